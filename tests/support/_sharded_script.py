"""Runs of the loops with sharded checkpoints on gloo process groups, for tests/trainers/test_loops_sharded.py.

usage: python _sharded_script.py PLAN.json RESULT.json

PLAN: ``{"steps": [{"name", "world", "runs": [run, ...]} or {"copy": [src, dst]}, ...]}``, in order.
This process imports torch once, then for each launch of the plan forks ``world`` processes, one per rank,
with tests/support/_ranks.py (a fork starts in milliseconds where a new interpreter needs seconds to import torch:
the tests launch a dozen process groups). Each rank joins a gloo group over 127.0.0.1 (none when ``world``
is 1), does the launch's runs in order, and exits. A rank may SIGKILL itself (``kill_at``: after that many
training batches, the other ranks waiting there to be killed; ``kill_in_save``: rank ``world - 1`` inside
its N-th DCP ``write_data``, after writing its shard, before the save commits); once a rank is dead by
SIGKILL (or has failed) this process SIGKILLs the others, as a scheduler stops a job. RESULT.json gets, per
launch name, each rank's exit status (negative: the signal) and the end of the log of each rank that failed.

A run: ``{"out", "mode": simple | swa | simple_then_swa, "epochs", "data": split | full, "resume",
"kill_at", "kill_in_save", "fsdp", "no_bn"}`` (``fsdp``: the model sharded with FSDP2 instead of DDP;
``no_bn``: FSDP2's model, without batch norm, unsharded). ``split``: each rank trains on its part of the data
(DistributedSampler); ``full``: every rank trains on all of it, which makes the computation independent
of the number of ranks (DDP averages equal gradients).
"""
import json
import os
import shutil
import signal
import sys
import time
import warnings

import torch

torch.set_num_threads(1)

import torch.distributed as dist  # noqa: E402

import tensorlist.dcp  # noqa: E402
import tensorlist.loops as loops  # noqa: E402
import tensorlist.loops.sharded  # noqa: E402,F401  (imported before the fork, as everything the ranks use)

import _ranks  # noqa: E402
from _loop_script import data, run as run_loop  # noqa: E402

LAUNCH_TIMEOUT = 150


def build(fsdp=False):
    torch.manual_seed(1)
    if fsdp:  # no batch norm: FSDP2 shards parameters, the test compares them
        return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.ReLU(), torch.nn.Dropout(0.2),
                                   torch.nn.Linear(16, 2))
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.BatchNorm1d(16), torch.nn.ReLU(),
                               torch.nn.Dropout(0.2), torch.nn.Linear(16, 2))


def one_run(run, rank, world):
    model = build(run.get("fsdp", False) or run.get("no_bn", False))
    if run.get("fsdp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        mesh = init_device_mesh("cpu", (world,))
        for m in model:
            if isinstance(m, torch.nn.Linear):
                fully_shard(m, mesh=mesh)
        wrapped = fully_shard(model, mesh=mesh)
    elif world > 1:
        wrapped = torch.nn.parallel.DistributedDataParallel(model)
    else:
        wrapped = model
    opt = torch.optim.Adam(wrapped.parameters(), lr=0.02)
    x, y = data()
    vx, vy = data(48, seed=5)
    ds = torch.utils.data.TensorDataset(x, y)
    if run["data"] == "split":
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=True,
                                                                  seed=0)
        train = torch.utils.data.DataLoader(ds, batch_size=16 // world, sampler=sampler)
    else:
        train = torch.utils.data.DataLoader(ds, batch_size=16, shuffle=True)
    handlers = {}
    if run.get("kill_at") is not None:
        calls = [0]

        def kill(state):  # counts batches over both phases of with_swa
            calls[0] += 1
            if calls[0] != run["kill_at"]:
                return
            if rank != 0:  # out of every collective until this process stops it (a peer that saw rank 0
                time.sleep(3600)  # die inside one would fail with an error instead of being killed)
            time.sleep(0.5 if world > 1 else 0)  # the other ranks reach their sleep
            os.kill(os.getpid(), signal.SIGKILL)
        handlers[loops.Events.ITERATION_COMPLETED] = kill
    if run.get("kill_in_save") is not None and rank == world - 1:
        saves = [0]
        write_data = tensorlist.dcp.TensorListWriter.write_data

        def dying_write_data(self, plan, planner):
            fut = write_data(self, plan, planner)
            saves[0] += 1
            if saves[0] == run["kill_in_save"]:
                os.kill(os.getpid(), signal.SIGKILL)  # its shard is written; the save has not committed
            return fut
        tensorlist.dcp.TensorListWriter.write_data = dying_write_data
    common = dict(loss_fn=torch.nn.functional.cross_entropy, validation=[(vx, vy)], out_dir=run["out"],
                  resume=run.get("resume", False), handlers=handlers, progress=False,
                  dataset_params={"name": "toy", "n": 96}, seed=1, checkpoint_format="sharded")
    run_loop(run["mode"], wrapped, opt, train, run["epochs"], **common)


def rank_main(launch, rank, port):
    world = launch["world"]
    warnings.simplefilter("ignore")
    if world > 1:
        _ranks.join(rank, world, port)
    for run in launch["runs"]:
        one_run(run, rank, world)
    if world > 1:
        dist.barrier()
        dist.destroy_process_group()


def launch_ranks(launch, logdir, index):
    world = launch["world"]
    logs = [os.path.join(logdir, f"launch{index}.rank{rank}.log") for rank in range(world)]
    with _ranks.Launch(world, logs) as job:
        for rank in range(world):
            job.fork(lambda rank=rank: rank_main(launch, rank, job.port))
        status = job.wait(LAUNCH_TIMEOUT)
        failed = {rank: job.output(rank)[-4000:] for rank in range(world) if status[rank] not in (0, -signal.SIGKILL)}
    return {"status": status, "logs": failed}


def main(plan_path, result_path):
    with open(plan_path) as f:
        plan = json.load(f)
    logdir = os.path.dirname(os.path.abspath(result_path))
    results = {}
    for i, step in enumerate(plan["steps"]):
        if "copy" in step:  # a snapshot of a run's directory, between launches
            shutil.copytree(*step["copy"])
        else:
            results[step["name"]] = launch_ranks(step, logdir, i)
    with open(result_path, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
    import _ranks
    _ranks.exit_now()
