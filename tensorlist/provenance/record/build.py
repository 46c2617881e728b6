"""Building records: loader settings, the optimizer section, whole records, and the per-run :class:`TrainingRecorder`.

Everything here turns live training objects (a torch optimizer, scheduler,
loss, DataLoader, loop settings) into the JSON of a record; it never keeps a
reference that later changes the record. The record is validated before it
is returned (``core.validate_training_record``). Epochs are counted from 1.

Imports the record's ``core``, ``spec``, ``hash``, ``modelfile`` and
``_common``; torch only inside :func:`loader_settings`, which is given a
torch DataLoader.
"""
from __future__ import annotations

import datetime as _dt
import inspect
import math
import numbers
import os
import platform
import sys
from collections.abc import Mapping
from typing import Any, List, Optional

import numpy as np

from tensorlist._base import backends
from tensorlist.crypto.keys import as_key
from tensorlist.provenance.record._common import copy_json, int_or_none, is_torch_tensor, loaded_torch, name_of, warn, warn_unimportable
from tensorlist.provenance.record.core import FORMAT, WEIGHTS_KINDS, TrainingRecord, check_strict_json, history, validate_training_record
from tensorlist.provenance.record.hash import resolve_paths, weights_sha256
from tensorlist.provenance.record.modelfile import read_training_record, save_model_file
from tensorlist.provenance.record.spec import spec, spec_or_none, to_json

__all__ = ["loader_settings", "optimizer_record", "optimizer_state_record", "build_training_record", "TrainingRecorder"]

_SCHEDULER_STEPS = ("epoch", "batch")

#: Keys of a solver's parameters that say where it ran, not how it trained:
#: the seed's record leaves them out (the model is the file's weights).
_WHERE_IT_RAN = ("model", "optimizer", "device", "verbose", "save_folder")


# --------------------------------------------------------------------------
# loaders


def _check_loader_dict(settings: Mapping, where: str) -> dict:
    keys = ("batch_size", "shuffle", "drop_last", "sampler")
    missing = [k for k in keys if k not in settings]
    extra = [k for k in settings if k not in keys]
    if missing or extra:
        raise ValueError(
            f"{where}: loader settings need exactly the keys {', '.join(keys)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else "")
        )
    out = dict(settings)
    for field, ok in (
        ("batch_size", lambda v: v is None or (int_or_none(v) is not None and v >= 1)),
        ("shuffle", lambda v: v is None or isinstance(v, bool)),
        ("drop_last", lambda v: isinstance(v, bool)),
        ("sampler", lambda v: v is None or (isinstance(v, str) and v)),
    ):
        if not ok(out[field]):
            raise ValueError(f"{where}.{field}: invalid value {out[field]!r}")
    return out


def loader_settings(loader) -> dict:
    """How a DataLoader feeds its data: batch_size, shuffle, drop_last, sampler.

    A torch DataLoader does not remember ``shuffle``; it is read from the
    sampler: ``RandomSampler`` -> true, ``SequentialSampler`` -> false. Any
    other sampler (or custom batch sampler) is named in ``sampler`` by its
    dotted class name, with ``shuffle`` its own ``shuffle`` attribute when it
    has one (e.g. DistributedSampler), else null. A RandomSampler drawing with
    replacement or a fixed number of samples is named too. A loader built with
    a plain ``BatchSampler`` reports that batch sampler's settings.

    Args:
        loader: a ``torch.utils.data.DataLoader`` (or anything with
            ``batch_size``, ``drop_last`` and ``sampler``), or a dict of the
            four settings (checked and returned).

    Returns:
        ``{"batch_size": int | None, "shuffle": bool | None,
        "drop_last": bool, "sampler": str | None}``.

    Raises:
        TypeError: ``loader`` is neither a loader nor a settings dict.
        ValueError: a settings dict with missing, extra or mistyped keys.

    Example:
        >>> loader_settings({"batch_size": 8, "shuffle": True, "drop_last": False, "sampler": None})
        {'batch_size': 8, 'shuffle': True, 'drop_last': False, 'sampler': None}
    """
    if isinstance(loader, Mapping):
        return _check_loader_dict(loader, "loader")
    for attr in ("batch_size", "drop_last", "sampler"):
        if not hasattr(loader, attr):
            raise TypeError(
                f"loader_settings: expected a DataLoader or a dict of settings; "
                f"{type(loader).__qualname__} has no attribute {attr!r}"
            )
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    batch_size = int_or_none(loader.batch_size)
    drop_last = bool(loader.drop_last)
    sampler = loader.sampler
    if loader.batch_size is None:
        batch_sampler = getattr(loader, "batch_sampler", None)
        if type(batch_sampler) is BatchSampler:
            batch_size = int_or_none(batch_sampler.batch_size)
            drop_last = bool(batch_sampler.drop_last)
            sampler = batch_sampler.sampler
        elif batch_sampler is not None:
            shuffle = getattr(batch_sampler, "shuffle", None)
            return {
                "batch_size": int_or_none(getattr(batch_sampler, "batch_size", None)),
                "shuffle": shuffle if isinstance(shuffle, bool) else None,
                "drop_last": bool(getattr(batch_sampler, "drop_last", False)),
                "sampler": name_of(type(batch_sampler))[0],
            }
        else:
            drop_last = False  # no automatic batching: each sample is a batch
    # a subclass (accelerate's SeedableRandomSampler, which the Trainer uses) still says whether it shuffles,
    # and is named
    if isinstance(sampler, SequentialSampler):
        shuffle, named = False, (None if type(sampler) is SequentialSampler else name_of(type(sampler))[0])
    elif isinstance(sampler, RandomSampler):
        plain = (type(sampler) is RandomSampler and not sampler.replacement
                 and getattr(sampler, "_num_samples", None) is None)
        shuffle, named = True, (None if plain else name_of(type(sampler))[0])
    else:
        attr = getattr(sampler, "shuffle", None)
        shuffle = attr if isinstance(attr, bool) else None
        named = name_of(type(sampler))[0]
    if batch_size is not None and batch_size < 1:
        batch_size = None
    return {"batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last, "sampler": named}


# --------------------------------------------------------------------------
# the optimizer section


def _optimizer_class(optimizer) -> str:
    name, importable = name_of(type(optimizer))
    if not importable:
        warn_unimportable("optimizer.class", name, "an object of the class")
    return name


def _finite_or_none(value) -> Optional[float]:
    if is_torch_tensor(value) or isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def optimizer_record(optimizer, *, model=None, scheduler=None, scheduler_step: Optional[str] = None) -> dict:
    """The ``optimizer`` section of a record, from a torch optimizer.

    Call it when training starts (a :class:`TrainingRecorder` does): the
    groups' settings are taken as they are now. A group's starting learning
    rate is its ``initial_lr`` (set by torch schedulers when made), else its
    ``lr``. ``parameter_groups`` is null for one group holding all of
    ``model``'s parameters with the optimizer's default hyperparameters.

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        model: the model, to name the parameters (``named_parameters``);
            without it they are named ``"#<index>"``, with a warning.
        scheduler: the learning-rate scheduler, or None.
        scheduler_step: ``"epoch"`` or ``"batch"``; required with a scheduler.

    Raises:
        ValueError: ``scheduler_step`` does not match ``scheduler``.
    """
    if scheduler is None and scheduler_step is not None:
        raise ValueError(f"scheduler_step={scheduler_step!r} given without a scheduler")
    if scheduler is not None and scheduler_step not in _SCHEDULER_STEPS:
        raise ValueError(f"scheduler_step must be 'epoch' or 'batch' with a scheduler, got {scheduler_step!r}")
    hyper = to_json(dict(optimizer.defaults), "optimizer.hyperparameters")
    names = {}
    model_params: List[int] = []
    if model is not None:
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)
            model_params.append(id(p))
    groups = []
    index = 0
    unnamed = 0
    group_params: List[int] = []
    for g, group in enumerate(optimizer.param_groups):
        params = []
        for p in group["params"]:
            name = names.get(id(p))
            if name is None:
                name = f"#{index}"
                unnamed += 1
            params.append(name)
            group_params.append(id(p))
            index += 1
        settings = {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}
        groups.append({
            "parameters": params,
            "initial_lr": _finite_or_none(group.get("initial_lr", group.get("lr"))),
            "settings": to_json(settings, f"optimizer.parameter_groups[{g}].settings"),
        })
    defaults_but_lr = {k: v for k, v in hyper.items() if k != "lr"}
    one_plain_group = (
        len(groups) == 1
        and groups[0]["settings"] == defaults_but_lr
        and groups[0]["initial_lr"] == _finite_or_none(hyper.get("lr"))
        and (model is None or group_params == model_params)
    )
    if not one_plain_group and unnamed and model is None:
        warn(
            "training record: no model given, so the optimizer's parameters are named by position "
            "('#0', '#1', ...); pass model= to name them"
        )
    return {
        "class": _optimizer_class(optimizer),
        "hyperparameters": hyper,
        "parameter_groups": None if one_plain_group else groups,
        "scheduler": None if scheduler is None else spec(scheduler, where="optimizer.scheduler"),
        "scheduler_step": scheduler_step,
    }


def optimizer_state_record(state) -> dict:
    """The ``optimizer`` section of a record from a saved optimizer state (torch's ``optimizer.state_dict()``).

    For a saver that holds the state but not the optimizer (a checkpoint
    plugin): the state names no class (``class`` null) and keeps each group's
    settings, not the constructor's defaults (``hyperparameters`` ``{}``);
    every group is listed, its parameters named by their index in the state
    (``"#0"``, ...), its ``initial_lr`` (else ``lr``) as its starting rate.
    No state, or one without groups: no groups (``parameter_groups`` null).
    The scheduler is not in an optimizer's state (null).

    Example:
        >>> optimizer_state_record({"state": {}, "param_groups": [{"lr": 0.1, "momentum": 0.9, "params": [0, 1]}]})
        ... # doctest: +NORMALIZE_WHITESPACE
        {'class': None, 'hyperparameters': {}, 'parameter_groups': [{'parameters': ['#0', '#1'], 'initial_lr': 0.1,
         'settings': {'momentum': 0.9}}], 'scheduler': None, 'scheduler_step': None}
    """
    groups = state.get("param_groups") if isinstance(state, Mapping) else None
    listed = []
    for g, group in enumerate(groups if isinstance(groups, (list, tuple)) else ()):
        if not isinstance(group, Mapping):
            continue
        params = group.get("params")
        settings = {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}
        listed.append({
            "parameters": [f"#{p}" for p in (params if isinstance(params, (list, tuple)) else ())],
            "initial_lr": _finite_or_none(group.get("initial_lr", group.get("lr"))),
            "settings": to_json(settings, f"optimizer.parameter_groups[{g}].settings"),
        })
    return {"class": None, "hyperparameters": {}, "parameter_groups": listed or None,
            "scheduler": None, "scheduler_step": None}


# --------------------------------------------------------------------------
# whole records


def _environment() -> dict:
    torch = loaded_torch()
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            tl_version: Optional[str] = version("tensorlist")
        except PackageNotFoundError:
            tl_version = getattr(sys.modules.get("tensorlist"), "__version__", None)
    except ImportError:  # pragma: no cover
        tl_version = None
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "tensorlist": tl_version if isinstance(tl_version, str) else None,
        "platform": platform.platform(),
    }


def _validation_section(validation, loss_spec) -> Optional[dict]:
    if validation is None:
        return None
    if not isinstance(validation, Mapping):
        raise TypeError(f"validation must be a dict or None, got {type(validation).__qualname__}")
    allowed = {"dataset_params", "loader", "every", "function", "reconstructor"}
    extra = set(validation) - allowed
    if extra:
        raise ValueError(f"validation: unexpected keys {sorted(extra)}; allowed: {sorted(allowed)}")
    loader = validation.get("loader")
    function = validation.get("function")
    data = validation.get("dataset_params")
    return {
        "dataset_params": None if data is None else to_json(dict(data), "validation.dataset_params"),
        "loader": None if loader is None else loader_settings(loader),
        "every": validation.get("every", 1),
        "function": loss_spec if function is None else spec_or_none(function, "validation.function"),
        "reconstructor": spec_or_none(validation.get("reconstructor"), "validation.reconstructor"),
    }


def _optimizer_section(optimizer, model, scheduler, scheduler_step) -> dict:
    """The record's ``optimizer``: a snapshot of a torch optimizer, or a copy of an :func:`optimizer_record` dict."""
    if not isinstance(optimizer, Mapping):
        return optimizer_record(optimizer, model=model, scheduler=scheduler, scheduler_step=scheduler_step)
    if scheduler is not None or scheduler_step is not None:
        raise ValueError("scheduler and scheduler_step belong to optimizer_record() when optimizer is a dict")
    check_strict_json(optimizer, "optimizer")  # before the copy: the check also bounds the nesting
    return copy_json(optimizer)


def _solver_class(solver) -> Optional[str]:
    """The dotted name the record's ``solver.class`` holds; a RecordWarning when it cannot be imported by it."""
    if isinstance(solver, str) or solver is None:
        return solver
    target = solver if (inspect.isroutine(solver) or isinstance(solver, type)) else type(solver)
    name, importable = name_of(target)
    if not importable:
        warn_unimportable("solver.class", name, "the training loop")
    return name


def build_training_record(
    *,
    optimizer,
    train_loader,
    epochs_asked: Optional[int],
    epochs_done: int,
    training_loss,
    validation_values=None,
    learning_rates=None,
    weights_kind: str = "final",
    weights_epoch: Optional[int] = None,
    weights_validation: Optional[float] = None,
    model=None,
    loss=None,
    scheduler=None,
    scheduler_step: Optional[str] = None,
    seed: Optional[int] = None,
    initial_weights_sha256: Optional[str] = None,
    initial_weights: Optional[Mapping] = None,
    validation: Optional[Mapping] = None,
    solver=None,
    solver_params: Optional[Mapping] = None,
) -> TrainingRecord:
    """Makes a training record from a torch optimizer, scheduler, loss, loaders and loop settings.

    Args:
        optimizer: a torch optimizer (snapshot now, see :func:`optimizer_record`)
            or the dict :func:`optimizer_record` made when training started
            (then ``scheduler`` must be None: it is inside).
        train_loader: the training DataLoader or its :func:`loader_settings`;
            None when the saver did not see it.
        epochs_asked: epochs the training was asked for; None when unknown.
        epochs_done: epochs completed.
        training_loss: per-epoch training losses (at least ``epochs_done``).
        validation_values: per-epoch validation values (None/NaN: not validated).
        learning_rates: per-epoch learning rate (a list per epoch when there
            are several groups); None: unknown (nulls).
        weights_kind: ``"final"``, ``"best_validation"`` or ``"checkpoint"``.
        weights_epoch: the epoch the weights are from (default: ``epochs_done``).
        weights_validation: their validation value (default: the history's
            value at ``weights_epoch``).
        model: the model, to name the optimizer's parameters.
        loss: the training loss (object or function), recorded as a spec.
        scheduler, scheduler_step: the LR scheduler and when it steps.
        seed: the training seed, or None for an unseeded run.
        initial_weights_sha256: :func:`weights_sha256` of the starting weights.
        initial_weights: ``{"from": "random_state"}``, ``{"from": "file",
            "file": ..., "origin": ...}`` or ``{"from": None, "origin": ...}``
            (default ``{"from": None, "origin": None}``).
        validation: None, or a dict with ``dataset_params``, ``loader``,
            ``every`` (default 1), ``function`` (default: the loss),
            ``reconstructor``.
        solver: the training loop (object, class or function) or its dotted
            name, or None.
        solver_params: the loop's settings, including values it computed;
            ``model``, ``optimizer``, ``device``, ``verbose`` and
            ``save_folder`` are left out.

    Returns:
        The validated :class:`TrainingRecord`.

    Raises:
        FormatError: the pieces do not make a valid record (naming the field).
        TypeError, ValueError: an argument of the wrong type or value.
    """
    for arg, value in (("seed", seed), ("epochs_asked", epochs_asked), ("epochs_done", epochs_done)):
        optional = arg != "epochs_done"
        if (value is not None or not optional) and int_or_none(value) is None:
            raise TypeError(f"{arg} must be an integer{' or None' if optional else ''}, got {value!r}")
    opt = _optimizer_section(optimizer, model, scheduler, scheduler_step)
    if weights_kind not in WEIGHTS_KINDS:
        raise ValueError(f"weights_kind must be one of {WEIGHTS_KINDS}, got {weights_kind!r}")
    done = int(epochs_done)
    hist_validation = history(validation_values, done) if validation_values is not None else [None] * done
    hist_lr = history(learning_rates, done) if learning_rates is not None else [None] * done
    epoch = done if weights_epoch is None else int(weights_epoch)
    if weights_validation is None and 1 <= epoch <= done:
        weights_validation = hist_validation[epoch - 1]
    if weights_kind == "best_validation" and _finite_or_none(weights_validation) is None:
        raise ValueError(
            f"weights_kind='best_validation' needs the weights' validation value: pass weights_validation=, "
            f"or validation_values with a finite value at epoch {epoch}"
        )
    loss_spec = spec_or_none(loss, "solver.loss")
    solver_class = _solver_class(solver)
    params = {k: v for k, v in dict(solver_params or {}).items() if k not in _WHERE_IT_RAN}
    if initial_weights is None:
        initial_weights = {"from": None, "origin": None}
    record = TrainingRecord(
        format=FORMAT,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        environment=_environment(),
        solver={"class": solver_class, "solver_params": to_json(params, "solver.solver_params"), "loss": loss_spec},
        optimizer=opt,
        seed=None if seed is None else int(seed),
        initial_weights_sha256=initial_weights_sha256,
        initial_weights=to_json(dict(initial_weights), "initial_weights"),
        train=None if train_loader is None else loader_settings(train_loader),
        validation=_validation_section(validation, loss_spec),
        epochs={"asked": None if epochs_asked is None else int(epochs_asked), "done": done},
        weights={"kind": weights_kind, "epoch": epoch, "validation": _finite_or_none(weights_validation), "sha256": None},
        history={
            "training_loss": history(training_loss, done),
            "validation": hist_validation,
            "learning_rate": hist_lr,
        },
    )
    validate_training_record(record)
    return record


class TrainingRecorder:
    """Keeps a training loop's record: a snapshot at the start, one call per epoch, one record per save.

    Made before the first optimizer step, it records the optimizer's starting
    settings and learning rates, the loss, loaders and schedule as specs (so
    any warning about a lambda shows at the start) and the hash of the
    starting weights. Epochs are counted from 1: after the first
    :meth:`epoch_done`, ``epochs_done`` is 1.

    Example (with torch)::

        recorder = TrainingRecorder(model, opt, loss=loss_fn, train_loader=dl, epochs=10,
                                    scheduler=sched, scheduler_step="epoch", seed=0,
                                    initial_weights={"from": "random_state"})
        for epoch in range(10):
            train_loss = ...               # one epoch
            recorder.epoch_done(train_loss, validation=val)   # before sched.step()
            sched.step()
            recorder.save("ckpt.json", model, kind="checkpoint", dataset_params=data)
        recorder.save("final.json", model, dataset_params=data)

    ``signing_key=`` (an EC private key, PEM path or ``cryptography`` key)
    signs each file :meth:`save` writes (docs/PROVENANCE.md);
    ``encryption_key=`` (a ``tensorlist.Key`` or 32 bytes) encrypts each,
    the record in its metadata sealed with the weights, and opens the file
    :meth:`resume` reads a record from.
    """

    def __init__(
        self,
        model,
        optimizer,
        *,
        loss=None,
        train_loader,
        epochs: int,
        scheduler=None,
        scheduler_step: Optional[str] = None,
        seed: Optional[int] = None,
        initial_weights: Optional[Mapping] = None,
        validation: Optional[Mapping] = None,
        validation_mode: str = "min",
        solver=None,
        solver_params: Optional[Mapping] = None,
        signing_key=None,
        encryption_key=None,
    ) -> None:
        if validation_mode not in ("min", "max"):
            raise ValueError(f"validation_mode must be 'min' or 'max', got {validation_mode!r}")
        self._optimizer = optimizer
        self.optimizer = optimizer_record(optimizer, model=model, scheduler=scheduler, scheduler_step=scheduler_step)
        self.initial_weights_sha256 = weights_sha256(model)
        self.loss = spec_or_none(loss, "solver.loss")
        self.train = loader_settings(train_loader)
        self.validation = validation
        self._validation_section = _validation_section(validation, self.loss)
        self.epochs_asked = int(epochs)
        self.seed = seed
        self.initial_weights = dict(initial_weights) if initial_weights is not None else None
        self.validation_mode = validation_mode
        self.solver = solver
        self.solver_params = dict(solver_params or {})
        self.signing_key = signing_key  # each save signed with it (tensorlist.provenance.signing.sign_saved)
        self.encryption_key = as_key(encryption_key)  # each save encrypted with it
        self.training_loss: List[Optional[float]] = []
        self.validation_values: List[Optional[float]] = []
        self.learning_rates: List[Any] = []
        self.best_epoch: Optional[int] = None
        self.best_validation: Optional[float] = None

    @property
    def epochs_done(self) -> int:
        """Epochs completed so far."""
        return len(self.training_loss)

    def epoch_done(self, training_loss, validation=None, learning_rate=None) -> int:
        """Records one finished epoch; returns its number (from 1).

        Args:
            training_loss: the epoch's training loss.
            validation: its validation value, or None when not validated.
            learning_rate: the epoch's rate(s); default: read from the
                optimizer now (call this before stepping an epoch scheduler).
        """
        if learning_rate is None:
            rates = [_finite_or_none(g.get("lr")) for g in self._optimizer.param_groups]
            learning_rate = rates[0] if len(rates) == 1 else rates
        self.training_loss.extend(history([training_loss], 1))
        value = history([validation], 1)[0]
        self.validation_values.append(value)
        self.learning_rates.extend(history([learning_rate], 1))
        if value is not None and (
            self.best_validation is None
            or (value < self.best_validation if self.validation_mode == "min" else value > self.best_validation)
        ):
            self.best_epoch, self.best_validation = self.epochs_done, value
        return self.epochs_done

    def resume(self, record, *, directory=None) -> None:
        """Continues the history of an earlier run's record (e.g. read from its last checkpoint).

        Args:
            record: the record, or anything :func:`read_training_record` reads
                one from (a model file's path included).
            directory: where the file holding ``record`` is (default: the
                directory of ``record`` when it is a path): the record's
                relative paths are read from there (:func:`resolve_paths`), so
                the next saves, wherever they go, name the same origin.
        """
        if directory is None and isinstance(record, (str, os.PathLike)):
            directory = os.path.dirname(os.fsdecode(record))
        record = read_training_record(record, key=self.encryption_key)
        if directory is not None:
            record = resolve_paths(record, directory)
        self.training_loss = list(record["history"]["training_loss"])
        self.validation_values = list(record["history"]["validation"])
        self.learning_rates = list(record["history"]["learning_rate"])
        self.best_epoch = self.best_validation = None
        for i, value in enumerate(self.validation_values, start=1):
            if value is not None and (
                self.best_validation is None
                or (value < self.best_validation if self.validation_mode == "min" else value > self.best_validation)
            ):
                self.best_epoch, self.best_validation = i, value
        self.initial_weights_sha256 = record["initial_weights_sha256"]
        self.initial_weights = record["initial_weights"]
        self.seed = record["seed"]

    def record(self, kind: str = "final", *, epoch: Optional[int] = None) -> TrainingRecord:
        """The record for weights of ``kind`` (after ``epoch``; default: the best or the last)."""
        value = None
        if kind == "best_validation" and epoch is None:
            if self.best_epoch is None:
                raise ValueError("no validated epoch yet, so there are no best-validation weights")
            epoch, value = self.best_epoch, self.best_validation
        return build_training_record(
            optimizer=self.optimizer,
            train_loader=self.train,
            epochs_asked=self.epochs_asked,
            epochs_done=self.epochs_done,
            training_loss=self.training_loss,
            validation_values=self.validation_values,
            learning_rates=self.learning_rates,
            weights_kind=kind,
            weights_epoch=epoch,
            weights_validation=value,
            loss=self.loss,
            seed=self.seed,
            initial_weights_sha256=self.initial_weights_sha256,
            initial_weights=self.initial_weights,
            validation=self._validation_section,
            solver=self.solver,
            solver_params=self.solver_params,
        )

    def save(self, path, weights, *, dataset_params: Mapping, kind: str = "final",
             epoch: Optional[int] = None, **save_options) -> TrainingRecord:
        """Saves a model file of ``weights`` with this run's record; returns the record saved.

        With the recorder's ``signing_key``, the file is then signed: ``path + ".sig"`` and
        ``path + ".provenance.json"`` (docs/PROVENANCE.md); with its ``encryption_key``, it is encrypted.
        """
        if self.encryption_key is not None:
            save_options.setdefault("key", self.encryption_key)
        if self.signing_key is None:
            return save_model_file(path, weights, training=self.record(kind, epoch=epoch),
                                   dataset_params=dataset_params, **save_options)
        with backends.dispatch("sign", path)(path, self.signing_key):  # tensorlist.provenance.signing.signed_save
            return save_model_file(path, weights, training=self.record(kind, epoch=epoch),
                                   dataset_params=dataset_params, **save_options)

