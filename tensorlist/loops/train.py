"""The reference training loops: lamp's ``IOLoops.epochs``, ``SWA.epochs`` and ``withSWA`` on torch.

The step is apart from the loop (``loops.batches``). The loops drive it over
batch streams, validate, schedule the learning rate, keep the min-validation
model, average weights (SWA), checkpoint after every epoch and resume
exactly. This module holds the public functions and the two phases (lamp's
``epochs`` loop and the SWA loop); what they share is ``loops.config`` (the
parameters), ``loops.run`` (an epoch, its tail, resume, files) and
``loops.checkpoint`` (the document). See ``docs/LOOPS.md``.

Imports torch and ``loops.batches``, ``loops.config``, ``loops.run``, ``loops.state``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch.optim.swa_utils import AveragedModel, update_bn

from tensorlist.provenance.record import epoch_number
from tensorlist.torch import module_state
from tensorlist.loops.batches import Minibatches, TrainingLoopContext, batch_stream, is_empty, supervised_step
from tensorlist.loops.config import LoopConfig, shared_docs
from tensorlist.loops.run import Run, log
from tensorlist.loops.state import Events, State

__all__ = [
    "TrainingLoopContext",
    "LoopResult",
    "Minibatches",
    "supervised_step",
    "epochs",
    "swa_epochs",
    "with_swa",
]


@dataclasses.dataclass
class LoopResult:
    """What a loop returns (lamp's result tuple, named).

    Attributes:
        epoch: 0-based epoch of the returned weights (the min-validation epoch,
            or the last completed one; -1 when no epoch ran).
        model: the trained module (holding the returned weights).
        learning_curve: chronological; simple: ``(epoch, train, smoothed,
            raw)``, SWA: ``(epoch, train, valid)``.
        schedule_state: the learning-rate schedule's final state.
        state: the final :class:`State`.
        files: model files written: ``{"final": path, "best_validation":
            path, "checkpoint": path}`` (those that exist).
    """

    epoch: int
    model: torch.nn.Module
    learning_curve: List[tuple]
    schedule_state: Any
    state: State
    files: Dict[str, str] = dataclasses.field(default_factory=dict)



# --------------------------------------------------------------------------
# the phases


def _run_simple(run: Run) -> int:
    """lamp's ``epochs`` loop on ``run.simple`` from its epoch on; returns the epoch of the returned model.

    At the end the min-validation snapshot, if any, is loaded into the model.
    """
    cfg, state = run.cfg, run.simple
    limit = cfg.epochs_of("simple")
    bar = run.progress_bar(total=limit, initial=state.epoch, desc="epochs", unit="epoch") if run.progress() else None
    try:
        while True:
            next_lr, factor = cfg.schedule.factor(state.schedule_state, state.epoch, state.last_validation_loss)
            if state.epoch >= limit or factor <= 0 or state.should_stop:
                if factor <= 0:
                    log.info("learning-rate schedule stopped training before epoch %d (factor %s)",
                             epoch_number(run.recorder.epochs_done), factor)
                break
            ctx, train_loss = run.train_at(state, factor)
            smoothed = raw = None
            if run.validates(state):
                smoothed, raw = run.validate_epoch(state, ctx, cfg.smoothing)
                if cfg.min_epochs is True or state.epoch in cfg.min_epochs:
                    if state.min_validation_loss is None or smoothed < state.min_validation_loss:
                        run.min_model = {k: v.clone() for k, v in module_state(run.module).items()}
                        state.min_validation_epoch = state.epoch
                    state.min_validation_loss = (smoothed if state.min_validation_loss is None
                                                 else min(state.min_validation_loss, smoothed))
            run.end_epoch(state, (state.epoch, train_loss, smoothed, raw), smoothed, next_lr,
                          ("training loss %.6g%s", train_loss,
                           "" if smoothed is None else f", validation loss {smoothed:.6g} (raw {raw:.6g})"))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(train=f"{train_loss:.4g}", valid="-" if smoothed is None else f"{smoothed:.4g}")
    finally:
        if bar is not None:
            bar.close()
    if run.min_model is not None:
        run.module.load_state_dict(run.min_model)
        return state.min_validation_epoch
    return state.epoch - 1


def _run_swa(run: Run) -> None:
    """The SWA loop on ``run.swa`` and ``run.averaged`` from its epoch on; the average goes into the model."""
    cfg, state, averaged = run.cfg, run.swa, run.averaged
    limit = cfg.epochs_of("swa")
    while True:
        next_s, factor, accumulate = cfg.swa_schedule.factor(state.schedule_state, state.epoch,
                                                             state.last_validation_loss)
        if state.epoch >= limit or factor <= 0 or state.should_stop:
            break
        ctx, train_loss = run.train_at(state, factor)
        valid = None
        if run.validates(state):
            valid, _ = run.validate_epoch(state, ctx, None)  # SWA does not smooth
            state.min_validation_loss = valid if state.min_validation_loss is None else min(state.min_validation_loss,
                                                                                          valid)
        if accumulate:
            averaged.update_parameters(run.module)
            state.number_of_averaged_models += 1
        run.end_epoch(state, (state.epoch, train_loss, valid), valid, next_s,
                      ("training loss %.6g%s, factor %.4g%s", train_loss,
                       "" if valid is None else f", validation loss {valid:.6g}", factor,
                       ", averaged" if accumulate else ""))
    if state.number_of_averaged_models > 0:
        with torch.no_grad():
            for p_avg, p in zip(averaged.module.parameters(), run.module.parameters()):
                p.copy_(p_avg)
        if cfg.forward_pass_after_training:
            batches = (b[0] if isinstance(b, (tuple, list)) else b
                       for b in batch_stream(cfg.train, run.context(state)) if not is_empty(b))
            update_bn(batches, run.module, device=cfg.device)
            if run.distributed:
                for b in run.module.buffers():
                    dist.broadcast(b, 0)


def _start_swa(run: Run) -> None:
    """A fresh SWA phase: its state, and the running average starting from the weights now."""
    run.swa = State(phase="swa", max_epochs=run.cfg.epochs_of("swa"), schedule_state=run.cfg.swa_schedule.init())
    run.averaged = AveragedModel(run.module)


# --------------------------------------------------------------------------
# the loops


@shared_docs
def epochs(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train, *, max_epochs: int,
           step: Optional[Callable] = None, loss_fn: Optional[Callable] = None, validation=None,
           training_callback: Optional[Callable] = None, validation_callback: Optional[Callable] = None,
           checkpoint=None, out_dir=None, resume=None, checkpoint_format: str = "document",
           validation_frequency: int = 1, return_min_validation_loss_model: Union[Sequence[int], bool] = (),
           learning_rate_schedule=None, lr_scheduler=None, accumulate_gradient_over_n_batches: int = 1,
           validation_loss_exponential_smoothing_factor: float = 1.0, handlers: Optional[Mapping] = None,
           progress: Optional[bool] = None, dataset_params: Optional[Mapping] = None, seed: Optional[int] = None,
           initial_weights: Optional[Mapping] = None, solver_params: Optional[Mapping] = None,
           device=None, signing_key=None, encryption_key=None) -> LoopResult:
    """lamp's ``IOLoops.epochs``: train up to ``max_epochs`` epochs with validation, checkpoints and resume.

    Each epoch (0-based index ``e``): the schedule gives a factor (stop if
    ``e >= max_epochs`` or factor <= 0); train one epoch at ``base_lr *
    factor``; validate if ``e % validation_frequency == 0`` and smooth
    (``raw * a + last * (1 - a)``); if ``e`` is in
    ``return_min_validation_loss_model`` (a set of epochs, or True for all)
    and the smoothed loss is a new minimum, snapshot the weights; append to
    the learning curve; checkpoint (a ``SimpleLoopState``). At the end the
    min-validation snapshot, if any, is loaded into the model.

    See the arguments below (shared by the three loops).
    """
    run = Run(LoopConfig.from_arguments("epochs", locals()))
    run.simple = State(phase="simple", max_epochs=run.cfg.max_epochs, schedule_state=run.cfg.schedule.init())
    run.start()
    epoch = _run_simple(run)
    run.save_best()
    run.save_final(min(max(epoch + 1, 0), run.recorder.epochs_done))
    run.finish_checkpoints()
    state = run.simple
    run.fire(Events.COMPLETED, state)
    return LoopResult(epoch, run.cfg.model, list(state.learning_curve), state.schedule_state, state, run.files)


@shared_docs
def swa_epochs(model, optimizer, train, *, max_epochs: int, swa_schedule=None, step=None, loss_fn=None,
               validation=None, training_callback=None, validation_callback=None, checkpoint=None, out_dir=None,
               resume=None, checkpoint_format: str = "document", validation_frequency: int = 1, lr_scheduler=None,
               accumulate_gradient_over_n_batches: int = 1, forward_pass_after_training: bool = True,
               handlers=None, progress=None, dataset_params=None, seed=None, initial_weights=None,
               solver_params=None, device=None, signing_key=None, encryption_key=None) -> LoopResult:
    """lamp's ``SWA.epochs``: stochastic weight averaging with a constant or cyclic schedule.

    Each epoch: the SWA schedule gives ``(factor, accumulate)``; train at
    ``base_lr * factor``; validate (no smoothing); when ``accumulate``, add the
    weights to the running average (``torch.optim.swa_utils.AveragedModel``).
    At the end the averaged weights go into the model and, if
    ``forward_pass_after_training``, one forward pass over the training batches
    refreshes batch-norm statistics (``swa_utils.update_bn``). Checkpoints are
    ``SWALoopState`` documents, written after every epoch.

    See the arguments below (shared by the three loops).
    """
    run = Run(LoopConfig.from_arguments("swa_epochs", locals()))
    run.averaged = AveragedModel(run.module)  # before a resume: the average's buffers are the start's
    run.swa = State(phase="swa", max_epochs=run.cfg.max_epochs, schedule_state=run.cfg.swa_schedule.init())
    run.start()
    _run_swa(run)
    run.save_final()
    run.finish_checkpoints()
    state = run.swa
    run.fire(Events.COMPLETED, state)
    return LoopResult(state.epoch - 1, run.cfg.model, list(state.learning_curve), state.schedule_state, state,
                      run.files)


@shared_docs
def with_swa(model, optimizer, train, *, warmup_epochs: int, swa_epochs: int, step=None, loss_fn=None,
             validation=None, training_callback=None, validation_callback=None, checkpoint=None, out_dir=None,
             resume=None, checkpoint_format: str = "document",
             return_min_validation_loss_model: Union[Sequence[int], bool] = (), learning_rate_schedule=None, swa_schedule=None, lr_scheduler=None,
             accumulate_gradient_over_n_batches: int = 1, forward_pass_after_training: bool = True,
             validation_loss_exponential_smoothing_factor: float = 1.0, handlers=None, progress=None,
             dataset_params=None, seed=None, initial_weights=None, solver_params=None, device=None,
             signing_key=None, encryption_key=None) -> LoopResult:
    """lamp's ``IOLoops.withSWA``: ``warmup_epochs`` of :func:`epochs`, then ``swa_epochs`` of SWA.

    Validation runs every epoch in both phases (as in lamp). Checkpoints are
    ``SimpleThenSWALoopState`` documents: ``swa`` is absent during the warm-up;
    during SWA the ``simple`` part keeps the warm-up's curve and
    losses with empty model and optimizer lists (as lamp writes them). The
    warm-up's min-validation model, if any, is where SWA starts. The
    returned curve is the warm-up's followed by the SWA epochs shifted
    after it, with ``(v, v)`` as the SWA epochs' smoothed and raw validation.
    Default schedules as lamp: ``Decrement(20, 0.5)`` and ``CyclicSWA(0.01, 1, 10)``.

    See the arguments below (shared by the three loops).
    """
    run = Run(LoopConfig.from_arguments("with_swa", locals()))
    run.simple = State(phase="simple", max_epochs=run.cfg.max_epochs, schedule_state=run.cfg.schedule.init())
    run.start()
    simple = run.simple
    if run.swa is None:
        warm_epoch = _run_simple(run)
        run.save_best()
        _start_swa(run)
    else:
        warm_epoch = simple.min_validation_epoch if simple.min_validation_epoch is not None else simple.epoch - 1
    _run_swa(run)
    run.save_final()
    run.finish_checkpoints()
    swa = run.swa
    shift = (max(e for e, *_ in simple.learning_curve) + 1) if simple.learning_curve else 0
    curve = list(simple.learning_curve) + [(e + shift, t, v, v) for e, t, v in swa.learning_curve]
    run.fire(Events.COMPLETED, swa)
    return LoopResult(warm_epoch, run.cfg.model, curve, swa.schedule_state, swa, run.files)
