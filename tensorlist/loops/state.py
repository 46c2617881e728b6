"""Loop state and events: :class:`State`, :class:`Events`, and the global RNG states a run saves.

Counting rule (one, used everywhere in the loops): ``State.epoch`` is the
number of epochs **completed** in the current phase. While an epoch runs,
its 0-based index is ``state.epoch`` (lamp's ``epoch``); learning-curve
entries carry that 0-based index; a checkpoint stores the number completed,
which is the index of the next epoch to run (lamp's stored ``epoch``). The
training record counts the same epochs from 1 (``epochs.done``), and so does
everything the loops print (log lines, progress bars, the demo's table):
through ``record.epoch_number``, from the recorder's count.

:func:`rng_state` and :func:`set_rng_state` capture and restore the global
generators of torch, numpy and ``random`` (a checkpoint stores them, so that a
resumed run draws the same numbers); :func:`rng_state_json` and
:func:`set_rng_state_json` do the same with one plain JSON value (what each
rank stores in a sharded checkpoint); :func:`seed_rngs` seeds them for a fresh
run. How a State becomes a checkpoint document is ``loops.checkpoint``.

Imports numpy, torch, ``_bridges.torch``, ``_base.states`` and ``errors`` only (no other module of ``loops``).
"""
from __future__ import annotations

import dataclasses
import enum
import random
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from tensorlist._base.jsonio import array_index
from tensorlist._base.states import check_rng_state
from tensorlist._bridges.torch import from_numpy, to_numpy
from tensorlist.errors import FormatError, short_repr

__all__ = ["Events", "State", "rng_state", "set_rng_state", "rng_state_json", "set_rng_state_json",
           "check_rng_state_json", "seed_rngs"]


class Events(enum.Enum):
    """When handlers run; each handler is called as ``handler(state)``."""

    STARTED = "started"
    EPOCH_STARTED = "epoch_started"
    ITERATION_COMPLETED = "iteration_completed"
    EPOCH_COMPLETED = "epoch_completed"  # after training and validation, before the checkpoint
    VALIDATION_COMPLETED = "validation_completed"
    CHECKPOINT_SAVED = "checkpoint_saved"
    COMPLETED = "completed"


@dataclasses.dataclass
class State:
    """The mutable state of a running loop (see the module docstring for the counting rule).

    Attributes:
        phase: ``"simple"`` (lamp's ``epochs``) or ``"swa"``.
        epoch: epochs completed in this phase.
        iteration: non-empty training batches processed in this phase.
        max_epochs: the phase's epoch limit.
        training_loss: the last epoch's training loss (weighted by batch size).
        validation_loss: the last validation loss as used by the loop (smoothed).
        raw_validation_loss: the last unsmoothed validation loss.
        last_validation_loss: lamp's ``lastValidationLoss``: the smoothed loss
            of the last epoch if it was validated, else None.
        min_validation_loss, min_validation_epoch: the best (smoothed) loss
            among the epochs eligible for the min-validation model, and its
            0-based epoch.
        learning_curve: chronological ``(epoch, train, smoothed, raw)``
            tuples (simple) or ``(epoch, train, valid)`` (swa).
        schedule_state: the learning-rate schedule's state for the next epoch.
        factor: the learning-rate factor of the current epoch.
        number_of_averaged_models: SWA: models in the running average.
        batch_loss: the last batch's loss (a float), for handlers.
        should_stop: a handler may set it to stop after the current epoch.
    """

    phase: str = "simple"
    epoch: int = 0
    iteration: int = 0
    max_epochs: int = 0
    training_loss: Optional[float] = None
    validation_loss: Optional[float] = None
    raw_validation_loss: Optional[float] = None
    last_validation_loss: Optional[float] = None
    min_validation_loss: Optional[float] = None
    min_validation_epoch: Optional[int] = None
    learning_curve: List[tuple] = dataclasses.field(default_factory=list)
    schedule_state: Any = None
    factor: float = 1.0
    number_of_averaged_models: int = 0
    batch_loss: Optional[float] = None
    should_stop: bool = False


# --------------------------------------------------------------------------
# RNG states


def rng_state() -> Tuple[Dict[str, np.ndarray], dict]:
    """The states of torch's (CPU and, once initialised, each CUDA device's), numpy's and ``random``'s
    global generators: (tensors, JSON).

    Example:
        >>> tensors, meta = rng_state()
        >>> drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
        >>> set_rng_state(tensors, meta)
        >>> (random.random(), float(np.random.rand()), float(torch.rand(1))) == drawn
        True
    """
    np_state = np.random.get_state()
    py_state = random.getstate()
    tensors = {"torch": to_numpy(torch.get_rng_state(), "torch RNG state"),
               "numpy": np.asarray(np_state[1], dtype=np.uint32)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = to_numpy(st, f"CUDA {i} RNG state")
    meta = {"numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "random": [py_state[0], list(py_state[1]), py_state[2]]}
    return tensors, meta


def set_rng_state(tensors: Mapping[str, np.ndarray], meta: Mapping, *, file=None, field: str = "rng") -> None:
    """Restores what :func:`rng_state` returned, once all of it is checked (``_base.states.check_rng_state``:
    FormatError naming ``file`` and the field, and no generator changed, when a part is of the wrong size
    or type)."""
    tensors, meta = check_rng_state(tensors, meta, file=file, field=field)
    torch.set_rng_state(from_numpy(tensors["torch"]))
    # "cuda.<index>" keys are a checkpoint's text: converted by the one bounded index rule; others ignored
    cuda = sorted((i, v) for i, v in ((array_index(k[5:]) if k.startswith("cuda.") else None, v)
                                      for k, v in tensors.items()) if i is not None)
    if cuda and torch.cuda.is_available():
        for i, v in cuda[:torch.cuda.device_count()]:
            torch.cuda.set_rng_state(from_numpy(v), i)
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, tensors["numpy"], int(pos), int(has_gauss), float(cached)))
    version, internal, gauss = meta["random"]
    random.setstate((version, tuple(internal), gauss))


def rng_state_json() -> dict:
    """:func:`rng_state` as one JSON value: ``{"tensors": {name: [ints]}, "meta": {...}}``.

    Example:
        >>> state = rng_state_json()
        >>> drawn = (random.random(), float(np.random.rand()), float(torch.rand(1)))
        >>> set_rng_state_json(state)
        >>> (random.random(), float(np.random.rand()), float(torch.rand(1))) == drawn
        True
    """
    tensors, meta = rng_state()
    return {"tensors": {k: np.asarray(v).tolist() for k, v in tensors.items()}, "meta": meta}


def check_rng_state_json(value: Any, *, file=None, field: str = "rng") -> tuple:
    """The ``(tensors, meta)`` of :func:`rng_state_json`'s value, checked as :func:`set_rng_state` checks them."""
    if not isinstance(value, Mapping) or not isinstance(value.get("tensors"), Mapping):
        raise FormatError(f"an RNG state must be {{'tensors': {{...}}, 'meta': {{...}}}}, got {short_repr(value)}",
                          file=file, field=field)
    return check_rng_state(value["tensors"], value.get("meta"), file=file, field=f"{field}.meta",
                           tensors_field=f"{field}.tensors")


def set_rng_state_json(value: Mapping, *, file=None, field: str = "rng") -> None:
    """Restores what :func:`rng_state_json` returned (the JSON lists as the arrays they were), once checked."""
    tensors, meta = check_rng_state_json(value, file=file, field=field)
    set_rng_state(tensors, meta, file=file, field=f"{field}.meta")


def seed_rngs(seed: Optional[int]) -> None:
    """Seeds torch, numpy and ``random`` for a fresh run (a resumed run restores their states instead)."""
    if seed is None:
        return
    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
