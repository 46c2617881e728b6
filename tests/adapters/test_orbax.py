"""tensorlist.orbax: pytrees saved and restored as tensorlist files through Orbax's own API.

Orbax's ``Checkpointer`` and ``CheckpointManager`` (steps, ``latest_step``, restore of step N, single and
composite items), bfloat16 leaves bit for bit, a restore onto a target sharding, the v1 API's handler
registry, and the handler's refusals.
"""
import collections
import os

import numpy as np
import pytest

pytest.importorskip("jax", reason="the Orbax adapter needs jax (pip install 'tensorlist[jax]')")
ocp = pytest.importorskip("orbax.checkpoint",
                          reason="the Orbax adapter needs orbax-checkpoint (pip install orbax-checkpoint)")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding  # noqa: E402

import tensorlist  # noqa: E402
import tensorlist.dcp  # noqa: E402,F401 (tensorlist.dcp.validate_checkpoint below)
from tensorlist.orbax import (  # noqa: E402
    SHARDED_DIR,
    TREE_FILE,
    TensorListCheckpointHandler,
    TensorListHandler,
    TensorListRestore,
    TensorListSave,
)


#: Seconds the two-process test waits for its processes (then kills them and fails).
TWO_PROCESS_TIMEOUT = 180

Pair = collections.namedtuple("Pair", ["mu", "nu"])  # at module level: a restore finds the class again


def params(seed: int = 0):
    """A small model's parameters: a dict of dicts, float32 and bfloat16 leaves."""
    rng = np.random.default_rng(seed)
    return {
        "dense": {"kernel": jnp.asarray(rng.standard_normal((8, 4), dtype=np.float32)),
                  "bias": jnp.asarray(rng.standard_normal(4, dtype=np.float32))},
        "embed": {"table": jnp.asarray(rng.standard_normal((16, 8), dtype=np.float32)).astype(jnp.bfloat16)},
        "scale": jnp.asarray(np.float32(seed + 0.5)),
    }


def assert_bit_equal(got, want):
    """Same tree, and every leaf the same dtype, shape and bytes."""
    assert jax.tree_util.tree_structure(got) == jax.tree_util.tree_structure(want)
    for g, w in zip(jax.tree_util.tree_leaves(got), jax.tree_util.tree_leaves(want)):
        assert isinstance(g, jax.Array)
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_array_equal(np.asarray(g).reshape(-1).view(np.uint8), np.asarray(w).reshape(-1).view(np.uint8))


def test_checkpointer_round_trip_is_bit_equal_and_a_tensorlist_file(tmp_path):
    tree = params()
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "ckpt", args=TensorListSave(tree, metadata={"step": 7}))
        back = ckptr.restore(tmp_path / "ckpt", args=TensorListRestore())
    assert_bit_equal(back, tree)
    assert back["embed"]["table"].dtype == jnp.bfloat16
    # the item is an ordinary tensorlist file: the numpy reader opens it
    with tensorlist.open(tmp_path / "ckpt" / TREE_FILE) as r:
        assert len(r.keys()) == 4


def test_restore_without_args_restores_the_saved_tree(tmp_path):
    tree = params(1)
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "c", args=TensorListSave(tree))
        assert_bit_equal(ckptr.restore(tmp_path / "c"), tree)


def test_checkpoint_manager_steps_latest_and_restore_of_step_n(tmp_path):
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(tmp_path / "run", options=options,
                               item_handlers=TensorListCheckpointHandler()) as mngr:
        for step in range(3):
            mngr.save(step, args=TensorListSave(params(step)))
        mngr.wait_until_finished()
        assert mngr.latest_step() == 2
        assert list(mngr.all_steps()) == [1, 2]  # max_to_keep dropped step 0
        assert_bit_equal(mngr.restore(1, args=TensorListRestore()), params(1))
        assert_bit_equal(mngr.restore(mngr.latest_step(), args=TensorListRestore()), params(2))
    # a fresh manager over the same directory finds the steps and restores them
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=TensorListCheckpointHandler()) as mngr:
        assert mngr.latest_step() == 2
        assert_bit_equal(mngr.restore(2, args=TensorListRestore()), params(2))
        assert_bit_equal(mngr.restore(None), params(2))  # no step, no args: the latest, as saved


def test_checkpoint_manager_composite_items(tmp_path):
    """Two items in one step, each with its own handler (``ocp.args.Composite``)."""
    handlers = {"params": TensorListCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=handlers) as mngr:
        mngr.save(5, args=ocp.args.Composite(params=TensorListSave(params(5)),
                                             meta=ocp.args.JsonSave({"lr": 0.1})))
        mngr.wait_until_finished()
        back = mngr.restore(5, args=ocp.args.Composite(params=TensorListRestore(),
                                                       meta=ocp.args.JsonRestore()))
    assert_bit_equal(back["params"], params(5))
    assert back["meta"] == {"lr": 0.1}
    assert (tmp_path / "run" / "5" / "params" / TREE_FILE).exists()


def test_restore_onto_a_target_sharding(tmp_path):
    devices = jax.devices()
    if len(devices) < 2:
        pytest.skip("needs 2 devices: tests/conftest.py sets XLA_FLAGS=--xla_force_host_platform_device_count=4 "
                    "before jax is imported; here jax was imported earlier with one device")
    tree = params(3)
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "c", args=TensorListSave(tree))
        mesh = Mesh(np.array(devices[:2]), ("x",))
        rows = NamedSharding(mesh, PartitionSpec("x"))
        replicated = NamedSharding(mesh, PartitionSpec())
        target = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=rows if x.ndim else replicated), tree)
        back = ckptr.restore(tmp_path / "c", args=TensorListRestore(target))
    assert_bit_equal(back, tree)
    kernel = back["dense"]["kernel"]
    assert kernel.sharding == rows
    assert [s.data.shape for s in kernel.addressable_shards] == [(4, 4), (4, 4)]
    assert back["embed"]["table"].sharding == rows


def test_restore_onto_one_sharding_or_one_device(tmp_path):
    tree = params(4)
    device = jax.devices()[-1]
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "c", args=TensorListSave(tree))
        on_sharding = ckptr.restore(tmp_path / "c", args=TensorListRestore(sharding=SingleDeviceSharding(device)))
        on_device = ckptr.restore(tmp_path / "c", args=TensorListRestore(device=device))
    for back in (on_sharding, on_device):
        assert_bit_equal(back, tree)
        assert all(leaf.devices() == {device} for leaf in jax.tree_util.tree_leaves(back))


def test_v1_api_handler_through_a_local_registry(tmp_path):
    v1 = pytest.importorskip("orbax.checkpoint.experimental.v1", reason="Orbax's v1 API (orbax-checkpoint 0.11+)")
    registry = v1.handlers.local_registry()
    registry.add(TensorListHandler, checkpointable_name="params")
    ctx = v1.Context()
    ctx.checkpointables.registry = registry
    tree = params(6)
    with ctx:
        v1.save_checkpointables(tmp_path / "c", {"params": tree})
        back = v1.load_checkpointables(tmp_path / "c")
        abstract = jax.tree_util.tree_map(
            lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=SingleDeviceSharding(jax.devices()[0])), tree)
        targeted = v1.load_checkpointables(tmp_path / "c", {"params": abstract})
        saved = v1.checkpointables_metadata(tmp_path / "c").metadata["params"]
    assert_bit_equal(back["params"], tree)
    assert_bit_equal(targeted["params"], tree)
    assert (tmp_path / "c" / "params" / TREE_FILE).exists()
    assert saved["embed"]["table"] == jax.ShapeDtypeStruct((16, 8), jnp.bfloat16)


class TestRefusals:
    def test_restore_of_a_directory_without_an_item(self, tmp_path):
        with pytest.raises(FileNotFoundError, match=f"neither {TREE_FILE} nor {SHARDED_DIR}/"):
            TensorListCheckpointHandler().restore(tmp_path, args=TensorListRestore())

    def test_save_needs_tensorlist_save_args(self, tmp_path):
        with pytest.raises(TypeError, match=r"needs args=TensorListSave\(\.\.\.\), got StandardSave"):
            TensorListCheckpointHandler().save(tmp_path, args=ocp.args.StandardSave(params()))

    def test_item_and_sharding_together(self, tmp_path):
        TensorListCheckpointHandler().save(tmp_path, args=TensorListSave(params()))
        with pytest.raises(ValueError, match="item= .* or sharding= .*not both"):
            TensorListCheckpointHandler().restore(
                tmp_path, args=TensorListRestore(item=params(), sharding=SingleDeviceSharding(jax.devices()[0])))

    def test_unexpected_arguments(self, tmp_path):
        with pytest.raises(TypeError, match=r"takes only args=TensorListSave\(\.\.\.\); got also .*'item'"):
            TensorListCheckpointHandler().save(tmp_path, args=TensorListSave(params()), item=params())


def test_item_metadata_is_the_abstract_tree(tmp_path):
    """``item_metadata`` reads the descriptor only: the saved tree with a ShapeDtypeStruct at each leaf."""
    tree = params(8)
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=TensorListCheckpointHandler()) as mngr:
        mngr.save(0, args=TensorListSave(tree))
        mngr.wait_until_finished()
        abstract = mngr.item_metadata(0)
        assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(tree)
        for a, x in zip(jax.tree_util.tree_leaves(abstract), jax.tree_util.tree_leaves(tree)):
            assert isinstance(a, jax.ShapeDtypeStruct) and (a.shape, a.dtype) == (x.shape, x.dtype)
        # with shardings added, it is a restore target
        device = jax.devices()[0]
        target = jax.tree_util.tree_map(
            lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=SingleDeviceSharding(device)), abstract)
        assert_bit_equal(mngr.restore(0, args=TensorListRestore(target)), tree)
    assert TensorListCheckpointHandler().metadata(tmp_path) is None  # no item here


def _mapped_file(address: int):
    """The file whose mapping holds ``address`` in this process (Linux's /proc/self/maps), or None."""
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            lo, hi = (int(x, 16) for x in fields[0].split("-"))
            if lo <= address < hi:
                return fields[5].strip() if len(fields) == 6 else None
    return None


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="reads the process's mappings from Linux's /proc")
def test_restore_on_cpu_aliases_the_mapped_file(tmp_path):
    """Restored leaves are views of the item's data file (zero-copy), bfloat16 included."""
    tree = params(9)
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "c", args=TensorListSave(tree))
        back = ckptr.restore(tmp_path / "c", args=TensorListRestore())
    data_files = {str(p) for p in (tmp_path / "c").iterdir() if p.name.endswith(".data")}
    for leaf in (back["dense"]["kernel"], back["embed"]["table"]):
        assert _mapped_file(leaf.addressable_data(0).unsafe_buffer_pointer()) in data_files


def test_verify_finds_a_corrupted_item(tmp_path):
    with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "c", args=TensorListSave(params()))
    [data] = [p for p in (tmp_path / "c").iterdir() if p.name.endswith(".data")]
    raw = bytearray(data.read_bytes())
    raw[0] ^= 0xFF
    data.write_bytes(bytes(raw))
    with pytest.raises(tensorlist.ChecksumError, match="CRC32C"):
        TensorListCheckpointHandler().restore(tmp_path / "c", args=TensorListRestore(verify=True))


def test_async_save_copies_the_leaves_before_it_returns(tmp_path):
    """CheckpointManager saves asynchronously: leaves changed right after save() returns are saved unchanged."""
    tree = {"w": np.arange(1 << 16, dtype=np.float32), "b": jnp.ones(4, jnp.bfloat16)}
    want = {"w": tree["w"].copy(), "b": tree["b"]}
    options = ocp.CheckpointManagerOptions(enable_async_checkpointing=True)
    with ocp.CheckpointManager(tmp_path / "run", options=options,
                               item_handlers=TensorListCheckpointHandler()) as mngr:
        mngr.save(0, args=TensorListSave(tree))
        tree["w"][:] = -1.0  # the training step reusing its buffers
        mngr.wait_until_finished()
        back = mngr.restore(0, args=TensorListRestore())
    np.testing.assert_array_equal(np.asarray(back["w"]), want["w"])
    assert_bit_equal({"b": back["b"]}, {"b": want["b"]})


def test_tree_kinds_survive_an_async_save(tmp_path):
    """Tuples, lists, None leaves and namedtuples come back as what they were, through the host copy too."""
    tree = {"opt": (Pair(jnp.zeros(3), jnp.ones(3)), [jnp.arange(2.0), None]), "count": jnp.asarray(7)}
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=TensorListCheckpointHandler()) as mngr:
        mngr.save(1, args=TensorListSave(tree))
        mngr.wait_until_finished()
        back = mngr.restore(1, args=TensorListRestore())
    assert type(back["opt"]) is tuple and type(back["opt"][1]) is list and back["opt"][1][1] is None
    assert type(back["opt"][0]) is Pair  # found again by its qualified name
    assert_bit_equal(back, tree)


def test_a_target_that_disagrees_with_the_file_names_the_leaf(tmp_path):
    tree = params()
    TensorListCheckpointHandler().save(tmp_path, args=TensorListSave(tree))
    target = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), tree)
    target["dense"]["kernel"] = jax.ShapeDtypeStruct((4, 8), jnp.float32)
    with pytest.raises(tensorlist.FormatError, match="dense/kernel"):
        TensorListCheckpointHandler().restore(tmp_path, args=TensorListRestore(target))


def test_a_flax_train_state_through_the_manager_with_orbax_s_item_semantics(tmp_path):
    """The most common Flax checkpoint: a TrainState (step an int, adam's state, a PRNG key beside it) restored
    into an abstract TrainState; a None in the item leaves that part out; a target dtype casts (as Orbax's)."""
    optax = pytest.importorskip("optax", reason="a TrainState needs an optax optimizer")
    train_state = pytest.importorskip("flax.training.train_state", reason="needs flax")

    def create(seed):
        return {"state": train_state.TrainState.create(apply_fn=None, params=params(seed), tx=optax.adam(1e-3)),
                "rng": jax.random.key(seed), "epoch": seed}

    item = create(3)
    item["state"] = item["state"].replace(step=120)
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=TensorListCheckpointHandler()) as mngr:
        mngr.save(120, args=TensorListSave(item))
        mngr.wait_until_finished()
        abstract = jax.eval_shape(lambda: create(0))
        back = mngr.restore(120, args=TensorListRestore(abstract))
        assert type(back["state"]) is train_state.TrainState and back["state"].tx is abstract["state"].tx
        assert back["state"].step == 120 and back["epoch"] == 3
        assert (jax.random.key_data(back["rng"]) == jax.random.key_data(item["rng"])).all()
        assert_bit_equal(back["state"].params, item["state"].params)
        assert_bit_equal(back["state"].opt_state, item["state"].opt_state)
        metadata = mngr.item_metadata(120)
        assert metadata["epoch"] == 3 and metadata["rng"].dtype == item["rng"].dtype
        assert set(metadata["state"]) == {"step", "params", "opt_state"}  # no target type: a dict, as Orbax's
        partial = mngr.restore(120, args=TensorListRestore({**abstract, "state": abstract["state"].replace(
            opt_state=None), "rng": None}))
        assert partial["rng"] is None and partial["state"].opt_state is None and partial["state"].step == 120
        bf16 = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16), abstract["state"].params)
        cast = mngr.restore(120, args=TensorListRestore({**abstract, "state": abstract["state"].replace(params=bf16)}))
        assert all(x.dtype == jnp.bfloat16 for x in jax.tree_util.tree_leaves(cast["state"].params))


# --- sharded items: the tree/ directory ------------------------------------------------------

def _four_devices():
    if len(jax.devices()) < 4:
        pytest.skip("needs 4 devices: tests/conftest.py sets XLA_FLAGS=--xla_force_host_platform_device_count=4 "
                    "before jax is imported; here jax was imported earlier with fewer")
    return jax.devices()[:4]


def _placed(tree, sharding):
    """``tree``'s 2-D leaves on ``sharding``, the others replicated on its mesh."""
    replicated = NamedSharding(sharding.mesh, PartitionSpec())
    return jax.tree_util.tree_map(lambda x: jax.device_put(x, sharding if x.ndim == 2 else replicated), tree)


def test_a_sharded_item_through_the_manager_restores_onto_another_sharding(tmp_path):
    """``TensorListSave(sharded=True)`` on a 2x2 mesh: a ``tree/`` checkpoint, its metadata, a 4x1 restore."""
    devices = _four_devices()
    grid = NamedSharding(Mesh(np.array(devices).reshape(2, 2), ("x", "y")), PartitionSpec("x", "y"))
    tree = _placed({**params(9), "opt": (jnp.arange(6, dtype=jnp.int32), None)}, grid)
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=TensorListCheckpointHandler()) as mngr:
        mngr.save(0, args=TensorListSave(tree, metadata={"lr": 0.5}, sharded=True))
        mngr.wait_until_finished()
        item = tmp_path / "run" / "0" / "default"
        assert SHARDED_DIR in os.listdir(item) and TREE_FILE not in os.listdir(item)
        ckpt = tensorlist.dcp.validate_checkpoint(item / SHARDED_DIR, verify=True)
        assert [len(ckpt.tensors[n].chunks) for n in ("dense/kernel", "embed/table", "scale")] == [4, 4, 1]
        assert ckpt.tree["metadata"] == {"lr": 0.5}
        abstract = mngr.item_metadata(0)
        assert jax.tree_util.tree_structure(abstract) == jax.tree_util.tree_structure(tree)
        for a, x in zip(jax.tree_util.tree_leaves(abstract), jax.tree_util.tree_leaves(tree)):
            assert isinstance(a, jax.ShapeDtypeStruct) and (a.shape, a.dtype) == (x.shape, x.dtype)
        line = Mesh(np.array(devices), ("x",))
        rows = NamedSharding(line, PartitionSpec("x"))
        target = jax.tree_util.tree_map(lambda a: jax.ShapeDtypeStruct(
            a.shape, a.dtype, sharding=rows if len(a.shape) == 2 else NamedSharding(line, PartitionSpec())), abstract)
        back = mngr.restore(0, args=TensorListRestore(target))
    assert_bit_equal(back, tree)
    assert back["opt"][1] is None and isinstance(back["opt"], tuple)
    kernel = back["dense"]["kernel"]
    assert kernel.sharding == rows and [s.data.shape for s in kernel.addressable_shards] == [(2, 4)] * 4


def test_an_async_sharded_save_is_written_before_it_returns(tmp_path):
    """A sharded save is collective, so ``async_save`` writes it in the caller's thread: later changes miss it."""
    tree = {"w": jnp.arange(8.0).reshape(4, 2)}
    with ocp.AsyncCheckpointer(TensorListCheckpointHandler()) as ckptr:
        ckptr.save(tmp_path / "c", args=TensorListSave(tree, sharded=True))
        tree["w"] = tree["w"] + 1  # a new array; the saved one stays
        ckptr.wait_until_finished()
        back = ckptr.restore(tmp_path / "c", args=TensorListRestore())
    assert back["w"].tolist() == np.arange(8.0).reshape(4, 2).tolist()
    assert (tmp_path / "c" / SHARDED_DIR).is_dir()


def test_sharded_items_in_a_composite_step(tmp_path):
    """With other items beside it (Orbax creates each item's directory, signalling it), over several steps."""
    handlers = {"params": TensorListCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}
    options = ocp.CheckpointManagerOptions(max_to_keep=2)
    with ocp.CheckpointManager(tmp_path / "run", options=options, item_handlers=handlers) as mngr:
        for step in range(3):
            mngr.save(step, args=ocp.args.Composite(params=TensorListSave({"w": jnp.arange(8.0) + step}, sharded=True),
                                                    meta=ocp.args.JsonSave({"step": step})))
        mngr.wait_until_finished()
        assert mngr.all_steps() == [1, 2]
        back = mngr.restore(2, args=ocp.args.Composite(params=TensorListRestore(), meta=ocp.args.JsonRestore()))
        assert mngr.item_metadata(2)["params"]["w"].shape == (8,)
    assert back["params"]["w"].tolist() == (np.arange(8.0) + 2).tolist() and back["meta"] == {"step": 2}
    assert (tmp_path / "run" / "2" / "params" / SHARDED_DIR).is_dir()


def test_sharded_false_refuses_a_leaf_spanning_processes(tmp_path, monkeypatch):
    """``sharded=False`` asks for one file, which cannot hold a leaf sharded across processes."""
    import tensorlist.orbax as tlo

    monkeypatch.setattr(tlo, "_is_sharded_across_processes", lambda tree: True)  # as in a multi-process run
    with pytest.raises(ValueError, match=r"TensorListSave\(sharded=False\), but a leaf .* sharded across"):
        TensorListCheckpointHandler().save(tmp_path, args=TensorListSave(params(), sharded=False))
    assert os.listdir(tmp_path) == []


def test_the_metadata_of_a_sharded_item_without_a_tree_is_none(tmp_path):
    """A ``tree/`` checkpoint whose metadata holds no tree header (written by another tool) has no abstract tree."""
    from tensorlist.dcp.jax_shards import save_dir

    save_dir(tmp_path / SHARDED_DIR, {"w": jnp.ones(4)}, None)
    assert TensorListCheckpointHandler().metadata(tmp_path) is None


@pytest.mark.slow  # 2 processes importing jax and orbax, joined by jax.distributed over gloo
def test_two_processes_save_and_restore_through_the_checkpoint_manager(tmp_path, unused_port):
    """Each process saves its shards through Orbax's CheckpointManager, both restore on a 2-device mesh; here too."""
    import subprocess
    import sys

    from _paths import SUPPORT as here

    sys.path.insert(0, here)
    from _orbax_script import STEP, assert_same, tree_values

    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [subprocess.Popen([sys.executable, os.path.join(here, "_orbax_script.py"), "save", str(i), "2",
                               str(unused_port), str(tmp_path / "run")], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for i in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=TWO_PROCESS_TIMEOUT)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the two processes did not finish in {TWO_PROCESS_TIMEOUT} s")
    for i, (p, out) in enumerate(zip(procs, outs)):
        assert p.returncode == 0 and f"process {i}: restored on 2" in out, out[-3000:]
    item = tmp_path / "run" / str(STEP) / "default" / SHARDED_DIR
    assert sorted(n.split(".")[0] for n in os.listdir(item) if n.endswith(".tl")) == ["0", "1"]
    with ocp.CheckpointManager(tmp_path / "run", item_handlers=TensorListCheckpointHandler()) as mngr:
        back = mngr.restore(STEP, args=TensorListRestore())  # here: one process, whole on the default device
    for got, want in zip(jax.tree_util.tree_leaves(back), jax.tree_util.tree_leaves(tree_values())):
        assert_same(got, want)
    assert back["opt"][1] is None
