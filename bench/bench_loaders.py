#!/usr/bin/env python3
"""Loaders benchmark: tensorlist against safetensors and the model streamers, cold and warm.

One run, the same bfloat16 tensors (``--gib`` GiB, default 1, as ``--tensors``
tensors, default 256) saved once as ``m.tl`` (tensorlist) and
``m.safetensors`` (safetensors.torch), then loaded into host memory by:

* ``tl_map``: ``tensorlist.load(p)`` (numpy views of a read-only mapping);
* ``tl_read``: ``tensorlist.load(p, mmap=False)`` (parallel ``pread`` into private memory);
* ``tl_torch``: ``tensorlist.torch.load_state(p)`` (torch tensors over the mapping);
* ``tl_torch_read``: ``tensorlist.torch.load_state(p, mmap=False)``;
* ``st``: ``safetensors.torch.load_file(p)`` (mmap backend, the default);
* ``st_pread``: ``safetensors.torch.load_file(p, backend="pread")`` where the installed version has it;
* ``runai``: runai-model-streamer's ``SafetensorsStreamer`` (CPU, ``stream_file`` + ``get_tensors``);
* ``fastsafetensors``: ``fastsafe_open(..., nogds=True, device="cpu")`` + ``get_tensor`` of every key;
* ``plain_direct``, ``plain_read``: no loader, the bare reads a loader without tricks would make: the
  file's bytes into fresh memory in one stream of 64 MiB requests, ``O_DIRECT`` (around the page
  cache) or plain reads.

Every load ends by touching every 4 KiB page of every tensor it returned (one
byte per page), so a lazy mapping pays for its page faults like a reader pays
for its copy. Two conditions:

* cold: before each run the files' pages are evicted (``posix_fadvise(DONTNEED)``
  per file after an ``fsync``, no root needed; ``--drop-caches`` writes
  ``/proc/sys/vm/drop_caches`` instead, root only, and affects the whole
  machine). The script checks with ``mincore`` that less than 1% of each file
  stayed resident and prints what it found.
* warm: both files are read once and stay in the page cache.

The contenders run in a new seeded order each round (``--repeat`` rounds,
default 7, after ``--warmup`` untimed ones), so the drift of a shared machine
hits all of them alike. Each load runs in a fresh process, timed after its
imports, as a program's first load is: in one long process a peer whose
memory comes from malloc reuses the pages the previous load freed, which
hides the cost of faulting in fresh memory that every first load pays
(``--in-process`` measures that way anyway, quicker).
The report gives the median, minimum and spread (max / min) of each, and the
ratio ``contender / tensorlist`` of medians, of minimums, and paired: the
median of each round's ratio, which cancels a disk's drift between minutes
(> 1: tensorlist faster). Every peer returns torch tensors, so each is compared
with tensorlist.torch's path of the same kind: ``tl_torch`` for safetensors'
mmap backend, ``tl_torch_read`` for the peers that copy into private memory
and for the plain reads.

Missing peers are skipped and named. They are not test dependencies:
``pip install safetensors runai-model-streamer fastsafetensors``.

Usage:
    python bench/bench_loaders.py [--gib 1.0] [--tensors 256] [--repeat 7] [--warmup 1]
                                  [--only REGEX] [--conditions cold,warm] [--dir DIR]
                                  [--drop-caches] [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import importlib
import importlib.metadata
import inspect
import json
import subprocess
import mmap
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

import numpy as np

try:  # run from a checkout without installing: python bench/bench_loaders.py
    import tensorlist
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorlist

import torch

import tensorlist.torch as tlt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fresh import installed_env  # noqa: E402
from pagecache import evict, resident_fraction, warm  # noqa: E402

PEERS = {"safetensors": "safetensors.torch", "runai-model-streamer": "runai_model_streamer",
         "fastsafetensors": "fastsafetensors"}


def peer(name: str):
    """The peer's module, imported on first need (a child process imports only its own), or None."""
    try:
        return importlib.import_module(PEERS[name])
    except ImportError:
        return None


def version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "-"

GiB = 1 << 30
PAGE = mmap.PAGESIZE

# --------------------------------------------------------------------------- data and page cache


def make_tensors(total: int, n: int, seed: int = 0) -> Dict[str, torch.Tensor]:
    """``n`` bfloat16 tensors of (rows, 2048) adding up to about ``total`` bytes."""
    rows = max(1, total // 2 // n // 2048)
    g = torch.Generator().manual_seed(seed)
    return {f"model.layers.{i}.weight": torch.randn((rows, 2048), generator=g).to(torch.bfloat16)
            for i in range(n)}


# --------------------------------------------------------------------------- touching


def _bytes_of(t) -> np.ndarray:
    if isinstance(t, torch.Tensor):
        return t.reshape(-1).view(torch.uint8).numpy()
    return np.asarray(t).reshape(-1).view(np.uint8)


def touch(values) -> int:
    """Reads one byte of every page of every tensor (and its last byte); returns how many tensors."""
    k, total = 0, 0
    for t in values:
        b = _bytes_of(t)
        if b.size:
            total += int(b[::PAGE].sum()) + int(b[-1])
        k += 1
    return k


# --------------------------------------------------------------------------- contenders


def direct_reads(path: str) -> bool:
    """Whether ``path``'s filesystem serves O_DIRECT reads (tmpfs before Linux 6.6 does not)."""
    if not hasattr(os, "O_DIRECT"):
        return False
    buf = mmap.mmap(-1, PAGE)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def read_plain(path: str, n: int, direct: bool) -> List[np.ndarray]:
    """The file's bytes read into fresh memory (an anonymous mapping) in one stream of 64 MiB
    requests, with O_DIRECT (around the page cache; Linux) or plain reads; returned as ``n`` byte
    views so that ``touch`` does what it does for the loaders."""
    size = os.path.getsize(path)
    buf = mmap.mmap(-1, -(-size // PAGE) * PAGE)
    view = memoryview(buf)
    fd = os.open(path, os.O_RDONLY | (getattr(os, "O_DIRECT", 0) if direct else 0))
    try:
        pos, step = 0, 64 << 20
        while pos < size:
            got = os.preadv(fd, [view[pos:pos + step]], pos)
            if got <= 0:
                raise EOFError(f"{path}: short read at {pos}")
            pos += got
    finally:
        os.close(fd)
    return np.array_split(np.frombuffer(buf, np.uint8, size), n)



class Contender:
    def __init__(self, key: str, label: str, kind: str, run: Callable[[], int]):
        self.key, self.label, self.kind, self.run = key, label, kind, run
        self.times: Dict[str, List[float]] = {"cold": [], "warm": []}


def contenders(tl_path: str, st_path: str, n: int, only: Optional[List[str]] = None) -> List[Contender]:
    """The contenders (those of ``only`` when given), each importing its peer when built."""
    out: List[Contender] = []

    def add(key, label, kind, load):
        if only is not None and key not in only:
            return

        def run():
            got = touch(load())
            if got != n:
                raise RuntimeError(f"{key} returned {got} tensors, not {n}")
            return got
        out.append(Contender(key, label, kind, run))

    add("tl_map", "tensorlist.load (mmap)", "map", lambda: tensorlist.load(tl_path).values())
    add("tl_read", "tensorlist.load(mmap=False)", "read", lambda: tensorlist.load(tl_path, mmap=False).values())
    add("tl_torch", "tensorlist.torch.load_state (mmap)", "map", lambda: tlt.load_state(tl_path).values())
    add("tl_torch_read", "tensorlist.torch.load_state(mmap=False)", "read",
        lambda: tlt.load_state(tl_path, mmap=False).values())
    if direct_reads(st_path):
        add("plain_direct", "plain O_DIRECT read of the file, one stream", "plain",
            lambda: read_plain(st_path, n, direct=True))
    add("plain_read", "plain read() of the file, one stream", "plain", lambda: read_plain(st_path, n, direct=False))
    wanted = lambda *keys: only is None or any(k in only for k in keys)  # noqa: E731
    st_pt = peer("safetensors") if wanted("st", "st_pread") else None
    if st_pt is not None:
        v = version("safetensors")
        add("st", f"safetensors {v} load_file (mmap)", "map", lambda: st_pt.load_file(st_path).values())
        if "backend" in inspect.signature(st_pt.load_file).parameters:
            add("st_pread", f"safetensors {v} load_file(backend='pread')", "read",
                lambda: st_pt.load_file(st_path, backend="pread").values())
    runai = peer("runai-model-streamer") if wanted("runai") else None
    if runai is not None:
        def stream():
            with runai.SafetensorsStreamer() as s:
                s.stream_file(st_path)
                return [t for _, t in s.get_tensors()]
        add("runai", f"runai-model-streamer {version('runai-model-streamer')} (CPU)", "read", stream)
    fst = peer("fastsafetensors") if wanted("fastsafetensors") else None
    if fst is not None:
        def fast():
            with fst.fastsafe_open(filenames=[st_path], nogds=True, device="cpu") as f:
                return [f.get_tensor(k) for k in f.keys()]
        add("fastsafetensors", f"fastsafetensors {version('fastsafetensors')} (nogds, CPU)", "read", fast)
    return out


def child(key: str, tl_path: str, st_path: str, n: int) -> None:
    """One timed load in this fresh process (imports done first, untimed); prints the seconds."""
    (case,) = contenders(tl_path, st_path, n, only=[key])
    if key in ("tl_map", "tl_read"):
        import ml_dtypes  # noqa: F401  (numpy's bfloat16: an import, untimed like the others)
    gc.collect()
    t0 = time.perf_counter()
    case.run()
    print(json.dumps({"key": key, "s": time.perf_counter() - t0}))


def peers_missing() -> List[str]:
    return [name for name in PEERS if version(name) == "-"]


# --------------------------------------------------------------------------- running and reporting


def run_child(key: str, tl_path: str, st_path: str, n: int, env: Dict[str, str]) -> float:
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", key, tl_path, st_path, str(n)],
                          capture_output=True, text=True, timeout=600, env=env)
    if proc.returncode:
        raise RuntimeError(f"{key} failed:\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])["s"]


def run_rounds(cases: List[Contender], conditions: List[str], paths: List[str], args, log) -> Dict[str, list]:
    """Times every contender in every condition, ``args.repeat`` rounds in a new order each."""
    rng = random.Random(1234)
    residency: Dict[str, list] = {"cold": [], "warm": []}
    env = installed_env()
    for rnd in range(args.warmup + args.repeat):
        timed = rnd >= args.warmup
        order = [(c, cond) for c in cases for cond in conditions]
        rng.shuffle(order)
        for c, cond in order:
            gc.collect()
            if cond == "cold":
                evict(paths, drop_all=args.drop_caches)
            else:
                warm(paths)
            res = max(resident_fraction(p) for p in paths)
            residency[cond].append(res)
            if args.in_process:
                t0 = time.perf_counter()
                c.run()
                dt = time.perf_counter() - t0
                gc.collect()
            else:
                dt = run_child(c.key, args.tl_path, args.st_path, args.tensors, env)
            if timed:
                c.times[cond].append(dt)
            log(f"round {rnd}{'' if timed else ' (warm-up)'} {cond:4s} {c.key:16s} {dt:8.3f} s  "
                f"(resident before: {res:.0%})")
    return residency


def report(cases: List[Contender], conditions: List[str], nbytes: int, out) -> dict:
    summary: dict = {}
    by_key = {c.key: c for c in cases}
    for cond in conditions:
        out.write(f"\n-- {cond} page cache: median / min of n runs, spread = max/min; "
                  "ratio = contender / tensorlist (>1: tensorlist faster), of medians, of minimums, and "
                  "paired (median of each round's ratio) --\n")
        out.write(f"{'contender':52s} {'median s':>9s} {'min s':>8s} {'spread':>7s} {'GiB/s':>6s} "
                  f"{'ratio':>6s} {'(min)':>6s} {'paired':>6s}  vs\n")
        # like with like: every peer returns torch tensors, so it is compared with tensorlist.torch
        refs = {kind: by_key[key] for kind, key in (("map", "tl_torch"), ("read", "tl_torch_read"),
                                                    ("plain", "tl_torch_read"))
                if key in by_key and by_key[key].times[cond]}
        rows = {}
        for c in cases:
            ts = c.times[cond]
            if not ts:
                continue
            med, lo, hi = statistics.median(ts), min(ts), max(ts)
            ref = refs.get(c.kind)
            ratio = rmin = paired = None
            if ref is not None and not c.key.startswith("tl"):
                ratio = med / statistics.median(ref.times[cond])
                rmin = lo / min(ref.times[cond])
                # the same round's runs, a minute apart at most: the disk's drift cancels
                paired = statistics.median(a / b for a, b in zip(ts, ref.times[cond]))
            rows[c.key] = {"median": med, "min": lo, "max": hi, "n": len(ts), "ratio": ratio,
                           "ratio_min": rmin, "ratio_paired": paired, "vs": ref.key if ref is not None else None}
            cell = lambda v: "" if v is None else f"{v:.2f}"  # noqa: E731
            out.write(f"{c.label:52s} {med:9.3f} {lo:8.3f} {hi / lo:7.2f} {nbytes / GiB / med:6.2f} "
                      f"{cell(ratio):>6s} {cell(rmin):>6s} {cell(paired):>6s}"
                      f"  {'' if ratio is None else by_key[ref.key].key}\n")
        summary[cond] = rows
    return summary


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="bytes of bfloat16 to load, in GiB (default 1)")
    p.add_argument("--tensors", type=int, default=256, help="how many tensors (default 256)")
    p.add_argument("--repeat", type=int, default=7, help="timed rounds (default 7)")
    p.add_argument("--warmup", type=int, default=1, help="untimed rounds first (default 1)")
    p.add_argument("--conditions", default="cold,warm", help="cold, warm or both (default cold,warm)")
    p.add_argument("--only", default=None, help="regex on contender keys (tensorlist's always run)")
    p.add_argument("--dir", default=None, help="where the files go (default: system temp)")
    p.add_argument("--drop-caches", action="store_true",
                   help="cold runs drop the whole page cache (root; the default evicts only the two files)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--in-process", action="store_true",
                   help="time every load in this one process (quicker; but a peer whose memory comes from "
                        "malloc then reuses the pages freed by the previous load, which a program's first "
                        "load cannot)")
    p.add_argument("--quiet", action="store_true", help="no per-run lines")
    p.add_argument("--child", nargs=4, metavar=("KEY", "TL", "ST", "N"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        key, tl_path, st_path, n = args.child
        child(key, tl_path, st_path, int(n))
        return 0
    conditions = [c.strip() for c in args.conditions.split(",") if c.strip()]
    if not conditions or set(conditions) - {"cold", "warm"} or args.repeat < 1 or args.gib <= 0:
        p.error("--conditions takes cold and/or warm; --repeat and --gib must be positive")

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    root = tempfile.mkdtemp(prefix="tensorlist-loaders-", dir=args.dir)
    try:
        tensors = make_tensors(int(args.gib * GiB), args.tensors)
        nbytes = sum(t.numel() * t.element_size() for t in tensors.values())
        tl_path, st_path = os.path.join(root, "m.tl"), os.path.join(root, "m.safetensors")
        tensorlist.save(tl_path, tensors)
        st_pt = peer("safetensors")
        if st_pt is None:
            raise SystemExit("bench_loaders needs safetensors (the peers read its files)")
        st_pt.save_file(tensors, st_path)
        del tensors
        gc.collect()
        args.tl_path, args.st_path = tl_path, st_path
        cases = contenders(tl_path, st_path, args.tensors)
        if args.only:
            cases = [c for c in cases if c.key.startswith("tl") or re.search(args.only, c.key)]
        data_paths = sorted(os.path.join(root, f) for f in os.listdir(root))  # tensorlist's data file too
        t_start = time.perf_counter()
        residency = run_rounds(cases, conditions, data_paths, args, log)
        elapsed = time.perf_counter() - t_start
    finally:
        shutil.rmtree(root, ignore_errors=True)
    out = sys.stdout
    out.write(f"tensorlist loaders benchmark: {nbytes / GiB:.2f} GiB of bfloat16 in {args.tensors} tensors; "
              f"python {platform.python_version()}, torch {torch.__version__}, "
              f"safetensors {version('safetensors')}, runai-model-streamer {version('runai-model-streamer')}, "
              f"fastsafetensors {version('fastsafetensors')}, "
              f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end\n")
    out.write(f"{'every load in this one process' if args.in_process else 'every load in a fresh process (imports untimed)'}; "
              f"{args.repeat} timed rounds after {args.warmup} warm-up, contenders and conditions in a new "
              f"seeded order each round; every load touches every 4 KiB page it returns; cold = "
              f"{'/proc/sys/vm/drop_caches' if args.drop_caches else 'posix_fadvise(DONTNEED) of the files'} "
              f"before the run\n")
    for cond in conditions:
        if residency[cond]:
            out.write(f"resident before a {cond} run (mincore): {min(residency[cond]):.0%} to "
                      f"{max(residency[cond]):.0%}\n")
    missing = peers_missing()
    if missing:
        out.write(f"not installed, skipped: {', '.join(missing)}\n")
    summary = report(cases, conditions, nbytes, out)
    out.write(f"\n(total {elapsed:.0f} s)\n")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": nbytes, "tensors": args.tensors, "results": summary,
                       "residency": residency, "elapsed_s": elapsed}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
