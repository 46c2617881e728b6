"""tensorlist.convert on the shared seams: one atomic durable write, one file-type check, shard confinement,
one torch bridge, one URL rule."""
import contextlib
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist._base import lowlevel
from _compat import formats_marked, needs_torch
from tensorlist.convert import convert, open_source, sinks

try:
    import torch
except ImportError:  # the tests marked needs_torch skip, the rest run (the s390x leg has no torch)
    torch = None

EXT = {"tensorlist": "m.tl", "lamp": "m.lamp", "safetensors": "m.safetensors", "hf": "model.safetensors.index.json",
       "npz": "m.npz", "npy": "m.npy", "pt": "m.pt"}
ALL = formats_marked(EXT)


def _arrays(fmt, value):
    """Three tensors (one for .npy), 16 KiB each, filled with ``value``."""
    n = 1 if fmt == "npy" else 3
    return {f"t{i}": np.full((64, 64), value + i, np.float32) for i in range(n)}


def _source(tmp_path, fmt, value, name="src.tl"):
    path = tmp_path / name
    tl.save(path, _arrays(fmt, value))
    return path


def _loaded(path):
    """The tensors of any converter output, by name ("0"... for positional ones)."""
    with open_source(path) as s:
        return {e.name: np.array(e.array()) for e in s.entries}


def _same(got, want):
    """The same stored (little-endian) bytes: ``want`` is native, big-endian on s390x."""
    assert [dtypes.as_little(a).tobytes() for a in got.values()] == [dtypes.as_little(a).tobytes()
                                                                      for a in want.values()]


@contextlib.contextmanager
def _deadline(seconds):
    """Fails the test instead of hanging (a blocked open() is interrupted by the alarm)."""
    def alarm(signum, frame):
        raise TimeoutError(f"still blocked after {seconds}s")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


# --- one atomic, durable write --------------------------------------------------------

@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="names fsynced fds through /proc/self/fd")
@pytest.mark.parametrize("fmt", ALL)
def test_every_output_is_fsynced_renamed_and_its_directory_fsynced(tmp_path, monkeypatch, fmt):
    src = _source(tmp_path, fmt, 1.0)
    out = tmp_path / "out"
    out.mkdir()
    dst = out / EXT[fmt]
    events = []
    real_fsync, real_replace, real_rename = lowlevel.fsync, os.replace, os.rename

    def fsync(fd, path=None):  # the package's one fsync (tl_fsync)
        events.append(("fsync", os.readlink(f"/proc/self/fd/{fd}")))
        return real_fsync(fd, path)

    def renamer(real):
        def rename(a, b, **kw):
            events.append(("replace", os.fspath(a), os.fspath(b)))
            return real(a, b, **kw)
        return rename

    monkeypatch.setattr(lowlevel, "fsync", fsync)
    monkeypatch.setattr(os, "replace", renamer(real_replace))
    monkeypatch.setattr(os, "rename", renamer(real_rename))  # the Writer's commit renames
    convert(src, dst, progress=False, shard_bytes=20_000)
    monkeypatch.undo()

    finals = [str(dst)]
    if fmt == "hf":
        finals = [str(out / s) for s in sorted(set(json.loads(dst.read_text())["weight_map"].values()))] + finals
        assert len(finals) == 4
    order = []
    for final in finals:
        at = [i for i, e in enumerate(events) if e[0] == "replace" and e[2] == final]
        assert len(at) == 1, (final, events)
        tmp = events[at[0]][1]
        assert os.path.dirname(tmp) == str(out) and os.path.basename(tmp).startswith("." + os.path.basename(final))
        assert ("fsync", tmp) in events[:at[0]], f"{tmp} renamed over {final} without an fsync"
        assert ("fsync", str(out)) in events[at[0] + 1:], f"directory not fsynced after {final} was renamed"
        order.append(at[0])
    assert order[-1] == max(order)  # HF: the index is renamed after every shard
    _same(_loaded(dst), _arrays(fmt, 1.0))
    assert not [n for n in os.listdir(out) if n.endswith(".tmp")]


@pytest.mark.parametrize("fmt", formats_marked(["safetensors", "hf", "npz", "npy", "pt", "tensorlist"]))
def test_durable_false_skips_the_fsyncs_not_the_rename(tmp_path, monkeypatch, fmt):
    src = _source(tmp_path, fmt, 1.0)
    calls = []
    monkeypatch.setattr(lowlevel, "fsync", lambda fd, path=None: calls.append(fd))
    convert(src, tmp_path / EXT[fmt], progress=False, durable=False)
    monkeypatch.undo()
    assert calls == []
    _same(_loaded(tmp_path / EXT[fmt]), _arrays(fmt, 1.0))


class _Failing:
    """A progress bar whose ``n``-th update raises: the sink has written part of its output by then."""

    def __init__(self, n):
        self.n = n

    def __call__(self, *args, **kwargs):
        return self

    def update(self, nbytes):
        self.n -= 1
        if self.n == 0:
            raise OSError("disk full")

    def close(self):
        pass


@pytest.mark.parametrize("fmt", ALL)
def test_a_failure_midway_leaves_the_old_destination_intact(tmp_path, monkeypatch, fmt):
    out = tmp_path / "out"
    out.mkdir()
    dst = out / EXT[fmt]
    convert(_source(tmp_path, fmt, 1.0, "old.tl"), dst, progress=False, shard_bytes=20_000)
    before = {n: (out / n).read_bytes() for n in os.listdir(out)}
    old = _loaded(dst)
    new = _source(tmp_path, fmt, 7.0, "new.tl")
    if fmt == "pt":  # the bar runs before torch.save: fail inside it, after part of the file is written
        def partial_save(obj, f, *a, **k):
            with open(f, "wb") as fh:
                fh.write(b"PK\x03\x04 half a zip")
            raise OSError("disk full")

        monkeypatch.setattr(torch, "save", partial_save)
    else:  # the 2nd tensor's update: the 1st is written (npy: its only tensor)
        monkeypatch.setattr(sinks, "Progress", _Failing(1 if fmt == "npy" else 2))
    with pytest.raises(OSError, match="disk full"):
        convert(new, dst, progress=False, shard_bytes=20_000)
    monkeypatch.undo()
    assert {n: (out / n).read_bytes() for n in os.listdir(out)} == before  # no temporary file left either
    _same(_loaded(dst), old)


def test_hf_failure_while_renaming_leaves_no_temporary_files(tmp_path, monkeypatch):
    from tensorlist._storage import commit as _commit

    src = _source(tmp_path, "hf", 1.0)
    out = tmp_path / "out"
    out.mkdir()
    real = _commit.durable_replace
    seen = []

    def flaky(tmp, path, durable=True):
        seen.append(path)
        if path.endswith(".index.json"):
            raise OSError("rename failed")
        return real(tmp, path, durable)

    monkeypatch.setattr(sinks, "durable_replace", flaky)
    with pytest.raises(OSError, match="rename failed"):
        convert(src, out / EXT["hf"], progress=False, shard_bytes=20_000)
    assert len(seen) == 4 and seen[-1].endswith(".index.json")  # the index comes last
    assert os.listdir(out) == []


# --- one file-type check -------------------------------------------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
@pytest.mark.parametrize("name,fmt", [("x.safetensors", None), ("x.npy", None), ("x.npz", None),
                                      pytest.param("x.pt", None, marks=needs_torch),
                                      ("model.safetensors.index.json", None), ("x.tl", None), ("x.dat", None),
                                      ("x.dat", "npz"), ("x.dat", "safetensors")])
def test_a_fifo_source_is_a_format_error_not_a_hang(tmp_path, name, fmt):
    os.mkfifo(tmp_path / name)
    with _deadline(20), pytest.raises(tl.FormatError, match=r"not a regular file: it is a FIFO"):
        convert(tmp_path / name, tmp_path / "out.tl", src_format=fmt, progress=False)
    assert not (tmp_path / "out.tl").exists()


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_a_fifo_shard_is_a_format_error_naming_the_index_entry(tmp_path):
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": "shard.safetensors"}}))
    os.mkfifo(tmp_path / "shard.safetensors")
    with _deadline(20), pytest.raises(tl.FormatError, match=r"index.json: field 'weight_map/w': shard '.*shard"
                                                            r"\.safetensors' is not a regular file: it is a FIFO"):
        open_source(tmp_path / "model.safetensors.index.json")


# --- Hugging Face shards stay in the index's directory ---------------------------------------

def _hf(tmp_path):
    """A one-shard checkpoint in ``hf/``: (index path, shard path)."""
    (tmp_path / "hf").mkdir()
    index = tmp_path / "hf" / EXT["hf"]
    convert(_source(tmp_path, "hf", 1.0), index, progress=False)
    shard = tmp_path / "hf" / json.loads(index.read_text())["weight_map"]["t0"]
    return index, shard


def test_a_shard_symlinked_outside_the_directory_is_refused(tmp_path):
    index, shard = _hf(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    os.replace(shard, tmp_path / "elsewhere" / "secret.safetensors")
    os.symlink(tmp_path / "elsewhere" / "secret.safetensors", shard)
    with pytest.raises(tl.FormatError, match=r"field 'weight_map/t0': shard '.*' resolves to '.*secret\.safetensors', "
                                             r"outside the index's directory"):
        convert(index, tmp_path / "out.tl", progress=False)
    assert not (tmp_path / "out.tl").exists()
    convert(index, tmp_path / "out.tl", progress=False, allow_outside=True)  # trusted on request
    _same(tl.load(tmp_path / "out.tl"), _arrays("hf", 1.0))


def test_a_shard_under_a_symlinked_directory_is_refused(tmp_path):
    index, shard = _hf(tmp_path)
    (tmp_path / "elsewhere").mkdir()
    os.replace(shard, tmp_path / "elsewhere" / shard.name)
    os.symlink(tmp_path / "elsewhere", tmp_path / "hf" / "sub")
    doc = json.loads(index.read_text())
    doc["weight_map"] = {k: "sub/" + v for k, v in doc["weight_map"].items()}
    index.write_text(json.dumps(doc))
    with pytest.raises(tl.FormatError, match="outside the index's directory"):
        open_source(index)


def test_the_hugging_face_cache_layout_is_accepted(tmp_path):
    """snapshots/<rev>/ holds symlinks into blobs/, the index's own target directory."""
    index, shard = _hf(tmp_path)
    blobs, snap = tmp_path / "cache" / "blobs", tmp_path / "cache" / "snapshots" / "abc"
    blobs.mkdir(parents=True)
    snap.mkdir(parents=True)
    for i, p in enumerate((index, shard)):
        os.replace(p, blobs / f"blob{i}")
        os.symlink(os.path.relpath(blobs / f"blob{i}", snap), snap / p.name)
    with open_source(snap / index.name) as s:
        _same({e.name: e.array() for e in s.entries}, _arrays("hf", 1.0))


# --- one torch bridge ------------------------------------------------------------------

@needs_torch
@pytest.mark.parametrize("bad,why", [
    (lambda: torch.ones(3).to_sparse(), r"a sparse tensor \(torch\.sparse_coo\)"),
    (lambda: torch.empty(2, device="meta"), "a tensor on the meta device"),
])
def test_a_tensor_without_plain_bytes_in_a_pt_source_is_a_clear_format_error(tmp_path, bad, why):
    torch.save({"w": torch.ones(2), "bad": bad()}, tmp_path / "s.pt")
    (tmp_path / "out").mkdir()
    for dst in ("s.tl", "s.safetensors", "s.npz"):
        with pytest.raises(tl.FormatError, match=r"s\.pt: tensor 1 \('bad'\): " + why) as e:
            convert(tmp_path / "s.pt", tmp_path / "out" / dst, progress=False)
        assert "\n" not in str(e.value) and isinstance(e.value.__cause__, TypeError)
    assert os.listdir(tmp_path / "out") == []


@needs_torch
def test_conj_and_neg_views_are_resolved(tmp_path):
    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    torch.save({"c": z.conj(), "n": torch._neg_view(torch.arange(3.0))}, tmp_path / "v.pt")
    convert(tmp_path / "v.pt", tmp_path / "v.tl", progress=False)
    got = tl.load(tmp_path / "v.tl")
    assert got["c"].tolist() == [1 - 2j, 3 + 4j] and got["n"].tolist() == [-0.0, -1.0, -2.0]


def test_importing_convert_does_not_import_torch():
    code = "import sys, tensorlist.convert; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# --- one URL rule ------------------------------------------------------------------

def test_file_urls_work_for_every_format(tmp_path):
    src = _source(tmp_path, "npz", 1.0)
    for fmt in ("safetensors", "npz", "pt") if torch is not None else ("safetensors", "npz"):
        convert(src.as_uri(), (tmp_path / EXT[fmt]).as_uri(), progress=False)
        _same(_loaded((tmp_path / EXT[fmt]).as_uri()), _arrays(fmt, 1.0))


def test_remote_urls_are_refused_for_local_only_formats(tmp_path):
    with pytest.raises(ValueError, match="remote URLs are supported for tensorlist and lamp files, not npz"):
        convert(_source(tmp_path, "npz", 1.0), "s3://bucket/m.npz", progress=False)
    with pytest.raises(ValueError, match="remote URLs are supported for tensorlist and lamp files, not safetensors"):
        open_source("s3://bucket/m.safetensors")
