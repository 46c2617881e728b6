"""The seed's functions: history, is_training_record, read_training_record, read_dataset_params.

Numpy only (the s390x leg runs it without torch); loader_settings, spec and the torch scalars of history are
tested in test_record_functions_torch.
"""
from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from _record_support import full_record
from tensorlist.errors import FormatError
from tensorlist.provenance.record import (
    FORMAT,
    TrainingRecord,
    history,
    is_training_record,
    read_dataset_params,
    read_training_record,
    spec,
)


# --- history -------------------------------------------------------------------

def test_history_cuts_to_done_and_nulls_non_finite():
    """The first `done` values as floats; NaN and +/-Inf become None."""
    assert history([1, 2.5, math.nan, math.inf, -math.inf, 7.0], 5) == [1.0, 2.5, None, None, None]
    assert history([0.5, 0.25], 0) == []
    assert json.dumps(history([math.nan], 1), allow_nan=False) == "[null]"


def test_history_of_preallocated_arrays_has_no_placeholders():
    """A run stopped after 3 of 10 preallocated epochs keeps 3 values, not 10."""
    losses = np.zeros(10)
    losses[:3] = [0.9, np.nan, 0.5]
    assert history(losses, 3) == [0.9, None, 0.5]


def test_history_accepts_numpy_scalars_and_nested_lists():
    """numpy scalars, None, and per-group lists (torch's and ml_dtypes' scalars: test_record_functions_torch)."""
    values = [np.float32(0.5), None, [0.1, np.float64("nan")], np.int64(3)]
    assert history(values, 4) == [0.5, None, [0.1, None], 3.0]


@pytest.mark.parametrize("values, done, error, message", [
    ([1.0], 2, ValueError, "2 epochs done but only 1 values"),
    ([1.0], -1, ValueError, "must be >= 0"),
    ([1.0], 1.0, TypeError, "done must be an integer"),
    ([1.0], True, TypeError, "done must be an integer"),
    (["x"], 1, TypeError, r"history\[0\]: expected a number"),
    ([True], 1, TypeError, "expected a number"),
    (np.float64(1.0), 1, TypeError, "0-d array"),
])
def test_history_rejects_bad_input(values, done, error, message):
    """Bad input is an error that says what is wrong."""
    with pytest.raises(error, match=message):
        history(values, done)


# --- is_training_record ----------------------------------------------------------

@pytest.mark.parametrize("value, expected", [
    (full_record(), True),
    (TrainingRecord(full_record()), True),
    ({"format": FORMAT}, True),
    ({"format": "tensorlist.training-record/7"}, True),
    ({"format": "tensorlist.training-record/"}, False),
    ({"format": "other"}, False),
    ({"training": full_record()}, False),
    ({}, False),
    ([full_record()], False),
    ("tensorlist.training-record/1", False),
    (None, False),
])
def test_is_training_record(value, expected):
    """A record is recognised by its version marker, as a dict or a TrainingRecord."""
    assert is_training_record(value) is expected


def test_module_imports_without_torch():
    """tensorlist.provenance.record never imports torch by itself."""
    code = ("import sys, tensorlist.provenance.record as r, numpy as np; "
            "r.weights_sha256({'a': np.zeros(2)}); r.history([1.0], 1); "
            "r.validate_training_record; assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- read_training_record ----------------------------------------------------------

def test_read_training_record_from_every_form(tmp_path):
    """A record, a dict holding one, a model-file descriptor, and JSON files of each."""
    record = full_record()
    holders = {
        "bare": record,
        "holder": {"training": record, "dataset_params": {"name": "x"}},
        "descriptor": {"tensors": [], "location": "x.data", "byteOffset": 0, "byteLength": 0,
                       "metadata": {"training": record, "dataset_params": {}}},
    }
    for name, value in holders.items():
        got = read_training_record(value)
        assert got == record and isinstance(got, TrainingRecord) and got is not record
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(value, allow_nan=False))
        assert read_training_record(path) == record
        assert read_training_record(str(path)) == record
    assert read_training_record(TrainingRecord(record)) == record
    assert read_training_record(json.dumps(record).encode()) == record


def test_record_reads_by_attribute():
    """record.epochs.done, record.weights.kind ...; the specs stay dicts."""
    record = read_training_record(full_record())
    assert record.epochs.done == 3 and record.weights.kind == "best_validation"
    assert record.initial_weights.origin.weights_sha256 == full_record()["initial_weights"]["origin"]["weights_sha256"]
    assert isinstance(record.optimizer, dict) and record.optimizer["class"] == "torch.optim.adam.Adam"
    assert record.history.training_loss == [1.0, 0.5, 0.4]
    with pytest.raises(AttributeError, match="no field 'nope'"):
        record.nope
    assert json.loads(record.to_json()) == full_record()


@pytest.mark.parametrize("content, message", [
    (b"\x00\x01\xff binary", "not a JSON file: not UTF-8"),
    (b"epochs: 3", "not a JSON file: Expecting value at line 1 column 1"),
    (b'{"format": NaN}', "NaN is not valid JSON"),
    (b'{"a": 1, "a": 2}', "duplicate key 'a'"),
    (b"[1, 2]", "holds a JSON list"),
    (b'{"name": "just data"}', "no training record"),
])
def test_read_training_record_rejects_bad_files_naming_them(tmp_path, content, message):
    """Non-JSON, non-strict JSON, or JSON without a record: a clear FormatError with the file."""
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    with pytest.raises(FormatError, match=re.escape(message)) as info:
        read_training_record(path)
    assert info.value.file == str(path)


def test_read_training_record_names_the_field_inside_a_model_file(tmp_path):
    """A broken record inside a model file is reported at its full path."""
    record = full_record()
    del record["epochs"]["done"]
    path = tmp_path / "m.json"
    path.write_text(json.dumps({"tensors": [], "location": "m.data", "byteOffset": 0, "byteLength": 0,
                                "metadata": {"training": record}}))
    with pytest.raises(FormatError, match=r"field 'metadata.training.epochs.done': missing required field"):
        read_training_record(path)
    with pytest.raises(FormatError, match=r"field 'training': expected a JSON object"):
        read_training_record({"training": [1]})


def test_read_training_record_type_errors():
    """Unsupported source types are TypeErrors, not format errors."""
    with pytest.raises(TypeError, match="expected a record, a dict or a path"):
        read_training_record(3.5)


def test_read_dataset_params_from_every_form(tmp_path):
    """The data record of a model file, of its metadata, or a bare one."""
    data = {"name": "LIDC", "content_hash": {"method": "file_sha256", "sha256": "b" * 64}}
    assert read_dataset_params({"metadata": {"dataset_params": data}}) == data
    assert read_dataset_params({"dataset_params": data, "training": {}}) == data
    assert read_dataset_params(data) == data
    path = tmp_path / "d.json"
    path.write_text(json.dumps({"metadata": {"dataset_params": dict(data, content_hash={"method": "x"})}}))
    with pytest.raises(FormatError, match=r"field 'metadata.dataset_params.content_hash.sha256': missing"):
        read_dataset_params(path)


# --- files and nesting, through the package's shared rules ----------------------------

@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")
def test_read_training_record_refuses_special_files_without_blocking(tmp_path):
    """A FIFO (which a plain open would wait on forever) or a directory is not a record file."""
    os.mkfifo(tmp_path / "pipe.json")
    with pytest.raises(FormatError, match="not a regular file: it is a FIFO") as info:
        read_training_record(tmp_path / "pipe.json")
    assert info.value.file == str(tmp_path / "pipe.json")
    with pytest.raises(FormatError, match="not a regular file: it is a directory"):
        read_dataset_params(tmp_path)


def test_read_training_record_caps_the_file_size(tmp_path):
    """A file above the descriptor size cap is refused before it is read (a sparse file here)."""
    from tensorlist.format import Limits

    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(Limits().max_descriptor_bytes + 1)
    with pytest.raises(FormatError, match="above the limit"):
        read_training_record(path)


def test_nesting_past_the_limit_is_an_error_not_a_recursion_error():
    """Values nested past _jsonio.MAX_DEPTH (or holding themselves) are refused, naming the field."""
    from tensorlist._base.jsonio import MAX_DEPTH

    deep = 1.0
    for _ in range(MAX_DEPTH + 50):
        deep = {"a": deep}
    record = full_record()
    record["solver"]["solver_params"]["deep"] = deep
    with pytest.raises(FormatError, match="nests deeper than") as info:
        read_training_record(record)
    assert info.value.field.startswith("solver.solver_params.deep.a.a")
    loop = []
    loop.append(loop)
    with pytest.raises(FormatError, match="nests deeper than") as info:
        spec(functools.partial(print, loop))
    assert info.value.field.startswith("object.args[0][0]")
    with pytest.raises(TypeError, match="nests deeper than"):
        history([loop], 1)
