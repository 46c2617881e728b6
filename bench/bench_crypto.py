"""Encrypted saves and loads against tensorlist's plain ones and tensorizer's encryption, on the same tensors.

The data: ``--mib`` MiB of bfloat16 (default 256) in 64 tensors, page cache
warm. Contenders, interleaved in a new order each round, medians of
``--repeat`` rounds; before each, the saves' outputs are removed and every
dirty page written back (``os.sync``), so no save pays for another's:

* loads: ``tensorlist.load(key=)`` (decrypted in parallel into one
  allocation), ``tensorlist.load(mmap=False)`` of the plain file, and
  tensorizer's ``TensorDeserializer(encryption=DecryptionParams)`` with
  ``device="cpu"`` reading every tensor (libsodium's XSalsa20-Poly1305);
* saves (``durable=False``): ``tensorlist.save(key=)`` and a plain
  ``tensorlist.save``, and tensorizer's ``TensorSerializer(encryption=)``.

Ratios printed against the targets (docs/SECURITY.md, "Encrypted files"):
encrypted load >= 2x tensorizer's, encrypted load time <= 1.25x the plain
load's, encrypted save >= 0.7x the plain save's speed. tensorizer is the
``tensorizer`` and ``libnacl`` packages (and libsodium); without them its
rows say n/a.

    python bench/bench_crypto.py --repeat 7
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import tensorlist as tl  # noqa: E402


def tensors(mib: int) -> dict:
    import ml_dtypes
    n = 64
    per = (mib << 20) // n // 2
    rng = np.random.default_rng(0)
    base = rng.standard_normal(per, dtype=np.float32).astype(ml_dtypes.bfloat16)
    return {f"layers.{i}.weight": np.roll(base, i).reshape(-1, 1024) if per % 1024 == 0 else np.roll(base, i)
            for i in range(n)}


def touch(arrays) -> None:
    for a in arrays:
        v = a.reshape(-1).view(np.uint8) if hasattr(a, "reshape") else a
        v[::4096].sum()


def settle(d) -> None:
    """Removes the saves' outputs and writes every dirty page back: each contender starts from a clean
    page cache (a save is then never slowed by writing back, or freeing, the one before it)."""
    for name in os.listdir(d):
        if name.startswith(("s_", "s.")):
            os.unlink(os.path.join(d, name))
    os.sync()


class Tensorizer:
    """tensorizer's encrypted serializer and deserializer, or None where it is not installed."""

    def __init__(self, d: str, state: dict):
        import torch
        from tensorizer import DecryptionParams, EncryptionParams, TensorDeserializer, TensorSerializer
        self.torch, self.TS, self.TD = torch, TensorSerializer, TensorDeserializer
        self.enc = EncryptionParams.random()
        self.dec = DecryptionParams.from_key(self.enc.key)
        self.state = {k: torch.from_numpy(v.view(np.uint16)).view(torch.bfloat16) for k, v in state.items()}
        self.path = os.path.join(d, "model.tensors")
        self.save(self.path)

    def save(self, path: str) -> None:
        s = self.TS(path, encryption=self.enc)
        s.write_state_dict(self.state)
        s.close()

    def load(self) -> None:
        with self.TD(self.path, encryption=self.dec, device="cpu") as d:
            touch([t.view(self.torch.uint8).numpy() for t in d.values()])


def run(args) -> dict:
    d = tempfile.mkdtemp(prefix="tensorlist-cryptobench-", dir=args.dir)
    try:
        state = tensors(args.mib)
        key = tl.Key.generate()
        enc, plain = os.path.join(d, "enc.tl"), os.path.join(d, "plain.tl")
        tl.save(enc, state, key=key)
        tl.save(plain, state)
        try:
            tz = Tensorizer(d, state)
        except ImportError as e:
            print(f"tensorizer not run: {e}")
            tz = None
        loads = {
            "tensorlist.load(key=)": lambda: touch(tl.load(enc, key=key).values()),
            "tensorlist.load(mmap=False), plain": lambda: touch(tl.load(plain, mmap=False).values()),
        }
        saves = {
            "tensorlist.save(key=)": lambda: tl.save(os.path.join(d, "s_enc.tl"), state, key=key, durable=False),
            "tensorlist.save, plain": lambda: tl.save(os.path.join(d, "s_plain.tl"), state, durable=False),
        }
        if tz is not None:
            loads["tensorizer TensorDeserializer(encryption=)"] = tz.load
            saves["tensorizer TensorSerializer(encryption=)"] = lambda: tz.save(os.path.join(d, "s.tensors"))
        times = {k: [] for k in (*loads, *saves)}
        rng = random.Random(0)
        jobs = [*loads.items(), *saves.items()]
        for f in dict(jobs).values():
            f()  # warm-up: page cache, imports, thread pools
        for _ in range(args.repeat):
            rng.shuffle(jobs)
            for name, f in jobs:
                settle(d)
                t = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t)
        return {k: statistics.median(v) for k, v in times.items()}
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mib", type=int, default=256)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--dir", default=None, help="where the files go (default: the system's temp dir)")
    args = p.parse_args(argv)
    med = run(args)
    gb = args.mib / 1024 * 1.073741824
    print(f"{args.mib} MiB of bfloat16 in 64 tensors, page cache warm, medians of {args.repeat} rounds")
    for name, s in med.items():
        print(f"  {name:48s} {s:8.4f} s  {gb / s:6.2f} GB/s")
    el, pl = med["tensorlist.load(key=)"], med["tensorlist.load(mmap=False), plain"]
    es, ps = med["tensorlist.save(key=)"], med["tensorlist.save, plain"]
    tz = med.get("tensorizer TensorDeserializer(encryption=)")
    print("targets (ratio = the other's time / the encrypted tensorlist's time):")
    print(f"  encrypted load vs tensorizer's (>= 2):             {tz / el:.2f}" if tz else
          "  encrypted load vs tensorizer's (>= 2):             n/a")
    print(f"  encrypted load time / plain load time (<= 1.25):   {el / pl:.2f}")
    print(f"  encrypted save speed / plain save speed (>= 0.7):  {ps / es:.2f}")
    tzs = med.get("tensorizer TensorSerializer(encryption=)")
    if tzs:
        print(f"  encrypted save vs tensorizer's (no target):        {tzs / es:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
