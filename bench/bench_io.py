#!/usr/bin/env python3
"""tensorlist I/O benchmark: save, lazy open and full load against the usual formats.

One run, the same tensors for every contender, in a temporary directory:

* workload A: ``--gib`` GiB (default 1) as ``--tensors`` (default 256) float32 tensors;
* workload B: ``--tiny`` (default 100,000) tiny named float32 tensors of 4-16 elements.

Three operations per workload:

* save: tensorlist.save (durable and not, checksums on and off), safetensors
  (numpy and torch ``save_file``), ``np.save`` of each array into a directory,
  ``np.savez``, ``torch.save`` and a raw ``write()`` of the same bytes into one
  file. Durable contenders (tensorlist ``durable=True``, raw write + fsync,
  safetensors + fsync) are compared with each other, non-durable ones with
  each other.
* lazy open: open the file(s) and get an array/tensor object for every tensor,
  touching no data.
* full load: get every tensor into memory and touch it: the same ``touch``
  function runs on every contender's output (by default it reads one byte of
  every 4 KiB page of every tensor, which faults in mmap'd pages; ``--touch
  sum`` sums every element instead).

The page cache is warm for every contender (the files are written and read
once before timing; nothing is dropped, no root needed). Each number is the
median of ``--repeat`` runs (n in the tables; contenders over 5x slower than
tensorlist and over 2 s stop after ``--slow-cap`` runs); contenders are
interleaved across repeats, in a new (seeded) order each round, so that drift
of a noisy machine and what the previous run left behind hit all of them alike. Outputs of a
save are deleted and ``sync()`` is called between timed runs (untimed), so that
no run pays for the previous run's writeback.

Ratios are ``contender time / tensorlist time``: above 1 means tensorlist is
faster. The targets are printed next
to the measured ratios.

Usage:
    python bench/bench_io.py [--quick] [--gib 1.0] [--tiny 100000] [--repeat N]
                             [--json out.json] [--dir DIR] [--only REGEX]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pagecache import drop_caches  # noqa: E402

try:  # run from a checkout without installing: python bench/bench_io.py
    import tensorlist
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorlist

try:
    import torch
except ImportError:  # optional contender
    torch = None
try:
    import safetensors
    import safetensors.numpy as st_np
    from safetensors import safe_open
except ImportError:  # optional contender
    safetensors = st_np = safe_open = None
try:
    import safetensors.torch as st_pt
except ImportError:
    st_pt = None

GiB = 1 << 30
MiB = 1 << 20

# --------------------------------------------------------------------------- data


def make_big(total_bytes: int, n: int, seed: int = 0) -> Dict[str, np.ndarray]:
    """``n`` float32 tensors of (rows, 1024) adding up to about ``total_bytes``."""
    elems = max(1024, total_bytes // 4 // n)
    rows = max(1, elems // 1024)
    rng = np.random.default_rng(seed)
    out = {}
    for i in range(n):
        out[f"model.layers.{i}.weight"] = rng.standard_normal((rows, 1024), dtype=np.float32)
    return out


def make_tiny(n: int, seed: int = 1) -> Dict[str, np.ndarray]:
    """``n`` float32 tensors of 4-16 elements, 1-D or 2-D, named like model parameters."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(4, 17, size=n)
    flat = rng.standard_normal(int(sizes.sum()), dtype=np.float32)
    out, pos = {}, 0
    kinds = ("weight", "bias", "scale", "shift")
    for i, s in enumerate(sizes.tolist()):
        a = flat[pos:pos + s].copy()  # its own buffer, as real parameters have
        pos += s
        if s % 2 == 0 and i % 3 == 0:
            a = a.reshape(2, s // 2)
        out[f"blocks.{i // 4}.{kinds[i % 4]}"] = a
    return out


def nbytes(tensors: Dict[str, np.ndarray]) -> int:
    return sum(a.nbytes for a in tensors.values())


# --------------------------------------------------------------------------- helpers


def _as_numpy(a):
    if torch is not None and isinstance(a, torch.Tensor):
        return a.numpy()
    return a


def touch_pages(values) -> int:
    """Reads one byte of every 4 KiB page of every tensor (and its last byte)."""
    total = 0
    for a in values:
        b = _as_numpy(a).reshape(-1).view(np.uint8)
        if b.size:
            total += int(b[::4096].sum()) + int(b[-1])
    return total


def touch_sum(values) -> float:
    """Sums every element of every tensor."""
    total = 0.0
    for a in values:
        total += float(_as_numpy(a).sum())
    return total


def fsync_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_write(path: str, tensors: Dict[str, np.ndarray], fsync: bool) -> None:
    """The ceiling: the tensors' bytes, back to back, with plain write() calls.

    Large tensors are written straight from their buffers; small ones are
    gathered into 1 MiB chunks first (one syscall per tiny tensor would not
    be a fair ceiling).
    """
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o666)
    try:
        pending = bytearray()

        def put(buf):
            view = memoryview(buf).cast("B")
            while view:
                n = os.write(fd, view)
                view = view[n:]

        for a in tensors.values():
            if a.nbytes >= 64 << 10:
                if pending:
                    put(pending)
                    pending = bytearray()
                put(a)
            else:
                pending += memoryview(a).cast("B")
                if len(pending) >= MiB:
                    put(pending)
                    pending = bytearray()
        if pending:
            put(pending)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def fs_type(path: str) -> str:
    """The filesystem type of ``path`` from /proc/mounts (Linux), or '?'."""
    try:
        best, kind = "", "?"
        real = os.path.realpath(path)
        with open("/proc/mounts") as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 3:
                    mnt = parts[1]
                    if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                        best, kind = mnt, parts[2]
        return kind
    except OSError:
        return "?"


# --------------------------------------------------------------------------- cases


class Case:
    """One contender of one operation.

    ``run(ctx)`` is the timed part; ``before(ctx)`` and ``after(ctx, result)``
    are untimed (fresh output directory, clean-up, freeing memory).
    """

    def __init__(self, key: str, label: str, run: Callable, *, ref: Optional[str] = None,
                 group: str = "", before: Optional[Callable] = None, after: Optional[Callable] = None,
                 note: str = ""):
        self.key, self.label, self.run, self.ref, self.group = key, label, run, ref, group
        self.before, self.after, self.note = before, after, note
        self.samples: List[float] = []
        self.error: Optional[str] = None  # set when the contender fails (e.g. too many open files)

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else float("nan")


def save_cases(tensors: Dict[str, np.ndarray], pt: Optional[Dict[str, Any]], root: str) -> List[Case]:
    cases: List[Case] = []

    def outdir(key):
        return os.path.join(root, "save", key)

    def fresh(key):
        def before(_ctx=None):
            d = outdir(key)
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            os.sync()  # no writeback debt from earlier runs
        return before

    def clean(key):
        def after(_ctx=None, _res=None):
            shutil.rmtree(outdir(key), ignore_errors=True)
            os.sync()
        return after

    def add(key, label, fn, *, ref, group, note=""):
        cases.append(Case(key, label, lambda ctx, k=key: fn(outdir(k)), ref=ref, group=group,
                          before=fresh(key), after=clean(key), note=note))

    # durable: fsync'd before returning
    add("tl_durable", "tensorlist.save(durable=True)",
        lambda d: tensorlist.save(os.path.join(d, "m.tl"), tensors, durable=True),
        ref="tl_durable", group="durable (fsync)",
        note="temp file + fsync data, descriptor and directory + rename")
    add("tl_durable_nocrc", "tensorlist.save(durable=True, checksum=False)",
        lambda d: tensorlist.save(os.path.join(d, "m.tl"), tensors, durable=True, checksum=False),
        ref="tl_durable", group="durable (fsync)")
    add("raw_fsync", "raw write() + fsync",
        lambda d: raw_write(os.path.join(d, "raw.bin"), tensors, fsync=True),
        ref="tl_durable", group="durable (fsync)", note="fsyncs the file only")
    if st_np is not None:
        def st_fsync(d):
            p = os.path.join(d, "m.safetensors")
            st_np.save_file(tensors, p)
            fsync_path(p)
        add("st_np_fsync", "safetensors.numpy.save_file + fsync", st_fsync,
            ref="tl_durable", group="durable (fsync)", note="fsyncs the file only")
    # not durable: data left in the page cache
    add("tl", "tensorlist.save(durable=False)",
        lambda d: tensorlist.save(os.path.join(d, "m.tl"), tensors, durable=False),
        ref="tl", group="not durable (no fsync)", note="still atomic (temp file + rename)")
    add("tl_nocrc", "tensorlist.save(durable=False, checksum=False)",
        lambda d: tensorlist.save(os.path.join(d, "m.tl"), tensors, durable=False, checksum=False),
        ref="tl", group="not durable (no fsync)")
    add("raw", "raw write()",
        lambda d: raw_write(os.path.join(d, "raw.bin"), tensors, fsync=False),
        ref="tl", group="not durable (no fsync)")
    if st_np is not None:
        add("st_np", "safetensors.numpy.save_file",
            lambda d: st_np.save_file(tensors, os.path.join(d, "m.safetensors")),
            ref="tl", group="not durable (no fsync)")
    if st_pt is not None and pt is not None:
        add("st_pt", "safetensors.torch.save_file",
            lambda d: st_pt.save_file(pt, os.path.join(d, "m.safetensors")),
            ref="tl", group="not durable (no fsync)")

    def npy_dir(d):
        for i, a in enumerate(tensors.values()):
            np.save(os.path.join(d, f"{i:07d}.npy"), a)
    add("npy", "np.save per array into a directory", npy_dir, ref="tl", group="not durable (no fsync)")
    add("npz", "np.savez", lambda d: np.savez(os.path.join(d, "m.npz"), **tensors),
        ref="tl", group="not durable (no fsync)")
    if pt is not None:
        add("torch", "torch.save", lambda d: torch.save(pt, os.path.join(d, "m.pt")),
            ref="tl", group="not durable (no fsync)")
    return cases


def write_inputs(tensors: Dict[str, np.ndarray], pt, root: str) -> Dict[str, str]:
    """Writes every format once (untimed) for the open and load phases."""
    d = os.path.join(root, "files")
    os.makedirs(d, exist_ok=True)
    paths = {"tl": os.path.join(d, "m.tl")}
    tensorlist.save(paths["tl"], tensors, durable=False)
    if st_np is not None:
        paths["st"] = os.path.join(d, "m.safetensors")
        st_np.save_file(tensors, paths["st"])
    paths["npy"] = os.path.join(d, "npy")
    os.makedirs(paths["npy"], exist_ok=True)
    for i, a in enumerate(tensors.values()):
        np.save(os.path.join(paths["npy"], f"{i:07d}.npy"), a)
    paths["npz"] = os.path.join(d, "m.npz")
    np.savez(paths["npz"], **tensors)
    if pt is not None:
        paths["pt"] = os.path.join(d, "m.pt")
        torch.save(pt, paths["pt"])
    os.sync()
    # warm the page cache: read every file once
    for dirpath, _, files in os.walk(d):
        for f in files:
            with open(os.path.join(dirpath, f), "rb", buffering=0) as fh:
                while fh.read(16 * MiB):
                    pass
    return paths


def _free(_ctx=None, _res=None):
    gc.collect()


def open_cases(names: List[str], paths: Dict[str, str]) -> List[Case]:
    cases: List[Case] = []
    npy_files = [os.path.join(paths["npy"], f"{i:07d}.npy") for i in range(len(names))]

    def add(key, label, fn, note=""):
        cases.append(Case(key, label, lambda ctx: fn(), ref="tl", after=_free, note=note))

    def tl_open():
        with tensorlist.open(paths["tl"]) as r:
            return {k: r[k] for k in r.keys()}
    add("tl", "tensorlist.open + r[k] for all k", tl_open)
    add("tl_load", "tensorlist.load(mmap=True)", lambda: tensorlist.load(paths["tl"]))
    if safe_open is not None and torch is not None:
        def st_pt_open():
            with safe_open(paths["st"], framework="pt") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        add("st_pt", 'safetensors safe_open(framework="pt") + get_tensor', st_pt_open)
    if safe_open is not None:
        def st_np_open():
            with safe_open(paths["st"], framework="np") as f:
                return {k: f.get_tensor(k) for k in f.keys()}
        add("st_np", 'safetensors safe_open(framework="np") + get_tensor', st_np_open,
            note="copies every tensor (not lazy)")
    add("npy", "np.load(mmap_mode='r') of each .npy",
        lambda: {n: np.load(p, mmap_mode="r") for n, p in zip(names, npy_files)})
    if torch is not None:
        add("torch", "torch.load(mmap=True, weights_only=True)",
            lambda: torch.load(paths["pt"], mmap=True, weights_only=True))
    return cases


def fresh_memory(total: int) -> Dict[str, np.ndarray]:
    """The floor of any load into private memory: ``total`` bytes of fresh
    anonymous memory (ordinary pages), one byte written per 4 KiB page."""
    import mmap

    buf = np.frombuffer(mmap.mmap(-1, max(total, 1)), np.uint8)
    buf[::4096] = 1
    return {"floor": buf}


def load_cases(names: List[str], paths: Dict[str, str], touch: Callable, total: int) -> List[Case]:
    cases: List[Case] = []
    npy_files = [os.path.join(paths["npy"], f"{i:07d}.npy") for i in range(len(names))]

    def add(key, label, fn, note=""):
        def run(ctx):
            d = fn()
            touch(d.values())
            return d
        cases.append(Case(key, label, run, ref="tl", after=_free, note=note))

    add("tl", "tensorlist.load(mmap=False) + touch", lambda: tensorlist.load(paths["tl"], mmap=False))
    add("floor", "(floor) fresh memory of that size, 1 write/page", lambda: fresh_memory(total),
        note="first-touch cost every private-memory loader pays")
    add("tl_mmap", "tensorlist.load(mmap=True) + touch", lambda: tensorlist.load(paths["tl"]),
        note="zero-copy: touch maps page-cache pages")
    if st_np is not None:
        add("st_np", "safetensors.numpy.load_file + touch", lambda: st_np.load_file(paths["st"]))
    if st_pt is not None:
        add("st_pt", "safetensors.torch.load_file + touch", lambda: st_pt.load_file(paths["st"]),
            note="zero-copy mmap")

    def npz_load():
        with np.load(paths["npz"]) as z:
            return {k: z[k] for k in z.files}
    add("npy", "np.load of each .npy + touch",
        lambda: {n: np.load(p) for n, p in zip(names, npy_files)})
    add("npz", "np.load(.npz) every member + touch", npz_load)
    if torch is not None:
        add("torch", "torch.load(weights_only=True) + touch",
            lambda: torch.load(paths["pt"], weights_only=True))
        add("torch_mmap", "torch.load(mmap=True, weights_only=True) + touch",
            lambda: torch.load(paths["pt"], mmap=True, weights_only=True), note="zero-copy mmap")
    return cases


# --------------------------------------------------------------------------- running


def _is_slow(c: Case, by_key: Dict[str, Case], slow_cap: int) -> bool:
    """A contender already timed ``slow_cap`` times that is over 5x slower than its
    tensorlist reference and takes over 2 s: more runs would not change a ratio that large."""
    ref = by_key.get(c.ref)
    if slow_cap <= 0 or c.key == c.ref or len(c.samples) < slow_cap or ref is None or not ref.samples:
        return False
    return c.median > 2.0 and c.median > 5 * ref.median


def run_round(cases: List[Case], rnd: int, record: bool, log, slow_cap: int = 0) -> None:
    # A fresh (seeded) order each round, not a rotation: a rotation keeps every
    # contender behind the same one, and what a run leaves behind matters here
    # (a save right after a durable one's 1 GiB was fsynced and deleted is
    # often 2x slower: the VM hands freed memory back to its host).
    order = list(cases)
    random.Random(rnd).shuffle(order)
    by_key = {c.key: c for c in cases}
    for c in order:
        if c.error or (record and _is_slow(c, by_key, slow_cap)):
            continue
        if c.before:
            c.before(None)
        gc.collect()
        t0 = time.perf_counter()
        try:
            res = c.run(None)
        except Exception as e:  # a contender that cannot do it at all is reported, not fatal
            res = None
            c.error = f"{type(e).__name__}: {e}"
            log(f"    {c.key:<18} failed: {c.error}")
        t1 = time.perf_counter()
        if c.after:
            c.after(None, res)
        del res
        if c.error:
            gc.collect()
            continue
        if record:
            c.samples.append(t1 - t0)
        log(f"    {c.key:<18} {t1 - t0:9.4f} s{'' if record else '  (warm-up)'}")


def warm_save(cases_fn, tensors, pt, root):
    """Runs each save contender once on two tiny tensors (imports, first-call set-up)."""
    keys = list(tensors)[:2]
    small = {k: tensors[k][:1].copy() for k in keys}
    small_pt = {k: torch.from_numpy(v) for k, v in small.items()} if pt is not None else None
    for c in cases_fn(small, small_pt, os.path.join(root, "warm")):
        c.before(None)
        c.run(None)
        c.after(None, None)
    shutil.rmtree(os.path.join(root, "warm"), ignore_errors=True)


def bench_workload(name: str, tensors: Dict[str, np.ndarray], args, root: str, log) -> Dict[str, List[Case]]:
    pt = {k: torch.from_numpy(v) for k, v in tensors.items()} if torch is not None else None
    wroot = os.path.join(root, name)
    os.makedirs(wroot, exist_ok=True)
    names = list(tensors)
    log(f"[{name}] writing the input files once (untimed) and warming the page cache")
    paths = write_inputs(tensors, pt, wroot)
    touch = touch_sum if args.touch == "sum" else touch_pages
    ops = {
        "save": save_cases(tensors, pt, wroot),
        "open": open_cases(names, paths),
        "load": load_cases(names, paths, touch, nbytes(tensors)),
    }
    if args.only:
        rx = re.compile(args.only)
        ops = {op: [c for c in cs if rx.search(f"{op}:{c.key}") or c.key == c.ref] for op, cs in ops.items()}
    warm_save(lambda t, p, r: save_cases(t, p, r), tensors, pt, wroot)
    for rnd in range(-args.warmup, args.repeat):
        record = rnd >= 0
        for op, cases in ops.items():
            if op == "save" and not record:
                continue  # saves are warmed on tiny inputs instead (1 GiB each is too slow)
            log(f"  [{name}] {op} round {rnd + 1 if record else 'warm-up'}")
            run_round(cases, rnd + args.warmup, record, log, args.slow_cap)
    del pt
    shutil.rmtree(wroot, ignore_errors=True)
    return ops


# --------------------------------------------------------------------------- report

TARGETS = [
    # (label, workload, op, tensorlist case, [other cases: fastest counts], at least, how)
    ("save >= 2x safetensors save_file", "A", "save", "tl", ["st_np", "st_pt"], 2.0,
     "no fsync on either side"),
    ("save >= 2x safetensors save_file (durable)", "A", "save", "tl_durable", ["st_np_fsync"], 2.0,
     "tensorlist durable=True vs safetensors + fsync"),
    ("save >= 0.8x raw write()", "A", "save", "tl_durable", ["raw_fsync"], 0.8,
     "both fsync'd"),
    ("save >= 0.8x raw write() (no fsync)", "A", "save", "tl", ["raw"], 0.8, "neither fsync'd"),
    ("save, CRC32C on, >= 0.9x raw write()", "A", "save", "tl", ["raw"], 0.9, "neither fsync'd"),
    ("lazy open >= 5x safe_open(pt)+get_tensor", "A", "open", "tl", ["st_pt"], 5.0, ""),
    ("full load >= 1.5x safetensors.numpy.load_file", "A", "load", "tl", ["st_np"], 1.5,
     "tensorlist mmap=False (private copy) vs load_file"),
    ("full load >= 1.5x safetensors.numpy.load_file (mmap)", "A", "load", "tl_mmap", ["st_np"], 1.5,
     "tensorlist mmap=True + touch"),
    ("100k tiny: save >= 2x safetensors save_file", "B", "save", "tl", ["st_np", "st_pt"], 2.0,
     "no fsync on either side"),
    ("100k tiny: save >= 2x safetensors (durable)", "B", "save", "tl_durable", ["st_np_fsync"], 2.0,
     "tensorlist durable=True vs safetensors + fsync"),
    ("100k tiny: open >= 2x safe_open(pt)+get_tensor", "B", "open", "tl", ["st_pt"], 2.0, ""),
]


def report(results: Dict[str, Dict[str, List[Case]]], meta: Dict[str, Any], out) -> Dict[str, Any]:
    w = out.write
    summary: Dict[str, Any] = {"meta": meta, "workloads": {}, "targets": []}
    op_titles = {"save": "save", "open": "lazy open of every tensor (no data touched)",
                 "load": "full load (every page touched)"}
    for wl, ops in results.items():
        info = meta["workloads"][wl]
        size, count = info["bytes"], info["tensors"]
        w(f"\n=== workload {wl}: {info['desc']} ===\n")
        summary["workloads"][wl] = {}
        for op, cases in ops.items():
            by_key = {c.key: c for c in cases}
            w(f"\n-- {op_titles[op]}  (median of n runs; "
              f"'tl x' = contender time / tensorlist time, >1: tensorlist faster)\n")
            w(f"{'contender':<52} {'median s':>9} {'min s':>8} {'n':>2} {'GiB/s':>7} {'us/tensor':>9} "
              f"{'tl x':>6}  vs\n")
            group = None
            rows = []
            for c in cases:
                if c.group and c.group != group:
                    group = c.group
                    w(f"  [{group}]\n")
                if c.error:
                    w(f"{c.label:<52} failed: {c.error[:90]}\n")
                    rows.append({"key": c.key, "label": c.label, "group": c.group, "error": c.error})
                    continue
                med = c.median
                ref = by_key.get(c.ref)
                ratio = med / ref.median if ref is not None and ref.median > 0 else float("nan")
                gibs = size / GiB / med if med > 0 else float("nan")
                per = med / count * 1e6 if count else float("nan")
                note = f"  ({c.note})" if c.note else ""
                w(f"{c.label:<52} {med:9.4f} {min(c.samples):8.4f} {len(c.samples):2d} {gibs:7.2f} {per:9.2f} "
                  f"{ratio:6.2f}  {c.ref}{note}\n")
                rows.append({"key": c.key, "label": c.label, "group": c.group, "samples": c.samples,
                             "median_s": med, "min_s": min(c.samples) if c.samples else None,
                             "gib_per_s": gibs, "us_per_tensor": per, "ref": c.ref,
                             "ratio_vs_ref": ratio, "note": c.note})
            summary["workloads"][wl][op] = rows
    w("\n=== targets: ratio = other time / tensorlist time (medians; "
      "'min' = ratio of the fastest runs) ===\n")
    w(f"{'target':<54} {'ratio':>6} {'min':>6} {'need':>5}  {'met':<4} compared with\n")
    for label, wl, op, tl_key, others, need, how in TARGETS:
        ops = results.get(wl, {})
        by_key = {c.key: c for c in ops.get(op, [])}
        tl_case = by_key.get(tl_key)
        cands = [by_key[k] for k in others if k in by_key and by_key[k].samples]
        if tl_case is None or not tl_case.samples or not cands:
            w(f"{label:<54} {'n/a':>6} {'':>6} {need:5.1f}  {'n/a':<4} (contender not run)\n")
            summary["targets"].append({"target": label, "ratio": None, "need": need, "met": None})
            continue
        best = min(cands, key=lambda c: c.median)
        ratio = best.median / tl_case.median
        ratio_min = min(best.samples) / min(tl_case.samples)
        met = ratio >= need
        desc = f"{tl_case.label} vs {best.label}" + (f"; {how}" if how else "")
        w(f"{label:<54} {ratio:6.2f} {ratio_min:6.2f} {need:5.1f}  {'yes' if met else 'NO':<4} {desc}\n")
        summary["targets"].append({"target": label, "workload": wl, "op": op, "tensorlist": tl_case.key,
                                   "other": best.key, "ratio": ratio, "ratio_min": ratio_min, "need": need,
                                   "met": met, "how": how})
    return summary


def environment(root: str) -> Dict[str, Any]:
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count()
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cores": cores,
        "numpy": np.__version__,
        "tensorlist": getattr(tensorlist, "__version__", "?"),
        "safetensors": getattr(safetensors, "__version__", None) if safetensors else None,
        "torch": torch.__version__ if torch is not None else None,
        "filesystem": fs_type(root),
        "OPENBLAS_CORETYPE": os.environ.get("OPENBLAS_CORETYPE"),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="small run: 64 MiB, 10,000 tiny tensors, 3 repeats")
    p.add_argument("--gib", type=float, default=None, help="workload A size in GiB (default 1.0; quick 1/16)")
    p.add_argument("--tensors", type=int, default=256, help="workload A tensor count (default 256)")
    p.add_argument("--tiny", type=int, default=None, help="workload B tensor count (default 100000; quick 10000)")
    p.add_argument("--repeat", type=int, default=None, help="timed runs per contender (default 5; quick 3)")
    p.add_argument("--warmup", type=int, default=None,
                   help="untimed open/load rounds before timing (default 1; quick 0)")
    p.add_argument("--slow-cap", type=int, default=3,
                   help="stop timing a contender after this many runs when it is over 5x slower than "
                        "tensorlist and over 2 s (0: never; default 3)")
    p.add_argument("--touch", choices=("pages", "sum"), default="pages",
                   help="full-load touch: one byte per 4 KiB page (default) or sum every element")
    p.add_argument("--workloads", default="A,B", help="which workloads to run (default A,B)")
    p.add_argument("--only", default=None,
                   help="regex on 'op:key' (e.g. 'save:st_np|open:'); tensorlist references always run")
    p.add_argument("--dir", default=None, help="where the temporary directory goes (default: system temp)")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--quiet", action="store_true", help="no per-run progress lines")
    p.add_argument("--drop-caches", action="store_true",
                   help="Linux, as root: drop the page cache once before the run, so that no save pays for "
                        "evicting other programs' cached files (the noise of a full page cache)")
    args = p.parse_args(argv)
    if args.gib is None:
        args.gib = 1 / 16 if args.quick else 1.0
    if args.tiny is None:
        args.tiny = 10_000 if args.quick else 100_000
    if args.repeat is None:
        args.repeat = 3 if args.quick else 5
    if args.warmup is None:
        args.warmup = 0 if args.quick else 1
    if args.repeat < 1 or args.tensors < 1 or args.tiny < 1 or args.gib <= 0:
        p.error("--repeat, --tensors, --tiny and --gib must be positive")
    wanted = {x.strip().upper() for x in args.workloads.split(",") if x.strip()}

    def log(msg):
        if not args.quiet:
            print(msg, file=sys.stderr, flush=True)

    if args.drop_caches:
        drop_caches()
    root = tempfile.mkdtemp(prefix="tensorlist-bench-", dir=args.dir)
    meta = {"env": environment(root), "repeat": args.repeat, "warmup": args.warmup, "touch": args.touch,
            "workloads": {}}
    if meta["env"]["OPENBLAS_CORETYPE"]:
        log("note: OPENBLAS_CORETYPE is set; it can slow numpy (see the environment notes)")
    results: Dict[str, Dict[str, List[Case]]] = {}
    t_start = time.perf_counter()
    try:
        if "A" in wanted:
            big = make_big(int(args.gib * GiB), args.tensors)
            meta["workloads"]["A"] = {
                "bytes": nbytes(big), "tensors": len(big),
                "desc": f"{nbytes(big) / GiB:.3g} GiB as {len(big)} float32 tensors "
                        f"{next(iter(big.values())).shape}"}
            results["A"] = bench_workload("A", big, args, root, log)
            del big
            gc.collect()
        if "B" in wanted:
            tiny = make_tiny(args.tiny)
            meta["workloads"]["B"] = {
                "bytes": nbytes(tiny), "tensors": len(tiny),
                "desc": f"{len(tiny)} tiny float32 tensors of 4-16 elements ({nbytes(tiny) / MiB:.2f} MiB)"}
            results["B"] = bench_workload("B", tiny, args, root, log)
            del tiny
    finally:
        shutil.rmtree(root, ignore_errors=True)
    env = meta["env"]
    out = sys.stdout
    out.write(f"tensorlist I/O benchmark: python {env['python']}, numpy {env['numpy']}, "
              f"safetensors {env['safetensors']}, torch {env['torch']}, {env['cores']} cores, "
              f"{env['filesystem']} at {args.dir or 'the system temp dir'}\n")
    out.write(f"page cache warm for every contender ({'dropped once before the run, ' if args.drop_caches else ''}"
              f"nothing dropped between runs); median of {args.repeat} runs "
              f"(at most {args.slow_cap} for contenders >5x slower than tensorlist and >2 s), "
              f"contenders interleaved across runs in a new seeded order each round; touch = "
              f"{'one byte per 4 KiB page' if args.touch == 'pages' else 'sum of every element'}; "
              f"saves write fresh files, sync() between runs (untimed)\n")
    out.write("durable contenders fsync (tensorlist: data, descriptor and directory; baselines: the file only); "
              "non-durable ones leave the data in the page cache; each group is compared within itself\n")
    summary = report(results, meta, out)
    summary["elapsed_s"] = time.perf_counter() - t_start
    out.write(f"\n(total {summary['elapsed_s']:.0f} s)\n")
    out.flush()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(summary, f, indent=1, default=float)
    return 0


if __name__ == "__main__":
    sys.exit(main())
