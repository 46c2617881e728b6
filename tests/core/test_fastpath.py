"""The C descriptor fast path must agree exactly with the exact Python validator.

The fast path (csrc/descriptor.c) accepts or declines; when it declines, the
Python path decides and explains. So the only way it can be wrong is to accept
something differently, which these tests hunt for.
"""
import json
import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorlist as tl
from tensorlist import format as F


def _outcome(path, fast):
    try:
        doc = F.read_json_file(path, fast=fast)
        obj, ptr = F.select_list(doc, None, str(path))
        d = F.parse_list(obj, file=str(path), pointer=ptr)
    except tl.FormatError as e:
        return ("error", str(e))
    t = d.tensors
    return ("ok", t.names, [x.code for x in t.dtypes], t.shapes, t.offsets, t.lengths, t.crcs, d.metadata,
            d.location, d.byte_offset, d.byte_length, d.version)


@pytest.mark.parametrize("kind", ["named", "positional", "lamp", "scalars", "empty", "escaped-names"])
def test_files_we_write_take_the_fast_path(tmp_path, kind, monkeypatch):
    path = tmp_path / "f.tl"
    tensors = {
        "named": {"a": np.zeros((2, 3), np.float32), "b": np.arange(5)},
        "positional": [np.zeros((2, 3), np.float32), np.arange(5)],
        "lamp": [np.zeros((2, 3), np.float32), np.int64(3)],
        "scalars": [np.float32(1), np.int8(2)],
        "empty": [],
        "escaped-names": {'q"uote': np.zeros(1), "tab\t": np.ones(2), "é": np.ones(1)},
    }[kind]
    tl.save(path, tensors, lamp=kind == "lamp")
    doc = F.read_json_file(path, fast=True)
    assert isinstance(doc["tensors"], F.TensorSpan)
    exact = _outcome(path, False)

    def declined(span, file=None):
        raise AssertionError("the C fast path declined a file tensorlist wrote")

    # parse_list falls back to the exact parser through TensorSpan.materialize only when C declines
    monkeypatch.setattr(F.TensorSpan, "materialize", declined)
    assert _outcome(path, True) == exact


# --- differential fuzzing ------------------------------------------------------

def _tensor(i, name):
    t = {"dims": [2, i % 3 + 1], "dataType": 6, "byteOffset": 64 * i, "byteLength": 8 * (i % 3 + 1)}
    if name:
        t["name"] = f"t{i}"
    return t


VALUES = st.one_of(st.none(), st.booleans(), st.integers(-3, 2**64), st.floats(allow_nan=False, allow_infinity=False),
                   st.text(max_size=4), st.lists(st.integers(-1, 5), max_size=3), st.just({"x": [1, {"y": 2}]}))
KEYS = st.sampled_from(["name", "dims", "dataType", "byteOffset", "byteLength", "crc32c", "extra", "dim"])


@st.composite
def descriptors(draw):
    n = draw(st.integers(0, 5))
    named = draw(st.booleans())
    tensors = [_tensor(i, named) for i in range(n)]
    for _ in range(draw(st.integers(0, 3))):  # mutations
        if not tensors:
            break
        t = draw(st.sampled_from(tensors))
        op = draw(st.sampled_from(["set", "del", "dup-name"]))
        key = draw(KEYS)
        if op == "set":
            t[key] = draw(VALUES)
        elif op == "del":
            t.pop(key, None)
        elif named:
            t["name"] = tensors[0].get("name")
    doc = {"tensors": tensors, "location": "d.data", "byteOffset": 0, "byteLength": 64 * max(n, 1)}
    if draw(st.booleans()):
        doc["formatVersion"] = draw(st.sampled_from([1, 2, None, "1"]))
    if draw(st.booleans()):
        doc["metadata"] = draw(VALUES)
    if draw(st.booleans()):
        doc = {"wrapper": [doc, {"tensors": [1, 2]}]}
    return doc


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(doc=descriptors(), indent=st.sampled_from([None, 0, 2]), escape=st.booleans())
def test_fast_and_exact_paths_agree(tmp_path, doc, indent, escape):
    path = tmp_path / "d.json"
    path.write_text(json.dumps(doc, indent=indent, ensure_ascii=escape))
    (tmp_path / "d.data").write_bytes(bytes(1024))
    assert _outcome(path, True) == _outcome(path, False)


@pytest.mark.parametrize("text", [
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[1],"name":"a","name":"b"}],'
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # duplicate key in a tensor
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[1],"n\\u0061me":"a","name":"b"}],'
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # the same key, escaped
    '{"tensors":[{"dataType":6,"byteOffset":-0,"byteLength":4,"dims":[1]}],'
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # -0 is 0 in JSON
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[1.0]}],'
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # 1.0 is not an integer
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[1],"x":1e999}],'
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # overflowing number
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[1],"x":NaN}],'
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # NaN token
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[' + "9" * 30 + "]}],"
    '"location":"d.data","byteOffset":0,"byteLength":8}',                         # huge dimension
    '{"tensors":[{"dataType":6,"byteOffset":0,"byteLength":4,"dims":[1],"name":"\\u0000tl0"}],'
    '"location":"d.data","byteOffset":0,"byteLength":8,"metadata":{"tensors":"\\u0000tl0"}}',  # our marker
    '{"tensors":[], "location":"d.data","byteOffset":0,"byteLength":8} x',       # trailing garbage
])
def test_tricky_texts_agree(tmp_path, text):
    path = tmp_path / "d.json"
    path.write_text(text)
    (tmp_path / "d.data").write_bytes(bytes(8))
    assert _outcome(path, True) == _outcome(path, False)


def test_embedded_lists_take_the_fast_path_and_keep_the_rest_of_the_document(tmp_path):
    path = tmp_path / "doc.json"
    tl.save_document(path, {"meta": {"tensors": [1, 2], "note": "not a list"},
                            "model": tl.Tensors({"w": np.ones(3)}), "opt": [tl.Tensors([np.zeros(2)])]})
    doc = F.read_json_file(path, fast=True)
    assert isinstance(doc["model"]["tensors"], F.TensorSpan)
    assert isinstance(doc["opt"][0]["tensors"], F.TensorSpan)
    assert doc["meta"] == {"tensors": [1, 2], "note": "not a list"}
    assert tl.load(path, pointer="/opt/0")["0"].tolist() == [0.0, 0.0]
    assert os.path.exists(path)
