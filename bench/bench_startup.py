"""Cold start: ``import tensorlist`` and the command line against ``python -c "import numpy"``.

Every CLI call and every worker process pays the start-up, so tensorlist
imports its heavy dependencies (ml_dtypes, torch, fsspec, jsonschema,
matplotlib, tqdm) where first needed. This script writes a small file (a
float32 matrix and an int64 vector, no bfloat16), then times fresh
interpreters, interleaved round by round so that the machine's load falls on
every command alike:

* ``python -c "import numpy"``: the baseline, what any numpy program pays;
* ``python -c "import tensorlist"``;
* ``tensorlist inspect small.tl``;
* ``tensorlist validate small.tl`` (this one runs the JSON Schema: jsonschema is imported).

Then what a torch program pays, against safetensors (``--no-torch`` skips it), each measured inside a
fresh interpreter that has already imported torch, interleaved the same way:

* ``import tensorlist.torch`` against ``import safetensors.torch`` (target: at most 3x);
* the first load of 64 MiB of bfloat16 tensors, imports included, every page touched:
  ``tensorlist.torch.load_state`` against ``safetensors.torch.load_file`` (target: at most 2x).
  bfloat16 crosses as its bits, so ml_dtypes (0.5 to 2 s to import) is not imported.

The two CLI rows run what the ``tensorlist`` console script runs
(``tensorlist.__main__:main``) in the interpreter running this script, with
this checkout first on ``sys.path``, and bytecode cached as an installed
package has it (in the temporary directory). It prints the median of ``--runs`` runs
of each (and the fastest, less disturbed by a busy machine), the median's
ratio to the baseline, the target ratio and whether it is met;
``--check`` exits 1 when a target is missed. Each child's output is checked,
so a command that fails is an error, not a fast time.

    python bench/bench_startup.py --runs 10 --check
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

import tensorlist  # noqa: E402
from fresh import installed_env  # noqa: E402  (this script's folder is on sys.path)

# what the console script does (pip's generated wrapper of tensorlist.__main__:main)
_CLI = "import sys; from tensorlist.__main__ import main; sys.argv[0] = 'tensorlist'; sys.exit(main())"

#: (label, target ratio to the baseline or None, argv after the interpreter, text the output must hold)
COMMANDS = (
    ('python -c "import numpy"', None, ["-c", "import numpy"], ""),
    ('python -c "import tensorlist"', 1.5, ["-c", "import tensorlist"], ""),
    ("tensorlist inspect small.tl", 2.5, ["-c", _CLI, "inspect", "{file}"], "2 tensors"),
    ("tensorlist validate small.tl", 3.0, ["-c", _CLI, "validate", "{file}"], ": ok (1 list, 2 tensors)"),
)


def run_once(argv, env, expect: str) -> float:
    """Seconds one fresh interpreter takes for ``argv``; raises if it fails or prints the wrong thing."""
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=ROOT)
    elapsed = time.perf_counter() - t0
    if proc.returncode != 0 or expect not in proc.stdout:
        raise RuntimeError(f"{argv} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    return elapsed


#: (label, target ratio to the safetensors row above it or None, code timed after ``import torch``)
_TOUCH = "\nfor t in sd.values(): t.view(torch.uint8).reshape(-1)[::4096].sum()"
TORCH_ROWS = (
    ("import safetensors.torch", None, "import safetensors.torch"),
    ("import tensorlist.torch", 3.0, "import tensorlist.torch"),
    ("safetensors first load_file", None,
     "import safetensors.torch; sd = safetensors.torch.load_file({st!r})" + _TOUCH),
    ("tensorlist first load_state", 2.0,
     "import tensorlist.torch; sd = tensorlist.torch.load_state({tl!r})" + _TOUCH),
)


def run_in_torch(code: str, env) -> float:
    """Seconds ``code`` takes in a fresh interpreter that has imported torch (timed in the child)."""
    prog = ("import time, torch\nt0 = time.perf_counter()\n" + code +
            "\nprint('<<%r>>' % (time.perf_counter() - t0)); import sys; print('ml_dtypes' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"{code!r} exited {proc.returncode}:\n{proc.stdout}{proc.stderr}")
    out = proc.stdout
    if "tensorlist" in code and out.strip().endswith("True"):
        raise RuntimeError(f"{code!r} imported ml_dtypes")
    return float(out[out.index("<<") + 2:out.index(">>")])


def torch_table(tmp: str, env, runs: int) -> int:
    """Prints the torch program rows; returns how many targets were missed."""
    import torch
    import safetensors.torch

    g = torch.Generator().manual_seed(0)
    sd = {f"layers.{i}.weight": torch.randn(1024, 1024, generator=g).to(torch.bfloat16) for i in range(32)}
    st, tlp = os.path.join(tmp, "m.safetensors"), os.path.join(tmp, "m.tl")
    safetensors.torch.save_file(sd, st)
    tensorlist.save(tlp, sd)
    rows = [(label, target, code.format(st=st, tl=tlp)) for label, target, code in TORCH_ROWS]
    for _, _, code in rows:
        run_in_torch(code, env)
    times = {label: [] for label, *_ in rows}
    for _ in range(runs):
        for label, _, code in rows:
            times[label].append(run_in_torch(code, env))
    print(f"=== a torch program (torch {torch.__version__}, 64 MiB of bfloat16), median of {runs} interleaved runs")
    print(f"{'after import torch':32} {'median':>9} {'min':>7} {'x peer':>8} {'target':>7}  met")
    missed = 0
    for i, (label, target, _) in enumerate(rows):
        med = statistics.median(times[label])
        ratio = med / statistics.median(times[rows[i - 1][0]]) if target is not None else 1.0
        met = target is None or ratio <= target
        missed += not met
        print(f"{label:32} {med * 1000:7.1f}ms {min(times[label]) * 1000:5.1f}ms {ratio:7.2f}x "
              f"{'' if target is None else f'<= {target:g}x':>7}  {'' if target is None else ('yes' if met else 'NO')}")
    return missed


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10, help="timed runs of each command (default 10)")
    ap.add_argument("--dir", default=None, help="where to put the temporary directory")
    ap.add_argument("--json", default=None, help="write the medians and ratios here")
    ap.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ap.add_argument("--no-torch", action="store_true", help="skip the torch program rows")
    args = ap.parse_args(argv)

    tmp = tempfile.mkdtemp(prefix="tensorlist-startbench-", dir=args.dir)
    try:
        path = os.path.join(tmp, "small.tl")
        tensorlist.save(path, {"w": np.ones((16, 16), np.float32), "step": np.arange(3, dtype=np.int64)},
                        metadata={"note": "start-up benchmark"})
        env = installed_env()
        cmds = [(label, target, [a.replace("{file}", path) for a in argv], expect)
                for label, target, argv, expect in COMMANDS]
        for _, _, argv_, expect in cmds:  # warm-up: the bytecode cache and the page cache
            run_once(argv_, env, expect)
        times = {label: [] for label, *_ in cmds}
        for _ in range(args.runs):
            for label, _, argv_, expect in cmds:
                times[label].append(run_once(argv_, env, expect))
        have = all(importlib.util.find_spec(m) for m in ("torch", "safetensors"))
        if not have and not args.no_torch:
            print("(the torch program rows need torch and safetensors: skipped)")
        torch_missed = torch_table(tmp, env, args.runs) if have and not args.no_torch else 0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    medians = {label: statistics.median(ts) for label, ts in times.items()}
    base = medians[cmds[0][0]]
    print(f"=== start-up, median of {args.runs} interleaved runs ({sys.executable}, "
          f"python {sys.version.split()[0]}, numpy {np.__version__})")
    print(f"{'command':32} {'median':>9} {'min':>7} {'x numpy':>8} {'target':>7}  met")
    missed = 0
    report = {}
    for label, target, _, _ in cmds:
        ratio = medians[label] / base
        met = target is None or ratio <= target
        missed += not met
        report[label] = {"median_s": medians[label], "min_s": min(times[label]), "ratio": ratio, "target": target,
                         "met": met}
        print(f"{label:32} {medians[label] * 1000:7.0f}ms {min(times[label]) * 1000:5.0f}ms {ratio:7.2f}x "
              f"{'' if target is None else f'<= {target:g}x':>7}  {'' if target is None else ('yes' if met else 'NO')}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"runs": args.runs, "commands": report}, f, indent=2)
    return 1 if args.check and (missed or torch_missed) else 0


if __name__ == "__main__":
    sys.exit(main())
