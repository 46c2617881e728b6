"""One process of tests/test_jax_shards.py's multi-process test: python _jax_shard_script.py MODE ID N PORT ROOT.

MODE ``save``: process ID of N (jax.distributed on 127.0.0.1:PORT, gloo CPU collectives, 2 CPU devices
each from XLA_FLAGS) saves the test's arrays sharded over all 2N devices; ``load2``: the N processes load
them on a mesh of one device per process and check each local shard; ``load1``: one plain process
loads them whole on its one device. Prints "loaded on K" when every value matched bit for bit.
"""
import os
import sys

import jax
import ml_dtypes
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from tensorlist._jax_shards import open_dir, save_dir

#: The tree header every save of the tests stores.
HEADER = {"format": "tensorlist.jax-tree/1", "tree": {"kind": "leaf", "name": "w"}, "metadata": {"step": 3}}

#: Seconds a process waits for the others to join (the test kills everything at its own timeout).
JOIN_TIMEOUT = 60


def values():
    """The global arrays every test saves (deterministic: each process rebuilds the same ones)."""
    rng = np.random.default_rng(0)
    return {"params/dense/kernel": rng.standard_normal((8, 16)).astype(np.float32),
            "params/dense/bias": rng.standard_normal((8, 4)).astype(ml_dtypes.bfloat16),
            "params/f8": rng.standard_normal((8, 4)).astype(ml_dtypes.float8_e4m3fn),
            "step": np.array(7, np.int32),
            "empty": np.zeros((0, 4), np.float32)}


def assert_same(arr, expected):
    """``arr`` (a jax or numpy array) has ``expected``'s dtype, shape and bytes (NaN payloads included)."""
    got = np.asarray(arr)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == np.ascontiguousarray(expected).tobytes()


def main(mode: str, pid: int, n: int, port: int, root: str) -> None:
    if mode != "load1":
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=n, process_id=pid,
                                   initialization_timeout=JOIN_TIMEOUT)
    arrays = values()
    if mode == "save":
        assert jax.device_count() == 2 * n and jax.local_device_count() == 2
        mesh = jax.make_mesh((n, 2), ("x", "y"))  # rows split across processes, columns across local devices
        tree = {}
        for k, v in arrays.items():
            s = NamedSharding(mesh, P("x", "y") if v.ndim == 2 and v.size else P())
            tree[k] = jax.make_array_from_callback(v.shape, s, lambda idx, v=v: v[idx])
        assert not tree["params/dense/kernel"].is_fully_addressable
        save_dir(root, tree, HEADER)
    elif mode == "load2":
        mesh = jax.make_mesh((n,), ("x",), devices=[d for d in jax.devices() if d.id == min(
            e.id for e in jax.devices() if e.process_index == d.process_index)])
        with open_dir(root) as c:
            for k, v in arrays.items():
                s = NamedSharding(mesh, P("x") if v.ndim == 2 and v.size else P())
                arr = c.load(k, s)
                assert len(arr.addressable_shards) == 1
                for shard in arr.addressable_shards:
                    assert_same(shard.data, v[shard.index])
            needed = sum(v.nbytes // (n if v.ndim == 2 else 1) for v in arrays.values())
            print(f"process {pid}: bytes needed {needed}, viewed {c.bytes_viewed}, copied {c.bytes_copied}")
            assert c.bytes_viewed + c.bytes_copied == needed
    else:
        assert jax.device_count() == 2
        with open_dir(root) as c:
            for k, v in arrays.items():
                assert_same(c.load(k, jax.devices()[0]), v)
        n = 1
    if mode != "load1":
        jax.distributed.shutdown()
    print(f"process {pid}: loaded on {n}" if mode != "save" else f"process {pid}: saved")


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
