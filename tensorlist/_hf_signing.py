"""Signing what the Hugging Face integrations save, through ``tensorlist.signing`` (docs/PROVENANCE.md)."""
from __future__ import annotations

import os

from .signing import sign_saved


def sign_checkpoint(trainer, trial) -> None:
    """Signs the ``checkpoint-N`` a ``TensorListTrainer`` just saved, from the process that writes it."""
    key = getattr(trainer, "tensorlist_signing_key", None)
    if key is not None and trainer.args.should_save:
        from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
        run_dir = trainer._get_output_dir(trial=trial)  # where transformers' _save_checkpoint wrote it
        sign_saved(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"), key)


def sign_state(accelerator, directory: str, training) -> None:
    """Signs a ``save_state`` directory with its recorder's ``signing_key`` (main process), if it has one."""
    if accelerator.is_main_process:
        sign_saved(directory, getattr(training, "signing_key", None))
