"""Remote storage against a real S3-compatible server (moto's, on loopback: the ``s3`` fixture of conftest.py) and memory://.

The mapping interface every reader shares is tested once for all of them in test_readers.py.
"""
import json
import os
import subprocess
import sys
import threading
import uuid

import ml_dtypes
import numpy as np
import pytest

import tensorlist as tl
from tensorlist.remote import RemoteError, RemoteReader, is_url

fsspec = pytest.importorskip("fsspec", reason="remote URLs need fsspec (pip install 'tensorlist[remote]')")


def _objects(fs, url):
    fs.invalidate_cache()
    folder = url.rsplit("/", 1)[0].removeprefix("s3://")
    try:
        return sorted(p.rsplit("/", 1)[1] for p in fs.ls(folder, detail=False))
    except FileNotFoundError:
        return []


def _tensors():
    rng = np.random.default_rng(1)
    return {"w": rng.standard_normal((64, 32)).astype(np.float32),
            "bf": rng.standard_normal(10).astype(ml_dtypes.bfloat16),
            "mask": np.array([True, False, True]), "step": np.int64(9), "empty": np.zeros((0,), np.float16)}


def test_is_url():
    assert is_url("s3://b/k") and is_url("memory://x/y") and is_url("file:///tmp/x")
    assert not is_url("model.tl") and not is_url("/abs/model.tl") and not is_url("C:\\x")


def test_s3_round_trip(s3, s3_prefix):
    url = f"{s3_prefix}/model.tl"
    want = _tensors()
    tl.save(url, want, metadata={"epoch": 2})
    got = tl.load(url)
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].tobytes() == np.asarray(v).tobytes()
    with tl.open(url) as r:
        assert isinstance(r, RemoteReader)
        assert r.metadata == {"epoch": 2} and r.keys() == list(want) and "w" in r and len(r) == 5
        assert r.verify() == 5
    assert tl.load(url, verify=True)["step"] == 9
    names = _objects(s3["fs"], url)
    assert len(names) == 2 and "model.tl" in names
    assert json.loads(s3["fs"].cat_file(url.removeprefix("s3://")))["location"] in names


def test_writer_to_s3_and_replacement_deletes_old_data(s3, s3_prefix):
    url = f"{s3_prefix}/stream.tl"
    with tl.Writer(url, metadata={"k": 1}) as w:
        w.add("a", np.arange(5))
        b = w.reserve("b", (4, 4), np.float32)
        b[:] = 3
    assert tl.load(url)["b"].sum() == 48
    first = set(_objects(s3["fs"], url))
    tl.save(url, {"a": np.zeros(2)})
    second = set(_objects(s3["fs"], url))
    assert len(second) == 2 and "stream.tl" in second and first & second == {"stream.tl"}
    assert list(tl.load(url)) == ["a"]


def test_only_requested_tensors_are_fetched_in_parallel(s3, s3_prefix):
    url = f"{s3_prefix}/big.tl"
    tensors = {f"t{i}": np.full(1 << 18, i, np.float32) for i in range(8)}  # 1 MiB each
    tl.save(url, tensors)
    fs = s3["fs"]
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    r = tl.open(url)
    fetched = []
    real = r.fs._cat_file

    async def counting(path, start=None, end=None, **kw):
        out = await real(path, start=start, end=end, **kw)
        fetched.append(len(out))
        return out

    r.fs._cat_file = counting
    calls = []
    real_ranges = r.fs.cat_ranges
    r.fs.cat_ranges = lambda paths, starts, ends, **kw: (calls.append(len(paths)), real_ranges(paths, starts, ends, **kw))[1]
    try:
        a = r["t3"]
        assert (a == 3).all() and fetched == [1 << 20]
        many = r.get_many(["t6", "t1", "t7"])
        assert [int(v[0]) for v in many.values()] == [6, 1, 7]
        # one batch: t1, and t6+t7 (neighbours) as one range
        assert fetched == [1 << 20, 1 << 20, 2 << 20] or fetched == [1 << 20, 2 << 20, 1 << 20]
        assert calls == [1, 2]
        assert sum(fetched) == 4 << 20  # of the 8 MiB stored
    finally:  # s3fs's methods are instance attributes (fsspec mirrors its async methods): put them back
        r.fs._cat_file = real
        r.fs.cat_ranges = real_ranges
    assert fs is not None


def test_failed_data_upload_leaves_no_descriptor(s3, s3_prefix, monkeypatch):
    url = f"{s3_prefix}/fail.tl"
    fs = fsspec.core.url_to_fs(url)[0]

    real_open = fs.open

    class Broken:  # the upload fails midway, after some bytes went out
        def __init__(self, f):
            self.f, self.n = f, 0

        def write(self, data):
            self.n += len(data)
            if self.n > 1024:
                raise ConnectionError("connection reset by peer")
            return self.f.write(data)

        def close(self):
            return self.f.close()

        def discard(self):
            self.f.discard()
            self.f.closed = True  # as remote's _DataStream.discard does to the file it holds

    monkeypatch.setattr(fs, "open", lambda *a, **k: Broken(real_open(*a, **k)))
    with pytest.raises(RemoteError, match=r"fail.tl: cannot upload tensor data: .*connection reset"):
        tl.save(url, _tensors())
    monkeypatch.undo()
    assert _objects(s3["fs"], url) == []


def test_failed_descriptor_upload_keeps_the_old_file_and_cleans_up(s3, s3_prefix, monkeypatch):
    url = f"{s3_prefix}/keep.tl"
    tl.save(url, {"old": np.ones(3)})
    before = _objects(s3["fs"], url)
    fs = fsspec.core.url_to_fs(url)[0]

    def broken(*a, **k):
        raise ConnectionError("timed out")

    monkeypatch.setattr(fs, "pipe_file", broken)
    with pytest.raises(RemoteError, match="cannot upload the descriptor"):
        tl.save(url, {"new": np.zeros(3)})
    monkeypatch.undo()
    assert _objects(s3["fs"], url) == before  # the new data object was removed again
    assert list(tl.load(url)) == ["old"]


def test_remote_reads_are_validated(s3, s3_prefix):
    fs = s3["fs"]
    url = f"{s3_prefix}/v.tl"
    tl.save(url, {"w": np.ones(16, np.float32)})
    key = url.removeprefix("s3://")
    desc = json.loads(fs.cat_file(key))
    data_key = key.rsplit("/", 1)[0] + "/" + desc["location"]
    fs.pipe_file(data_key, fs.cat_file(data_key)[:10])  # truncated data object
    with pytest.raises(tl.FormatError, match="v.tl"):
        tl.open(url)
    bad = dict(desc, location="../escape.data")
    fs.pipe_file(key, json.dumps(bad).encode())
    with pytest.raises(tl.FormatError, match="escapes"):
        tl.open(url)
    fs.pipe_file(key, b'{"location": "x", "byteOffset": 0, "byteOffset": 1, "byteLength": 0}')
    with pytest.raises(tl.FormatError, match="(?i)duplicate"):
        tl.open(url)
    with pytest.raises(FileNotFoundError, match="no such file"):
        tl.open(f"{s3_prefix}/missing.tl")


@pytest.mark.slow  # starts a process
def test_unreachable_endpoint_is_one_clear_error(unused_port):
    pytest.importorskip("s3fs", reason="s3:// URLs need s3fs")
    url = "s3://tensorlist-tests/x.tl"
    opts = {"client_kwargs": {"endpoint_url": f"http://127.0.0.1:{unused_port}"}, "key": "k", "secret": "s",
            "config_kwargs": {"connect_timeout": 1, "retries": {"max_attempts": 1}}, "retries": 1}
    with pytest.raises(RemoteError, match=r"s3://tensorlist-tests/x.tl: cannot read the descriptor's size") as e:
        RemoteReader(url, storage_options=opts)
    assert "\n" not in str(e.value)
    env = dict(os.environ, AWS_ENDPOINT_URL=opts["client_kwargs"]["endpoint_url"], AWS_ACCESS_KEY_ID="k",
               AWS_SECRET_ACCESS_KEY="s", AWS_MAX_ATTEMPTS="1", AWS_DEFAULT_REGION="us-east-1")
    p = subprocess.run([sys.executable, "-m", "tensorlist", "inspect", url], capture_output=True, text=True,
                       env=env, timeout=120)
    assert p.returncode == 1
    assert p.stderr.count("\n") == 1 and "Traceback" not in p.stderr
    assert p.stderr.startswith("tensorlist inspect: error: s3://tensorlist-tests/x.tl: cannot")


@pytest.mark.slow  # starts processes
def test_cli_convert_to_s3_inspect_and_diff(s3, s3_prefix, tmp_path):
    save_file = pytest.importorskip("safetensors.numpy", reason="converting needs safetensors").save_file

    src = tmp_path / "m.safetensors"
    save_file({"a": np.arange(6, dtype=np.float32), "b": np.eye(3)}, str(src))
    url = f"{s3_prefix}/cli.tl"
    env = dict(os.environ, **s3["env"])

    def run(*args):
        return subprocess.run([sys.executable, "-m", "tensorlist", *args], capture_output=True, text=True,
                              env=env, timeout=120)

    p = run("convert", str(src), url)
    assert p.returncode == 0, p.stderr
    p = run("inspect", url)
    assert p.returncode == 0 and "float32" in p.stdout and "(3, 3)" in p.stdout
    p = run("validate", "--verify", url)
    assert p.returncode == 0 and "checksums verified" in p.stdout
    p = run("diff", str(src), url)
    assert p.returncode == 0 and p.stdout.startswith("same")
    p = run("convert", url, str(tmp_path / "back.npz"))
    assert p.returncode == 0, p.stderr
    assert (np.load(tmp_path / "back.npz")["b"] == np.eye(3)).all()


def test_memory_filesystem(tmp_path):
    url = f"memory://tl-tests/{uuid.uuid4().hex[:8]}/m.tl"
    want = _tensors()
    tl.save(url, want, metadata={"m": True})
    with tl.open(url) as r:
        assert r["bf"].tobytes() == want["bf"].tobytes() and r.metadata == {"m": True}
    fs, path = fsspec.core.url_to_fs(url)
    desc = json.loads(fs.cat_file(path))
    desc["tensors"][0]["crc32c"] ^= 1
    fs.pipe_file(path, json.dumps(desc).encode())
    with pytest.raises(tl.ChecksumError, match="CRC32C"):
        tl.load(url, verify=True)
    with pytest.raises(KeyError, match="no tensor 'nope'"):
        tl.open(url)["nope"]


def test_many_small_tensors_are_few_requests(tmp_path):
    url = f"memory://tl-tests/{uuid.uuid4().hex[:8]}/small.tl"
    want = {f"t{i}": np.full(3, i, np.int16) for i in range(5000)}
    tl.save(url, want)
    r = tl.open(url)
    calls = []
    real = r.fs.cat_file
    r.fs.cat_file = lambda *a, **k: (calls.append(a), real(*a, **k))[1]
    try:
        got = r.to_dict()
    finally:  # fsspec caches filesystem instances: leave no instance attribute to shadow the class's method
        del r.fs.cat_file
    assert len(calls) == 1 and all((got[k] == v).all() for k, v in want.items())
    assert not got["t7"].flags.writeable


def test_concurrent_readers(tmp_path):
    url = f"memory://tl-tests/{uuid.uuid4().hex[:8]}/c.tl"
    tl.save(url, {f"t{i}": np.full(100, i) for i in range(10)})
    errors = []

    def read():
        try:
            with tl.open(url) as r:
                assert int(r["t7"][0]) == 7
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=read) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
