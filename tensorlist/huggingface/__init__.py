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

transformers (:class:`TensorListTrainer`, a ``transformers.Trainer`` subclass
in ``tensorlist.huggingface.trainer``) writes ``checkpoint-N/`` as ``model.json``,
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
transformers only where they are used (``TensorListTrainer``, whose module
imports transformers, on first access). See docs/LOOPS.md ("Hugging Face").
"""
from __future__ import annotations

import os
from typing import List, Mapping, Optional

import torch

from tensorlist.huggingface import accelerate as checkpoint_dirs
from tensorlist.huggingface import signing
from tensorlist import writer
from tensorlist._storage.commit import atomic_file
from tensorlist.crypto import as_key
from tensorlist.huggingface.states import (  # noqa: F401 - re-exported: the file names and state files of both integrations
                         MODEL_FILE, OPTIMIZER_FILE, PICKLE_NAME, SCALER_FILE, SCHEDULER_FILE, STATE_FORMAT,
                         TRAINING_ARGS_FILE, export_pretrained, load_rng, plain, read_state_file, refuse_pickles,
                         save_rng, save_state_file, last_checkpoint)
from tensorlist.huggingface.record import trainer_record  # noqa: F401 - re-exported
from tensorlist.huggingface.pretrained import from_pretrained  # noqa: F401 - re-exported
from tensorlist._base.jsonio import dumps
from tensorlist._base.states import check_sampler_state
from tensorlist.errors import FormatError
from tensorlist.format import Limits, confine, read_json_file, sha256_file
from tensorlist.loops.state import set_rng_state
from tensorlist.provenance.record import TrainingRecorder, build_training_record, save_model_file
from tensorlist.torch import load_module_state, load_optimizer_state, save_optimizer_state

__all__ = [
    "STATE_FORMAT", "save_state", "load_state", "save_state_file", "read_state_file", "refuse_pickles",
    "export_pretrained", "from_pretrained", "TensorListTrainer", "trainer_record", "last_checkpoint",
]

#: The manifest :func:`save_state` commits last: each descriptor's SHA-256, so a save killed midway
#: (or files of two saves mixed in one directory) is refused on load instead of resuming a mixture.
MANIFEST_FILE = "tensorlist_state.json"
MANIFEST_FORMAT = "tensorlist.hf-accelerate-state/1"

_ACCELERATE_HOW = ("convert it once, only if you trust it: `accelerator.load_state(dir)` (which unpickles), then "
                   "`tensorlist.huggingface.save_state(accelerator, new_dir)`")


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
    sched = plain(accelerator._schedulers[0]) if accelerator._schedulers else None
    loaders = accelerator._dataloaders
    loader = loaders[0] if loaders else {"batch_size": None, "shuffle": None, "drop_last": False, "sampler": None}
    record = build_training_record(
        optimizer=plain(accelerator._optimizers[0]), model=model, scheduler=sched,
        scheduler_step=None if sched is None else "batch", train_loader=loader,
        epochs_asked=0, epochs_done=0, training_loss=[], weights_kind="checkpoint",
        solver="accelerate.Accelerator", solver_params={"step": int(accelerator.step)},
    )
    return record, data


def save_state(accelerator, output_dir=None, *, training=None, dataset_params: Optional[Mapping] = None,
               key=None) -> str:
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
            ``tensorlist.provenance.record.TrainingRecorder`` (its ``checkpoint`` record; its ``signing_key`` signs the save),
            a record, or None for one built from the first optimizer,
            scheduler and loader (no history: the loop is the caller's).
        dataset_params: the data record (default ``{}``).
        key: a ``tensorlist.Key`` (or 32 bytes) encrypting every file but the
            manifest (default: the recorder's ``encryption_key``, if any);
            :func:`load_state` then needs it.

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
    key = as_key(key if key is not None else getattr(training, "encryption_key", None))
    with checkpoint_dirs.saving(accelerator, output_dir) as target:
        with signing.signed_state(accelerator, target, training):
            _write_state(accelerator, target, training, dataset_params, key)
    return target


def _write_state(accelerator, output_dir: str, training, dataset_params, key=None) -> None:
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
                writer.save(path, {k: v.detach() for k, v in state.items()}, key=key)
            else:
                save_model_file(path, state, training=record, dataset_params=data, key=key)
        for i, opt in enumerate(accelerator._optimizers):
            save_optimizer_state(at(_numbered("optimizer", i)), opt, key=key)
        for i, sched in enumerate(accelerator._schedulers):
            save_state_file(at(_numbered("scheduler", i)), "scheduler", sched.state_dict(), key=key)
        for i, loader in enumerate(accelerator._dataloaders):
            state, tensors = _loader_state(loader)
            if state or tensors:
                save_state_file(at(_numbered("sampler", i)), "sampler", state, tensors=tensors, key=key)
        if accelerator.scaler is not None:
            save_state_file(at("scaler.json"), "scaler", accelerator.scaler.state_dict(), key=key)
        for i, obj in enumerate(accelerator._custom_objects):
            save_state_file(at(f"custom_checkpoint_{i}.json"), "custom", obj.state_dict(), key=key)
    save_rng(os.path.join(output_dir, f"random_states_{accelerator.process_index}.json"), step=int(accelerator.step),
             key=key)
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


def load_state(accelerator, input_dir=None, *, strict: bool = True, key=None) -> None:
    """Restores what :func:`save_state` wrote into the accelerator's prepared objects.

    ``input_dir`` None under automatic checkpoint naming: the newest complete
    ``<project_dir>/checkpoints/checkpoint_<N>``, as ``Accelerator.load_state()``.
    ``key`` opens a state saved encrypted (``EncryptionError`` naming the file without it).

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
    key = as_key(key)
    opts = [(opt, load_optimizer_state(path, opt, restore=False, key=key)) for path, opt in opt_paths]
    scheds = [(s, read_state_file(path, "scheduler", like=s.state_dict(), key=key)) for path, s in sched_paths]
    loaders = [(d, *check_sampler_state(*read_state_file(path, "sampler", with_tensors=True, key=key),
                                        _loader_state(d)[0], file=path)) for path, d in loader_paths]
    scaler = scaler_path and read_state_file(scaler_path, "scaler", like=accelerator.scaler.state_dict(), key=key)
    customs = [(obj, read_state_file(path, "custom", key=key)) for path, obj in custom_paths]
    meta, rng = load_rng(rng_path, restore=False, key=key)
    for path, model in model_paths:
        load_module_state(path, model, strict=strict, key=key)
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


def __getattr__(name: str):
    # PEP 562: TensorListTrainer's module imports transformers (the class's base) at its top, so it is
    # imported on first access only; the Accelerate half and the rest of this package never need it.
    if name == "TensorListTrainer":
        from tensorlist.huggingface.trainer import TensorListTrainer

        globals()[name] = TensorListTrainer  # later accesses skip this hook
        return TensorListTrainer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"TensorListTrainer"})
