"""The reference training loops: lamp's ``IOLoops.epochs``, ``SWA.epochs`` and ``withSWA`` on torch.

The step is apart from the loop: a *step* is ``step(model, batch) -> (loss,
n)`` (a scalar loss tensor to differentiate and the batch's example count);
:func:`supervised_step` makes one from a loss function. The loops drive it
over batch streams, validate, schedule the learning rate, keep the
min-validation model, average weights (SWA), checkpoint after every epoch
and resume exactly. See ``docs/LOOPS.md``.
"""
from __future__ import annotations

import copy
import dataclasses
import logging
import math
import os
import sys
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from ..record import TrainingRecorder, weights_sha256, save_model_file, validate_dataset_params
from ..torch import check_optimizer_state, optimizer_state_from_parts, optimizer_state_parts, to_numpy
from . import checkpoint as _ck
from .state import set_rng_state
from .schedules import CyclicSWA, Noop
from .state import Events, State

__all__ = [
    "TrainingLoopContext",
    "LoopResult",
    "Minibatches",
    "supervised_step",
    "epochs",
    "swa_epochs",
    "with_swa",
]

log = logging.getLogger("tensorlist.loops")


@dataclasses.dataclass(frozen=True)
class TrainingLoopContext:
    """What a batch-stream factory gets each epoch (lamp's ``TrainingLoopContext``)."""

    epoch: int
    last_validation_loss: Optional[float]
    min_validation_loss: Optional[float]


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


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, (torch.nn.parallel.DistributedDataParallel,
                                              torch.nn.DataParallel)) else model


def _dist() -> Tuple[bool, int]:
    import torch.distributed as d

    if d.is_available() and d.is_initialized():
        return True, d.get_rank()
    return False, 0


def _is_empty(batch) -> bool:
    if batch is None:
        return True
    first = batch[0] if isinstance(batch, (tuple, list)) and len(batch) else batch
    if isinstance(batch, (tuple, list)) and not batch:
        return True
    return isinstance(first, torch.Tensor) and first.dim() > 0 and first.shape[0] == 0


def _stream(source, ctx: TrainingLoopContext):
    it = source(ctx) if callable(source) and not hasattr(source, "__iter__") else source
    sampler = getattr(it, "sampler", None)
    if hasattr(sampler, "set_epoch"):
        sampler.set_epoch(ctx.epoch)
    elif hasattr(it, "set_epoch"):
        it.set_epoch(ctx.epoch)
    return it


def _settings(source) -> dict:
    if hasattr(source, "settings"):
        return source.settings()
    if all(hasattr(source, a) for a in ("batch_size", "drop_last", "sampler")):
        from ..record import loader_settings

        return loader_settings(source)
    return {"batch_size": None, "shuffle": None, "drop_last": False, "sampler": None}


def _progress(progress: Optional[bool]) -> bool:
    if progress is not None:
        return progress
    return sys.stderr.isatty()


def _tqdm(iterable=None, **kw):
    from tqdm.auto import tqdm

    return tqdm(iterable, **kw)


def _float_or_none(v) -> Optional[float]:
    return None if v is None else float(v)


class _Config:
    """Everything a phase needs; made once by the public functions."""

    def __init__(self, **kw):
        self.__dict__.update(kw)


def _module_state(module) -> Dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in module.state_dict().items()}


def _clone_state(module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


def _np(d: Mapping[str, torch.Tensor]) -> Dict[str, np.ndarray]:
    return {k: to_numpy(v) for k, v in d.items()}


def _load_model(module, arrays: Mapping[str, np.ndarray], where: str) -> None:
    own = module.state_dict()
    missing = [k for k in own if k not in arrays]
    unexpected = [k for k in arrays if k not in own]
    wrong = [f"{k}: checkpoint {list(arrays[k].shape)} vs model {list(own[k].shape)}"
             for k in own if k in arrays and tuple(arrays[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or wrong:
        raise ValueError(f"{where}: the checkpoint holds another model (missing {missing}, unexpected "
                         f"{unexpected}, wrong shapes {wrong})")
    from ..torch import from_numpy

    module.load_state_dict({k: from_numpy(np.asarray(a)) for k, a in arrays.items()})


def _optimizer_sd(arrays, meta, optimizer, where):
    from ..torch import from_numpy

    if meta is None:
        raise ValueError(f"{where}: the checkpoint's optimizer list has no metadata (not written by tensorlist.loops)")
    sd = optimizer_state_from_parts({k: from_numpy(np.asarray(a)) for k, a in arrays.items()}, meta)
    check_optimizer_state(optimizer, sd, where=where)
    return sd


class _Run:
    """One run of a loop: shared by the simple and the SWA phases."""

    def __init__(self, cfg: _Config):
        self.cfg = cfg
        self.module = _unwrap(cfg.model)
        self.distributed, self.rank = _dist()
        self.files: Dict[str, str] = {}
        self.base_lrs = [g.get("initial_lr", g["lr"]) for g in cfg.optimizer.param_groups]
        dp = cfg.dataset_params if cfg.dataset_params is not None else {"name": None}
        validate_dataset_params(dp, field_prefix="dataset_params")
        self.dataset_params = dp
        validation = None
        if cfg.validation is not None:
            validation = {"loader": _settings(cfg.validation), "every": cfg.validation_frequency}
        loss = getattr(cfg.step, "loss_fn", None)
        sched = cfg.lr_scheduler if cfg.lr_scheduler is not None else cfg.schedule
        self.recorder = TrainingRecorder(
            self.module, cfg.optimizer, loss=loss, train_loader=_settings(cfg.train), epochs=cfg.epochs_asked,
            scheduler=sched, scheduler_step="epoch", seed=cfg.seed,
            initial_weights=cfg.initial_weights, validation=validation, solver=cfg.solver,
            solver_params=cfg.solver_params,
        )

    # --- events -----------------------------------------------------------
    def fire(self, event: Events, state: State) -> None:
        for h in self.cfg.handlers.get(event, ()):
            h(state)

    # --- learning rate ----------------------------------------------------
    def set_factor(self, factor: float) -> None:
        if self.cfg.lr_scheduler is not None:
            return  # the torch scheduler owns the rates; the factor schedule can still stop
        for g, base in zip(self.cfg.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * factor

    # --- one epoch --------------------------------------------------------
    def epoch_at(self, state: State, factor: float) -> Tuple[TrainingLoopContext, float]:
        """Trains the epoch ``state.epoch`` at learning-rate ``factor`` (both loops' common part).

        Fires EPOCH_STARTED and the training callback; returns (context, training loss).
        """
        state.factor = factor
        self.set_factor(factor)
        ctx = TrainingLoopContext(state.epoch, state.last_validation_loss, state.min_validation_loss)
        self.fire(Events.EPOCH_STARTED, state)
        train_loss = self.train_epoch(state, ctx)
        state.training_loss = train_loss
        if self.cfg.training_callback is not None:
            self.cfg.training_callback(state.epoch, train_loss, self.cfg.model)
        return ctx, train_loss

    def _reduce(self, total: float, count: int) -> Tuple[float, int]:
        if self.distributed:
            import torch.distributed as d

            t = torch.tensor([total, float(count)], dtype=torch.float64)
            d.all_reduce(t)
            total, count = float(t[0]), int(t[1])
        return total, count

    def train_epoch(self, state: State, ctx: TrainingLoopContext) -> float:
        cfg = self.cfg
        model, opt, n_acc = cfg.model, cfg.optimizer, max(1, cfg.accumulate_gradient_over_n_batches)
        model.train()
        total, count, pending = 0.0, 0, 0
        stream = _stream(cfg.train, ctx)
        bar = None
        if _progress(cfg.progress) and self.rank == 0:
            stream = bar = _tqdm(stream, desc=f"{state.phase} epoch {state.epoch}", leave=False, unit="batch")
        opt.zero_grad(set_to_none=True)
        for batch in stream:
            if _is_empty(batch):
                continue  # lamp's EmptyBatch: skipped, not counted
            loss, n = cfg.step(model, batch)
            loss.backward()
            pending += 1
            if pending == n_acc:
                opt.step()
                opt.zero_grad(set_to_none=True)
                pending = 0
            value = float(loss.detach())
            total += value * n
            count += n
            state.iteration += 1
            state.batch_loss = value
            self.fire(Events.ITERATION_COMPLETED, state)
        if pending:  # a short last group still steps (lamp leaves its gradients behind)
            opt.step()
            opt.zero_grad(set_to_none=True)
        if bar is not None:
            bar.close()
        total, count = self._reduce(total, count)
        return total / count if count else math.nan

    def validate(self, state: State, ctx: TrainingLoopContext) -> float:
        cfg = self.cfg
        cfg.model.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for batch in _stream(cfg.validation, ctx):
                if _is_empty(batch):
                    continue
                loss, n = cfg.step(cfg.model, batch)
                total += float(loss) * n
                count += n
        total, count = self._reduce(total, count)
        return total / count if count else math.nan

    # --- checkpoints and model files -----------------------------------------
    def record_meta(self, kind: str, weights: Mapping[str, np.ndarray], epoch: Optional[int] = None,
                    value: Optional[float] = None) -> dict:
        rec = self.recorder.record("checkpoint" if kind == "checkpoint" else kind, epoch=epoch)
        if value is not None:
            rec["weights"]["validation"] = value
        rec["weights"]["sha256"] = weights_sha256(weights)
        return {"training": rec, "dataset_params": copy.deepcopy(dict(self.dataset_params))}

    def optimizer_parts(self):
        tensors, meta = optimizer_state_parts(self.cfg.optimizer.state_dict())
        return _np(tensors), meta

    def write(self, document: dict) -> None:
        if self.cfg.checkpoint is None:
            return
        if self.rank == 0:
            _ck.write_checkpoint(self.cfg.checkpoint, document)
            self.files["checkpoint"] = os.fspath(self.cfg.checkpoint)
            log.debug("checkpoint written: %s", self.cfg.checkpoint)
        if self.distributed:
            import torch.distributed as d

            d.barrier()

    def save_model(self, name: str, kind: str, weights: Mapping[str, torch.Tensor], epoch: int,
                   value: Optional[float] = None) -> None:
        if self.cfg.out_dir is None or self.rank != 0:
            return
        path = os.path.join(self.cfg.out_dir, name)
        rec = self.recorder.record(kind, epoch=epoch)
        if value is not None:
            rec["weights"]["validation"] = value
        save_model_file(path, _np(weights), training=rec, dataset_params=self.dataset_params)
        self.files[kind] = path


def _swa_average_into(averaged, module) -> None:
    with torch.no_grad():
        for p_avg, p in zip(averaged.module.parameters(), module.parameters()):
            p.copy_(p_avg)


def _run_simple(run: _Run, state: State, min_model: Optional[Dict[str, torch.Tensor]],
                wrap: Callable[[dict], dict]) -> Tuple[int, Optional[Dict[str, torch.Tensor]]]:
    """lamp's ``epochs`` loop from ``state`` on; returns (epoch of the returned model, min model)."""
    cfg = run.cfg
    epochs_bar = None
    if _progress(cfg.progress) and run.rank == 0:
        epochs_bar = _tqdm(total=cfg.max_epochs, initial=state.epoch, desc="epochs", unit="epoch")
    try:
        while True:
            next_lr, factor = cfg.schedule.factor(state.schedule_state, state.epoch, state.last_validation_loss)
            if state.epoch >= cfg.max_epochs or factor <= 0 or state.should_stop:
                if factor <= 0:
                    log.info("learning-rate schedule stopped training before epoch %d (factor %s)", state.epoch, factor)
                break
            ctx, train_loss = run.epoch_at(state, factor)
            smoothed = raw = None
            if cfg.validation is not None and state.epoch % cfg.validation_frequency == 0:
                raw = run.validate(state, ctx)
                a = cfg.smoothing
                prev = state.last_validation_loss
                smoothed = raw * a + (prev if prev is not None else raw) * (1 - a)
                state.validation_loss, state.raw_validation_loss = smoothed, raw
                if cfg.validation_callback is not None:  # once, with the smoothed loss (lamp: twice)
                    cfg.validation_callback(state.epoch, smoothed, cfg.model)
                run.fire(Events.VALIDATION_COMPLETED, state)
                if cfg.min_epochs is True or state.epoch in cfg.min_epochs:
                    if state.min_validation_loss is None or smoothed < state.min_validation_loss:
                        min_model = _clone_state(run.module)
                        state.min_validation_epoch = state.epoch
                    state.min_validation_loss = (smoothed if state.min_validation_loss is None
                                                 else min(state.min_validation_loss, smoothed))
            state.learning_curve.append((state.epoch, train_loss, smoothed, raw))
            run.recorder.epoch_done(train_loss, validation=smoothed)
            if cfg.lr_scheduler is not None:
                cfg.lr_scheduler.step()
            log.info("epoch %d: training loss %.6g%s", state.epoch, train_loss,
                     "" if smoothed is None else f", validation loss {smoothed:.6g} (raw {raw:.6g})")
            state.epoch += 1
            state.last_validation_loss = smoothed
            state.schedule_state = next_lr
            run.fire(Events.EPOCH_COMPLETED, state)
            if cfg.checkpoint is not None:
                run.write(wrap(_simple_doc(run, state, min_model)))
                run.fire(Events.CHECKPOINT_SAVED, state)
            if epochs_bar is not None:
                epochs_bar.update(1)
                epochs_bar.set_postfix(train=f"{train_loss:.4g}", valid="-" if smoothed is None else f"{smoothed:.4g}")
    finally:
        if epochs_bar is not None:
            epochs_bar.close()
    if min_model is not None:
        run.module.load_state_dict(min_model)
        return state.min_validation_epoch, min_model
    return state.epoch - 1, None


def _simple_doc(run: _Run, state: State, min_model) -> dict:
    weights = _np(_module_state(run.module))
    opt_t, opt_meta = run.optimizer_parts()
    doc = _ck.phase_document("simple", model=weights, model_meta=run.record_meta("checkpoint", weights),
                             optimizer=opt_t, optimizer_meta=opt_meta, state=state,
                             min_model=None if min_model is None else _np(min_model))
    return doc


def _extras(run: _Run, state: State, phase: str, simple_sched=None, swa_sched=None) -> dict:
    sch = run.cfg.lr_scheduler
    return _ck.extension(phase=phase, state=state, base_lrs=run.base_lrs,
                      lr_scheduler_state=None if sch is None else sch.state_dict(),
                      simple_schedule_state=simple_sched, swa_schedule_state=swa_sched)


def _finish_doc(run: _Run, typ: str, body: dict, ext: dict, meta: dict) -> dict:
    doc = {"type": typ}
    doc.update(body)
    doc["tensorlist"] = ext
    doc["training"] = meta["training"]
    doc["dataset_params"] = meta["dataset_params"]
    return doc


def _restore_common(run: _Run, ext: Mapping, doc: Mapping, where: str) -> None:
    if not isinstance(ext, Mapping) or ext.get("format") != _ck.LOOP_STATE_FORMAT:
        raise ValueError(f"{where}: no {_ck.LOOP_STATE_FORMAT!r} extension: a lamp checkpoint or one of "
                         "another program cannot be resumed exactly")
    if len(ext["baseLearningRates"]) != len(run.cfg.optimizer.param_groups):
        raise ValueError(f"{where}: {len(ext['baseLearningRates'])} parameter groups saved, the optimizer has "
                         f"{len(run.cfg.optimizer.param_groups)}")
    run.base_lrs = list(ext["baseLearningRates"])
    if run.cfg.lr_scheduler is not None:
        if ext.get("lrScheduler") is None:
            raise ValueError(f"{where}: the checkpoint has no LR scheduler state, but an lr_scheduler was given")
        run.cfg.lr_scheduler.load_state_dict(ext["lrScheduler"])
    if "training" in doc:
        run.recorder.resume(doc["training"])


def _restore_phase(run: _Run, phase: Mapping, kind: str, where: str) -> Tuple[State, Optional[dict]]:
    _load_model(run.module, phase["model"], where)
    sd = _optimizer_sd(phase["optimizer"], phase.get("optimizerMetadata"), run.cfg.optimizer, where)
    state = _ck.state_from_phase(phase, kind)
    min_model = None
    if kind == "simple" and phase.get("minValidationLossModel") is not None:
        from ..torch import from_numpy

        min_model = {k: from_numpy(np.array(a)) for k, a in phase["minValidationLossModel"][1].items()}
    run.cfg.optimizer.load_state_dict(sd)
    return state, min_model


def _make_config(model, optimizer, train, *, step, loss_fn, max_epochs, validation, training_callback,
                 validation_callback, checkpoint, out_dir, validation_frequency, return_min_validation_loss_model,
                 learning_rate_schedule, lr_scheduler, accumulate_gradient_over_n_batches,
                 validation_loss_exponential_smoothing_factor, handlers, progress, dataset_params, seed,
                 initial_weights, solver, solver_params, epochs_asked, device=None) -> _Config:
    if device is not None:
        model.to(device)
    if step is None:
        if loss_fn is None:
            raise TypeError("give step= (step(model, batch) -> (loss, n)) or loss_fn=")
        step = supervised_step(loss_fn, device)
    if validation_frequency < 1:
        raise ValueError(f"validation_frequency must be >= 1, got {validation_frequency!r}")
    if not 0 < validation_loss_exponential_smoothing_factor <= 1:
        raise ValueError("validation_loss_exponential_smoothing_factor must be in (0, 1], got "
                         f"{validation_loss_exponential_smoothing_factor!r}")
    rm = return_min_validation_loss_model
    min_epochs = True if rm is True else frozenset(int(e) for e in (rm or ()))
    if out_dir is not None:
        os.makedirs(out_dir, exist_ok=True)
        if checkpoint is None:
            checkpoint = os.path.join(out_dir, "checkpoint.json")
    hs: Dict[Events, List[Callable]] = {}
    for ev, fns in (handlers or {}).items():
        hs[Events(ev)] = list(fns) if isinstance(fns, (list, tuple)) else [fns]
    return _Config(model=model, optimizer=optimizer, train=train, step=step, max_epochs=int(max_epochs),
                   validation=validation, training_callback=training_callback,
                   validation_callback=validation_callback, checkpoint=checkpoint, out_dir=out_dir,
                   validation_frequency=int(validation_frequency), min_epochs=min_epochs,
                   schedule=learning_rate_schedule or Noop(), lr_scheduler=lr_scheduler,
                   accumulate_gradient_over_n_batches=int(accumulate_gradient_over_n_batches),
                   smoothing=float(validation_loss_exponential_smoothing_factor), handlers=hs, progress=progress,
                   dataset_params=dataset_params, seed=seed, initial_weights=initial_weights, solver=solver,
                   solver_params=dict(solver_params or {}), epochs_asked=int(epochs_asked), device=device)


def _seed(seed: Optional[int]) -> None:
    """A fresh run with ``seed=`` seeds torch, numpy and ``random`` (a resumed one restores their states)."""
    if seed is None:
        return
    import random

    torch.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)


def _resume_path(resume, checkpoint) -> Optional[str]:
    if resume is None or resume is False:
        return None
    if resume is True:
        if checkpoint is None:
            raise ValueError("resume=True needs checkpoint= (or out_dir=)")
        return os.fspath(checkpoint) if os.path.exists(checkpoint) else None
    if not os.path.exists(resume):
        raise FileNotFoundError(f"checkpoint to resume from {os.fspath(resume)!r} does not exist")
    return os.fspath(resume)


_COMMON_DOC = """
    Args:
        model: the module (or a DistributedDataParallel wrapper: see docs/LOOPS.md).
        optimizer: a torch optimizer over the model's parameters.
        train: the training batches: an iterable re-iterated each epoch (a
            DataLoader, a list, :class:`Minibatches`), or a factory
            ``f(TrainingLoopContext) -> iterable`` called once per epoch.
            ``None`` or a batch with 0 examples is skipped; the stream's end
            ends the epoch.
        step: ``step(model, batch) -> (loss, n)``; default
            ``supervised_step(loss_fn)``.
        loss_fn: the loss for the default step.
        validation: validation batches (same forms as ``train``), or None.
        training_callback, validation_callback: ``f(epoch, loss, model)``,
            once per epoch / per validation (validation: the smoothed loss).
        checkpoint: the checkpoint path (default ``out_dir/checkpoint.json``).
        out_dir: where model files go (``final.json``,
            ``best_validation.json``); None: no model files.
        resume: True: continue from ``checkpoint`` if it exists; a path:
            continue from that checkpoint; None/False: start afresh.
        validation_frequency: validate when ``epoch % validation_frequency == 0``.
        learning_rate_schedule: a schedule from ``tensorlist.loops.schedules``
            (factor per epoch; a factor <= 0 stops). Default: factor 1.
        lr_scheduler: a torch LR scheduler stepped once per epoch instead
            (its state is checkpointed); the factor schedule then only stops.
        accumulate_gradient_over_n_batches: sum gradients over N batches per step.
        handlers: ``{Events.X: fn or [fns]}``, each called as ``fn(state)``.
        progress: tqdm bars; None: only when stderr is a terminal.
        dataset_params: the training data's record (stored in every model file).
        device: moves the model there; the default step moves each batch there.
        seed: seeds torch, numpy and ``random`` when a fresh run starts
            (a resumed run restores their states from the checkpoint); recorded.
        initial_weights, solver_params: for the training record.
"""


def epochs(model: torch.nn.Module, optimizer: torch.optim.Optimizer, train, *, max_epochs: int,
           step: Optional[Callable] = None, loss_fn: Optional[Callable] = None, validation=None,
           training_callback: Optional[Callable] = None, validation_callback: Optional[Callable] = None,
           checkpoint=None, out_dir=None, resume=None, validation_frequency: int = 1,
           return_min_validation_loss_model: Union[Sequence[int], bool] = (),
           learning_rate_schedule=None, lr_scheduler=None, accumulate_gradient_over_n_batches: int = 1,
           validation_loss_exponential_smoothing_factor: float = 1.0, handlers: Optional[Mapping] = None,
           progress: Optional[bool] = None, dataset_params: Optional[Mapping] = None, seed: Optional[int] = None,
           initial_weights: Optional[Mapping] = None, solver_params: Optional[Mapping] = None,
           device=None) -> LoopResult:
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
    cfg = _make_config(model, optimizer, train, step=step, loss_fn=loss_fn, max_epochs=max_epochs,
                       validation=validation, training_callback=training_callback,
                       validation_callback=validation_callback, checkpoint=checkpoint, out_dir=out_dir,
                       validation_frequency=validation_frequency,
                       return_min_validation_loss_model=return_min_validation_loss_model,
                       learning_rate_schedule=learning_rate_schedule, lr_scheduler=lr_scheduler,
                       accumulate_gradient_over_n_batches=accumulate_gradient_over_n_batches,
                       validation_loss_exponential_smoothing_factor=validation_loss_exponential_smoothing_factor,
                       handlers=handlers, progress=progress, dataset_params=dataset_params, seed=seed,
                       initial_weights=initial_weights, solver="tensorlist.loops.epochs",
                       solver_params=solver_params, epochs_asked=max_epochs, device=device)
    cfg.solver_params.update(_loop_params(cfg))
    run = _Run(cfg)
    state = State(phase="simple", max_epochs=cfg.max_epochs, schedule_state=cfg.schedule.init())
    min_model = None
    path = _resume_path(resume, cfg.checkpoint)
    if path is not None:
        doc = _ck.read_checkpoint(path)
        if doc["type"] != "SimpleLoopState":
            raise ValueError(f"{path}: a {doc['type']} checkpoint cannot resume epochs() (it needs a "
                             f"SimpleLoopState; use with_swa() or swa_epochs())")
        ext = doc.get("tensorlist")
        _restore_common(run, ext, doc, path)
        state, min_model = _restore_phase(run, doc, "simple", path)
        state.max_epochs = cfg.max_epochs
        state.iteration = int(ext.get("iteration", 0))
        state.schedule_state = ext.get("scheduleState")
        set_rng_state(ext["rngTensors"], ext["rng"])
        log.info("resumed from %s after %d epochs", path, state.epoch)
    else:
        _seed(seed)
    run.fire(Events.STARTED, state)

    def wrap(body):
        ext = _extras(run, state, "simple", simple_sched=state.schedule_state)
        return _finish_doc(run, "SimpleLoopState", body, ext, body["model"].metadata)

    epoch, min_model = _run_simple(run, state, min_model, wrap)
    _save_final(run, state, epoch, min_model)
    run.fire(Events.COMPLETED, state)
    return LoopResult(epoch, cfg.model, list(state.learning_curve), state.schedule_state, state, run.files)


def _loop_params(cfg) -> dict:
    return {"max_epochs": cfg.max_epochs, "validation_frequency": cfg.validation_frequency,
            "accumulate_gradient_over_n_batches": cfg.accumulate_gradient_over_n_batches,
            "validation_loss_exponential_smoothing_factor": cfg.smoothing,
            "return_min_validation_loss_model": True if cfg.min_epochs is True else sorted(cfg.min_epochs)}


def _save_final(run: _Run, state: State, epoch: int, min_model) -> None:
    if min_model is not None and state.min_validation_epoch is not None:
        run.save_model("best_validation.json", "best_validation", min_model, state.min_validation_epoch + 1,
                       value=state.min_validation_loss)
    done = run.recorder.epochs_done
    run.save_model("final.json", "final", _module_state(run.module), min(max(epoch + 1, 0), done))


# --------------------------------------------------------------------------
# SWA


def _run_swa(run: _Run, state: State, averaged, swa_schedule, swa_epochs_n: int, wrap, refresh_bn: bool) -> None:
    cfg = run.cfg
    from torch.optim.swa_utils import update_bn

    while True:
        next_s, factor, accumulate = swa_schedule.factor(state.schedule_state, state.epoch,
                                                         state.last_validation_loss)
        if state.epoch >= swa_epochs_n or factor <= 0 or state.should_stop:
            break
        ctx, train_loss = run.epoch_at(state, factor)
        valid = None
        if cfg.validation is not None and state.epoch % cfg.validation_frequency == 0:
            valid = run.validate(state, ctx)
            state.validation_loss = state.raw_validation_loss = valid
            if cfg.validation_callback is not None:
                cfg.validation_callback(state.epoch, valid, cfg.model)
            run.fire(Events.VALIDATION_COMPLETED, state)
            state.min_validation_loss = valid if state.min_validation_loss is None else min(state.min_validation_loss,
                                                                                          valid)
        if accumulate:
            averaged.update_parameters(run.module)
            state.number_of_averaged_models += 1
        state.learning_curve.append((state.epoch, train_loss, valid))
        run.recorder.epoch_done(train_loss, validation=valid)
        if cfg.lr_scheduler is not None:
            cfg.lr_scheduler.step()
        log.info("SWA epoch %d: training loss %.6g%s, factor %.4g%s", state.epoch, train_loss,
                 "" if valid is None else f", validation loss {valid:.6g}", factor,
                 ", averaged" if accumulate else "")
        state.epoch += 1
        state.last_validation_loss = valid
        state.schedule_state = next_s
        run.fire(Events.EPOCH_COMPLETED, state)
        if cfg.checkpoint is not None:
            run.write(wrap(_swa_doc(run, state, averaged)))
            run.fire(Events.CHECKPOINT_SAVED, state)
    if state.number_of_averaged_models > 0:
        _swa_average_into(averaged, run.module)
        if refresh_bn:
            ctx = TrainingLoopContext(state.epoch, state.last_validation_loss, state.min_validation_loss)
            batches = (b[0] if isinstance(b, (tuple, list)) else b for b in _stream(cfg.train, ctx)
                       if not _is_empty(b))
            update_bn(batches, run.module, device=cfg.device)
            if run.distributed:
                import torch.distributed as d

                for b in run.module.buffers():
                    d.broadcast(b, 0)


def _averaged_state(averaged) -> Dict[str, torch.Tensor]:
    return {k: v.detach() for k, v in averaged.module.state_dict().items()}


def _swa_doc(run: _Run, state: State, averaged) -> dict:
    weights = _np(_module_state(run.module))
    opt_t, opt_meta = run.optimizer_parts()
    avg = _np(_averaged_state(averaged)) if state.number_of_averaged_models > 0 else None
    return _ck.phase_document("swa", model=weights, model_meta=run.record_meta("checkpoint", weights),
                              optimizer=opt_t, optimizer_meta=opt_meta, state=state,
                              averaged=avg)


def _new_averaged(module):
    from torch.optim.swa_utils import AveragedModel

    return AveragedModel(module)


def _restore_averaged(averaged, phase: Mapping, state: State, where: str) -> None:
    if state.number_of_averaged_models > 0:
        if phase.get("averagedModels") is None:
            raise ValueError(f"{where}: numberOfAveragedModels > 0 but no averagedModels")
        _load_model(averaged.module, phase["averagedModels"], where + " (averagedModels)")
    averaged.n_averaged.fill_(state.number_of_averaged_models)


def swa_epochs(model, optimizer, train, *, max_epochs: int, swa_schedule=None, step=None, loss_fn=None,
               validation=None, training_callback=None, validation_callback=None, checkpoint=None, out_dir=None,
               resume=None, validation_frequency: int = 1, lr_scheduler=None,
               accumulate_gradient_over_n_batches: int = 1, forward_pass_after_training: bool = True,
               handlers=None, progress=None, dataset_params=None, seed=None, initial_weights=None,
               solver_params=None, device=None) -> LoopResult:
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
    swa_schedule = swa_schedule or CyclicSWA()
    cfg = _make_config(model, optimizer, train, step=step, loss_fn=loss_fn, max_epochs=max_epochs,
                       validation=validation, training_callback=training_callback,
                       validation_callback=validation_callback, checkpoint=checkpoint, out_dir=out_dir,
                       validation_frequency=validation_frequency, return_min_validation_loss_model=(),
                       learning_rate_schedule=swa_schedule, lr_scheduler=lr_scheduler,
                       accumulate_gradient_over_n_batches=accumulate_gradient_over_n_batches,
                       validation_loss_exponential_smoothing_factor=1.0, handlers=handlers, progress=progress,
                       dataset_params=dataset_params, seed=seed, initial_weights=initial_weights,
                       solver="tensorlist.loops.swa_epochs", solver_params=solver_params, epochs_asked=max_epochs,
                       device=device)
    cfg.solver_params.update(_loop_params(cfg))
    run = _Run(cfg)
    averaged = _new_averaged(run.module)
    state = State(phase="swa", max_epochs=cfg.max_epochs, schedule_state=swa_schedule.init())
    path = _resume_path(resume, cfg.checkpoint)
    if path is not None:
        doc = _ck.read_checkpoint(path)
        if doc["type"] != "SWALoopState":
            raise ValueError(f"{path}: a {doc['type']} checkpoint cannot resume swa_epochs() (it needs a "
                             "SWALoopState)")
        ext = doc.get("tensorlist")
        _restore_common(run, ext, doc, path)
        state, _ = _restore_phase(run, doc, "swa", path)
        state.max_epochs = cfg.max_epochs
        state.iteration = int(ext.get("iteration", 0))
        state.schedule_state = ext.get("swaScheduleState")
        _restore_averaged(averaged, doc, state, path)
        set_rng_state(ext["rngTensors"], ext["rng"])
    else:
        _seed(seed)
    run.fire(Events.STARTED, state)

    def wrap(body):
        ext = _extras(run, state, "swa", swa_sched=state.schedule_state)
        return _finish_doc(run, "SWALoopState", body, ext, body["model"].metadata)

    _run_swa(run, state, averaged, swa_schedule, cfg.max_epochs, wrap, forward_pass_after_training)
    run.save_model("final.json", "final", _module_state(run.module), run.recorder.epochs_done)
    run.fire(Events.COMPLETED, state)
    return LoopResult(state.epoch - 1, cfg.model, list(state.learning_curve), state.schedule_state, state, run.files)


def with_swa(model, optimizer, train, *, warmup_epochs: int, swa_epochs: int, step=None, loss_fn=None,
             validation=None, training_callback=None, validation_callback=None, checkpoint=None, out_dir=None,
             resume=None, return_min_validation_loss_model: Union[Sequence[int], bool] = (),
             learning_rate_schedule=None, swa_schedule=None, lr_scheduler=None,
             accumulate_gradient_over_n_batches: int = 1, forward_pass_after_training: bool = True,
             validation_loss_exponential_smoothing_factor: float = 1.0, handlers=None, progress=None,
             dataset_params=None, seed=None, initial_weights=None, solver_params=None, device=None) -> LoopResult:
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
    from .schedules import Decrement

    learning_rate_schedule = learning_rate_schedule or Decrement(20, 0.5)
    swa_schedule = swa_schedule or CyclicSWA()
    cfg = _make_config(model, optimizer, train, step=step, loss_fn=loss_fn, max_epochs=warmup_epochs,
                       validation=validation, training_callback=training_callback,
                       validation_callback=validation_callback, checkpoint=checkpoint, out_dir=out_dir,
                       validation_frequency=1, return_min_validation_loss_model=return_min_validation_loss_model,
                       learning_rate_schedule=learning_rate_schedule, lr_scheduler=lr_scheduler,
                       accumulate_gradient_over_n_batches=accumulate_gradient_over_n_batches,
                       validation_loss_exponential_smoothing_factor=validation_loss_exponential_smoothing_factor,
                       handlers=handlers, progress=progress, dataset_params=dataset_params, seed=seed,
                       initial_weights=initial_weights, solver="tensorlist.loops.with_swa",
                       solver_params=solver_params, epochs_asked=warmup_epochs + swa_epochs, device=device)
    cfg.solver_params.update(_loop_params(cfg))
    cfg.solver_params.update({"warmup_epochs": int(warmup_epochs), "swa_epochs": int(swa_epochs)})
    run = _Run(cfg)
    averaged = None
    simple = State(phase="simple", max_epochs=int(warmup_epochs), schedule_state=learning_rate_schedule.init())
    swa = None
    min_model = None
    path = _resume_path(resume, cfg.checkpoint)
    if path is not None:
        doc = _ck.read_checkpoint(path)
        if doc["type"] != "SimpleThenSWALoopState":
            raise ValueError(f"{path}: a {doc['type']} checkpoint cannot resume with_swa() (it needs a "
                             "SimpleThenSWALoopState)")
        ext = doc.get("tensorlist")
        _restore_common(run, ext, doc, path)
        if doc.get("swa") is None:
            simple, min_model = _restore_phase(run, doc["simple"], "simple", path)
            simple.max_epochs = int(warmup_epochs)
        else:
            simple = _ck.state_from_phase(doc["simple"], "simple")
            swa, _ = _restore_phase(run, doc["swa"], "swa", path)
            swa.max_epochs = int(swa_epochs)
            swa.schedule_state = ext.get("swaScheduleState")
            swa.iteration = int(ext.get("iteration", 0))
            averaged = _new_averaged(run.module)
            _restore_averaged(averaged, doc["swa"], swa, path)
        simple.schedule_state = ext.get("scheduleState")
        if swa is None:
            simple.iteration = int(ext.get("iteration", 0))
        set_rng_state(ext["rngTensors"], ext["rng"])
    else:
        _seed(seed)
    run.fire(Events.STARTED, simple if swa is None else swa)
    warm_epoch = -1
    if swa is None:
        def wrap_simple(body):
            ext = _extras(run, simple, "simple", simple_sched=simple.schedule_state)
            return _finish_doc(run, "SimpleThenSWALoopState", {"simple": body}, ext, body["model"].metadata)

        warm_epoch, warm_min = _run_simple(run, simple, min_model, wrap_simple)
        if warm_min is not None and simple.min_validation_epoch is not None:
            run.save_model("best_validation.json", "best_validation", warm_min, simple.min_validation_epoch + 1,
                           value=simple.min_validation_loss)
        swa = State(phase="swa", max_epochs=int(swa_epochs), schedule_state=swa_schedule.init())
        averaged = _new_averaged(run.module)
    else:
        warm_epoch = simple.min_validation_epoch if simple.min_validation_epoch is not None else simple.epoch - 1

    def wrap_swa(body):
        ext = _extras(run, swa, "swa", simple_sched=simple.schedule_state, swa_sched=swa.schedule_state)
        return _finish_doc(run, "SimpleThenSWALoopState", {"simple": _ck.empty_simple(simple), "swa": body}, ext,
                           body["model"].metadata)

    run.cfg.max_epochs = int(swa_epochs)
    _run_swa(run, swa, averaged, swa_schedule, int(swa_epochs), wrap_swa, forward_pass_after_training)
    run.save_model("final.json", "final", _module_state(run.module), run.recorder.epochs_done)
    shift = (max(e for e, *_ in simple.learning_curve) + 1) if simple.learning_curve else 0
    curve = list(simple.learning_curve) + [(e + shift, t, v, v) for e, t, v in swa.learning_curve]
    run.fire(Events.COMPLETED, swa)
    return LoopResult(warm_epoch, cfg.model, curve, swa.schedule_state, swa, run.files)


_RETURNS_DOC = """
    Returns:
        A :class:`LoopResult`.

    Raises:
        ValueError: a checkpoint of another model, optimizer or loop;
            nothing is overwritten then.
        FileNotFoundError: ``resume`` names a missing file.
"""

for _f in (epochs, swa_epochs, with_swa):
    _f.__doc__ = _f.__doc__.replace("\n    See the arguments below (shared by the three loops).\n    ", "") + _COMMON_DOC + _RETURNS_DOC
del _f
