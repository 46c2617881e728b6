"""Learning-rate schedules in lamp's manner: a factor per epoch, and SWA schedules.

A schedule has ``init()`` (its starting state, plain JSON) and
``factor(state, epoch, last_validation_loss) -> (next_state, factor)``. The
loop sets each parameter group's rate to ``base_lr * factor`` for the epoch;
a factor ``<= 0`` stops the loop (this is how reduce-on-plateau early
stopping works, as in lamp). ``epoch`` is the 0-based index of the epoch
about to run.

An SWA schedule's ``factor`` returns ``(next_state, factor, accumulate)``:
``accumulate`` says whether the weights after this epoch join the average.

Example:
    >>> s = ReduceLROnPlateau(patience=1, reduce_factor=0.5, stop_factor=0.2)
    >>> st = s.init(); out = []
    >>> for e, v in enumerate([None, 1.0, 0.9, 0.95, 0.95, 0.95, 0.95, 0.95]):
    ...     st, f = s.factor(st, e, v); out.append(f)
    >>> out
    [1.0, 1.0, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25]
    >>> [round(CyclicSWA(0.1, 1.0, 4).factor(None, e, None)[1], 3) for e in range(4)]
    [0.775, 0.55, 0.325, 0.1]

Imports nothing beyond the standard library (schedules know no torch).
"""
from __future__ import annotations

import math
from typing import Any, Optional, Tuple

__all__ = ["Noop", "Decrement", "ReduceLROnPlateau", "ConstantSWA", "CyclicSWA"]


class Noop:
    """Factor 1 every epoch (lamp's ``LearningRateSchedule.noop``)."""

    def init(self) -> Any:
        return None

    def factor(self, state, epoch: int, last_validation_loss: Optional[float]) -> Tuple[Any, float]:
        return state, 1.0


class Decrement:
    """``fraction ** (epoch // every)`` (lamp's ``decrement(every, fraction)``)."""

    def __init__(self, every: int = 20, fraction: float = 0.5):
        if every < 1:
            raise ValueError(f"every must be >= 1, got {every!r}")
        self.every = int(every)
        self.fraction = float(fraction)

    def init(self) -> Any:
        return None

    def factor(self, state, epoch: int, last_validation_loss: Optional[float]) -> Tuple[Any, float]:
        return state, self.fraction ** (epoch // self.every)


class ReduceLROnPlateau:
    """lamp's ``reduceLROnPlateau``: multiply by ``reduce_factor`` after ``patience`` epochs without improvement.

    The state has lamp's ``ReduceLROnPlateauState`` JSON shape,
    ``{"min", "minLoc", "activeFactor"}`` with ``min``/``minLoc`` left out
    while unset. Once the active factor falls to ``stop_factor`` or below the
    factor is 0, which stops the loop. Unlike lamp, an epoch without a
    validation loss (the first one) keeps the factor instead of failing.
    """

    def __init__(self, start_factor: float = 1.0, reduce_factor: float = 0.5, patience: int = 10,
                 threshold: float = 1e-4, relative_threshold_mode: bool = True, stop_factor: float = 1e-4):
        self.start_factor = float(start_factor)
        self.reduce_factor = float(reduce_factor)
        self.patience = int(patience)
        self.threshold = float(threshold)
        self.relative_threshold_mode = bool(relative_threshold_mode)
        self.stop_factor = float(stop_factor)

    def init(self) -> dict:
        return {"activeFactor": self.start_factor}

    def _out(self, state: dict) -> Tuple[dict, float]:
        f = state["activeFactor"]
        return state, (0.0 if f <= self.stop_factor else f)

    def factor(self, state, epoch: int, last_validation_loss: Optional[float]) -> Tuple[dict, float]:
        state = dict(state)
        if last_validation_loss is None or not math.isfinite(last_validation_loss):
            return self._out(state)
        best = state.get("min")
        if best is None:
            improved = True
        elif self.relative_threshold_mode:
            improved = last_validation_loss < best * (1 - self.threshold)
        else:
            improved = last_validation_loss < best - self.threshold
        if improved:
            state["min"], state["minLoc"] = float(last_validation_loss), int(epoch)
        elif epoch - state.get("minLoc", -1) > self.patience:
            state["activeFactor"] = state["activeFactor"] * self.reduce_factor
            state["minLoc"] = int(epoch)
        return self._out(state)


class ConstantSWA:
    """SWA at a constant factor, averaging after every epoch (lamp's ``SWALearningRateSchedule.constant``)."""

    def __init__(self, factor: float = 1.0):
        self.value = float(factor)

    def init(self) -> Any:
        return None

    def factor(self, state, epoch: int, last_validation_loss: Optional[float]) -> Tuple[Any, float, bool]:
        return state, self.value, True


class CyclicSWA:
    """Cyclic SWA (lamp's ``cyclic``): within each cycle of ``cycle_length`` epochs the factor falls
    linearly from near ``max_factor`` to ``min_factor``; the average takes the weights of each
    cycle's last epoch. ``t = ((epoch % L) + 1) / L``, ``f = (1 - t) * max + t * min``.
    """

    def __init__(self, min_factor: float = 0.01, max_factor: float = 1.0, cycle_length: int = 10):
        if cycle_length < 1:
            raise ValueError(f"cycle_length must be >= 1, got {cycle_length!r}")
        self.min_factor = float(min_factor)
        self.max_factor = float(max_factor)
        self.cycle_length = int(cycle_length)

    def init(self) -> Any:
        return None

    def factor(self, state, epoch: int, last_validation_loss: Optional[float]) -> Tuple[Any, float, bool]:
        k = epoch % self.cycle_length
        t = (k + 1) / self.cycle_length
        return state, (1 - t) * self.max_factor + t * self.min_factor, k == self.cycle_length - 1
