#!/usr/bin/env python3
"""(Re)makes the conformance corpus: small valid and invalid TensorList files and manifest.json.

Run ``python tests/conformance/make_corpus.py [OUT_DIR]`` (default: this directory). The output is
deterministic: every byte comes from this script (no tensorlist writer, no random names), so
tests/core/test_conformance.py can check that the committed corpus is what this script makes.

manifest.json lists one case per descriptor:

- ``id``, ``file`` (relative to the manifest), ``pointer`` (RFC 6901, or null for the whole document);
- ``expect``: ``"ok"`` or ``"error"``; ``rule``: for errors, the rule number of docs/FORMAT.md §2.3
  that the file breaks (1 size cap ... 13 data file), ``rule_name`` and a ``why``;
- ``limits``: policy limits the case is read with (``max_descriptor_bytes``, ``max_tensors``);
- ``verify``: ``"ok"``/``"error"``, the outcome of checking the stored CRC32Cs (valid files only);
- ``tensors`` (valid files): in list order, ``key`` (the name, or the index as a string), ``dtype``
  (canonical name), ``dataType`` (code), ``shape``, ``hex`` (the stored little-endian bytes) and
  ``values`` (the elements as JSON numbers, complex as [re, im]; omitted where not exact in JSON).

Only numpy and ml_dtypes are needed, for the element values.
"""
import functools
import json
import os
import shutil
import sys

import ml_dtypes
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))

# (code, name, numpy dtype): docs/FORMAT.md §3
DTYPES = [
    (0, "uint8", "u1"), (1, "int8", "i1"), (2, "int16", "<i2"), (3, "int32", "<i4"), (4, "int64", "<i8"),
    (5, "float16", "<f2"), (6, "float32", "<f4"), (7, "float64", "<f8"), (9, "complex64", "<c8"),
    (10, "complex128", "<c16"), (11, "bool", "?"), (15, "bfloat16", ml_dtypes.bfloat16),
    (23, "float8_e5m2", ml_dtypes.float8_e5m2), (24, "float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    (25, "float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz), (26, "float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
    (27, "uint16", "<u2"), (28, "uint32", "<u4"), (29, "uint64", "<u8"),
    (44, "float8_e8m0fnu", ml_dtypes.float8_e8m0fnu),
    # packed pairs of 4-bit floats: the values are the bytes, in a uint8 tagged as tensorlist's readers tag it
    (45, "float4_e2m1fn_x2", np.dtype("u1", metadata={"tensorlist.dtype": "float4_e2m1fn_x2"})),
]
CODE = {name: code for code, name, _ in DTYPES}
NP = {name: np.dtype(dt) for _, name, dt in DTYPES}
RULES = {1: "size cap", 2: "strict JSON", 3: "types", 4: "tensor count", 5: "list alignment", 6: "names",
         7: "element type", 8: "size", 9: "tensor alignment", 10: "bounds", 11: "no overlap",
         12: "location", 13: "data file"}


def _crc_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc_table()


def crc32c(data: bytes) -> int:
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


def sample(name: str, shape) -> np.ndarray:
    """Deterministic, exactly representable values of a dtype."""
    n = int(np.prod(shape))
    k = np.arange(n)
    if name == "bool":
        a = (k % 3 == 1)
    elif name.startswith(("uint", "int")) or name == "float4_e2m1fn_x2":
        a = (k * 7 + 1) if name.startswith("uint") else (k * 7 - 5)
    elif name == "float8_e8m0fnu":
        a = 2.0 ** (k - 2)
    elif name.startswith("complex"):
        a = (k - 2) * 0.5 + 1j * (k * 0.25)
    else:
        a = (k - 2) * 0.5
    return np.asarray(a).astype(NP[name]).reshape(shape)


def values(a: np.ndarray):
    if a.dtype.kind == "c":
        return [[float(z.real), float(z.imag)] for z in a.reshape(-1)]
    if a.dtype.kind == "b":
        return [bool(x) for x in a.reshape(-1)]
    if a.dtype.kind in "iu":
        return [int(x) for x in a.reshape(-1)]
    return [float(x) for x in a.astype(np.float64).reshape(-1)]


def dumps(obj) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


def align(n, a):
    return (n + a - 1) // a * a


def layout(arrays, names=None, *, alignment=64, crc=True, lamp=False, start=0):
    """(tensor entries, region bytes) for arrays laid out as tensorlist or lamp writes them."""
    entries, region = [], bytearray()
    for i, a in enumerate(arrays):
        raw = a.tobytes()
        off = len(region) if lamp else align(len(region), max(alignment, a.dtype.itemsize))
        region += b"\0" * (off - len(region)) + raw
        if lamp:
            region += b"\0" * ((8 - len(raw) % 8) % 8)
            e = {}
            if a.ndim:
                e["dims"] = list(a.shape)
        else:
            e = {"name": names[i]} if names else {}
            e["dims"] = list(a.shape)
        name = dtype_name(a)
        e.update(dataType=CODE[name], byteOffset=off, byteLength=len(raw))
        if crc and not lamp:
            e["crc32c"] = crc32c(raw)
        entries.append(e)
    if not lamp:
        region += b"\0" * (align(len(region), alignment) - len(region))
    return entries, bytes(region)


def dtype_name(a: np.ndarray) -> str:
    """The table name of ``a``'s dtype (a tagged uint8 is not uint8: numpy's == ignores the tag)."""
    return next(n for c, n, dt in DTYPES if np.dtype(dt) == a.dtype and np.dtype(dt).metadata == a.dtype.metadata)


def expected(arrays, names=None):
    out = []
    for i, a in enumerate(arrays):
        name = dtype_name(a)
        out.append({"key": names[i] if names else str(i), "dtype": name, "dataType": CODE[name],
                    "shape": list(a.shape), "hex": a.tobytes().hex(), "values": values(a)})
    return out


class Corpus:
    def __init__(self, out):
        self.out = out
        self.cases = []

    def write(self, rel, data: bytes):
        path = os.path.join(self.out, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)

    def case(self, cid, file, expect, pointer=None, **extra):
        c = {"id": cid, "file": file, "pointer": pointer, "expect": expect}
        if "rule" in extra:
            extra["rule_name"] = RULES[extra["rule"]]
        c.update(extra)
        self.cases.append(c)

    def valid_list(self, cid, arrays, names=None, *, lamp=False, desc_extra=None, tensor_extra=None,
                   data_prefix=b"", data_suffix=b"", location=None, crc=True, why=""):
        entries, region = layout(arrays, names, lamp=lamp, crc=crc)
        for e, x in zip(entries, tensor_extra or []):
            e.update(x)
        file = f"valid/{cid}.tl"
        loc = location or f"{cid}.tl.data"
        offset = len(data_prefix)
        if lamp:
            desc = {"tensors": entries} if entries else {}
            desc.update(location=loc, byteOffset=offset, byteLength=len(region))
        else:
            desc = {"formatVersion": 1, "tensors": entries, "location": loc, "byteOffset": offset,
                    "byteLength": len(region)}
        desc.update(desc_extra or {})
        self.write(file, dumps(desc))
        if region or data_prefix or data_suffix:
            self.write(f"valid/{loc}", data_prefix + region + data_suffix)
        self.case(cid, file, "ok", tensors=expected(arrays, names), verify="ok", why=why)
        return desc


BASE_TENSORS = [
    {"name": "w", "dims": [2, 2], "dataType": 6, "byteOffset": 0, "byteLength": 16},
    {"name": "b", "dims": [2], "dataType": 7, "byteOffset": 16, "byteLength": 16},
]
BASE_DATA = np.arange(4, dtype="<f4").tobytes() + np.array([5, 6], "<f8").tobytes()


def base(**over):
    d = {"formatVersion": 1, "tensors": json.loads(json.dumps(BASE_TENSORS)), "location": "base.data",
         "byteOffset": 0, "byteLength": 32}
    d.update(over)
    return d


def with_tensor(i, **over):
    d = base()
    d["tensors"][i].update(over)
    return d


def _bad(c, cid, rule, doc, why, pointer=None, data=None, **extra):
    """One invalid case: the descriptor (and its data file, if any) and its manifest entry."""
    file = f"invalid/{cid}.tl"
    c.write(file, doc if isinstance(doc, bytes) else dumps(doc))
    if data is not None:
        c.write(f"invalid/{cid}.data", data)
    c.case(cid, file, "error", pointer=pointer, rule=rule, why=why, **extra)


def _valid_dtypes(c):
    # --- valid: every dtype -------------------------------------------------------------------
    for _, name, _ in DTYPES:
        arrays = [sample(name, (2, 3)), sample(name, ()), sample(name, (0, 4))]
        c.valid_list(f"dtype_{name}", arrays, ["m", "s", "e"], why=f"{name}: a matrix, a scalar, an empty tensor")



def _valid_lamp(c):
    # --- valid: lamp-written layouts -----------------------------------------------------------
    lamp_text = (b'{"tensors":[{"dims":[2,3],"dataType":6,"byteOffset":0,"byteLength":24},'
                 b'{"dims":[5],"dataType":6,"byteOffset":24,"byteLength":20},'
                 b'{"dataType":4,"byteOffset":48,"byteLength":8}],"location":"x.lamp.data",'
                 b'"byteOffset":0,"byteLength":56}')
    arrays = [sample("float32", (2, 3)), sample("float32", (5,)), sample("int64", ())]
    entries, region = layout(arrays, lamp=True)
    assert dumps({"tensors": entries, "location": "x.lamp.data", "byteOffset": 0,
                  "byteLength": len(region)}) == lamp_text
    c.write("valid/x.lamp", lamp_text)
    c.write("valid/x.lamp.data", region)
    c.case("lamp_example", "valid/x.lamp", "ok", tensors=expected(arrays), verify="ok",
           why="the lamp example of FORMAT.md §5.2, byte for byte")
    c.valid_list("lamp_every_lamp_dtype",
                 [sample(n, (3,)) for n in ("uint8", "int8", "int16", "int32", "int64", "float16",
                                            "float32", "float64", "bool", "bfloat16")], lamp=True,
                 why="lamp padding to 8 bytes after each tensor")
    c.valid_list("lamp_empty_tensors_at_end", [sample("int16", (3,)), sample("float32", (0,)),
                                               sample("int8", (0, 2))], lamp=True,
                 why="empty tensors sitting at exactly the list's end (lamp writes these)")
    c.valid_list("lamp_empty_list", [], lamp=True, why="no tensors key, byteLength 0, no data file")
    c.valid_list("lamp_escaped_names_free", [sample("uint8", (9,))], lamp=True,
                 why="a 9-byte tensor padded to 16")



def _valid_extensions(c):
    # --- valid: tensorlist extensions and layouts ----------------------------------------------
    c.valid_list("named_crc_metadata", [sample("float32", (2, 3)), sample("float64", ())], ["w", "step"],
                 desc_extra={"metadata": {"epoch": 3, "note": [1, None, True]}},
                 why="FORMAT.md §2.4 shape: names, checksums and metadata")
    c.valid_list("no_crc", [sample("int32", (4,))], ["a"], crc=False, why="checksums are optional")
    c.valid_list("unicode_names", [sample("int8", (2,)), sample("int8", (1,))], ["é/\u2603", "a\"b\\c\n"],
                 why="non-ASCII and escaped characters in names")
    c.valid_list("unknown_keys_ignored", [sample("uint16", (2,))], ["x"],
                 desc_extra={"producer": {"name": "someone"}},
                 tensor_extra=[{"quantization": None, "extra": [1, 2]}],
                 why="readers ignore keys they do not know, in both objects")
    c.valid_list("region_at_nonzero_offset", [sample("float32", (3,))], ["x"], data_prefix=b"\xab" * 4096,
                 data_suffix=b"\xcd" * 100, why="list at byteOffset 4096, other bytes before and after")
    c.valid_list("subdirectory_location", [sample("int64", (2,))], ["x"], location="sub/dir/data.bin",
                 why="location is a relative path into a subdirectory")
    c.valid_list("dot_segments_inside", [sample("int64", (2,))], ["x"], location="sub/../dots.data",
                 why="'..' that does not leave the directory")
    c.valid_list("empty_named_list", [], [], why="tensors [] and byteLength 0: the data file is not opened")
    # hand-made layout: tensors out of offset order with gaps, empty tensor inside another's range
    a, b = sample("float64", (2,)), sample("int16", (3,))
    desc = {"tensors": [{"name": "late", "dims": [2], "dataType": 7, "byteOffset": 64, "byteLength": 16},
                        {"name": "early", "dims": [3], "dataType": 2, "byteOffset": 8, "byteLength": 6},
                        {"name": "void", "dims": [0], "dataType": 6, "byteOffset": 64, "byteLength": 0}],
            "location": "hand_layout.data", "byteOffset": 0, "byteLength": 96}
    data = bytearray(96)
    data[64:80] = a.tobytes()
    data[8:14] = b.tobytes()
    c.write("valid/hand_layout.tl", dumps(desc))
    c.write("valid/hand_layout.data", bytes(data))
    c.case("hand_layout", "valid/hand_layout.tl", "ok",
           tensors=expected([a, b, sample("float32", (0,))], ["late", "early", "void"]), verify="ok",
           why="offsets out of order, gaps, an empty tensor inside another's range (no shared byte)")
    # pretty-printed, with whitespace everywhere JSON allows it
    entries, region = layout([sample("float32", (2,))], ["p"])
    desc = {"formatVersion": 1, "tensors": entries, "location": "pretty.data", "byteOffset": 0,
            "byteLength": len(region)}
    c.write("valid/pretty.tl", b" \r\n\t" + json.dumps(desc, indent=3).encode() + b"\n\n")
    c.write("valid/pretty.data", region)
    c.case("pretty_printed", "valid/pretty.tl", "ok", tensors=expected([sample("float32", (2,))], ["p"]),
           verify="ok", why="indentation and surrounding whitespace")
    # a checksum that does not match: loads fine, fails verification
    entries, region = layout([sample("int32", (4,))], ["x"])
    entries[0]["crc32c"] ^= 1
    c.write("valid/bad_crc.tl", dumps({"formatVersion": 1, "tensors": entries, "location": "bad_crc.data",
                                       "byteOffset": 0, "byteLength": len(region)}))
    c.write("valid/bad_crc.data", region)
    c.case("crc_mismatch", "valid/bad_crc.tl", "ok", tensors=expected([sample("int32", (4,))], ["x"]),
           verify="error", why="checksums are checked only on request")



def _valid_embedded(c):
    # --- valid: embedded descriptors and shared data files -------------------------------------
    m = [sample("float32", (2, 2)), sample("bfloat16", (3,))]
    o = [sample("float64", (2,)), sample("int64", ())]
    e1, r1 = layout(m, ["w", "b"])
    e2, r2 = layout(o)
    start2 = align(len(r1), 4096)
    doc = {"epoch": 3, "model": {"formatVersion": 1, "tensors": e1, "location": "ckpt.json.data",
                                 "byteOffset": 0, "byteLength": len(r1)},
           "optimizer": {"state": [{"formatVersion": 1, "tensors": e2, "location": "ckpt.json.data",
                                    "byteOffset": start2, "byteLength": len(r2)}]},
           "a~b/c": {"tensors": [], "location": "ckpt.json.data", "byteOffset": 0, "byteLength": 0}}
    c.write("valid/ckpt.json", dumps(doc))
    c.write("valid/ckpt.json.data", r1 + b"\0" * (start2 - len(r1)) + r2)
    c.case("embedded_model", "valid/ckpt.json", "ok", pointer="/model", tensors=expected(m, ["w", "b"]),
           verify="ok", why="a list embedded in a bigger document, sharing its data file")
    c.case("embedded_optimizer", "valid/ckpt.json", "ok", pointer="/optimizer/state/0", tensors=expected(o),
           verify="ok", why="a second list in the same data file at a 4096-aligned offset")
    c.case("embedded_escaped_pointer", "valid/ckpt.json", "ok", pointer="/a~0b~1c", tensors=[], verify="ok",
           why="RFC 6901 escapes ~0 and ~1")



def _invalid_syntax_and_types(c):
    # --- invalid: one file per rule (several for some) -----------------------------------------
    c.write("invalid/base.data", BASE_DATA)

    bad = functools.partial(_bad, c)
    bad("r01_size_cap", 1, base(metadata="x" * 200), "descriptor above max_descriptor_bytes",
        limits={"max_descriptor_bytes": 256})
    bad("r02_duplicate_key", 2, dumps(base())[:-1] + b',"byteLength":32}', "a key twice in one object")
    bad("r02_duplicate_key_in_tensor", 2,
        dumps(base()).replace(b'"dataType":6', b'"dataType":6,"dataType":6'), "a key twice in a tensor")
    bad("r02_nan", 2, dumps(base()).replace(b'"byteLength":32}', b'"byteLength":32,"metadata":NaN}'),
        "NaN is not JSON")
    bad("r02_infinity", 2, dumps(base()).replace(b'"byteLength":32}', b'"byteLength":32,"metadata":-Infinity}'),
        "-Infinity is not JSON")
    bad("r02_number_overflow", 2, dumps(base()).replace(b'"byteLength":32}', b'"byteLength":32,"metadata":1e999}'),
        "a number that overflows a double")
    bad("r02_two_values", 2, dumps(base()) + b" {}", "more than one JSON value")
    bad("r02_truncated", 2, dumps(base())[:-7], "the document ends early")
    bad("r02_invalid_utf8", 2, dumps(base()).replace(b'"base.data"', b'"base\xff.data"'), "not UTF-8")
    bad("r02_trailing_comma", 2, dumps(base())[:-1] + b",}", "a trailing comma")
    bad("r02_single_quotes", 2, dumps(base()).replace(b'"location"', b"'location'"), "single-quoted key")
    bad("r02_nesting_257", 2, dumps(base()).replace(b'"byteLength":32}', b'"byteLength":32,"metadata":'
                                                    + b"[" * 256 + b"]" * 256 + b"}"),
        "arrays nested 257 levels deep (the limit is 256)")
    bad("r02_lone_surrogate_name", 2, dumps(base()).replace(b'"name":"w"', b'"name":"w\\ud800"'),
        "a name that is not valid Unicode (an unpaired surrogate escape)")
    bad("r02_lone_surrogate_location", 2, dumps(base()).replace(b'"location":"base.data"',
                                                              b'"location":"base\\udc80.data"'),
        "a location that is not valid Unicode (an unpaired surrogate escape)")
    bad("r03_dims_65", 3, with_tensor(0, dims=[1] * 63 + [2, 2]), "65 dims, more than the 64 a tensor may have")
    bad("r02_raw_control_char", 2, dumps(base()).replace(b'"base.data"', b'"base\x01.data"'),
        "a raw control character in a string")
    bad("r03_missing_location", 3, {k: v for k, v in base().items() if k != "location"}, "location is required")
    bad("r03_location_not_string", 3, base(location=7), "location must be a string")
    bad("r03_offset_string", 3, base(byteOffset="0"), "byteOffset must be an integer")
    bad("r03_length_float", 3, base(byteLength=32.0), "1.0-style numbers are not integers")
    bad("r03_length_negative", 3, base(byteLength=-32), "negative length")
    bad("r03_length_2_63", 3, base(byteLength=1 << 63), "integers must be below 2**63")
    bad("r03_datatype_bool", 3, with_tensor(0, dataType=True), "true is not an integer")
    bad("r03_missing_datatype", 3, {**base(), "tensors": [{"dims": [2], "byteOffset": 0, "byteLength": 8}]},
        "dataType is required")
    bad("r03_dims_not_array", 3, with_tensor(0, dims=4), "dims must be an array")
    bad("r03_dims_negative", 3, with_tensor(0, dims=[-2, -2]), "dims must be non-negative")
    bad("r03_dims_float", 3, with_tensor(0, dims=[2, 2.0]), "dims must be integers")
    bad("r03_tensors_not_array", 3, base(tensors={"w": BASE_TENSORS[0]}), "tensors must be an array")
    bad("r03_tensor_not_object", 3, base(tensors=[1]), "each tensor is an object")
    bad("r03_name_null", 3, with_tensor(0, name=None), "name must be a string")
    bad("r03_crc_2_32", 3, with_tensor(0, crc32c=1 << 32), "crc32c must be below 2**32")
    bad("r03_format_version_future", 3, base(formatVersion=2), "a formatVersion the reader does not know")
    bad("r03_not_an_object", 3, b"[1,2,3]", "the descriptor is not an object")
    bad("r04_tensor_count", 4, base(), "more tensors than max_tensors", limits={"max_tensors": 1})
    bad("r05_list_offset_unaligned", 5, base(byteOffset=100), "list byteOffset not a multiple of 4096")
    bad("r05_list_end_overflows", 5, base(byteOffset=(1 << 63) - 4096, byteLength=4096),
        "byteOffset + byteLength overflows 2**63 - 1")
    bad("r06_mixed_names", 6, {**base(), "tensors": [BASE_TENSORS[0],
                                                     {k: v for k, v in BASE_TENSORS[1].items() if k != "name"}]},
        "some tensors named, some not")
    bad("r06_duplicate_names", 6, with_tensor(1, name="w"), "two tensors with one name")


def _invalid_layout_and_files(c, out):
    bad = functools.partial(_bad, c)
    bad("r07_complex32", 7, with_tensor(0, dataType=8), "complex32 has no numpy representation")
    bad("r07_unknown_code", 7, with_tensor(0, dataType=99), "an unknown ScalarType code")
    bad("r08_size_mismatch", 8, with_tensor(0, byteLength=12), "dims x itemsize != byteLength")
    bad("r08_dims_product_overflow", 8, with_tensor(0, dims=[1 << 40, 1 << 40]),
        "product(dims) x itemsize overflows 64 bits")
    bad("r08_empty_tensor_unrepresentable", 8, with_tensor(0, dims=[0, 1 << 62], byteLength=0),
        "an empty tensor whose non-zero dims x itemsize overflow 64 bits (no array library can shape it)")
    bad("r09_tensor_unaligned", 9, {**base(byteLength=40), "tensors": [
        BASE_TENSORS[0], {**BASE_TENSORS[1], "byteOffset": 20}]}, "tensor byteOffset not a multiple of 8",
        data=BASE_DATA + bytes(8))
    bad("r09_itemsize_unaligned", 9, {**base(byteLength=64), "location": "r09_itemsize_unaligned.data",
                                      "tensors": [{"name": "z", "dims": [1], "dataType": 10, "byteOffset": 8,
                                                   "byteLength": 16}]},
        "complex128 at an offset not a multiple of 16", data=bytes(64))
    bad("r10_tensor_past_list_end", 10, with_tensor(1, byteOffset=24), "tensor ends past the list's byteLength")
    bad("r10_offset_overflow", 10, with_tensor(1, byteOffset=(1 << 63) - 8), "byteOffset + byteLength overflows")
    bad("r11_overlap", 11, with_tensor(1, byteOffset=8), "two tensors share bytes")
    bad("r11_amplification", 11, {**base(byteLength=16), "tensors": [
        {"name": f"t{i}", "dims": [4], "dataType": 6, "byteOffset": 0, "byteLength": 16} for i in range(50)]},
        "many tensors over the same bytes (memory amplification)")
    bad("r12_location_absolute", 12, base(location="/etc/passwd"), "absolute location")
    bad("r12_location_escapes", 12, base(location="../invalid/base.data"), "location leaves the directory")
    bad("r12_location_backslash", 12, base(location="sub\\base.data"), "backslash separator")
    bad("r12_location_drive", 12, base(location="C:base.data"), "drive letter")
    bad("r12_location_empty", 12, base(location=""), "empty location")
    bad("r12_location_nul", 12, base(location="base.data\u0000x"), "NUL in location")
    bad("r13_data_missing", 13, base(location="does-not-exist.data"), "the data file does not exist")
    bad("r13_data_short", 13, base(location="r13_data_short.data"), "the data file is shorter than the region",
        data=BASE_DATA[:31])
    bad("r13_location_through_a_file", 13, base(location="base.data/x"), "a path through a regular file")
    bad("r13_data_directory", 13, base(location="dir.data"), "the data file is a directory")
    os.makedirs(os.path.join(out, "invalid", "dir.data"), exist_ok=True)
    c.write("invalid/dir.data/.keep", b"")
    bad("r13_region_past_file", 13, base(byteOffset=4096), "the region starts past the end of the file")
    bad("embedded_bad_pointer_target", 3, {"model": base(location=5)}, "an embedded list with a bad field",
        pointer="/model")



def make(out):
    if os.path.isdir(os.path.join(out, "valid")):
        shutil.rmtree(os.path.join(out, "valid"))
    if os.path.isdir(os.path.join(out, "invalid")):
        shutil.rmtree(os.path.join(out, "invalid"))
    c = Corpus(out)

    _valid_dtypes(c)
    _valid_lamp(c)
    _valid_extensions(c)
    _valid_embedded(c)
    _invalid_syntax_and_types(c)
    _invalid_layout_and_files(c, out)

    manifest = {
        "format": "tensorlist conformance corpus",
        "version": 1,
        "spec": "docs/FORMAT.md",
        "rules": {str(k): v for k, v in RULES.items()},
        "cases": c.cases,
    }
    with open(os.path.join(out, "manifest.json"), "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1, ensure_ascii=False)
        f.write("\n")
    return manifest


if __name__ == "__main__":
    m = make(sys.argv[1] if len(sys.argv) > 1 else HERE)
    ok = sum(c["expect"] == "ok" for c in m["cases"])
    print(f"{len(m['cases'])} cases: {ok} valid, {len(m['cases']) - ok} invalid")
