"""The seed's functions that take torch objects: loader_settings, spec, history of torch and ml_dtypes scalars."""
from __future__ import annotations

import functools
import json
import math
import re
import warnings

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 scalars need ml_dtypes")
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

from tensorlist.provenance.record import RecordWarning, history, loader_settings, spec

DATA = TensorDataset(torch.arange(10.0).reshape(10, 1))


# --- history of torch and ml_dtypes values ---------------------------------------------

def test_history_of_a_torch_tensor_has_no_placeholders():
    """A preallocated torch tensor keeps the first ``done`` values."""
    assert history(torch.tensor([1.0, float("nan"), 0.0, 0.0]), 2) == [1.0, None]


def test_history_accepts_scalars_of_every_framework_and_nested_lists():
    """numpy/torch scalars (bfloat16 too), None, and per-group lists."""
    values = [np.float32(0.5), torch.tensor(0.25, dtype=torch.bfloat16), None, [0.1, np.float64("nan")],
              ml_dtypes.bfloat16(2.0), 3]
    assert history(values, 6) == [0.5, 0.25, None, [0.1, None], 2.0, 3.0]
    assert history(torch.tensor([1.5, 2.5], dtype=torch.bfloat16), 2) == [1.5, 2.5]


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
