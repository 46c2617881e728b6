"""Checkpoint directories of tensorlist's DCP layout through the command line and ``convert``, without torch.

The checkpoints here are built with numpy alone (``tl.save`` for each rank's shard, ``metadata_document``
for ``.metadata.json``), as 2 ranks would save them: chunks split unevenly, along either dimension, an
empty tensor, a scalar, and non-tensor values. ``inspect``, ``validate`` and ``convert`` run in this
process through ``tensorlist.cli.main`` (what ``python -m tensorlist`` runs), and once in a child where
torch cannot be imported. Stock DCP checkpoints (FileSystemWriter) are tests/dcp/test_dcp_import.py's.
"""
import json
import math
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist.cli import main
from tensorlist.convert import MetadataDroppedWarning, convert, infer_format, open_source
from tensorlist.dcp import METADATA_NAME, read_full, read_metadata, shard_name, validate_checkpoint
from tensorlist.errors import FormatError

from _dcp_support import SAVE_ID, TENSORS, VALUES, make_checkpoint


@pytest.fixture
def ckpt(tmp_path):
    return make_checkpoint(tmp_path / "ckpt")


def cli(capsys, *args):
    """``tensorlist ARGS`` in this process: (exit status, stdout lines, stderr lines)."""
    rc = main([str(a) for a in args])
    out = capsys.readouterr()
    return rc, out.out.splitlines(), out.err.splitlines()


def same(got, want, what=""):
    """Same dtype (a bit carrier, as sources give bfloat16/float8, counts as its type), shape and bytes."""
    assert dtypes.from_numpy(got.dtype) is dtypes.from_numpy(want.dtype) and got.shape == want.shape, (
        what, got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes(), what


def values_of(values=VALUES):
    return {k: v for k, (_, v) in values.items()}


# --- inspect, validate ------------------------------------------------------------------

def test_a_checkpoint_directory_is_inferred_as_dcp(ckpt, tmp_path):
    assert infer_format(ckpt, for_reading=True) == "dcp" and infer_format(ckpt) == "dcp"
    assert infer_format("s3://bucket/run/ckpt/") == "dcp"
    stock = tmp_path / "stock"
    stock.mkdir()
    (stock / ".metadata").write_bytes(b"\x80\x04.")
    assert infer_format(stock, for_reading=True) == "torch-dcp"
    assert infer_format(f"{tmp_path}/not-yet-made/") == "dcp"


def test_inspect_lists_each_fqn_with_dtype_global_shape_chunks_and_bytes(ckpt, capsys):
    rc, out, err = cli(capsys, "inspect", ckpt)
    assert rc == 0 and err == []
    assert out[0].startswith(f"{ckpt}  (format dcp") and f"save {SAVE_ID}" in out[0] and "2 data files" in out[0]
    rows = {line.split()[0]: line.split() for line in out[2:-1]}
    assert rows["w"][:4] == ["w", "float32", "(8,", "6)"] and rows["w"][4] == "2" and rows["w"][5:] == ["192", "B"]
    assert rows["h"][1] == "bfloat16" and rows["h"][4] == "2"
    assert rows["b"][1:4] == ["int64", "(5,)", "1"] and rows["s"][1:4] == ["float64", "()", "1"]
    assert rows["step"][1:3] == ["value", "(json)"] and rows["betas"][1:3] == ["value", "(json)"]
    assert out[-1].strip() == "5 tensors in 7 chunks, 272 B of data; 3 values"


def test_inspect_json(ckpt, capsys):
    rc, out, _ = cli(capsys, "inspect", ckpt, "--json")
    doc = json.loads("\n".join(out))
    assert rc == 0 and doc["format"] == "dcp" and doc["save_id"] == SAVE_ID
    assert doc["files"] == [shard_name(0, SAVE_ID), shard_name(1, SAVE_ID)]
    w = doc["tensors"][0]
    assert (w["name"], w["dtype"], w["shape"], w["chunks"], w["bytes"]) == ("w", "float32", [8, 6], 2, 192)
    assert w["chunk_list"] == [{"offsets": [0, 0], "sizes": [5, 6]}, {"offsets": [5, 0], "sizes": [3, 6]}]
    assert [(v["name"], v["encoding"]) for v in doc["values"]] == [("step", "json"), ("betas", "json"),
                                                                    ("best", "json")]
    assert doc["tensor_bytes"] == sum(a.nbytes for a in TENSORS.values())


def test_validate_a_checkpoint_directory(ckpt, capsys):
    rc, out, _ = cli(capsys, "validate", "--verify", ckpt)
    assert rc == 0
    assert out == [f"{ckpt}: ok (dcp checkpoint, 5 tensors in 7 chunks, 3 values, 2 shard files, checksums verified)"]


def _edit(path, edit):
    doc = json.loads((path / METADATA_NAME).read_text())
    edit(doc)
    (path / METADATA_NAME).write_text(json.dumps(doc))


def _w_chunk(d, i):
    return d["stateDict"]["w"]["chunks"][i]


TILING = [
    ("overlap", lambda d: _w_chunk(d, 1)["offsets"].__setitem__(0, 4), "'w': chunks 0 and 1 overlap"),
    ("gap", lambda d: _w_chunk(d, 1)["sizes"].__setitem__(0, 2), "'w': the chunks cover 42 of the tensor's 48"),
    ("out of range", lambda d: _w_chunk(d, 1)["sizes"].__setitem__(1, 7), r"'w': chunk 1 \(offsets \[5, 0\], sizes "
     r"\[3, 7\]\) lies outside the tensor of size \[8, 6\]"),
]


@pytest.mark.parametrize("edit,message", [t[1:] for t in TILING], ids=[t[0] for t in TILING])
def test_validate_refuses_chunks_that_do_not_tile_their_tensor_in_one_line(ckpt, capsys, edit, message):
    _edit(ckpt, edit)
    rc, out, err = cli(capsys, "validate", ckpt)
    assert rc == 1 and out == [] and len(err) == 1
    assert err[0].startswith(f"tensorlist validate: error: {ckpt / METADATA_NAME}: "), err[0]
    import re
    assert re.search(message, err[0]), err[0]
    with pytest.raises(FormatError, match=message):
        validate_checkpoint(ckpt)


# --- convert ------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [".tl", ".safetensors", ".npz"])
def test_convert_assembles_the_full_tensors(ckpt, tmp_path, capsys, suffix):
    dst = tmp_path / f"full{suffix}"
    rc, _, err = cli(capsys, "convert", ckpt, dst, "--no-progress")
    assert rc == 0 and err == []
    with open_source(dst) as src:
        got = {e.name: e.array() for e in src.entries}
        metadata = src.metadata
    assert sorted(got) == sorted(TENSORS)
    for k, a in TENSORS.items():
        same(got[k], a, k)
    # the values travel as metadata (tagged JSON: the tuple and the infinity kept)
    assert metadata == {"dcpValues": {"step": 7, "betas": {"__tuple__": [0.9, 0.999]}, "best": {"__float__": "inf"}}}


def test_convert_dcp_to_dcp_keeps_chunks_shards_and_values(ckpt, tmp_path, capsys):
    dst = tmp_path / "copy"  # a checkpoint's copy named without an extension: a checkpoint directory
    rc, _, err = cli(capsys, "convert", ckpt, dst, "--no-progress")
    assert rc == 0 and err == []
    a, b = read_metadata(ckpt), validate_checkpoint(dst, verify=True)
    assert b.save_id != a.save_id and len(b.files) == 2
    assert {k: t.chunks for k, t in b.tensors.items()} == {k: t.chunks for k, t in a.tensors.items()}
    assert [b.storage[k].file[0] for k in a.storage] == [a.storage[k].file[0] for k in a.storage]  # same ranks
    full = read_full(dst)
    for k, v in TENSORS.items():
        same(full[k], v, k)
    assert {k: full[k] for k in VALUES} == values_of() and isinstance(full["betas"], tuple)


def test_a_flat_file_converts_to_a_checkpoint_and_its_values_come_back(ckpt, tmp_path, capsys):
    flat = tmp_path / "flat.tl"
    assert cli(capsys, "convert", ckpt, flat, "--no-progress")[0] == 0
    dst = tmp_path / "again"
    assert cli(capsys, "convert", flat, f"{dst}/", "--no-progress")[0] == 0  # a name ending with / is a directory
    ckpt2 = validate_checkpoint(dst, verify=True)
    assert len(ckpt2.files) == 1 and all(len(t.chunks) == 1 for t in ckpt2.tensors.values())
    full = read_full(dst)
    for k, v in TENSORS.items():
        same(full[k], v, k)
    assert {k: full[k] for k in VALUES} == values_of()


def test_other_metadata_is_dropped_with_a_warning(tmp_path):
    tl.save(tmp_path / "m.tl", {"x": np.ones(3)}, metadata={"note": "hi"})
    with pytest.warns(MetadataDroppedWarning, match="is not written: a checkpoint holds tensors"):
        convert(tmp_path / "m.tl", f"{tmp_path}/ck/", progress=False)
    assert read_full(tmp_path / "ck")["x"].tolist() == [1.0, 1.0, 1.0]


def test_a_new_conversion_replaces_the_checkpoint_and_removes_its_files(ckpt, tmp_path):
    dst = tmp_path / "dst"
    convert(ckpt, dst, progress=False)
    first = read_metadata(dst).save_id
    tl.save(tmp_path / "other.tl", {"z": np.arange(3)})
    convert(tmp_path / "other.tl", dst, dst_format="dcp", progress=False)
    ckpt2 = read_metadata(dst)
    assert list(read_full(dst)) == ["z"]
    assert all(first not in n for n in os.listdir(dst))
    assert sorted(os.listdir(dst)) == sorted([METADATA_NAME] + [n for n in os.listdir(dst) if ckpt2.save_id in n])


def test_a_failed_conversion_leaves_the_previous_checkpoint(ckpt, tmp_path, monkeypatch):
    dst = tmp_path / "dst"
    convert(ckpt, dst, progress=False)
    before = sorted(os.listdir(dst))
    import tensorlist.convert.dcp as cdcp

    def boom(*args, **kwargs):
        raise OSError("disk full (simulated)")
    monkeypatch.setattr(cdcp, "commit_metadata", boom)
    with pytest.raises(OSError, match="simulated"):
        convert(ckpt, dst, progress=False)
    assert sorted(os.listdir(dst)) == before  # the new save's shards removed, the old checkpoint whole
    validate_checkpoint(dst, verify=True)


def test_tensors_stream_one_at_a_time_and_a_one_chunk_tensor_is_the_mapped_chunk(ckpt):
    with open_source(ckpt) as src:
        b = next(e for e in src.entries if e.name == "b").array()
        assert not b.flags.writeable and not b.flags.owndata  # a view of the mapped shard: no copy
        w = next(e for e in src.entries if e.name == "w").array()
        assert w.flags.owndata  # assembled from two chunks, when asked for


def test_torch_dcp_is_never_a_destination(ckpt, tmp_path):
    with pytest.raises(ValueError, match="read, never written"):
        convert(ckpt, tmp_path / "x", dst_format="torch-dcp", progress=False)


def test_a_file_is_not_a_checkpoint_directory(ckpt, tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(NotADirectoryError, match="is not a directory"):
        convert(ckpt, tmp_path / "f", dst_format="dcp", progress=False)


def test_memory_urls_as_destination_and_source(ckpt, tmp_path, capsys):
    pytest.importorskip("fsspec")
    url = f"memory://tensorlist-dcp-cli-{os.getpid()}/ckpt/"
    assert cli(capsys, "convert", ckpt, url, "--no-progress")[0] == 0
    full = read_full(url)
    for k, v in TENSORS.items():
        same(full[k], v, k)
    rc, out, _ = cli(capsys, "validate", "--verify", url)
    assert rc == 0 and out[0].endswith("checksums verified)")
    rc, out, _ = cli(capsys, "inspect", url)
    assert rc == 0 and "format dcp" in out[0]
    assert cli(capsys, "convert", url, tmp_path / "back.safetensors", "--no-progress")[0] == 0
    with open_source(tmp_path / "back.safetensors") as src:
        same(next(e for e in src.entries if e.name == "h").array(), TENSORS["h"])
    import fsspec
    fsspec.filesystem("memory").rm(url.removeprefix("memory://").rstrip("/"), recursive=True)


# --- bad input through the command line: exit status 1, one line naming the file -------------

def _truncate_shard(path):
    data = sorted(n for n in os.listdir(path) if n.startswith("1.") and n.endswith(".data"))[0]
    os.truncate(path / data, os.path.getsize(path / data) - 1)
    return data


def _drop_rank(path):
    os.unlink(path / shard_name(1, SAVE_ID))
    return shard_name(1, SAVE_ID)


def _point_outside(path):
    _edit(path, lambda d: [e for e in d["storage"] if e["fqn"] == "b"][0].__setitem__("tensor", "b@9"))
    return shard_name(1, SAVE_ID)


def _unknown_file(path):
    _edit(path, lambda d: [e for e in d["storage"] if e["fqn"] == "w"][0].__setitem__("file", "7.0123abcd.tl"))
    return METADATA_NAME


def _planted_pickle(path):
    import pickle
    (path / METADATA_NAME).write_bytes(pickle.dumps({"format": "tensorlist-dcp", "x": (1, 2)}))
    return METADATA_NAME


BAD = [("truncated shard", _truncate_shard, "truncated|data file"),
       ("missing rank file", _drop_rank, "is missing"),
       ("chunk outside its shard", _point_outside, "which the shard lacks"),
       ("file not in files", _unknown_file, "not in files"),
       ("pickle as .metadata.json", _planted_pickle, "not UTF-8")]


@pytest.mark.parametrize("command", ["validate", "convert"])
@pytest.mark.parametrize("damage,message", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_checkpoints_are_one_line_naming_the_file(ckpt, tmp_path, capsys, command, damage, message):
    named = damage(ckpt)
    args = ["validate", "--verify", ckpt] if command == "validate" else ["convert", ckpt, tmp_path / "o.tl",
                                                                          "--no-progress"]
    rc, out, err = cli(capsys, *args)
    assert rc == 1
    lines = err  # validate and convert alike: one error line on stderr
    assert len(lines) == 1 and out == [], (out, err)
    assert lines[0].startswith(f"tensorlist {command}: error: {ckpt}") and named in lines[0], lines[0]
    import re
    assert re.search(message, lines[0]), lines[0]
    assert not (tmp_path / "o.tl").exists()


def test_a_pickle_planted_as_the_metadata_is_refused_by_inspect_too(ckpt, capsys):
    _planted_pickle(ckpt)
    rc, out, err = cli(capsys, "inspect", ckpt)
    assert rc == 1 and out == [] and len(err) == 1
    assert err[0].startswith(f"tensorlist inspect: error: {ckpt / METADATA_NAME}") and "not UTF-8" in err[0]


def test_a_directory_without_metadata_says_so(tmp_path, capsys):
    (tmp_path / "nothing").mkdir()
    rc, _, err = cli(capsys, "inspect", tmp_path / "nothing")
    assert rc == 1 and len(err) == 1 and "no checkpoint metadata" in err[0]


# --- without torch ------------------------------------------------------------------------

@pytest.mark.slow  # a child process
def test_inspect_validate_convert_run_without_torch(ckpt, tmp_path):
    code = ("import sys; sys.modules['torch'] = None\n"
            "from tensorlist.cli import main\n"
            "args = sys.argv[1:]\n"
            "rc = [main(['inspect', args[0]]), main(['validate', '--verify', args[0]]),\n"
            "      main(['convert', args[0], args[1], '--no-progress']),\n"
            "      main(['convert', args[0], args[2], '--no-progress'])]\n"
            "assert 'torch' not in {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n"
            "print('rc', rc)")
    out = subprocess.run([sys.executable, "-c", code, str(ckpt), str(tmp_path / "m.safetensors"),
                          str(tmp_path / "copy")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("rc [0, 0, 0, 0]") and "Traceback" not in out.stderr
    full = read_full(tmp_path / "copy")
    for k, v in TENSORS.items():
        same(full[k], v, k)
    with open_source(tmp_path / "m.safetensors") as src:
        assert math.isclose(sum(e.nbytes for e in src.entries), sum(a.nbytes for a in TENSORS.values()))


def test_the_metadata_of_a_conversion_is_warning_free(ckpt, tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        convert(ckpt, tmp_path / "c", progress=False)
