"""transformers' ``Trainer`` writing tensorlist files: :class:`TensorListTrainer`.

Imports transformers at its top, as the class needs transformers' ``Trainer``
as its base: ``tensorlist.huggingface`` imports this module only when
``TensorListTrainer`` is first asked for, so the Accelerate integration and
:func:`~tensorlist.huggingface.states.last_checkpoint` and
:func:`~tensorlist.huggingface.record.trainer_record` (which need no
transformers) work without it.
"""
from __future__ import annotations

import logging
import os
import shutil
from typing import Any, Dict, Mapping, Optional

import transformers
from transformers.trainer_callback import TrainerState

from tensorlist import writer
from tensorlist._storage.commit import atomic_file
from tensorlist.crypto import as_key
from tensorlist.format import confine, read_json_file
from tensorlist.huggingface import signing as _hf_signing
from tensorlist.huggingface.record import trainer_record
from tensorlist.huggingface.states import (MODEL_FILE, OPTIMIZER_FILE, PICKLE_NAME, SCALER_FILE, SCHEDULER_FILE,
                                           TRAINING_ARGS_FILE, export_pretrained, last_checkpoint, load_rng, plain,
                                           read_state_file, refuse_pickles, save_rng, save_state_file)
from tensorlist.loops.state import rng_state, set_rng_state
from tensorlist.provenance.record import optimizer_record, read_training_record, resolve_paths, save_model_file, weights_sha256
from tensorlist.torch import load_module_state, load_optimizer_state, save_optimizer_state

__all__ = ["TensorListTrainer"]

_log = logging.getLogger("tensorlist.huggingface")


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
        signing_key: an EC private key signing each ``checkpoint-N`` (``model.sig`` inside)
            and each ``save_model`` (``model.json.sig`` beside it) (docs/PROVENANCE.md).
        encryption_key: a ``tensorlist.Key`` (or 32 bytes) encrypting every
            tensorlist file of each ``checkpoint-N`` and ``save_model`` (the
            weights, the record, the optimizer's, scheduler's, scaler's and
            RNG states); resuming needs it. Not with ``export_safetensors``
            (plaintext). ``trainer_state.json``, ``training_args.json`` and
            ``config.json`` stay plain JSON (transformers reads them).
        *args, **kwargs: ``transformers.Trainer``'s.
    """

    def __init__(self, *args, dataset_params: Optional[Mapping] = None,
                 initial_weights: Optional[Mapping] = None, export_safetensors: bool = False,
                 eval_dataset_params: Optional[Mapping] = None, signing_key=None, encryption_key=None, **kwargs):
        if encryption_key is not None and export_safetensors:
            raise ValueError("export_safetensors writes the weights in plaintext: it cannot go with encryption_key "
                             "(export_pretrained(..., key=) decrypts an export on purpose)")
        super().__init__(*args, **kwargs)
        self.tensorlist_signing_key = signing_key
        self.tensorlist_encryption_key = as_key(encryption_key)
        self.tensorlist_eval_dataset_params = None if eval_dataset_params is None else dict(eval_dataset_params)
        self._tensorlist_best = False  # the model holds the best checkpoint's weights (load_best_model_at_end)
        self.tensorlist_dataset_params = None if dataset_params is None else dict(dataset_params)
        self.tensorlist_initial_weights = dict(initial_weights) if initial_weights else None
        self.tensorlist_export_safetensors = bool(export_safetensors)
        self._tensorlist_start: Dict[str, Any] = {}
        self._tensorlist_kind = "final"

    # ---- what the record starts from
    def train(self, resume_from_checkpoint=None, trial=None, **kwargs):
        """``Trainer.train``; ``resume_from_checkpoint=True`` takes the last *complete* checkpoint.

        A checkpoint to resume is checked (no pickles, its RNG states and
        training record readable) before transformers loads anything, and its
        record's starting point carries over into the resumed run's records.
        """
        self._tensorlist_best = False
        if resume_from_checkpoint is True:
            resume_from_checkpoint = last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume_from_checkpoint:
            self._tensorlist_start = self._resumed_start(resume_from_checkpoint)
        else:
            self._tensorlist_start = {"initial_weights_sha256": weights_sha256(self.model)}
        return super().train(resume_from_checkpoint=resume_from_checkpoint or None, trial=trial, **kwargs)

    def _resumed_start(self, checkpoint) -> Dict[str, Any]:
        """What the record of a run resumed from ``checkpoint`` starts from, once the checkpoint is checked."""
        refuse_pickles(checkpoint)
        key = self.tensorlist_encryption_key
        if os.path.exists(self._rng_file(checkpoint)):  # checked before the model is loaded
            load_rng(self._rng_file(checkpoint), restore=False, key=key)
        model_file = confine(checkpoint, MODEL_FILE)
        record = resolve_paths(read_training_record(model_file, key=key), os.path.dirname(model_file))  # as the file reads them
        read_json_file(confine(checkpoint, "trainer_state.json"))  # transformers reads it plainly
        return {"optimizer": record["optimizer"], "initial_weights_sha256": record["initial_weights_sha256"],
                "initial_weights": record["initial_weights"]}

    def create_scheduler(self, num_training_steps: int, optimizer=None):
        sched = super().create_scheduler(num_training_steps, optimizer)
        if "optimizer" not in self._tensorlist_start and self.optimizer is not None:
            self._tensorlist_start["optimizer"] = optimizer_record(
                plain(self.optimizer), model=self.model, scheduler=plain(sched), scheduler_step="batch")
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
            with _hf_signing.signed_checkpoint(self, trial):
                super()._save_checkpoint(model, trial)
        finally:
            self._tensorlist_kind = "final"

    def save_model(self, output_dir=None, _internal_call: bool = False):
        """``Trainer.save_model``; with ``signing_key``, the model file is signed as it is saved.

        ``model.json`` and its data file are signed, ``model.json.sig`` and
        ``model.json.provenance.json`` beside them (``output_dir`` may hold
        checkpoints, so the directory is not signed whole). A save made for
        a ``checkpoint-N`` (``_internal_call``) is signed with its directory.
        """
        if _internal_call or self.tensorlist_signing_key is None:
            return super().save_model(output_dir, _internal_call)
        target = os.path.join(output_dir if output_dir is not None else self.args.output_dir, MODEL_FILE)
        with _hf_signing.signed_model(self, target):
            return super().save_model(output_dir, _internal_call)

    def _save(self, output_dir=None, state_dict=None):
        output_dir = output_dir if output_dir is not None else self.args.output_dir
        os.makedirs(output_dir, exist_ok=True)
        model = self.accelerator.unwrap_model(self.model, keep_torch_compile=False)
        state = model.state_dict() if state_dict is None else state_dict
        record = trainer_record(self, self._tensorlist_kind)
        path = os.path.join(output_dir, MODEL_FILE)
        key = self.tensorlist_encryption_key
        if record is None:
            writer.save(path, {k: v.detach() for k, v in state.items()}, key=key)
        else:
            save_model_file(path, state, training=record, dataset_params=self._dataset_params(), key=key)
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
            key = self.tensorlist_encryption_key
            save_optimizer_state(os.path.join(output_dir, OPTIMIZER_FILE), self.optimizer, key=key)
            save_state_file(os.path.join(output_dir, SCHEDULER_FILE), "scheduler", self.lr_scheduler.state_dict(),
                            key=key)

    def _save_scaler(self, output_dir):
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None and self.args.should_save:
            save_state_file(os.path.join(output_dir, SCALER_FILE), "scaler", scaler.state_dict(),
                            key=self.tensorlist_encryption_key)

    def _rng_file(self, directory) -> str:
        name = "rng_state.json" if self.args.world_size <= 1 else f"rng_state_{self.args.process_index}.json"
        return confine(directory, name)

    def _save_rng_state(self, output_dir):
        os.makedirs(output_dir, exist_ok=True)
        save_rng(self._rng_file(output_dir), key=self.tensorlist_encryption_key)

    # ---- resuming
    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        self._check_plain()
        refuse_pickles(resume_from_checkpoint)
        model = self.accelerator.unwrap_model(model if model is not None else self.model)
        load_module_state(confine(resume_from_checkpoint, MODEL_FILE), model, key=self.tensorlist_encryption_key)

    def _load_optimizer_and_scheduler(self, checkpoint):
        if checkpoint is None or not any(os.path.lexists(os.path.join(checkpoint, n))
                                         for n in (OPTIMIZER_FILE, SCHEDULER_FILE)):
            return  # a save_only_model checkpoint: a fresh optimizer, as the stock Trainer
        key = self.tensorlist_encryption_key
        sched = read_state_file(confine(checkpoint, SCHEDULER_FILE), "scheduler",
                                like=self.lr_scheduler.state_dict(), key=key)
        load_optimizer_state(confine(checkpoint, OPTIMIZER_FILE), self.optimizer, key=key)  # checked, then loaded
        self.lr_scheduler.load_state_dict(sched)

    def _load_scaler(self, checkpoint):
        scaler = getattr(self.accelerator, "scaler", None)
        if checkpoint is not None and scaler is not None and os.path.exists(confine(checkpoint, SCALER_FILE)):
            scaler.load_state_dict(read_state_file(confine(checkpoint, SCALER_FILE), "scaler",
                                                   like=scaler.state_dict(), key=self.tensorlist_encryption_key))

    def _load_rng_state(self, checkpoint):
        if checkpoint is None:
            return
        path = self._rng_file(checkpoint)  # confined there
        if not os.path.exists(path):
            _log.info("%s: no RNG state; the resumed run is not reproducible", path)
            return
        load_rng(path, key=self.tensorlist_encryption_key)

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
        checkpoint, output_dir = os.fspath(checkpoint), os.fspath(output_dir)
        self._check_plain()
        self._load_stock(checkpoint)
        saved_rng = rng_state()
        self._tensorlist_kind = "checkpoint"
        try:
            transformers.Trainer._load_rng_state(self, checkpoint)
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
        _copy_the_rest(checkpoint, output_dir)
        return output_dir

    def _load_stock(self, checkpoint: str) -> None:
        """The stock checkpoint's state, weights, optimizer, scheduler and scaler, through the stock loaders."""
        base = transformers.Trainer
        self.state = TrainerState.load_from_json(os.path.join(checkpoint, "trainer_state.json"))
        self._tensorlist_start = {"initial_weights_sha256": None}  # the stock run's starting weights are not known
        base._load_from_checkpoint(self, checkpoint)
        self.optimizer, self.lr_scheduler = None, None
        self.create_optimizer_and_scheduler(num_training_steps=self.state.max_steps)
        base._load_optimizer_and_scheduler(self, checkpoint)
        base._load_scaler(self, checkpoint)

    def _load_best_model(self):
        best = self.state.best_model_checkpoint
        refuse_pickles(best)
        load_module_state(confine(best, MODEL_FILE), self.accelerator.unwrap_model(self.model),
                          key=self.tensorlist_encryption_key)
        self._tensorlist_best = True


def _copy_the_rest(checkpoint: str, output_dir: str) -> None:
    """Copies a stock checkpoint's files that the conversion did not write (trainer_state.json, tokenizer files).

    Pickles and the stock weights (``model.safetensors``, ``model-*`` shards) are left out: the converted
    checkpoint holds the weights as ``model.json``, and nothing in it may be a pickle.
    """
    written = set(os.listdir(output_dir))
    for name in sorted(os.listdir(checkpoint)):
        src = os.path.join(checkpoint, name)
        if (name in written or PICKLE_NAME.search(name) or name.startswith(("model.safetensors", "model-"))
                or not os.path.isfile(src)):
            continue
        shutil.copyfile(src, os.path.join(output_dir, name))
