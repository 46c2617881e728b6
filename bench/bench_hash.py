"""weights_sha256 over a memory-mapped tensorlist file vs plain hashlib.sha256 over the same bytes.

weights_sha256 adds a length-prefixed header per tensor (name, dtype, shape,
byte length) and hands each tensor's mapped bytes straight to SHA-256, so on
a large file it should run at the speed of SHA-256 itself. This script writes
a model-like file (default 512 MiB: large float32 matrices, a bfloat16 block,
hundreds of small tensors), warms the page cache, then times, interleaved:

* ``weights_sha256(path)``: open the descriptor, map the data file, hash;
* ``hashlib.sha256``: map the data file with ``mmap`` and hash the same tensor
  byte ranges, nothing else.

and prints the ratio (hashlib time / weights_sha256 time; 1.0 = as fast as
hashlib; the target is >= 0.9). ``--check`` exits 1 below the target.

    python bench/bench_hash.py --size-mib 512 --repeat 5 --check
"""
from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import sys
import tempfile
import time

import ml_dtypes
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tensorlist  # noqa: E402
from tensorlist.provenance.record import weights_sha256  # noqa: E402

TARGET = 0.9


def make_weights(size_mib: int) -> dict:
    """About size_mib MiB of model-like tensors (float32 blocks, bfloat16, many small ones)."""
    rng = np.random.default_rng(0)
    total = size_mib << 20
    weights = {}
    # 300 small tensors (biases, norms): the per-tensor overhead shows here
    for i in range(300):
        weights[f"layers.{i}.bias"] = rng.standard_normal(256).astype(np.float32)
    bf16_bytes = total // 8
    weights["embed.weight"] = rng.standard_normal(bf16_bytes // 2).astype(ml_dtypes.bfloat16).reshape(-1, 1024)
    left = total - sum(a.nbytes for a in weights.values())
    block = 32 << 20
    i = 0
    while left > 0:
        n = min(block, left) // 4
        weights[f"blocks.{i}.weight"] = rng.standard_normal(n, dtype=np.float32).reshape(-1, 1024) \
            if n % 1024 == 0 else rng.standard_normal(n, dtype=np.float32)
        left -= n * 4
        i += 1
        if n == 0:
            break
    return weights


def hashlib_same_bytes(path: str) -> str:
    """Plain SHA-256 over each tensor's bytes, read through mmap of the data file."""
    with open(path, "rb") as f:
        desc = json.loads(f.read())
    data = os.path.join(os.path.dirname(path), desc["location"])
    h = hashlib.sha256()
    with open(data, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        view = memoryview(m)
        base = desc["byteOffset"]
        for t in desc["tensors"]:
            start = base + t["byteOffset"]
            h.update(view[start:start + t["byteLength"]])
        view.release()
    return h.hexdigest()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=512, help="data size in MiB (>= 256 for the claim)")
    parser.add_argument("--repeat", type=int, default=5, help="timed runs of each (the best is kept)")
    parser.add_argument("--dir", default=None, help="where to write the file (default: a temporary directory)")
    parser.add_argument("--check", action="store_true", help=f"exit 1 when the ratio is below {TARGET}")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = os.path.join(tmp, "model.json")
        weights = make_weights(args.size_mib)
        n_bytes = sum(a.nbytes for a in weights.values())
        tensorlist.save(path, weights, checksum=False, durable=False)
        expected = weights_sha256(weights)
        del weights
        # warm the page cache so both sides read memory, not disk
        hashlib_same_bytes(path)
        assert weights_sha256(path) == expected

        t_tl, t_hl = [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            weights_sha256(path)
            t_tl.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            hashlib_same_bytes(path)
            t_hl.append(time.perf_counter() - t0)

    best_tl, best_hl = min(t_tl), min(t_hl)
    ratio = best_hl / best_tl
    gib = n_bytes / (1 << 30)
    print(f"data: {n_bytes / (1 << 20):.0f} MiB in one memory-mapped tensorlist file "
          f"(float32 + bfloat16 + 300 small tensors), best of {args.repeat} runs each")
    print(f"hashlib.sha256 over the same bytes: best {best_hl * 1e3:8.1f} ms  ({gib / best_hl:.2f} GiB/s)")
    print(f"weights_sha256(path)              : best {best_tl * 1e3:8.1f} ms  ({gib / best_tl:.2f} GiB/s)")
    print(f"ratio (hashlib time / weights_sha256 time): {ratio:.3f}  (target >= {TARGET})")
    if args.check and ratio < TARGET:
        print("FAIL: below target", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
