"""Every JSON value a reader takes from a file is untrusted: any value, of any type, at any place.

One class of test for two classes of defect: a value of the wrong type used as a
lookup key (an unhashable list or dict reaching ``in`` or ``[]``: ``TypeError: unhashable type``),
and a text converted to an integer without bound (``int()`` of 5,000 digits: Python's
``ValueError: Exceeds the limit (4300 digits)``). Each file kind below is written valid, then every
value in its JSON is replaced, one at a time, by each hostile value, and every reader of that kind
must either read it or raise the project's own error (a :class:`tensorlist.TensorListError`), never
a stray TypeError, KeyError, IndexError or ValueError.
"""
import json
import zipfile

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._base.jsonio import set_at_pointer
from tensorlist._base.jsonio import MAX_INDEX_DIGITS, array_index, walk
from tensorlist.convert import NPZ_SIDECAR, open_source

HOSTILE = {
    "list": [[1]],
    "dict": {"k": [1]},
    "empty-dict": {},
    "long-digits": "1" * 5000,
    "superscript-digit": "\u00b2",
    "true": True,
    "null": None,
    "negative": -1,
    "float": 1.5,
    "huge": 2 ** 70,
}


def _mutations(doc):
    """(pointer, hostile name, mutated document) for every value of ``doc`` and every hostile value."""
    for ptr, _ in walk(doc):
        if ptr == "":
            continue
        for name, value in HOSTILE.items():
            copy = json.loads(json.dumps(doc))
            set_at_pointer(copy, ptr, value)
            yield ptr, name, copy


def _assert_own_error_or_success(read, where):
    try:
        read()
    except tl.TensorListError:
        pass
    except Exception as e:  # noqa: BLE001 - the point: nothing but the project's errors may escape
        pytest.fail(f"{where}: {type(e).__name__}: {e}")


def _descriptor_file(tmp_path):
    tl.save(tmp_path / "m.tl", {"w": np.arange(6, dtype=np.float32).reshape(2, 3),
                                "b": np.zeros(2, dtype=np.int16)},
            metadata={"epoch": 1, "tags": ["a"]})
    return json.loads((tmp_path / "m.tl").read_text())


DESCRIPTOR_READERS = {
    "load": lambda p: tl.load(p),
    "load-copy": lambda p: tl.load(p, mmap=False),
    "open": lambda p: tl.open(p).close(),
    "validate": lambda p: tl.validate(p),
    "load_document": lambda p: tl.load_document(p),
    "convert-source": lambda p: open_source(p).close(),
}


@pytest.mark.parametrize("reader", sorted(DESCRIPTOR_READERS))
def test_any_value_anywhere_in_a_descriptor_is_read_or_a_format_error(tmp_path, reader):
    doc = _descriptor_file(tmp_path)
    path = tmp_path / "bad.tl"
    count = 0
    for ptr, name, bad in _mutations(doc):
        path.write_text(json.dumps(bad))
        _assert_own_error_or_success(lambda: DESCRIPTOR_READERS[reader](str(path)), f"{ptr} := {name}")
        count += 1
    assert count > 100


def test_any_value_anywhere_in_an_embedding_document_is_read_or_a_format_error(tmp_path):
    tl.save_document(tmp_path / "d.json", {"epoch": 3, "runs": [{"model": tl.Tensors({"w": np.ones(3)})}]})
    doc = json.loads((tmp_path / "d.json").read_text())
    path = tmp_path / "bad.json"
    for ptr, name, bad in _mutations(doc):
        path.write_text(json.dumps(bad))
        for read in (lambda: tl.load_document(str(path)), lambda: tl.load(str(path), pointer="/runs/0/model"),
                     lambda: tl.validate(str(path))):
            _assert_own_error_or_success(read, f"{ptr} := {name}")


def _npz(path, side):
    with zipfile.ZipFile(path, "w") as z:
        for name, a in {"w": np.ones(2, np.uint16), "v": np.ones(3, np.float32)}.items():
            with z.open(name + ".npy", "w") as f:
                np.lib.format.write_array(f, a)
        with z.open(NPZ_SIDECAR + ".npy", "w") as f:
            np.lib.format.write_array(f, np.array(json.dumps(side)))


def test_any_value_anywhere_in_an_npz_side_entry_is_read_or_a_format_error(tmp_path):
    side = {"named": True, "dtypes": {"w": "bfloat16"}, "metadata": {"epoch": 1}}
    path = tmp_path / "bad.npz"
    for ptr, name, bad in _mutations(side):
        _npz(path, bad)
        _assert_own_error_or_success(lambda: open_source(str(path)).close(), f"{ptr} := {name}")


def test_the_issue_s_npz_sample_names_file_and_entry(tmp_path):
    _npz(tmp_path / "a.npz", {"dtypes": {"w": ["bfloat16"]}})
    with pytest.raises(tl.FormatError, match=r"a\.npz.*__tensorlist__/dtypes/w.*is not a dtype stored"):
        open_source(str(tmp_path / "a.npz"))


@pytest.mark.parametrize("pointer", ["/runs/" + "1" * 5000, "/runs/" + "9" * 20, "/runs/0/model/" + "0" * 3])
def test_a_pointer_index_of_any_length_is_a_format_error(tmp_path, pointer):
    tl.save_document(tmp_path / "d.json", {"runs": [{"model": tl.Tensors({"w": np.ones(3)})}]})
    with pytest.raises(tl.FormatError, match="JSON pointer"):
        tl.load(str(tmp_path / "d.json"), pointer=pointer)


@pytest.mark.parametrize("token, expected", [
    ("0", 0), ("7", 7), ("12", 12), ("9" * MAX_INDEX_DIGITS, int("9" * MAX_INDEX_DIGITS)),
    ("01", None), ("", None), ("-1", None), ("+1", None), (" 1", None), ("1 ", None), ("\u00b2", None),
    ("\u0661", None), ("1e3", None), ("1_000", None), (["1"], None), (1, None), (None, None),
])
def test_array_index_is_rfc6901_and_never_converts_unbounded_text(token, expected):
    assert array_index(token) == expected


def test_array_index_of_more_digits_than_any_array_is_past_every_end():
    past = 10 ** MAX_INDEX_DIGITS
    assert past > 2 ** 59  # no array in memory has this many items
    assert array_index("1" * 5000) == past
    assert array_index("1" * (MAX_INDEX_DIGITS + 1)) == past


def _safetensors_with_header(path, header, data_bytes):
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(data_bytes))


def test_any_value_anywhere_in_a_safetensors_header_is_read_or_a_format_error(tmp_path):
    header = {"__metadata__": {"format": "pt"}, "w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]},
              "b": {"dtype": "BF16", "shape": [4], "data_offsets": [24, 32]}}
    path = tmp_path / "bad.safetensors"
    _safetensors_with_header(path, header, 32)
    open_source(str(path)).close()  # the unmutated file reads
    for ptr, name, bad in _mutations(header):
        _safetensors_with_header(path, bad, 32)
        _assert_own_error_or_success(lambda: open_source(str(path)).close(), f"{ptr} := {name}")


def test_any_value_anywhere_in_a_hugging_face_index_is_read_or_a_format_error(tmp_path):
    _safetensors_with_header(tmp_path / "model-00001-of-00001.safetensors",
                             {"w": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8)
    index = {"metadata": {"total_size": 8}, "weight_map": {"w": "model-00001-of-00001.safetensors"}}
    path = tmp_path / "model.safetensors.index.json"
    path.write_text(json.dumps(index))
    open_source(str(path)).close()
    for ptr, name, bad in _mutations(index):
        path.write_text(json.dumps(bad))
        _assert_own_error_or_success(lambda: open_source(str(path)).close(), f"{ptr} := {name}")


def test_any_value_anywhere_in_a_training_record_is_read_or_a_format_error(tmp_path):
    from _record_support import full_record
    from tensorlist.provenance.record import read_training_record, validate_training_record

    record = full_record()
    validate_training_record(record)
    path = tmp_path / "m.tl"
    for ptr, name, bad in _mutations(record):
        tl.save(path, {"w": np.ones(2, np.float32)}, metadata={"training": bad})
        _assert_own_error_or_success(lambda: read_training_record(str(path)), f"{ptr} := {name}")


MODEL_FILE_READERS = {
    "verify_model_file": lambda p: __import__("tensorlist.provenance.record", fromlist=["x"]).verify_model_file(p),
    "lineage": lambda p: __import__("tensorlist.provenance.lineage", fromlist=["x"]).lineage(p),
    "cyclonedx_bom": lambda p: __import__("tensorlist.provenance.exports", fromlist=["x"]).cyclonedx_bom(p),
    "model_card": lambda p: __import__("tensorlist.provenance.exports", fromlist=["x"]).model_card(p),
}


@pytest.mark.parametrize("reader", sorted(MODEL_FILE_READERS))
def test_any_value_anywhere_in_a_model_file_s_records_is_read_or_a_format_error(tmp_path, reader):
    """The training and data records of a model file whose weights match, through every reader of model files."""
    from _record_support import full_record
    from tensorlist.provenance.record import weights_sha256

    weights = {"w": np.ones(2, np.float32)}
    record = full_record()
    record["weights"]["sha256"] = weights_sha256(weights)
    meta = {"training": record, "dataset_params": {"name": "d", "files": ["a", "b"], "size": {"n": 2}}}
    path = tmp_path / "m.tl"
    for ptr, name, bad in _mutations(meta):
        tl.save(path, weights, metadata=bad)
        _assert_own_error_or_success(lambda: MODEL_FILE_READERS[reader](str(path)), f"{ptr} := {name}")
