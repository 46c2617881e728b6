"""CRC32C throughput of every implementation this build and CPU run, with PyPI's for reference.

Each path of csrc/crc32c*.c is called through ``lowlevel.crc32c_impl`` (the dispatcher's choice as
"auto"), next to ``google_crc32c.extend`` and ``crc32c.crc32c`` when those packages are installed.
Every contender is one Python call per buffer, so the 4 KiB column includes the call's overhead
(printed apart, as "call us": the time of one call on an empty buffer) for all of them alike; the
larger columns are the paths' own speed (64 KiB stays in L2, 64 MiB streams from memory). Prints
medians in GB/s (1e9 bytes/s) and ratios to the portable path and to google-crc32c. Under qemu-user the figures measure the emulator, not the CPU.

    python bench/bench_crc.py                 # 4 KiB, 64 KiB and 64 MiB, median of 5
    python bench/bench_crc.py --quick         # a smoke run (tests/test_bench_smoke.py)
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tensorlist._base import lowlevel


def _contenders():
    """name -> function(buffer) -> int, the paths first, then the PyPI references that are installed."""
    out = {}
    names, _ = lowlevel.crc32c_impls()
    for name in names + ["auto"]:
        out[name] = lambda buf, impl=name: lowlevel.crc32c_impl(impl, buf)
    try:
        import google_crc32c
        out[f"google-crc32c ({google_crc32c.implementation})"] = lambda buf: google_crc32c.extend(0, buf)
    except ImportError:
        pass
    try:
        import crc32c as crc32c_pypi
        out["crc32c (PyPI)"] = lambda buf: crc32c_pypi.crc32c(buf)
    except ImportError:
        pass
    return out


def _rate(fn, buf, budget: float, repeat: int) -> float:
    """Median GB/s over `repeat` samples of about `budget` seconds each."""
    calls, elapsed = 1, 0.0
    while True:  # calibrate: enough calls per sample to fill the budget
        t = time.perf_counter()
        for _ in range(calls):
            fn(buf)
        elapsed = time.perf_counter() - t
        if elapsed >= budget / 4 or calls >= 1 << 24:
            break
        calls *= 4
    calls = max(1, int(calls * budget / max(elapsed, 1e-9)))
    rates = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn(buf)
        rates.append(calls * len(buf) / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def _call_us(fn, repeat: int) -> float:
    """Median microseconds of one call on an empty buffer: the per-call cost in every column."""
    calls = 20000
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn(b"")
        samples.append((time.perf_counter() - t) / calls * 1e6)
    return statistics.median(samples)


def _label(size: int) -> str:
    return f"{size >> 20} MiB" if size >= 1 << 20 else f"{size >> 10} KiB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,65536,67108864", help="buffer sizes in bytes, comma-separated")
    ap.add_argument("--repeat", type=int, default=5, help="samples per contender and size (median reported)")
    ap.add_argument("--budget", type=float, default=0.2, help="seconds per sample")
    ap.add_argument("--quick", action="store_true", help="smoke run: 4 KiB and 1 MiB, 1 sample of 20 ms")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    if args.quick:
        args.sizes, args.repeat, args.budget = "4096,1048576", 1, 0.02
    sizes = [int(s) for s in args.sizes.split(",")]
    contenders = _contenders()
    rng = np.random.default_rng(0)
    buffers = {n: rng.integers(0, 256, n, dtype=np.uint8).tobytes() for n in sizes}
    expected = {n: lowlevel.crc32c_impl("portable", b) for n, b in buffers.items()}
    results, overhead = {}, {}
    for name, fn in contenders.items():
        for n, buf in buffers.items():
            if int(fn(buf)) != expected[n]:  # every contender must agree before it is timed
                print(f"{name}: wrong CRC32C for {_label(n)}", file=sys.stderr)
                return 1
        results[name] = {n: _rate(fn, buf, args.budget, args.repeat) for n, buf in buffers.items()}
        overhead[name] = _call_us(fn, args.repeat)

    _, chosen_big = lowlevel.crc32c_impls(max(sizes))
    _, chosen_small = lowlevel.crc32c_impls(min(sizes))
    google = next((k for k in results if k.startswith("google-crc32c")), None)
    big = max(sizes)
    print(f"CRC32C, GB/s (median of {args.repeat}), {platform.machine()} {platform.system()}; "
          f"auto = {chosen_small} ({_label(min(sizes))}), {chosen_big} ({_label(big)})")
    head = f"{'implementation':<28}" + "".join(f"{_label(n):>10}" for n in sizes)
    head += f"{'call us':>9}{'x portable':>12}" + (f"{'x google':>10}" if google else "")
    print(head)
    for name, rates in results.items():
        row = f"{name:<28}" + "".join(f"{rates[n]:>10.2f}" for n in sizes)
        row += f"{overhead[name]:>9.2f}{rates[big] / results['portable'][big]:>12.2f}"
        if google:
            row += f"{rates[big] / results[google][big]:>10.2f}"
        print(row)
    print(f"(ratios at {_label(big)}; >1: faster than the reference)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"sizes": sizes, "gb_per_s": results, "call_us": overhead, "auto": [chosen_small, chosen_big]},
                      f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
