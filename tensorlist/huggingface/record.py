"""What a ``transformers.Trainer``'s training record says, read from its state and arguments.

The per-epoch history from ``state.log_history``, the evaluation as the
record's ``validation`` (a record whose history holds validation values must
describe how they were made), and the epoch and value of the best
checkpoint's weights once ``load_best_model_at_end`` has loaded them.
The value the record follows is the Trainer's own choice of metric:
``eval_<metric_for_best_model>``, ``eval_loss`` when none is set (the
Trainer's default for ``load_best_model_at_end`` too). :func:`trainer_record`
puts these together into the record of the Trainer's weights now.

Needs no transformers: it reads the Trainer's attributes only, so
``tensorlist.huggingface`` re-exports it without importing transformers.
"""
from __future__ import annotations

import math
from typing import List, Mapping, Optional, Tuple

from tensorlist._base.jsonio import loads_strict
from tensorlist.huggingface.states import plain
from tensorlist.provenance.record import build_training_record, optimizer_record, spec

_WHERE = "validation.function"


def metric_key(args) -> str:
    """The ``log_history`` key of the evaluation value the record holds."""
    name = getattr(args, "metric_for_best_model", None) or "loss"
    return name if name.startswith("eval_") else f"eval_{name}"


def epoch_history(log_history: List[Mapping], done: int, metric: str = "eval_loss"):
    """Per-epoch (training loss, validation, learning rate) from the Trainer's ``log_history``.

    An epoch's training loss is the mean of the ``loss`` values logged in it,
    its validation the last ``metric`` value, its rate the last
    ``learning_rate``; an epoch with nothing logged gets null. An entry
    logged at epoch ``e`` (fractional mid-epoch) counts in epoch ``ceil(e)``.
    """
    losses: List[List[float]] = [[] for _ in range(done)]
    valid: List[Optional[float]] = [None] * done
    rates: List[Optional[float]] = [None] * done
    for entry in log_history:
        epoch = entry.get("epoch")
        if not isinstance(epoch, (int, float)) or not math.isfinite(epoch):
            continue
        i = max(math.ceil(epoch - 1e-9), 1) - 1
        if i >= done:
            continue
        if isinstance(entry.get("loss"), (int, float)):
            losses[i].append(float(entry["loss"]))
        if isinstance(entry.get(metric), (int, float)):
            valid[i] = float(entry[metric])
        if isinstance(entry.get("learning_rate"), (int, float)):
            rates[i] = float(entry["learning_rate"])
    return [sum(v) / len(v) if v else None for v in losses], valid, rates


def per_group(rate: Optional[float], groups: List[Mapping]):
    """The logged rate (group 0's) for every group: a scheduler scales each group's starting rate alike."""
    first = groups[0].get("initial_lr")
    if rate is None or not first:
        return [None] * len(groups)
    return [None if g.get("initial_lr") is None else rate * g["initial_lr"] / first for g in groups]


def _strategy(args) -> str:
    value = getattr(args, "eval_strategy", "no")
    return str(getattr(value, "value", value))


def _every(trainer, strategy: str) -> int:
    """Epochs between evaluations: 1 by epoch; by steps, the steps between them over an epoch's steps, rounded up."""
    if strategy != "steps":
        return 1
    args = trainer.args
    steps = getattr(trainer.state, "eval_steps", None) or args.eval_steps or args.logging_steps
    loader = getattr(trainer.callback_handler, "train_dataloader", None)
    try:
        per_epoch = len(loader) // max(1, int(args.gradient_accumulation_steps))
    except TypeError:  # no loader yet, or one without a length
        return 1
    if not per_epoch or not steps:
        return 1
    return max(1, math.ceil(steps / per_epoch))


def _function(trainer, metric: str) -> dict:
    """The evaluation's function as a spec: the loss the Trainer computes, or ``compute_metrics``."""
    if metric == "eval_loss":
        chosen = trainer.compute_loss_func
        if chosen is None:
            model = trainer.accelerator.unwrap_model(trainer.model)
            chosen = type(model).forward  # the model computes its own loss from the labels
    else:
        chosen = trainer.compute_metrics
    if chosen is None:
        chosen = type(trainer).evaluate
    return spec(chosen, where=_WHERE)


def _dataset_record(data) -> Optional[dict]:
    if data is None:
        return None
    if isinstance(data, Mapping):  # several evaluation sets, by name
        return {"datasets": {str(k): _dataset_record(v) for k, v in data.items()}}
    out = {"name": type(data).__qualname__}
    if hasattr(data, "__len__"):
        out["size"] = len(data)
    return out


def validation(trainer, metric: str, dataset_params: Optional[Mapping]) -> Optional[dict]:
    """The record's ``validation`` for a Trainer: None when it neither evaluates nor has logged ``metric``.

    ``dataset_params``: the evaluation data's record; None for the
    evaluation dataset's class name and length.
    """
    strategy = _strategy(trainer.args)
    logged = any(metric in entry for entry in trainer.state.log_history or [])
    if strategy == "no" and not logged:
        return None
    args = trainer.args
    data = dict(dataset_params) if dataset_params is not None else _dataset_record(trainer.eval_dataset)
    return {
        "dataset_params": data,
        # the Trainer's evaluation loader: a SequentialSampler over the whole set
        "loader": {"batch_size": int(args.per_device_eval_batch_size), "shuffle": False,
                   "drop_last": bool(args.dataloader_drop_last), "sampler": None},
        "every": _every(trainer, strategy),
        "function": _function(trainer, metric),
    }


def best_weights(state, metric: str, done: int) -> Optional[Tuple[int, float]]:
    """(epoch, value) of the best checkpoint's weights, from ``state.best_metric`` and ``best_global_step``.

    The epoch is the one its evaluation counts in (see :func:`epoch_history`),
    at most ``done``; None when the state does not say.
    """
    value, step = state.best_metric, getattr(state, "best_global_step", None)
    if not isinstance(value, (int, float)) or not math.isfinite(value) or not step:
        return None
    for entry in state.log_history or []:
        epoch = entry.get("epoch")
        if entry.get("step") == step and metric in entry and isinstance(epoch, (int, float)) and math.isfinite(epoch):
            return min(done, max(1, math.ceil(epoch - 1e-9))), float(value)
    return None


def trainer_record(trainer, kind: str = "final"):
    """The training record of a ``TensorListTrainer``'s weights now (None before it has an optimizer).

    Filled from what the Trainer knows: the optimizer's groups and the
    scheduler as they were when training started, ``TrainingArguments.seed``,
    the hash of the starting weights, the loader's settings, the epochs asked
    and completed (``state.epoch``, counted from 1), the per-epoch history
    from ``state.log_history`` and, in ``solver.solver_params``, the global
    step, the whole ``log_history`` and the training arguments. A Trainer
    that evaluates gets a ``validation`` section and each epoch's last
    ``eval_<metric_for_best_model>`` (``eval_loss`` by default) in the
    history; a final save after ``load_best_model_at_end`` loaded the best
    checkpoint is ``best_validation`` weights (:func:`best_weights`).
    """
    start = getattr(trainer, "_tensorlist_start", None) or {}
    opt_section = start.get("optimizer")
    if opt_section is None:
        if trainer.optimizer is None:
            return None
        sched = None if trainer.lr_scheduler is None else plain(trainer.lr_scheduler)
        opt_section = optimizer_record(plain(trainer.optimizer), model=trainer.model, scheduler=sched,
                                       scheduler_step=None if sched is None else "batch")
    st, args = trainer.state, trainer.args
    done = int(math.floor((st.epoch or 0) + 1e-9))
    asked = math.ceil(st.num_train_epochs) if getattr(st, "num_train_epochs", None) else math.ceil(args.num_train_epochs)
    metric = metric_key(args)
    loss, valid, rates = epoch_history(st.log_history or [], done, metric)
    groups = opt_section.get("parameter_groups")
    if groups and len(groups) > 1:
        rates = [per_group(r, groups) for r in rates]
    best = getattr(trainer, "_tensorlist_best", False) and kind == "final" and best_weights(st, metric, done)
    loader = getattr(trainer.callback_handler, "train_dataloader", None)
    if loader is None:
        loader = {"batch_size": args.per_device_train_batch_size, "shuffle": None,
                  "drop_last": bool(args.dataloader_drop_last), "sampler": None}
    return build_training_record(
        optimizer=opt_section, train_loader=loader, epochs_asked=max(asked, done), epochs_done=done,
        training_loss=loss, validation_values=valid, learning_rates=rates, model=trainer.model, seed=args.seed,
        weights_kind="best_validation" if best else kind, weights_epoch=best[0] if best else done,
        weights_validation=best[1] if best else None,
        validation=validation(trainer, metric, getattr(trainer, "tensorlist_eval_dataset_params", None)),
        initial_weights_sha256=start.get("initial_weights_sha256"),
        initial_weights=start.get("initial_weights") or trainer.tensorlist_initial_weights,
        solver=type(trainer), solver_params={
            "global_step": int(st.global_step), "epoch": st.epoch, "max_steps": int(st.max_steps or 0),
            "validation_metric": metric,
            "log_history": list(st.log_history or []), "training_args": loads_strict(args.to_json_string()),
        },
    )
