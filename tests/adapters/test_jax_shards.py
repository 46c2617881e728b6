"""Sharded jax.Arrays saved in the DCP layout and loaded onto other meshes (tensorlist.dcp.jax_shards).

In this process: 4 forced CPU devices (tests/conftest.py sets XLA_FLAGS before jax is imported), saves on
2x2 and 4x1 meshes (replicated axes included), loads on 2 devices, on 1 and with another partitioning,
values compared bit for bit, zero-copy checked by buffer pointers. The slow test runs 2 real processes
(jax.distributed on 127.0.0.1, gloo CPU collectives, 2 devices each) through tests/support/_jax_shard_script.py.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

jax = pytest.importorskip("jax", reason="sharded saves need jax (pip install 'jax[cpu]')")
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

import tensorlist as tl
from tensorlist import dcp as dcp_read
from tensorlist.dcp.jax_shards import open_dir, plan_chunks, save_dir
from tensorlist.errors import FormatError

from _jax_shard_script import HEADER, USER_METADATA, assert_same, values
from _paths import SUPPORT  # noqa: E402

HERE = SUPPORT
if len(jax.devices()) < 4:  # jax was imported before tests/conftest.py could set XLA_FLAGS
    pytest.skip(f"needs 4 CPU devices, jax has {len(jax.devices())}: set XLA_FLAGS="
                "--xla_force_host_platform_device_count=4 before jax is first imported", allow_module_level=True)


def mesh(shape):
    return jax.make_mesh(shape, ("x", "y"), devices=jax.devices()[:shape[0] * shape[1]])


def sharded(arrays, sharding):
    """Each array on ``sharding`` (0-d and empty ones fully replicated: nothing to split)."""
    out = {}
    for k, v in arrays.items():
        s = sharding if v.ndim == 2 and v.size else NamedSharding(sharding.mesh, P())
        out[k] = jax.make_array_from_callback(v.shape, s, lambda idx, v=v: v[idx])
    return out


# (id, mesh shape, partition spec of the 2-d arrays, distinct chunks of an (8, 16) array)
LAYOUTS = [
    ("2x2 both axes", (2, 2), P("x", "y"), 4),
    ("2x2 rows, y replicated", (2, 2), P("x", None), 2),
    ("2x2 columns, x replicated", (2, 2), P(None, "y"), 2),
    ("2x2 replicated", (2, 2), P(), 1),
    ("4x1 rows", (4, 1), P("x", None), 4),
    ("4x1 columns over y of size 1", (4, 1), P("y", "x"), 4),
]


@pytest.fixture(scope="module", params=LAYOUTS, ids=[c[0] for c in LAYOUTS])
def saved(request, tmp_path_factory):
    _, shape, spec, n = request.param
    path = tmp_path_factory.mktemp("ckpt")
    save_dir(path, sharded(values(), NamedSharding(mesh(shape), spec)), HEADER)
    return path, n


def test_the_plan_has_one_chunk_per_distinct_index_written_from_the_first_device(saved):
    path, n = saved
    with open_dir(path) as c:
        assert len(c.chunks("params/dense/kernel")) == n
        assert len(c.chunks("step")) == 1 and c.chunks("empty") == [((0, 0), (0, 4))]
    kernel = jax.device_put(values()["params/dense/kernel"], NamedSharding(mesh((2, 2)), P("x", None)))
    _, shape, chunks = plan_chunks("k", kernel)
    assert shape == (8, 16) and [(c.offsets, c.device.id) for c in chunks] == [((0, 0), 0), ((4, 0), 2)]


def test_the_checkpoint_is_a_dcp_checkpoint_that_dcp_read_accepts(saved):
    path, _ = saved
    ckpt = dcp_read.validate_checkpoint(path, verify=True, schema=True)
    assert ckpt.tree == HEADER and list(ckpt.tensors) == list(values())
    full = dcp_read.read_full(path, verify=True)
    for k, v in values().items():
        assert_same(full[k], v)


def test_open_dir_gives_the_header_names_shapes_and_dtypes(saved):
    path, _ = saved
    with open_dir(path) as c:
        assert c.header == HEADER and c.names() == list(values())
        for k, v in values().items():
            assert c.shape(k) == v.shape and c.dtype(k) == v.dtype


TARGETS = [
    ("default device", lambda: None),
    ("one device", lambda: jax.devices()[3]),
    ("2 devices rows", lambda: NamedSharding(mesh((2, 1)), P("x", None))),
    ("2 devices columns", lambda: NamedSharding(mesh((1, 2)), P(None, "y"))),
    ("4 devices columns", lambda: NamedSharding(mesh((1, 4)), P(None, "y"))),
    ("4 devices transposed 2x2", lambda: NamedSharding(mesh((2, 2)), P("y", "x"))),
    ("4 devices replicated", lambda: NamedSharding(mesh((2, 2)), P())),
]


@pytest.mark.parametrize("target", [t[1] for t in TARGETS], ids=[t[0] for t in TARGETS])
def test_every_layout_loads_onto_every_target_bit_for_bit(saved, target):
    path, _ = saved
    t = target()
    with open_dir(path) as c:
        for k, v in values().items():
            want = t if v.ndim == 2 and v.size or not isinstance(t, NamedSharding) else NamedSharding(t.mesh, P())
            arr = c.load(k, want)
            assert_same(arr, v)
            if isinstance(want, NamedSharding):
                assert arr.sharding == want
                for shard in arr.addressable_shards:
                    assert_same(shard.data, v[shard.index])
            else:
                assert arr.devices() == {want or jax.devices()[0]}


def test_a_shape_dtype_struct_gives_its_sharding_and_is_checked(saved):
    path, _ = saved
    v = values()["params/dense/kernel"]
    s = NamedSharding(mesh((2, 1)), P("x", None))
    with open_dir(path) as c:
        arr = c.load("params/dense/kernel", jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=s))
        assert arr.sharding == s
        assert_same(arr, v)
        for bad in (jax.ShapeDtypeStruct((8, 8), v.dtype, sharding=s), jax.ShapeDtypeStruct(v.shape, jnp.float16)):
            with pytest.raises(FormatError, match=r"'params/dense/kernel' is saved as float32\[8, 16\]; the target "
                                                  r"asks for") as e:
                c.load("params/dense/kernel", bad)
            assert e.value.file == str(path / dcp_read.METADATA_NAME)
            assert e.value.field == "/stateDict/params~1dense~1kernel"


# --- zero-copy and the bytes read ------------------------------------------------------

@pytest.fixture(scope="module")
def rows4(tmp_path_factory):
    """The arrays saved in 4 row chunks (4x1 mesh): each chunk 2 rows (of 64 bytes or more for the kernel)."""
    path = tmp_path_factory.mktemp("rows4")
    save_dir(path, sharded(values(), NamedSharding(mesh((4, 1)), P("x", None))), None)
    return path


@pytest.mark.parametrize("name", ["params/dense/kernel", "params/dense/bias", "params/f8"])
def test_a_block_that_is_a_saved_chunk_is_the_mapped_view_itself(rows4, name):
    s = NamedSharding(mesh((4, 1)), P("x", None))
    with open_dir(rows4) as c:
        arr = c.load(name, s)
        for shard in arr.addressable_shards:
            view = c.chunk(name, (shard.index[0].start, 0))
            assert view.ctypes.data % 64 == 0
            assert shard.data.unsafe_buffer_pointer() == view.ctypes.data
        assert c.bytes_copied == 0 and c.bytes_viewed == arr.nbytes


def test_a_block_inside_one_chunk_is_a_view_of_it(tmp_path):
    v = values()["params/dense/kernel"]  # 2 chunks of 4 rows, loaded as 4 blocks of 2 rows (128 bytes each)
    save_dir(tmp_path, {"k": jax.device_put(v, NamedSharding(mesh((2, 1)), P("x", None)))}, None)
    with open_dir(tmp_path) as c:
        arr = c.load("k", NamedSharding(mesh((4, 1)), P("x", None)))
        for shard in arr.addressable_shards:
            row = shard.index[0].start
            chunk = c.chunk("k", (row // 4 * 4, 0))
            assert shard.data.unsafe_buffer_pointer() == chunk.ctypes.data + (row % 4) * v.shape[1] * v.itemsize
        assert c.bytes_copied == 0
        assert_same(arr, v)


def test_a_4_to_2_reshard_reads_exactly_the_bytes_it_needs(rows4):
    v = values()["params/dense/kernel"]
    rows, columns = NamedSharding(mesh((2, 1)), P("x", None)), NamedSharding(mesh((1, 2)), P(None, "y"))
    with open_dir(rows4) as c:  # rows: 2 saved chunks back to back in the one shard file: one view of both
        arr = c.load("params/dense/kernel", rows)
        assert c.bytes_copied == 0 and c.bytes_viewed == v.nbytes
        for shard in arr.addressable_shards:
            first = c.chunk("params/dense/kernel", (shard.index[0].start, 0))
            assert shard.data.unsafe_buffer_pointer() == first.ctypes.data
        assert_same(arr, v)
    with open_dir(rows4) as c:  # columns: half of each of the 4 chunks per block, copied
        arr = c.load("params/dense/kernel", columns)
        assert c.bytes_viewed == 0 and c.bytes_copied == v.nbytes
        assert_same(arr, v)
    with open_dir(rows4, mmap=False) as c:  # pread copies are never joined into one view
        arr = c.load("params/dense/kernel", rows)
        assert c.bytes_viewed == 0 and c.bytes_copied == v.nbytes
        assert_same(arr, v)


def test_replicas_on_several_local_devices_share_one_read(rows4):
    v = values()["params/dense/kernel"]
    with open_dir(rows4) as c:
        arr = c.load("params/dense/kernel", NamedSharding(mesh((2, 2)), P("x", None)))  # 2 blocks, 2 devices each
        assert c.bytes_viewed == v.nbytes and c.bytes_copied == 0 and len(arr.addressable_shards) == 4
        pointers = {}
        for shard in arr.addressable_shards:
            pointers.setdefault(shard.index[0].start, set()).add(shard.data.unsafe_buffer_pointer())
        assert [len(p) for p in pointers.values()] == [1, 1]  # both replicas alias the one mapped block
        assert_same(arr, v)


# --- saving again, host values, dtype rules ---------------------------------------------

def test_a_new_save_replaces_the_old_one_and_deletes_its_files(tmp_path):
    save_dir(tmp_path, {"a": jnp.zeros(4)}, None)
    first = sorted(os.listdir(tmp_path))
    save_dir(tmp_path, {"b": jnp.ones((2, 2))}, HEADER)
    files = sorted(os.listdir(tmp_path))
    assert not set(first) & set(files) - {dcp_read.METADATA_NAME} and len(files) == 3
    with open_dir(tmp_path) as c:
        assert c.names() == ["b"] and c.header == HEADER
        assert_same(c.load("b"), np.ones((2, 2), np.float32))


def test_host_arrays_are_saved_whole_by_process_0(tmp_path):
    v = np.arange(6, dtype=np.int16).reshape(2, 3)
    save_dir(tmp_path, {"h": v}, None)
    with open_dir(tmp_path) as c:
        assert c.chunks("h") == [((0, 0), (2, 3))]
        assert_same(c.load("h", NamedSharding(mesh((2, 1)), P("x", None))), v)


def test_64_bit_values_are_refused_without_x64_before_anything_is_built(tmp_path):
    if jax.config.jax_enable_x64:
        pytest.skip("jax_enable_x64 is on in this process: 64-bit values load as they are")
    save_dir(tmp_path, {"d": np.arange(4.0)}, None)
    with open_dir(tmp_path) as c:
        with pytest.raises(TypeError, match="'d': dtype float64 needs jax_enable_x64"):
            c.load("d", NamedSharding(mesh((2, 1)), P("x")))
        assert c.bytes_copied == c.bytes_viewed == 0
        assert_same(c.load("d", downcast=True), np.arange(4.0, dtype=np.float32))


def test_a_header_that_is_not_json_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(FormatError, match="NaN and Infinity are not JSON") as e:
        save_dir(tmp_path / "c", {"a": jnp.zeros(2)}, {"format": "x", "metadata": {"lr": float("nan")}})
    assert e.value.field == "/tree/metadata/lr" and not (tmp_path / "c").exists()


def test_names_must_be_strings(tmp_path):
    with pytest.raises(TypeError, match=r"array names must be str, not int \(0\)"):
        save_dir(tmp_path, {0: jnp.zeros(2)}, None)


# --- bad checkpoints: a FormatError naming the file, nothing built ------------------------

def _edit_metadata(path, edit):
    file = path / dcp_read.METADATA_NAME
    doc = json.loads(file.read_text())
    edit(doc)
    file.write_text(json.dumps(doc))
    return str(file)


def _copy(saved, tmp_path):
    return shutil.copytree(saved, tmp_path / "copy")


def test_a_missing_shard_file_is_named(rows4, tmp_path):
    path = _copy(rows4, tmp_path)
    shard = next(n for n in os.listdir(path) if n.endswith(".tl"))
    os.unlink(path / shard)
    with pytest.raises(FormatError, match=f"shard file '{shard}' of the checkpoint is missing") as e:
        open_dir(path)
    assert e.value.file == str(path / shard)


def test_a_chunk_outside_its_array_is_named(rows4, tmp_path):
    path = _copy(rows4, tmp_path)
    file = _edit_metadata(path, lambda d: d["stateDict"]["params/dense/kernel"]["chunks"][3].update(offsets=[7, 0]))
    with pytest.raises(FormatError, match=r"'params/dense/kernel': chunk 3 \(offsets \[7, 0\], sizes \[2, 16\]\) "
                                          "lies outside the tensor of size") as e:
        open_dir(path)
    assert e.value.file == file and e.value.field == "/stateDict/params~1dense~1kernel/chunks/3"


def test_a_tree_header_that_is_not_an_object_is_refused(rows4, tmp_path):
    path = _copy(rows4, tmp_path)
    file = _edit_metadata(path, lambda d: d.update(tree=["tensorlist.jax-tree/1"]))
    with pytest.raises(FormatError, match="is not an object") as e:
        open_dir(path)
    assert e.value.file == file and e.value.field == "/tree"


def test_a_truncated_shard_is_refused_when_opened(rows4, tmp_path):
    path = _copy(rows4, tmp_path)
    data = next(path / n for n in os.listdir(path) if n.endswith(".data"))
    os.truncate(data, os.path.getsize(data) // 2)
    with pytest.raises(FormatError, match="data file"):
        open_dir(path)


# --- two real processes -----------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(args, n, port, root, timeout, ok=True):
    """``n`` processes of the script, each with 2 CPU devices; killed (and failed) past ``timeout`` seconds.

    Returns each process's output; with ``ok``, every process must have exited 0, else every one non-zero.
    """
    env = dict(os.environ, XLA_FLAGS="--xla_force_host_platform_device_count=2")
    procs = [subprocess.Popen([sys.executable, os.path.join(HERE, "_jax_shard_script.py"), *args, str(i), str(n),
                               str(port), str(root)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              text=True) for i in range(n)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"{args}: the processes did not finish in {timeout} s")
    for p, out in zip(procs, outs):
        assert (p.returncode == 0) == ok, out[-3000:]
    return outs


@pytest.mark.slow  # 5 processes importing jax, 2 of them pairs of jax.distributed processes over gloo
def test_two_processes_save_on_4_devices_and_load_on_2_and_on_1(tmp_path, unused_port):
    """Save, a save that fails in one process (both raise, none hangs, the old save stands), loads on 2 and 1."""
    root = tmp_path / "ckpt"
    _run(["save"], 2, unused_port, root, 120)
    files = sorted(n.split(".")[0] for n in os.listdir(root) if n.endswith(".tl"))
    assert files == ["0", "1"]  # each process wrote its own shard file
    full = dcp_read.read_full(root, verify=True)
    ckpt = dcp_read.validate_checkpoint(root, schema=True)
    assert ckpt.tree["format"] == "tensorlist.jax-tree/1" and ckpt.tree["metadata"] == USER_METADATA
    assert [(o, ckpt.storage[("local", o)].file) for o, _ in ckpt.tensors["local"].chunks] == [
        ((0, 0), f"0.{ckpt.save_id}.tl")]  # the process-local array once, from process 0
    for k, v in values().items():
        assert_same(full[k], v)
    before = sorted(os.listdir(root))
    outs = _run(["savefail"], 2, _free_port(), root, 120, ok=False)  # process 1's write fails
    assert "OSError: injected" in outs[1] and "writing the shards failed in process(es) [1]" in outs[0]
    assert dcp_read.read_metadata(root).save_id == ckpt.save_id  # nothing committed: the old save stands
    full = dcp_read.read_full(root, verify=True)
    assert all(full[k].tobytes() == v.tobytes() for k, v in values().items())
    assert set(before) <= set(os.listdir(root))  # process 0's new shard stays until the next commit sweeps it
    outs = _run(["load2"], 2, _free_port(), root, 120)
    assert all("loaded on 2" in o for o in outs)
    outs = _run(["load1"], 1, 0, root, 120)
    assert "loaded on 1" in outs[0]
    with open_dir(root) as c:  # and here, on this process's 4 devices in another partitioning
        for k, v in values().items():
            assert_same(c.load(k, NamedSharding(mesh((1, 4)), P(None, "y")) if v.ndim == 2 and v.size else None), v)
    os.unlink(root / "1.{}.tl".format(ckpt.save_id))
    with pytest.raises(FormatError, match=r"shard file '1\.[0-9a-f]{8}\.tl' of the checkpoint is missing"):
        open_dir(root)


# --- through tensorlist.jax: save(sharded=True) and load of a directory ---------------------

@pytest.fixture(scope="module")
def tree_dir(tmp_path_factory):
    """A pytree saved with ``tensorlist.jax.save(sharded=True)`` from the 2x2 mesh."""
    tlj = pytest.importorskip("tensorlist.jax", reason="tensorlist.jax comes with the jax adapter")
    path = tmp_path_factory.mktemp("tree")
    flat = sharded(values(), NamedSharding(mesh((2, 2)), P("x", "y")))
    tree = {"params": {"dense": {"kernel": flat["params/dense/kernel"], "bias": flat["params/dense/bias"]},
                       "f8": flat["params/f8"]}, "opt": (flat["step"], None, [flat["empty"]])}
    tlj.save(path, tree, sharded=True, metadata={"epoch": 2})
    return tlj, path


def test_a_tree_saved_sharded_comes_back_with_its_structure_on_a_target_tree(tree_dir):
    tlj, path = tree_dir
    v = values()
    rows = NamedSharding(mesh((2, 1)), P("x", None))
    target = {"params": {"dense": {"kernel": rows, "bias": jax.ShapeDtypeStruct((8, 4), v["params/dense/bias"].dtype,
                                                                                   sharding=rows)}, "f8": None},
              "opt": None}
    tree = tlj.load(path, sharding=target)
    assert set(tree) == {"params", "opt"} and isinstance(tree["opt"], tuple) and tree["opt"][1] is None
    assert tree["params"]["dense"]["kernel"].sharding == rows and tree["params"]["dense"]["bias"].sharding == rows
    assert_same(tree["params"]["dense"]["kernel"], v["params/dense/kernel"])
    assert_same(tree["params"]["f8"], v["params/f8"])
    assert_same(tree["opt"][0], v["step"]) and assert_same(tree["opt"][2][0], v["empty"])
    assert dcp_read.read_metadata(path).tree["metadata"] == {"epoch": 2}


def test_a_sharded_save_keeps_scalars_keys_and_pytree_nodes_and_casts_per_device_block(tmp_path):
    """What an Orbax tree holds besides arrays, through the directory layout; cast=True converts each block."""
    tlj = pytest.importorskip("tensorlist.jax", reason="tensorlist.jax comes with the jax adapter")
    flax_struct = pytest.importorskip("flax.struct", reason="a flax.struct dataclass is the pytree node tested")

    @flax_struct.dataclass
    class State:
        w: jax.Array
        rng: jax.Array
        step: int

    cols = NamedSharding(mesh((2, 2)), P(None, "y"))
    w = jax.make_array_from_callback((4, 8), cols, lambda idx: np.arange(32, dtype=np.float32).reshape(4, 8)[idx] / 7)
    rng = jax.device_put(jax.random.split(jax.random.key(3, impl="rbg"), 4), NamedSharding(mesh((2, 2)), P("x")))
    tlj.save(tmp_path / "ckpt", State(w, rng, 11), sharded=True)
    plain = tlj.load(tmp_path / "ckpt")
    assert set(plain) == {"w", "rng", "step"} and plain["step"] == 11
    assert (jax.random.key_data(plain["rng"]) == jax.random.key_data(rng)).all()
    rows = NamedSharding(mesh((4, 1)), P("x"))
    target = State(jax.ShapeDtypeStruct((4, 8), jnp.bfloat16, sharding=rows),
                   jax.ShapeDtypeStruct(rng.shape, rng.dtype, sharding=rows), 0)
    back = tlj.load(tmp_path / "ckpt", sharding=target, cast=True)
    assert type(back) is State and back.step == 11 and jax.random.key_impl(back.rng) == "rbg"
    assert back.rng.sharding == rows
    assert np.asarray(jax.random.key_data(back.rng)).tobytes() == np.asarray(jax.random.key_data(rng)).tobytes()
    assert back.w.dtype == jnp.bfloat16 and back.w.sharding == rows
    assert np.asarray(back.w).tobytes() == np.asarray(w).astype(jnp.bfloat16).tobytes()
    with pytest.raises(FormatError, match=r"ckpt: tree at w: .* \(load with cast=True to convert\)"):
        tlj.load(tmp_path / "ckpt", sharding=target)


def test_tensorlist_jax_load_names_the_missing_shard(tree_dir, tmp_path):
    tlj, path = tree_dir
    path = _copy(path, tmp_path)
    shard = next(n for n in os.listdir(path) if n.endswith(".tl"))
    os.unlink(path / shard)
    with pytest.raises(FormatError, match=f"shard file '{shard}' of the checkpoint is missing"):
        tlj.load(path)


def test_tensorlist_jax_load_names_a_chunk_outside_its_array(tree_dir, tmp_path):
    tlj, path = tree_dir
    path = _copy(path, tmp_path)
    file = _edit_metadata(path, lambda d: d["stateDict"]["params/f8"]["chunks"][0].update(offsets=[6, 0]))
    with pytest.raises(FormatError, match="'params/f8': chunk 0 .* lies outside the tensor") as e:
        tlj.load(path)
    assert e.value.file == file


def test_tensorlist_jax_load_refuses_a_target_of_another_shape(tree_dir):
    tlj, path = tree_dir
    bad = {"params": {"dense": {"kernel": jax.ShapeDtypeStruct((16, 8), np.float32), "bias": None}, "f8": None},
           "opt": None}
    with pytest.raises(FormatError, match="params/dense/kernel") as e:
        tlj.load(path, sharding=bad)
    assert str(path) in str(e.value)


def test_the_cli_validates_inspects_and_converts_a_sharded_save(rows4, tmp_path, capsys):
    from tensorlist.cli import main

    assert main(["validate", "--verify", str(rows4)]) == 0
    assert main(["inspect", str(rows4)]) == 0
    assert "params/dense/kernel" in capsys.readouterr().out
    assert main(["convert", str(rows4), str(tmp_path / "whole.tl"), "--no-progress"]) == 0
    with tl.open(tmp_path / "whole.tl") as r:
        for k, v in values().items():
            assert_same(r[k], v)


@pytest.mark.slow  # imports torch (seconds, where no other test of the run has)
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")
def test_torch_dcp_loads_a_sharded_jax_save(rows4):
    torch = pytest.importorskip("torch", reason="torch's dcp.load reads the checkpoint only where torch is installed")
    import torch.distributed.checkpoint as dcp
    from tensorlist.dcp import TensorListReader

    v = values()["params/dense/kernel"]
    sd = {"params/dense/kernel": torch.zeros(v.shape), "step": torch.zeros((), dtype=torch.int32)}
    dcp.load(sd, storage_reader=TensorListReader(rows4), no_dist=True)
    assert sd["params/dense/kernel"].numpy().tobytes() == v.tobytes() and int(sd["step"]) == 7


def test_verify_checks_the_crc_of_each_chunk_read(rows4, tmp_path):
    from tensorlist.errors import ChecksumError

    path = _copy(rows4, tmp_path)
    shard = next(path / n for n in os.listdir(path) if n.endswith(".tl"))
    doc = json.loads(shard.read_text())
    where = doc.get("byteOffset", 0) + next(t["byteOffset"] for t in doc["tensors"]
                                            if t["name"] == "params/dense/kernel@0,0")
    data = next(path / n for n in os.listdir(path) if n.endswith(".data"))
    with open(data, "r+b") as f:  # flip the first byte of the first kernel chunk
        f.seek(where)
        b = f.read(1)
        f.seek(where)
        f.write(bytes([b[0] ^ 0xFF]))
    with open_dir(path) as c:  # without verify the flipped byte comes through
        assert np.asarray(c.load("params/dense/kernel")).tobytes() != values()["params/dense/kernel"].tobytes()
    with open_dir(path, verify=True) as c:
        assert_same(c.load("params/f8"), values()["params/f8"])  # the other chunks are fine
        with pytest.raises(ChecksumError, match="params/dense/kernel@0,0"):
            c.load("params/dense/kernel", NamedSharding(mesh((2, 1)), P("x", None)))


# --- any tiling (a torch DCP save's, say), any target: hypothesis ---------------------------

def _cuts(n):
    """Sorted cut points splitting ``range(n)`` into 1 to 3 non-empty runs."""
    if n == 1:
        return st.just([0, 1])
    return st.lists(st.integers(1, n - 1), max_size=2, unique=True).map(lambda c: [0, *sorted(c), n])


@st.composite
def _tilings(draw):
    rows, cols = draw(st.sampled_from([2, 4, 6, 8])), draw(st.integers(1, 9))
    r, c = draw(_cuts(rows)), draw(_cuts(cols))
    chunks = [((r[i], c[j]), (r[i + 1] - r[i], c[j + 1] - c[j])) for i in range(len(r) - 1)
              for j in range(len(c) - 1)]
    files = draw(st.lists(st.integers(0, 1), min_size=len(chunks), max_size=len(chunks)))
    return (rows, cols), draw(st.permutations(chunks)), files


def _write_tiling(path, value, chunks, files):
    """A checkpoint of ``value`` in the given chunks and shard files, as another DCP writer would lay it out."""
    save_id = "0123abcd"
    meta = dcp_read.TensorMeta("layer.w", "float32", value.shape, tuple(chunks))
    storage, per_file = [], {}
    for (off, sz), f in zip(chunks, files):
        name = dcp_read.tensor_key("layer.w", off)
        per_file.setdefault(f, {})[name] = value[off[0]:off[0] + sz[0], off[1]:off[1] + sz[1]]
        storage.append(dcp_read.StorageEntry("layer.w", off, dcp_read.shard_name(f, save_id), name,
                                             sz[0] * sz[1] * 4, None, "float32", sz))
    for f, arrays in per_file.items():
        tl.save(os.path.join(path, dcp_read.shard_name(f, save_id)), arrays, durable=False)
    dcp_read.commit_metadata(path, dcp_read.metadata_document(save_id=save_id, dcp_version="1.0.0",
                                                              entries={"layer.w": meta}, storage=storage),
                             durable=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_tilings(), st.sampled_from([t[0] for t in TARGETS]))
def test_any_tiling_loads_onto_any_target(tiling, target_id):
    shape, chunks, files = tiling
    value = np.arange(shape[0] * shape[1], dtype=np.float32).reshape(shape)
    target = dict(TARGETS)[target_id]()
    if isinstance(target, NamedSharding) and any(shape[d] % n for d, n in enumerate(target.mesh.devices.shape)):
        target = NamedSharding(target.mesh, P())  # a split jax cannot make: the array replicated instead
    with tempfile.TemporaryDirectory() as path:
        _write_tiling(path, value, chunks, files)
        with open_dir(path) as c:
            arr = c.load("layer.w", target)
            assert_same(arr, value)
            blocks = {tuple((i.start, i.stop) for i in s.index): s.data.nbytes for s in arr.addressable_shards}
            assert c.bytes_viewed + c.bytes_copied == sum(blocks.values())  # each distinct block once, no more
