"""One process of tests/adapters/test_jax_shards.py's multi-process test: python _jax_shard_script.py MODE ID N PORT ROOT.

MODE ``save``: process ID of N (jax.distributed on 127.0.0.1:PORT, gloo CPU collectives, 2 CPU devices
each from XLA_FLAGS) saves the test's arrays as a tree with ``tensorlist.jax.save(sharded=True)``,
sharded over all 2N devices (one leaf a process-local array); ``savefail``: the same, but process 1's
shard write raises; ``load2``: the N processes load them with ``tensorlist.jax.load`` on a mesh of one
device per process, check each local shard and count the bytes read; ``load1``: one plain process
loads them whole on its one device. Prints "loaded on K" when every value matched bit for bit. The
test module imports ``values``, ``HEADER``, ``USER_METADATA`` and ``assert_same`` from here.
"""
import os
import sys

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import tensorlist.jax as tlj
from tensorlist.dcp import jax_shards as _jax_shards
from tensorlist.dcp.jax_shards import open_dir

#: The tree header every save of the tests stores.
HEADER = {"format": "tensorlist.jax-tree/1", "tree": {"kind": "leaf", "name": "w"}, "metadata": {"step": 3}}

#: The user metadata the multi-process save stores.
USER_METADATA = {"step": 3}
#: The leaf the multi-process save passes as a process-local array (each process its own copy).
LOCAL = "local"
#: Seconds a process waits for the others to join (the test kills everything at its own timeout).
JOIN_TIMEOUT = 60


def values():
    """The global arrays every test saves (deterministic: each process rebuilds the same ones)."""
    rng = np.random.default_rng(0)
    return {"params/dense/kernel": rng.standard_normal((8, 16)).astype(np.float32),
            "params/dense/bias": rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16),
            "params/f8": rng.standard_normal((8, 4)).astype(ml_dtypes.float8_e4m3fn),
            "step": np.array(7, np.int32),
            "empty": np.zeros((0, 4), np.float32),
            LOCAL: np.arange(32, dtype=np.float32).reshape(4, 8)}


def assert_same(arr, expected):
    """``arr`` (a jax or numpy array) has ``expected``'s dtype, shape and bytes (NaN payloads included)."""
    got = np.asarray(arr)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()


def nest(flat):
    """The pytree whose leaves' names (tensorlist.jax's '/'-joined key paths) are ``flat``'s keys."""
    tree = {}
    for name, v in flat.items():
        *head, last = name.split("/")
        node = tree
        for k in head:
            node = node.setdefault(k, {})
        node[last] = v
    return tree


def main(mode: str, pid: int, n: int, port: int, root: str) -> None:
    if mode != "load1":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=pid,
                                   initialization_timeout=JOIN_TIMEOUT)
    arrays = values()
    split = lambda v: v.ndim == 2 and v.size  # noqa: E731 (0-d and empty arrays are replicated)
    if mode == "savefail" and pid == 1:  # this process's shard write fails: both processes must raise
        def fail(*args, **kwargs):
            raise OSError("injected")
        _jax_shards.save = fail
    if mode in ("save", "savefail"):
        assert jax.device_count() == 2 * n and jax.local_device_count() == 2
        mesh = jax.make_mesh((n, 2), ("x", "y"))  # rows split across processes, columns across local devices
        flat = {}
        for k, v in arrays.items():
            if k == LOCAL:  # each process's own copy on its own default device
                flat[k] = jax.device_put(v)
                continue
            s = NamedSharding(mesh, P("x", "y") if split(v) else P())
            flat[k] = jax.make_array_from_callback(v.shape, s, lambda idx, v=v: v[idx])
        assert not flat["params/dense/kernel"].is_fully_addressable and flat[LOCAL].is_fully_addressable
        tlj.save(root, nest(flat), metadata=USER_METADATA, sharded=True)
    elif mode == "load2":
        firsts = [d for d in jax.devices() if d.id == min(e.id for e in jax.devices()
                                                           if e.process_index == d.process_index)]
        mesh = jax.make_mesh((n,), ("x",), devices=firsts)  # one device in each process
        shardings = {k: NamedSharding(mesh, P("x") if split(v) else P()) for k, v in arrays.items()}
        tree = tlj.load(root, sharding=nest(shardings))
        for k, v in arrays.items():
            *head, last = k.split("/")
            node = tree
            for h in head:
                node = node[h]
            arr = node[last]
            assert arr.sharding == shardings[k] and len(arr.addressable_shards) == 1
            for shard in arr.addressable_shards:
                assert_same(shard.data, v[shard.index])
        with open_dir(root) as c:  # the bytes one process reads: its own half (and the replicated scalar)
            for k, s in shardings.items():
                c.load(k, s)
            needed = sum(v.nbytes // (n if split(v) else 1) for v in arrays.values())
            print(f"process {pid}: bytes needed {needed} of {sum(v.nbytes for v in arrays.values())}, "
                  f"viewed {c.bytes_viewed}, copied {c.bytes_copied}")
            assert c.bytes_viewed + c.bytes_copied == needed
    else:
        assert jax.device_count() == 2
        tree = tlj.load(root)
        for k, v in arrays.items():
            *head, last = k.split("/")
            node = tree
            for h in head:
                node = node[h]
            assert_same(node[last], v)
            assert node[last].devices() == {jax.devices()[0]}
        n = 1
    if mode != "load1":
        jax.distributed.shutdown()
    print(f"process {pid}: loaded on {n}" if mode != "save" else f"process {pid}: saved")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
