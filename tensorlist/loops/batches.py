"""Batches and steps: what the loops iterate over and what they call on each batch.

A *step* is ``step(model, batch) -> (loss, n)`` (a scalar loss tensor to
differentiate and the batch's example count); :func:`supervised_step` makes
one from a loss function. A batch stream is an iterable re-iterated each
epoch (a ``DataLoader``, a list, :class:`Minibatches`) or a factory
``f(TrainingLoopContext) -> iterable``; :func:`batch_stream` opens it for an
epoch, :func:`is_empty` says which batches a loop skips, and
:func:`stream_settings` describes it for the training record.

Imports torch and ``record`` (its loader settings) only.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Optional

import torch

from tensorlist.provenance.record import loader_settings

__all__ = ["TrainingLoopContext", "Minibatches", "supervised_step", "batch_stream", "is_empty", "stream_settings"]


@dataclasses.dataclass(frozen=True)
class TrainingLoopContext:
    """What a batch-stream factory gets each epoch (lamp's ``TrainingLoopContext``)."""

    epoch: int
    last_validation_loss: Optional[float]
    min_validation_loss: Optional[float]


class Minibatches:
    """Minibatches of full tensors, reshuffled each epoch (lamp's ``minibatchesFromFull``, fixed).

    ``drop_last`` drops only a *short* last batch; lamp's drops the last group
    even when it is full. Shuffling is seeded by ``(seed, epoch)`` so that a
    resumed run sees the same batches; the loops call :meth:`set_epoch`.

    Example:
        >>> mb = Minibatches(torch.arange(10.), torch.arange(10.), batch_size=4, shuffle=False, drop_last=True)
        >>> [len(x) for x, _ in mb]
        [4, 4]
        >>> [len(x) for x, _ in Minibatches(torch.arange(8.), torch.arange(8.), 4, shuffle=False, drop_last=True)]
        [4, 4]
    """

    def __init__(self, features, target, batch_size: int, *, shuffle: bool = True, drop_last: bool = False,
                 seed: int = 0):
        if len(features) != len(target):
            raise ValueError(f"features and target differ in length: {len(features)} != {len(target)}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size!r}")
        self.features, self.target = features, target
        self.batch_size, self.shuffle, self.drop_last, self.seed = int(batch_size), bool(shuffle), bool(drop_last), seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def settings(self) -> dict:
        """The training record's loader settings."""
        return {"batch_size": self.batch_size, "shuffle": self.shuffle, "drop_last": self.drop_last,
                "sampler": None}

    def __len__(self) -> int:
        n = len(self.features)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        n = len(self.features)
        if self.shuffle:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
            idx = torch.randperm(n, generator=g)
        else:
            idx = torch.arange(n)
        for start in range(0, n, self.batch_size):
            sel = idx[start:start + self.batch_size]
            if self.drop_last and len(sel) < self.batch_size:
                return
            yield self.features[sel], self.target[sel]


def supervised_step(loss_fn: Callable, device=None) -> Callable:
    """A step for ``(input, target)`` batches: ``loss_fn(model(input), target)``, n = ``len(input)``."""

    def step(model, batch):
        x, y = batch
        if device is not None:
            x, y = x.to(device), y.to(device)
        return loss_fn(model(x), y), int(x.shape[0])

    step.loss_fn = loss_fn  # recorded in the training record
    return step


def is_empty(batch) -> bool:
    """lamp's ``EmptyBatch``: None, an empty tuple or list, or a first tensor with 0 examples."""
    if batch is None:
        return True
    first = batch[0] if isinstance(batch, (tuple, list)) and len(batch) else batch
    if isinstance(batch, (tuple, list)) and not batch:
        return True
    return isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] == 0


def batch_stream(source, ctx: TrainingLoopContext):
    """The batches of epoch ``ctx.epoch``: calls a factory, and tells a sampler or stream the epoch."""
    it = source(ctx) if callable(source) and not hasattr(source, "__iter__") else source
    sampler = getattr(it, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(ctx.epoch)
    elif hasattr(it, "set_epoch"):
        it.set_epoch(ctx.epoch)
    return it


def stream_settings(source) -> dict:
    """A batch stream's loader settings for the training record (unknown ones as None)."""
    if hasattr(source, "settings"):
        return source.settings()
    if all(hasattr(source, a) for a in ("batch_size", "drop_last", "sampler")):
        return loader_settings(source)
    return {"batch_size": None, "shuffle": None, "drop_last": False, "sampler": None}
