"""Hostile tree specs, against every entry point that reads one.

A tree spec (``tensorlist.jax``'s ``/metadata/tree``, or a sharded directory's ``/tree/tree`` in
``.metadata.json``) is read by ``tensorlist.jax.load``, ``tensorlist.validate``, Orbax's
``TensorListCheckpointHandler.metadata`` and the command line's ``inspect`` and ``validate``; all of
them go through one check, ``_base.tree.check``. The files are saved by the package (through Orbax's
``Checkpointer`` and ``tensorlist.jax.save(sharded=True)``), then edited as an attacker would.

- Class 1, a field of the wrong JSON type: every value of the spec replaced in turn by a list, an
  object, a number, a bool, null... Every entry point gives the same verdict: it reads the file, or
  raises a FormatError naming the file, the JSON pointer and the tree path (the CLI prints it and goes
  on with the next file); never a stray TypeError (``unhashable type: 'list'``).
- Class 2, a file never causes an import: a namedtuple ``type`` naming a lazily imported attribute
  (``numpy:f2py.X``: numpy's ``__getattr__`` imports ``numpy.f2py``), a function (``os:system``,
  ``importlib:import_module``), a module nobody imported (``antigravity``, ``this``: importing them has
  visible effects), or a node kind whose adapter would import its framework (``flax.FrozenDict``
  without flax): in a fresh interpreter, no entry point adds a module to ``sys.modules``, and each
  gives a plain namedtuple of the same name and fields, or a FormatError naming the file.
"""
import collections
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

pytest.importorskip("jax", reason="tree files are written by tensorlist.jax (pip install 'tensorlist[jax]')")
ocp = pytest.importorskip("orbax.checkpoint", reason="the Orbax entry point needs orbax-checkpoint")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

import tensorlist as tl  # noqa: E402
import tensorlist.jax as tlj  # noqa: E402
from tensorlist._base.jsonio import resolve_pointer, set_at_pointer, walk  # noqa: E402
from tensorlist.cli import main  # noqa: E402
from tensorlist.dcp.layout import METADATA_NAME  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402
from tensorlist.orbax import (  # noqa: E402
    SHARDED_DIR, TREE_FILE, TensorListCheckpointHandler, TensorListRestore, TensorListSave)

Pair = collections.namedtuple("Pair", ["mu", "nu"])


@jax.tree_util.register_dataclass
@dataclasses.dataclass
class Box:
    """A pytree node jax knows and the codec does not (a ``pytree`` node in the spec)."""

    inner: object
    count: object

#: What replaces each value of a spec, one at a time.
HOSTILE = {
    "list": ["a"],
    "object": {"a": 1},
    "empty-object": {},
    "int": 7,
    "huge": 2 ** 70,
    "float": 1.5,
    "bool": True,
    "null": None,
    "text": "x",
}


def _tree():
    return {"w": jnp.ones((2, 3)), "p": Pair(jnp.zeros(2), None),
            "l": [jnp.arange(3), ()], "o": collections.OrderedDict(b=jnp.ones(1)), "i": {0: jnp.ones(1)},
            # the kinds Orbax's trees bring: Python scalars, a typed PRNG key, a registered pytree node
            "s": [3, float("-inf"), True], "k": jax.random.key(0, impl="rbg"), "b": Box(jnp.ones(1), 2.5)}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """An Orbax item holding a tree file, and a sharded directory: (item dir, sharded dir), as saved."""
    base = tmp_path_factory.mktemp("saved")
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(base / "ckpt", args=TensorListSave(_tree(), metadata={"step": 1}))
    sharded = base / "sharded" / SHARDED_DIR
    tlj.save(sharded, _tree(), sharded=True, metadata={"step": 1})
    return base / "ckpt", sharded


def _spec_mutations(doc, at):
    """(pointer, hostile name, edited document) for every value under ``at`` (the spec) and every hostile value."""
    for ptr, _ in walk(resolve_pointer(doc, at), at):
        for name, value in HOSTILE.items():
            copy = json.loads(json.dumps(doc))
            set_at_pointer(copy, ptr, value)
            yield ptr, name, copy


def _verdict(read, file):
    """None when ``read()`` succeeds, else its FormatError's reason; it must name ``file``."""
    try:
        read()
    except FormatError as e:
        assert e.file == file, f"names {e.file!r}, not {file!r}: {e}"
        return e.reason
    return None


def _cli(capsys, *argv):
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _check_cli(capsys, target, good, verdict):
    """``inspect`` shows the tree and whether it is invalid; ``validate`` reports it and goes on to ``good``."""
    code, out, err = _cli(capsys, "inspect", target)
    assert code == 0 and err == "", err
    assert ("tree: invalid (" in out) == (verdict is not None), out
    code, out, err = _cli(capsys, "validate", target, good)
    lines = err.splitlines() + out.splitlines()  # an error line goes to stderr, the ok lines to stdout
    assert len(lines) == 2 and lines[1].startswith(f"{good}: ok"), out
    assert code == (0 if verdict is None else 1) and (err == "") == (verdict is None), err
    if verdict is not None:
        assert str(target) in lines[0] and "error" in lines[0] and verdict.split(":")[0] in lines[0], lines[0]


def test_any_value_of_a_tree_file_s_spec_is_read_or_one_format_error_everywhere(saved, tmp_path, capsys):
    item, _ = saved
    good = item / TREE_FILE
    doc = json.loads(good.read_text())
    spec_text = json.dumps(doc["metadata"]["tree"])
    for kind in ("dict", "namedtuple", "list", "tuple", "ordereddict", "none", "leaf", "scalar", "key", "pytree"):
        assert f'"kind": "{kind}"' in spec_text, kind  # the mutations below reach every kind
    bad_item = tmp_path / "item"
    shutil.copytree(item, bad_item)
    path = bad_item / TREE_FILE
    handler = TensorListCheckpointHandler()
    refused = 0
    for ptr, name, bad in _spec_mutations(doc, "/metadata/tree"):
        path.write_text(json.dumps(bad))
        where = f"{ptr} := {name}"
        verdicts = {
            "jax.load": _verdict(lambda: tlj.load(path), str(path)),
            "validate": _verdict(lambda: tl.validate(path), str(path)),
            "orbax metadata": _verdict(lambda: handler.metadata(bad_item), str(path)),
        }
        assert len(set(verdicts.values())) == 1, f"{where}: {verdicts}"
        verdict = verdicts["jax.load"]
        _check_cli(capsys, path, good, verdict)
        refused += verdict is not None
    assert refused > 100  # the table reaches kinds, keys, names, fields, types and children


def test_any_value_of_a_sharded_directory_s_spec_is_read_or_one_format_error_everywhere(saved, tmp_path, capsys):
    _, good = saved
    doc = json.loads((good / METADATA_NAME).read_text())
    bad_dir = tmp_path / "item" / SHARDED_DIR
    shutil.copytree(good, bad_dir)
    meta = bad_dir / METADATA_NAME
    handler = TensorListCheckpointHandler()
    refused = 0
    for ptr, name, bad in _spec_mutations(doc, "/tree/tree"):
        meta.write_text(json.dumps(bad))
        where = f"{ptr} := {name}"
        verdicts = {
            "jax.load": _verdict(lambda: tlj.load(bad_dir), str(meta)),
            "orbax metadata": _verdict(lambda: handler.metadata(bad_dir.parent), str(meta)),
        }
        assert len(set(verdicts.values())) == 1, f"{where}: {verdicts}"
        verdict = verdicts["jax.load"]
        _check_cli(capsys, bad_dir, good, verdict)
        refused += verdict is not None
    assert refused > 100


@pytest.mark.parametrize("value", [["p"], {"p": 1}])
def test_the_issue_s_sample_a_leaf_name_that_is_a_list_or_an_object(saved, tmp_path, value):
    item, _ = saved
    doc = json.loads((item / TREE_FILE).read_text())
    spec = doc["metadata"]["tree"]
    i = spec["keys"].index("w")
    spec["children"][i]["name"] = value
    path = tmp_path / "t.tl"
    shutil.copy(item / doc["location"], tmp_path)
    path.write_text(json.dumps(doc))
    for read in (lambda: tlj.load(path), lambda: tl.validate(path)):
        with pytest.raises(FormatError, match=r"t\.tl: field '/metadata/tree/children/\d/name': tree at w: a "
                                              r"leaf's 'name' must be a string, not") as e:
            read()
        assert e.value.field == f"/metadata/tree/children/{i}/name"


# --- class 2: no import caused by a file -------------------------------------------------------------

#: namedtuple ``type`` values a file may hold -> what comes back: a plain namedtuple of that name, or an error.
TYPE_NAMES = {
    "numpy:f2py.X": "namedtuple X",  # numpy's lazy __getattr__ would import numpy.f2py
    "numpy:testing.X": "namedtuple X",
    "numpy.f2py:X": "namedtuple X",  # a module nobody imported
    "antigravity:geohash": "namedtuple geohash",  # importing it opens a web browser
    "this:s": "namedtuple s",  # importing it prints the Zen of Python
    "xmlrpc.client:Fault": "namedtuple Fault",
    "enum:EnumMeta.X": "namedtuple X",  # a class's metaclass hooks are not asked either
    "os:system": "FormatError",
    "importlib:import_module": "FormatError",
    "builtins:__import__": "FormatError",
    "sys:modules": "FormatError",
    "collections:OrderedDict.fromkeys": "FormatError",
    "__main__:Pair": "class Pair",  # a class the program holds comes back as itself
}

_CHILD = textwrap.dedent('''
    import collections, contextlib, io, json, sys
    import jsonschema, tensorlist as tl, tensorlist.jax as tlj
    from tensorlist.cli import main
    from tensorlist.orbax import TensorListCheckpointHandler

    Pair = collections.namedtuple("Pair", ["mu", "nu"])
    cases = json.loads(sys.argv[1])
    handler = TensorListCheckpointHandler()

    def describe(value):
        t = type(value)
        if t is Pair:
            return "class Pair"
        if isinstance(value, tuple) and hasattr(t, "_fields"):
            return "namedtuple " + t.__name__
        return type(value).__name__

    def run(entry, path, item):
        out = io.StringIO()
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
                if entry == "jax.load":
                    return describe(tlj.load(path)["p"])
                if entry == "validate":
                    return "ok" if tl.validate(path) else "none"
                if entry == "orbax metadata":
                    return describe(handler.metadata(item)["p"])
                code = main([entry.split()[1], path])
                return f"rc {code}: {out.getvalue()}"
        except tl.FormatError as e:
            return "FormatError " + (e.file or "") + ": " + e.reason
        except Exception as e:
            return "foreign " + type(e).__name__ + ": " + str(e)

    entries = ["jax.load", "validate", "orbax metadata", "cli inspect", "cli validate"]
    for c in cases:  # every entry point once on every file first: what they import themselves is imported
        for entry in entries:
            run(entry, c["path"], c["item"])
    results = []
    for c in cases:
        for entry in entries:
            before = set(sys.modules)
            got = run(entry, c["path"], c["item"])
            results.append({"case": c["name"], "entry": entry, "got": got,
                            "new_modules": sorted(set(sys.modules) - before)})
    print(json.dumps({"results": results, "loaded": [m for m in ("numpy.f2py", "numpy.testing", "antigravity",
                                                                 "this", "xmlrpc.client", "flax")
                                                     if m in sys.modules]}))
''')


def _edited_item(item, dest, edit):
    """A copy of the Orbax item ``item`` at ``dest``, its spec edited by ``edit(spec)``."""
    shutil.copytree(item, dest)
    path = dest / TREE_FILE
    doc = json.loads(path.read_text())
    edit(doc["metadata"]["tree"])
    path.write_text(json.dumps(doc))
    return path


def _p_node(spec):
    return spec["children"][spec["keys"].index("p")]


def test_no_entry_point_imports_a_module_a_file_names(saved, tmp_path):
    item, _ = saved
    cases = []
    for i, type_name in enumerate(TYPE_NAMES):
        def edit(spec, type_name=type_name):
            _p_node(spec)["type"] = type_name
        path = _edited_item(item, tmp_path / f"type{i}", edit)
        cases.append({"name": type_name, "path": str(path), "item": str(path.parent)})

    def frozen(spec):  # a node kind whose adapter would import flax to rebuild it
        p = _p_node(spec)
        p.update(kind="flax.FrozenDict", keys=p.pop("fields"))
        del p["type"]
    path = _edited_item(item, tmp_path / "frozen", frozen)
    cases.append({"name": "flax.FrozenDict", "path": str(path), "item": str(path.parent)})

    child = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(cases)], capture_output=True, text=True,
                           timeout=300, env={**os.environ, "BROWSER": "false"})
    assert child.returncode == 0, child.stderr
    report = json.loads(child.stdout.splitlines()[-1])
    assert report["loaded"] == [], report["loaded"]  # not even during the first round
    expected = {**TYPE_NAMES, "flax.FrozenDict": "dict"}
    paths = {c["name"]: c["path"] for c in cases}
    for r in report["results"]:
        where = f"{r['case']} via {r['entry']}"
        assert r["new_modules"] == [], f"{where} imported {r['new_modules']}"
        got, want = r["got"], expected[r["case"]]
        assert not got.startswith("foreign"), f"{where}: {got}"
        if r["entry"] == "cli inspect":
            assert got.startswith("rc 0:") and ("tree: invalid" in got) == (want == "FormatError"), f"{where}: {got}"
        elif r["entry"] == "cli validate":
            assert got.startswith("rc 1:" if want == "FormatError" else "rc 0:"), f"{where}: {got}"
        elif r["entry"] == "validate" and want != "FormatError":
            assert got == "ok", f"{where}: {got}"
        elif want == "FormatError":
            assert got == f"FormatError {paths[r['case']]}: tree at p: '{r['case']}' is not a namedtuple class", \
                f"{where}: {got}"
        else:
            assert got == want, f"{where}: {got}"


def test_a_restore_target_that_does_not_match_is_the_documented_value_error(saved, tmp_path):
    item, _ = saved
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        for target, match in [({"w": None}, r"sharding tree at \(root\): keys \['w'\] do not match"),
                              ({**{k: None for k in ("w", "p", "o", "i", "s", "k", "b")}, "l": [None, {"x": None}]},
                               r"sharding tree at l/1: the file holds a tuple of 0, the sharding tree a dict of 1"),
                              ({**{k: None for k in ("p", "l", "o", "i", "s", "k", "b")}, "w": [None]},
                               r"sharding tree at w: the file holds a leaf here; .* not a list")]:
            with pytest.raises(ValueError, match=rf"{TREE_FILE}: {match}") as e:
                ckptr.restore(item, args=TensorListRestore(item=target))
            assert not isinstance(e.value, FormatError)  # the caller's tree, not the file, is at fault
