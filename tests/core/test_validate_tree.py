"""``tensorlist validate`` (and ``tensorlist.validate``) check a tree file's tree against its tensors.

A descriptor whose metadata has the format ``tensorlist.jax-tree/1`` (what ``tensorlist.jax.save``
writes) is valid only if its tree names every stored tensor exactly once, with nodes of known kinds and
keys of the right types: the same ``_base.tree.check`` ``tensorlist.jax.load`` runs, without importing jax.
A checkpoint directory with a tree (``tensorlist.jax.save(sharded=True)``) is checked by the CLI alike.
The files here are written with numpy only (the tree codec is stdlib); the directory case needs jax.
"""
import json

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import tree as _tree
from tensorlist.cli import main
from tensorlist.errors import FormatError


def tree_file(path, tree=None, mutate=None):
    """Saves ``tree`` (numpy leaves) as a tree file; ``mutate(header)`` may spoil its header first."""
    tree = {"params": {"w": np.ones((2, 3), np.float32), "b": np.zeros(3, np.float32)}, "step": None} \
        if tree is None else tree
    spec, leaves = _tree.encode(tree)
    header = _tree.make_header(spec, {"epoch": 1})
    if mutate is not None:
        mutate(header)
    tl.save(path, dict(leaves), metadata=header)
    return path


def cli(capsys, *args):
    """validate's exit status, and what it printed: the ok lines (stdout), then the error lines (stderr)."""
    code = main(["validate", *map(str, args)])
    printed = capsys.readouterr()
    return code, printed.out + printed.err


def test_a_tree_file_validates(tmp_path, capsys):
    path = tree_file(tmp_path / "t.tl")
    assert [d.keys() for d in tl.validate(path)] == [["params/w", "params/b"]]
    code, out = cli(capsys, path)
    assert code == 0 and out.startswith(f"{path}: ok (1 list, 2 tensors")


def _drop_leaf(header):
    header["tree"]["children"][0]["children"].pop()
    header["tree"]["children"][0]["keys"].pop()


def _rename_leaf(header):
    header["tree"]["children"][0]["children"][0]["name"] = "params/v"


def _unknown_kind(header):
    header["tree"]["children"][0]["kind"] = "set"


def _int_as_float_key(header):
    header["tree"]["keys"][1] = 1.5


def _no_metadata_field(header):
    del header["metadata"]


@pytest.mark.parametrize("mutate, field, message", [
    (_drop_leaf, "/metadata/tree", r"tensor 'params/b' is stored but no leaf of the tree names it"),
    (_rename_leaf, "/metadata/tree/children/0/children/0/name", r"tree at params/w: the leaf names tensor "
     r"'params/v', which the file does not store"),
    (_unknown_kind, "/metadata/tree/children/0/kind", r"tree at params: unknown node kind 'set'"),
    (_int_as_float_key, "/metadata/tree/keys/1", r"key 1 is 1\.5: a key is a string or an integer"),
    (_no_metadata_field, "/metadata", r"has exactly the fields \['format', 'metadata', 'tree'\]"),
])
def test_a_tree_that_does_not_match_the_tensors_is_refused(tmp_path, capsys, mutate, field, message):
    path = tree_file(tmp_path / "t.tl", mutate=mutate)
    with pytest.raises(FormatError, match=message) as e:
        tl.validate(path)
    assert e.value.file == str(path) and e.value.field == field
    code, out = cli(capsys, path)
    assert code == 1 and out.count("\n") == 1 and "error" in out and "t.tl" in out
    tl.load(path)  # the plain reader still reads the tensors: the tree is a tree file's rule only


def test_other_metadata_is_not_a_tree(tmp_path):
    tl.save(tmp_path / "m.tl", {"w": np.ones(2)}, metadata={"format": "something-else", "tree": 3})
    assert len(tl.validate(tmp_path / "m.tl")) == 1


def test_adapter_node_kinds_are_known_without_the_adapter(tmp_path):
    """A FrozenDict or nnx.State node (kinds tensorlist.jax registers) validates without tensorlist.jax."""
    def frozen(header):
        header["tree"]["children"][0]["kind"] = "flax.FrozenDict"
    path = tree_file(tmp_path / "f.tl", mutate=frozen)
    saved = _tree._REGISTRY.pop("flax.FrozenDict", None)  # as in a process that never imported tensorlist.jax
    try:
        assert len(tl.validate(path)) == 1
    finally:
        if saved is not None:
            _tree._REGISTRY["flax.FrozenDict"] = saved


def test_the_adapter_kinds_are_those_tensorlist_jax_registers():
    pytest.importorskip("jax", reason="compares with what tensorlist.jax registers (pip install 'jax[cpu]')")
    import tensorlist.jax  # noqa: F401 (registers its kinds)

    registered = {k: nt.keyed for k, nt in _tree._REGISTRY.items() if nt.module.startswith("flax.")}
    assert registered == _tree.ADAPTER_KINDS


def test_an_embedded_tree_file_names_its_pointer(tmp_path):
    path = tree_file(tmp_path / "t.tl", mutate=_rename_leaf)
    doc = {"model": json.loads(path.read_text())}
    (tmp_path / "doc.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError) as e:
        tl.validate(tmp_path / "doc.json")
    assert e.value.field == "/model/metadata/tree/children/0/children/0/name"


def test_a_checkpoint_directory_with_a_tree_is_checked_by_the_cli(tmp_path, capsys):
    pytest.importorskip("jax", reason="writes a tensorlist.jax checkpoint directory (pip install 'jax[cpu]')")
    from tensorlist.dcp.jax_shards import save_dir

    spec, _ = _tree.encode({"w": "W", "b": "B"})  # stand-in leaves: the arrays are given apart
    save_dir(tmp_path / "good", {"w": np.ones(4, np.float32), "b": np.zeros(2, np.float32)},
             _tree.make_header(spec))
    code, out = cli(capsys, tmp_path / "good")
    assert code == 0 and "its tree checked" in out
    save_dir(tmp_path / "bad", {"w": np.ones(4, np.float32), "b": np.zeros(2, np.float32), "extra": np.ones(1)},
             _tree.make_header(spec))
    code, out = cli(capsys, tmp_path / "bad")
    assert code == 1 and "tensor 'extra' is stored but no leaf of the tree names it" in out and "/tree/tree" in out
