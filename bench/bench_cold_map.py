#!/usr/bin/env python3
"""Ways to fault in a cold memory-mapped file: is there a faster one than touching its pages?

A mapped load of a file that is not in the page cache (tensorlist's and safetensors' default) is the
kernel's readahead behind page faults. This measures, on one file evicted before every run
(``posix_fadvise(DONTNEED)``), the time until one byte of every 4 KiB page has been read:

* ``touch``: the faults alone (what both formats do);
* ``willneed``: ``madvise(MADV_WILLNEED)`` over the whole mapping first;
* ``fadvise``: ``posix_fadvise(WILLNEED)`` over the whole file first;
* ``populate``: ``madvise(MADV_POPULATE_READ)`` (Linux 5.14) from ``--threads`` threads, 8 MiB at a
  time, while the main thread touches.

Linux only. Prints each way's median and fastest time and its ratio to ``touch`` (> 1: faster).

Usage:
    python bench/bench_cold_map.py [--gib 1] [--rounds 5] [--threads 4] [--dir DIR]
"""
import argparse
import ctypes
import mmap
import os
import statistics
import sys
import tempfile
import threading
import time

import numpy as np

from pagecache import evict  # this script's folder is on sys.path when run as a script

MADV_POPULATE_READ = 22  # linux/mman.h; Python's mmap module lacks it before 3.13
CHUNK = 8 << 20


def one_load(path: str, size: int, way: str, threads: int, madvise) -> float:
    evict([path])
    t = time.perf_counter()
    fd = os.open(path, os.O_RDONLY)
    m = mmap.mmap(fd, size, prot=mmap.PROT_READ)
    a = np.frombuffer(m, np.uint8)
    workers = []
    if way == "willneed":
        m.madvise(mmap.MADV_WILLNEED)
    elif way == "fadvise":
        os.posix_fadvise(fd, 0, size, os.POSIX_FADV_WILLNEED)
    elif way == "populate":
        base, step = a.ctypes.data, -(-size // threads)

        def work(lo, hi):
            for off in range(lo, hi, CHUNK):
                madvise(base + off, min(CHUNK, hi - off), MADV_POPULATE_READ)

        workers = [threading.Thread(target=work, args=(i * step, min(size, (i + 1) * step))) for i in range(threads)]
        for w in workers:
            w.start()
    int(a[::4096].sum())  # one byte of every page: the faults
    elapsed = time.perf_counter() - t
    for w in workers:
        w.join()
    del a
    m.close()
    os.close(fd)
    return elapsed


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--gib", type=float, default=1.0, help="file size in GiB (default 1)")
    p.add_argument("--rounds", type=int, default=5, help="timed runs of each way (default 5)")
    p.add_argument("--threads", type=int, default=4, help="threads of the populate way (default 4)")
    p.add_argument("--dir", default=None, help="where the file goes (default: system temp)")
    args = p.parse_args(argv)
    if not sys.platform.startswith("linux"):
        p.error("Linux only (madvise, posix_fadvise)")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    size = int(args.gib * (1 << 30)) // 4096 * 4096
    ways = ["touch", "willneed", "fadvise", "populate"]
    times = {w: [] for w in ways}
    with tempfile.TemporaryDirectory(prefix="tensorlist-cold-", dir=args.dir) as d:
        path = os.path.join(d, "data.bin")
        rng = np.random.default_rng(0)
        with open(path, "wb") as f:
            for off in range(0, size, 64 << 20):
                f.write(rng.integers(0, 256, min(64 << 20, size - off), dtype=np.uint8).tobytes())
        for r in range(args.rounds):
            for w in (ways if r % 2 == 0 else ways[::-1]):  # alternate the order: drift hits all alike
                times[w].append(one_load(path, size, w, args.threads, libc.madvise))
    base = statistics.median(times["touch"]), min(times["touch"])
    print(f"cold mapped read of {size / (1 << 30):.2f} GiB, one byte per page, {args.rounds} rounds")
    print(f"{'way':10} {'median s':>9} {'min s':>7} {'touch/way (median, min)':>24}")
    for w in ways:
        med, low = statistics.median(times[w]), min(times[w])
        print(f"{w:10} {med:9.3f} {low:7.3f} {base[0] / med:11.2f} {base[1] / low:11.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
