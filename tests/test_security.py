"""Limits by policy, the symlink policy, and readers racing writers (docs/SECURITY.md)."""
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tensorlist as tl
from tensorlist import _lowlevel


def _save(path, n=4):
    tl.save(path, {f"t{i}": np.full(1000, i, np.float32) for i in range(n)})


# --- the total-size limit ------------------------------------------------------


@pytest.mark.parametrize("reader", ["load", "load_nommap", "open", "validate", "load_document"])
def test_total_size_limit_is_a_policy_the_caller_raises(tmp_path, reader):
    path = tmp_path / "m.tl"
    _save(path)
    length = json.loads(path.read_text())["byteLength"]
    calls = {
        "load": lambda **kw: tl.load(path, **kw),
        "load_nommap": lambda **kw: tl.load(path, mmap=False, **kw),
        "open": lambda **kw: tl.open(path, **kw).close(),
        "validate": lambda **kw: tl.validate(path, **kw),
        "load_document": lambda **kw: tl.load_document(path, **kw),
    }
    call = calls[reader]
    with pytest.raises(tl.FormatError, match=r"above the limit of 4096 \(raise it with max_total_bytes="):
        call(max_total_bytes=4096)
    call(max_total_bytes=length)  # exactly at the limit is fine
    call()  # default: bounded by the data file's size only


def test_sparse_list_is_refused_by_the_total_size_limit_before_any_allocation(tmp_path):
    # A 1 TiB sparse data file costs nothing on disk; mmap=False would allocate it all.
    path = tmp_path / "sparse.tl"
    data = tmp_path / "sparse.tl.data"
    with open(data, "wb") as f:
        f.truncate(1 << 40)
    path.write_text(json.dumps({"tensors": [{"dims": [1 << 38], "dataType": 6, "byteOffset": 0,
                                             "byteLength": 1 << 40}],
                                "location": data.name, "byteOffset": 0, "byteLength": 1 << 40}))
    with pytest.raises(tl.FormatError, match="above the limit"):
        tl.load(path, mmap=False, max_total_bytes=1 << 30)


def test_descriptor_and_tensor_count_limits_are_raisable(tmp_path):
    path = tmp_path / "m.tl"
    _save(path, n=3)
    size = path.stat().st_size
    with pytest.raises(tl.FormatError, match="above the limit"):
        tl.load(path, max_descriptor_bytes=size - 1)
    with pytest.raises(tl.FormatError, match="3 tensors, above the limit of 2"):
        tl.load(path, max_tensors=2)
    assert len(tl.load(path, max_descriptor_bytes=size, max_tensors=3)) == 3


# --- symlinked data files ----------------------------------------------------


def _symlinked(tmp_path, target_dir):
    """A descriptor in tmp_path/doc whose data file is a symlink into target_dir."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    _save(src / "m.tl")
    loc = json.loads((src / "m.tl").read_text())["location"]
    target_dir.mkdir(parents=True, exist_ok=True)
    os.replace(src / loc, target_dir / loc)
    doc = tmp_path / "doc"
    doc.mkdir(exist_ok=True)
    (doc / "m.tl").write_bytes((src / "m.tl").read_bytes())
    (doc / loc).symlink_to(os.path.relpath(target_dir / loc, doc))
    return doc / "m.tl"


@pytest.mark.parametrize("mmap", [True, False])
def test_data_file_symlink_leaving_the_directory_is_refused_unless_allowed(tmp_path, mmap):
    path = _symlinked(tmp_path, tmp_path / "elsewhere")
    with pytest.raises(tl.FormatError, match="outside the descriptor's directory"):
        tl.load(path, mmap=mmap)
    with pytest.raises(tl.FormatError, match="outside the descriptor's directory"):
        tl.validate(path)
    with pytest.raises(tl.FormatError, match="outside the descriptor's directory"):
        tl.load_document(path)
    assert tl.load(path, mmap=mmap, allow_outside=True)["t3"][0] == 3
    tl.validate(path, allow_outside=True, verify=True)


def test_symlink_through_a_directory_is_refused_too(tmp_path):
    path = tmp_path / "doc" / "m.tl"
    path.parent.mkdir()
    (tmp_path / "out").mkdir()
    tl.save(tmp_path / "out" / "m.tl", {"a": np.ones(3)})
    (path.parent / "sub").symlink_to(tmp_path / "out")
    text = (tmp_path / "out" / "m.tl").read_text()
    loc = json.loads(text)["location"]
    path.write_text(text.replace(f'"{loc}"', f'"sub/{loc}"'))
    with pytest.raises(tl.FormatError, match="outside the descriptor's directory"):
        tl.load(path)


def test_symlink_inside_the_directory_is_fine(tmp_path):
    path = _symlinked(tmp_path, tmp_path / "doc" / "blobs")
    assert tl.load(path)["t1"][0] == 1


def test_content_addressed_cache_layout_is_accepted(tmp_path):
    # Both files are symlinks into one blob directory (as in a Hugging Face cache).
    blobs, snap = tmp_path / "blobs", tmp_path / "snapshots" / "rev"
    blobs.mkdir()
    snap.mkdir(parents=True)
    _save(blobs / "m.tl")
    loc = json.loads((blobs / "m.tl").read_text())["location"]
    (snap / "m.tl").symlink_to(os.path.relpath(blobs / "m.tl", snap))
    (snap / loc).symlink_to(os.path.relpath(blobs / loc, snap))
    assert tl.load(snap / "m.tl")["t2"][0] == 2
