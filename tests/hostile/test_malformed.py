"""One malformed file per validation rule, and parity between the validator, the schema and the C core.

Every case is fed to ``load`` (mmap on and off), ``open`` and ``validate``; each must raise
``FormatError`` (a ``ValueError``) whose message names the file and whose attributes name the tensor
and the field. ``validate`` runs the JSON Schema first, so its message may be the schema's; the
table says where its field differs (e.g. the schema points into ``dims/1``).
"""
import copy
import json
import os
import pickle
import re
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any, Callable, Dict, Optional, Union

import jsonschema
import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base import dtypes
from tensorlist._base import lowlevel
from tensorlist import format as fmt
from tensorlist.crypto import spec
from tensorlist._core import lib
from tensorlist._base.jsonio import loads_strict
from tensorlist.schema import load_schema, schema_validator
from _paths import ROOT as ROOT_DIR

ROOT = Path(ROOT_DIR)

BASE = {
    "formatVersion": 1,
    "tensors": [
        {"name": "w", "dims": [2, 2], "dataType": 6, "byteOffset": 0, "byteLength": 16},
        {"name": "b", "dims": [2], "dataType": 7, "byteOffset": 16, "byteLength": 16},
    ],
    "location": "d.data",
    "byteOffset": 0,
    "byteLength": 32,
}
DATA = np.arange(4, dtype="<f4").tobytes() + np.array([5, 6], "<f8").tobytes()
SAME = object()  # "validate reports the same as load"


@dataclass
class Case:
    id: str
    doc: Union[bytes, Callable[[Dict], Any]]  # raw descriptor bytes, or a mutation of BASE
    match: str
    field: Optional[str] = None
    index: Optional[int] = None
    name: Optional[str] = None
    kwargs: Dict[str, Any] = dc_field(default_factory=dict)
    data: Optional[bytes] = DATA
    setup: Optional[Callable[[Path], None]] = None
    v_match: Any = SAME
    v_field: Any = SAME


def _set(*path_and_value):
    *path, value = path_and_value

    def mutate(d):
        node = d
        for p in path[:-1]:
            node = node[p]
        node[path[-1]] = value
    return mutate


def _del(*path):
    def mutate(d):
        node = d
        for p in path[:-1]:
            node = node[p]
        del node[path[-1]]
    return mutate


def _all(*mutations):
    def mutate(d):
        for m in mutations:
            m(d)
    return mutate


def _text(d) -> str:
    return json.dumps(d, separators=(",", ":"))


BASE_TEXT = _text(BASE)
T0, T1 = ("tensors", 0), ("tensors", 1)
INT_ = r"must be an integer in \[0, 2\*\*63\)"


def _doc_lists():
    doc = {"epoch": 3, "lists": [copy.deepcopy(BASE), copy.deepcopy(BASE)]}
    return _text(doc).encode()



CASES = [
    # 1. size cap
    Case("size-cap", BASE_TEXT.encode(), r"above the limit of 100", kwargs={"max_descriptor_bytes": 100}),
    # 2. strict JSON
    Case("not-utf8", BASE_TEXT.replace('"d.data"', '"d\xff.data"').encode("latin-1"), "not UTF-8"),
    Case("utf16", BASE_TEXT.encode("utf-16"), "not UTF-8"),
    Case("truncated-json", BASE_TEXT[:-5].encode(), "invalid JSON"),
    Case("trailing-garbage", (BASE_TEXT + " x").encode(), "invalid JSON: Extra data"),
    Case("two-values", (BASE_TEXT + BASE_TEXT).encode(), "invalid JSON: Extra data"),
    Case("empty-file", b"", "invalid JSON"),
    Case("duplicate-key", BASE_TEXT.replace('"location":"d.data"', '"location":"d.data","location":"d.data"')
         .encode(), "duplicate key 'location'"),
    Case("duplicate-key-in-tensor", BASE_TEXT.replace('"dataType":6', '"dataType":6,"dataType":6').encode(),
         "duplicate key 'dataType'"),
    Case("duplicate-key-escaped", BASE_TEXT.replace('"location":"d.data"',
                                                    '"location":"d.data","locati\\u006fn":"d.data"').encode(),
         "duplicate key 'location'"),
    Case("nan", BASE_TEXT.replace('"byteLength":32}', '"byteLength":32,"metadata":NaN}').encode(),
         "NaN is not valid JSON"),
    Case("infinity", BASE_TEXT.replace('"byteLength":32}', '"byteLength":32,"metadata":[Infinity]}').encode(),
         "Infinity is not valid JSON"),
    Case("-infinity", BASE_TEXT.replace('"byteLength":32}', '"byteLength":32,"metadata":-Infinity}').encode(),
         "-Infinity is not valid JSON"),
    Case("nan-in-tensor", BASE_TEXT.replace('"byteOffset":16', '"byteOffset":NaN').encode(),
         "NaN is not valid JSON"),
    Case("1e999", BASE_TEXT.replace('"byteLength":32}', '"byteLength":32,"metadata":{"x":1e999}}').encode(),
         "out of the float64 range"),
    Case("-1e999-in-tensor", BASE_TEXT.replace('"byteOffset":16', '"byteOffset":-1e999').encode(),
         "out of the float64 range"),
    Case("huge-integer-literal", BASE_TEXT.replace('"byteLength":32}', '"byteLength":32,"metadata":'
                                                   + "9" * 5000 + "}").encode(), "invalid JSON"),
    Case("deep-nesting", BASE_TEXT.replace('"byteLength":32}', '"byteLength":32,"metadata":'
                                           + "[" * 100000 + "]" * 100000 + "}").encode(), "invalid JSON"),
    Case("single-quotes", BASE_TEXT.replace('"d.data"', "'d.data'").encode(), "invalid JSON"),
    Case("comment", ("// lamp\n" + BASE_TEXT).encode(), "invalid JSON"),
    # the document holds no TensorList
    Case("root-array", b"[1, 2]", "is not a TensorList descriptor and embeds none"),
    Case("root-string", b'"d.data"', "embeds none"),
    Case("root-number", b"42", "embeds none"),
    Case("root-null", b"null", "embeds none"),
    Case("pointer-to-non-object", _doc_lists(), "must be a JSON object, got int", kwargs={"pointer": "/epoch"},
         v_match=r"3 is not of type 'object'"),
    # 3. types, list level
    Case("missing-location", _del("location"), "missing required field", "location",
         v_match="'location' is a required property"),
    Case("missing-byteOffset", _del("byteOffset"), "missing required field", "byteOffset",
         v_match="'byteOffset' is a required property"),
    Case("missing-byteLength", _del("byteLength"), "missing required field", "byteLength",
         v_match="'byteLength' is a required property"),
    Case("location-int", _set("location", 5), "must be a string, got 5", "location",
         v_match="5 is not of type 'string'"),
    Case("location-null", _set("location", None), "must be a string, got None", "location",
         v_match="None is not of type 'string'"),
    Case("byteOffset-bool", _set("byteOffset", False), INT_ + ", got False", "byteOffset",
         v_match="False is not of type 'integer'"),
    Case("byteOffset-float", _set("byteOffset", 0.0), INT_ + ", got 0.0", "byteOffset"),  # schema: 0.0 is an integer
    Case("byteLength-float", _set("byteLength", 32.5), INT_ + ", got 32.5", "byteLength",
         v_match="32.5 is not of type 'integer'"),
    Case("byteLength-string", _set("byteLength", "32"), INT_ + ", got '32'", "byteLength",
         v_match="'32' is not of type 'integer'"),
    Case("byteOffset-negative", _set("byteOffset", -4096), INT_ + ", got -4096", "byteOffset",
         v_match="-4096 is less than the minimum of 0"),
    Case("byteLength-negative", _set("byteLength", -1), INT_ + ", got -1", "byteLength",
         v_match="-1 is less than the minimum of 0"),
    Case("byteOffset-2**63", _set("byteOffset", 2**63), INT_, "byteOffset",
         v_match="is greater than the maximum"),
    Case("byteLength-2**64", _set("byteLength", 2**64), INT_, "byteLength", v_match="is greater than the maximum"),
    # 5. list alignment and overflow
    Case("list-offset-unaligned", _set("byteOffset", 100), "must be a multiple of 4096, got 100", "byteOffset",
         v_match="100 is not a multiple of 4096"),
    Case("list-offset-2048", _set("byteOffset", 2048), "multiple of 4096", "byteOffset"),
    Case("list-overflow", _all(_set("byteOffset", 2**63 - 4096), _set("byteLength", 8192)),
         "byteOffset \\+ byteLength overflows 64 bits", "byteLength"),
    # format version
    Case("formatVersion-3", _set("formatVersion", 3), "unsupported format version 3", "formatVersion",
         v_match="3 is greater than the maximum of 2"),
    Case("formatVersion-2", _set("formatVersion", 2), "an encrypted list has formatVersion 2", "formatVersion",
         v_match="'encryption' is a required property", v_field="encryption"),
    Case("formatVersion-0", _set("formatVersion", 0), "unsupported format version 0", "formatVersion",
         v_match="0 is less than the minimum of 1"),
    Case("formatVersion-string", _set("formatVersion", "1"), "unsupported format version '1'", "formatVersion",
         v_match="'1' is not of type 'integer'"),
    Case("formatVersion-bool", _set("formatVersion", True), "unsupported format version True", "formatVersion",
         v_match="True is not of type 'integer'"),
    Case("formatVersion-null", _set("formatVersion", None), "unsupported format version None", "formatVersion",
         v_match="None is not of type 'integer'"),
    # tensors array
    Case("tensors-object", _set("tensors", {}), "must be an array, got dict", "tensors",
         v_match="is not of type 'array'"),
    Case("tensors-null", _set("tensors", None), "must be an array, got NoneType", "tensors",
         v_match="None is not of type 'array'"),
    Case("tensors-string", _set("tensors", "w,b"), "must be an array, got str", "tensors",
         v_match="is not of type 'array'"),
    Case("tensors-marker-like-string", _set("tensors", "\x00tl0"), "must be an array, got str", "tensors",
         v_match="is not of type 'array'"),
    # 4. tensor count
    Case("too-many-tensors", lambda d: None, "2 tensors, above the limit of 1", "tensors",
         kwargs={"max_tensors": 1}),
    # tensor objects
    Case("tensor-int", _set("tensors", 0, 5), "must be a JSON object, got int", "tensors/0", 0,
         v_match="5 is not of type 'object'", v_field=None),
    Case("tensor-array", _set("tensors", 1, []), "must be a JSON object, got list", "tensors/1", 1,
         v_match=r"\[\] is not of type 'object'", v_field=None),
    Case("tensor-null", _set("tensors", 1, None), "must be a JSON object, got NoneType", "tensors/1", 1,
         v_match="None is not of type 'object'", v_field=None),
    # 6. names
    Case("mixed-named-unnamed", _del(*T1, "name"), "either every tensor of a list has a name or none has",
         "name", 1),
    Case("mixed-unnamed-named", _del(*T0, "name"), "either every tensor", "name", 1, "b"),
    Case("duplicate-names", _set(*T1, "name", "w"), r"duplicate name \(also tensor 0\)", "name", 1, "w"),
    Case("duplicate-names-escaped", BASE_TEXT.replace('"name":"w"', '"name":"\\u00e9"')
         .replace('"name":"b"', '"name":"\u00e9"').encode(), r"duplicate name \(also tensor 0\)", "name", 1, "\u00e9"),
    Case("name-int", _set(*T0, "name", 5), "must be a string, got 5", "name", 0,
         v_match="5 is not of type 'string'"),
    Case("name-null", _set(*T1, "name", None), "must be a string, got None", "name", 1,
         v_match="None is not of type 'string'"),
    # tensor fields: presence and types
    Case("missing-dataType", _del(*T0, "dataType"), "missing required field", "dataType", 0, "w",
         v_match="'dataType' is a required property"),
    Case("missing-tensor-byteOffset", _del(*T1, "byteOffset"), "missing required field", "byteOffset", 1, "b",
         v_match="'byteOffset' is a required property"),
    Case("missing-tensor-byteLength", _del(*T1, "byteLength"), "missing required field", "byteLength", 1, "b",
         v_match="'byteLength' is a required property"),
    Case("dataType-string", _set(*T0, "dataType", "6"), "must be an integer, got '6'", "dataType", 0, "w",
         v_match="'6' is not one of"),
    Case("dataType-bool", _set(*T0, "dataType", True), "must be an integer, got True", "dataType", 0, "w",
         v_match="True is not one of"),
    Case("dataType-float", _set(*T0, "dataType", 6.0), "must be an integer, got 6.0", "dataType", 0, "w"),
    Case("tensor-byteOffset-bool", _set(*T1, "byteOffset", True), INT_ + ", got True", "byteOffset", 1, "b",
         v_match="True is not of type 'integer'"),
    Case("tensor-byteOffset-float", _set(*T1, "byteOffset", 16.5), INT_ + ", got 16.5", "byteOffset", 1, "b",
         v_match="16.5 is not (of type 'integer'|a multiple of 8)"),
    Case("tensor-byteLength-string", _set(*T1, "byteLength", "16"), INT_ + ", got '16'", "byteLength", 1, "b",
         v_match="'16' is not of type 'integer'"),
    Case("tensor-byteOffset-negative", _set(*T1, "byteOffset", -16), INT_ + ", got -16", "byteOffset", 1, "b",
         v_match="-16 is less than the minimum of 0"),
    Case("tensor-byteLength-negative", _set(*T1, "byteLength", -16), INT_ + ", got -16", "byteLength", 1, "b",
         v_match="-16 is less than the minimum of 0"),
    Case("tensor-byteOffset-2**63", _set(*T1, "byteOffset", 2**63), INT_, "byteOffset", 1, "b",
         v_match="is greater than the maximum"),
    Case("dims-string", _set(*T0, "dims", "2,2"), "must be an array of non-negative integers", "dims", 0, "w",
         v_match="is not of type 'array'"),
    Case("dims-null", _set(*T0, "dims", None), "must be an array of non-negative integers", "dims", 0, "w",
         v_match="None is not of type 'array'"),
    Case("dims-negative", _set(*T0, "dims", [-2, -2]), "must be an array of non-negative integers", "dims", 0, "w",
         v_match="-2 is less than the minimum of 0", v_field="dims/0"),
    Case("dims-float", _set(*T0, "dims", [2, 2.5]), "must be an array of non-negative integers", "dims", 0, "w",
         v_match="2.5 is not of type 'integer'", v_field="dims/1"),
    Case("dims-bool", _set(*T1, "dims", [True]), "must be an array of non-negative integers", "dims", 1, "b",
         v_match="True is not of type 'integer'", v_field="dims/0"),
    Case("crc32c-2**32", _set(*T1, "crc32c", 2**32), "must be an unsigned 32-bit integer", "crc32c", 1, "b",
         v_match="is greater than the maximum of 4294967295"),
    Case("crc32c-negative", _set(*T1, "crc32c", -1), "must be an unsigned 32-bit integer", "crc32c", 1, "b",
         v_match="-1 is less than the minimum of 0"),
    Case("crc32c-string", _set(*T1, "crc32c", "0x1"), "must be an unsigned 32-bit integer", "crc32c", 1, "b",
         v_match="is not of type 'integer'"),
    Case("crc32c-null", _set(*T1, "crc32c", None), "must be an unsigned 32-bit integer", "crc32c", 1, "b",
         v_match="None is not of type 'integer'"),
    # 7. element type
    Case("dtype-unknown", _set(*T0, "dataType", 99), "unknown dtype code 99", "dataType", 0, "w",
         v_match="99 is not one of"),
    Case("dtype-negative", _set(*T0, "dataType", -1), "unknown dtype code -1", "dataType", 0, "w",
         v_match="-1 is not one of"),
    Case("dtype-complex32", _all(_set(*T0, "dataType", 8), _set(*T0, "byteLength", 16)),
         r"dtype code 8 \(complex32 \(ComplexHalf\)\) has no numpy representation", "dataType", 0, "w",
         v_match="8 is not one of"),
    Case("dtype-quint4x2", _set(*T1, "dataType", 16), r"dtype code 16 \(quint4x2\) has no numpy", "dataType",
         1, "b", v_match="16 is not one of"),
    # 8. size
    Case("dims-times-itemsize", _set(*T0, "dims", [2, 3]),
         r"dims \[2, 3\] x 4 bytes \(float32\) = 24, but byteLength is 16", "byteLength", 0, "w"),
    Case("scalar-size", _del(*T1, "dims"), r"dims \[\] x 8 bytes \(float64\) = 8, but byteLength is 16",
         "byteLength", 1, "b"),
    Case("dims-product-huge", _set(*T0, "dims", [2**62, 2**62]), "but byteLength is 16", "byteLength", 0, "w"),
    # 9. tensor alignment
    Case("tensor-offset-not-8-aligned", _all(_set(*T1, "byteOffset", 20), _set("byteLength", 40)),
         "20 is not a multiple of 8", "byteOffset", 1, "b", v_match="20 is not a multiple of 8"),
    Case("tensor-offset-not-itemsize-aligned",
         _all(_set(*T0, "dims", [2]), _set(*T0, "dataType", 1), _set(*T0, "byteLength", 2),
              _set(*T1, "dims", [1]), _set(*T1, "dataType", 10), _set(*T1, "byteOffset", 8)),
         "8 is not a multiple of 8 and of the item size 16", "byteOffset", 1, "b"),
    # 10. bounds
    Case("tensor-past-list-end", _set("byteLength", 24), "tensor ends at 32, past the list's byteLength 24",
         "byteLength", 1, "b"),
    Case("tensor-64bit-overflow", _all(_set(*T1, "byteOffset", 2**63 - 8)),
         "byteOffset \\+ byteLength overflows 64 bits", "byteOffset", 1, "b"),
    # 11. overlap
    Case("overlap", _set(*T1, "byteOffset", 8), r"bytes \[8, 24\) overlap tensor 0 \('w'\) at \[0, 16\)",
         "byteOffset", 1, "b"),
    Case("overlap-unsorted",
         lambda d: d.update(byteLength=48, tensors=[
             {"name": "x", "dims": [4], "dataType": 6, "byteOffset": 32, "byteLength": 16},
             {"name": "y", "dims": [4], "dataType": 6, "byteOffset": 0, "byteLength": 16},
             {"name": "z", "dims": [2], "dataType": 7, "byteOffset": 8, "byteLength": 16}]),
         r"bytes \[8, 24\) overlap tensor 1 \('y'\) at \[0, 16\)", "byteOffset", 2, "z",
         data=bytes(48)),
    Case("overlap-identical", _all(_set(*T1, "byteOffset", 0), _set(*T1, "dims", [2]), _set(*T1, "dataType", 7)),
         r"overlap tensor 0 \('w'\)", "byteOffset", 1, "b"),
    # 12. location
    Case("location-empty", _set("location", ""), "must be a non-empty relative POSIX path", "location",
         v_match="'' (is too short|does not match)"),
    Case("location-nul", _set("location", "d\x00.data"), "without NUL", "location", v_match="does not match"),
    Case("location-absolute", _set("location", "/etc/passwd"), "absolute or non-POSIX path '/etc/passwd' refused",
         "location"),
    Case("location-backslash", _set("location", "sub\\d.data"), "absolute or non-POSIX path", "location"),
    Case("location-drive", _set("location", "C:/d.data"), "absolute or non-POSIX path", "location"),
    Case("location-dotdot", _set("location", "../d.data"), "'../d.data' escapes the descriptor's directory",
         "location"),
    Case("location-dotdot-inside", _set("location", "a/../../d.data"), "escapes the descriptor's directory",
         "location"),
    Case("location-dot", _set("location", "."), "escapes the descriptor's directory", "location"),
    # 13. data file
    Case("data-missing", lambda d: None, r"data file '.*d\.data' does not exist", "location", data=None),
    Case("data-too-short", lambda d: None, r"is 31 bytes but the list needs \[0, 32\)", "byteLength",
         data=DATA[:31]),
    Case("data-too-short-offset", _set("byteOffset", 4096), r"is 32 bytes but the list needs \[4096, 4128\)",
         "byteLength"),
    Case("data-is-directory", lambda d: None, "is not a regular file", "location", data=None,
         setup=lambda tmp: (tmp / "d.data").mkdir()),
    # JSON pointers
    Case("pointer-missing-key", _doc_lists(), "no key 'nope'", kwargs={"pointer": "/nope"}),
    Case("pointer-into-scalar", _doc_lists(), "'/epoch/x': '/epoch/x' goes into a scalar", kwargs={"pointer": "/epoch/x"}),
    Case("pointer-syntax", _doc_lists(), "must be empty or start with '/'", kwargs={"pointer": "lists/0"}),
    Case("pointer-leading-zero", _doc_lists(), "'01' is not an array index", kwargs={"pointer": "/lists/01"}),
    Case("pointer-dash", _doc_lists(), "'-' is not an array index", kwargs={"pointer": "/lists/-"}),
    Case("pointer-past-end", _doc_lists(), "index 2 past the array's end", kwargs={"pointer": "/lists/2"}),
    Case("pointer-bad-escape-target", _doc_lists(), "no key 'a/b'", kwargs={"pointer": "/a~1b"}),
]


def _write_case(tmp_path: Path, case: Case) -> Path:
    if isinstance(case.doc, bytes):
        text = case.doc
    else:
        d = copy.deepcopy(BASE)
        case.doc(d)
        text = _text(d).encode()
    path = tmp_path / "d.json"
    path.write_bytes(text)
    if case.data is not None:
        (tmp_path / "d.data").write_bytes(case.data)
    if case.setup is not None:
        case.setup(tmp_path)
    return path


def _check(e: tl.FormatError, path: Path, field, index, name):
    assert isinstance(e, ValueError) and type(e) is tl.FormatError
    assert e.file == str(path) and str(path) in str(e)
    assert (e.field, e.tensor_index, e.tensor_name) == (field, index, name)
    if index is not None:
        assert f"tensor {index}" in str(e)
    if field is not None:
        assert f"field {field!r}" in str(e)


ENTRIES = ["load", "load-nommap", "open", "validate"]


@pytest.mark.parametrize("case, entry", [pytest.param(c, e, id=f"{c.id}-{e}") for c in CASES for e in ENTRIES])
def test_malformed_file_raises_format_error(tmp_path, case, entry):
    path = _write_case(tmp_path, case)
    match, fld = case.match, case.field
    if entry == "validate":
        match = case.match if case.v_match is SAME else case.v_match
        fld = case.field if case.v_field is SAME else case.v_field
    with pytest.raises(tl.FormatError, match=match) as info:
        if entry == "load":
            tl.load(path, **case.kwargs)
        elif entry == "load-nommap":
            tl.load(path, mmap=False, **case.kwargs)
        elif entry == "open":
            tl.open(path, **case.kwargs)
        else:
            tl.validate(path, **case.kwargs)
    _check(info.value, path, fld, case.index, case.name)


def test_every_rule_has_a_case():
    """Each ``fail``/``FormatError`` site of the validator is exercised by some case above."""
    ids = {c.id for c in CASES}
    for needed in ["size-cap", "not-utf8", "duplicate-key", "nan", "1e999", "root-array",
                   "missing-location", "location-int", "byteOffset-bool", "byteOffset-float",
                   "byteOffset-negative", "list-offset-unaligned", "formatVersion-2", "tensors-object",
                   "too-many-tensors", "tensor-int", "mixed-named-unnamed", "duplicate-names",
                   "missing-dataType", "dtype-unknown", "dtype-complex32", "dims-times-itemsize",
                   "tensor-offset-not-8-aligned", "tensor-offset-not-itemsize-aligned",
                   "tensor-past-list-end", "overlap", "overlap-unsorted", "tensor-64bit-overflow",
                   "crc32c-2**32", "location-absolute", "location-dotdot", "location-empty",
                   "data-missing", "data-too-short", "data-is-directory", "pointer-missing-key",
                   "pointer-into-scalar", "pointer-syntax"]:
        assert needed in ids, needed


def test_the_base_case_is_valid(tmp_path):
    """The cases above differ from this file by one thing each."""
    path = _write_case(tmp_path, Case("base", lambda d: None, ""))
    out = tl.load(path)
    assert out["w"].tolist() == [[0, 1], [2, 3]] and out["b"].tolist() == [5, 6]
    assert len(tl.validate(path)) == 1
    assert tl.load(path, pointer="")["b"].tolist() == [5, 6]


@pytest.mark.parametrize("mmap", [True, False])
def test_data_file_truncated_at_every_length(tmp_path, mmap):
    path = _write_case(tmp_path, Case("base", lambda d: None, ""))
    data = tmp_path / "d.data"
    for n in range(len(DATA)):
        data.write_bytes(DATA[:n])
        expect = re.escape(f"is {n} bytes but the list needs [0, 32)")
        for call in (lambda: tl.load(path, mmap=mmap), lambda: tl.open(path, mmap=mmap),
                     lambda: tl.validate(path)):
            with pytest.raises(tl.FormatError, match=expect) as info:
                call()
            _check(info.value, path, "byteLength", None, None)
    data.write_bytes(DATA + b"extra bytes after the list are allowed")
    assert tl.load(path, mmap=mmap)["b"].tolist() == [5, 6]


def test_data_file_truncated_while_open_without_mmap(tmp_path):
    path = _write_case(tmp_path, Case("base", lambda d: None, ""))
    with tl.open(path, mmap=False) as r:
        os.truncate(tmp_path / "d.data", 20)
        assert r["w"].tolist() == [[0, 1], [2, 3]]  # still within the file
        with pytest.raises(tl.FormatError, match="was truncated while reading") as info:
            r["b"]
    assert (info.value.tensor_index, info.value.tensor_name) == (1, "b")


def test_document_with_several_lists_needs_a_pointer(tmp_path):
    path = tmp_path / "d.json"
    path.write_bytes(_doc_lists())
    (tmp_path / "d.data").write_bytes(DATA)
    for call in (lambda: tl.load(path), lambda: tl.open(path), lambda: tl.load(path, mmap=False)):
        with pytest.raises(tl.FormatError, match=r"embedding 2 of them at '/lists/0', '/lists/1': pass pointer=") \
                as info:
            call()
        assert info.value.file == str(path)
    # validate checks every embedded list instead, and finds both sound
    assert [d.pointer for d in tl.validate(path)] == ["/lists/0", "/lists/1"]
    assert tl.load(path, pointer="/lists/1")["w"].tolist() == [[0, 1], [2, 3]]


def test_errors_inside_embedded_lists_name_the_pointer(tmp_path):
    doc = json.loads(_doc_lists())
    doc["lists"][1]["tensors"][1]["byteOffset"] = 8
    path = tmp_path / "d.json"
    path.write_text(_text(doc))
    (tmp_path / "d.data").write_bytes(DATA)
    for call in (lambda: tl.load(path, pointer="/lists/1"), lambda: tl.validate(path)):
        with pytest.raises(tl.FormatError, match="overlap tensor 0") as info:
            call()
        assert (info.value.field, info.value.tensor_index) == ("/lists/1/byteOffset", 1)
    assert tl.load(path, pointer="/lists/0")["b"].tolist() == [5, 6]


def test_location_outside_is_allowed_on_request(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "outside.data").write_bytes(DATA)
    d = copy.deepcopy(BASE)
    d["location"] = "../outside.data"
    path = sub / "d.json"
    path.write_text(_text(d))
    with pytest.raises(tl.FormatError, match="escapes"):
        tl.load(path)
    assert tl.load(path, allow_outside=True)["b"].tolist() == [5, 6]
    assert tl.open(path, allow_outside=True, mmap=False)["w"].tolist() == [[0, 1], [2, 3]]
    assert len(tl.validate(path, allow_outside=True)) == 1


def test_absolute_location_is_allowed_on_request(tmp_path):
    sub = tmp_path / "sub"
    sub.mkdir()
    (tmp_path / "outside.data").write_bytes(DATA)
    d = copy.deepcopy(BASE)
    d["location"] = str(tmp_path / "outside.data")
    path = sub / "d.json"
    path.write_text(_text(d))
    with pytest.raises(tl.FormatError, match="absolute"):
        tl.load(path)
    assert tl.load(path, allow_outside=True)["b"].tolist() == [5, 6]


def test_format_error_pickles_with_its_attributes():
    e = tl.FormatError("bad", file="f.json", tensor_index=3, tensor_name="w", field="dims")
    e2 = pickle.loads(pickle.dumps(e))
    assert type(e2) is tl.FormatError and str(e2) == str(e) == "f.json: tensor 3 ('w'): field 'dims': bad"
    assert (e2.file, e2.tensor_index, e2.tensor_name, e2.field, e2.reason) == ("f.json", 3, "w", "dims", "bad")
    c = pickle.loads(pickle.dumps(tl.ChecksumError("x", file="a")))
    assert type(c) is tl.ChecksumError and c.file == "a"


@pytest.mark.parametrize("text, match", [
    ('{"a":1,"a":2}', "duplicate key 'a'"),
    ('{"a":{"b":1,"b":1}}', "duplicate key 'b'"),
    ("[NaN]", "NaN is not valid JSON"),
    ('{"a":Infinity}', "Infinity is not valid JSON"),
    ("[-Infinity]", "-Infinity is not valid JSON"),
    ("[1e999]", "out of the float64 range"),
    ("[-1e400]", "out of the float64 range"),
    ("[" + "1" * 5000 + "]", "invalid JSON"),
    ("[1,]", "invalid JSON"),
    ("{} {}", "invalid JSON: Extra data"),
    (b'{"a":"\xff"}', "not UTF-8"),
    ("[" * 50000 + "]" * 50000, "invalid JSON"),
])
def test_loads_strict_rules(text, match):
    with pytest.raises(tl.FormatError, match=match) as info:
        loads_strict(text, file="doc.json")
    assert info.value.file == "doc.json" and str(info.value).startswith("doc.json: ")


def test_loads_strict_accepts_what_json_allows():
    assert loads_strict('{"a":[1,2.5,-0.0,1e308,null,true,"\\u00e9"]} \n\t') == \
        {"a": [1, 2.5, -0.0, 1e308, None, True, "é"]}
    assert loads_strict(b'"\xc3\xa9"') == "é"


# --- parity: schema, fast validator, C core and constants ----------------------------------


def _lst(**kw):
    d = {"location": "d.data", "byteOffset": 0, "byteLength": 64}
    d.update(kw)
    return d


def _t(**kw):
    t = {"dims": [2], "dataType": 6, "byteOffset": 0, "byteLength": 8}
    t.update(kw)
    return t


GOOD = [
    ("lamp-minimal", {"location": "x.lamp.data", "byteOffset": 0, "byteLength": 0}),
    ("lamp-scalar-no-dims", _lst(tensors=[{"dataType": 4, "byteOffset": 0, "byteLength": 8}])),
    ("named-with-crc", _lst(formatVersion=1, tensors=[_t(name="a", crc32c=0), _t(name="b", byteOffset=8,
                                                                                     crc32c=2**32 - 1)])),
    ("trailing-empty", _lst(byteLength=8, tensors=[_t(), _t(dims=[0], byteOffset=8, byteLength=0)])),
    ("metadata-anything", _lst(metadata=[1, {"a": None}, "x", 2.5])),
    ("unknown-keys", _lst(type="X", extra={"tensors": 5}, tensors=[_t(unit="m")])),
    ("list-offset-4096", _lst(byteOffset=8192)),
    ("max-offset", _lst(byteOffset=2**63 - 4096, byteLength=0)),
    ("subdir-location", _lst(location="sub/dir/d.data")),
    *[(f"dtype-{d.name}", _lst(tensors=[_t(dataType=d.code, dims=[3], byteLength=3 * d.itemsize)]))
      for d in dtypes.DTYPES],
]

BAD = [
    ("missing-location", {"byteOffset": 0, "byteLength": 0}),
    ("missing-byteOffset", {"location": "d", "byteLength": 0}),
    ("missing-byteLength", {"location": "d", "byteOffset": 0}),
    ("root-array", [1]),
    ("root-null", None),
    ("location-int", _lst(location=3)),
    ("location-empty", _lst(location="")),
    ("location-nul", _lst(location="a\x00b")),
    ("byteOffset-bool", _lst(byteOffset=True)),
    ("byteOffset-string", _lst(byteOffset="0")),
    ("byteOffset-null", _lst(byteOffset=None)),
    ("byteOffset-negative", _lst(byteOffset=-4096)),
    ("byteOffset-unaligned", _lst(byteOffset=4095)),
    ("byteOffset-too-big", _lst(byteOffset=2**63)),
    ("byteLength-fraction", _lst(byteLength=1.5)),
    ("byteLength-too-big", _lst(byteLength=2**63)),
    ("formatVersion-0", _lst(formatVersion=0)),
    ("formatVersion-2", _lst(formatVersion=2)),
    ("formatVersion-3", _lst(formatVersion=3)),
    ("formatVersion-string", _lst(formatVersion="1")),
    ("formatVersion-bool", _lst(formatVersion=True)),
    ("formatVersion-null", _lst(formatVersion=None)),
    ("tensors-object", _lst(tensors={})),
    ("tensors-null", _lst(tensors=None)),
    ("tensor-int", _lst(tensors=[1])),
    ("tensor-null", _lst(tensors=[None])),
    ("tensor-missing-dataType", _lst(tensors=[{"byteOffset": 0, "byteLength": 0}])),
    ("tensor-missing-byteOffset", _lst(tensors=[{"dataType": 6, "byteLength": 0}])),
    ("tensor-missing-byteLength", _lst(tensors=[{"dataType": 6, "byteOffset": 0}])),
    ("name-int", _lst(tensors=[_t(name=1)])),
    ("name-bool", _lst(tensors=[_t(name=False)])),
    ("name-null", _lst(tensors=[_t(name=None)])),
    ("dims-string", _lst(tensors=[_t(dims="2")])),
    ("dims-null", _lst(tensors=[_t(dims=None)])),
    ("dims-negative", _lst(tensors=[_t(dims=[-2])])),
    ("dims-fraction", _lst(tensors=[_t(dims=[2.5])])),
    ("dims-bool", _lst(tensors=[_t(dims=[True, 2], byteLength=8)])),
    ("dataType-string", _lst(tensors=[_t(dataType="6")])),
    ("dataType-bool", _lst(tensors=[_t(dataType=True, byteLength=2, dims=[2])])),
    ("dataType-null", _lst(tensors=[_t(dataType=None)])),
    ("dataType-8", _lst(tensors=[_t(dataType=8)])),
    ("dataType-12", _lst(tensors=[_t(dataType=12, byteLength=2)])),
    ("dataType-99", _lst(tensors=[_t(dataType=99)])),
    ("dataType-negative", _lst(tensors=[_t(dataType=-1)])),
    ("tensor-offset-4", _lst(tensors=[_t(byteOffset=4)])),
    ("tensor-offset-negative", _lst(tensors=[_t(byteOffset=-8)])),
    ("tensor-offset-bool", _lst(tensors=[_t(byteOffset=False)])),
    ("tensor-offset-null", _lst(tensors=[_t(byteOffset=None)])),
    ("tensor-length-negative", _lst(tensors=[_t(byteLength=-8)])),
    ("tensor-length-string", _lst(tensors=[_t(byteLength="8")])),
    ("crc-negative", _lst(tensors=[_t(crc32c=-1)])),
    ("crc-too-big", _lst(tensors=[_t(crc32c=2**32)])),
    ("crc-string", _lst(tensors=[_t(crc32c="0")])),
    ("crc-bool", _lst(tensors=[_t(crc32c=True)])),
    ("crc-null", _lst(tensors=[_t(crc32c=None)])),
]


def _parse_ok(obj) -> bool:
    try:
        fmt.parse_list(obj)
    except tl.FormatError:
        return False
    return True


@pytest.mark.parametrize("name, obj", GOOD, ids=[g[0] for g in GOOD])
def test_parity_good(name, obj):
    assert schema_validator().is_valid(obj)
    assert _parse_ok(obj)
    assert len(tl.validate(obj)) == 1


@pytest.mark.parametrize("name, obj", BAD, ids=[b[0] for b in BAD])
def test_parity_bad(name, obj):
    assert not schema_validator().is_valid(obj)
    assert not _parse_ok(obj)
    if isinstance(obj, (dict, list)):
        with pytest.raises(tl.FormatError, match="schema: |embeds none"):
            tl.validate(obj)


def test_parity_documented_differences():
    """What the schema cannot say: JSON Schema counts 1.0 as an integer; semantic rules are the validator's."""
    for obj in (_lst(byteLength=64.0), _lst(tensors=[_t(dataType=6.0)]), _lst(location="/abs"),
                _lst(location="../up"), _lst(tensors=[_t(byteLength=12)]),
                _lst(tensors=[_t(name="a"), _t(name="a", byteOffset=8)]),
                _lst(tensors=[_t(), _t(byteOffset=0)]), _lst(byteLength=4, tensors=[_t()]),
                _lst(tensors=[_t(dataType=10, dims=[1], byteLength=16, byteOffset=8)])):
        assert schema_validator().is_valid(obj)
        assert not _parse_ok(obj)
        with pytest.raises(tl.FormatError):
            tl.validate(obj)


@pytest.mark.parametrize("schema_file", sorted(p.name for p in (ROOT / "schemas").glob("*.json")))
def test_check_schema(schema_file):
    schema = json.loads((ROOT / "schemas" / schema_file).read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert load_schema(schema_file) == schema  # the installed copy is the repository's


def test_schema_dtype_enum_equals_the_dtype_table():
    tensor = load_schema()["$defs"]["tensor"]["properties"]["dataType"]
    assert tensor["enum"] == [d.code for d in dtypes.DTYPES]
    described = dict((int(c), n) for c, n in re.findall(r"(\d+) (\w+)", tensor["description"]))
    assert described == {d.code: d.name for d in dtypes.DTYPES}
    assert not set(dtypes.UNSUPPORTED_CODES) & {d.code for d in dtypes.DTYPES}


def test_schema_numbers_equal_the_format_constants():
    s = load_schema()
    props, tprops = s["properties"], s["$defs"]["tensor"]["properties"]
    assert props["byteOffset"]["multipleOf"] == fmt.LIST_ALIGNMENT
    assert tprops["byteOffset"]["multipleOf"] == fmt.MIN_TENSOR_ALIGNMENT
    for p in (props["byteOffset"], props["byteLength"], tprops["byteOffset"], tprops["byteLength"],
              tprops["dims"]["items"]):
        assert p["maximum"] == fmt.MAX_INT and p["minimum"] == 0
    assert tprops["crc32c"]["maximum"] == 2**32 - 1
    assert props["formatVersion"]["maximum"] == fmt.ENCRYPTED_VERSION
    enc = s["$defs"]["encryption"]["properties"]
    assert (enc["chunkBytes"]["minimum"], enc["chunkBytes"]["maximum"]) == (spec.MIN_CHUNK, spec.MAX_CHUNK)
    assert enc["scheme"]["const"] == spec.SCHEME
    for name, (lo, hi) in spec.KDF_LIMITS.items():
        assert (enc["kdf"]["properties"][name]["minimum"], enc["kdf"]["properties"][name]["maximum"]) == (lo, hi)
    assert f"/{fmt.FORMAT_VERSION}/" in s["$id"]
    assert set(s["required"]) == {"location", "byteOffset", "byteLength"}
    assert set(s["$defs"]["tensor"]["required"]) == {"dataType", "byteOffset", "byteLength"}


def _defines(text):
    return {k: int(v) for k, v in re.findall(r"^#define\s+(TL_\w+)\s+(-?\d+)", text, re.M)}


def _strip_comments(text):
    return re.sub(r"/\*.*?\*/", "", text, flags=re.S)


def _prototypes(text):
    text = _strip_comments(text)
    return {name: " ".join(sig.split()) for sig, name in
            re.findall(r"^((?:const\s+)?\w+\s*\**\s*(tl_\w+)\s*\([^;]*\))\s*;", text, re.M)}


def _structs(text):
    return {name: " ".join(body.split()) for body, name in
            re.findall(r"typedef struct \{(.*?)\}\s*(\w+);", _strip_comments(text), re.S)}


def test_c_constants_agree_with_python_and_the_header():
    header = (ROOT / "csrc" / "tensorlist.h").read_text()
    defines = _defines(header)
    assert defines["TL_LIST_ALIGNMENT"] == fmt.LIST_ALIGNMENT == lowlevel.LIST_ALIGNMENT == tl.LIST_ALIGNMENT == 4096
    assert defines["TL_MIN_TENSOR_ALIGNMENT"] == fmt.MIN_TENSOR_ALIGNMENT == lowlevel.MIN_TENSOR_ALIGNMENT \
        == tl.MIN_TENSOR_ALIGNMENT == 8
    for name, value in defines.items():
        assert getattr(lib, name) == value, name  # the compiled core agrees with its header
    la = lowlevel.ffi.new("int64_t *")
    ma = lowlevel.ffi.new("int64_t *")
    assert lib.tl_constants(la, ma) == 0 and (la[0], ma[0]) == (4096, 8)
    assert fmt.DEFAULT_ALIGNMENT % fmt.MIN_TENSOR_ALIGNMENT == 0 and fmt.MAX_INT == 2**63 - 1


def test_cdef_declares_what_the_header_declares():
    header = (ROOT / "csrc" / "tensorlist.h").read_text()
    cdef = (ROOT / "csrc" / "tensorlist_cdef.h").read_text()
    assert _defines(cdef) == _defines(header)
    assert _prototypes(cdef) == _prototypes(header)
    assert len(_prototypes(header)) >= 14
    assert _structs(cdef) == _structs(header) and set(_structs(header)) >= {"tl_span", "tl_write_item"}
    assert lowlevel.ffi.sizeof("tl_span") == lowlevel.SPAN_DTYPE.itemsize
