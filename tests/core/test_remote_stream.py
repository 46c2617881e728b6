"""Streamed remote writes: save, Writer and save_document upload as they write, descriptor last.

Against a real S3-compatible server (moto's, on loopback: conftest's ``s3``) and ``memory://``.
The memory bound is measured in a child process (anonymous RSS, sampled while it saves), so
that the server's copy of the object, which lives in this process, does not count.
"""
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

import tensorlist as tl

fsspec = pytest.importorskip("fsspec", reason="remote storage needs fsspec")


def _mixed():
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((300, 70)).astype(np.float32),
        "be": np.arange(1000, dtype=">i4"),                      # byte-swapped while streaming
        "cbe": (np.arange(9) + 1j).astype(">c16"),                # complex: swapped per half
        "bf": rng.standard_normal(33).astype(ml_dtypes.bfloat16),
        "empty": np.zeros((0, 5), np.float16),
        "scalar": np.float64(2.5),
        "strided": np.arange(40, dtype=np.int16).reshape(8, 5)[:, ::2],
    }


def _equal(got, want):
    assert list(got) == list(want)
    for k, v in want.items():
        v = np.asarray(v)
        assert got[k].dtype == v.dtype.newbyteorder("=") or got[k].dtype == v.dtype, k
        assert got[k].shape == v.shape, k
        assert got[k].tobytes() == np.ascontiguousarray(v.astype(v.dtype.newbyteorder("<"))).tobytes(), k


@pytest.fixture(params=["memory", "s3"])
def base(request):
    if request.param == "memory":
        return f"memory://stream-{os.urandom(4).hex()}"
    return request.getfixturevalue("s3_prefix")


def test_save_streams_every_dtype_and_checksums(base):
    url = f"{base}/m.tl"
    tl.save(url, _mixed(), metadata={"k": [1, 2]})
    _equal(tl.load(url, verify=True), _mixed())
    assert tl.open(url).metadata == {"k": [1, 2]}


def test_save_matches_a_local_save_byte_for_byte(base, tmp_path):
    url = f"{base}/m.tl"
    tl.save(url, _mixed())
    tl.save(tmp_path / "m.tl", _mixed())
    fs, path = fsspec.core.url_to_fs(url)
    remote_desc = fs.cat_file(path).decode()
    local_desc = (tmp_path / "m.tl").read_text()
    local_data = [n for n in os.listdir(tmp_path) if n.endswith(".data")][0]
    remote_data = tl.open(url).descriptor.location
    assert remote_desc.replace(remote_data, "X") == local_desc.replace(local_data, "X")
    assert fs.cat_file(f"{os.path.dirname(path)}/{remote_data}") == (tmp_path / local_data).read_bytes()


def test_lamp_mode_streams_lamps_bytes(base, tmp_path):
    arrays = [np.zeros((2, 3), np.float32), np.int64(1)]
    tl.save(f"{base}/x.lamp", arrays, lamp=True)
    tl.save(tmp_path / "x.lamp", arrays, lamp=True)
    fs, path = fsspec.core.url_to_fs(f"{base}/x.lamp")
    assert fs.cat_file(path) == (tmp_path / "x.lamp").read_bytes()
    assert fs.cat_file(path + ".data") == (tmp_path / "x.lamp.data").read_bytes()


def test_writer_streams_adds_and_spools_what_follows_a_reserve(base):
    url = f"{base}/w.tl"
    with tl.Writer(url, metadata={"kind": "stream"}) as w:
        w.add("a", np.arange(5000, dtype=np.float64))
        r = w.reserve("r", (64, 64), np.float32)
        w.add("b", np.arange(7, dtype=">i8"))               # after the reserve: spooled until close
        r2 = w.reserve("r2", 10, np.int16)
        w.add("c", np.ones(3, np.uint8))
        r[:] = 3.0
        r2[:] = np.arange(10)
    got = tl.load(url, verify=True)
    assert got["a"].tolist() == list(range(5000)) and (got["r"] == 3).all()
    assert got["b"].tolist() == list(range(7)) and got["r2"].tolist() == list(range(10))
    assert got["c"].tolist() == [1, 1, 1]
    assert tl.open(url).metadata == {"kind": "stream"}


def test_writer_abort_leaves_the_previous_file(base):
    url = f"{base}/w.tl"
    tl.save(url, {"old": np.ones(3)})
    with pytest.raises(RuntimeError, match="boom"):
        with tl.Writer(url) as w:
            w.add("new", np.zeros(100000))
            raise RuntimeError("boom")
    assert tl.load(url)["old"].tolist() == [1, 1, 1]
    fs, path = fsspec.core.url_to_fs(url)
    left = sorted(os.path.basename(p) for p in fs.ls(os.path.dirname(path), detail=False))
    assert left == sorted(["w.tl", tl.open(url).descriptor.location])


def test_save_document_and_load_document_take_urls(base):
    url = f"{base}/ckpt.json"
    first = tl.save_document(url, {"epoch": 3, "model": tl.Tensors({"w": np.arange(6.0)}),
                                   "opt": tl.Tensors([np.ones(2)], metadata={"lr": 0.1})})
    doc = tl.load_document(url)
    assert doc["epoch"] == 3 and doc["model"]["w"].tolist() == list(range(6))
    assert tl.load(url, pointer="/opt")["0"].tolist() == [1, 1]
    # keep the model's list as it is: its data object stays
    tl.save_document(url, {"epoch": 4, "model": first["model"], "opt": tl.Tensors([np.zeros(2)])})
    doc = tl.load_document(url)
    assert doc["epoch"] == 4 and doc["model"]["w"].tolist() == list(range(6)) and doc["opt"]["0"].sum() == 0


def test_a_failed_upload_keeps_the_previous_checkpoint(s3_prefix, monkeypatch):
    url = f"{s3_prefix}/ckpt.json"
    tl.save_document(url, {"model": tl.Tensors({"w": np.ones(4)})})
    fs = fsspec.core.url_to_fs(url)[0]
    real_open = fs.open

    class Broken:
        def __init__(self, f):
            self.f = f

        def write(self, data):
            raise ConnectionError("reset")

        def discard(self):
            self.f.discard()
            self.f.closed = True  # as remote's _DataStream.discard does to the file it holds

        def close(self):
            return self.f.close()

    monkeypatch.setattr(fs, "open", lambda *a, **k: Broken(real_open(*a, **k)))
    with pytest.raises(tl.TensorListError, match="reset"):
        tl.save_document(url, {"model": tl.Tensors({"w": np.zeros(4)})})
    monkeypatch.undo()
    assert tl.load_document(url)["model"]["w"].tolist() == [1, 1, 1, 1]


_MEASURE = """
import os, sys, threading, time, fsspec, numpy as np, tensorlist as tl
url, mib = sys.argv[1], int(sys.argv[2])
tl.save(url, {"warm": np.zeros(4)})       # imports s3fs, botocore... and connects: not the save's memory
src = os.path.join(sys.argv[3], "src.bin")
with open(src, "wb") as f:
    f.truncate(mib << 20)                 # a sparse file: its pages are file-backed, not anonymous
arrays = {f"t{i}": np.memmap(src, np.float32, "r", offset=i * (16 << 20), shape=(4 << 20,))
          for i in range(mib // 16)}

def anon():
    for line in open("/proc/self/status"):
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) << 10

peak, done = [anon()], []
base = peak[0]
def sample():
    while not done:
        peak.append(anon())
        time.sleep(0.02)
t = threading.Thread(target=sample)
t.start()
tl.save(url, arrays)
done.append(1)
t.join()
print((max(peak) - base) >> 20)
"""


def test_streamed_save_holds_little_memory(s3, s3_prefix, tmp_path):
    """A 256 MiB save to the S3 server grows the writer's anonymous memory by a few parts only."""
    url = f"{s3_prefix}/big.tl"
    env = dict(os.environ, **s3["env"])
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(_MEASURE), url, "256", str(tmp_path)],
                       capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode == 0, r.stderr
    grew = int(r.stdout.strip().splitlines()[-1])
    assert grew < 128, f"anonymous memory grew by {grew} MiB for a 256 MiB save"  # measured: 62
    assert tl.open(url).descriptor.byte_length == 256 << 20


def test_validate_takes_urls(base):
    url = f"{base}/v.tl"
    tl.save(url, {"w": np.arange(4.0)})
    [desc] = tl.validate(url, verify=True)
    assert desc.keys() == ["w"] and desc.file == url
    fs, path = fsspec.core.url_to_fs(url)
    data = f"{os.path.dirname(path)}/{desc.location}"
    fs.pipe_file(data, bytes(desc.byte_length))
    with pytest.raises(tl.ChecksumError, match="'w'"):
        tl.validate(url, verify=True)
    tl.validate(url)  # the size is right: only verify reads the bytes
    fs.rm_file(data)
    with pytest.raises(tl.FormatError, match="does not exist") as info:
        tl.validate(url)
    assert info.value.file == url and info.value.field == "location"
    fs.pipe_file(path, b'{"location": 3}')
    with pytest.raises(tl.FormatError, match="schema") as info:
        tl.validate(url)
    assert info.value.file == url
