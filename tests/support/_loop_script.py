"""A small training run for the loop tests, run as a subprocess (so that it can be killed with SIGKILL).

usage: python _loop_script.py OUT_DIR MODE EPOCHS [KILL_AT_ITERATION] [--resume]
MODE: simple | swa | simple_then_swa
"""
import os
import signal
import sys

import torch

torch.set_num_threads(1)

import tensorlist.loops as loops  # noqa: E402


def data(n=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x[:, :3].sum(1) > 0).long()
    return x, y


def build(seed=1):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                                torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    return model, opt


def toy():
    """The model, optimizer, training batches (shuffled) and validation set of the single-process loop runs."""
    model, opt = build()
    x, y = data()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16, shuffle=True)
    return model, opt, train, [data(48, seed=5)]


def run(mode, model, opt, train, n, **common):
    """Trains ``n`` epochs with loop MODE and the settings of every loop test; the loop's result.

    ``simple``: epochs() with a step schedule, smoothing, 2-batch accumulation; ``swa``: swa_epochs() with a
    cyclic schedule; ``simple_then_swa``: with_swa(), half the epochs each.
    """
    if mode == "simple":
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return loops.epochs(model, opt, train, max_epochs=n, return_min_validation_loss_model=True,
                            lr_scheduler=sched, validation_loss_exponential_smoothing_factor=0.7,
                            accumulate_gradient_over_n_batches=2, **common)
    if mode == "swa":
        return loops.swa_epochs(model, opt, train, max_epochs=n, swa_schedule=loops.CyclicSWA(0.1, 1.0, 2), **common)
    return loops.with_swa(model, opt, train, warmup_epochs=n // 2, swa_epochs=n - n // 2,
                          learning_rate_schedule=loops.ReduceLROnPlateau(patience=1),
                          swa_schedule=loops.ConstantSWA(0.5), return_min_validation_loss_model=True, **common)


def main(argv):
    out, mode, n = argv[0], argv[1], int(argv[2])
    kill_at = int(argv[3]) if len(argv) > 3 and argv[3] != "-" else None
    resume = "--resume" in argv
    model, opt, train, validation = toy()
    handlers = {}
    if kill_at is not None:
        calls = [0]

        def kill(state):  # counts batches over both phases of with_swa
            calls[0] += 1
            if calls[0] == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
        handlers[loops.Events.ITERATION_COMPLETED] = kill
    run(mode, model, opt, train, n, loss_fn=torch.nn.functional.cross_entropy, validation=validation, out_dir=out,
        resume=resume, handlers=handlers, progress=False, dataset_params={"name": "toy", "n": 96}, seed=1)


if __name__ == "__main__":
    main(sys.argv[1:])
