"""The training demo: a ConvLSTMPeephole learns which way a pattern moves, with SWA, on CPU in seconds.

``run_demo()`` makes a synthetic sequence task (a 2x2 bright square moving
one pixel per frame across an 8x8 field, in one of four directions, with
noise), trains ``ConvLSTMPeephole -> pooling -> BatchNorm -> Linear`` with
:func:`tensorlist.loops.with_swa` (warm-up with validation and the
min-validation model, then cyclic SWA and a batch-norm refresh), checkpoints
every epoch, and prints the model files, their training-record summaries and
the learning curve as the final model file records it (the table ``tensorlist
record`` prints: epochs from 1, the validation value the loop used).

Imports torch, ``nn``, ``record`` and the ``tensorlist.loops`` facade (lazily:
``tensorlist demo`` needs the loops only for its last part).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Callable, Optional

import torch

__all__ = ["run_demo", "moving_patterns", "DirectionNet"]

DIRECTIONS = ("right", "left", "down", "up")
#: The warm-up's validation smoothing factor (``validation_loss_exponential_smoothing_factor``).
SMOOTHING = 0.7


def moving_patterns(n: int, *, frames: int = 5, size: int = 8, seed: int = 0):
    """``n`` noisy sequences ``[n, frames, 1, size, size]`` of a moving square and their direction (0-3)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 4, (n,), generator=g)
    x = 0.1 * torch.randn(n, frames, 1, size, size, generator=g)
    start = torch.randint(0, size - 1 - frames, (n, 2), generator=g)
    steps = torch.tensor([[0, 1], [0, -1], [1, 0], [-1, 0]])
    for k in range(n):
        r, c = int(start[k, 0]), int(start[k, 1])
        dr, dc = (int(v) for v in steps[y[k]])
        if dr < 0:
            r += frames
        if dc < 0:
            c += frames
        for t in range(frames):
            rr, cc = r + dr * t, c + dc * t
            x[k, t, 0, rr:rr + 2, cc:cc + 2] += 1.0
    return x, y


class DirectionNet(torch.nn.Module):
    """ConvLSTMPeephole over the frames, then average pooling, BatchNorm and a linear classifier."""

    def __init__(self, hidden: int = 6):
        super().__init__()
        from tensorlist.loops.nn import ConvLSTMPeephole

        self.rnn = ConvLSTMPeephole(1, hidden, kernel_i=3, kernel_c=3, stride=-1)
        self.norm = torch.nn.BatchNorm1d(hidden)
        self.head = torch.nn.Linear(hidden, 4)

    def forward(self, x):
        h = self.rnn(x)[:, -1]
        return self.head(self.norm(h.mean(dim=(2, 3))))


def run_demo(out_dir: Optional[str] = None, *, warmup_epochs: int = 4, swa_epochs: int = 4,
             say: Callable[[str], None] = print) -> dict:
    """Trains the demo model and prints where its files are, their records and the learning curve.

    Args:
        out_dir: where the checkpoint and model files go (default: a new
            temporary directory).
        warmup_epochs, swa_epochs: the two phases' lengths.
        say: the print function.

    Returns:
        ``{"out_dir", "files", "learning_curve", "accuracy", "seconds"}``.
    """
    threads = torch.get_num_threads()
    # a model this small runs fastest on one thread; several OpenMP threads
    # spin against each other (and against anything else on a small machine)
    torch.set_num_threads(1)
    try:
        return _run_demo(out_dir, warmup_epochs, swa_epochs, say)
    finally:
        torch.set_num_threads(threads)


def _run_demo(out_dir, warmup_epochs, swa_epochs, say) -> dict:
    from tensorlist.loops import nn as tnn
    from tensorlist.provenance.record import dataset_content_hash, epoch_number, history_table, verify_model_file
    from tensorlist.loops import CyclicSWA, Decrement, Minibatches, with_swa

    t0 = time.perf_counter()
    out_dir = out_dir or tempfile.mkdtemp(prefix="tensorlist-loops-demo-")
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    x, y = moving_patterns(384, seed=0)
    vx, vy = moving_patterns(128, seed=1)
    model = DirectionNet()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.02)
    data_record = {"name": "moving-patterns (synthetic)", "split": "train", "n": len(x), "frames": 5, "size": 8,
                   "seed": 0, "content_hash": dataset_content_hash({"x": x.numpy(), "y": y.numpy()})}
    say(f"training demo: ConvLSTMPeephole on moving squares ({len(x)} training, {len(vx)} validation sequences), "
        f"{warmup_epochs} warm-up + {swa_epochs} SWA epochs on CPU, writing into {out_dir}")
    res = with_swa(
        model, optimizer, Minibatches(x, y, 32, seed=0), loss_fn=torch.nn.functional.cross_entropy,
        warmup_epochs=warmup_epochs, swa_epochs=swa_epochs, validation=Minibatches(vx, vy, 128, shuffle=False),
        return_min_validation_loss_model=True, learning_rate_schedule=Decrement(2, 0.5),
        swa_schedule=CyclicSWA(0.05, 0.5, 2), validation_loss_exponential_smoothing_factor=SMOOTHING,
        out_dir=out_dir, dataset_params=data_record, seed=0, initial_weights={"from": "random_state"},
    )
    acc = tnn.evaluate(model, (vx, vy), [tnn.Top1Accuracy(), tnn.Loss()], batch_size=128)
    say("model files (each carries the training record and the data record):")
    records = {}
    for kind in ("best_validation", "final", "checkpoint"):
        path = res.files.get(kind)
        if path is None:
            continue
        rec = records[kind] = verify_model_file(path) if kind != "checkpoint" else _checkpoint_record(path)
        w = rec["weights"]
        say(f"  {kind:<16}{path}")
        say(f"                  record: {rec['solver']['class']}, {rec['optimizer']['class']}, epochs "
            f"{rec['epochs']['done']}/{rec['epochs']['asked']}, weights kind {w['kind']} after epoch {w['epoch']}, "
            f"seed {rec['seed']}, sha256 {w['sha256'][:16]}...")
    # the curve as the final file records it, in the very lines `tensorlist record` prints
    say(f"learning curve of {res.files['final']} (epochs {epoch_number(0)}-{warmup_epochs} warm-up, validation "
        f"smoothed by {SMOOTHING}; {epoch_number(warmup_epochs)}-{warmup_epochs + swa_epochs} SWA), "
        "as `tensorlist record` prints it:")
    for line in history_table(records["final"]):
        say(line)
    seconds = time.perf_counter() - t0
    say(f"final model (SWA average, batch-norm refreshed): validation top-1 accuracy "
        f"{acc['Top1Accuracy'].value:.3f}, loss {acc['Loss'].value:.4f}; {seconds:.1f} s")
    return {"out_dir": out_dir, "files": dict(res.files), "learning_curve": res.learning_curve,
            "accuracy": acc["Top1Accuracy"].value, "seconds": seconds}


def _checkpoint_record(path):
    from tensorlist.provenance.record import read_training_record

    return read_training_record(path)
