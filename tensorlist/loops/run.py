"""One run of a loop: the machinery ``epochs``, ``swa_epochs`` and ``with_swa`` share.

:class:`Run` holds what a run has besides its :class:`~.config.LoopConfig`:
the unwrapped module, the process group, the training recorder, the base
learning rates, the phases' states (``simple``, ``swa``), the min-validation
snapshot and the SWA average. It does the work common to the loops: training
and validating one epoch (:meth:`Run.train_at`, :meth:`Run.validate_epoch`),
the epoch tail (:meth:`Run.end_epoch`: learning curve, training record, torch
LR scheduler, log line, counters, events, checkpoint), checkpoints and model
files, and resuming from a checkpoint (:meth:`Run.restore`), one way for all
three loops and both checkpoint formats (a document from rank 0, or a sharded
DCP directory every rank writes: ``loops.sharded``, imported only then).

Imports torch, ``record``, ``torch`` (the adapters), ``_bridges.torch`` and
``loops.batches``, ``loops.checkpoint``, ``loops.config``, ``loops.state``
(and ``loops.sharded`` when a run uses sharded checkpoints).
"""
from __future__ import annotations

import copy
import logging
import math
import os
import sys
from typing import Dict, Mapping, Optional, Tuple

import numpy as np
import torch
import torch.distributed as dist
from torch.optim.swa_utils import AveragedModel

from tensorlist._base.states import check_like, check_rng_state
from tensorlist._base.terminal import raw_stream
from tensorlist._bridges.torch import from_numpy, state_to_numpy
from tensorlist.errors import FormatError, short_repr
from tensorlist.provenance.record import TrainingRecorder, anchor_paths, epoch_number, save_model_file, weights_sha256
from tensorlist.provenance.signing import signed_save
from tensorlist.torch import check_optimizer_state, match_state, module_state, optimizer_state_from_parts, optimizer_state_parts
from tensorlist.loops.batches import TrainingLoopContext, batch_stream, is_empty, stream_settings
from tensorlist.loops.checkpoint import (CHECKPOINT_TYPES, LOOP_STATE_FORMAT, dcp_ref, empty_simple, extension,
                         is_sharded_checkpoint, loop_document, phase_document, phase_parts, read_checkpoint,
                         read_sharded_loop_state, sharded_checkpoint_exists, state_from_phase, write_checkpoint)
from tensorlist.loops.config import LoopConfig
from tensorlist.loops.state import Events, State, check_rng_state_json, seed_rngs, set_rng_state

__all__ = ["Run", "log"]

log = logging.getLogger("tensorlist.loops")


def _unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.module if isinstance(model, (torch.nn.parallel.DistributedDataParallel,
                                              torch.nn.DataParallel)) else model


def _process_group() -> Tuple[bool, int]:
    if dist.is_available() and dist.is_initialized():
        return True, dist.get_rank()
    return False, 0


def _is_dtensor(t) -> bool:
    """A DTensor (FSDP2's parameters), told by its method: torch.distributed.tensor is not imported for it."""
    return callable(getattr(t, "full_tensor", None))


class _WholeWeights(dict):
    """What the training recorder reads of a module with DTensor state: the whole weights, gathered from
    every rank (collective), and the module's parameter names."""

    def __init__(self, module: torch.nn.Module):
        super().__init__((k, v.full_tensor() if _is_dtensor(v) else v) for k, v in module_state(module).items())
        self.named_parameters = module.named_parameters


def _check_model(module: torch.nn.Module, arrays: Mapping[str, np.ndarray], where: str) -> None:
    """Refuses a checkpoint's weights that are not ``module``'s (names and shapes, both ways)."""
    m = match_state(module.state_dict(), arrays)
    if not m.complete:
        wrong = [f"{k}: checkpoint {list(saved)} vs model {list(own)}" for k, saved, own in m.mismatched]
        raise ValueError(f"{where}: the checkpoint holds another model (missing {list(m.missing)}, unexpected "
                         f"{list(m.unexpected)}, wrong shapes {wrong})")


def _load_model(module: torch.nn.Module, arrays: Mapping[str, np.ndarray]) -> None:
    module.load_state_dict({k: from_numpy(np.asarray(a)) for k, a in arrays.items()})


class Run:
    """One run of a loop (see the module docstring); made by the public loop functions."""

    def __init__(self, cfg: LoopConfig):
        self.cfg = cfg
        if cfg.device is not None:
            cfg.model.to(cfg.device)
        if cfg.out_dir is not None:
            os.makedirs(cfg.out_dir, exist_ok=True)
        self.module = _unwrap(cfg.model)
        self.distributed, self.rank = _process_group()
        self.files: Dict[str, str] = {}
        self.base_lrs = [g.get("initial_lr", g["lr"]) for g in cfg.optimizer.param_groups]
        self.simple: Optional[State] = None  # the phases' states, as far as the loop has them
        self.swa: Optional[State] = None
        self.min_model: Optional[Dict[str, torch.Tensor]] = None
        self.averaged: Optional[AveragedModel] = None
        self._store = None  # the sharded checkpoint's writer (loops.sharded), made at the first save
        validation = None
        if cfg.validation is not None:
            validation = {"loader": stream_settings(cfg.validation), "every": cfg.validation_frequency}
        sched = cfg.lr_scheduler if cfg.lr_scheduler is not None else cfg.schedule
        recorded = self.module
        if any(_is_dtensor(v) for v in self.module.state_dict().values()):  # FSDP2
            if cfg.checkpoint is not None and cfg.checkpoint_format != "sharded":
                raise ValueError("the model's state is sharded (DTensors, e.g. FSDP2): pass checkpoint_format="
                                 "'sharded' (a checkpoint document holds whole tensors only)")
            if cfg.loop != "epochs":
                raise ValueError(f"{cfg.loop}() cannot average a model whose state is sharded (DTensors, e.g. "
                                 "FSDP2): torch's AveragedModel deep-copies the module, which FSDP2 refuses")
            recorded = _WholeWeights(self.module)
        self.recorder = TrainingRecorder(
            recorded, cfg.optimizer, loss=getattr(cfg.step, "loss_fn", None),
            train_loader=stream_settings(cfg.train), epochs=cfg.epochs_asked, scheduler=sched, scheduler_step="epoch", seed=cfg.seed,
            initial_weights=cfg.initial_weights, validation=validation, solver=cfg.solver,
            solver_params=dict(cfg.solver_params), encryption_key=cfg.encryption_key,
        )

    def progress(self) -> bool:
        """Whether this process shows progress bars (rank 0, and ``progress`` or a terminal)."""
        shown = self.cfg.progress if self.cfg.progress is not None else sys.stderr.isatty()
        return shown and self.rank == 0

    @staticmethod
    def progress_bar(iterable=None, **kw):
        """A tqdm bar."""
        from tqdm.auto import tqdm  # an optional dependency: imported only when bars are on

        return tqdm(iterable, **{"file": raw_stream(sys.stderr), **kw})  # its "\r" raw under the CLI's escaping

    # --- start ------------------------------------------------------------------
    def start(self) -> None:
        """Resumes from the checkpoint ``resume`` names, or seeds a fresh run; then fires STARTED."""
        path = self.resume_path()
        if path is not None:
            self.restore(path)
        else:
            seed_rngs(self.cfg.seed)
        self.fire(Events.STARTED, self.swa if self.swa is not None else self.simple)

    def resume_path(self) -> Optional[str]:
        resume, checkpoint = self.cfg.resume, self.cfg.checkpoint
        if resume is None or resume is False:
            return None
        if resume is True:
            if checkpoint is None:
                raise ValueError("resume=True needs checkpoint= (or out_dir=)")
            if is_sharded_checkpoint(checkpoint):  # a directory: resumable once a save has committed
                return os.fspath(checkpoint) if sharded_checkpoint_exists(checkpoint) else None
            return os.fspath(checkpoint) if os.path.exists(checkpoint) else None
        if not os.path.exists(resume):
            raise FileNotFoundError(f"checkpoint to resume from {os.fspath(resume)!r} does not exist")
        return os.fspath(resume)

    def _check_loop_state(self, doc: Mapping, path: str):
        """The checks of a checkpoint's loop state (either format); returns (extension, kind, phase, simple part)."""
        cfg = self.cfg
        wanted = CHECKPOINT_TYPES[cfg.loop]
        if doc["type"] != wanted:
            hint = "; use with_swa() or swa_epochs()" if cfg.loop == "epochs" else ""
            raise ValueError(f"{path}: a {doc['type']} checkpoint cannot resume {cfg.loop}() (it needs a "
                             f"{wanted}{hint})")
        ext = doc.get("tensorlist")
        if not isinstance(ext, Mapping) or ext.get("format") != LOOP_STATE_FORMAT:
            raise ValueError(f"{path}: no {LOOP_STATE_FORMAT!r} extension: a lamp checkpoint or one of "
                             "another program cannot be resumed exactly")
        groups = cfg.optimizer.param_groups
        rates = ext.get("baseLearningRates")
        check_like(rates, [0.0] * (len(rates) if isinstance(rates, list) else 0), file=path,
                   field="tensorlist.baseLearningRates")
        if not isinstance(ext.get("iteration", 0), int) or isinstance(ext.get("iteration"), bool):
            raise FormatError(f"must be an integer, got {short_repr(ext.get('iteration'))}", file=path,
                              field="tensorlist.iteration")
        for part in phase_parts(doc):
            if part is not None and (not isinstance(part, Mapping) or type(part.get("epoch")) is not int
                                     or type(part.get("numberOfAveragedModels", 0)) is not int):
                raise FormatError("a phase's epoch and numberOfAveragedModels must be integers", file=path,
                                  field="epoch")
        if cfg.lr_scheduler is not None and ext.get("lrScheduler") is not None:
            check_like(ext["lrScheduler"], cfg.lr_scheduler.state_dict(), file=path, field="tensorlist.lrScheduler")
        if len(ext["baseLearningRates"]) != len(groups):
            raise ValueError(f"{path}: {len(ext['baseLearningRates'])} parameter groups saved, the optimizer has "
                             f"{len(groups)}")
        if cfg.lr_scheduler is not None and ext.get("lrScheduler") is None:
            raise ValueError(f"{path}: the checkpoint has no LR scheduler state, but an lr_scheduler was given")
        simple_doc, swa_doc = phase_parts(doc)
        kind = "swa" if swa_doc is not None else "simple"
        return ext, kind, (swa_doc if swa_doc is not None else simple_doc), simple_doc

    def _checked_rng(self, ext: Mapping, path: str, *, sharded: bool) -> tuple:
        """The generator states to restore, checked: this rank's (else rank 0's) in a sharded checkpoint."""
        if not sharded:
            return check_rng_state(ext.get("rngTensors"), ext.get("rng"), file=path, field="tensorlist.rng",
                                   tensors_field="tensorlist.rngTensors")
        by_rank = ext.get("rngByRank") or {}
        rank = self.rank if by_rank.get(self.rank) is not None else 0
        if by_rank.get(rank) is None:
            raise ValueError(f"{path}: the sharded checkpoint holds no generator states (no 'rng.0' entry)")
        return check_rng_state_json(by_rank[rank], file=path, field=f"rng.{rank}")

    def restore(self, path: str) -> None:
        """Resumes from the checkpoint at ``path``: every check first, then model, optimizer, states, RNGs.

        ``path`` is a checkpoint document, or a sharded checkpoint's directory
        (then every rank calls this: the loads are collective, and DCP
        reshards to the processes and the model's layout now). Sets the state
        of the phase the checkpoint is in (and, in SWA, the warm-up's), the
        min-validation snapshot and the SWA average (``self.averaged``, made
        here after the weights are loaded unless the loop made it already).

        Raises:
            ValueError: a checkpoint of another loop, model, optimizer or
                parameter groups, or without the loops' extension.
        """
        cfg = self.cfg
        store = None
        if is_sharded_checkpoint(path):
            from tensorlist.loops.sharded import ShardedCheckpoint  # torch.distributed.checkpoint: only for sharded runs

            doc, meta = read_sharded_loop_state(path, ranks=(self.rank, 0), key=cfg.encryption_key)
            store = ShardedCheckpoint(path, encryption_key=cfg.encryption_key)
        else:
            doc = read_checkpoint(path, key=cfg.encryption_key)
        ext, kind, phase, simple_doc = self._check_loop_state(doc, path)
        state = state_from_phase(phase, kind)
        has_min = kind == "simple" and phase.get("minValidationLossModel") is not None
        has_avg = kind == "swa" and state.number_of_averaged_models > 0
        if has_avg and phase.get("averagedModels") is None:
            raise ValueError(f"{path}: numberOfAveragedModels > 0 but no averagedModels")
        if store is not None:
            store.check(meta, self.module, cfg.optimizer, min_model=has_min, averaged=has_avg)
        else:
            _check_model(self.module, phase["model"], path)
            opt_meta = phase.get("optimizerMetadata")
            if opt_meta is None:
                raise ValueError(f"{path}: the checkpoint's optimizer list has no metadata (not written by "
                                 "tensorlist.loops)")
            opt_sd = optimizer_state_from_parts(
                {k: from_numpy(np.asarray(a)) for k, a in phase["optimizer"].items()}, opt_meta, file=path,
                field="optimizer.metadata")
            check_optimizer_state(cfg.optimizer, opt_sd, where=path)
            if has_avg:
                _check_model(self.module, phase["averagedModels"], path + " (averagedModels)")

        rng = self._checked_rng(ext, path, sharded=store is not None)

        # every check passed: from here on the run takes the checkpoint's state
        training = doc.get("training", (phase.get("modelMetadata") or {}).get("training"))  # encrypted: sealed there
        if training is not None:  # first: it reads (and checks) the training record; its paths from the checkpoint's place
            self.recorder.resume(training, directory=path if store is not None else os.path.dirname(path))
        self.base_lrs = list(ext["baseLearningRates"])
        if cfg.lr_scheduler is not None:
            cfg.lr_scheduler.load_state_dict(ext["lrScheduler"])
        if store is not None:
            min_model = store.load(self.module, cfg.optimizer, min_model=has_min)
        else:
            _load_model(self.module, phase["model"])
            cfg.optimizer.load_state_dict(opt_sd)
            min_model = ({k: from_numpy(np.array(a)) for k, a in phase["minValidationLossModel"][1].items()}
                         if has_min else None)
        state.max_epochs = cfg.epochs_of(kind)
        state.iteration = int(ext.get("iteration", 0))
        if kind == "simple":
            state.schedule_state = ext.get("scheduleState")
            self.simple = state
            if min_model is not None:
                self.min_model = min_model
        else:
            state.schedule_state = ext.get("swaScheduleState")
            self.swa = state
            if simple_doc is not None:
                self.simple = state_from_phase(simple_doc, "simple")
                self.simple.schedule_state = ext.get("scheduleState")
            if self.averaged is None:
                self.averaged = AveragedModel(self.module)
            if has_avg:
                if store is not None:
                    store.load_averaged(self.averaged.module)
                else:
                    _load_model(self.averaged.module, phase["averagedModels"])
            self.averaged.n_averaged.fill_(state.number_of_averaged_models)
        set_rng_state(*rng, file=path)
        log.info("resumed from %s after %d epochs", path, state.epoch)

    # --- events and learning rate -------------------------------------------------
    def fire(self, event: Events, state: State) -> None:
        for h in self.cfg.handlers.get(event, ()):
            h(state)

    def set_factor(self, factor: float) -> None:
        if self.cfg.lr_scheduler is not None:
            return  # the torch scheduler owns the rates; the factor schedule can still stop
        for g, base in zip(self.cfg.optimizer.param_groups, self.base_lrs):
            g["lr"] = base * factor

    # --- one epoch ------------------------------------------------------------------
    @staticmethod
    def context(state: State) -> TrainingLoopContext:
        return TrainingLoopContext(state.epoch, state.last_validation_loss, state.min_validation_loss)

    def train_at(self, state: State, factor: float) -> Tuple[TrainingLoopContext, float]:
        """Trains the epoch ``state.epoch`` at learning-rate ``factor``.

        Fires EPOCH_STARTED and the training callback; returns (context, training loss).
        """
        state.factor = factor
        self.set_factor(factor)
        ctx = self.context(state)
        self.fire(Events.EPOCH_STARTED, state)
        train_loss = self.train_epoch(state, ctx)
        state.training_loss = train_loss
        if self.cfg.training_callback is not None:
            self.cfg.training_callback(state.epoch, train_loss, self.cfg.model)
        return ctx, train_loss

    def _reduce(self, total: float, count: int) -> Tuple[float, int]:
        if self.distributed:
            t = torch.tensor([total, float(count)], dtype=torch.float64)
            dist.all_reduce(t)
            total, count = float(t[0]), int(t[1])
        return total, count

    def train_epoch(self, state: State, ctx: TrainingLoopContext) -> float:
        cfg = self.cfg
        model, opt, n_acc = cfg.model, cfg.optimizer, max(1, cfg.accumulate_gradient_over_n_batches)
        model.train()
        total, count, pending = 0.0, 0, 0
        stream = batch_stream(cfg.train, ctx)
        bar = None
        if self.progress():
            stream = bar = self.progress_bar(stream, desc=f"{state.phase} epoch {epoch_number(self.recorder.epochs_done)}",
                                             leave=False, unit="batch")
        opt.zero_grad(set_to_none=True)
        for batch in stream:
            if is_empty(batch):
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
            for batch in batch_stream(cfg.validation, ctx):
                if is_empty(batch):
                    continue
                loss, n = cfg.step(cfg.model, batch)
                total += float(loss) * n
                count += n
        total, count = self._reduce(total, count)
        return total / count if count else math.nan

    def validates(self, state: State) -> bool:
        """Whether the epoch ``state.epoch`` is validated."""
        return self.cfg.validation is not None and state.epoch % self.cfg.validation_frequency == 0

    def validate_epoch(self, state: State, ctx: TrainingLoopContext,
                       smoothing: Optional[float]) -> Tuple[float, float]:
        """Validates, smooths (``raw * a + last * (1 - a)`` unless ``smoothing`` is None) and reports.

        Sets the state's losses, calls the validation callback once with the
        loss the loop uses, fires VALIDATION_COMPLETED; returns (that loss, raw).
        """
        raw = self.validate(state, ctx)
        value = raw
        if smoothing is not None:
            prev = state.last_validation_loss
            value = raw * smoothing + (prev if prev is not None else raw) * (1 - smoothing)
        state.validation_loss, state.raw_validation_loss = value, raw
        if self.cfg.validation_callback is not None:  # once, with the smoothed loss (lamp: twice)
            self.cfg.validation_callback(state.epoch, value, self.cfg.model)
        self.fire(Events.VALIDATION_COMPLETED, state)
        return value, raw

    def end_epoch(self, state: State, entry: tuple, validation: Optional[float], next_schedule_state,
                  log_args: tuple) -> None:
        """What follows every epoch of every loop, in this order.

        Appends ``entry`` to the learning curve, records the epoch, steps the
        torch LR scheduler, logs ``log_args`` (a format and its arguments)
        after ``epoch N:`` with the epoch's number in the training record,
        counts the epoch done (and stores the loss and schedule state the next
        epoch starts from), fires EPOCH_COMPLETED, then writes the checkpoint
        and fires CHECKPOINT_SAVED.
        """
        state.learning_curve.append(entry)
        number = self.recorder.epoch_done(entry[1], validation=validation)
        if self.cfg.lr_scheduler is not None:
            self.cfg.lr_scheduler.step()
        # the record's number (from 1, across phases and resumes), as tables of the record print it
        log.info("%sepoch %d: " + log_args[0], "SWA " if state.phase == "swa" else "", number, *log_args[1:])
        state.epoch += 1
        state.last_validation_loss = validation
        state.schedule_state = next_schedule_state
        self.fire(Events.EPOCH_COMPLETED, state)
        if self.cfg.checkpoint is not None:
            self.write_checkpoint()
            self.fire(Events.CHECKPOINT_SAVED, state)

    # --- checkpoints and model files --------------------------------------------------
    def record_meta(self, kind: str, weights: Optional[Mapping[str, np.ndarray]], epoch: Optional[int] = None,
                    value: Optional[float] = None) -> dict:
        """The training and data records of weights of ``kind``; ``weights`` None: no hash (``sha256`` null)."""
        rec = self.recorder.record("checkpoint" if kind == "checkpoint" else kind, epoch=epoch)
        if value is not None:
            rec["weights"]["validation"] = value
        if weights is not None:
            rec["weights"]["sha256"] = weights_sha256(weights)
        return {"training": rec, "dataset_params": copy.deepcopy(dict(self.cfg.dataset_params))}

    def checkpoint_document(self, *, sharded: bool = False) -> dict:
        """The checkpoint of the run as it stands: the active phase in full (the SWA phase once it began).

        ``sharded``: the loop state of a sharded checkpoint instead: the same
        document with ``dcp_ref`` references in place of the tensors (saved
        beside it by every rank), no RNG states (each rank saves its own), and
        a training record without the weights hash (the shards have CRCs; the
        model files have the hash).
        """
        if sharded:
            weights = None
            parts = dict(model=dcp_ref("model"), model_meta=None, optimizer=dcp_ref("optimizer"),
                         optimizer_meta=None)
            min_model = None if self.min_model is None else dcp_ref("min_model")
            averaged = dcp_ref("averaged")
        else:
            weights = state_to_numpy(module_state(self.module), bits=True)
            opt_tensors, opt_meta = optimizer_state_parts(self.cfg.optimizer.state_dict())
            parts = dict(model=weights, optimizer=state_to_numpy(opt_tensors, bits=True), optimizer_meta=opt_meta)
            min_model = None if self.min_model is None else state_to_numpy(self.min_model, bits=True)
            averaged = None
        record = self.record_meta("checkpoint", weights)
        record["training"] = anchor_paths(record["training"], self.checkpoint_directory())
        if not sharded:
            parts["model_meta"] = record
        active = self.swa if self.swa is not None else self.simple
        if self.swa is not None:
            if self.swa.number_of_averaged_models == 0:
                averaged = None
            elif not sharded:
                averaged = state_to_numpy(module_state(self.averaged.module), bits=True)
            swa = phase_document("swa", state=self.swa, averaged=averaged, **parts)
            simple = empty_simple(self.simple, sharded=sharded) if self.simple is not None else None
        else:
            swa = None
            simple = phase_document("simple", state=self.simple, min_model=min_model, **parts)
        sch = self.cfg.lr_scheduler
        ext = extension(phase=active.phase, state=active, base_lrs=self.base_lrs,
                        lr_scheduler_state=None if sch is None else sch.state_dict(),
                        simple_schedule_state=None if self.simple is None else self.simple.schedule_state,
                        swa_schedule_state=None if self.swa is None else self.swa.schedule_state,
                        world_size=self.world_size() if sharded else None)
        return loop_document(CHECKPOINT_TYPES[self.cfg.loop], simple=simple, swa=swa, ext=ext, record=record)

    def checkpoint_directory(self) -> str:
        """Where the checkpoint's record is read from: a document's directory, or a sharded checkpoint itself."""
        path = os.fspath(self.cfg.checkpoint)
        return path if self.cfg.checkpoint_format == "sharded" else os.path.dirname(path)

    def world_size(self) -> int:
        return dist.get_world_size() if self.distributed else 1

    def write_checkpoint(self) -> None:
        """Writes the checkpoint: rank 0 the document (every rank waits for it), or every rank its shards."""
        if self.cfg.checkpoint is None:
            return
        path = os.fspath(self.cfg.checkpoint)
        if self.cfg.checkpoint_format == "sharded":
            if self._store is None:
                from tensorlist.loops.sharded import ShardedCheckpoint  # torch.distributed.checkpoint: only for sharded runs

                self._store = ShardedCheckpoint(path, encryption_key=self.cfg.encryption_key)
            swa_n = self.swa.number_of_averaged_models if self.swa is not None else 0
            key = self.cfg.signing_key if self.rank == 0 else None
            with signed_save(path, key):  # rank 0 signs the directory, once the save is committed
                self._store.save(module=self.module, optimizer=self.cfg.optimizer,
                                 loop_state=self.checkpoint_document(sharded=True) if self.rank == 0 else None,
                                 min_model=self.min_model if self.swa is None else None,
                                 averaged=self.averaged.module if swa_n > 0 else None)
                if key is not None:
                    self._store.wait()  # the replaced save's files gone: the signature lists this save's alone
            if self.distributed and self.cfg.signing_key is not None:
                dist.barrier()  # no rank writes the next save into the directory while rank 0 hashes it
        else:
            if self.rank == 0:
                with signed_save(path, self.cfg.signing_key):
                    write_checkpoint(path, self.checkpoint_document(), key=self.cfg.encryption_key)
            if self.distributed:
                dist.barrier()
        if self.rank == 0:
            self.files["checkpoint"] = path
        log.debug("checkpoint written: %s", path)

    def finish_checkpoints(self) -> None:
        """Waits until the files of replaced sharded checkpoints are deleted (the loops call it at the end)."""
        if self._store is not None:
            self._store.wait()

    def save_model(self, name: str, kind: str, weights: Mapping[str, torch.Tensor], epoch: int,
                   value: Optional[float] = None) -> None:
        """Rank 0 writes the model file ``out_dir/name`` (nothing without ``out_dir``).

        Every rank calls it: DTensor weights (FSDP2) are gathered whole first,
        which takes every rank.
        """
        if self.cfg.out_dir is None:
            return
        if any(_is_dtensor(v) for v in weights.values()):
            weights = {k: v.full_tensor() if _is_dtensor(v) else v for k, v in weights.items()}
        if self.rank != 0:
            return
        path = os.path.join(self.cfg.out_dir, name)
        rec = self.recorder.record(kind, epoch=epoch)
        if value is not None:
            rec["weights"]["validation"] = value
        with signed_save(path, self.cfg.signing_key):
            save_model_file(path, state_to_numpy(weights, bits=True), training=rec,
                            dataset_params=self.cfg.dataset_params, key=self.cfg.encryption_key)
        self.files[kind] = path

    def save_best(self) -> None:
        """``best_validation.json``: the min-validation snapshot of the simple phase, if it has one."""
        s = self.simple
        if self.min_model is not None and s is not None and s.min_validation_epoch is not None:
            self.save_model("best_validation.json", "best_validation", self.min_model, s.min_validation_epoch + 1,
                            value=s.min_validation_loss)

    def save_final(self, epochs_done: Optional[int] = None) -> None:
        """``final.json``: the model's weights now, recorded after ``epochs_done`` (default: all done)."""
        done = self.recorder.epochs_done if epochs_done is None else epochs_done
        self.save_model("final.json", "final", module_state(self.module), done)
