"""Signing what the Hugging Face integrations save, through ``tensorlist.provenance.signing.signed_save`` (docs/PROVENANCE.md).

Each function gives the context a save runs in: with a key, the previous
signature of the target is removed before the save and the new one written
once it is complete, from the process that writes the files.
"""
from __future__ import annotations

import os

from tensorlist.provenance.signing import signed_save


def signed_checkpoint(trainer, trial):
    """Around a ``TensorListTrainer``'s ``_save_checkpoint``: signs the ``checkpoint-N`` directory it writes."""
    key = getattr(trainer, "tensorlist_signing_key", None) if trainer.args.should_save else None
    if key is None:
        return signed_save(None, None)
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR
    run_dir = trainer._get_output_dir(trial=trial)  # where transformers' _save_checkpoint writes it
    return signed_save(os.path.join(run_dir, f"{PREFIX_CHECKPOINT_DIR}-{trainer.state.global_step}"), key)


def signed_model(trainer, path):
    """Around a ``TensorListTrainer.save_model`` outside checkpoints: signs the model file ``path`` it writes."""
    key = getattr(trainer, "tensorlist_signing_key", None) if trainer.args.should_save else None
    return signed_save(path, key)


def signed_state(accelerator, directory: str, training):
    """Around ``save_state``: signs its directory with its recorder's ``signing_key`` (main process), if any."""
    return signed_save(directory, getattr(training, "signing_key", None) if accelerator.is_main_process else None)
