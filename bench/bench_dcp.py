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

* async_save with torch's own stagers (torch >= 2.9): ``DefaultStager(StagingOptions(...))`` with shared
  memory and async staging (the stall is until ``async_save`` returns its ``AsyncSaveResponse``), and
  ``async_checkpointer_type=PROCESS`` (the writer is sent to a background process);
* resharding load, cold and warm (a second set of ``--load-world`` processes, default twice ``--world``,
  loads the checkpoints the first set saved, so each rank needs half of one saved chunk of every tensor):
  ``FileSystemReader``, ``TensorListReader`` (byte ranges with ``preadv``) and the mapped whole-chunk read
  it replaced. Cold: every file of the checkpoint evicted from the page cache with
  ``posix_fadvise(DONTNEED)`` before each load (no root needed). Bytes read are the kernel's
  ``/proc/self/io`` ``read_bytes`` (from storage: cold rows only), summed over the ranks, against the bytes
  the ranks' shards hold; TensorListReader's own count of its preads is printed too;
* one key out of many, cold: each rank loads ``layer3.weight`` alone.

Ratios print as ``FileSystem time / tensorlist time`` (above 1: tensorlist
faster) and ``stall / blocking save`` (below 1: the loop waits less), next to
the targets (save >= 1.0x, load >= 1.5x, stall <= 0.2x).

Usage:
    python bench/bench_dcp.py [--quick] [--mib 256] [--world 2] [--load-world 4] [--repeat 3] [--dir DIR]
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pagecache import evict_dir  # noqa: E402

TARGETS = {"save": 1.0, "load": 1.5, "stall": 0.2, "read": 1.1}
N_TENSORS = 16


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="8 MiB, one run, no warm-up (a smoke test)")
    p.add_argument("--mib", type=float, default=256.0, help="state dict size in MiB, all ranks together")
    p.add_argument("--world", type=int, default=2, help="gloo processes")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per contender (the median is printed)")
    p.add_argument("--dir", default=None, help="where the checkpoints go (default: a temporary directory)")
    p.add_argument("--load-world", type=int, default=None, help="processes of the resharding load (default 2x world)")
    p.add_argument("--phase", default="save", help=argparse.SUPPRESS)
    p.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.load_world is None:
        a.load_world = 2 * a.world
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

    def stall_stager(kind: str) -> float:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType, AsyncSaveResponse
        process = kind == "process"
        # shared memory both ways (the background process reads the staged copy from it); async staging on a thread
        stager = DefaultStager(StagingOptions(False, True, not process, False))
        w = TensorListWriter(os.path.join(a.dir, f"tl-async-{kind}"))
        dist.barrier()
        t0 = time.perf_counter()
        r = dcp.async_save(sd, storage_writer=w, process_group=async_group, async_stager=stager,
                           async_checkpointer_type=AsyncCheckpointerType.PROCESS if process
                           else AsyncCheckpointerType.THREAD)
        t = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        (r.upload_completion if isinstance(r, AsyncSaveResponse) else r).result()
        stager.close()
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
    if _has_stagers():
        contenders["stall stager"] = lambda: stall_stager("thread")
        contenders["stall process"] = lambda: stall_stager("process")
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
    if "stall stager" in m:
        print(f"       DefaultStager(shared memory, async staging) on a thread: {m['stall stager']:7.3f} s, "
              f"{m['stall stager'] / m['save tl']:5.2f}x; AsyncCheckpointerType.PROCESS (shared memory): "
              f"{m['stall process']:7.3f} s, "
              f"{m['stall process'] / m['save tl']:5.2f}x")
    else:
        print("       (this torch has no DefaultStager/AsyncCheckpointerType.PROCESS: torch >= 2.9)")


def _has_stagers() -> bool:
    from torch.distributed.checkpoint import staging
    try:
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: F401
    except ImportError:
        return False
    return hasattr(staging, "DefaultStager")


def _read_bytes() -> int:
    """Bytes this process has read from storage (``/proc/self/io``; 0 where there is none)."""
    try:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("read_bytes:")).split()[1])
    except (OSError, StopIteration):
        return 0


def _load_main(a) -> None:
    """Phase 2: ``--load-world`` ranks load what ``--world`` ranks saved (a reshard), cold and warm."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.device_mesh import init_device_mesh

    from mapped_reader import MappedReader  # this script's folder is on sys.path
    from tensorlist.dcp import TensorListReader

    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{a.port}", rank=a.rank, world_size=a.load_world,
                            timeout=datetime.timedelta(seconds=600))
    mesh = init_device_mesh("cpu", (a.load_world,))
    torch.manual_seed(0)
    sd = _state_dict(mesh, a.mib, a.world)  # the same global tensors, now on load_world ranks
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    fs_dir, tl_dir = os.path.join(a.dir, "fs"), os.path.join(a.dir, "tl")
    one = "layer3.weight"
    readers = {"fs": lambda: FileSystemReader(fs_dir), "tl": lambda: TensorListReader(tl_dir),
               "mapped": lambda: MappedReader(tl_dir)}
    folders = {"fs": fs_dir, "tl": tl_dir, "mapped": tl_dir}

    def rchar() -> int:
        with open("/proc/self/io") as f:
            return int(next(line for line in f if line.startswith("rchar:")).split()[1])

    def one_load(kind: str, keys, no_dist: bool):
        reader = readers[kind]()
        part = {k: target[k] for k in keys}
        before, chars = _read_bytes(), rchar()
        t0 = time.perf_counter()
        dcp.load(part, storage_reader=reader, no_dist=no_dist)
        t = time.perf_counter() - t0
        return [t, _read_bytes() - before, getattr(reader, "bytes_read", 0), rchar() - chars,
                sum(part[k].to_local().numel() * part[k].to_local().element_size() for k in keys)]

    def measure(kind: str, cold: bool, keys):
        """Cold: the ranks load one after another (``no_dist``), each after evicting the checkpoint, so no rank
        reads what another brought into the page cache. Warm: one collective ``dcp.load``."""
        if cold:
            mine = None
            for r in range(a.load_world):
                if r == a.rank:
                    evict_dir(folders[kind])
                    mine = one_load(kind, keys, True)
                dist.barrier()
        else:
            dist.barrier()
            mine = one_load(kind, keys, False)
        stats = torch.tensor(mine, dtype=torch.float64)
        spread = stats.clone()
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        # cold: the mean rank's time (they ran one after another); warm: the slowest rank's
        t = float(stats[0]) / a.load_world if cold else float(spread[0])
        return {"time": t, "read": float(stats[1]), "counted": float(stats[2]), "chars": float(stats[3]),
                "needed": float(stats[4])}

    rows = {}
    for cold, keys, label in ((True, list(sd), "cold"), (False, list(sd), "warm"), (True, [one], "one key")):
        for kind in readers:
            runs = [measure(kind, cold, keys) for _ in range(a.repeat)]
            rows[(label, kind)] = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    for k in sd:
        assert torch.equal(target[k].to_local(), sd[k].to_local()), f"{k}: the resharded load differs"
    if a.rank == 0:
        _report_load(a, rows)
    dist.barrier()
    dist.destroy_process_group()


def _report_load(a, rows) -> None:
    print(f"resharding load: saved on {a.world} ranks, loaded on {a.load_world} (each rank needs half of one saved "
          f"chunk per tensor); median of {a.repeat}. Cold rows: the ranks load one after another, each after "
          "evicting the checkpoint from the page cache (time: the mean rank's); bytes read: /proc/self/io "
          "read_bytes summed over the ranks, next to the bytes their shards hold. Warm rows: one collective load "
          "(the slowest rank's time)")
    names = {"fs": "FileSystemReader", "tl": "TensorListReader", "mapped": "mapped whole chunks"}
    for label in ("cold", "warm", "one key"):
        fs = rows[(label, "fs")]["time"]
        for kind in ("fs", "tl", "mapped"):
            r = rows[(label, kind)]
            ratio = f"  speed vs FileSystemReader {fs / r['time']:5.2f}x" if kind != "fs" else ""
            read = (f"  read {r['read'] / (1 << 20):8.1f} MiB = {r['read'] / r['needed']:4.2f}x needed"
                    if label != "warm" else "")
            counted = (f" (its preads {r['counted'] / r['needed']:4.2f}x)" if kind == "tl" else
                       f" (read() calls {r['chars'] / r['needed']:4.2f}x)" if kind == "fs" else "")
            print(f"{label:8s} {names[kind]:20s} {r['time']:7.3f} s{read}{counted}{ratio}")
    print(f"targets: bytes read <= {TARGETS['read']}x needed (cold reshard, one key); load >= {TARGETS['load']}x "
          "FileSystemReader")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None) -> int:
    a = _args(argv)
    if a.rank is not None:
        (_load_main if a.phase == "load" else _rank_main)(a)
        return 0
    own = a.dir is None
    a.dir = tempfile.mkdtemp(prefix="tensorlist-bench-dcp-") if own else a.dir
    try:
        for phase, world in (("save", a.world), ("load", a.load_world)):
            port = _free_port()
            env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
            cmd = [sys.executable, os.path.abspath(__file__), "--mib", str(a.mib), "--world", str(a.world),
                   "--load-world", str(a.load_world), "--repeat", str(a.repeat), "--dir", a.dir, "--port", str(port),
                   "--phase", phase] + (["--quick"] if a.quick else [])
            procs = [subprocess.Popen(cmd + ["--rank", str(r)], env=env) for r in range(world)]
            while any(p.poll() is None for p in procs) and not any(p.returncode for p in procs):
                time.sleep(0.1)
            for p in procs:  # a failed rank leaves the others waiting on a collective
                if p.poll() is None:
                    p.kill()
            codes = [p.wait() for p in procs]
            if any(codes):
                print(f"a rank failed ({phase}): exit codes {codes}", file=sys.stderr)
                return 1
        return 0
    finally:
        if own:
            shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
