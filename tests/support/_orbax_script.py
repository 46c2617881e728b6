"""One process of tests/adapters/test_orbax.py's two-process test: python _orbax_script.py MODE ID N PORT ROOT.

Process ID of N (jax.distributed on 127.0.0.1:PORT, gloo CPU collectives, 2 CPU devices each from
XLA_FLAGS). MODE ``save``: saves :func:`tree_values` sharded over all 2N devices (rows across processes,
columns across each process's devices) through Orbax's ``CheckpointManager`` with
``TensorListCheckpointHandler`` (step 1), then restores step 1 onto a mesh of one device per process,
checks every local shard bit for bit and the item metadata, and prints "restored on K".
The test module imports ``tree_values`` and ``assert_same`` from here.
"""
import sys

import jax
import ml_dtypes
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P

from tensorlist.orbax import TensorListCheckpointHandler, TensorListRestore, TensorListSave

#: Seconds a process waits for the others to join (the test kills everything at its own timeout).
JOIN_TIMEOUT = 60

#: The step the test saves.
STEP = 1


def tree_values():
    """The host values of the tree every process saves (deterministic: each process rebuilds the same)."""
    rng = np.random.default_rng(0)
    return {"params": {"kernel": rng.standard_normal((8, 16)).astype(np.float32),
                       "table": rng.standard_normal((4, 8)).astype(ml_dtypes.bfloat16)},
            "opt": (np.array(7, np.int32), None)}


def assert_same(arr, expected):
    """``arr`` (a jax or numpy array) has ``expected``'s dtype, shape and bytes."""
    got = np.asarray(arr)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()


def main(mode: str, pid: int, n: int, port: int, root: str) -> None:
    assert mode == "save"
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=pid,
                               initialization_timeout=JOIN_TIMEOUT)
    host = tree_values()
    mesh = jax.make_mesh((n, 2), ("x", "y"))
    place = lambda v: jax.make_array_from_callback(  # noqa: E731
        v.shape, NamedSharding(mesh, P("x", "y") if v.ndim == 2 else P()), lambda idx: v[idx])
    tree = jax.tree_util.tree_map(place, host)
    assert not tree["params"]["kernel"].is_fully_addressable
    with ocp.CheckpointManager(root, item_handlers=TensorListCheckpointHandler()) as mngr:
        mngr.save(STEP, args=TensorListSave(tree, metadata={"step": STEP}))
        mngr.wait_until_finished()
        assert mngr.latest_step() == STEP
        abstract = mngr.item_metadata(STEP)
        firsts = [d for d in jax.devices() if d.id == min(e.id for e in jax.devices()
                                                           if e.process_index == d.process_index)]
        rows = jax.make_mesh((n,), ("x",), devices=firsts)  # one device in each process
        target = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=NamedSharding(rows, P("x") if a.ndim else P())),
            abstract)
        back = mngr.restore(STEP, args=TensorListRestore(target))
    for got, want, t in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(host),
                            jax.tree_util.tree_leaves(target)):
        assert got.sharding == t.sharding and len(got.addressable_shards) == 1
        for shard in got.addressable_shards:
            assert_same(shard.data, want[shard.index])
    assert back["opt"][1] is None
    jax.distributed.shutdown()
    print(f"process {pid}: restored on {n}")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
