#!/usr/bin/env python3
"""Distributed checkpoint benchmark: tensorlist.dcp against DCP's own FileSystemWriter/FileSystemReader.

One run, real gloo processes on loopback (``--world``, default 2), the same
state dict for every contender: ``--mib`` MiB in all (default 256) as 16
DTensors sharded along dimension 0 over the ranks, half float32, half
bfloat16. Timed, each the slowest rank's time, median of ``--repeat`` runs
(contenders interleaved, a warm-up round first):

* save: ``dcp.save`` with ``FileSystemWriter`` (``sync_files=True``, DCP's
  default) and with ``TensorListWriter`` (``durable=True``, the default): both
  fsync their files before the metadata is committed. FileSystemWriter
  overwrites its files in place; TensorListWriter writes new ones and deletes
  the replaced checkpoint's in a thread after the commit: that deletion is
  timed apart (joined before the next contender runs) and printed too;
* load: ``dcp.load`` into preallocated DTensors with ``FileSystemReader``
  (one ``torch.load`` per chunk) and with ``TensorListReader`` (memory-mapped
  shards, one copy per chunk). The page cache is warm for both (the files
  were just written);
* async_save stall: how long ``dcp.async_save(storage_writer=TensorListWriter)``
  keeps the training loop waiting (it returns once the state is staged in
  CPU memory; the write goes on in a thread), against a blocking ``dcp.save``
  with the same writer: with one writer kept across saves (the staged copy
  of the previous save is reused, ``cache_staged_state_dict=True``, the
  default), and with a new writer per save (fresh memory every time).

Ratios print as ``FileSystem time / tensorlist time`` (above 1: tensorlist
faster) and ``stall / blocking save`` (below 1: the loop waits less), next to
the targets of issue 12 (save >= 1.0x, load >= 1.5x, stall <= 0.2x).

Usage:
    python bench/bench_dcp.py [--quick] [--mib 256] [--world 2] [--repeat 3] [--dir DIR]
"""
from __future__ import annotations

import argparse
import datetime
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

TARGETS = {"save": 1.0, "load": 1.5, "stall": 0.2}
N_TENSORS = 16


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="8 MiB, one run, no warm-up (a smoke test)")
    p.add_argument("--mib", type=float, default=256.0, help="state dict size in MiB, all ranks together")
    p.add_argument("--world", type=int, default=2, help="gloo processes")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per contender (the median is printed)")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        a.mib, a.repeat = 8.0, 1
    return a


def _state_dict(mesh, mib: float, world: int):
    import torch
    from torch.distributed.tensor import Shard, distribute_tensor
    per = int(mib * (1 << 20)) // N_TENSORS
    out = {}
    for i in range(N_TENSORS):
        dtype = torch.float32 if i % 2 == 0 else torch.bfloat16
        cols = 1024
        rows = max(world, per // (cols * (4 if dtype == torch.float32 else 2)))
        full = torch.empty(rows, cols, dtype=dtype)
        g = torch.Generator().manual_seed(i)
        full.copy_(torch.rand(rows, cols, generator=g))
        out[f"layer{i}.weight"] = distribute_tensor(full, mesh, [Shard(0)])
    return out


def _rank_main(a) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader, FileSystemWriter
    from torch.distributed.device_mesh import init_device_mesh

    from tensorlist.dcp import TensorListReader, TensorListWriter

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.world,
                            timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (a.world,))
    sd = _state_dict(mesh, a.mib, a.world)
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    nbytes = sum(v.numel() * v.element_size() for v in sd.values())  # DTensor.numel(): the global tensor
    fs_dir, tl_dir = os.path.join(a.dir, "fs"), os.path.join(a.dir, "tl")
    async_group = dist.new_group(backend="gloo")
    kept = TensorListWriter(os.path.join(a.dir, "tl-async-kept"))

    def timed(fn) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fn()
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    def stall(writer) -> float:
        dist.barrier()
        t0 = time.perf_counter()
        fut = dcp.async_save(sd, storage_writer=writer, process_group=async_group)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        fut.result()  # no collective on the default group while the save thread uses its own
        writer.wait()
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t)

    writer = TensorListWriter(tl_dir)

    def save_tl() -> float:
        t = timed(lambda: dcp.save(sd, storage_writer=writer))
        times["cleanup"].append(timed(writer.wait))  # untimed above: dcp.save returned before the deletion ended
        return t

    contenders = {
        "save fs": lambda: timed(lambda: dcp.save(sd, storage_writer=FileSystemWriter(fs_dir))),
        "save tl": save_tl,
        "load fs": lambda: timed(lambda: dcp.load(target, storage_reader=FileSystemReader(fs_dir))),
        "load tl": lambda: timed(lambda: dcp.load(target, storage_reader=TensorListReader(tl_dir))),
        "stall": lambda: stall(kept),
        "stall fresh": lambda: stall(TensorListWriter(os.path.join(a.dir, "tl-async-fresh"))),
    }
    times = {k: [] for k in list(contenders) + ["cleanup"]}
    rounds = a.repeat if a.quick else a.repeat + 1
    for r in range(rounds):
        for k, fn in contenders.items():
            t = fn()
            if a.quick or r > 0:  # round 0 is the warm-up (imports, first allocations)
                times[k].append(t)
            elif k == "save tl":
                times["cleanup"].clear()
    check = {k: torch.zeros_like(v) for k, v in sd.items()}
    dcp.load(check, storage_reader=TensorListReader(tl_dir))
    assert all(torch.equal(check[k].to_local(), sd[k].to_local()) for k in sd), "tensorlist.dcp round trip differs"
    if a.rank == 0:
        _report(a, nbytes, {k: statistics.median(v) if v else 0.0 for k, v in times.items()})
    dist.barrier()
    dist.destroy_process_group()


def _report(a, total: int, m) -> None:
    gib = total / (1 << 30)
    print(f"tensorlist.dcp vs DCP FileSystemWriter/Reader: {a.world} gloo ranks, {total / (1 << 20):.1f} MiB state "
          f"dict ({N_TENSORS} DTensors, Shard(0), float32 + bfloat16), median of {a.repeat}, warm page cache")
    save, load = m["save fs"] / m["save tl"], m["load fs"] / m["load tl"]
    st, stf = m["stall"] / m["save tl"], m["stall fresh"] / m["save tl"]
    whole = m["save fs"] / (m["save tl"] + m["cleanup"])
    print(f"save   FileSystemWriter {m['save fs']:7.3f} s  TensorListWriter {m['save tl']:7.3f} s "
          f"({gib / m['save tl']:.2f} GiB/s)  ratio {save:5.2f}x  (target >= {TARGETS['save']}x)")
    print(f"       + deleting the replaced checkpoint after dcp.save returned: {m['cleanup']:.3f} s; "
          f"ratio counting it {whole:5.2f}x")
    print(f"load   FileSystemReader {m['load fs']:7.3f} s  TensorListReader {m['load tl']:7.3f} s "
          f"({gib / m['load tl']:.2f} GiB/s)  ratio {load:5.2f}x  (target >= {TARGETS['load']}x)")
    print(f"async_save stall {m['stall']:7.3f} s vs blocking save {m['save tl']:7.3f} s  ratio {st:5.2f}x  "
          f"(target <= {TARGETS['stall']}x; one writer, staged copy reused)")
    print(f"       a new writer per save (staged into fresh memory): {m['stall fresh']:7.3f} s, {stf:5.2f}x")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    a = _args(argv)
    if a.rank is not None:
        _rank_main(a)
        return 0
    own = a.dir is None
    a.dir = tempfile.mkdtemp(prefix="tensorlist-bench-dcp-") if own else a.dir
    try:
        port = _free_port()
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        cmd = [sys.executable, os.path.abspath(__file__), "--mib", str(a.mib), "--world", str(a.world), "--repeat",
               str(a.repeat), "--dir", a.dir, "--port", str(port)] + (["--quick"] if a.quick else [])
        procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(a.world)]
        while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
            time.sleep(0.1)
        for p in procs:  # a failed rank leaves the others waiting on a collective
            if p.poll() is None:
                p.kill()
        codes = [p.wait() for p in procs]
        if any(codes):
            print(f"a rank failed: exit codes {codes}", file=sys.stderr)
            return 1
        return 0
    finally:
        if own:
            shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
