"""The seed's functions: history, is_training_record, loader_settings, read_training_record; specs."""
from __future__ import annotations

import functools
import json
import math
import os
import re
import subprocess
import sys
import warnings

import ml_dtypes
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    TensorDataset,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from _record_support import full_record
from tensorlist.errors import FormatError
from tensorlist.record import (
    FORMAT,
    RecordWarning,
    TrainingRecord,
    history,
    is_training_record,
    loader_settings,
    read_dataset_params,
    read_training_record,
    spec,
)

DATA = TensorDataset(torch.arange(10.0).reshape(10, 1))


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
    assert history(torch.tensor([1.0, float("nan"), 0.0, 0.0]), 2) == [1.0, None]


def test_history_accepts_scalars_of_every_framework_and_nested_lists():
    """numpy/torch scalars (bfloat16 too), None, and per-group lists."""
    values = [np.float32(0.5), torch.tensor(0.25, dtype=torch.bfloat16), None, [0.1, np.float64("nan")],
              ml_dtypes.bfloat16(2.0), 3]
    assert history(values, 6) == [0.5, 0.25, None, [0.1, None], 2.0, 3.0]
    assert history(torch.tensor([1.5, 2.5], dtype=torch.bfloat16), 2) == [1.5, 2.5]


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


# --- loader_settings -------------------------------------------------------------

@pytest.mark.parametrize("loader, expected", [
    (DataLoader(DATA, batch_size=4, shuffle=True, drop_last=True),
     {"batch_size": 4, "shuffle": True, "drop_last": True, "sampler": None}),
    (DataLoader(DATA, batch_size=3),
     {"batch_size": 3, "shuffle": False, "drop_last": False, "sampler": None}),
    (DataLoader(DATA, batch_size=2, sampler=WeightedRandomSampler([1.0] * 10, 10)),
     {"batch_size": 2, "shuffle": None, "drop_last": False,
      "sampler": "torch.utils.data.sampler.WeightedRandomSampler"}),
    (DataLoader(DATA, batch_size=2, sampler=DistributedSampler(DATA, num_replicas=2, rank=0, shuffle=True)),
     {"batch_size": 2, "shuffle": True, "drop_last": False,
      "sampler": "torch.utils.data.distributed.DistributedSampler"}),
    (DataLoader(DATA, batch_size=2, sampler=RandomSampler(DATA, replacement=True)),
     {"batch_size": 2, "shuffle": True, "drop_last": False, "sampler": "torch.utils.data.sampler.RandomSampler"}),
    (DataLoader(DATA, batch_sampler=BatchSampler(RandomSampler(DATA), batch_size=5, drop_last=True)),
     {"batch_size": 5, "shuffle": True, "drop_last": True, "sampler": None}),
    (DataLoader(DATA, batch_sampler=BatchSampler(SequentialSampler(DATA), batch_size=5, drop_last=False)),
     {"batch_size": 5, "shuffle": False, "drop_last": False, "sampler": None}),
    (DataLoader(DATA, batch_size=None),
     {"batch_size": None, "shuffle": False, "drop_last": False, "sampler": None}),
])
def test_loader_settings(loader, expected):
    """shuffle comes from the sampler class; other samplers are named."""
    assert loader_settings(loader) == expected


class SeededRandomSampler(RandomSampler):
    """A RandomSampler subclass, as accelerate's SeedableRandomSampler (the Trainer's default) is."""


class MySequentialSampler(SequentialSampler):
    pass


@pytest.mark.parametrize("sampler, shuffle", [(SeededRandomSampler(DATA), True), (MySequentialSampler(DATA), False)])
def test_loader_settings_of_a_sampler_subclass_says_whether_it_shuffles_and_names_it(sampler, shuffle):
    settings = loader_settings(DataLoader(DATA, batch_size=2, sampler=sampler))
    assert settings == {"batch_size": 2, "shuffle": shuffle, "drop_last": False,
                        "sampler": f"{__name__}.{type(sampler).__qualname__}"}


def test_loader_settings_names_custom_batch_sampler():
    """A batch sampler of the user's own is named, with what it exposes."""

    class Buckets:
        batch_size = 8
        drop_last = True

        def __iter__(self):
            return iter([[0, 1], [2, 3]])

        def __len__(self):
            return 2

    settings = loader_settings(DataLoader(DATA, batch_sampler=Buckets()))
    assert settings["sampler"].endswith("test_loader_settings_names_custom_batch_sampler.<locals>.Buckets")
    assert settings["batch_size"] == 8 and settings["drop_last"] is True and settings["shuffle"] is None


def test_loader_settings_of_an_iterable_dataset_names_its_sampler():
    """An IterableDataset has no sampler of its own: the constant one is named, shuffle unknown."""

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(3))

    settings = loader_settings(DataLoader(Stream(), batch_size=2))
    assert settings["batch_size"] == 2 and settings["shuffle"] is None and "Sampler" in settings["sampler"]


def test_loader_settings_accepts_and_checks_a_settings_dict():
    """A loop that is not fed by a DataLoader states its settings as a dict."""
    settings = {"batch_size": 16, "shuffle": True, "drop_last": False, "sampler": None}
    assert loader_settings(settings) == settings
    with pytest.raises(ValueError, match="missing"):
        loader_settings({"batch_size": 16})
    with pytest.raises(ValueError, match=r"loader.batch_size: invalid value 0"):
        loader_settings(dict(settings, batch_size=0))
    with pytest.raises(TypeError, match="has no attribute 'batch_size'"):
        loader_settings(object())


# --- specs -----------------------------------------------------------------------

def module_level_loss(a, b):
    return (a - b).abs().mean()


def test_spec_of_importable_callables_and_objects():
    """Functions by dotted name; objects by class and constructor arguments."""
    assert spec(module_level_loss) == {"callable": f"{__name__}.module_level_loss", "importable": True}
    assert spec(torch.nn.functional.mse_loss) == {"callable": "torch.nn.functional.mse_loss", "importable": True}
    assert spec(torch.sigmoid) == {"callable": "torch.sigmoid", "importable": True}
    assert spec(torch.nn.L1Loss) == {"callable": "torch.nn.modules.loss.L1Loss", "importable": True}
    assert spec(torch.nn.SmoothL1Loss(beta=0.5)) == {
        "class": "torch.nn.modules.loss.SmoothL1Loss", "args": {"reduction": "mean", "beta": 0.5}, "importable": True}


def test_lambda_is_named_with_a_warning():
    """A lambda is recorded by name, importable false, and a RecordWarning says so."""
    with pytest.warns(RecordWarning, match=r"solver\.loss is the callable .*<lambda>.*recorded by name only"):
        out = spec(lambda a, b: (a - b).mean(), where="solver.loss")
    assert out["importable"] is False
    assert out["callable"] == f"{__name__}.test_lambda_is_named_with_a_warning.<locals>.<lambda>"


def test_local_function_bound_method_and_local_class_are_named_with_warnings():
    """Anything not importable by its name is named, never dropped, never a crash."""

    def local_loss(a, b):
        return a - b

    class LocalLoss(torch.nn.Module):
        def __init__(self, scale=2.0):
            super().__init__()
            self.scale = scale

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        f = spec(local_loss)
        m = spec(torch.nn.MSELoss().forward)
        c = spec(LocalLoss(3.0))
    assert f == {"callable": f"{__name__}.{test_local_function_bound_method_and_local_class_are_named_with_warnings.__name__}.<locals>.local_loss", "importable": False}
    assert m == {"callable": "torch.nn.modules.loss.MSELoss.forward", "importable": False}
    assert c["class"].endswith("<locals>.LocalLoss") and c["args"] == {"scale": 3.0} and c["importable"] is False
    assert len(caught) == 3 and all(issubclass(w.category, RecordWarning) for w in caught)


def test_spec_of_partial_and_of_awkward_objects_never_raises():
    """partials keep their function and arguments; odd attributes become JSON or specs."""
    p = functools.partial(torch.nn.functional.huber_loss, delta=0.5)
    assert spec(p) == {"class": "functools.partial", "importable": True, "args": {
        "func": {"callable": "torch.nn.functional.huber_loss", "importable": True}, "args": [],
        "keywords": {"delta": 0.5}}}

    class Odd:
        def __init__(self, a, b, c, d, e, loop=None):
            self.a, self.c, self.d, self.e = (1, 2), {3: np.float32(0.5)}, np.arange(3), torch.float16
            self.loop = self

        @property
        def b(self):
            raise RuntimeError("no")

    with warnings.catch_warnings(record=True):
        warnings.simplefilter("always")
        out = spec(Odd(1, 2, 3, 4, 5))
    args = out["args"]
    assert args["a"] == [1, 2] and args["c"] == {"3": 0.5} and args["d"] == [0, 1, 2]
    assert args["e"] == "torch.float16" and "b" not in args
    depth = 0
    node = args["loop"]
    while node["args"] is not None:  # a self-reference stops at the depth limit
        node, depth = node["args"]["loop"], depth + 1
    assert depth < 10
    json.dumps(out, allow_nan=False)


def test_spec_nulls_non_finite_arguments_and_summarises_big_arrays():
    """NaN/inf arguments become null and big arrays a hash summary, each with a warning."""

    class Weighted:
        def __init__(self, limit, weights):
            self.limit, self.weights = limit, weights

    with pytest.warns(RecordWarning) as caught:
        out = spec(Weighted(math.inf, torch.ones(5000, dtype=torch.bfloat16)))
    assert out["args"]["limit"] is None
    assert out["args"]["weights"]["dtype"] == "bfloat16" and out["args"]["weights"]["shape"] == [5000]
    assert re.fullmatch(r"[0-9a-f]{64}", out["args"]["weights"]["weights_sha256"])
    messages = " | ".join(str(w.message) for w in caught)
    assert "object.args.limit is inf" in messages and "an array of 5000 elements" in messages
    assert "<locals>.Weighted" in messages  # the local class itself is named, too


def test_module_imports_without_torch():
    """tensorlist.record never imports torch by itself."""
    code = ("import sys, tensorlist.record as r, numpy as np; "
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
    from tensorlist._jsonio import MAX_DEPTH

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
