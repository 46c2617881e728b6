"""One mapping test suite, run against every reader, so that the reading paths cannot drift apart.

Each test of :class:`TestMapping` runs once per reader kind:

========== ============================================== =========================
kind       opened as                                      reader
========== ============================================== =========================
mmap       ``/tmp/.../x.tl``                              ``tensorlist.Reader``, mapped
pread      ``/tmp/.../x.tl`` with ``mmap=False``          ``tensorlist.Reader``, pread
copy       ``/tmp/.../x.tl`` with ``mmap="copy"``         ``tensorlist.Reader``, copy-on-write mapping
file-url   ``file:///tmp/.../x.tl``                       ``tensorlist.Reader`` (file:// is local)
memory     ``memory://tl-readers/.../x.tl``               ``tensorlist.remote.RemoteReader``
s3         ``s3://tensorlist-tests/.../x.tl`` (moto)      ``tensorlist.remote.RemoteReader``
========== ============================================== =========================

:class:`TestCopyOnWrite` runs the ``mmap="copy"`` cases against every kind
(remote readers give writable private copies).

Lists are written through the public API at the reader's own address
(``tensorlist.save(url, ...)``). The embedded document is written locally
(``save_document``) and copied there byte for byte, so that every reader
reads the same bytes; broken files are written byte by byte.
"""
from __future__ import annotations

import json
import os
import re
import posixpath
import uuid
from pathlib import Path

import numpy as np
import pytest

import tensorlist as tl
from _compat import ml_dtypes

KINDS = ["mmap", "pread", "copy", "file-url", "memory", "s3"]
REMOTE = ("memory", "s3")


class Store:
    """Where one reader kind's files live: the address to open, and raw access to the bytes."""

    kind: str
    open_kwargs: dict = {}

    def url(self, name: str) -> str:
        raise NotImplementedError

    def read(self, name: str) -> bytes:
        raise NotImplementedError

    def write(self, name: str, data: bytes) -> None:
        raise NotImplementedError

    def delete(self, name: str) -> None:
        raise NotImplementedError

    # --- through the public API -------------------------------------------------
    def save(self, name: str, tensors, **kwargs) -> str:
        tl.save(self.url(name), tensors, **kwargs)
        return self.url(name)

    def open(self, name: str, **kwargs):
        return tl.open(self.url(name), **{**self.open_kwargs, **kwargs})

    def load(self, name: str, **kwargs):
        return tl.load(self.url(name), **{**self.open_kwargs, **kwargs})

    # --- byte-level helpers -----------------------------------------------------
    def publish(self, folder: Path) -> None:
        """Copies every file of a local folder here, byte for byte."""
        for p in sorted(folder.iterdir()):
            self.write(p.name, p.read_bytes())

    def descriptor(self, name: str) -> dict:
        return json.loads(self.read(name))

    def data_name(self, name: str) -> str:
        return self.descriptor(name)["location"]


class LocalStore(Store):
    def __init__(self, kind: str, root: Path):
        self.kind, self.root = kind, root
        self.open_kwargs = {"mmap": {"pread": False, "copy": "copy"}.get(kind, True)}

    def url(self, name):
        return ("file://" if self.kind == "file-url" else "") + str(self.root / name)

    def read(self, name):
        return (self.root / name).read_bytes()

    def write(self, name, data):
        (self.root / name).parent.mkdir(parents=True, exist_ok=True)
        (self.root / name).write_bytes(data)

    def delete(self, name):
        (self.root / name).unlink()


class FsspecStore(Store):
    def __init__(self, kind: str, fs, folder: str):
        self.kind, self.fs, self.folder = kind, fs, folder
        self.open_kwargs = {}

    def _path(self, name):
        return posixpath.join(self.folder, name)

    def url(self, name):
        return f"{self.kind}://{self._path(name).lstrip('/')}"

    def read(self, name):
        return self.fs.cat_file(self._path(name))

    def write(self, name, data):
        self.fs.pipe_file(self._path(name), data)

    def delete(self, name):
        self.fs.rm_file(self._path(name))


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    kind = request.param
    if kind not in REMOTE:
        yield LocalStore(kind, tmp_path)
        return
    fsspec = pytest.importorskip("fsspec", reason="remote URLs need fsspec (pip install 'tensorlist[remote]')")
    if kind == "memory":
        fs = fsspec.filesystem("memory")
        folder = f"/tl-readers/{uuid.uuid4().hex[:8]}"
        yield FsspecStore(kind, fs, folder)
        if fs.exists(folder):
            fs.rm(folder, recursive=True)  # memory:// lives as long as the process
    else:
        s3 = request.getfixturevalue("s3")
        yield FsspecStore(kind, s3["fs"], f"{s3['bucket']}/{uuid.uuid4().hex[:8]}")


# --- what is saved ---------------------------------------------------------------

def _tensors() -> dict:
    rng = np.random.default_rng(7)
    return {
        "w": rng.standard_normal((5, 3)).astype(np.float32),
        # bfloat16 where ml_dtypes is installed (none for s390x: there it is refused by name, test_platforms)
        **({"bf16": rng.standard_normal(7).astype(ml_dtypes.bfloat16)} if ml_dtypes is not None
           else {"u16": np.arange(7, dtype=np.uint16)}),  # as many tensors either way
        "f16": np.linspace(-2, 2, 9, dtype=np.float16).reshape(3, 3),
        "i8": np.arange(-4, 4, dtype=np.int8),
        "u64": np.array([0, 1, 2**64 - 1], np.uint64),
        "c64": (np.arange(4) + 1j * np.arange(4)).astype(np.complex64),
        "mask": np.array([True, False, True]),
        "scalar": np.array(3.5),                      # 0-d
        "step": np.int64(9),                          # 0-d from a numpy scalar
        "empty": np.zeros((0,), np.float16),
        "empty2d": np.zeros((3, 0), np.int32),
        "be_f4": np.arange(6, dtype=">f4").reshape(2, 3),   # big-endian input
        "be_i8": np.array([1, -2, 2**40], dtype=">i8"),
        "strided": np.arange(20, dtype=np.float64).reshape(4, 5)[:, ::2],  # not contiguous
    }


def _as_stored(v) -> np.ndarray:
    """What a reader must give back for ``v``: little-endian, C order, same values."""
    a = np.asarray(v)
    return a.astype(a.dtype.newbyteorder("<"), order="C")  # native ("=") is big-endian on some hosts


def _same(got: np.ndarray, want) -> None:
    want = _as_stored(want)
    assert got.dtype == want.dtype, (got.dtype, want.dtype)
    assert got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def _saved(store: Store, name: str = "m.tl", **kwargs):
    want = _tensors()
    store.save(name, want, metadata={"epoch": 3, "note": ["a", None, 1.5]}, **kwargs)
    return want


def _embedded_document(store: Store, tmp_path: Path, name: str = "doc.json") -> None:
    """A JSON document embedding two lists, made locally and copied to the store."""
    stage = tmp_path / "stage"
    stage.mkdir()
    tl.save_document(stage / name, {
        "note": {"tensors": "not a list here", "text": "x"},
        "model": tl.Tensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, metadata={"m": 1}),
        "opt": [tl.Tensors([np.ones(2, np.int16), np.zeros((), np.float64)])],
    })
    if isinstance(store, LocalStore):
        for p in stage.iterdir():
            p.rename(store.root / p.name)
    else:
        store.publish(stage)


# --- the suite -------------------------------------------------------------------

class TestMapping:
    """The mapping interface of every reader (parametrized by the ``store`` fixture)."""

    def test_the_reader_type_is_the_one_meant(self, store):
        _saved(store)
        with store.open("m.tl") as r:
            if store.kind in REMOTE:
                from tensorlist.remote import RemoteReader

                assert type(r) is RemoteReader
            else:
                assert type(r) is tl.Reader
                assert r.path == str(store.root / "m.tl")  # file:// read by the local reader

    def test_keys_len_iter_contains(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            assert r.keys() == list(want)
            assert len(r) == len(want)
            assert list(r) == list(want)
            assert "w" in r and ("bf16" in r) == (ml_dtypes is not None)
            assert "nope" not in r and 0 not in r and None not in r

    def test_positional_list_keys(self, store):
        store.save("p.tl", [np.arange(3), np.ones((2, 2), np.float32)], lamp=True)
        with store.open("p.tl") as r:
            assert r.keys() == ["0", "1"] and list(r) == ["0", "1"] and len(r) == 2
            assert "1" in r and 1 not in r
            _same(r["1"], np.ones((2, 2), np.float32))
            _same(r[0], np.arange(3))
            assert r.metadata is None

    def test_empty_list(self, store):
        store.save("e.tl", {})
        with store.open("e.tl") as r:
            assert r.keys() == [] and len(r) == 0 and list(r) == [] and r.to_dict() == {}
            assert r.items() == [] and r.values() == [] and r.verify() == 0
        assert store.load("e.tl") == {}

    def test_int_and_str_indexing(self, store):
        want = _saved(store)
        keys = list(want)
        with store.open("m.tl") as r:
            _same(r["w"], want["w"])
            _same(r[0], want[keys[0]])
            _same(r[-1], want[keys[-1]])
            _same(r[-len(keys)], want[keys[0]])
            _same(r[np.int64(1)], want[keys[1]])

    @pytest.mark.parametrize("key,error,match", [
        pytest.param(14, IndexError, "index 14 out of range for 14 tensors", id="past-end"),
        pytest.param(-15, IndexError, "index -15 out of range for 14 tensors", id="before-start"),
        pytest.param(2**70, IndexError, "out of range", id="huge"),
        pytest.param("nope", KeyError, "no tensor 'nope'", id="unknown-name"),
        pytest.param("0", KeyError, "no tensor '0'", id="positional-key-of-named-list"),
        pytest.param(1.0, TypeError, "indexed by name .str. or position .int., not float", id="float"),
        pytest.param(True, TypeError, "not bool", id="bool"),
        pytest.param(None, TypeError, "not NoneType", id="None"),
        pytest.param(b"w", TypeError, "not bytes", id="bytes"),
    ])
    def test_bad_keys(self, store, key, error, match):
        _saved(store)
        with store.open("m.tl") as r:
            with pytest.raises(error, match=match):
                r[key]
            with pytest.raises(error, match=match):
                r.info(key)

    def test_info(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            for i, (k, v) in enumerate(want.items()):
                stored = _as_stored(v)
                for key in (k, i, i - len(want)):
                    t = r.info(key)
                    assert (t.index, t.name, t.key) == (i, k, k)
                    assert t.dtype.numpy == stored.dtype and t.shape == stored.shape
                    assert t.byte_length == stored.nbytes and t.byte_offset % 64 == 0
                    assert t.crc32c is not None

    def test_metadata(self, store):
        _saved(store)
        store.save("plain.tl", {"a": np.zeros(1)})
        with store.open("m.tl") as r, store.open("plain.tl") as plain:
            assert r.metadata == {"epoch": 3, "note": ["a", None, 1.5]}
            assert plain.metadata is None

    def test_get(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            _same(r.get("f16"), want["f16"])
            assert r.get("nope") is None
            assert r.get("nope", 5) == 5

    def test_get_many(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            got = r.get_many(["be_i8", 0, -1, "empty"])
            assert list(got) == ["be_i8", 0, -1, "empty"]
            _same(got["be_i8"], want["be_i8"])
            _same(got[0], want["w"])
            _same(got[-1], want["strided"])
            _same(got["empty"], want["empty"])
            assert r.get_many([]) == {}
            with pytest.raises(KeyError, match="nope"):
                r.get_many(["w", "nope"])

    def test_the_reader_class_opens_every_address(self, store):
        want = _saved(store)
        with tl.Reader(store.url("m.tl"), **store.open_kwargs) as r:
            assert r.keys() == list(want)
            _same(r["f16"], want["f16"])

    def test_items_values_to_dict_and_load_give_what_was_saved(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            items, values, every = r.items(), r.values(), r.to_dict()
            one_by_one = {k: r[k] for k in r}
        assert [k for k, _ in items] == list(want) and list(every) == list(want)
        loaded = store.load("m.tl")
        assert list(loaded) == list(want)
        for (k, a), b in zip(items, values):
            for got in (a, b, every[k], one_by_one[k], loaded[k]):
                _same(got, want[k])
        assert ml_dtypes is None or every["bf16"].dtype == ml_dtypes.bfloat16
        assert every["scalar"].shape == () and every["empty2d"].shape == (3, 0)
        assert every["be_f4"].dtype == np.dtype("<f4")

    def test_arrays_are_read_only_except_with_mmap_false_or_copy(self, store):
        _saved(store)
        writable = store.kind in ("pread", "copy")
        with store.open("m.tl") as r:
            for a in [r["w"], r["empty"], *r.values(), *r.to_dict().values()]:
                assert a.flags.writeable == writable

    def test_arrays_outlive_the_reader(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            a, every = r["w"], r.to_dict()
        _same(a, want["w"])
        _same(every["c64"], want["c64"])

    def test_verify_ok(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            assert r.verify() == len(want)
            assert r.verify(["w", 1, -1]) == 3
        assert list(store.load("m.tl", verify=True)) == list(want)

    def test_verify_without_checksums(self, store):
        store.save("n.tl", {"a": np.ones(3)}, checksum=False)
        with store.open("n.tl") as r:
            assert r.verify() == 0 and r.info("a").crc32c is None
        with pytest.warns(UserWarning, match="stores no checksums"):
            store.load("n.tl", verify=True)

    def test_a_corrupted_byte_is_a_checksum_error(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            t = r.info("i8")
            at = r.descriptor.byte_offset + t.byte_offset + 3
        data_name = store.data_name("m.tl")
        data = bytearray(store.read(data_name))
        data[at] ^= 0x40
        store.write(data_name, bytes(data))
        with store.open("m.tl") as r:
            with pytest.raises(tl.ChecksumError, match=r"tensor 3 \('i8'\): field 'crc32c': CRC32C of the data") as e:
                r.verify()
            assert (e.value.tensor_index, e.value.tensor_name, e.value.field) == (3, "i8", "crc32c")
            assert r.verify([k for k in want if k != "i8"]) == len(want) - 1
            assert r["i8"][3] != want["i8"][3]  # reading does not check: verify does
        with pytest.raises(tl.ChecksumError, match="'i8'"):
            store.load("m.tl", verify=True)

    def test_pointer_into_an_embedded_document(self, store, tmp_path):
        _embedded_document(store, tmp_path)
        with store.open("doc.json", pointer="/model") as r:
            assert r.keys() == ["w"] and r.metadata == {"m": 1} and r.descriptor.pointer == "/model"
            _same(r["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
            assert r.verify() == 1
        with store.open("doc.json", pointer="/opt/0") as r:
            assert r.keys() == ["0", "1"]
            _same(r[0], np.ones(2, np.int16))
            _same(r["1"], np.zeros((), np.float64))
        _same(store.load("doc.json", pointer="/model")["w"], np.arange(6, dtype=np.float32).reshape(2, 3))

    def test_load_document(self, store, tmp_path):
        _embedded_document(store, tmp_path)
        doc = tl.load_document(store.url("doc.json"), **store.open_kwargs)
        assert doc["note"] == {"tensors": "not a list here", "text": "x"}
        assert list(doc["model"]) == ["w"] and list(doc["opt"][0]) == ["0", "1"]
        _same(doc["model"]["w"], np.arange(6, dtype=np.float32).reshape(2, 3))
        _same(doc["opt"][0]["0"], np.ones(2, np.int16))
        _same(doc["opt"][0]["1"], np.zeros((), np.float64))
        with pytest.raises(tl.FormatError, match="field '/opt/0/tensors': 2 tensors, above the limit of 1"):
            tl.load_document(store.url("doc.json"), max_tensors=1, **store.open_kwargs)

    @pytest.mark.parametrize("pointer,match", [
        pytest.param(None, "embedding 2 of them at '/model', '/opt/0': pass pointer=", id="none-given"),
        pytest.param("/nope", "(?i)pointer", id="no-such-key"),
        pytest.param("/opt/5", "(?i)pointer", id="no-such-index"),
        pytest.param("model", "(?i)pointer", id="malformed"),
        pytest.param("/note/text", "a TensorList must be a JSON object, got str", id="at-a-string"),
        pytest.param("/note", "missing required field", id="at-a-non-list-object"),
    ])
    def test_bad_pointers(self, store, tmp_path, pointer, match):
        _embedded_document(store, tmp_path)
        with pytest.raises(tl.FormatError, match=match):
            store.open("doc.json", pointer=pointer)
        with pytest.raises(tl.FormatError, match=match):
            store.load("doc.json", pointer=pointer)

    @pytest.mark.parametrize("limit,match", [
        pytest.param({"max_descriptor_bytes": 100}, "descriptor is [0-9]+ bytes, above the limit of 100",
                     id="max_descriptor_bytes"),
        pytest.param({"max_tensors": 13}, "14 tensors, above the limit of 13", id="max_tensors"),
        pytest.param({"max_total_bytes": 64}, "list is [0-9]+ bytes, above the limit of 64", id="max_total_bytes"),
    ])
    def test_limits_are_format_errors(self, store, limit, match):
        _saved(store)
        with pytest.raises(tl.FormatError, match=match):
            store.open("m.tl", **limit)
        with pytest.raises(tl.FormatError, match=match):
            store.load("m.tl", **limit)
        with pytest.raises(tl.FormatError, match=match):
            tl.open(store.url("m.tl"), **limit)

    def test_limits_that_hold(self, store):
        want = _saved(store)
        size = len(store.read("m.tl"))
        with store.open("m.tl", max_descriptor_bytes=size, max_tensors=len(want)) as r:
            assert len(r) == len(want)
            total = r.descriptor.byte_length
        assert list(store.load("m.tl", max_total_bytes=total)) == list(want)

    def test_a_missing_file(self, store):
        with pytest.raises(FileNotFoundError):
            store.open("missing.tl")
        with pytest.raises(FileNotFoundError):
            store.load("missing.tl")

    def test_a_missing_data_file_is_a_format_error(self, store):
        _saved(store)
        data_name = store.data_name("m.tl")
        store.delete(data_name)
        with pytest.raises(tl.FormatError, match=f"data (file|object) .*{data_name}.* does not exist"):
            store.open("m.tl")

    @pytest.mark.parametrize("keep", [0, 1, 100, -1], ids=["empty", "1-byte", "100-bytes", "one-byte-short"])
    def test_a_truncated_data_file_is_a_format_error(self, store, keep):
        _saved(store)
        data_name = store.data_name("m.tl")
        data = store.read(data_name)
        store.write(data_name, data[:keep] if keep >= 0 else data[:len(data) - 1])
        with pytest.raises(tl.FormatError, match="m.tl"):
            store.open("m.tl")
        with pytest.raises(tl.FormatError, match="m.tl"):
            store.load("m.tl")

    @pytest.mark.parametrize("text,match", [
        pytest.param(b"[]", "is not a TensorList descriptor and embeds none", id="empty-array"),
        pytest.param(b"[1, 2]", "is not a TensorList descriptor and embeds none", id="array"),
        pytest.param(b'{"a": 1}', "is not a TensorList descriptor and embeds none", id="other-object"),
        pytest.param(b'"tensors"', "is not a TensorList descriptor and embeds none", id="string"),
        pytest.param(b"42", "is not a TensorList descriptor and embeds none", id="number"),
        pytest.param(b"null", "is not a TensorList descriptor and embeds none", id="null"),
        pytest.param(b'{"tensors": [], "location": "d", "byteOffset": 0}',
                     "field 'byteLength': missing required field", id="no-byteLength"),
        pytest.param(b'{"tensors": 3, "location": "d", "byteOffset": 0, "byteLength": 0}',
                     "field 'tensors': must be an array", id="tensors-not-array"),
        pytest.param(b'{"tensors": [], "location": "d", "byteOffset": 0, "byteLength": 0, "byteLength": 0}',
                     "(?i)duplicate", id="duplicate-key"),
        pytest.param(b'{"tensors": [', "(?i)json", id="cut-json"),
        pytest.param(b"", "(?i)json", id="empty-file"),
        pytest.param(b"\xff\xfe", "(?i)utf-8|json", id="not-utf8"),
    ])
    def test_a_descriptor_that_is_not_a_list(self, store, text, match):
        store.write("bad.tl", text)
        with pytest.raises(tl.FormatError, match=match):
            store.open("bad.tl")
        with pytest.raises(tl.FormatError, match=match):
            store.load("bad.tl")

    def test_a_location_leaving_the_folder_is_refused(self, store):
        _saved(store)
        desc = store.descriptor("m.tl")
        desc["location"] = "../" + desc["location"]
        store.write("m.tl", json.dumps(desc).encode())
        with pytest.raises(tl.FormatError, match="escapes the descriptor's directory"):
            store.open("m.tl")

    def test_a_hand_made_layout(self, store):
        """A list past a header, tensors out of order with gaps (one past the remote merge gap), data in a subfolder."""
        a = np.arange(10, dtype=np.float64)
        b = np.arange(6, dtype=np.int16).reshape(2, 3)
        c = np.array([1.5, -2.5], np.float32)
        start, data = 4096, bytearray(4096 + 200_000)
        offsets = {"a": 199_000, "b": 0, "c": 64}  # "a" lies ~195 KiB after "c"
        for name, v in (("a", a), ("b", b), ("c", c)):
            data[start + offsets[name]:start + offsets[name] + v.nbytes] = _as_stored(v).tobytes()
        codes = {"a": 7, "b": 2, "c": 6}
        desc = {"tensors": [{"name": k, "dims": list(v.shape), "dataType": codes[k], "byteOffset": offsets[k],
                             "byteLength": v.nbytes} for k, v in (("a", a), ("b", b), ("c", c))],
                "location": "blobs/./h.bin", "byteOffset": start, "byteLength": 200_000, "metadata": {"hand": 1}}
        store.write("blobs/h.bin", bytes(data))
        store.write("h.tl", json.dumps(desc).encode())
        with store.open("h.tl") as r:
            assert r.keys() == ["a", "b", "c"] and r.metadata == {"hand": 1}
            for got in (r.to_dict(), dict(r.items()), r.get_many(["a", "b", "c"]), {k: r[k] for k in r}):
                _same(got["a"], a)
                _same(got["b"], b)
                _same(got["c"], c)
            assert r.verify() == 0
        _same(store.load("h.tl")["a"], a)

    def test_a_data_file_truncated_after_open(self, store):
        _saved(store)
        data_name = store.data_name("m.tl")
        if store.open_kwargs.get("mmap", False):
            # touching a mapped page past a truncation is a SIGBUS (test_security.py checks that in a
            # child); what a mapping reader promises is to see the truncation when it opens
            store.write(data_name, store.read(data_name)[:64])
            with pytest.raises(tl.FormatError, match=r"m.tl.*is 64 bytes but the list needs"):
                store.open("m.tl")
            return
        with store.open("m.tl") as r:
            store.write(data_name, store.read(data_name)[:64])
            _same(r["w"], _tensors()["w"])  # within what is left
            with pytest.raises(tl.FormatError, match=r"m.tl.*tensor 13 \('strided'\).*truncated while reading"):
                r["strided"]
            with pytest.raises(tl.FormatError, match="truncated while reading"):
                r.to_dict()

    def test_readinto_fills_a_buffer_with_the_region_bytes(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            n = r.descriptor.byte_length
            whole = np.empty(n, np.uint8)
            r.readinto(whole)
            for k, a in want.items():
                info = r.info(k)
                got = whole[info.byte_offset:info.byte_offset + info.byte_length].tobytes()
                assert got == np.ascontiguousarray(a).astype(a.dtype.newbyteorder("<")).tobytes(), k
                part = bytearray(info.byte_length)
                r.readinto(part, info.byte_offset)
                assert bytes(part) == got
            tail = np.empty(5, np.uint8)
            r.readinto(tail, n - 5)
            assert tail.tobytes() == whole[-5:].tobytes()
            r.readinto(bytearray(0), n)
            for buf, at, match in ((bytearray(1), n, "outside"), (bytearray(n + 1), 0, "outside"),
                                   (bytearray(1), -1, "outside"), (b"x", 0, "read-only"),
                                   (np.zeros((4, 4), np.uint8)[:, 1], 0, "contiguous")):
                with pytest.raises(ValueError, match=match):
                    r.readinto(buf, at)
            for at in (1.0, "0", None, True):
                with pytest.raises(TypeError):
                    r.readinto(bytearray(1), at)

    def test_readinto_of_a_data_file_truncated_after_open(self, store):
        _saved(store)
        data_name = store.data_name("m.tl")
        if store.open_kwargs.get("mmap", False):
            return  # a mapping sees the truncation at open (test_a_data_file_truncated_after_open)
        with store.open("m.tl") as r:
            store.write(data_name, store.read(data_name)[:64])
            head = bytearray(64 - r.descriptor.byte_offset)
            r.readinto(head)  # within what is left
            with pytest.raises(tl.FormatError, match=r"m.tl.*truncated while reading"):
                r.readinto(bytearray(r.descriptor.byte_length))

    def test_closed_reader(self, store):
        want = _saved(store)
        r = store.open("m.tl")
        a = r["w"]
        assert not r.closed
        r.close()
        assert r.closed
        for use in (lambda: r["w"], lambda: r[0], r.to_dict, r.items, r.values, r.verify, lambda: r.get("w"),
                    lambda: r.get_many(["w"]), lambda: r.readinto(bytearray(1))):
            with pytest.raises(ValueError, match="closed"):
                use()
        r.close()  # closing twice is fine
        # what the descriptor says stays known; arrays already returned stay valid
        assert r.keys() == list(want) and len(r) == len(want) and "w" in r and r.metadata["epoch"] == 3
        assert r.info("w").shape == (5, 3)
        _same(a, want["w"])

    def test_context_manager(self, store):
        want = _saved(store)
        with store.open("m.tl") as r:
            assert not r.closed
            a = r["w"]
        assert r.closed
        _same(a, want["w"])
        with pytest.raises(RuntimeError, match="inside"):
            with store.open("m.tl") as r2:
                raise RuntimeError("inside")
        assert r2.closed
        with pytest.raises(ValueError, match="closed"):
            r2["w"]

    def test_repr_names_the_file(self, store):
        _saved(store)
        with store.open("m.tl") as r:
            assert "m.tl" in repr(r) and "14 tensors" in repr(r)

    def test_a_replaced_file_reads_the_new_content(self, store):
        store.save("m.tl", {"a": np.zeros(3)})
        with store.open("m.tl") as r:
            _same(r["a"], np.zeros(3))
        store.save("m.tl", {"b": np.ones(2, np.int8)})
        assert list(store.load("m.tl")) == ["b"]
        assert sorted(os.path.basename(n) for n in _listing(store)) == sorted(["m.tl", store.data_name("m.tl")])


def _listing(store: Store):
    if isinstance(store, LocalStore):
        return [p.name for p in store.root.iterdir()]
    store.fs.invalidate_cache()
    return store.fs.ls(store.folder, detail=False)


class TestCopyOnWrite:
    """``mmap="copy"`` with every reader: writable arrays whose writes never reach the file."""

    @staticmethod
    def _files(store: Store, name: str = "m.tl") -> dict:
        return {n: store.read(n) for n in (name, store.data_name(name))}

    @staticmethod
    def _scribble(arrays) -> None:
        for a in arrays:
            if a.size:
                a.reshape(-1).view(np.uint8)[...] = 0xA5

    def test_writes_never_reach_the_file(self, store):
        want = _saved(store)
        before = self._files(store)
        got = store.load("m.tl", mmap="copy")
        assert all(a.flags.writeable for a in got.values())
        self._scribble(got.values())
        assert (got["w"].view(np.uint8) == 0xA5).all()
        with store.open("m.tl", mmap="copy") as r:
            self._scribble([r["w"], r["i8"]])
            assert r["w"].flags.writeable
        assert self._files(store) == before  # the file's bytes, re-read after the writes
        again = store.load("m.tl")
        for k in want:
            _same(again[k], want[k])

    def test_views_are_64_byte_aligned(self, store):
        _saved(store)
        for source in (store.load("m.tl", mmap="copy"), store.open("m.tl", mmap="copy").to_dict()):
            for k, a in source.items():
                if a.size:
                    assert a.ctypes.data % tl.DEFAULT_ALIGNMENT == 0, k

    def test_verify_checks_the_private_pages(self, store):
        want = _saved(store)
        assert list(store.load("m.tl", mmap="copy", verify=True)) == list(want)
        with store.open("m.tl", mmap="copy") as r:
            assert r.verify() == len(want)
            w = r["w"]
            w[0, 0] += 1  # only in this reader's copy of the page (or fetched bytes)
            if store.kind in REMOTE:  # each read is a new private copy
                assert r.verify(["w"]) == 1
            else:
                with pytest.raises(tl.ChecksumError, match=r"m.tl.*tensor 0 \('w'\)"):
                    r.verify(["w"])
        assert tl.open(store.url("m.tl")).verify(["w"]) == 1  # the file still holds the saved bytes

    def test_the_arrays_outlive_the_reader(self, store):
        want = _saved(store)
        with store.open("m.tl", mmap="copy") as r:
            a, every = r["w"], r.to_dict()
        del r
        a += 1
        _same(a, want["w"] + 1)
        every["c64"][...] = 0
        assert not every["c64"].any()
        _same(every["u64"], want["u64"])

    def test_load_document(self, store, tmp_path):
        _embedded_document(store, tmp_path)
        before = {n: store.read(n) for n in ("doc.json", store.descriptor("doc.json")["model"]["location"])}
        doc = tl.load_document(store.url("doc.json"), mmap="copy")
        w = doc["model"]["w"]
        assert w.flags.writeable and doc["opt"][0]["0"].flags.writeable
        w[...] = -1
        assert {n: store.read(n) for n in before} == before
        _same(tl.load_document(store.url("doc.json"))["model"]["w"], np.arange(6, dtype=np.float32).reshape(2, 3))

    @pytest.mark.parametrize("bad", ["COPY", "copy ", "r", "", 1, 0, None, b"copy", np.bool_(True)], ids=repr)
    def test_a_bad_mmap_value_is_refused_naming_it(self, store, bad):
        _saved(store)
        for call in (store.open, store.load):
            with pytest.raises(ValueError, match=r"mmap must be True, False or 'copy', not " + re.escape(repr(bad))):
                call("m.tl", mmap=bad)
        with pytest.raises(ValueError, match="mmap must be"):
            tl.load_document(store.url("m.tl"), mmap=bad)
