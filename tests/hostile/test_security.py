"""Limits by policy, the symlink policy, and readers racing writers (docs/SECURITY.md)."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import lowlevel


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


# --- readers and writers at the same time ----------------------------------------------------


def test_open_readers_keep_consistent_old_data_through_many_replacements(tmp_path):
    path = tmp_path / "m.tl"
    readers = []
    for gen in range(25):
        tl.save(path, {"x": np.full(50_000, gen, np.int64), "g": np.int64(gen)}, metadata={"gen": gen})
        r = tl.open(path, mmap=gen % 2 == 0)
        readers.append((gen, r, r["x"] if r._mmap else None))
    for gen, r, view in readers:
        assert r.metadata == {"gen": gen}
        assert r.verify() == 2  # the CRCs of what this reader holds still match
        assert int(r["g"]) == gen and (r["x"] == gen).all()
        if view is not None:
            assert (view == gen).all()
        r.close()
    assert int(tl.load(path)["g"]) == 24
    assert len(os.listdir(tmp_path)) == 2  # the replaced data files are gone from the directory


def test_readers_in_threads_while_a_writer_replaces(tmp_path):
    path = tmp_path / "m.tl"
    tl.save(path, {"x": np.zeros(20_000, np.int64), "g": np.int64(0)})
    stop, errors = threading.Event(), []

    def read():
        while not stop.is_set():
            try:
                with tl.open(path, mmap=bool(np.random.randint(2))) as r:
                    g = int(r["g"])
                    if not (r["x"] == g).all() or r.verify() != 2:
                        errors.append(f"inconsistent generation {g}")
            except Exception as e:  # noqa: BLE001
                errors.append(repr(e))

    threads = [threading.Thread(target=read) for _ in range(2)]
    for t in threads:
        t.start()
    for gen in range(1, 40):
        tl.save(path, {"x": np.full(20_000, gen, np.int64), "g": np.int64(gen)})
    stop.set()
    for t in threads:
        t.join()
    assert errors == []


def _truncated_after_open(tmp_path, mmap):
    path = tmp_path / "m.tl"
    tl.save(path, {"a": np.arange(100_000, dtype=np.float64), "b": np.ones(100_000)})
    r = tl.open(path, mmap=mmap)
    data = tmp_path / r.descriptor.location
    os.truncate(data, 4096)  # someone else truncates the file in place
    return path, r


def test_truncated_file_is_detected_when_opened(tmp_path):
    path, r = _truncated_after_open(tmp_path, mmap=False)
    r.close()
    for mmap in (True, False):
        with pytest.raises(tl.FormatError, match="is 4096 bytes but the list needs"):
            tl.open(path, mmap=mmap)
        with pytest.raises(tl.FormatError, match="truncated or replaced"):
            tl.load(path, mmap=mmap)
    with pytest.raises(tl.FormatError, match="is 4096 bytes"):
        tl.validate(path)


def test_mmap_false_reader_raises_format_error_when_truncated_after_open(tmp_path):
    path, r = _truncated_after_open(tmp_path, mmap=False)
    with pytest.raises(tl.FormatError, match="was truncated while reading"):
        r["b"]
    with pytest.raises(tl.FormatError, match="was truncated while reading"):
        r.to_dict()
    with pytest.raises(tl.FormatError, match=r"tensor 0 \('a'\).*was truncated while reading"):
        r["a"]
    r.close()


@pytest.mark.slow  # a child that dies of SIGBUS
def test_mapped_reader_of_a_file_truncated_after_open_gets_sigbus(tmp_path):
    # The documented hazard (docs/SECURITY.md): a mapping cannot be protected; mmap=False can.
    src = textwrap.dedent(f"""
        import os, numpy as np, tensorlist as tl
        path = {str(tmp_path / 'm.tl')!r}
        tl.save(path, {{"a": np.arange(100_000, dtype=np.float64)}})
        r = tl.open(path)
        os.truncate(os.path.join(os.path.dirname(path), r.descriptor.location), 0)
        print(float(r["a"][-1]))
    """)
    proc = subprocess.run([sys.executable, "-c", src], capture_output=True, timeout=60)
    # SIGBUS; under AddressSanitizer (.ci/sanitize.sh) its handler reports "BUS" and aborts
    assert proc.returncode == -signal.SIGBUS or (proc.returncode == -signal.SIGABRT and b"BUS" in proc.stderr), proc
