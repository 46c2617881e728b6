"""Encrypted lists behind fsspec URLs: save, Writer, save_document, load, open, load_document, validate.

Against ``memory://`` and a real S3-compatible server (moto's, conftest's ``s3``). The remote
writer seals with the local writer's chunks and tags (``Seal.stream_list``), the remote reader
opens with the local reader's ``Opener``; no plaintext byte reaches the store or a local file.
"""
import os
import tempfile

import numpy as np
import pytest

import tensorlist as tl
import tensorlist.remote as remote

pytest.importorskip("cryptography")
fsspec = pytest.importorskip("fsspec", reason="remote storage needs fsspec")

KEY = tl.Key(bytes(range(32)))
SENTINEL = b"PLAINTEXT-SENTINEL-7f3a"


def _tensors():
    rng = np.random.default_rng(3)
    return {
        "w": rng.standard_normal((700, 800)).astype(np.float32),  # three 1 MiB chunks
        "be": np.arange(1000, dtype=">i4"),
        "empty": np.zeros((0, 5), np.float16),
        "s": np.frombuffer(SENTINEL * 5000, np.uint8),
    }


def _equal(got, want):
    assert list(got) == list(want)
    for k, v in want.items():
        assert got[k].shape == v.shape, k
        assert got[k].tobytes() == v.astype(v.dtype.newbyteorder("<")).tobytes(), k


@pytest.fixture(params=["memory", "s3"])
def base(request):
    if request.param == "memory":
        return f"memory://enc-{os.urandom(4).hex()}"
    return request.getfixturevalue("s3_prefix")


def _data_object(url: str, pointer=None) -> bytes:
    fs, path = fsspec.core.url_to_fs(url)
    fs.invalidate_cache()
    return fs.cat_file(path.rsplit("/", 1)[0] + "/" + tl.open(url, pointer=pointer).descriptor.location)


def test_save_and_load_round_trip(base):
    url = f"{base}/m.tl"
    tl.save(url, _tensors(), metadata={"owner": "lab"}, key=KEY)
    _equal(tl.load(url, key=KEY), _tensors())
    _equal(tl.load(url, key=KEY, verify=True), _tensors())
    with tl.open(url, key=KEY) as r:
        assert r.encrypted and r.metadata == {"owner": "lab"}
        _equal(r.get_many(["w", "s"]), {k: _tensors()[k] for k in ("w", "s")})
        buf = np.empty(64, np.uint8)
        r.readinto(buf, r.info("s").byte_offset)
        assert buf.tobytes() == (SENTINEL * 5)[:64]
    with tl.open(url) as r:  # without the key: the table reads, the metadata does not
        assert r.keys() == list(_tensors()) and r.info("w").shape == (700, 800) and r.metadata is None
    assert [d.pointer for d in tl.validate(url, verify=True, key=KEY)] == [""]
    assert SENTINEL not in _data_object(url)


def test_remote_layout_is_the_local_one(base, tmp_path):
    url = f"{base}/m.tl"
    tl.save(url, _tensors(), key=KEY)
    tl.save(tmp_path / "m.tl", _tensors(), key=KEY)
    here, there = tl.open(tmp_path / "m.tl").descriptor, tl.open(url).descriptor
    assert here.tensors.offsets == there.tensors.offsets and here.byte_length == there.byte_length
    assert (here.encryption.tags_offset, here.encryption.tags_length) == \
        (there.encryption.tags_offset, there.encryption.tags_length)
    assert len(_data_object(url)) == os.path.getsize(tmp_path / tl.open(tmp_path / "m.tl").descriptor.location)


def test_streamed_writer_with_reserve(base):
    url = f"{base}/w.tl"
    want = _tensors()
    with tl.Writer(url, metadata={"n": 1}, key=KEY) as w:
        w.add("w", want["w"])
        r = w.reserve("r", (300, 7), np.float64)
        w.add("be", want["be"])  # after a reserve: spooled (sealed) until close
        w.add("empty", want["empty"])
        z = w.reserve("z", (0,), np.int8)
        w.add("s", want["s"])
        r[:] = np.arange(2100.0).reshape(300, 7)
    got = tl.load(url, key=KEY)
    assert list(got) == ["w", "r", "be", "empty", "z", "s"] and got["z"].shape == z.shape
    np.testing.assert_array_equal(got["r"], np.arange(2100.0).reshape(300, 7))
    _equal({k: got[k] for k in want}, want)
    assert tl.open(url, key=KEY).metadata == {"n": 1}
    assert SENTINEL not in _data_object(url)


def test_document_round_trip(base):
    url = f"{base}/ckpt.json"
    doc = {"epoch": 2, "model": tl.Tensors(_tensors(), metadata={"m": 1}), "opt": tl.Tensors([np.ones(9)])}
    tl.save_document(url, doc, key=KEY)
    got = tl.load_document(url, key=KEY)
    assert got["epoch"] == 2
    _equal(got["model"], _tensors())
    np.testing.assert_array_equal(tl.load(url, pointer="/opt", key=KEY)["0"], np.ones(9))
    assert tl.open(url, pointer="/model", key=KEY).metadata == {"m": 1}
    assert len(tl.validate(url, verify=True, key=KEY)) == 2


def _refused(url, read, key, match):
    with pytest.raises(tl.EncryptionError, match=match) as info:
        read(key)
    assert url in str(info.value)


def test_without_the_key_or_with_another_nothing_is_returned(base):
    url, doc = f"{base}/m.tl", f"{base}/d.json"
    tl.save(url, _tensors(), key=KEY)
    tl.save_document(doc, {"model": tl.Tensors(_tensors())}, key=KEY)
    other = tl.Key.generate()
    for read in (lambda k: tl.load(url, key=k), lambda k: tl.open(url, key=k)["w"],
                 lambda k: tl.validate(url, verify=True, key=k)):
        _refused(url, read, other, "another key")
        _refused(url, read, None, "key")
    _refused(doc, lambda k: tl.load_document(doc, key=k), other, "another key")
    _refused(doc, lambda k: tl.load_document(doc, key=k), None, "key")
    _refused(url, lambda k: tl.validate(url, key=k), other, "another key")  # the key check alone


def test_an_altered_chunk_is_refused_naming_the_url_and_tensor():
    url = f"memory://enc-{os.urandom(4).hex()}/m.tl"
    tl.save(url, _tensors(), key=KEY)
    fs, path = fsspec.core.url_to_fs(url)
    data = path.rsplit("/", 1)[0] + "/" + tl.open(url).descriptor.location
    blob = bytearray(fs.cat_file(data))
    blob[tl.open(url).info("w").byte_offset + (1 << 20) + 3] ^= 1
    fs.pipe_file(data, bytes(blob))
    with pytest.raises(tl.EncryptionError, match="fails authentication") as info:
        tl.load(url, key=KEY)
    assert url in str(info.value) and info.value.tensor_name == "w"
    np.testing.assert_array_equal(tl.open(url, key=KEY)["be"], np.arange(1000))  # other tensors still read


def _scan(root):
    hits = []
    for d, _, files in os.walk(root):
        for f in files:
            try:
                with open(os.path.join(d, f), "rb") as fh:
                    if SENTINEL in fh.read():
                        hits.append(os.path.join(d, f))
            except OSError:
                pass
    return hits


def test_no_plaintext_reaches_a_local_file(tmp_path, monkeypatch):
    """Every local file (the reserve spool included) is scanned while the upload completes."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    scans = []
    finish = remote._DataStream.finish

    def scanning_finish(self):
        scans.append((sorted(os.listdir(tmp_path)), _scan(tmp_path)))
        finish(self)

    monkeypatch.setattr(remote._DataStream, "finish", scanning_finish)
    url = f"memory://enc-{os.urandom(4).hex()}"
    tl.save(f"{url}/m.tl", _tensors(), key=KEY)
    with tl.Writer(f"{url}/w.tl", key=KEY) as w:
        r = w.reserve("r", (len(SENTINEL) * 100,), np.uint8)
        w.add("s", _tensors()["s"])  # spooled
        r[:] = np.frombuffer(SENTINEL * 100, np.uint8)
    tl.save_document(f"{url}/d.json", {"m": tl.Tensors(_tensors())}, key=KEY)
    assert len(scans) == 3 and any(names for names, _ in scans)  # the spool existed during the Writer's upload
    assert all(hits == [] for _, hits in scans), scans
    with tl.Writer(f"{url}/plain.tl") as w:  # the check itself: a plain spool does hold the sentinel
        r = w.reserve("r", (len(SENTINEL),), np.uint8)
        w.add("s", _tensors()["s"])
        r[:] = 0
    assert scans[-1][1]
    for name, pointer in (("m.tl", None), ("w.tl", None), ("d.json", "/m")):
        assert SENTINEL not in _data_object(f"{url}/{name}", pointer)
        assert tl.open(f"{url}/{name}", pointer=pointer).encrypted


def test_file_urls_and_refusals(tmp_path):
    url = f"file://{tmp_path}/m.tl"
    remote.save(url, _tensors(), key=KEY)
    _equal(remote.load(url, key=KEY), _tensors())
    _refused(str(tmp_path / "m.tl"), lambda k: remote.load(url, key=k), None, "key")
    with pytest.raises(ValueError, match="lamp"):
        tl.save("memory://enc/lamp.tl", [np.ones(3)], lamp=True, key=KEY)
    with pytest.raises(TypeError, match="Key.from_file"):
        tl.save("memory://enc/k.tl", [np.ones(3)], key="key.bin")


def test_a_plain_list_read_with_a_key_is_refused():
    """A plain file put in place of an encrypted one must not pass for it."""
    url = f"memory://enc-{os.urandom(4).hex()}/m.tl"
    tl.save(url, _tensors())
    _refused(url, lambda k: tl.load(url, key=k), KEY, "not encrypted")
    _equal(tl.load(url), _tensors())
