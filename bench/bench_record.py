"""Training records at scale: reading and validating a long history, failing on a hostile one, plotting many groups.

Prints, for a record of ``--epochs`` epochs (default a million; two parameter
groups, so each epoch holds a training loss, a validation value and two
learning rates) saved as a JSON file:

* its size, ``format.read_json_bytes`` (the capped strict parse),
  ``validate_training_record`` on the parsed record, and
  ``read_training_record(path)`` (read, parse, validate) end to end;
* a hostile record (``--bad`` string entries where numbers belong, 400,000 by
  default: the issue's 6.4 MB case) read in a child process under a 1 GiB
  address-space limit (``RLIMIT_AS``): the time to its FormatError and the
  child's peak resident memory;
* ``tensorlist record FILE --plot`` on a record with ``--groups`` parameter
  groups (20,000 by default; matplotlib's Agg backend), in a child process.

No targets are asserted.

    python bench/bench_record.py
    python bench/bench_record.py --epochs 100000 --bad 50000 --groups 2000   # quick
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

from fresh import installed_env  # noqa: E402  (this script's folder is on sys.path)
from tensorlist.format import read_json_bytes  # noqa: E402
from tensorlist.provenance.record import FORMAT, read_training_record, validate_training_record  # noqa: E402

HASH = "0123456789abcdef" * 4


def record(epochs: int, groups: int = 2) -> dict:
    """A valid record of ``epochs`` epochs and ``groups`` parameter groups."""
    loader = {"batch_size": 32, "shuffle": True, "drop_last": False, "sampler": None}
    spec = {"class": "torch.nn.modules.loss.MSELoss", "args": {}, "importable": True}
    return {
        "format": FORMAT, "created": "2025-01-31T12:00:00Z",
        "environment": {"python": "3.11.7", "numpy": "2.0.0", "torch": None, "tensorlist": "0.1.0"},
        "solver": {"class": "lab.Loop", "solver_params": {}, "loss": spec},
        "optimizer": {"class": "torch.optim.sgd.SGD", "hyperparameters": {"lr": 0.1},
                      "parameter_groups": [{"parameters": [f"layer{g}.weight"], "initial_lr": 0.1, "settings": {}}
                                           for g in range(groups)] if groups > 1 else None,
                      "scheduler": None, "scheduler_step": None},
        "seed": 0, "initial_weights_sha256": HASH, "initial_weights": {"from": "random_state"},
        "train": loader,
        "validation": {"dataset_params": None, "loader": loader, "every": 1, "function": spec, "reconstructor": None},
        "epochs": {"asked": epochs, "done": epochs},
        "weights": {"kind": "final", "epoch": epochs, "validation": None, "sha256": None},
        "history": {"training_loss": [1.0 / (e + 1) for e in range(epochs)],
                    "validation": [0.5 / (e + 1) if e % 2 else None for e in range(epochs)],
                    "learning_rate": [[0.1 / (e + 1)] * groups if groups > 1 else 0.1 / (e + 1)
                                      for e in range(epochs)]},
    }


def timed(fn):
    t = time.perf_counter()
    value = fn()
    return time.perf_counter() - t, value


LIMITED = textwrap.dedent("""
    import resource, sys, time
    resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
    from tensorlist.errors import FormatError
    from tensorlist.provenance.record import read_training_record
    t = time.perf_counter()
    try:
        read_training_record(sys.argv[1])
        outcome = "accepted"
    except FormatError as e:
        outcome = f"FormatError at {e.field}"
    except MemoryError:
        outcome = "MemoryError"
    seconds = time.perf_counter() - t
    with open("/proc/self/status") as f:  # VmHWM: this process's own peak (ru_maxrss keeps the parent's)
        peak = next((int(line.split()[1]) / 1024 for line in f if line.startswith("VmHWM:")), float("nan"))
    print(f"{outcome}|{seconds:.2f}|{peak:.0f}")
""")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--epochs", type=int, default=1_000_000)
    p.add_argument("--bad", type=int, default=400_000)
    p.add_argument("--groups", type=int, default=20_000)
    args = p.parse_args()
    env = installed_env(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with tempfile.TemporaryDirectory(prefix="tensorlist-bench-record-") as d:
        path = os.path.join(d, "record.json")
        text = json.dumps(record(args.epochs)).encode()
        with open(path, "wb") as f:
            f.write(text)
        validate_training_record(record(3))  # the schema loaded and compiled: not part of the figures
        t_parse, doc = timed(lambda: read_json_bytes(text))
        t_valid, _ = timed(lambda: validate_training_record(doc))
        t_read, _ = timed(lambda: read_training_record(path))
        print(f"record of {args.epochs:,} epochs, 2 parameter groups: {len(text) / 1e6:.1f} MB of JSON")
        print(f"  strict parse (read_json_bytes)       {t_parse:7.2f} s")
        print(f"  validate_training_record             {t_valid:7.2f} s")
        print(f"  read_training_record(path), in all   {t_read:7.2f} s")

        hostile = record(args.bad + 10, groups=1)
        hostile["history"]["validation"][10:] = ["bad entry"] * args.bad
        hpath = os.path.join(d, "hostile.json")
        with open(hpath, "w") as f:
            json.dump(hostile, f)
        out = subprocess.run([sys.executable, "-c", LIMITED, hpath], capture_output=True, text=True, env=env)
        outcome, seconds, peak = (out.stdout.strip().split("|") + ["?", "?"])[:3] if out.returncode == 0 \
            else (f"child failed: {out.stderr.strip().splitlines()[-1:]}", "?", "?")
        print(f"hostile record, {args.bad:,} bad entries ({os.path.getsize(hpath) / 1e6:.1f} MB), 1 GiB limit:")
        print(f"  {outcome} after {seconds} s, peak resident memory {peak} MiB")

        gpath = os.path.join(d, "groups.json")
        many = record(10, groups=args.groups)
        with open(gpath, "w") as f:
            json.dump(many, f)
        png = os.path.join(d, "curves.png")
        t_plot, out = timed(lambda: subprocess.run(
            [sys.executable, "-m", "tensorlist", "record", gpath, "--plot", png], capture_output=True, text=True,
            env=env))
        status = out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
        print(f"tensorlist record --plot, {args.groups:,} parameter groups, 10 epochs (a child, imports included):")
        print(f"  {t_plot:.2f} s: {status}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
