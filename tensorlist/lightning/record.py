"""The training record a Lightning checkpoint dict gives by itself, for ``TensorListCheckpointIO``.

A ``CheckpointIO`` sees the checkpoint dict, not the Trainer: its epoch and
global step, the fit loop's progress, each optimizer's state (its groups'
settings and learning rates), the schedulers' states and the saved
hyper-parameters. :func:`with_record` makes the record from those through
the record package's builders (``optimizer_state_record``,
``build_training_record``), so every checkpoint the plugin writes is a model
file with provenance. What the dict does not hold is recorded as unknown
(optimizer class, loader, epochs asked, per-epoch history: null); the
seed is Lightning's ``PL_GLOBAL_SEED``, as ``TrainingRecordCallback`` reads it.
A checkpoint that already holds a record (the callback's, which sees the
Trainer) keeps it.

Imports the ``record`` package and torch (no lightning).
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional

import torch

from tensorlist.provenance.record import TrainingRecord, build_training_record, optimizer_state_record
from tensorlist.provenance.record.spec import to_json

__all__ = ["RECORD_KEYS", "SOLVER", "with_record", "checkpoint_record", "epochs_done", "global_seed",
           "loss_value", "FullWeights", "whole_module"]

#: The checkpoint's keys holding the record (a model file's metadata keys).
RECORD_KEYS = ("training", "dataset_params")
#: The record's ``solver.class`` for a Lightning run.
SOLVER = "lightning.pytorch.Trainer"
#: The data record when nobody gave one.
UNKNOWN_DATA = {"name": None}


def global_seed() -> Optional[int]:
    """The seed ``lightning.seed_everything`` left in ``PL_GLOBAL_SEED``, or None."""
    seed = os.environ.get("PL_GLOBAL_SEED")
    try:
        return None if seed is None else int(seed)
    except ValueError:
        return None


def _int(value) -> Optional[int]:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def epochs_done(checkpoint: Mapping) -> int:
    """The epochs completed when ``checkpoint`` was taken.

    Lightning's ``epoch`` is the epoch running (0-based): a checkpoint taken at
    an epoch's end says ``epoch=0`` after one epoch. The fit loop's progress
    tells: the epochs completed, plus the running one when its last batch is
    done (a save at the epoch's end, or after its last validation); without
    it, ``epoch`` (the epochs before the running one).
    """
    fit = checkpoint.get("loops", {}).get("fit_loop") if isinstance(checkpoint.get("loops"), Mapping) else None
    if isinstance(fit, Mapping):
        total = fit.get("epoch_progress", {}).get("total") if isinstance(fit.get("epoch_progress"), Mapping) else None
        batches = fit.get("epoch_loop.batch_progress")
        if isinstance(total, Mapping) and _int(total.get("completed")) is not None:
            completed, started = total["completed"], _int(total.get("started")) or 0
            last = isinstance(batches, Mapping) and batches.get("is_last_batch") is True
            return completed + (1 if last and started > completed else 0)
    return _int(checkpoint.get("epoch")) or 0


def checkpoint_record(checkpoint: Mapping) -> TrainingRecord:
    """The record of a Lightning checkpoint dict (module docstring: what it holds).

    ``weights.sha256`` is left null: the plugin sets it to the hash of the
    ``state_dict`` it writes.
    """
    states = checkpoint.get("optimizer_states")
    states = states if isinstance(states, (list, tuple)) else []
    schedulers = checkpoint.get("lr_schedulers")
    params: dict[str, Any] = {
        "epoch": _int(checkpoint.get("epoch")), "global_step": _int(checkpoint.get("global_step")),
        "lightning_version": checkpoint.get("pytorch-lightning_version"),
        "optimizers": len(states), "lr_schedulers": len(schedulers) if isinstance(schedulers, (list, tuple)) else 0,
    }
    if not isinstance(params["lightning_version"], str):
        params["lightning_version"] = None
    if isinstance(checkpoint.get("hyper_parameters"), Mapping):
        params["hyper_parameters"] = to_json(dict(checkpoint["hyper_parameters"]), "solver.solver_params.hyper_parameters")
    done = epochs_done(checkpoint)
    return build_training_record(
        optimizer=optimizer_state_record(states[0] if states else None), train_loader=None, epochs_asked=None,
        epochs_done=done, training_loss=[None] * done, weights_kind="checkpoint", seed=global_seed(),
        solver=SOLVER, solver_params=params)


def is_lightning_checkpoint(checkpoint: Mapping) -> bool:
    """A dict as Lightning's ``dump_checkpoint`` makes it: a ``state_dict`` mapping, ``epoch`` and ``global_step``."""
    return isinstance(checkpoint.get("state_dict"), Mapping) and _int(checkpoint.get("epoch")) is not None \
        and _int(checkpoint.get("global_step")) is not None


def with_record(checkpoint: Mapping) -> Mapping:
    """``checkpoint`` with a record: the one it holds, else one made from it (a new dict; the caller's is kept).

    A dict that is not a Lightning checkpoint (:func:`is_lightning_checkpoint`)
    is returned as it is.
    """
    if "training" in checkpoint or not is_lightning_checkpoint(checkpoint):
        return checkpoint
    out = dict(checkpoint)
    out["training"] = checkpoint_record(checkpoint)
    out.setdefault("dataset_params", dict(UNKNOWN_DATA))
    return out


def loss_value(outputs) -> Optional[float]:
    """A training step's loss as a float, when ``outputs`` holds one scalar loss."""
    if isinstance(outputs, Mapping):
        outputs = outputs.get("loss")
    if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
        return float(outputs.detach())
    if isinstance(outputs, (int, float)):
        return float(outputs)
    return None


class FullWeights(torch.nn.Module):
    """A sharded module seen whole by the record: its parameters' names, its full state dict (gathered once)."""

    def __init__(self, module, full: Mapping) -> None:
        super().__init__()
        self._module = [module]  # a list: not registered as a submodule
        self._full = full

    def state_dict(self, *args, **kwargs):  # noqa: D102 (the gathered full tensors)
        return self._full

    def named_parameters(self, *args, **kwargs):  # noqa: D102 (the module's names)
        return self._module[0].named_parameters(*args, **kwargs)


def whole_module(module):
    """``module``, or a whole view of it when its parameters are DTensors (a collective: every rank calls it)."""
    from torch.distributed.tensor import DTensor

    if not any(isinstance(p, DTensor) for p in module.parameters()):
        return module
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return FullWeights(module, full)
