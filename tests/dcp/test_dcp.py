"""tensorlist.dcp: torch.distributed.checkpoint on tensorlist files, with real gloo processes on loopback.

One launch of 4 ranks saves every kind of state dict (plain tensors with non-tensor values, DTensors
sharded and replicated, FSDP2 model and optimizer state, an async save); launches of 2 and 3 ranks
load them back with other layouts (DCP reshards), and this process loads them on 1. Values are
compared bit-exact with the tensors the savers were given. The same file is the worker: run as a
script it is one rank (python test_dcp.py MODE RANK WORLD PORT ROOT).
"""
import datetime
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tensorlist.dcp needs torch (pip install 'tensorlist[torch]')")
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

import tensorlist as tl
from tensorlist._base import dtypes as _dtypes
from tensorlist._bridges.torch import from_numpy
from tensorlist.dcp import TensorListReader, TensorListWriter, read_full, validate_checkpoint
from tensorlist.dcp import (METADATA_NAME, SCHEMA, Shards, StorageEntry, TensorMeta, schema_check, check_shape,
                                 metadata_document, parse_metadata, read_metadata)
from tensorlist.errors import FormatError
from tensorlist.schema import load_schema, schema_validator

import _ranks
from _paths import ROOT

REPO = ROOT
OBJ = {"epoch": 3, "name": "run-1", "betas": (0.9, 0.999), "best": float("inf"), "tags": ["a", "b"], "none": None}
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


# --- what every rank saves (deterministic, so loaders can rebuild it) -----------------

def plain_tensors():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(8, 6, generator=g), "b": torch.arange(5), "h": torch.randn(4, 4, generator=g).bfloat16(),
            "s": torch.tensor(3.5, dtype=torch.float64)}


def dtensor_values():
    g = torch.Generator().manual_seed(1)
    return {"s0": torch.randn(8, 6, generator=g), "s1": torch.randn(5, 7, generator=g),
            "rep": torch.randn(3, 3, generator=g), "bf": torch.randn(6, 4, generator=g).bfloat16(),
            "tiny": torch.randn(2, 3, generator=g)}


def saved_placements():
    from torch.distributed.tensor import Replicate, Shard
    return {"s0": Shard(0), "s1": Shard(1), "rep": Replicate(), "bf": Shard(0), "tiny": Shard(0)}


def loaded_placements():
    from torch.distributed.tensor import Replicate, Shard
    return {"s0": Shard(1), "s1": Shard(0), "rep": Shard(0), "bf": Replicate(), "tiny": Shard(1)}


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def train_step(model, opt):
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    model(x).sum().backward()
    opt.step()
    opt.zero_grad()


def flat_full_state(model, opt, **options):
    """Model and optimizer state as {name: full tensor} (gathered from DTensors)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions
    msd, osd = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True, **options))
    out = {f"model/{k}": v for k, v in msd.items()}
    for fqn, st in osd.get("state", {}).items():  # cpu_offload: only rank 0 gets the values
        out.update({f"optim/{fqn}/{k}": v for k, v in st.items()})
    return out


def assert_same(got, want, what):
    assert got.dtype == want.dtype and got.shape == want.shape, (what, got.dtype, got.shape, want.dtype, want.shape)
    assert torch.equal(got, want), what


# --- the worker (one rank) -------------------------------------------------------------

def worker_save(rank, world, root):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    # plain tensors (the same on every rank: DCP's planner writes each once) and non-tensor values
    dcp.save({"model": plain_tensors(), "meta": dict(OBJ)},
             storage_writer=TensorListWriter(os.path.join(root, "plain")))
    # DTensors: sharded along each dimension (unevenly, with empty shards) and replicated
    place = saved_placements()
    dcp.save({k: distribute_tensor(v, mesh, [place[k]]) for k, v in dtensor_values().items()},
             storage_writer=TensorListWriter(os.path.join(root, "dtensor")))
    # FSDP2 model and Adam state after one step, through DCP's get_state_dict
    model = make_model()
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    train_step(model, opt)
    msd, osd = get_state_dict(model, opt)
    dcp.save({"model": msd, "optim": osd}, storage_writer=TensorListWriter(os.path.join(root, "fsdp")))
    full = flat_full_state(model, opt, cpu_offload=True)
    if rank == 0:
        tl.save(os.path.join(root, "fsdp-reference.tl"), {k: v.float() for k, v in full.items()})
    # async_save: the state is staged before async_save returns; changing it afterwards changes nothing saved
    group = dist.new_group(backend="gloo")
    sd = {"x": distribute_tensor(dtensor_values()["s0"], mesh, [place["s0"]]), "w": plain_tensors()["w"].clone()}
    fut = dcp.async_save(sd, storage_writer=TensorListWriter(os.path.join(root, "async")), process_group=group)
    with torch.no_grad():
        sd["x"].to_local().add_(1000)
        sd["w"].add_(1000)
    fut.result()


def worker_load(rank, world, root):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import distribute_tensor
    mesh = init_device_mesh("cpu", (world,))
    want = plain_tensors()
    sd = {"model": {k: torch.zeros_like(v) for k, v in want.items()}, "meta": {k: None for k in OBJ}}
    dcp.load(sd, storage_reader=TensorListReader(os.path.join(root, "plain")))
    for k, v in want.items():
        assert_same(sd["model"][k], v, k)
    assert sd["meta"] == OBJ, sd["meta"]
    # DTensors resharded: every tensor loaded with another placement than it was saved with
    place = loaded_placements()
    values = dtensor_values()
    sd = {k: distribute_tensor(torch.zeros_like(v), mesh, [place[k]]) for k, v in values.items()}
    dcp.load(sd, storage_reader=TensorListReader(os.path.join(root, "dtensor")))
    for k, v in values.items():
        assert sd[k].placements == (place[k],)
        assert_same(sd[k].full_tensor(), v, k)
    # FSDP2 on another number of ranks: set_state_dict from the loaded state, compare with the saver's full state
    model = make_model()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    for m in model:
        if isinstance(m, torch.nn.Linear):
            fully_shard(m, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, storage_reader=TensorListReader(os.path.join(root, "fsdp")))
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    ref = tl.load(os.path.join(root, "fsdp-reference.tl"))
    full = flat_full_state(model, opt)
    assert sorted(full) == sorted(ref)
    for k, v in full.items():
        assert_same(v.float(), torch.from_numpy(ref[k].copy()), k)
    # the async save holds the values of before the change made while it ran
    sd = {"x": distribute_tensor(torch.zeros(8, 6), mesh, [place["s0"]]), "w": torch.zeros(8, 6)}
    dcp.load(sd, storage_reader=TensorListReader(os.path.join(root, "async")))
    assert_same(sd["x"].full_tensor(), values["s0"], "async x")
    assert_same(sd["w"], want["w"], "async w")


class _DyingWriter(TensorListWriter):
    """Rank 1 writes its shard, then is killed before the coordinator can commit."""

    def write_data(self, plan, planner):
        fut = super().write_data(plan, planner)
        if self.rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return fut


def worker_kill(rank, world, root):
    path = os.path.join(root, "killed")
    dcp.save({"w": plain_tensors()["w"], "b": plain_tensors()["b"]}, storage_writer=TensorListWriter(path))
    dist.barrier()
    dcp.save({"w": plain_tensors()["w"] + 1, "b": plain_tensors()["b"] + 1}, storage_writer=_DyingWriter(path))
    raise AssertionError("the save with a killed rank returned")


def worker(mode, rank, world, port, root):
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    _ranks.join(rank, world, port, timeout=datetime.timedelta(seconds=60))
    {"save": worker_save, "load": worker_load, "kill": worker_kill}[mode](rank, world, root)
    dist.barrier()
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """Every checkpoint, saved once by 4 gloo ranks."""
    root = tmp_path_factory.mktemp("dcp")
    _ranks.run_script(__file__, "save", 4, root)
    return root


def _copy(saved, name, tmp_path):
    return shutil.copytree(saved / name, tmp_path / name)


# --- save on 4, load on 1 (this process), 2 and 3 ---------------------------------------

@pytest.mark.slow  # gloo processes
def test_plain_state_dict_saved_on_4_loads_on_1_with_its_values(saved):
    want = plain_tensors()
    sd = {"model": {k: torch.zeros_like(v) for k, v in want.items()}, "meta": {k: None for k in OBJ}}
    dcp.load(sd, storage_reader=TensorListReader(saved / "plain"))
    for k, v in want.items():
        assert_same(sd["model"][k], v, k)
    assert sd["meta"] == OBJ and isinstance(sd["meta"]["betas"], tuple)
    ckpt = validate_checkpoint(saved / "plain", verify=True)
    assert ckpt.bytes_keys == [f"meta.{k}" for k in OBJ]
    # no pickle anywhere: the metadata is JSON and every file is a tensorlist file or that JSON
    names = sorted(os.listdir(saved / "plain"))
    assert METADATA_NAME in names and all(n == METADATA_NAME or ".tl" in n for n in names)
    json.loads((saved / "plain" / METADATA_NAME).read_text())


@pytest.mark.slow  # gloo processes
def test_read_full_equals_what_was_saved_without_torch_tensors(saved):
    full = read_full(saved / "plain")
    for k, v in plain_tensors().items():
        assert isinstance(full[f"model.{k}"], np.ndarray)
        assert_same(from_numpy(full[f"model.{k}"]), v, k)
    assert {k: full[f"meta.{k}"] for k in OBJ} == OBJ
    dt = read_full(saved / "dtensor", verify=True)
    for k, v in dtensor_values().items():
        assert_same(from_numpy(dt[k]), v, k)


@pytest.mark.slow  # gloo processes
def test_dtensors_saved_on_4_load_on_1_as_full_tensors(saved):
    values = dtensor_values()
    sd = {k: torch.zeros_like(v) for k, v in values.items()}
    dcp.load(sd, storage_reader=TensorListReader(saved / "dtensor"))
    for k, v in values.items():
        assert_same(sd[k], v, k)
    ckpt = read_metadata(saved / "dtensor")
    assert len(ckpt.tensors["s0"].chunks) == 4 and len(ckpt.tensors["rep"].chunks) == 1  # replicated: written once
    assert len(ckpt.files) == 4


@pytest.mark.slow  # gloo processes
def test_fsdp2_model_and_optimizer_saved_on_4_load_on_1_through_set_state_dict(saved):
    model, ref = make_model(), tl.load(saved / "fsdp-reference.tl")
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    msd, osd = get_state_dict(model, opt)
    dcp.load({"model": msd, "optim": osd}, storage_reader=TensorListReader(saved / "fsdp"))
    set_state_dict(model, opt, model_state_dict=msd, optim_state_dict=osd)
    full = flat_full_state(model, opt)
    assert sorted(full) == sorted(ref)
    for k, v in full.items():
        assert_same(v.float(), torch.from_numpy(ref[k].copy()), k)
    assert opt.param_groups[0]["betas"] == (0.9, 0.999)  # a tuple again, through tagged JSON
    # the same model keeps training identically from the loaded state
    train_step(model, opt)
    flat = read_full(saved / "fsdp")
    assert flat["optim.state.0.weight.step"] == np.float32(1.0)
    assert flat["optim.param_groups.0.lr"] == 0.01


@pytest.mark.slow  # gloo processes
def test_async_save_kept_the_values_staged_before_it_returned(saved):
    sd = {"x": torch.zeros(8, 6), "w": torch.zeros(8, 6)}
    dcp.load(sd, storage_reader=TensorListReader(saved / "async"))
    assert_same(sd["x"], dtensor_values()["s0"], "x")
    assert_same(sd["w"], plain_tensors()["w"], "w")


def test_async_save_with_cached_staging_copies_into_the_same_buffers(tmp_path):
    sd = {"w": torch.arange(6.0), "opt": {"lr": 0.1, "m": [torch.ones(2)]}}
    writer = TensorListWriter(tmp_path, cache_staged_state_dict=True)
    dcp.async_save(sd, storage_writer=writer).result()
    first = writer.state_dict_cache
    with torch.no_grad():
        sd["w"].add_(10)
    sd["opt"]["m"][0].mul_(3)
    dcp.async_save(sd, storage_writer=writer).result()
    assert writer.state_dict_cache is first and first["w"].data_ptr() != sd["w"].data_ptr()
    full = read_full(tmp_path)
    assert full["w"].tolist() == [10.0, 11.0, 12.0, 13.0, 14.0, 15.0] and full["opt.m.0"].tolist() == [3.0, 3.0]
    sd["opt"]["lr"] = 0.2  # another value: staged afresh, not copied into the old structure
    dcp.async_save(sd, storage_writer=writer).result()
    assert writer.state_dict_cache is not first and read_full(tmp_path)["opt.lr"] == 0.2
    writer.wait()


@pytest.mark.slow  # gloo processes
@pytest.mark.parametrize("world", [2, 3])
def test_saved_on_4_loads_on_2_and_3_ranks_resharded(saved, world):
    _ranks.run_script(__file__, "load", world, saved)


# --- atomicity --------------------------------------------------------------------------

@pytest.mark.slow  # gloo processes
def test_a_rank_killed_before_the_commit_leaves_the_previous_checkpoint_loadable(tmp_path):
    with _ranks.Launch(2) as job:
        _ranks.spawn_script(job, __file__, "kill", tmp_path)
        job.procs[1].wait(timeout=180)
        try:
            job.procs[0].wait(timeout=20)  # gloo reports the dead peer; if it does not, stop it
        except subprocess.TimeoutExpired:
            pass
        log = job.output(1)
    assert job.procs[1].returncode == -signal.SIGKILL, log[-3000:]
    path = tmp_path / "killed"
    ckpt = validate_checkpoint(path, verify=True)
    leftovers = [n for n in os.listdir(path) if n != METADATA_NAME and ckpt.save_id not in n]
    assert leftovers, "the killed save wrote nothing: the test tested nothing"
    sd = {"w": torch.zeros(8, 6), "b": torch.zeros(5, dtype=torch.int64)}
    dcp.load(sd, storage_reader=TensorListReader(path))
    assert_same(sd["w"], plain_tensors()["w"], "w")
    assert_same(sd["b"], plain_tensors()["b"], "b")
    # the next committed save removes what the killed one left
    writer = TensorListWriter(path)
    dcp.save({"w": sd["w"] * 2}, storage_writer=writer)
    writer.wait()
    ckpt = read_metadata(path)
    assert sorted(os.listdir(path)) == sorted([METADATA_NAME] + [n for n in os.listdir(path) if ckpt.save_id in n])


def test_every_dcp_reader_takes_the_mmap_modes_and_refuses_others(tmp_path):
    dcp.save({"a": torch.arange(3.0)}, storage_writer=TensorListWriter(tmp_path))
    for mode in (True, "copy", False):
        assert read_full(tmp_path, mmap=mode)["a"].tolist() == [0.0, 1.0, 2.0]
        with Shards(tmp_path, mmap=mode) as shards:
            arrays = [shards.array(e) for e in read_metadata(tmp_path).storage.values() if e.offset is not None]
            assert [a.flags.writeable for a in arrays] == [mode is not True]
        state = {"a": torch.zeros(3)}
        dcp.load(state, storage_reader=TensorListReader(tmp_path, mmap=mode))
        assert state["a"].tolist() == [0.0, 1.0, 2.0]
    for call in (lambda: read_full(tmp_path, mmap="cow"), lambda: Shards(tmp_path, mmap="cow"),
                 lambda: TensorListReader(tmp_path, mmap="cow")):
        with pytest.raises(ValueError, match="mmap must be True, False or 'copy', not 'cow'"):
            call()


def test_a_second_save_replaces_the_first_and_overwrite_false_refuses(tmp_path):
    writer = TensorListWriter(tmp_path)
    dcp.save({"a": torch.ones(3)}, storage_writer=writer)
    dcp.save({"a": torch.full((3,), 2.0)}, storage_writer=writer)
    writer.wait()
    assert read_full(tmp_path)["a"].tolist() == [2.0, 2.0, 2.0]
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".tl")]) == 1
    with pytest.raises(BaseException, match=r"Checkpoint already exists and self\.overwrite=False"):  # DCP's words
        dcp.save({"a": torch.ones(3)}, storage_writer=TensorListWriter(tmp_path, overwrite=False))


# --- values that are not tensors ------------------------------------------------------------

class Opaque:
    def __init__(self, v):
        self.v = v

    def __eq__(self, other):
        return isinstance(other, Opaque) and other.v == self.v


def test_a_value_json_cannot_hold_is_refused_naming_its_key_unless_pickle_is_allowed(tmp_path):
    sd = {"x": torch.ones(2), "cfg": {"obj": Opaque(5)}}
    with pytest.raises(BaseException) as e:
        dcp.save(sd, storage_writer=TensorListWriter(tmp_path / "refused"))
    assert "'cfg.obj' cannot be stored as JSON" in str(e.value) and "allow_pickle=True" in str(e.value)
    assert not (tmp_path / "refused" / METADATA_NAME).exists()
    dcp.save(sd, storage_writer=TensorListWriter(tmp_path / "pickled", allow_pickle=True))
    assert read_metadata(tmp_path / "pickled").storage[("cfg.obj", None)].encoding == "torch_save"
    back = {"x": torch.zeros(2), "cfg": {"obj": None}}
    with pytest.raises(BaseException, match="'cfg.obj' is stored as a torch.save pickle"):
        dcp.load(back, storage_reader=TensorListReader(tmp_path / "pickled"))
    assert isinstance(read_full(tmp_path / "pickled")["cfg.obj"], bytes)  # raw, never unpickled
    dcp.load(back, storage_reader=TensorListReader(tmp_path / "pickled", allow_pickle=True))
    assert back["cfg"]["obj"] == Opaque(5)


def test_a_checkpoint_loads_without_a_template_as_dcp_to_torch_save_does(tmp_path):
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    dcp.save({"model": {"w": torch.ones(2, 2)}, "opt": {"lr": 0.1, "betas": (0.9, 0.99)}},
             storage_writer=TensorListWriter(tmp_path))
    sd = {}  # rebuilt from the metadata: shapes and dtypes from stateDict, nesting from the planner data
    _load_state_dict(sd, storage_reader=TensorListReader(tmp_path), planner=_EmptyStateDictLoadPlanner(), no_dist=True)
    assert sd["opt"] == {"lr": 0.1, "betas": (0.9, 0.99)} and torch.equal(sd["model"]["w"], torch.ones(2, 2))


def test_memory_url_single_process():
    url = f"memory://tensorlist-dcp-{os.getpid()}/ckpt"
    want = plain_tensors()
    writer = TensorListWriter(url)
    dcp.save({"model": want, "step": 5}, storage_writer=writer)
    dcp.save({"model": want, "step": 6}, storage_writer=writer)
    writer.wait()
    sd = {"model": {k: torch.zeros_like(v) for k, v in want.items()}, "step": 0}
    dcp.load(sd, storage_reader=TensorListReader(url))
    assert sd["step"] == 6 and all(torch.equal(sd["model"][k], v) for k, v in want.items())
    assert read_full(url)["model.w"].tolist() == want["w"].tolist()
    import fsspec
    fs, root = fsspec.core.url_to_fs(url)
    assert len([n for n in fs.ls(root, detail=False) if n.endswith(".tl")]) == 1  # the first save was swept
    fs.rm(root, recursive=True)


# --- bad input: every refusal is a FormatError naming the file (and the fqn) ------------------

def _edit_metadata(path, edit):
    doc = json.loads((path / METADATA_NAME).read_text())
    edit(doc)
    (path / METADATA_NAME).write_text(json.dumps(doc))


def _chunk(doc, fqn, i):
    return doc["stateDict"][fqn]["chunks"][i]


def _entry(doc, fqn, i=0):
    return [e for e in doc["storage"] if e["fqn"] == fqn][i]


def _swap(a, b, key):
    a[key], b[key] = b[key], a[key]


# (id, edit of the metadata of the DTensor checkpoint, message, file named: "metadata" or "shard")
BAD_METADATA = [
    ("gap", lambda d: _chunk(d, "s0", 1)["sizes"].__setitem__(0, 1), r"'s0': the chunks cover 42 of .* 48 .*gap",
     "metadata"),
    ("overlap", lambda d: _chunk(d, "s0", 1)["offsets"].__setitem__(0, 1), r"'s0': chunks 0 and 1 overlap", "metadata"),
    ("out of range", lambda d: _chunk(d, "s1", 3)["sizes"].__setitem__(1, 2), r"'s1': chunk 3 .* lies outside",
     "metadata"),
    ("chunk rank", lambda d: _chunk(d, "rep", 0)["offsets"].pop(), r"'rep': chunk 0 has 1 offsets", "metadata"),
    ("no storage entry", lambda d: d["storage"].remove(_entry(d, "s0", 2)), r"'s0': the chunk at offsets \[4, 0\] "
     "has no storage entry", "metadata"),
    ("unknown file", lambda d: _entry(d, "s0").__setitem__("file", "9.00000000.tl"), r"'s0': .*not in files",
     "metadata"),
    ("byte length", lambda d: _entry(d, "s0").__setitem__("byteLength", 4), r"'s0': storage entry .* says 4 bytes",
     "metadata"),
    ("unknown fqn", lambda d: _entry(d, "s0").__setitem__("fqn", "nope"), r"'nope', which is not in stateDict",
     "metadata"),
    ("chunks swapped", lambda d: _swap(_entry(d, "tiny"), _entry(d, "s0"), "tensor"),
     r"'(s0|tiny)': the metadata says the chunk at offsets \[0, 0\] is float32\[(2, 6|1, 3)\], the shard holds "
     r"float32\[(1, 3|2, 6)\]", "shard"),
    ("chunk points at nothing", lambda d: _entry(d, "s0").__setitem__("tensor", "s0@9,9"), r"'s0': .*which the shard "
     "lacks", "shard"),
    ("version", lambda d: d.__setitem__("formatVersion", 2), r"not a tensorlist DCP metadata", "metadata"),
    ("file leaves the directory", lambda d: d["files"].__setitem__(0, "../0.x.tl"), r"does not match", "metadata"),
    ("dtype", lambda d: d["stateDict"]["s0"].__setitem__("dtype", "complex32"), r"is not one of", "metadata"),
    ("format name", lambda d: d.__setitem__("format", "other"), r"not a tensorlist DCP metadata", "metadata"),
]


@pytest.mark.slow  # gloo processes
@pytest.mark.parametrize("edit,message,named", [b[1:] for b in BAD_METADATA], ids=[b[0] for b in BAD_METADATA])
def test_bad_metadata_is_a_format_error_naming_the_file(saved, tmp_path, edit, message, named):
    path = _copy(saved, "dtensor", tmp_path)
    validate_checkpoint(path)
    _edit_metadata(path, edit)
    with pytest.raises(FormatError, match=message) as e:
        validate_checkpoint(path)
    if named == "metadata":
        assert e.value.file == str(path / METADATA_NAME)
    else:
        assert os.path.basename(e.value.file).endswith(".tl") and os.path.dirname(e.value.file) == str(path)
    with pytest.raises(FormatError, match=message):
        read_full(path)


@pytest.mark.slow  # gloo processes
def test_bad_metadata_reaches_dcp_load_as_its_format_error(saved, tmp_path):
    path = _copy(saved, "dtensor", tmp_path)
    _edit_metadata(path, BAD_METADATA[1][1])
    with pytest.raises(BaseException, match=r"\.metadata\.json: field '/stateDict/s0/chunks/1': 's0': chunks 0 and 1 "
                       "overlap"):
        dcp.load({k: torch.zeros_like(v) for k, v in dtensor_values().items()},
                 storage_reader=TensorListReader(path))


@pytest.mark.slow  # gloo processes
def test_a_truncated_shard_is_a_format_error_naming_it(saved, tmp_path):
    path = _copy(saved, "dtensor", tmp_path)
    data = sorted(n for n in os.listdir(path) if n.startswith("2.") and n.endswith(".data"))[0]
    os.truncate(path / data, os.path.getsize(path / data) - 1)
    with pytest.raises(FormatError, match=data) as e:
        validate_checkpoint(path)
    assert os.path.basename(e.value.file).startswith("2.")
    with pytest.raises(FormatError, match=data):
        read_full(path)
    with pytest.raises(BaseException, match=f"FormatError: .*{data}"):
        dcp.load({k: torch.zeros_like(v) for k, v in dtensor_values().items()}, storage_reader=TensorListReader(path))


@pytest.mark.slow  # gloo processes
def test_a_missing_rank_file_is_a_format_error_naming_it(saved, tmp_path):
    path = _copy(saved, "dtensor", tmp_path)
    shard = read_metadata(path).files[3]
    os.unlink(path / shard)
    with pytest.raises(FormatError, match=f"shard file '{shard}' of the checkpoint is missing") as e:
        validate_checkpoint(path)
    assert e.value.file == str(path / shard)
    with pytest.raises(FormatError, match="is missing"):
        read_full(path)


class _Planted:
    def __reduce__(self):
        return (open, (os.path.join(os.environ["TL_MARKER_DIR"], "unpickled"), "w"))


@pytest.mark.slow  # gloo processes
def test_a_pickle_planted_as_the_metadata_is_refused_and_never_run(saved, tmp_path, monkeypatch):
    path = _copy(saved, "plain", tmp_path)
    monkeypatch.setenv("TL_MARKER_DIR", str(tmp_path))
    (path / METADATA_NAME).write_bytes(pickle.dumps({"format": _Planted()}))
    for read in (validate_checkpoint, read_full, read_metadata):
        with pytest.raises(FormatError, match="not UTF-8|invalid JSON") as e:
            read(path)
        assert e.value.file == str(path / METADATA_NAME)
    with pytest.raises(BaseException, match=r"\.metadata\.json: descriptor is not UTF-8"):
        dcp.load({"model": plain_tensors()}, storage_reader=TensorListReader(path))
    assert not (tmp_path / "unpickled").exists()
    (path / METADATA_NAME).unlink()
    with pytest.raises(FileNotFoundError, match="no checkpoint metadata"):
        read_full(path)


# --- the layout's schema, and reading without torch ------------------------------------------

def test_the_example_of_format_md_is_a_valid_metadata_document():
    spec = open(os.path.join(REPO, "docs", "FORMAT.md"), encoding="utf-8").read().split("## Distributed checkpoints")[1]
    doc = json.loads(spec.split("```json\n", 1)[1].split("```", 1)[0])
    check_shape(doc, file="FORMAT.md", schema=True)
    ckpt = parse_metadata(doc, file="FORMAT.md")
    assert ckpt.storage[("w", (2, 0))].shape == (2, 2) and ckpt.bytes_keys == ["step"]


def test_the_schema_is_valid_and_its_dtypes_are_the_dtype_table():
    schema = load_schema(SCHEMA)
    schema_validator(SCHEMA)  # check_schema runs here
    assert schema["$id"].endswith("/dcp-metadata/1/dcp-metadata.schema.json")
    assert schema["$defs"]["tensor"]["properties"]["dtype"]["enum"] == [d.name for d in _dtypes.DTYPES]


def _good_doc():
    entries = {"w": TensorMeta("w", "float32", (4, 2), (((0, 0), (2, 2)), ((2, 0), (2, 2)))), "step": None}
    storage = [StorageEntry("w", (0, 0), "0.0123abcd.tl", "w@0,0", 16), StorageEntry("w", (2, 0), "1.0123abcd.tl",
               "w@2,0", 16), StorageEntry("step", None, "0.0123abcd.tl", "step@bytes", 1, "json")]
    return metadata_document(save_id="0123abcd", dcp_version="1.0.0", entries=entries, storage=storage,
                             planner_data={"w": {"__tuple__": ["w"]}},
                             storage_meta={"checkpointId": "/x", "saveId": "0123abcd", "modules": []})


def _set(path, value):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        d[last] = value
    return edit


def _drop(path):
    def edit(d):
        *head, last = path
        for k in head:
            d = d[k]
        del d[last]
    return edit


W, C, P, S = ["stateDict", "w"], ["stateDict", "w", "chunks", 0], ["stateDict", "w", "properties"], ["storage", 0]
# (id, edit, valid?) fed to the hand-written checks and to jsonschema alike. "integers only": the one documented
# difference (as for the descriptor schema): JSON Schema counts 4.0 as an integer, the checks refuse it.
SHAPES = [
    ("as written", lambda d: None, True),
    ("dcpVersion null", _set(["dcpVersion"], None), True),
    ("no dcpVersion", _drop(["dcpVersion"]), True),
    ("storageMeta null", _set(["storageMeta"], None), True),
    ("storageMeta empty", _set(["storageMeta"], {}), True),
    ("plannerData anything", _set(["plannerData"], [1, {"a": None}]), True),
    ("pickle encoding", _set(["storage", 2, "encoding"], "torch_save"), True),
    ("empty state", lambda d: d.update(stateDict={}, storage=[], files=[]), True),
    ("not an object", lambda d: d.clear() or d.update(x=1), False),
    ("no format", _drop(["format"]), False),
    ("other format", _set(["format"], "tensorlist"), False),
    ("extra key", _set(["extra"], 1), False),
    ("version 0", _set(["formatVersion"], 0), False),
    ("version 2", _set(["formatVersion"], 2), False),
    ("version true", _set(["formatVersion"], True), False),
    ("version 1.0", _set(["formatVersion"], 1.0), "integers only"),
    ("dcpVersion int", _set(["dcpVersion"], 1), False),
    ("saveId upper", _set(["saveId"], "0123ABCD"), False),
    ("saveId long", _set(["saveId"], "0123abcd0"), False),
    ("files not unique", _set(["files"], ["0.0123abcd.tl", "0.0123abcd.tl"]), False),
    ("file with a directory", _set(["files", 0], "d/0.0123abcd.tl"), False),
    ("file hidden", _set(["files", 0], ".0.0123abcd.tl"), False),
    ("file not .tl", _set(["files", 0], "0.0123abcd.json"), False),
    ("stateDict array", _set(["stateDict"], []), False),
    ("entry type", _set(W + ["type"], "other"), False),
    ("bytes with a key", _set(["stateDict", "step", "dtype"], "uint8"), False),
    ("tensor without properties", _drop(W + ["properties"]), False),
    ("tensor extra key", _set(W + ["extra"], 1), False),
    ("dtype unknown", _set(W + ["dtype"], "complex32"), False),
    ("size negative", _set(W + ["size", 0], -1), False),
    ("size bool", _set(W + ["size", 0], True), False),
    ("size float", _set(W + ["size", 0], 4.0), "integers only"),
    ("size 2^63", _set(W + ["size", 0], 1 << 63), False),
    ("size 2^63-1", _set(W + ["size", 0], (1 << 63) - 1), True),
    ("chunks object", _set(W + ["chunks"], {}), False),
    ("chunk extra key", _set(C + ["extra"], 1), False),
    ("chunk without sizes", _drop(C + ["sizes"]), False),
    ("offsets string", _set(C + ["offsets"], "0,0"), False),
    ("layout sparse", _set(P + ["layout"], "sparse_coo"), False),
    ("memoryFormat other", _set(P + ["memoryFormat"], "channels_last_3d"), False),
    ("memoryFormat channels_last", _set(P + ["memoryFormat"], "channels_last"), True),
    ("pinMemory int", _set(P + ["pinMemory"], 0), False),
    ("requiresGrad missing", _drop(P + ["requiresGrad"]), False),
    ("entry without offset", _drop(S + ["offset"]), False),
    ("entry offset bool", _set(S + ["offset", 0], False), False),
    ("entry offset string", _set(S + ["offset"], "0"), False),
    ("entry extra key", _set(S + ["extra"], 1), False),
    ("entry byteLength negative", _set(S + ["byteLength"], -1), False),
    ("entry fqn int", _set(S + ["fqn"], 1), False),
    ("entry tensor null", _set(S + ["tensor"], None), False),
    ("entry encoding other", _set(S + ["encoding"], "pickle"), False),
    ("storage object", _set(["storage"], {}), False),
    ("storageMeta extra", _set(["storageMeta", "x"], 1), False),
    ("modules of ints", _set(["storageMeta", "modules"], [1]), False),
    ("checkpointId int", _set(["storageMeta", "checkpointId"], 1), False),
    ("tree header", _set(["tree"], {"format": "tensorlist.jax-tree/1", "tree": {"kind": "leaf"}, "metadata": None}),
     True),
    ("tree with format only", _set(["tree"], {"format": "x"}), True),
    ("tree null", _set(["tree"], None), False),
    ("tree array", _set(["tree"], [{"format": "x"}]), False),
    ("tree without format", _set(["tree"], {"tree": {}}), False),
    ("tree format int", _set(["tree"], {"format": 1}), False),
]


@pytest.mark.parametrize("edit,valid", [c[1:] for c in SHAPES], ids=[c[0] for c in SHAPES])
def test_hand_written_shape_checks_agree_with_jsonschema(edit, valid):
    doc = _good_doc()
    edit(doc)
    if valid == "integers only":
        schema_check(doc, "m.json")
        with pytest.raises(FormatError, match="is not an integer|not a version"):
            check_shape(doc, file="m.json")
        return
    for schema in (False, True):
        if valid:
            check_shape(doc, file="m.json", schema=schema)
            continue
        with pytest.raises(FormatError, match="not a tensorlist DCP metadata document") as e:
            if schema:
                schema_check(doc, "m.json")  # jsonschema alone
            else:
                check_shape(doc, file="m.json")
        assert e.value.file == "m.json" and e.value.field.startswith("/")


@pytest.mark.slow  # gloo processes
def test_read_full_and_validate_run_with_torch_blocked(saved):
    code = ("import sys; sys.modules['torch'] = None\n"
            "import tensorlist.dcp as d\n"
            f"full = d.read_full({str(saved / 'dtensor')!r}, verify=True)\n"
            f"d.validate_checkpoint({str(saved / 'plain')!r})\n"
            "assert 'torch' not in {m.split('.')[0] for m, v in sys.modules.items() if v is not None}\n"
            "print(sorted(full), full['bf'].dtype)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['bf', 'rep', 's0', 's1', 'tiny'] bfloat16"


@pytest.mark.slow  # gloo processes
def test_bench_quick_runs():
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    out = subprocess.run([sys.executable, os.path.join(REPO, "bench", "bench_dcp.py"), "--quick"], capture_output=True,
                         text=True, timeout=240, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    for word in ("save", "load", "async_save stall"):
        assert word in out.stdout, out.stdout


if __name__ == "__main__":
    worker(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5])
    _ranks.exit_now()
