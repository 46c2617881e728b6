#!/usr/bin/env python3
"""GPU load benchmark: a checkpoint from a file into device memory, tensorlist against its peers.

One run, the same state dict for every contender (``--gib`` GiB of bfloat16
and float32 tensors shaped like a transformer's: large matrices and small
norm vectors), saved once per format in a temporary directory. Each contender
loads every tensor onto ``--device`` and waits for the device
(``torch.cuda.synchronize``):

* ``tensorlist.load(device=)``: the staging path (pinned ring, chunked
  ``pread``, copies on a side stream overlapping the next read);
* ``tensorlist.load + .to(device)``: zero-copy host views, then one pageable
  copy per tensor (what a loader without the staging path does);
* ``safetensors.safe_open(device=) + get_tensor``: every key;
* ``safetensors.torch.load_file(device=)``;
* ``torch.load(map_location=device, mmap=True, weights_only=True)``.

Two tables: warm (the files in the page cache: the copy pipeline is measured)
and cold (each file's pages evicted with ``posix_fadvise(DONTNEED)`` before
each run, no root needed: the read from disk is measured too). Each number is
the median of ``--repeat`` runs, contenders interleaved in a new order each
round. Ratios are ``contender time / tensorlist time``: above 1 means
tensorlist is faster. The target is printed with them.

``--device cpu`` runs every code path on the CPU as a smoke test (what CI can
run); its times measure host copies, not a device load.

Usage:
    python bench/bench_gpu_load.py [--gib 1.0] [--repeat 5] [--device cuda] [--json out.json]
"""
from __future__ import annotations

import argparse
import gc
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List

try:  # run from a checkout without installing: python bench/bench_gpu_load.py
    import tensorlist
except ImportError:  # pragma: no cover
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import tensorlist

import torch

import tensorlist.torch as tt

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pagecache import evict  # noqa: E402

try:
    import safetensors.torch as st_pt
    from safetensors import safe_open
except ImportError:  # optional contender
    st_pt = safe_open = None

MiB = 1 << 20


def state_dict(total_bytes: int, seed: int = 0) -> Dict[str, torch.Tensor]:
    """Layers of a 4096-wide transformer (bf16 matrices, f32 norms) until ``total_bytes``."""
    g = torch.Generator().manual_seed(seed)
    width = 4096 if total_bytes >= 512 * MiB else 512
    sd: Dict[str, torch.Tensor] = {}
    layer, size = 0, 0
    while size < total_bytes:
        for name, shape, dtype in ((f"layers.{layer}.attn.qkv.weight", (3 * width, width), torch.bfloat16),
                                   (f"layers.{layer}.attn.out.weight", (width, width), torch.bfloat16),
                                   (f"layers.{layer}.norm.weight", (width,), torch.float32),
                                   (f"layers.{layer}.mlp.up.weight", (width, width), torch.bfloat16),
                                   (f"layers.{layer}.mlp.down.bias", (width,), torch.float32)):
            t = torch.empty(shape, dtype=torch.float32).uniform_(-1, 1, generator=g).to(dtype)
            sd[name] = t
            size += t.numel() * t.element_size()
        layer += 1
    return sd


def data_files(path: str) -> List[str]:
    if path.endswith(".tl"):
        with tensorlist.open(path) as r:
            return [path, r.descriptor.data_path]
    return [path]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=1.0)
    ap.add_argument("--mib", type=float, default=None, help="size in MiB (overrides --gib; for smoke runs)")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--dir", default=None, help="where the temporary directory goes")
    ap.add_argument("--json", default=None)
    ap.add_argument("--no-cold", action="store_true", help="skip the cold-cache table")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("no CUDA device here: nothing to measure (use --device cpu for a smoke run)")
        return 0
    cuda = device.type == "cuda"
    total = int((args.mib * MiB) if args.mib is not None else args.gib * 1024 * MiB)
    sd = state_dict(total)
    nbytes = sum(t.numel() * t.element_size() for t in sd.values())
    tmp = tempfile.mkdtemp(prefix="tensorlist-gpubench-", dir=args.dir)
    try:
        files = {"tl": os.path.join(tmp, "m.tl"), "st": os.path.join(tmp, "m.safetensors"),
                 "pt": os.path.join(tmp, "m.pt")}
        tt.save_module_state(files["tl"], sd)
        if st_pt is not None:
            st_pt.save_file(sd, files["st"])
        torch.save(sd, files["pt"])
        os.sync()
        del sd
        gc.collect()

        def sync():
            if cuda:
                torch.cuda.synchronize(device)

        def tl_staged():
            return tensorlist.load(files["tl"], device=device)

        def tl_naive():
            return {k: t.to(device) for k, t in tt.load_state(files["tl"]).items()}

        def st_open():
            with safe_open(files["st"], framework="pt", device=str(device)) as f:
                return {k: f.get_tensor(k) for k in f.keys()}

        def st_load():
            return st_pt.load_file(files["st"], device=str(device))

        def pt_load():
            return torch.load(files["pt"], map_location=device, mmap=True, weights_only=True)

        contenders: Dict[str, tuple] = {
            "tensorlist.load(device=)": (tl_staged, "tl"),
            "tensorlist.load + .to(device)": (tl_naive, "tl"),
            "torch.load(map_location=, mmap=True)": (pt_load, "pt"),
        }
        if st_pt is not None:
            contenders["safetensors safe_open(device=) + get_tensor"] = (st_open, "st")
            contenders["safetensors.torch.load_file(device=)"] = (st_load, "st")
        # every contender loads the same tensors: check once, untimed
        ref = {k: v.cpu() for k, v in tl_staged().items()}
        for name, (fn, _) in contenders.items():
            got = fn()
            sync()
            assert set(got) == set(ref) and all(torch.equal(got[k].cpu(), ref[k]) for k in ref), name
            del got
        del ref
        results: Dict[str, Dict[str, float]] = {}
        for cache in (("warm",) if args.no_cold else ("warm", "cold")):
            times: Dict[str, List[float]] = {name: [] for name in contenders}
            rng = random.Random(0)
            for _ in range(args.repeat):
                order = list(contenders)
                rng.shuffle(order)
                for name in order:
                    fn, kind = contenders[name]
                    if cache == "cold":
                        evict(data_files(files[kind]))
                    gc.collect()
                    if cuda:
                        torch.cuda.empty_cache()
                    sync()
                    t0 = time.perf_counter()
                    out = fn()
                    sync()
                    times[name].append(time.perf_counter() - t0)
                    del out
            results[cache] = {name: statistics.median(v) for name, v in times.items()}
        gpu = torch.cuda.get_device_name(device) if cuda else "cpu (smoke run: host copies, not a device load)"
        print(f"GPU load: {len(tt.load_state(files['tl']))} tensors, {nbytes / MiB:.0f} MiB, onto {gpu}, "
              f"median of {args.repeat}")
        for cache, row in results.items():
            ours = row["tensorlist.load(device=)"]
            print(f"\n-- {cache} page cache")
            print(f"{'contender':48s} {'time s':>8s} {'GB/s':>7s} {'other/tl':>9s}")
            for name, t in row.items():
                print(f"{name:48s} {t:8.3f} {nbytes / t / 1e9:7.2f} {t / ours:8.2f}x")
        print("\n=== targets")
        for cache, row in results.items():
            ours = row["tensorlist.load(device=)"]
            for peer in ("safetensors safe_open(device=) + get_tensor", "torch.load(map_location=, mmap=True)"):
                if peer in row:
                    ratio = row[peer] / ours
                    verdict = ("met" if ratio >= 1.0 else "NOT met") if cuda else "n/a (smoke run on the CPU)"
                    print(f"{cache}: load >= 1.0x {peer}: {ratio:.2f}x {verdict}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"bytes": nbytes, "device": gpu, "repeat": args.repeat, "seconds": results}, f, indent=1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
