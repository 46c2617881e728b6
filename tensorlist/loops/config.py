"""The loops' shared parameters: :class:`LoopConfig`, defined, checked and documented once.

``epochs``, ``swa_epochs`` and ``with_swa`` take about twenty-five parameters
in common. Each builds one frozen :class:`LoopConfig` from its arguments
(:meth:`LoopConfig.from_arguments`), which applies the loop's own defaults,
checks every value before anything happens (no side effects: the model is
moved and ``out_dir`` made when the run starts) and computes what the
training record states about the loop. :func:`shared_docs` appends the one
Args/Returns/Raises text to each loop's docstring.

Imports ``record`` (the data record's check) and ``loops.batches``,
``loops.schedules``, ``loops.state``.
"""
from __future__ import annotations

import dataclasses
import os
import types
from typing import Any, Callable, FrozenSet, Mapping, Optional, Tuple, Union

from tensorlist.crypto.keys import as_key
from tensorlist.provenance.record import validate_dataset_params
from tensorlist.loops.batches import supervised_step
from tensorlist.loops.schedules import CyclicSWA, Decrement, Noop
from tensorlist.loops.state import Events

__all__ = ["LoopConfig", "shared_docs", "ARGS_DOC", "RETURNS_DOC", "CHECKPOINT_FORMATS"]

#: The loops, by the name of their public function.
LOOPS = ("epochs", "swa_epochs", "with_swa")

#: ``checkpoint_format`` values and the default checkpoint name in ``out_dir`` for each:
#: one document written by rank 0, or a DCP directory every rank writes its shards into.
CHECKPOINT_FORMATS = {"document": "checkpoint.json", "sharded": "checkpoint.dcp"}


@dataclasses.dataclass(frozen=True)
class LoopConfig:
    """Everything a run of a loop is given, normalised (see :data:`ARGS_DOC` for the arguments).

    Attributes beyond the arguments of the same name:
        loop: ``"epochs"``, ``"swa_epochs"`` or ``"with_swa"``.
        step: the step (``supervised_step(loss_fn)`` when none was given).
        max_epochs: the first phase's epoch limit (``with_swa``: ``warmup_epochs``).
        swa_epochs: ``with_swa``'s SWA epochs, else None.
        checkpoint: the checkpoint path (``out_dir/checkpoint.json``, or
            ``out_dir/checkpoint.dcp`` when sharded, by default), or None.
        checkpoint_format: ``"document"`` or ``"sharded"`` (see :data:`ARGS_DOC`).
        min_epochs: ``return_min_validation_loss_model`` as True or a frozenset of epochs.
        schedule: the first phase's factor schedule (``swa_epochs``: its SWA
            schedule), the one the training record names.
        swa_schedule: the SWA phase's schedule (``swa_epochs``, ``with_swa``).
        smoothing: ``validation_loss_exponential_smoothing_factor``.
        handlers: ``{Events: (fns...)}``.
        dataset_params: the data record, checked (``{"name": None}`` when none was given).
        solver_params: the given ones updated with the loop's settings, for the training record.
    """

    loop: str
    model: Any
    optimizer: Any
    train: Any
    step: Callable
    max_epochs: int
    swa_epochs: Optional[int]
    validation: Any
    training_callback: Optional[Callable]
    validation_callback: Optional[Callable]
    checkpoint: Any
    checkpoint_format: str
    out_dir: Any
    resume: Any
    validation_frequency: int
    min_epochs: Union[bool, FrozenSet[int]]
    schedule: Any
    swa_schedule: Any
    lr_scheduler: Any
    accumulate_gradient_over_n_batches: int
    smoothing: float
    forward_pass_after_training: bool
    handlers: Mapping[Events, Tuple[Callable, ...]]
    progress: Optional[bool]
    dataset_params: Mapping
    seed: Optional[int]
    initial_weights: Optional[Mapping]
    solver_params: Mapping[str, Any]
    device: Any
    signing_key: Any = None
    encryption_key: Any = None

    @property
    def solver(self) -> str:
        """The loop's name in the training record."""
        return f"tensorlist.loops.{self.loop}"

    @property
    def epochs_asked(self) -> int:
        """All the epochs the call asks for (both phases of ``with_swa``)."""
        return self.max_epochs + (self.swa_epochs or 0)

    def epochs_of(self, phase: str) -> int:
        """The epoch limit of a phase (``"simple"`` or ``"swa"``)."""
        if phase == "swa" and self.loop == "with_swa":
            return self.swa_epochs
        return self.max_epochs

    @classmethod
    def from_arguments(cls, loop: str, args: Mapping[str, Any]) -> "LoopConfig":
        """The config of a call to the loop ``loop`` with the arguments ``args`` (its ``locals()``).

        Raises:
            TypeError: neither ``step`` nor ``loss_fn``, or ``dataset_params`` not a mapping.
            ValueError: a setting out of range, an unknown event.
            FormatError: an invalid ``dataset_params``.
        """
        a = dict(args)
        swa_epochs = swa_schedule = None
        if loop == "epochs":
            max_epochs, schedule = a["max_epochs"], a["learning_rate_schedule"] or Noop()
        elif loop == "swa_epochs":
            max_epochs = a["max_epochs"]
            schedule = swa_schedule = a["swa_schedule"] or CyclicSWA()
            a.update(return_min_validation_loss_model=(), validation_loss_exponential_smoothing_factor=1.0)
        elif loop == "with_swa":
            max_epochs, swa_epochs = a["warmup_epochs"], int(a["swa_epochs"])
            schedule = a["learning_rate_schedule"] or Decrement(20, 0.5)
            swa_schedule = a["swa_schedule"] or CyclicSWA()
            a["validation_frequency"] = 1  # lamp's withSWA validates every epoch
        else:
            raise ValueError(f"unknown loop {loop!r}; expected one of {LOOPS}")
        step = a["step"]
        if step is None:
            if a["loss_fn"] is None:
                raise TypeError("give step= (step(model, batch) -> (loss, n)) or loss_fn=")
            step = supervised_step(a["loss_fn"], a["device"])
        if a["validation_frequency"] < 1:
            raise ValueError(f"validation_frequency must be >= 1, got {a['validation_frequency']!r}")
        smoothing = a["validation_loss_exponential_smoothing_factor"]
        if not 0 < smoothing <= 1:
            raise ValueError(f"validation_loss_exponential_smoothing_factor must be in (0, 1], got {smoothing!r}")
        rm = a["return_min_validation_loss_model"]
        min_epochs = True if rm is True else frozenset(int(e) for e in (rm or ()))
        handlers = {}
        for ev, fns in (a["handlers"] or {}).items():
            handlers[Events(ev)] = tuple(fns) if isinstance(fns, (list, tuple)) else (fns,)
        dataset_params = a["dataset_params"] if a["dataset_params"] is not None else {"name": None}
        validate_dataset_params(dataset_params, field_prefix="dataset_params")
        checkpoint, out_dir = a["checkpoint"], a["out_dir"]
        checkpoint_format = a.get("checkpoint_format", "document")
        if checkpoint_format not in CHECKPOINT_FORMATS:
            raise ValueError(f"checkpoint_format must be one of {sorted(CHECKPOINT_FORMATS)}, got "
                             f"{checkpoint_format!r}")
        if out_dir is not None and checkpoint is None:
            checkpoint = os.path.join(out_dir, CHECKPOINT_FORMATS[checkpoint_format])
        solver_params = dict(a["solver_params"] or {})
        solver_params.update({
            "max_epochs": int(max_epochs), "validation_frequency": int(a["validation_frequency"]),
            "accumulate_gradient_over_n_batches": int(a["accumulate_gradient_over_n_batches"]),
            "validation_loss_exponential_smoothing_factor": float(smoothing),
            "return_min_validation_loss_model": True if min_epochs is True else sorted(min_epochs),
        })
        if loop == "with_swa":
            solver_params.update({"warmup_epochs": int(max_epochs), "swa_epochs": swa_epochs})
        return cls(
            loop=loop, model=a["model"], optimizer=a["optimizer"], train=a["train"], step=step,
            max_epochs=int(max_epochs), swa_epochs=swa_epochs, validation=a["validation"],
            training_callback=a["training_callback"], validation_callback=a["validation_callback"],
            checkpoint=checkpoint, checkpoint_format=checkpoint_format, out_dir=out_dir, resume=a["resume"],
            validation_frequency=int(a["validation_frequency"]), min_epochs=min_epochs, schedule=schedule,
            swa_schedule=swa_schedule, lr_scheduler=a["lr_scheduler"],
            accumulate_gradient_over_n_batches=int(a["accumulate_gradient_over_n_batches"]),
            smoothing=float(smoothing), forward_pass_after_training=bool(a.get("forward_pass_after_training")),
            handlers=types.MappingProxyType(handlers), progress=a["progress"], dataset_params=dataset_params,
            seed=a["seed"], initial_weights=a["initial_weights"],
            solver_params=types.MappingProxyType(solver_params), device=a["device"],
            signing_key=a.get("signing_key"), encryption_key=as_key(a.get("encryption_key")),
        )


ARGS_DOC = """
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
        checkpoint: the checkpoint path (default ``out_dir/checkpoint.json``;
            sharded: the directory ``out_dir/checkpoint.dcp``).
        checkpoint_format: ``"document"`` (default): one tensorlist document
            written by rank 0 after every epoch; ``"sharded"``: a
            torch.distributed.checkpoint directory (``tensorlist.dcp``) that
            every rank writes its own shards into, with the loop state as
            JSON, resumable on another number of processes and for FSDP2 /
            DTensor models (docs/LOOPS.md, "Sharded checkpoints").
        out_dir: where model files go (``final.json``,
            ``best_validation.json``); None: no model files.
        resume: True: continue from ``checkpoint`` if it exists; a path:
            continue from that checkpoint (a document file or a sharded
            directory, whichever ``checkpoint_format``); None/False: start afresh.
        validation_frequency: validate when ``epoch % validation_frequency == 0``.
        learning_rate_schedule: a schedule from ``tensorlist.loops.schedules``
            (factor per epoch; a factor <= 0 stops). Default: factor 1.
        lr_scheduler: a torch LR scheduler stepped once per epoch instead
            (its state is checkpointed); the factor schedule then only stops.
        accumulate_gradient_over_n_batches: sum gradients over N batches per step.
        handlers: ``{Events.X: fn or [fns]}``, each called as ``fn(state)``.
        progress: tqdm bars; None: only when stderr is a terminal.
        dataset_params: the training data's record (stored in every model file).
        signing_key: an EC private key (PEM path or ``cryptography`` key): each
            model file and checkpoint saved is signed, ``NAME.sig`` and
            ``NAME.provenance.json`` beside a file, ``model.sig`` and
            ``model.provenance.json`` inside a sharded checkpoint's directory
            (docs/PROVENANCE.md); None: nothing is signed.
        encryption_key: a ``tensorlist.Key`` (or 32 bytes): each model file
            and checkpoint is encrypted with it (tensors and list metadata,
            the training records included; a sharded checkpoint's shards),
            and a resume reads the checkpoint with it. None: nothing is encrypted.
        device: moves the model there; the default step moves each batch there.
        seed: seeds torch, numpy and ``random`` when a fresh run starts
            (a resumed run restores their states from the checkpoint); recorded.
        initial_weights, solver_params: for the training record.
"""

RETURNS_DOC = """
    Returns:
        A :class:`LoopResult`.

    Raises:
        ValueError: a checkpoint of another model, optimizer or loop;
            nothing is overwritten then.
        FileNotFoundError: ``resume`` names a missing file.
"""

_SEE_BELOW = "\n    See the arguments below (shared by the three loops).\n    "


def shared_docs(fn: Callable) -> Callable:
    """Appends :data:`ARGS_DOC` and :data:`RETURNS_DOC` to a loop's docstring, in place of its pointer to them."""
    fn.__doc__ = fn.__doc__.replace(_SEE_BELOW, "") + ARGS_DOC + RETURNS_DOC
    return fn
