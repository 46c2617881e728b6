"""Loop state, events, and checkpoints in the shape of lamp's StateIO.

Counting rule (one, used everywhere in the loops): ``State.epoch`` is the
number of epochs **completed** in the current phase. While an epoch runs,
its 0-based index is ``state.epoch`` (lamp's ``epoch``); learning-curve
entries carry that 0-based index; a checkpoint stores the number completed,
which is the index of the next epoch to run (lamp's stored ``epoch``). The
training record counts the same epochs from 1 (``epochs.done``).

A checkpoint is one JSON document written atomically with
``tensorlist.save_document`` (all its TensorLists share one data file):

- ``{"type": "SimpleLoopState", "model", "optimizer", "epoch",
  "lastValidationLoss"?, "minValidationLoss"?, "minValidationLossModel"?:
  [epoch, TensorList], "learningCurve"?: [[epoch, train, smoothed|null,
  raw|null], ...] newest first, ...}``
- ``{"type": "SWALoopState", "model", "optimizer", "epoch", ...,
  "numberOfAveragedModels", "averagedModels"?, "learningCurve"?: [[epoch,
  train, valid|null], ...]}``
- ``{"type": "SimpleThenSWALoopState", "simple": {...}, "swa": {...}?}``

with lamp's keys in lamp's order (``type`` first, absent options and empty
curves left out) and these extensions, which lamp skips when reading:
tensor names in every TensorList; the optimizer's non-tensor state in the
optimizer list's ``metadata``; ``"tensorlist"`` (loop extras: schedule
states, the torch LR scheduler's state, base learning rates, RNG states of
torch, numpy and ``random``); and ``"training"``/``"dataset_params"`` (the
training record and data record; the model list's metadata holds them too,
so ``load(path, pointer="/model")`` is a model file).
"""
from __future__ import annotations

import dataclasses
import enum
import math
import os
import random
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch

from .. import writer
from ..reader import load_document
from .._jsonio import from_tagged as _from_json_safe, to_tagged as _json_safe
from .._torch_bridge import to_numpy

__all__ = ["Events", "State", "LOOP_STATE_FORMAT", "read_checkpoint", "rng_state", "set_rng_state"]

#: Version marker of the loops' extension object (``"tensorlist"`` key of a checkpoint).
LOOP_STATE_FORMAT = "tensorlist.loop-state/1"


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
    global generators: (tensors, JSON)."""
    np_state = np.random.get_state()
    py_state = random.getstate()
    tensors = {"torch": to_numpy(torch.get_rng_state()), "numpy": np.asarray(np_state[1], dtype=np.uint32)}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        for i, st in enumerate(torch.cuda.get_rng_state_all()):
            tensors[f"cuda.{i}"] = to_numpy(st)
    meta = {"numpy": [np_state[0], int(np_state[2]), int(np_state[3]), float(np_state[4])],
            "random": [py_state[0], list(py_state[1]), py_state[2]]}
    return tensors, meta


def set_rng_state(tensors: Mapping[str, np.ndarray], meta: Mapping) -> None:
    """Restores what :func:`rng_state` returned."""
    torch.set_rng_state(torch.from_numpy(np.array(tensors["torch"], dtype=np.uint8)))
    cuda = sorted((int(k.split(".")[1]), v) for k, v in tensors.items() if k.startswith("cuda."))
    if cuda and torch.cuda.is_available():
        for i, v in cuda[:torch.cuda.device_count()]:
            torch.cuda.set_rng_state(torch.from_numpy(np.array(v, dtype=np.uint8)), i)
    kind, pos, has_gauss, cached = meta["numpy"]
    np.random.set_state((kind, np.array(tensors["numpy"], dtype=np.uint32), pos, has_gauss, cached))
    version, internal, gauss = meta["random"]
    random.setstate((version, tuple(internal), gauss))


# --------------------------------------------------------------------------
# documents


def _num(value):
    """A loss as JSON: NaN and infinities (not JSON) become null, as in the training record."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _opt(doc: dict, key: str, value) -> None:
    value = _num(value)
    if value is not None:
        doc[key] = value


def phase_document(kind: str, *, model: Mapping, model_meta: Optional[dict], optimizer: Mapping,
                   optimizer_meta: Optional[dict], epoch: int, state: State,
                   min_model: Optional[Mapping] = None, averaged: Optional[Mapping] = None) -> dict:
    """One SimpleLoopState / SWALoopState object (no ``type``), lamp's keys in lamp's order."""
    doc: Dict[str, Any] = {
        "model": writer.Tensors(dict(model), metadata=model_meta),
        "optimizer": writer.Tensors(dict(optimizer), metadata=optimizer_meta),
        "epoch": int(epoch),
    }
    _opt(doc, "lastValidationLoss", state.last_validation_loss)
    _opt(doc, "minValidationLoss", state.min_validation_loss)
    if kind == "simple":
        if min_model is not None:
            doc["minValidationLossModel"] = [int(state.min_validation_epoch), writer.Tensors(dict(min_model))]
        curve = [[e, _num(t), _num(s), _num(r)] for e, t, s, r in reversed(state.learning_curve)]
    else:
        doc["numberOfAveragedModels"] = int(state.number_of_averaged_models)
        if averaged is not None:
            doc["averagedModels"] = writer.Tensors(dict(averaged))
        curve = [[e, _num(t), _num(v)] for e, t, v in reversed(state.learning_curve)]
    if curve:
        doc["learningCurve"] = curve
    return doc


def empty_simple(state: State) -> dict:
    """The ``simple`` part of a SimpleThenSWALoopState during the SWA phase (lamp: empty lists)."""
    doc = phase_document("simple", model={}, model_meta=None, optimizer={}, optimizer_meta=None,
                         epoch=state.epoch, state=state)
    return doc


def state_from_phase(doc: Mapping, kind: str) -> State:
    """A :class:`State` from a loaded phase object (tensors are not touched)."""
    s = State(phase=kind, epoch=int(doc["epoch"]))
    s.last_validation_loss = doc.get("lastValidationLoss")
    s.min_validation_loss = doc.get("minValidationLoss")
    curve = [tuple(e) for e in reversed(doc.get("learningCurve", []))]
    s.learning_curve = curve
    if kind == "simple":
        mvm = doc.get("minValidationLossModel")
        s.min_validation_epoch = int(mvm[0]) if mvm is not None else None
        if curve:
            s.training_loss, s.validation_loss, s.raw_validation_loss = curve[-1][1], curve[-1][2], curve[-1][3]
    else:
        s.number_of_averaged_models = int(doc.get("numberOfAveragedModels", 0))
        if curve:
            s.training_loss, s.validation_loss = curve[-1][1], curve[-1][2]
            s.raw_validation_loss = s.validation_loss
    return s


def extras(*, phase: str, state: State, base_lrs: List[float], lr_scheduler_state, swa_schedule_state=None,
           simple_schedule_state=None) -> dict:
    tensors, meta = rng_state()
    return {
        "format": LOOP_STATE_FORMAT,
        "phase": phase,
        "iteration": state.iteration,
        "baseLearningRates": list(base_lrs),
        "scheduleState": _json_safe(simple_schedule_state, "schedule state"),
        "swaScheduleState": _json_safe(swa_schedule_state, "swa schedule state"),
        "lrScheduler": None if lr_scheduler_state is None else _json_safe(lr_scheduler_state, "lr scheduler"),
        "rng": meta,
        "rngTensors": writer.Tensors(tensors),
    }


def read_checkpoint(path) -> dict:
    """Reads a loop checkpoint: the document with every TensorList replaced by its arrays.

    The arrays are in private, writable memory (the optimizer updates its
    state in place). The optimizer list's metadata is kept under
    ``"optimizerMetadata"`` next to each phase's ``"optimizer"``.

    Raises:
        FileNotFoundError: no such checkpoint.
        FormatError: the file is not a valid tensorlist document.
        ValueError: the document is not a loop checkpoint.
    """
    import json

    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"checkpoint {path!r} does not exist")
    with open(path, "rb") as f:
        raw = json.loads(f.read())
    if not isinstance(raw, dict) or raw.get("type") not in ("SimpleLoopState", "SWALoopState",
                                                            "SimpleThenSWALoopState"):
        raise ValueError(f"{path}: not a loop checkpoint (no SimpleLoopState/SWALoopState/"
                         f"SimpleThenSWALoopState 'type')")
    doc = load_document(path, mmap=False)

    def phase_meta(src, dst):
        if isinstance(src, dict) and isinstance(src.get("optimizer"), dict):
            dst["optimizerMetadata"] = src["optimizer"].get("metadata")
            dst["modelMetadata"] = src["model"].get("metadata")

    if raw["type"] == "SimpleThenSWALoopState":
        phase_meta(raw["simple"], doc["simple"])
        if raw.get("swa") is not None:
            phase_meta(raw["swa"], doc["swa"])
    else:
        phase_meta(raw, doc)
    ext = doc.get("tensorlist")
    if isinstance(ext, dict) and ext.get("lrScheduler") is not None:
        ext["lrScheduler"] = _from_json_safe(ext["lrScheduler"])
    for key in ("scheduleState", "swaScheduleState"):
        if isinstance(ext, dict) and ext.get(key) is not None:
            ext[key] = _from_json_safe(ext[key])
    return doc
