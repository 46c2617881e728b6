"""A tiny Lightning run for tests/trainers/test_lightning.py: in-process (``fit``) or as a script (DDP, sharded strategies).

As a script: ``python _lightning_script.py STRATEGY OUT_DIR EPOCHS [CKPT_PATH]`` fits on CPU with 2 processes
(``ddp`` or ``model_parallel``), checkpointing through tensorlist, and rank 0 writes ``OUT_DIR/losses.json``
(the per-step losses of rank 0) and ``OUT_DIR/checkpoints.json`` (the checkpoint paths written).
"""
from __future__ import annotations

import json
import os
import sys

import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from tensorlist.lightning import (TensorListCheckpointIO, TensorListModelParallelStrategy,
                                  TrainingRecordCallback)

#: Samples and batch size: 4 steps an epoch in one process, 2 a rank in two.
SAMPLES, BATCH = 16, 4


class Tiny(pl.LightningModule):
    """33 parameters: Linear(4, 4) -> tanh -> Linear(4, 1), Adam with a step schedule."""

    def __init__(self, sharded: bool = False):
        super().__init__()
        self.sharded = sharded
        self.net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))

    def configure_model(self):
        if self.sharded:
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y))

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters(), lr=0.05, betas=(0.9, 0.99))
        return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)}


class Losses(Callback):
    """Every training step's loss, exactly (as float64 bit patterns are kept by JSON floats)."""

    def __init__(self):
        self.losses = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.losses.append(float(outputs["loss"].detach()))


def loader():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 4, generator=g)
    return DataLoader(TensorDataset(x, x.sum(1, keepdim=True).sin()), batch_size=BATCH, shuffle=False)


def fit(out_dir, epochs, *, ckpt_path=None, strategy="auto", devices=1, plugins=None, sharded=False, seed=7,
        validate=False, signing_key=None):
    """One run; returns (losses, model checkpoint callback, trainer); ``signing_key`` goes to the record callback."""
    torch.set_num_threads(1)
    pl.seed_everything(seed, verbose=False)
    losses = Losses()
    ckpt = ModelCheckpoint(dirpath=os.fspath(out_dir), every_n_epochs=1, save_top_k=-1)
    trainer = pl.Trainer(max_epochs=epochs, accelerator="cpu", devices=devices, strategy=strategy,
                         plugins=plugins if plugins is not None else [TensorListCheckpointIO()],
                         callbacks=[losses, TrainingRecordCallback(dataset_params={"name": "tiny-sine"}, validation_key="val_loss",
                                                                     signing_key=signing_key), ckpt],
                         enable_progress_bar=False, logger=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(Tiny(sharded=sharded), train_dataloaders=loader(), val_dataloaders=loader() if validate else None,
                ckpt_path=ckpt_path)
    return losses.losses, ckpt, trainer


def main(argv):
    strategy, out_dir, epochs = argv[0], argv[1], int(argv[2])
    ckpt_path = argv[3] if len(argv) > 3 else None
    if strategy == "model_parallel":
        key = os.environ.get("TENSORLIST_TEST_SIGNING_KEY")  # a PEM path: the strategy signs each directory
        kwargs = dict(strategy=TensorListModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1,
                                                               signing_key=key),
                      plugins=[], sharded=True)
    else:
        kwargs = dict(strategy=strategy)
    losses, ckpt, trainer = fit(out_dir, epochs, ckpt_path=ckpt_path, devices=2, **kwargs)
    if trainer.global_rank == 0:
        with open(os.path.join(out_dir, "losses.json"), "w") as f:
            json.dump(losses, f)
        with open(os.path.join(out_dir, "checkpoints.json"), "w") as f:
            json.dump(sorted(os.listdir(out_dir)), f)


if __name__ == "__main__":
    main(sys.argv[1:])
