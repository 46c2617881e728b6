"""lamp compatibility: golden bytes of lamp mode, reading files as lamp writes them, lamp's JSON style.

The golden texts are lamp's own output (derived there from lamp's Writer and jsoniter-scala's
defaults); the golden data bytes were written out by hand from IEEE-754 little-endian encodings:
float32 0..10 = 00000000 0000803f 00000040 00004040 00008040 0000a040 0000c040 0000e040 00000041
00001041 00002041, int64 -2 = feffffffffffffff, float16 1.0/-2.0 = 003c/00c0, bfloat16
1.0/0.5/-1.0/3.0 = 803f/003f/80bf/4040.
"""
import json
import os
import re

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tensorlist as tl
from tensorlist._base.jsonio import loads_strict
from tensorlist._base.jsonio import dumps_lamp, lamp_float

# --- golden files -----------------------------------------------------------------------------

GOLDEN_A_TEXT = (
    '{"tensors":[{"dims":[2,3],"dataType":6,"byteOffset":0,"byteLength":24},'
    '{"dims":[5],"dataType":6,"byteOffset":24,"byteLength":20},'
    '{"dataType":4,"byteOffset":48,"byteLength":8}],'
    '"location":"x.lamp.data","byteOffset":0,"byteLength":56}'
)
GOLDEN_A_DATA = bytes.fromhex(
    "00000000" "0000803f" "00000040" "00004040" "00008040" "0000a040"  # f32[2,3] = 0..5
    "0000c040" "0000e040" "00000041" "00001041" "00002041"  # f32[5] = 6..10
    "00000000"  # 20 -> 24: four zero pad bytes
    "feffffffffffffff"  # int64 scalar -2
)
GOLDEN_EMPTY_TEXT = '{"location":"x.lamp.data","byteOffset":0,"byteLength":0}'
GOLDEN_SMALL_TEXT = (
    '{"tensors":[{"dims":[3],"dataType":11,"byteOffset":0,"byteLength":3},'
    '{"dims":[2],"dataType":5,"byteOffset":8,"byteLength":4},'
    '{"dims":[2,2],"dataType":15,"byteOffset":16,"byteLength":8}],'
    '"location":"x.lamp.data","byteOffset":0,"byteLength":24}'
)
GOLDEN_SMALL_DATA = bytes.fromhex(
    "010001" "0000000000"  # bool[3] + 5 pad
    "003c00c0" "00000000"  # f16 [1, -2] + 4 pad
    "803f003f80bf4040"  # bf16 [[1, .5], [-1, 3]]
)


def golden_a_arrays():
    return [np.arange(6, dtype=np.float32).reshape(2, 3), np.arange(6, 11, dtype=np.float32),
            np.array(-2, dtype=np.int64)]


def golden_small_arrays():
    return [np.array([True, False, True]), np.array([1, -2], np.float16),
            np.array([[1, 0.5], [-1, 3]], ml_dtypes.bfloat16)]


def _files(directory):
    return sorted(os.listdir(directory))


@pytest.mark.parametrize(
    "arrays, text, data",
    [
        (golden_a_arrays, GOLDEN_A_TEXT, GOLDEN_A_DATA),
        (lambda: [], GOLDEN_EMPTY_TEXT, b""),
        (golden_small_arrays, GOLDEN_SMALL_TEXT, GOLDEN_SMALL_DATA),
    ],
    ids=["lamp-1.5a", "lamp-1.5b-empty", "bool-f16-bf16"],
)
@pytest.mark.parametrize("how", ["save", "save-named", "save-bigendian-strided", "writer"])
def test_lamp_mode_golden_bytes(tmp_path, arrays, text, data, how):
    path = tmp_path / "x.lamp"
    tensors = arrays()
    if how == "save":
        tl.save(path, tensors, lamp=True)
    elif how == "save-named":  # names are not stored in lamp mode; order is kept
        tl.save(path, {f"n{i}": a for i, a in enumerate(tensors)}, lamp=True)
    elif how == "save-bigendian-strided":
        def odd(a):
            a = a.astype(a.dtype.newbyteorder(">"))  # values kept (ml_dtypes < 0.5.4 cannot byteswap)
            if a.ndim == 0:
                return a
            big = np.zeros(tuple(2 * n for n in a.shape), a.dtype)
            view = big[tuple(slice(None, None, 2) for _ in a.shape)]
            view[...] = a
            return view
        tl.save(path, [odd(a) for a in tensors], lamp=True)
    else:
        with tl.Writer(path, lamp=True) as w:
            for a in tensors:
                w.add(a)
    assert path.read_bytes() == text.encode()  # exact, with no trailing newline
    assert (tmp_path / "x.lamp.data").read_bytes() == data
    assert _files(tmp_path) == ["x.lamp", "x.lamp.data"]  # no temporary files left behind
    out = tl.load(path)
    assert list(out) == [str(i) for i in range(len(tensors))]
    for got, want in zip(out.values(), tensors):
        assert got.dtype == want.dtype
        assert got.shape == want.shape and got.tobytes() == want.tobytes()


def test_lamp_mode_replaces_in_place_without_orphans(tmp_path):
    path = tmp_path / "x.lamp"
    for i in range(3):
        tl.save(path, golden_a_arrays() if i % 2 == 0 else golden_small_arrays(), lamp=True)
    assert path.read_text() == GOLDEN_A_TEXT
    assert _files(tmp_path) == ["x.lamp", "x.lamp.data"]
    assert (tmp_path / "x.lamp.data").read_bytes() == GOLDEN_A_DATA


def test_lamp_mode_refuses_metadata(tmp_path):
    with pytest.raises(ValueError, match="lamp=True .* metadata cannot be stored"):
        tl.save(tmp_path / "x.lamp", [np.zeros(1)], lamp=True, metadata={"a": 1})
    assert _files(tmp_path) == []


def test_lamp_mode_pads_to_8_and_ignores_alignment(tmp_path):
    path = tmp_path / "x.lamp"
    tl.save(path, [np.arange(3, dtype=np.uint8), np.arange(3, dtype=np.int16), np.float64(1)],
            lamp=True, alignment=4096)
    desc = json.loads(path.read_text())
    assert [t["byteOffset"] for t in desc["tensors"]] == [0, 8, 16]
    assert desc["byteLength"] == 24 and "formatVersion" not in desc
    assert all(set(t) == {"dims", "dataType", "byteOffset", "byteLength"} for t in desc["tensors"][:2])
    assert set(desc["tensors"][2]) == {"dataType", "byteOffset", "byteLength"}


def test_lamp_mode_location_escaping_and_raw_utf8(tmp_path):
    path = tmp_path / "mödel\x7f\x01.lamp"
    tl.save(path, [np.zeros(1, np.float32)], lamp=True)
    raw = path.read_bytes()
    assert '"location":"mödel\\u007f\\u0001.lamp.data"'.encode() in raw
    assert tl.load(path)["0"].tolist() == [0.0]


# --- reading what lamp writes -------------------------------------------------------------------


def _write(tmp_path, name, text, data=None, data_name="x.lamp.data"):
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    if data is not None:
        (tmp_path / data_name).write_bytes(data)
    return path


@pytest.mark.parametrize("mmap", [True, False])
def test_reads_the_lamp_golden_file(tmp_path, mmap):
    path = _write(tmp_path, "x.lamp", GOLDEN_A_TEXT, GOLDEN_A_DATA)
    out = tl.load(path, mmap=mmap)
    assert list(out) == ["0", "1", "2"]
    for got, want in zip(out.values(), golden_a_arrays()):
        assert got.dtype == want.dtype and got.shape == want.shape and np.array_equal(got, want)
    assert out["2"].shape == () and out["2"] == -2  # no dims: a scalar
    with tl.open(path) as r:
        assert r.descriptor.version is None and r.metadata is None and r.info(0).name is None
        assert r.info(0).crc32c is None and r.verify() == 0


def test_reads_lamp_empty_list_without_touching_any_file(tmp_path):
    path = _write(tmp_path, "x.lamp", GOLDEN_EMPTY_TEXT)  # no data file at all
    assert tl.load(path) == {}
    assert tl.load(path, mmap=False) == {}
    assert len(tl.validate(path)[0].tensors) == 0


@pytest.mark.parametrize("mmap", [True, False])
def test_reads_trailing_empty_tensor_that_lamp_cannot_read_back(tmp_path, mmap):
    text = ('{"tensors":[{"dims":[2],"dataType":6,"byteOffset":0,"byteLength":8},'
            '{"dims":[0],"dataType":6,"byteOffset":8,"byteLength":0},'
            '{"dims":[3,0],"dataType":4,"byteOffset":8,"byteLength":0}],'
            '"location":"x.lamp.data","byteOffset":0,"byteLength":8}')
    path = _write(tmp_path, "x.lamp", text, np.array([1.5, -2], "<f4").tobytes())
    out = tl.load(path, mmap=mmap)
    assert out["0"].tolist() == [1.5, -2.0]
    assert out["1"].shape == (0,) and out["1"].dtype == np.float32
    assert out["2"].shape == (3, 0) and out["2"].dtype == np.int64


def test_reads_all_empty_lists_of_any_dtype(tmp_path):
    # lamp's reader only supports codes 1, 4, 6, 7, 15 in an all-empty list; tensorlist reads any
    text = ('{"tensors":[{"dims":[0],"dataType":3,"byteOffset":0,"byteLength":0},'
            '{"dims":[0,2],"dataType":5,"byteOffset":0,"byteLength":0},'
            '{"dims":[0],"dataType":11,"byteOffset":0,"byteLength":0}],'
            '"location":"missing.data","byteOffset":0,"byteLength":0}')
    out = tl.load(_write(tmp_path, "x.lamp", text))
    assert [(a.dtype, a.shape) for a in out.values()] == [
        (np.dtype("<i4"), (0,)), (np.dtype("<f2"), (0, 2)), (np.dtype(bool), (0,))]


def test_ignores_unknown_keys_and_trailing_whitespace(tmp_path):
    text = ('{"type":"Whatever","tensors":[{"dims":[2],"dataType":3,"extra":{"a":[1,{"b":null}]},'
            '"byteOffset":0,"byteLength":8,"unit":"m"}],"location":"x.lamp.data","byteOffset":0,'
            '"byteLength":8,"comment":"hi","nested":{"location":7}}\n \t\r\n')
    out = tl.load(_write(tmp_path, "x.lamp", text, np.array([7, -7], "<i4").tobytes()))
    assert out["0"].tolist() == [7, -7]


def test_reads_non_ascii_location_written_raw(tmp_path):
    text = '{"tensors":[{"dataType":1,"byteOffset":0,"byteLength":1}],"location":"dàta☃","byteOffset":0,"byteLength":8}'
    out = tl.load(_write(tmp_path, "x.lamp", text, b"\xff" + bytes(7), data_name="dàta☃"))
    assert out["0"] == -1 and out["0"].shape == ()


STATE_TEXT = (
    '{"type":"SimpleLoopState","model":{"tensors":[{"dims":[5,5],"dataType":6,"byteOffset":0,'
    '"byteLength":100},{"dims":[5],"dataType":6,"byteOffset":104,"byteLength":20}],'
    '"location":"ckpt.model","byteOffset":0,"byteLength":128},"optimizer":{"tensors":[{"dataType":7,'
    '"byteOffset":0,"byteLength":8},{"dims":[5,5],"dataType":6,"byteOffset":8,"byteLength":100},'
    '{"dims":[5],"dataType":6,"byteOffset":112,"byteLength":20},{"dims":[5,5],"dataType":6,'
    '"byteOffset":136,"byteLength":100},{"dims":[5],"dataType":6,"byteOffset":240,"byteLength":20}],'
    '"location":"ckpt.optimizer","byteOffset":0,"byteLength":264},"epoch":3,"lastValidationLoss":0.41,'
    '"minValidationLoss":0.41,"minValidationLossModel":[2,{"tensors":[{"dims":[5,5],"dataType":6,'
    '"byteOffset":0,"byteLength":100},{"dims":[5],"dataType":6,"byteOffset":104,"byteLength":20}],'
    '"location":"ckpt.minvalidmodel","byteOffset":0,"byteLength":128}],'
    '"learningCurve":[[2,0.45,0.41,0.41],[1,0.6,0.5,0.5],[0,0.9,0.7,0.7]]}'
)


def _lamp_data(arrays):
    out = b""
    for a in arrays:
        b = a.tobytes()
        out += b + bytes(-len(b) % 8)
    return out


def test_reads_a_lamp_stateio_checkpoint(tmp_path):
    """A lamp SimpleLoopState embedding three TensorLists, one inside a tuple."""
    w, b = np.arange(25, dtype="<f4").reshape(5, 5), np.arange(5, dtype="<f4") - 2
    opt = [np.array(3.0, "<f8"), w * 2, b * 2, w * 3, b * 3]
    (tmp_path / "ckpt.model").write_bytes(_lamp_data([w, b]))
    (tmp_path / "ckpt.optimizer").write_bytes(_lamp_data(opt))
    (tmp_path / "ckpt.minvalidmodel").write_bytes(_lamp_data([w + 1, b + 1]))
    assert len(_lamp_data(opt)) == 264
    path = _write(tmp_path, "ckpt", STATE_TEXT)
    model = tl.load(path, pointer="/model")
    assert np.array_equal(model["0"], w) and np.array_equal(model["1"], b)
    optimizer = tl.load(path, pointer="/optimizer", mmap=False)
    assert [a.shape for a in optimizer.values()] == [(), (5, 5), (5,), (5, 5), (5,)]
    assert optimizer["0"] == 3.0 and np.array_equal(optimizer["4"], b * 3)
    best = tl.load(path, pointer="/minValidationLossModel/1")
    assert np.array_equal(best["0"], w + 1)
    with pytest.raises(tl.FormatError, match="embedding 3 of them.*pass pointer="):
        tl.load(path)
    doc = tl.load_document(path)
    assert doc["epoch"] == 3 and doc["learningCurve"][0] == [2, 0.45, 0.41, 0.41]
    assert doc["minValidationLossModel"][0] == 2
    assert np.array_equal(doc["minValidationLossModel"][1]["1"], b + 1)
    assert [d.pointer for d in tl.validate(path)] == ["/model", "/optimizer", "/minValidationLossModel/1"]


# --- lamp's JSON style ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value, text",
    [
        (0.0, "0.0"),
        (-0.0, "0.0"),  # jsoniter only writes a sign for x < 0
        (1e-4, "1.0E-4"),
        (1e7, "1.0E7"),
        (1.7976931348623157e308, "1.7976931348623157E308"),
        (9.9e-44, "9.9E-44"),
        (0.001, "0.001"),
        (0.5, "0.5"),
        (123.0, "123.0"),
        (1234567.0, "1234567.0"),
        (12345678.0, "1.2345678E7"),
        (0.41, "0.41"),
        (-2.5, "-2.5"),
        (0.0025, "0.0025"),
        (0.00025, "2.5E-4"),
        (1e16, "1.0E16"),
        (1e22, "1.0E22"),
        (-1e-5, "-1.0E-5"),
        (0.1 + 0.2, "0.30000000000000004"),
        (100, "100.0"),
    ],
)
def test_lamp_float_examples(value, text):
    assert lamp_float(value) == text
    assert float(text) == value


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")])
def test_lamp_float_refuses_non_finite(value):
    with pytest.raises(ValueError, match="cannot be written as JSON"):
        lamp_float(value)
    with pytest.raises(ValueError, match="cannot be written as JSON"):
        dumps_lamp({"loss": value})


_LAMP_FLOAT = re.compile(r"-?(?:(?P<plain>(?:0|[1-9]\d*)\.\d+)|(?P<mant>[1-9]\.\d+)E(?P<exp>-?[1-9]\d*))\Z")


@settings(max_examples=500, deadline=None)
@given(st.floats(allow_nan=False, allow_infinity=False))
def test_lamp_float_round_trips_with_java_thresholds(x):
    text = lamp_float(x)
    m = _LAMP_FLOAT.match(text)
    assert m, text
    assert float(text) == x
    if x == 0:
        assert text == "0.0"
        return
    if m.group("exp"):  # Java's Double.toString thresholds: 1e-3 <= |x| < 1e7 is plain
        e10 = int(m.group("exp"))
        assert e10 < -3 or e10 >= 7
    else:
        assert 1e-3 <= abs(x) < 1e7
    frac = (m.group("plain") or m.group("mant")).split(".")[1]
    assert frac == "0" or not frac.endswith("0")  # shortest: no trailing zeros


def test_dumps_lamp_escapes_like_jsoniter():
    assert dumps_lamp("\x00\x01\x1f\x7f") == '"\\u0000\\u0001\\u001f\\u007f"'  # lowercase hex
    assert dumps_lamp("\x0b\x1a\x1b") == '"\\u000b\\u001a\\u001b"'
    assert dumps_lamp("\b\t\n\f\r") == '"\\b\\t\\n\\f\\r"'
    assert dumps_lamp('q"b\\') == '"q\\"b\\\\"'
    assert dumps_lamp("a/b") == '"a/b"'  # "/" is not escaped
    assert dumps_lamp("é☃😀\x80\xa0") == '"é☃😀\x80\xa0"'  # non-ASCII raw, C1 controls too
    assert dumps_lamp({"k\ney": 1}) == '{"k\\ney":1}'


def test_dumps_lamp_is_compact_and_keeps_key_order():
    obj = {"z": [1, 2.0, None, True, False, "s"], "a": {}, "m": [], "f": 0.41, "e": 1e-4}
    assert dumps_lamp(obj) == '{"z":[1,2.0,null,true,false,"s"],"a":{},"m":[],"f":0.41,"e":1.0E-4}'
    assert dumps_lamp((1, None)) == "[1,null]"  # tuples are arrays
    with pytest.raises(TypeError, match="cannot write set"):
        dumps_lamp({1, 2})


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
    max_leaves=20,
)


@settings(max_examples=200, deadline=None)
@given(json_values)
def test_dumps_lamp_round_trips_through_strict_json(obj):
    text = dumps_lamp(obj)
    assert loads_strict(text) == obj
