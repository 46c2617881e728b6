"""Hugging Face without pickles: Accelerate's ``save_state``/``load_state`` and transformers' ``Trainer``.

Both write every state as a tensorlist file (tensors in the data file, the rest
as strict JSON in the descriptor's metadata), and every model file they write
is a model file (docs/TRAINING_RECORD.md): it carries the training record and
the data record, which ``tensorlist record FILE`` prints. Nothing here unpickles
anything: a directory holding pickles (``*.bin``, ``*.pkl``, ``*.pt``,
``*.pth``, what the stock savers write) is refused with :class:`FormatError`,
saying how to convert it.

Accelerate (:func:`save_state`, :func:`load_state`) writes, in one directory,
accelerate's own file names with ``.json`` descriptors: ``model.json``
(``model_<i>.json`` for more models), ``optimizer.json``, ``scheduler.json``,
``sampler.json``, ``scaler.json``, ``custom_checkpoint_<i>.json``, one
``random_states_<rank>.json`` per process and, last, the manifest
``tensorlist_state.json`` (each descriptor's SHA-256). They are functions taking the
accelerator, not the ``register_save_state_pre_hook`` hooks: a save pre-hook
sees only ``(models, weights, output_dir)``, so it can keep the model files
from being written but not the optimizers', schedulers' and samplers' (written
by ``save_accelerator_state`` from lists the hook is not given) nor the
``random_states_<rank>.pkl`` pickle (written unconditionally); a load pre-hook
sees ``(models, input_dir)`` and ``load_accelerator_state`` then reads
``optimizer.bin`` whatever the hook did. The functions still call the hooks
registered on the accelerator, as ``Accelerator.save_state`` does, so hooks
that save extra files (diffusers') keep working.

transformers (:data:`TensorListTrainer`, a ``transformers.Trainer`` subclass
made on first use) writes ``checkpoint-N/`` as ``model.json``,
``optimizer.json``, ``scheduler.json``, ``scaler.json``, ``rng_state.json``
(``rng_state_<rank>.json`` on several processes), ``config.json``,
``training_args.json`` (``TrainingArguments.to_json_string``, not the pickled
``training_args.bin``) and the Trainer's own ``trainer_state.json``, and
resumes from it through ``trainer.train(resume_from_checkpoint=...)``. The
weights are exported for ``from_pretrained`` by :func:`export_pretrained` (or
``export_safetensors=True``, which writes ``model.safetensors`` beside). A
trusted stock checkpoint is rewritten by ``convert_stock_checkpoint``, the one
call that unpickles (the stock loaders, ``torch.load(weights_only=True)``).

Only single-device and DDP runs are handled: FSDP, DeepSpeed, Megatron-LM,
XLA and SageMaker saves raise NotImplementedError (sharded state belongs to
``tensorlist.dcp``). Nothing imports this module; it imports accelerate and
transformers only where they are used. See docs/LOOPS.md ("Hugging Face").
"""
from __future__ import annotations

import functools
import logging
import math
import os
import re
import shutil
from typing import Any, Dict, List, Mapping, Optional

import torch

from . import _hf_accelerate as checkpoint_dirs, _hf_record as trainer_state, _hf_signing, reader, writer
from ._commit import atomic_file
from ._jsonio import dumps, from_tagged, loads_strict, to_tagged
from ._states import check_like, check_rng_state, check_sampler_state
from .errors import FormatError
from .format import Limits, confine, read_json_file, read_regular, sha256_file
from .loops.state import rng_state, set_rng_state
from .record import (
    TrainingRecorder, build_training_record, optimizer_record, read_training_record, save_model_file, weights_sha256,
)
from .torch import load_module_state, load_optimizer_state, load_state as load_tensors, save_optimizer_state

__all__ = [
    "STATE_FORMAT", "save_state", "load_state", "save_state_file", "read_state_file", "refuse_pickles",
    "export_pretrained", "TensorListTrainer", "trainer_record", "last_checkpoint",
]

#: Version marker of the small state files (scheduler, sampler, scaler, RNG, custom objects).
STATE_FORMAT = "tensorlist.hf-state/1"

#: File names the stock savers write with pickle (torch.save): a directory holding one is refused.
PICKLE_NAME = re.compile(r"\.(bin|pkl|pt|pth)\Z")

#: The manifest :func:`save_state` commits last: each descriptor's SHA-256, so a save killed midway
#: (or files of two saves mixed in one directory) is refused on load instead of resuming a mixture.
MANIFEST_FILE = "tensorlist_state.json"
MANIFEST_FORMAT = "tensorlist.hf-accelerate-state/1"

#: The Trainer's descriptor names inside ``checkpoint-N/``.
MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, SCALER_FILE = "model.json", "optimizer.json", "scheduler.json", "scaler.json"
TRAINING_ARGS_FILE = "training_args.json"

_ACCELERATE_HOW = ("convert it once, only if you trust it: `accelerator.load_state(dir)` (which unpickles), then "
                   "`tensorlist.huggingface.save_state(accelerator, new_dir)`")
_TRAINER_HOW = ("convert it once, only if you trust it: `TensorListTrainer(...).convert_stock_checkpoint(dir, "
                "new_dir)` (reads the pickles with torch.load(weights_only=True), as the stock Trainer does), then "
                "resume from new_dir")

_log = logging.getLogger("tensorlist.huggingface")


# --------------------------------------------------------------------------
# the pieces both integrations share


def refuse_pickles(directory, *, how: str = _TRAINER_HOW) -> None:
    """Raises FormatError when ``directory`` holds a pickle file of a stock checkpoint (never opened).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); open(os.path.join(d, "optimizer.pt"), "wb").close()
        >>> refuse_pickles(d, how="convert it")
        Traceback (most recent call last):
        ...
        tensorlist.errors.FormatError: ...: holds pickle files ['optimizer.pt'] (a stock checkpoint); ...
    """
    directory = os.fspath(directory)
    found = sorted(n for n in os.listdir(directory) if PICKLE_NAME.search(n))
    if found:
        raise FormatError(f"holds pickle files {found} (a stock checkpoint); tensorlist never unpickles: {how}",
                          file=directory)


def save_state_file(path, kind: str, state: Any, *, tensors: Optional[Mapping] = None, **metadata) -> None:
    """Saves a state of plain values (a scheduler's, a sampler's, a scaler's) as a tensorlist file.

    The state goes into the metadata as tagged JSON (tuples, non-finite
    floats and non-str keys kept); a tensor in it is refused (TypeError,
    naming where): pass the tensors a state needs (a generator's state) as
    ``tensors``, a name -> tensor mapping saved as the file's TensorList.

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "scheduler.json")
        >>> save_state_file(p, "scheduler", {"last_epoch": 3, "base_lrs": [0.1]})
        >>> read_state_file(p, "scheduler")
        {'last_epoch': 3, 'base_lrs': [0.1]}
    """
    meta = {"format": STATE_FORMAT, "kind": kind, "state": to_tagged(state, kind), **metadata}
    writer.save(path, dict(tensors or {}), metadata=meta)


def _state_metadata(path, kind: str) -> Mapping:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no {kind} state (was the checkpoint saved with the same objects?)")
    with reader.Reader(path) as r:
        meta = r.metadata
    if not isinstance(meta, Mapping) or meta.get("format") != STATE_FORMAT:
        raise FormatError(f"not a {STATE_FORMAT!r} file", file=path, field="metadata.format")
    if meta.get("kind") != kind:
        raise FormatError(f"holds a {meta.get('kind')!r} state, expected {kind!r}", file=path, field="metadata.kind")
    if "state" not in meta:
        raise FormatError("no state", file=path, field="metadata.state")
    return meta


def read_state_file(path, kind: str, *, with_tensors: bool = False, like: Any = None) -> Any:
    """The state :func:`save_state_file` wrote (FormatError naming the file when it is another kind).

    With ``with_tensors``: ``(state, tensors)``, the tensors as torch tensors
    in private memory. With ``like`` (the live object's ``state_dict()``):
    a state of other keys or JSON types is a FormatError naming the field.
    """
    state = from_tagged(_state_metadata(path, kind)["state"], file=os.fspath(path), where="metadata.state")
    if like is not None:
        check_like(state, like, file=os.fspath(path), field="metadata.state")
    if not with_tensors:
        return state
    return state, load_tensors(path, mmap=False)


def _save_rng(path, **extra) -> None:
    tensors, meta = rng_state()
    writer.save(path, tensors, metadata={"format": STATE_FORMAT, "kind": "rng", "state": meta, **extra})


def _load_rng(path, *, restore: bool = True) -> tuple:
    """(the file's metadata, the checked states); the generators take them unless ``restore`` is False."""
    meta = _state_metadata(path, "rng")
    states = check_rng_state(reader.load(os.fspath(path)), meta["state"], file=os.fspath(path),
                             field="metadata.state", tensors_field="tensors")
    if restore:
        set_rng_state(*states)
    return meta, states


def _plain(obj):
    """The torch object an accelerate wrapper (AcceleratedOptimizer, AcceleratedScheduler) holds."""
    for attr in ("optimizer", "scheduler"):
        inner = getattr(obj, attr, None)
        if inner is not None and type(obj).__module__.startswith("accelerate"):
            return inner
    return obj


def export_pretrained(checkpoint, output_dir, *, model_file: str = MODEL_FILE) -> str:
    """Writes ``model.safetensors`` and ``config.json`` for ``from_pretrained`` from a tensorlist model file.

    Args:
        checkpoint: a directory holding ``model.json`` (and ``config.json``,
            copied with ``generation_config.json`` when present), or the model
            file itself.
        output_dir: where to write (made if needed); may be the checkpoint.
        model_file: the descriptor's name inside a directory.

    Returns:
        The path of the ``model.safetensors`` written. Its metadata holds
        ``format: pt`` and the training record as JSON text under
        ``tensorlist.training`` when the file has one.
    """
    from safetensors.torch import save_file

    checkpoint = os.fspath(checkpoint)
    source = confine(checkpoint, model_file) if os.path.isdir(checkpoint) else checkpoint
    os.makedirs(output_dir, exist_ok=True)
    # clones: safetensors refuses tensors sharing storage, and every tensor of a mapped file does
    weights = {k: v.clone() for k, v in load_tensors(source).items()}
    meta = {"format": "pt"}
    with reader.Reader(source) as r:
        training = r.metadata.get("training") if isinstance(r.metadata, Mapping) else None
    if training is not None:
        meta["tensorlist.training"] = dumps(training)
    out = os.path.join(output_dir, "model.safetensors")
    with atomic_file(out) as tmp:
        save_file(weights, tmp, metadata=meta)
    here = os.path.dirname(source)
    for name in ("config.json", "generation_config.json"):
        src, dst = confine(here, name), os.path.join(output_dir, name)
        if os.path.lexists(src) and os.path.abspath(src) != os.path.abspath(dst):
            text = read_regular(src, Limits().max_descriptor_bytes, what=name)
            with atomic_file(dst) as tmp, open(tmp, "wb") as f:
                f.write(text)
    return out


# --------------------------------------------------------------------------
# Accelerate


def _check_distributed(accelerator) -> None:
    kind = str(getattr(accelerator, "distributed_type", "")).rsplit(".", 1)[-1]
    if kind in ("FSDP", "DEEPSPEED", "MEGATRON_LM", "XLA"):
        raise NotImplementedError(f"tensorlist.huggingface: {kind} saves are sharded; use tensorlist.dcp for them")


def _numbered(base: str, i: int, ext: str = ".json") -> str:
    return f"{base}{ext}" if i == 0 else f"{base}_{i}{ext}"


def _accelerate_record(accelerator, model, training, dataset_params):
    """(record, data record) for a model file of ``save_state``; (None, None) with no optimizer to describe."""
    data = {} if dataset_params is None else dict(dataset_params)
    if isinstance(training, TrainingRecorder):
        return training.record("checkpoint"), data
    if training is not None:
        return training, data
    if not accelerator._optimizers:
        return None, None
    sched = _plain(accelerator._schedulers[0]) if accelerator._schedulers else None
    loaders = accelerator._dataloaders
    loader = loaders[0] if loaders else {"batch_size": None, "shuffle": None, "drop_last": False, "sampler": None}
    record = build_training_record(
        optimizer=_plain(accelerator._optimizers[0]), model=model, scheduler=sched,
        scheduler_step=None if sched is None else "batch", train_loader=loader,
        epochs_asked=0, epochs_done=0, training_loss=[], weights_kind="checkpoint",
        solver="accelerate.Accelerator", solver_params={"step": int(accelerator.step)},
    )
    return record, data


def save_state(accelerator, output_dir=None, *, training=None, dataset_params: Optional[Mapping] = None) -> str:
    """``accelerator.save_state(output_dir)`` as tensorlist files: no pickle in the directory.

    Saves each prepared model (``model.json``, a model file), optimizer
    (``tensorlist.torch.save_optimizer_state``), scheduler, the seedable
    samplers' and stateful loaders' states, the gradient scaler, objects
    registered with ``register_for_checkpointing`` (their ``state_dict`` as
    plain values) and each process's RNG states with ``accelerator.step``.
    The accelerator's save pre-hooks run first, as in ``save_state``.

    Each file is replaced atomically and the manifest (``tensorlist_state.json``,
    every descriptor's SHA-256) is committed last, so :func:`load_state`
    refuses a save cut short, or files of two saves mixed. Save each
    checkpoint into a new directory (as accelerate's automatic naming does)
    to keep the previous one loadable while the next is written.

    Args:
        accelerator: an ``accelerate.Accelerator`` after ``prepare``.
        output_dir: the checkpoint directory (made if needed). Under the
            accelerator's automatic checkpoint naming it is ignored, as by
            ``Accelerator.save_state``: the save goes to
            ``<project_dir>/checkpoints/checkpoint_<iteration>``, the oldest
            beyond ``total_limit`` are removed once it is complete, and
            ``project_configuration.iteration`` moves on only then.
        training: the model files' training record: a
            ``tensorlist.record.TrainingRecorder`` (its ``checkpoint`` record; its ``signing_key`` signs the save),
            a record, or None for one built from the first optimizer,
            scheduler and loader (no history: the loop is the caller's).
        dataset_params: the data record (default ``{}``).

    Returns:
        The directory written.

    Raises:
        ValueError: no ``output_dir`` without automatic naming, or the
            automatic ``checkpoint_<iteration>`` exists already.
        NotImplementedError: an FSDP, DeepSpeed, Megatron-LM or XLA run.
        TypeError: a scheduler, sampler or custom state holding values JSON
            cannot hold (naming where).
    """
    _check_distributed(accelerator)
    with checkpoint_dirs.saving(accelerator, output_dir) as target:
        _write_state(accelerator, target, training, dataset_params)
        _hf_signing.sign_state(accelerator, target, training)
    return target


def _write_state(accelerator, output_dir: str, training, dataset_params) -> None:
    """The files of :func:`save_state`, into ``output_dir``."""
    os.makedirs(output_dir, exist_ok=True)
    main = accelerator.is_main_process
    if main and os.path.exists(os.path.join(output_dir, MANIFEST_FILE)):
        # a save into an earlier save's directory replaces its files one by one: without the old
        # manifest, a load while (or after) this save is cut short is refused as incomplete
        os.remove(os.path.join(output_dir, MANIFEST_FILE))
    models = accelerator._models
    weights = [accelerator.get_state_dict(m, unwrap=True) for m in models]
    for hook in accelerator._save_model_state_pre_hook.values():
        hook(models, weights, output_dir)
    written: List[str] = []

    def at(name: str) -> str:
        written.append(name)
        return os.path.join(output_dir, name)

    if main:
        for i, state in enumerate(weights):
            model = accelerator.unwrap_model(models[i]) if i < len(models) else None
            record, data = _accelerate_record(accelerator, model, training, dataset_params)
            path = at(_numbered("model", i))
            if record is None:
                writer.save(path, {k: v.detach() for k, v in state.items()})
            else:
                save_model_file(path, state, training=record, dataset_params=data)
        for i, opt in enumerate(accelerator._optimizers):
            save_optimizer_state(at(_numbered("optimizer", i)), opt)
        for i, sched in enumerate(accelerator._schedulers):
            save_state_file(at(_numbered("scheduler", i)), "scheduler", sched.state_dict())
        for i, loader in enumerate(accelerator._dataloaders):
            state, tensors = _loader_state(loader)
            if state or tensors:
                save_state_file(at(_numbered("sampler", i)), "sampler", state, tensors=tensors)
        if accelerator.scaler is not None:
            save_state_file(at("scaler.json"), "scaler", accelerator.scaler.state_dict())
        for i, obj in enumerate(accelerator._custom_objects):
            save_state_file(at(f"custom_checkpoint_{i}.json"), "custom", obj.state_dict())
    _save_rng(os.path.join(output_dir, f"random_states_{accelerator.process_index}.json"), step=int(accelerator.step))
    accelerator.wait_for_everyone()
    if main:  # last, once every process has written its RNG states
        written += [f"random_states_{r}.json" for r in range(accelerator.num_processes)]
        _write_manifest(output_dir, written)
    accelerator.wait_for_everyone()


def _sha256_of(path: str) -> str:
    return sha256_file(path, Limits().max_descriptor_bytes, what="descriptor")  # a regular file, bounded


def _write_manifest(output_dir: str, names: List[str]) -> None:
    files = {n: _sha256_of(os.path.join(output_dir, n)) for n in names}
    doc = {"format": MANIFEST_FORMAT, "files": files}
    with atomic_file(os.path.join(output_dir, MANIFEST_FILE)) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(dumps(doc) + "\n")


def _read_manifest(input_dir: str) -> Mapping:
    path = confine(input_dir, MANIFEST_FILE)
    if not os.path.exists(path):
        raise FormatError(f"no {MANIFEST_FILE}: not a complete tensorlist.huggingface.save_state "
                          "(a save killed midway leaves none)", file=input_dir)
    doc = read_json_file(path, Limits())
    if not isinstance(doc, Mapping) or doc.get("format") != MANIFEST_FORMAT or not isinstance(doc.get("files"), Mapping):
        raise FormatError(f"not a {MANIFEST_FORMAT!r} manifest", file=path, field="format")
    return doc["files"]


def _checked(input_dir: str, files: Mapping, name: str) -> str:
    """The path of descriptor ``name``, once its bytes are those the manifest lists."""
    path = confine(input_dir, name)
    if name not in files:
        raise FileNotFoundError(f"{path}: not part of the saved state ({MANIFEST_FILE} does not list it)")
    if not os.path.exists(path):
        raise FormatError(f"listed in {MANIFEST_FILE} but missing", file=path)
    if _sha256_of(path) != files[name]:
        raise FormatError(f"is not the file {MANIFEST_FILE} lists (rewritten by a later save killed midway, "
                          "or copied from another checkpoint)", file=path)
    return path


def _loader_state(loader):
    """(state, tensors) of a loader: what accelerate pickles (a SeedableRandomSampler's epoch and seed, a
    stateful loader's state) and the generator its shards draw the order from, which accelerate does not save.

    On several processes ``prepare`` gives a shuffling sampler a generator of its own, seeded from torch's
    global one, and each epoch's order comes from it: a resumed run needs its state to draw the same order.
    """
    from accelerate.data_loader import SeedableRandomSampler

    state, tensors = {}, {}
    sampler = loader.get_sampler() if hasattr(loader, "get_sampler") else None
    if isinstance(sampler, SeedableRandomSampler):
        state["seedable_sampler"] = {"epoch": int(sampler.epoch), "initial_seed": int(sampler.initial_seed)}
    if getattr(loader, "use_stateful_dataloader", False):
        state["dataloader"] = loader.state_dict()
    generator = getattr(loader, "synchronized_generator", None)
    if isinstance(generator, torch.Generator) and not isinstance(sampler, SeedableRandomSampler):
        tensors["generator"] = generator.get_state()
    return state, tensors


def load_state(accelerator, input_dir=None, *, strict: bool = True) -> None:
    """Restores what :func:`save_state` wrote into the accelerator's prepared objects.

    ``input_dir`` None under automatic checkpoint naming: the newest complete
    ``<project_dir>/checkpoints/checkpoint_<N>``, as ``Accelerator.load_state()``.

    Raises:
        ValueError: no ``input_dir`` and automatic naming is off.
        FormatError: the directory holds pickles (a stock ``save_state``; the
            message says how to convert it); it has no manifest (a save
            killed midway) or a descriptor is not the one the manifest lists
            (files of two saves mixed); or a file is truncated, lies about
            its contents or is of another kind (naming the file).
        FileNotFoundError: no file for a prepared object was saved.
        KeyError, ValueError: a model or optimizer state does not fit
            (``strict=False`` loads what matches in the models).
    """
    _check_distributed(accelerator)
    input_dir = checkpoint_dirs.load_dir(accelerator, input_dir,
                                         complete=lambda d: os.path.isfile(os.path.join(d, MANIFEST_FILE)))
    refuse_pickles(input_dir, how=_ACCELERATE_HOW)
    files = _read_manifest(input_dir)
    models = list(accelerator._models)
    for hook in accelerator._load_model_state_pre_hook.values():
        hook(models, input_dir)
    # every path checked against the manifest before anything is loaded
    model_paths = [(_checked(input_dir, files, _numbered("model", i)), accelerator.unwrap_model(m))
                   for i, m in enumerate(models)]
    opt_paths = [(_checked(input_dir, files, _numbered("optimizer", i)), o) for i, o in enumerate(accelerator._optimizers)]
    sched_paths = [(_checked(input_dir, files, _numbered("scheduler", i)), s) for i, s in enumerate(accelerator._schedulers)]
    loader_paths = [(_checked(input_dir, files, _numbered("sampler", i)), d)
                    for i, d in enumerate(accelerator._dataloaders) if _numbered("sampler", i) in files]
    custom_paths = [(_checked(input_dir, files, f"custom_checkpoint_{i}.json"), o)
                    for i, o in enumerate(accelerator._custom_objects)]
    scaler_path = None if accelerator.scaler is None else _checked(input_dir, files, "scaler.json")
    rng_path = _checked(input_dir, files, f"random_states_{accelerator.process_index}.json")
    # every state read and checked (_states) before the first object takes one
    opts = [(opt, load_optimizer_state(path, opt, restore=False)) for path, opt in opt_paths]
    scheds = [(s, read_state_file(path, "scheduler", like=s.state_dict())) for path, s in sched_paths]
    loaders = [(d, *check_sampler_state(*read_state_file(path, "sampler", with_tensors=True), _loader_state(d)[0],
                                        file=path)) for path, d in loader_paths]
    scaler = scaler_path and read_state_file(scaler_path, "scaler", like=accelerator.scaler.state_dict())
    customs = [(obj, read_state_file(path, "custom")) for path, obj in custom_paths]
    meta, rng = _load_rng(rng_path, restore=False)
    for path, model in model_paths:
        load_module_state(path, model, strict=strict)
    for opt, sd in opts:
        opt.load_state_dict(sd)
    for sched, state in scheds:
        sched.load_state_dict(state)
    for loader, state, tensors in loaders:
        _set_loader_state(loader, state, tensors)
    if scaler_path is not None:
        accelerator.scaler.load_state_dict(scaler)
    for obj, state in customs:
        obj.load_state_dict(state)
    set_rng_state(*rng)
    if isinstance(meta.get("step"), int):
        accelerator.step = meta["step"]


def _set_loader_state(loader, state: Mapping, tensors: Mapping) -> None:
    generator = getattr(loader, "synchronized_generator", None)
    if "generator" in tensors and isinstance(generator, torch.Generator):
        generator.set_state(tensors["generator"])
    seedable = state.get("seedable_sampler")
    sampler = loader.get_sampler() if hasattr(loader, "get_sampler") else None
    if seedable is not None and sampler is not None:
        sampler.epoch, sampler.initial_seed = int(seedable["epoch"]), int(seedable["initial_seed"])
    if "dataloader" in state and getattr(loader, "use_stateful_dataloader", False):
        loader.load_state_dict(state["dataloader"])


# --------------------------------------------------------------------------
# transformers' Trainer


def trainer_record(trainer, kind: str = "final"):
    """The training record of a :data:`TensorListTrainer`'s weights now (None before it has an optimizer).

    Filled from what the Trainer knows: the optimizer's groups and the
    scheduler as they were when training started, ``TrainingArguments.seed``,
    the hash of the starting weights, the loader's settings, the epochs asked
    and completed (``state.epoch``, counted from 1), the per-epoch history
    from ``state.log_history`` and, in ``solver.solver_params``, the global
    step, the whole ``log_history`` and the training arguments. A Trainer
    that evaluates gets a ``validation`` section and each epoch's last
    ``eval_<metric_for_best_model>`` (``eval_loss`` by default) in the
    history; a final save after ``load_best_model_at_end`` loaded the best
    checkpoint is ``best_validation`` weights (``tensorlist._hf_record``).
    """
    start = getattr(trainer, "_tensorlist_start", None) or {}
    opt_section = start.get("optimizer")
    if opt_section is None:
        if trainer.optimizer is None:
            return None
        sched = None if trainer.lr_scheduler is None else _plain(trainer.lr_scheduler)
        opt_section = optimizer_record(_plain(trainer.optimizer), model=trainer.model, scheduler=sched,
                                       scheduler_step=None if sched is None else "batch")
    st, args = trainer.state, trainer.args
    done = int(math.floor((st.epoch or 0) + 1e-9))
    asked = math.ceil(st.num_train_epochs) if getattr(st, "num_train_epochs", None) else math.ceil(args.num_train_epochs)
    metric = trainer_state.metric_key(args)
    loss, valid, rates = trainer_state.epoch_history(st.log_history or [], done, metric)
    groups = opt_section.get("parameter_groups")
    if groups and len(groups) > 1:
        rates = [trainer_state.per_group(r, groups) for r in rates]
    best = getattr(trainer, "_tensorlist_best", False) and kind == "final" and trainer_state.best_weights(st, metric, done)
    loader = getattr(trainer.callback_handler, "train_dataloader", None)
    if loader is None:
        loader = {"batch_size": args.per_device_train_batch_size, "shuffle": None,
                  "drop_last": bool(args.dataloader_drop_last), "sampler": None}
    return build_training_record(
        optimizer=opt_section, train_loader=loader, epochs_asked=max(asked, done), epochs_done=done,
        training_loss=loss, validation_values=valid, learning_rates=rates, model=trainer.model, seed=args.seed,
        weights_kind="best_validation" if best else kind, weights_epoch=best[0] if best else done,
        weights_validation=best[1] if best else None,
        validation=trainer_state.validation(trainer, metric, getattr(trainer, "tensorlist_eval_dataset_params", None)),
        initial_weights_sha256=start.get("initial_weights_sha256"),
        initial_weights=start.get("initial_weights") or trainer.tensorlist_initial_weights,
        solver=type(trainer), solver_params={
            "global_step": int(st.global_step), "epoch": st.epoch, "max_steps": int(st.max_steps or 0),
            "validation_metric": metric,
            "log_history": list(st.log_history or []), "training_args": loads_strict(args.to_json_string()),
        },
    )


_CHECKPOINT_DIR = re.compile(r"checkpoint-([0-9]{1,18})\Z")


def last_checkpoint(output_dir) -> Optional[str]:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (what ``resume_from_checkpoint=True`` takes).

    Complete: its ``trainer_state.json``, which the Trainer writes last,
    parses, and its ``model.json`` exists; a checkpoint whose save was cut
    short is passed over (the stock ``get_last_checkpoint`` takes it).
    """
    output_dir = os.fspath(output_dir)
    found = []
    for name in os.listdir(output_dir):
        m = _CHECKPOINT_DIR.match(name)
        if m and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), name))
    for _, name in sorted(found, reverse=True):
        path = os.path.join(output_dir, name)
        try:
            read_json_file(confine(path, "trainer_state.json"), Limits())
        except (OSError, FormatError):
            continue
        if os.path.isfile(os.path.join(path, MODEL_FILE)):
            return path
    return None


@functools.lru_cache(maxsize=None)
def _trainer_class():
    import transformers

    class TensorListTrainer(transformers.Trainer):
        """A ``transformers.Trainer`` whose checkpoints are tensorlist files with the training record.

        Use it as the Trainer; resume with ``train(resume_from_checkpoint=...)``
        (a path, or True for the last complete ``checkpoint-N`` in
        ``output_dir``: :func:`last_checkpoint`).

        Args:
            dataset_params: the data record of every model file (default:
                the training dataset's class name and length).
            initial_weights: the record's ``initial_weights`` (default
                ``{"from": None, "origin": None}``: not known).
            export_safetensors: also write ``model.safetensors`` (and the
                config) for ``from_pretrained`` beside each ``model.json``.
            eval_dataset_params: the record of the evaluation data (default:
                the evaluation dataset's class name and length).
            signing_key: an EC private key signing each ``checkpoint-N`` (docs/PROVENANCE.md).
            *args, **kwargs: ``transformers.Trainer``'s.
        """

        def __init__(self, *args, dataset_params: Optional[Mapping] = None,
                     initial_weights: Optional[Mapping] = None, export_safetensors: bool = False,
                     eval_dataset_params: Optional[Mapping] = None, signing_key=None, **kwargs):
            super().__init__(*args, **kwargs)
            self.tensorlist_signing_key = signing_key
            self.tensorlist_eval_dataset_params = None if eval_dataset_params is None else dict(eval_dataset_params)
            self._tensorlist_best = False  # the model holds the best checkpoint's weights (load_best_model_at_end)
            self.tensorlist_dataset_params = None if dataset_params is None else dict(dataset_params)
            self.tensorlist_initial_weights = dict(initial_weights) if initial_weights else None
            self.tensorlist_export_safetensors = bool(export_safetensors)
            self._tensorlist_start: Dict[str, Any] = {}
            self._tensorlist_kind = "final"

        # ---- what the record starts from
        def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
            self._tensorlist_best = False
            if resume_from_checkpoint is True:
                resume_from_checkpoint = last_checkpoint(self.args.output_dir)
                if resume_from_checkpoint is None:
                    raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
            if resume_from_checkpoint:
                refuse_pickles(resume_from_checkpoint)
                if os.path.exists(self._rng_file(resume_from_checkpoint)):  # checked before the model is loaded
                    _load_rng(self._rng_file(resume_from_checkpoint), restore=False)
                record = read_training_record(confine(resume_from_checkpoint, MODEL_FILE))
                read_json_file(confine(resume_from_checkpoint, "trainer_state.json"))  # transformers reads it plainly
                self._tensorlist_start = {"optimizer": record["optimizer"],
                                          "initial_weights_sha256": record["initial_weights_sha256"],
                                          "initial_weights": record["initial_weights"]}
            else:
                self._tensorlist_start = {"initial_weights_sha256": weights_sha256(self.model)}
            return super().train(resume_from_checkpoint=resume_from_checkpoint or None, trial=trial, **kwargs)

        def create_scheduler(self, num_training_steps: int, optimizer=None):
            sched = super().create_scheduler(num_training_steps, optimizer)
            if "optimizer" not in self._tensorlist_start and self.optimizer is not None:
                self._tensorlist_start["optimizer"] = optimizer_record(
                    _plain(self.optimizer), model=self.model, scheduler=_plain(sched), scheduler_step="batch")
            return sched

        def _dataset_params(self) -> dict:
            if self.tensorlist_dataset_params is not None:
                return self.tensorlist_dataset_params
            data = self.train_dataset
            out = {"name": None if data is None else type(data).__qualname__}
            if data is not None and hasattr(data, "__len__"):
                out["size"] = len(data)
            return out

        def _check_plain(self) -> None:
            if self.is_deepspeed_enabled or self.is_fsdp_enabled or self.is_fsdp_xla_enabled:
                raise NotImplementedError("TensorListTrainer: DeepSpeed and FSDP checkpoints are sharded; "
                                          "use tensorlist.dcp for them")

        # ---- saving
        def _save_checkpoint(self, model, trial):
            self._check_plain()
            self._tensorlist_kind = "checkpoint"
            try:
                super()._save_checkpoint(model, trial)
                _hf_signing.sign_checkpoint(self, trial)
            finally:
                self._tensorlist_kind = "final"

        def _save(self, output_dir=None, state_dict=None):
            output_dir = output_dir if output_dir is not None else self.args.output_dir
            os.makedirs(output_dir, exist_ok=True)
            model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
            state = model.state_dict() if state_dict is None else state_dict
            record = trainer_record(self, self._tensorlist_kind)
            path = os.path.join(output_dir, MODEL_FILE)
            if record is None:
                writer.save(path, {k: v.detach() for k, v in state.items()})
            else:
                save_model_file(path, state, training=record, dataset_params=self._dataset_params())
            if hasattr(model, "config") and hasattr(model.config, "save_pretrained"):
                model.config.save_pretrained(output_dir)
                gen = getattr(model, "generation_config", None)
                if gen is not None and getattr(model, "can_generate", lambda: False)():
                    gen.save_pretrained(output_dir)
            if self.tensorlist_export_safetensors:
                export_pretrained(path, output_dir)
            if self.processing_class is not None:
                self.processing_class.save_pretrained(output_dir)
            with atomic_file(os.path.join(output_dir, TRAINING_ARGS_FILE)) as tmp:
                with open(tmp, "w", encoding="utf-8") as f:
                    f.write(self.args.to_json_string())

        def _save_optimizer_and_scheduler(self, output_dir):
            self._check_plain()
            if self.args.should_save:
                save_optimizer_state(os.path.join(output_dir, OPTIMIZER_FILE), self.optimizer)
                save_state_file(os.path.join(output_dir, SCHEDULER_FILE), "scheduler", self.lr_scheduler.state_dict())

        def _save_scaler(self, output_dir):
            scaler = getattr(self.accelerator, "scaler", None)
            if scaler is not None and self.args.should_save:
                save_state_file(os.path.join(output_dir, SCALER_FILE), "scaler", scaler.state_dict())

        def _rng_file(self, directory) -> str:
            name = "rng_state.json" if self.args.world_size <= 1 else f"rng_state_{self.args.process_index}.json"
            return confine(directory, name)

        def _save_rng_state(self, output_dir):
            os.makedirs(output_dir, exist_ok=True)
            _save_rng(self._rng_file(output_dir))

        # ---- resuming
        def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
            self._check_plain()
            refuse_pickles(resume_from_checkpoint)
            model = self.accelerator.unwrap_model(model if model is not None else self.model)
            load_module_state(confine(resume_from_checkpoint, MODEL_FILE), model)

        def _load_optimizer_and_scheduler(self, checkpoint):
            if checkpoint is None or not any(os.path.lexists(os.path.join(checkpoint, n))
                                             for n in (OPTIMIZER_FILE, SCHEDULER_FILE)):
                return  # a save_only_model checkpoint: a fresh optimizer, as the stock Trainer
            sched = read_state_file(confine(checkpoint, SCHEDULER_FILE), "scheduler",
                                    like=self.lr_scheduler.state_dict())
            load_optimizer_state(confine(checkpoint, OPTIMIZER_FILE), self.optimizer)  # checked, then loaded
            self.lr_scheduler.load_state_dict(sched)

        def _load_scaler(self, checkpoint):
            scaler = getattr(self.accelerator, "scaler", None)
            if checkpoint is not None and scaler is not None and os.path.exists(confine(checkpoint, SCALER_FILE)):
                scaler.load_state_dict(read_state_file(confine(checkpoint, SCALER_FILE), "scaler",
                                                       like=scaler.state_dict()))

        def _load_rng_state(self, checkpoint):
            if checkpoint is None:
                return
            path = self._rng_file(checkpoint)  # confined there
            if not os.path.exists(path):
                _log.info("%s: no RNG state; the resumed run is not reproducible", path)
                return
            _load_rng(path)

        def convert_stock_checkpoint(self, checkpoint, output_dir) -> str:
            """Rewrites a stock ``checkpoint-N`` (pickles) as this class's, for a checkpoint you trust.

            The one place anything is unpickled, and only when called: the
            stock Trainer's own loaders read ``optimizer.pt``, ``scheduler.pt``
            and ``rng_state.pth`` (``torch.load(weights_only=True)``) into this
            trainer's model, a new optimizer and scheduler, and the RNG states
            are captured and then put back as they were. ``training_args.bin``
            is never read (this trainer's arguments are written as
            ``training_args.json``); other files but pickles and the weights
            (``trainer_state.json``, tokenizer files) are copied. Resuming from
            ``output_dir`` then continues the stock run.

            Returns:
                ``output_dir``.
            """
            from transformers.trainer_callback import TrainerState

            base = transformers.Trainer
            checkpoint, output_dir = os.fspath(checkpoint), os.fspath(output_dir)
            self._check_plain()
            self.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
            self._tensorlist_start = {"initial_weights_sha256": None}
            base._load_from_checkpoint(self, checkpoint)
            self.optimizer, self.lr_scheduler = None, None
            self.create_optimizer_and_scheduler(num_training_steps=self.state.max_steps)
            base._load_optimizer_and_scheduler(self, checkpoint)
            base._load_scaler(self, checkpoint)
            saved_rng = rng_state()
            self._tensorlist_kind = "checkpoint"
            try:
                base._load_rng_state(self, checkpoint)
                os.makedirs(output_dir, exist_ok=True)
                self._save(output_dir)
                self._save_optimizer_and_scheduler(output_dir)
                self._save_scaler(output_dir)
                self._save_rng_state(output_dir)
            finally:
                set_rng_state(*saved_rng)
                self._tensorlist_kind = "final"
                self.optimizer, self.lr_scheduler = None, None
                self._tensorlist_start = {}
            written = set(os.listdir(output_dir))
            for name in sorted(os.listdir(checkpoint)):
                src = os.path.join(checkpoint, name)
                if (name in written or PICKLE_NAME.search(name) or name.startswith(("model.safetensors", "model-"))
                        or not os.path.isfile(src)):
                    continue
                shutil.copyfile(src, os.path.join(output_dir, name))
            return output_dir

        def _load_best_model(self):
            best = self.state.best_model_checkpoint
            refuse_pickles(best)
            load_module_state(confine(best, MODEL_FILE), self.accelerator.unwrap_model(self.model))
            self._tensorlist_best = True

    TensorListTrainer.__module__ = __name__
    return TensorListTrainer


def __getattr__(name: str):
    # the Trainer subclass needs transformers' Trainer as its base: made (and transformers imported) on first use
    if name == "TensorListTrainer":
        return _trainer_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
