"""Sharded JAX loads: bytes a reshard needs, bytes it copies or views, and file pages it reads.

Saves one float32 array (``--mib`` MiB, square-ish, rows split over 4 forced CPU devices: 4 chunks)
with ``tensorlist.dcp.jax_shards.save_dir``, then loads it onto other shardings. For each target it prints
the bytes the target's blocks need, the bytes ``ShardedCheckpoint`` handed on as views of the mapped
chunks and those it copied into assembled blocks, and the file's pages in the page cache after the load
and after every value was read once (``mincore`` after ``posix_fadvise(DONTNEED)`` emptied the cache:
what was really read from the file), with the load's wall time.

    python bench/bench_jax_shards.py               # 64 MiB
    python bench/bench_jax_shards.py --mib 512
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=4")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import jax  # noqa: E402
import numpy as np  # noqa: E402
from jax.sharding import NamedSharding, PartitionSpec as P  # noqa: E402

from tensorlist.dcp.jax_shards import open_dir, save_dir  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pagecache import evict, resident_bytes  # noqa: E402

def _data_files(path):
    return [os.path.join(path, n) for n in os.listdir(path) if n.endswith(".data")]


def _drop_cache(path) -> None:
    evict(_data_files(path))


def _resident(path) -> int:
    """Bytes of the checkpoint's data files now in the page cache."""
    return sum(resident_bytes(f) for f in _data_files(path))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mib", type=int, default=64, help="size of the saved float32 array in MiB")
    args = ap.parse_args()
    devs = jax.devices()
    if len(devs) < 4:
        sys.exit(f"needs 4 CPU devices, jax has {len(devs)} (XLA_FLAGS was set before this script ran?)")
    cols = 4096
    rows = max(8, args.mib * (1 << 20) // (4 * cols) // 8 * 8)
    value = np.random.default_rng(0).standard_normal((rows, cols), dtype=np.float32)
    mesh = lambda shape: jax.make_mesh(shape, ("x", "y"), devices=devs[:shape[0] * shape[1]])  # noqa: E731
    targets = [
        ("4 -> 4, same rows", NamedSharding(mesh((4, 1)), P("x", None))),
        ("4 -> 2, rows", NamedSharding(mesh((2, 1)), P("x", None))),
        ("4 -> 2, columns", NamedSharding(mesh((1, 2)), P(None, "y"))),
        ("4 -> 8 row blocks on 4 devices", NamedSharding(mesh((2, 2)), P(("x", "y"), None))),
        ("4 -> 1 device", devs[0]),
    ]
    with tempfile.TemporaryDirectory(prefix="tensorlist-bench-") as tmp:
        arr = jax.device_put(value, NamedSharding(mesh((4, 1)), P("x", None)))
        t = time.perf_counter()
        save_dir(tmp, {"w": arr}, None, durable=True)
        print(f"saved {value.nbytes / 2**20:.0f} MiB float32 {list(value.shape)} in 4 row chunks: "
              f"{time.perf_counter() - t:.3f} s")
        print(f"{'target':34} {'needed MiB':>10} {'viewed':>8} {'copied':>8} {'file read':>10} "
              f"{'after use':>10} {'load s':>8}")
        mib = lambda b: f"{b / 2**20:.1f}"  # noqa: E731
        for label, target in targets:
            gc.collect()  # the previous target's arrays (and their mapped pages) are gone
            _drop_cache(tmp)
            before = _resident(tmp)
            with open_dir(tmp) as c:
                t = time.perf_counter()
                out = c.load("w", target)
                out.block_until_ready()
                took = time.perf_counter() - t
                read_by_load = _resident(tmp) - before
                needed = sum(shard.data.nbytes for shard in out.addressable_shards)
                for shard in out.addressable_shards:
                    float(np.asarray(shard.data).sum())  # every value read once
                after = _resident(tmp) - before
                print(f"{label:34} {mib(needed):>10} {mib(c.bytes_viewed):>8} {mib(c.bytes_copied):>8} "
                      f"{mib(read_by_load):>10} {mib(after):>10} {took:>8.3f}")
                np.testing.assert_array_equal(np.asarray(out), value)
            del out, shard, c


if __name__ == "__main__":
    main()
