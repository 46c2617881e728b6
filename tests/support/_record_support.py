"""Shared pieces of the training-record tests: a full valid record, an
independent weights_sha256, and Hypothesis strategies for records."""
from __future__ import annotations

import copy
import hashlib
import struct

import numpy as np
from hypothesis import strategies as st

from tensorlist._base import dtypes
from tensorlist.provenance.record import FORMAT

HEX_A = "a" * 64
HEX_B = "0123456789abcdef" * 4


def full_record() -> dict:
    """A valid record in which every optional shape is present (for per-field tests)."""
    return {
        "format": FORMAT,
        "created": "2025-01-31T12:00:00.5+00:00",
        "environment": {"python": "3.11.7", "numpy": "2.0.0", "torch": "2.13.0", "tensorlist": "0.1.0"},
        "solver": {
            "class": "lab.loops.Supervised",
            "solver_params": {"clip_norm": 1.0, "noise_std": 0.05},
            "loss": {"callable": "torch.nn.functional.mse_loss", "importable": True},
        },
        "optimizer": {
            "class": "torch.optim.adam.Adam",
            "hyperparameters": {"lr": 0.001, "betas": [0.9, 0.999]},
            "parameter_groups": [
                {"parameters": ["0.weight", "0.bias"], "initial_lr": 0.001, "settings": {"betas": [0.9, 0.999]}},
                {"parameters": ["2.weight"], "initial_lr": 0.01, "settings": {"betas": [0.9, 0.999]}},
            ],
            "scheduler": {"class": "torch.optim.lr_scheduler.StepLR", "args": {"step_size": 2, "gamma": 0.5},
                          "importable": True},
            "scheduler_step": "epoch",
        },
        "seed": 42,
        "initial_weights_sha256": HEX_A,
        "initial_weights": {"from": "file", "file": "initial.json", "origin": {"file": "base.json",
                                                                                "weights_sha256": HEX_B}},
        "train": {"batch_size": 32, "shuffle": True, "drop_last": False, "sampler": "lab.data.BalancedSampler"},
        "validation": {
            "dataset_params": {"name": "val", "content_hash": {"method": "file_sha256", "sha256": HEX_B}},
            "loader": {"batch_size": 64, "shuffle": False, "drop_last": False, "sampler": "lab.data.Fixed"},
            "every": 1,
            "function": {"class": "torch.nn.modules.loss.MSELoss", "args": {"reduction": "mean"}, "importable": True},
            "reconstructor": {"class": "lab.recon.FBP", "args": {"filter": "ramp"}, "importable": True},
        },
        "epochs": {"asked": 10, "done": 3},
        "weights": {"kind": "best_validation", "epoch": 2, "validation": 0.25, "sha256": HEX_A},
        "history": {
            "training_loss": [1.0, 0.5, 0.4],
            "validation": [0.3, 0.25, 0.26],
            "learning_rate": [[0.001, 0.01], [0.001, 0.01], [0.0005, 0.005]],
        },
    }


# Objects whose content is free-form JSON: a field test does not go inside them.
FREE_FORM = {
    ("solver", "solver_params"),
    ("optimizer", "hyperparameters"),
    ("validation", "dataset_params"),
}


def _free(path) -> bool:
    if tuple(path[-2:]) in FREE_FORM:
        return True
    return bool(path) and path[-1] in ("settings", "args")


def field_paths(value=None, path=()):
    """Every field path of the full record (keys, and list entries as ints)."""
    if value is None and not path:
        value = full_record()
    if isinstance(value, dict):
        for key, item in value.items():
            yield path + (key,)
            if not _free(path + (key,)):
                yield from field_paths(item, path + (key,))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield path + (i,)
            yield from field_paths(item, path + (i,))


def dotted(path) -> str:
    out = ""
    for part in path:
        out = f"{out}[{part}]" if isinstance(part, int) else (f"{out}.{part}" if out else part)
    return out


def get(record, path):
    for part in path[:-1]:
        record = record[part]
    return record, path[-1]


def wrong_value(value):
    """A value of a type the field at hand does not accept."""
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return "7"
    if isinstance(value, str):
        return 12345
    if value is None:
        return 12345
    if isinstance(value, dict):
        return "an object was expected"
    if isinstance(value, list):
        return "a list was expected"
    raise AssertionError(value)


def with_change(path, change):
    record = full_record()
    parent, key = get(record, path)
    change(parent, key)
    return record


# --- an independent weights_sha256, written from the definition ------------

def reference_sha256(named_arrays) -> str:
    """docs/FORMAT.md 'Weights hash', byte for byte, for a list of (name, array)."""
    u64 = lambda n: struct.pack("<Q", n)  # noqa: E731
    parts = [b"tensorlist-weights-sha256\x00v1", u64(len(named_arrays))]
    for name, arr in named_arrays:
        arr = np.asarray(arr)
        dt = dtypes.from_numpy(arr.dtype)
        if dt.carried:  # ml_dtypes values or a bit carrier: its bits as unsigned integers, in its byte order
            arr = arr.view(np.dtype(f"u{dt.itemsize}").newbyteorder(arr.dtype.byteorder))
        raw = np.ascontiguousarray(arr).astype(dt.bits).tobytes()
        n, d = name.encode("utf-8"), dt.name.encode()
        parts += [u64(len(n)), n, u64(len(d)), d, u64(arr.ndim)] + [u64(s) for s in arr.shape]
        parts += [u64(len(raw)), raw]
    return hashlib.sha256(b"".join(parts)).hexdigest()


# --- Hypothesis strategies ---------------------------------------------------

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
_name = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)
_finite = st.floats(allow_nan=False, allow_infinity=False)
_json_scalar = st.none() | st.booleans() | st.integers(-(2**63), 2**63) | _finite | _text
json_values = st.recursive(
    _json_scalar,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
    max_leaves=8,
)
free_objects = st.dictionaries(_text, json_values, max_size=4)
_hex = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_lr = st.floats(min_value=0, max_value=10, allow_nan=False)
_maybe_number = st.none() | _finite

specs = st.one_of(
    st.builds(lambda c, i: {"callable": c, "importable": i}, _name, st.booleans()),
    st.builds(lambda c, a, i: {"class": c, "args": a, "importable": i}, _name, st.none() | free_objects,
              st.booleans()),
)
loaders = st.fixed_dictionaries({
    "batch_size": st.none() | st.integers(1, 2**20),
    "shuffle": st.none() | st.booleans(),
    "drop_last": st.booleans(),
    "sampler": st.none() | _name,
})
_where_it_ran = {"model", "optimizer", "device", "verbose", "save_folder"}


@st.composite
def records(draw) -> dict:
    """Valid training records, every field drawn."""
    done = draw(st.integers(0, 6))
    groups = draw(st.none() | st.lists(
        st.fixed_dictionaries({"parameters": st.lists(_name, max_size=3), "initial_lr": st.none() | _lr,
                               "settings": free_objects}),
        min_size=1, max_size=3))
    n_groups = 1 if groups is None else len(groups)
    lr_entry = (st.none() | _lr) if n_groups == 1 else (st.none() | st.lists(st.none() | _lr, min_size=n_groups,
                                                                               max_size=n_groups))
    scheduler = draw(st.none() | specs)
    validation = draw(st.none() | st.fixed_dictionaries({
        "dataset_params": st.none() | free_objects.filter(lambda d: "content_hash" not in d),
        "loader": st.none() | loaders,
        "every": st.integers(1, 5),
        "function": specs,
        "reconstructor": st.none() | specs,
    }))
    kinds = ["final", "checkpoint"] + (["best_validation"] if validation is not None else [])
    kind = draw(st.sampled_from(kinds))
    initial = draw(st.sampled_from(["random_state", "file", None]))
    origin = draw(st.none() | st.fixed_dictionaries({"file": _name, "weights_sha256": _hex}))
    if initial == "random_state":
        initial_weights = {"from": "random_state"}
    elif initial == "file":
        initial_weights = {"from": "file", "file": draw(_name), "origin": origin}
    else:
        initial_weights = {"from": None, "origin": origin}
    return {
        "format": FORMAT,
        "created": draw(st.sampled_from(["2024-02-29T23:59:59Z", "2025-01-31T12:00:00.123456+00:00",
                                         "1999-12-31T00:00:00-05:30"])),
        "environment": {"python": draw(_name), "numpy": draw(st.none() | _name), "torch": draw(st.none() | _name),
                        "tensorlist": draw(st.none() | _name)},
        "solver": {
            "class": draw(st.none() | _name),
            "solver_params": draw(free_objects.filter(lambda d: not (set(d) & _where_it_ran))),
            "loss": draw(st.none() | specs),
        },
        "optimizer": {
            "class": draw(_name),
            "hyperparameters": draw(free_objects),
            "parameter_groups": groups,
            "scheduler": scheduler,
            "scheduler_step": None if scheduler is None else draw(st.sampled_from(["epoch", "batch"])),
        },
        "seed": draw(st.none() | st.integers(-(2**64), 2**128)),
        "initial_weights_sha256": draw(st.none() | _hex),
        "initial_weights": initial_weights,
        "train": draw(loaders),
        "validation": validation,
        "epochs": {"asked": draw(st.integers(0, 10**6)), "done": done},
        "weights": {
            "kind": kind,
            "epoch": draw(st.integers(0, done)),
            "validation": draw(_finite) if kind == "best_validation" else draw(_maybe_number),
            "sha256": draw(st.none() | _hex),
        },
        "history": {
            "training_loss": draw(st.lists(_maybe_number, min_size=done, max_size=done)),
            "validation": (draw(st.lists(_maybe_number, min_size=done, max_size=done))
                           if validation is not None else [None] * done),
            "learning_rate": draw(st.lists(lr_entry, min_size=done, max_size=done)),
        },
    }


def deepcopy(value):
    return copy.deepcopy(value)
