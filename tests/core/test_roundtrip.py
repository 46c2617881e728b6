"""Round trips through the public API: save/load, Writer.add/reserve, shared data files, documents.

Comparisons are bit-exact on byte views (so NaN payloads, -0.0 and float8 specials count), and
every test checks that the caller's arrays are left exactly as they were.
"""
import json
import math
import os
import tempfile
import warnings
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlist as tl
from tensorlist._base import dtypes as _dtypes
from tensorlist._base import lowlevel
from tensorlist._base.dtypes import DTYPES, from_numpy

HYPOTHESIS = settings(
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)

LAYOUTS = ["c", "bigendian", "transpose", "strided", "reversed", "bigendian-strided"]
# every row this ml_dtypes can make arrays of: all of them from 0.5 on (tests/core/test_startup.py checks which)
SUPPORTED = [d for d in DTYPES if d.supported]


def _le(dtype) -> np.dtype:
    """The stored (little-endian) form of a table dtype."""
    return from_numpy(dtype).numpy


def _bigendian(a: np.ndarray) -> np.ndarray:
    """The same values in a big-endian dtype, built by byte swapping (bit-exact, NaN-safe).

    ml_dtypes' own types are swapped as unsigned integers of their size: their
    ``byteswap`` swaps nothing before ml_dtypes 0.5.4 (its #311).
    """
    swapped = a.view(f"<u{a.dtype.itemsize}").byteswap() if a.dtype.kind == "V" else a.byteswap()
    return swapped.view(a.dtype.newbyteorder(">"))


def _strided(a: np.ndarray) -> np.ndarray:
    """A non-contiguous view (every other element in each axis) holding the values of ``a``."""
    if a.ndim == 0:
        return a.copy()
    big = np.zeros(tuple(2 * n + 1 for n in a.shape), dtype=a.dtype)
    view = big[tuple(slice(1, None, 2) for _ in a.shape)]
    view[...] = a
    return view


def make_input(expected: np.ndarray, layout: str) -> np.ndarray:
    """An array equal (bitwise) to C-contiguous little-endian ``expected`` in the given layout."""
    if layout == "c":
        return expected.copy()
    if layout == "bigendian":
        return _bigendian(expected)
    if layout == "transpose":
        return expected.T.copy().T
    if layout == "strided":
        return _strided(expected)
    if layout == "reversed":  # negative strides
        return expected[(slice(None, None, -1),) * expected.ndim].copy()[(slice(None, None, -1),) * expected.ndim]
    if layout == "bigendian-strided":
        return _strided(_bigendian(expected))
    raise AssertionError(layout)


@st.composite
def tensor_specs(draw, max_dim=4):
    dt = draw(st.sampled_from(SUPPORTED))
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(0, max_dim), min_size=ndim, max_size=ndim)))
    n = math.prod(shape) * dt.itemsize
    raw = draw(st.binary(min_size=n, max_size=n))
    expected = np.frombuffer(raw, dtype=np.uint8).copy()
    if dt.name == "bool":
        expected %= 2
    expected = expected.view(dt.numpy).reshape(shape)
    layout = draw(st.sampled_from(LAYOUTS))
    return expected, make_input(expected, layout)


def _same_bytes(got: np.ndarray, expected: np.ndarray) -> None:
    stored = _dtypes.as_little(np.ascontiguousarray(expected))  # what the file holds, on any host
    assert got.dtype == stored.dtype  # exact: little-endian table dtype
    assert got.shape == expected.shape
    assert np.ascontiguousarray(got).tobytes() == stored.tobytes()


def _snapshot(arrays):
    return [(a.dtype, a.shape, a.strides, a.tobytes()) for a in arrays]


def _check_loaded(loaded, keys, expected, mmap):
    assert list(loaded) == keys
    for k, e in zip(keys, expected):
        a = loaded[k]
        _same_bytes(a, e)
        if mmap and a.size:
            assert not a.flags.writeable
            with pytest.raises(ValueError, match="WRITEABLE"):
                a.flags.writeable = True
        if not mmap:
            assert a.flags.writeable


def _fresh(tmp_path) -> Path:
    return Path(tempfile.mkdtemp(dir=tmp_path))


# --- hypothesis round trips -------------------------------------------------------------------


@settings(HYPOTHESIS, max_examples=120)
@given(
    specs=st.lists(tensor_specs(), max_size=5),
    named=st.booleans(),
    mode=st.sampled_from(["save", "add", "reserve", "mixed"]),
    alignment=st.sampled_from([8, 16, 64, 256, 4096]),
    mmap=st.booleans(),
)
def test_round_trip(tmp_path, specs, named, mode, alignment, mmap):
    directory = _fresh(tmp_path)
    path = directory / "t.tl"
    expected = [e for e, _ in specs]
    inputs = [i for _, i in specs]
    keys = [f"t{i}.w/~x" for i in range(len(inputs))] if named else [str(i) for i in range(len(inputs))]
    before = _snapshot(inputs)

    if mode == "save":
        tensors = dict(zip(keys, inputs)) if named else list(inputs)
        tl.save(path, tensors, alignment=alignment, durable=False)
    else:
        with tl.Writer(path, alignment=alignment, durable=False) as w:
            for i, (k, a) in enumerate(zip(keys, inputs)):
                if mode == "add" or (mode == "mixed" and i % 2 == 0):
                    w.add(k, a) if named else w.add(a)
                else:
                    r = w.reserve(k, a.shape, a.dtype) if named else w.reserve(a.shape, a.dtype)
                    assert r.flags.writeable and r.dtype == _le(a.dtype)
                    assert r.tobytes() == bytes(r.nbytes)  # starts as zeros
                    r[...] = a

    assert _snapshot(inputs) == before  # the caller's arrays are never modified
    assert sorted(os.listdir(directory))[0] == "t.tl" and len(os.listdir(directory)) == 2

    _check_loaded(tl.load(path, mmap=mmap), keys, expected, mmap)
    with tl.open(path, mmap=mmap) as r:
        assert len(r) == len(keys) and r.keys() == keys
        assert r.verify() == len(keys)  # every tensor carries a checksum, and it matches
        desc = r.descriptor
        assert desc.byte_offset == 0 and desc.byte_length % alignment == 0
        for i, (k, e) in enumerate(zip(keys, expected)):
            info = r.info(k)
            assert info.index == i and info.name == (k if named else None)
            assert info.byte_offset % alignment == 0 and info.byte_length == e.nbytes
            _same_bytes(r[i], e)
            got = r[k]
            if mmap and got.size and alignment <= 4096:
                # the list starts page-aligned, so each mapped tensor is aligned in memory too
                assert got.__array_interface__["data"][0] % alignment == 0
        ends = [t.byte_offset + t.byte_length for t in desc.tensors]
        assert all(end <= desc.byte_length for end in ends)
        assert desc.byte_length == (-(-max(ends, default=0) // alignment) * alignment)
        # the whole data file: each tensor's little-endian bytes at its offset, zeros elsewhere
        image = bytearray(desc.byte_length)
        for t, e in zip(desc.tensors, expected):
            image[t.byte_offset : t.byte_offset + t.byte_length] = e.tobytes()
        assert (directory / desc.location).read_bytes() == bytes(image)


@settings(HYPOTHESIS, max_examples=40)
@given(spec=tensor_specs(max_dim=6), mmap=st.booleans())
def test_round_trip_single_tensor_verify_and_lamp_mode(tmp_path, spec, mmap):
    expected, given_array = spec
    directory = _fresh(tmp_path)
    before = _snapshot([given_array])
    tl.save(directory / "n.tl", {"x": given_array}, durable=False)
    tl.save(directory / "l.lamp", [given_array], lamp=True, durable=False)
    assert _snapshot([given_array]) == before
    _check_loaded(tl.load(directory / "n.tl", mmap=mmap, verify=True), ["x"], [expected], mmap)
    _check_loaded(tl.load(directory / "l.lamp", mmap=mmap), ["0"], [expected], mmap)
    lamp_desc = json.loads((directory / "l.lamp").read_text())
    assert ("dims" in lamp_desc["tensors"][0]) == (expected.ndim > 0)
    assert (directory / "l.lamp.data").stat().st_size == -(-expected.nbytes // 8) * 8


# --- explicit cases ---------------------------------------------------------------------------


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("tensors", [[], {}], ids=["positional", "named"])
def test_empty_list(tmp_path, tensors, mmap):
    path = tmp_path / "e.tl"
    tl.save(path, tensors)
    assert tl.load(path, mmap=mmap) == {}
    with tl.open(path) as r:
        assert len(r) == 0 and r.keys() == [] and r.descriptor.byte_length == 0
    with tl.Writer(tmp_path / "w.tl"):
        pass
    assert tl.load(tmp_path / "w.tl", mmap=mmap) == {}


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("named", [True, False])
def test_trailing_and_inner_empty_tensors(tmp_path, named, mmap):
    arrays = [np.zeros((0, 3), np.float32), np.arange(3, dtype=np.float32), np.zeros(0, np.int64),
              np.zeros((2, 0), np.complex128)]
    keys = ["a", "b", "c", "d"] if named else ["0", "1", "2", "3"]
    path = tmp_path / "t.tl"
    tl.save(path, dict(zip(keys, arrays)) if named else arrays)
    desc = json.loads(path.read_text())
    last = desc["tensors"][-1]
    # trailing empty tensors sit at offset 0, inside the list, so that lamp's Reader reads the file
    # (FORMAT.md 5.1); inner ones keep their place in the sequence
    assert last["byteLength"] == 0 and last["byteOffset"] == 0 and desc["byteLength"] > 0
    assert desc["tensors"][2]["byteOffset"] == 0 and desc["tensors"][0]["byteOffset"] == 0
    _check_loaded(tl.load(path, mmap=mmap), keys, arrays, mmap)


def test_all_empty_tensors_need_no_data(tmp_path):
    path = tmp_path / "z.tl"
    tl.save(path, [np.zeros(0, np.float32), np.zeros((0, 5), np.uint16)])
    desc = json.loads(path.read_text())
    assert desc["byteLength"] == 0
    (tmp_path / desc["location"]).unlink()  # a zero-length list never opens its data file
    out = tl.load(path)
    assert [a.shape for a in out.values()] == [(0,), (0, 5)]


@pytest.mark.parametrize("alignment", [8, 16, 32, 64, 128, 4096, 1 << 20])
def test_alignment_values(tmp_path, alignment):
    arrays = {"a": np.arange(3, dtype=np.int8), "b": np.arange(5, dtype=np.float64),
              "c": np.float32(2.5), "d": np.ones((3, 3), np.uint16)}
    path = tmp_path / "a.tl"
    tl.save(path, arrays, alignment=alignment)
    desc = json.loads(path.read_text())
    # FORMAT.md 5.1: each tensor starts at align(end of the previous one); the list is padded too
    expected, cursor = [], 0
    for a in arrays.values():
        start = -(-cursor // alignment) * alignment
        expected.append(start)
        cursor = start + np.asarray(a).nbytes
    assert [t["byteOffset"] for t in desc["tensors"]] == expected
    assert desc["byteLength"] == -(-cursor // alignment) * alignment
    assert (tmp_path / desc["location"]).stat().st_size == desc["byteLength"]
    if alignment >= 64:
        assert expected == [i * alignment for i in range(4)]
    out = tl.load(path, verify=True)
    for k, a in arrays.items():
        _same_bytes(out[k], np.asarray(a))


@pytest.mark.parametrize("how", ["save", "writer", "lamp"])
def test_tensors_start_at_a_multiple_of_their_item_size(tmp_path, how):
    """complex128 is 16 bytes: with 8-byte alignment (and in lamp mode) it still starts 16-aligned."""
    arrays = [np.uint8(1), np.array([1 + 2j, 3 - 4j]), np.int8(2), np.array([5j])]
    path = tmp_path / "c.tl"
    if how == "writer":
        with tl.Writer(path, alignment=8) as w:
            for a in arrays:
                w.add(a)
    elif how == "lamp":
        # lamp's running sum puts the complex128 at 8: neither lamp nor rule 9 reads that (FORMAT.md 5.2)
        with pytest.raises(ValueError, match="tensor 1"):
            tl.save(path, arrays, lamp=True)
        assert not path.exists()
        return
    else:
        tl.save(path, arrays, alignment=8)
    desc = json.loads(path.read_text())
    assert [t["byteOffset"] for t in desc["tensors"]] == [0, 16, 48, 64]
    out = tl.load(path)
    for k, a in zip(out, arrays):
        _same_bytes(out[k], np.asarray(a))


@pytest.mark.parametrize("alignment", [0, 1, 4, 12, 3, 2 << 20, True, 64.0])
def test_bad_alignment_is_refused_before_writing(tmp_path, alignment):
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        tl.save(tmp_path / "a.tl", [np.zeros(3)], alignment=alignment)
    with pytest.raises(ValueError, match="alignment must be a power of two"):
        tl.Writer(tmp_path / "a.tl", alignment=alignment)
    assert os.listdir(tmp_path) == []


def test_scalars_and_python_values(tmp_path):
    path = tmp_path / "s.tl"
    tl.save(path, {"i": 3, "f": 2.5, "b": True, "np": np.float16(1.5), "z": np.array(7, np.uint64),
                   "list": [[1, 2], [3, 4]]})
    out = tl.load(path)
    assert {k: (v.dtype, v.shape) for k, v in out.items()} == {
        "i": (np.dtype("<i8"), ()), "f": (np.dtype("<f8"), ()), "b": (np.dtype(bool), ()),
        "np": (np.dtype("<f2"), ()), "z": (np.dtype("<u8"), ()), "list": (np.dtype("<i8"), (2, 2))}
    assert out["i"] == 3 and out["f"] == 2.5 and out["b"] and out["np"] == 1.5 and out["z"] == 7
    assert out["list"].tolist() == [[1, 2], [3, 4]]
    desc = json.loads(path.read_text())
    assert desc["tensors"][0]["dims"] == []  # tensorlist always writes dims


def test_bigendian_input_is_unchanged_by_save_and_writer(tmp_path):
    a = np.arange(12, dtype=">f8").reshape(3, 4)
    c = np.array([1 + 2j, -3j], dtype=">c16")
    copies = (a.copy(), c.copy())
    tl.save(tmp_path / "s.tl", {"a": a, "c": c})
    with tl.Writer(tmp_path / "w.tl") as w:
        w.add("a", a[:, ::2])
        w.add("c", c)
    assert a.dtype == np.dtype(">f8") and a.tobytes() == copies[0].tobytes()
    assert c.dtype == np.dtype(">c16") and c.tobytes() == copies[1].tobytes()
    for name, expect_a in (("s.tl", a), ("w.tl", a[:, ::2])):
        out = tl.load(tmp_path / name, verify=True)
        assert out["a"].dtype == np.dtype("<f8") and np.array_equal(out["a"], expect_a)
        assert out["c"].dtype == np.dtype("<c16") and np.array_equal(out["c"], c)
    data = (tmp_path / json.loads((tmp_path / "s.tl").read_text())["location"]).read_bytes()
    assert data[8:16] == np.array([1.0], "<f8").tobytes()  # stored little-endian


def test_loaded_mmap_arrays_are_readonly_and_survive_close(tmp_path):
    path = tmp_path / "m.tl"
    tl.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    r = tl.open(path)
    w = r["w"]
    r.close()
    assert r.closed
    with pytest.raises(ValueError, match="closed"):
        r["w"]
    assert w.tolist() == [[0, 1, 2], [3, 4, 5]]  # the mapping outlives the reader
    with pytest.raises(ValueError, match="read-only"):
        w[0, 0] = 1
    with pytest.raises(ValueError, match="WRITEABLE"):
        w.flags.writeable = True
    with pytest.raises(ValueError, match="WRITEABLE"):
        w.reshape(-1).flags.writeable = True
    private = tl.load(path, mmap=False)["w"]
    private[0, 0] = 42  # a private copy: the file does not change
    assert tl.load(path)["w"][0, 0] == 0


def test_reader_mapping_protocol(tmp_path):
    path = tmp_path / "r.tl"
    tl.save(path, {"a": np.arange(2), "b": np.ones(3, np.float32)}, metadata={"k": 1})
    with tl.open(path) as r:
        assert list(r) == ["a", "b"] and "a" in r and "zz" not in r
        assert r.metadata == {"k": 1}
        assert r[1].tolist() == [1, 1, 1] and r[-1].tolist() == [1, 1, 1]
        assert r.get("zz") is None and r.get("a").tolist() == [0, 1]
        with pytest.raises(KeyError, match="no tensor 'zz'"):
            r["zz"]
        assert [k for k, _ in r.items()] == ["a", "b"]


# --- checksums --------------------------------------------------------------------------------


def _data_file(path: Path) -> Path:
    return path.parent / json.loads(path.read_text())["location"]


@pytest.mark.parametrize("mmap", [True, False])
@pytest.mark.parametrize("named", [True, False])
def test_flipped_data_byte_raises_checksum_error_naming_the_tensor(tmp_path, named, mmap):
    arrays = [np.arange(16, dtype=np.float32), np.arange(8, dtype=np.float64), np.arange(3, dtype=np.int8)]
    names = ["w", "b", "s"]
    path = tmp_path / "c.tl"
    tl.save(path, dict(zip(names, arrays)) if named else arrays)
    assert len(tl.load(path, verify=True, mmap=mmap)) == 3
    with tl.open(path) as r:
        start = r.info(1).byte_offset
        pad = r.info(2).byte_offset + r.info(2).byte_length
    data = _data_file(path)
    raw = bytearray(data.read_bytes())
    raw[pad] ^= 0xFF  # padding is not covered by any checksum
    data.write_bytes(bytes(raw))
    assert len(tl.load(path, verify=True, mmap=mmap)) == 3
    raw[start + 3] ^= 0x01
    data.write_bytes(bytes(raw))
    where = r"tensor 1 \('b'\)" if named else r"tensor 1: "
    with pytest.raises(tl.ChecksumError, match=where + r".*field 'crc32c'.*CRC32C") as info:
        tl.load(path, verify=True, mmap=mmap)
    e = info.value
    assert isinstance(e, tl.FormatError) and isinstance(e, ValueError)
    assert (e.file, e.tensor_index, e.tensor_name, e.field) == (str(path), 1, "b" if named else None, "crc32c")
    assert str(path) in str(e)
    with pytest.raises(tl.ChecksumError, match=where):
        tl.validate(path, verify=True)
    with tl.open(path, mmap=mmap) as r:
        assert r.verify(["w", "s"] if named else [0, 2]) == 2
        with pytest.raises(tl.ChecksumError, match=where):
            r.verify()
    # without verify the flipped byte is simply returned: checking is what catches it
    assert tl.load(path, mmap=mmap)["b" if named else "1"].tobytes() != arrays[1].tobytes()


def test_reserved_tensors_get_checksums_of_what_was_filled_in(tmp_path):
    path = tmp_path / "r.tl"
    with tl.Writer(path) as w:
        a = w.reserve("a", (100, 3), np.float32)
        w.add("b", np.arange(5))
        a[:] = np.arange(300, dtype=np.float32).reshape(100, 3)
    desc = json.loads(path.read_text())
    assert desc["tensors"][0]["crc32c"] == lowlevel.crc32c(np.arange(300, dtype="<f4").tobytes())
    out = tl.load(path, verify=True)
    assert out["a"].ravel().tolist() == list(range(300))


def test_verify_without_checksums_warns(tmp_path):
    path = tmp_path / "n.tl"
    tl.save(path, [np.arange(3)], checksum=False)
    assert "crc32c" not in path.read_text()
    with pytest.warns(UserWarning, match="stores no checksums"):
        tl.load(path, verify=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        tl.load(path)


# --- metadata ---------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=10),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=25,
)


@settings(HYPOTHESIS, max_examples=60)
@given(metadata=json_values)
def test_metadata_round_trips_any_json(tmp_path, metadata):
    directory = _fresh(tmp_path)
    tl.save(directory / "m.tl", {"x": np.zeros(2)}, metadata=metadata, durable=False)
    with tl.open(directory / "m.tl") as r:
        assert r.metadata == metadata
        assert json.dumps(r.metadata) == json.dumps(metadata)  # order and int/float kinds kept
    with tl.Writer(directory / "w.tl", metadata=metadata, durable=False) as w:
        w.add("x", np.zeros(2))
    assert tl.open(directory / "w.tl").metadata == metadata


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), {"a": [1, float("nan")]},
                                 {"k": {(1, 2): 3}}, {"x": object()}],
                         ids=["nan", "inf", "-inf", "nested-nan", "tuple-key", "object"])
def test_metadata_that_is_not_strict_json_is_refused(tmp_path, bad):
    path = tmp_path / "m.tl"
    tl.save(path, {"x": np.arange(3)}, metadata={"old": True})
    listing = sorted(os.listdir(tmp_path))
    with pytest.raises(ValueError, match="metadata must be strict JSON"):
        tl.save(path, {"x": np.arange(4)}, metadata=bad)
    with pytest.raises(ValueError, match="metadata must be strict JSON"):
        tl.Writer(path, metadata=bad)
    with pytest.raises(ValueError, match="metadata must be strict JSON"):
        tl.write_data(tmp_path / "d.data", [tl.Tensors([np.zeros(1)], metadata=bad)])
    assert sorted(os.listdir(tmp_path)) == listing
    assert tl.open(path).metadata == {"old": True} and len(tl.load(path)["x"]) == 3


def test_metadata_with_non_str_keys_is_refused(tmp_path):
    with pytest.raises((TypeError, ValueError), match="str keys"):
        tl.save(tmp_path / "m.tl", [np.zeros(1)], metadata={1: "a", True: "b"})
    assert os.listdir(tmp_path) == []


names = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)


@settings(HYPOTHESIS, max_examples=60)
@given(keys=st.lists(names, unique=True, max_size=6), mmap=st.booleans())
def test_any_tensor_names_round_trip(tmp_path, keys, mmap):
    """Names with quotes, backslashes, control characters, non-ASCII, or empty."""
    directory = _fresh(tmp_path)
    arrays = [np.full(i + 1, i, np.int16) for i in range(len(keys))]
    tl.save(directory / "n.tl", dict(zip(keys, arrays)), durable=False)
    _check_loaded(tl.load(directory / "n.tl", mmap=mmap), keys, arrays, mmap)
    with tl.open(directory / "n.tl") as r:
        assert [r.info(i).name for i in range(len(keys))] == keys


def test_awkward_names_round_trip(tmp_path):
    keys = ['a"b', "c\\d", "é", "\x00", "\n\t", "😀", "", "\u2028", "/~0~1", "\x7f"]
    arrays = [np.full(2, i, np.float32) for i in range(len(keys))]
    path = tmp_path / "n.tl"
    tl.save(path, dict(zip(keys, arrays)))
    assert '"name":"\\u0000"' in path.read_text(encoding="utf-8")  # strict JSON escapes
    _check_loaded(tl.load(path), keys, arrays, True)
    _check_loaded(tl.load(path, mmap=False), keys, arrays, False)


# --- many tensors, large offsets ------------------------------------------------------------


@pytest.mark.slow  # about 20 s
def test_one_million_tiny_tensors(tmp_path):
    n = 1_000_000
    path = tmp_path / "many.tl"
    tl.save(path, [np.array([i], np.int32) for i in range(n)], alignment=8, checksum=False,
            durable=False)
    assert (tmp_path / json.loads(path.read_text())["location"]).stat().st_size == 8 * n
    out = tl.load(path)
    assert len(out) == n
    rng = np.random.default_rng(0)
    for i in [0, 1, n - 1, *rng.integers(0, n, 100).tolist()]:
        a = out[str(i)]
        assert a.shape == (1,) and a.dtype == np.dtype("<i4") and int(a[0]) == i
    assert list(out)[:3] == ["0", "1", "2"] and list(out)[-1] == str(n - 1)


FIVE_GIB = 5 << 30


@pytest.mark.parametrize("where", ["list", "tensor"])
@pytest.mark.parametrize("mmap", [True, False])
def test_offsets_beyond_4gib_in_a_sparse_file(tmp_path, where, mmap):
    a = (np.arange(8).reshape(4, 2) * 1.5).astype("<f8")  # arithmetic gives the host's order: stored is "<"
    b = np.arange(5, dtype="<i2")
    data = tmp_path / "big.data"
    list_offset = FIVE_GIB if where == "list" else 4096
    tensor_base = 0 if where == "list" else FIVE_GIB + 8  # past 2**32 relative to the list, too
    with open(data, "wb") as f:
        os.truncate(f.fileno(), list_offset + tensor_base + 4096)  # sparse: no disk blocks used
        f.seek(list_offset + tensor_base)
        f.write(a.tobytes() + b.tobytes())
    desc = {
        "tensors": [
            {"name": "a", "dims": [4, 2], "dataType": 7, "byteOffset": tensor_base, "byteLength": 64,
             "crc32c": lowlevel.crc32c(a.tobytes())},
            {"name": "b", "dims": [5], "dataType": 2, "byteOffset": tensor_base + 64, "byteLength": 10,
             "crc32c": lowlevel.crc32c(b.tobytes())},
        ],
        "location": "big.data", "byteOffset": list_offset, "byteLength": tensor_base + 80,
    }
    path = tmp_path / "big.json"
    path.write_text(json.dumps(desc))
    assert tl.validate(path, verify=True)[0].byte_offset == list_offset
    if where == "list" or mmap:
        out = tl.load(path, mmap=mmap, verify=True)
        _same_bytes(out["a"], a)
        _same_bytes(out["b"], b)
    # (load(mmap=False) reads the whole 5 GiB region into memory: per-tensor reads instead)
    with tl.open(path, mmap=mmap) as r:
        assert r.verify() == 2
        _same_bytes(r["a"], a)
        _same_bytes(r["b"], b)
    # one byte short of the region's end is refused before any tensor is read
    os.truncate(data, list_offset + tensor_base + 79)
    with pytest.raises(tl.FormatError, match="is .* bytes but the list needs"):
        tl.load(path, mmap=mmap)


# --- shared data files and documents ----------------------------------------------------------


@pytest.mark.parametrize("mmap", [True, False])
def test_write_data_shares_one_file_between_lists(tmp_path, mmap):
    model = {"w": np.arange(1000, dtype=np.float32).reshape(10, 100), "b": np.ones(10, np.float16)}
    optimizer = [np.float64(3), np.zeros((10, 100), np.float32), np.arange(7, dtype=">i4")]
    extra = tl.Tensors({"e": np.array([True, False])}, metadata={"note": "extra"})
    descs = tl.write_data(tmp_path / "ckpt.data", [model, optimizer, extra, []])
    assert [d["location"] for d in descs] == ["ckpt.data"] * 4
    starts = [d["byteOffset"] for d in descs]
    assert all(s % tl.LIST_ALIGNMENT == 0 for s in starts) and starts[0] == 0
    for d, nxt in zip(descs, descs[1:]):
        assert d["byteOffset"] + d["byteLength"] <= nxt["byteOffset"]  # regions do not overlap
    assert descs[2]["metadata"] == {"note": "extra"}
    for d in descs:
        tl.validate(d, base_dir=tmp_path, verify=True)
    doc = {"type": "SimpleLoopState", "model": descs[0], "optimizer": descs[1],
           "extras": [{"x": descs[2]}], "empty": descs[3], "epoch": 3}
    path = tmp_path / "ckpt.json"
    path.write_text(json.dumps(doc))
    assert tl.find_tensor_lists(doc) == ["/model", "/optimizer", "/extras/0/x", "/empty"]
    _check_loaded(tl.load(path, pointer="/model", mmap=mmap), ["w", "b"], list(model.values()), mmap)
    opt = tl.load(path, pointer="/optimizer", mmap=mmap, verify=True)
    _check_loaded(opt, ["0", "1", "2"], [np.asarray(optimizer[0]), optimizer[1],
                                         optimizer[2].astype("<i4")], mmap)
    assert tl.load(path, pointer="/extras/0/x")["e"].tolist() == [True, False]
    assert tl.open(path, pointer="/extras/0/x").metadata == {"note": "extra"}
    full = tl.load_document(path, mmap=mmap)
    assert full["type"] == "SimpleLoopState" and full["epoch"] == 3 and full["empty"] == {}
    _same_bytes(full["model"]["w"], model["w"])
    _same_bytes(full["optimizer"]["2"], optimizer[2].astype("<i4"))
    assert full["extras"][0]["x"]["e"].tolist() == [True, False]
    assert {d.pointer for d in tl.validate(path)} == {"/model", "/optimizer", "/extras/0/x", "/empty"}


@pytest.mark.parametrize("mmap", [True, False])
def test_save_document_with_escaped_pointers_and_array_indices(tmp_path, mmap):
    w = np.arange(6, dtype=np.float32).reshape(2, 3)
    doc = {
        "epoch": 7,
        "a/b": tl.Tensors({"w": w}, metadata={"m": [1, 2]}),
        "c~d": {"list": [1, tl.Tensors([np.int64(5)]), {"deep~/": tl.Tensors({"z": np.zeros(0)})}]},
        "plain": [{"not": "a list"}],
    }
    path = tmp_path / "doc.json"
    written = tl.save_document(path, doc)
    assert json.loads(path.read_text()) == written
    assert written["epoch"] == 7 and written["plain"] == [{"not": "a list"}]
    pointers = tl.find_tensor_lists(written)
    assert pointers == ["/a~1b", "/c~0d/list/1", "/c~0d/list/2/deep~0~1"]
    files = sorted(os.listdir(tmp_path))
    assert len(files) == 2 and files[0] == "doc.json"  # one shared data file beside it
    _check_loaded(tl.load(path, pointer="/a~1b", mmap=mmap, verify=True), ["w"], [w], mmap)
    assert tl.open(path, pointer="/a~1b").metadata == {"m": [1, 2]}
    assert tl.load(path, pointer="/c~0d/list/1", mmap=mmap)["0"] == 5
    assert tl.load(path, pointer="/c~0d/list/2/deep~0~1")["z"].shape == (0,)
    full = tl.load_document(path, mmap=mmap)
    assert full["epoch"] == 7 and full["c~d"]["list"][0] == 1
    _same_bytes(full["a/b"]["w"], w)
    assert full["c~d"]["list"][1]["0"] == 5 and full["c~d"]["list"][2]["deep~/"]["z"].shape == (0,)
    assert [d.pointer for d in tl.validate(path, verify=True)] == pointers
