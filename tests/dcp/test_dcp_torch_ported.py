"""PyTorch's own DCP test scenarios for the file-system storage layer, run against TensorListWriter/Reader.

Origin: the scenarios of PyTorch's ``test/distributed/checkpoint/`` (https://github.com/pytorch/pytorch,
BSD-3-Clause license, Copyright (c) Meta Platforms, Inc. and affiliates and the PyTorch contributors):
``test_file_system_checkpoint_cpu.py``, ``test_file_system_checkpoint.py``, ``e2e/test_e2e_save_and_load.py``,
``test_format_utils.py``, ``test_dtensor_resharding.py``, ``test_async_process_based_checkpoint_save.py`` and
``test_compatibility.py``. Each scenario is re-written here for pytest, CPU and gloo, with
``FileSystemWriter``/``FileSystemReader`` replaced by ``TensorListWriter``/``TensorListReader`` (and
``checkpoint_id=`` by those storage objects); what each checks is what the original checks. The test ids
name the original (``<file>::<test>``).

Run here: in one process, the module/tensor/blob round trips, the dtype casting rules (narrowing refused by a
strict planner: torch's ``allow_unsafe_types=False`` where it has the keyword, else its rule ported, as torch
2.13 has none), stateful and non-stateful loads, an empty state dict without a process group, the e2e train
state (its ``losses`` an ``io.BytesIO``), async save on a thread (cached staging, DefaultStager), the metadata's
``storage_meta``, loading without a template (``dcp_to_torch_save``'s way) and saving a torch.save file
(``torch_save_to_dcp``'s way), overwrite=False in DCP's words. On 2 gloo ranks (slow, one launch): DTensor
resharding 1-D <-> 1-D and 2-D (a (2, 1) mesh) <-> 2-D, 1-D <-> 2-D; e2e DDP and FSDP2 (model, optimizer,
stateful objects, train state; one more step equal); partial loads; async save with
``AsyncCheckpointerType.PROCESS``; bytes values; replicated <-> sharded switches.

Not run, and why:
- FileSystemWriter's ``_extensions`` (Rot13, ZStandard stream transforms): tensorlist has no stream extensions;
  the same tensor-and-blob scenario runs without one.
- ``ShardedTensor`` scenarios (``test_read_write_shard_tensor``, ``test_load_with_different_shard_plan``,
  ``test_load_rowwise_to_colwise``, ``test_switch_between_sharded_tensor_to_tensor``): ShardedTensor is
  deprecated in favour of DTensor, and its state dict hooks need RPC-free process groups that this suite does
  not start; the same resharding and sharded <-> plain switches run with DTensors.
- HSDP and FSDP1 (``FullyShardedDataParallel``) e2e variants and ``compile=True``: HSDP needs a 2 x 2 mesh (4
  ranks: too slow on CI's CPUs), FSDP1 on CPU is not supported by this torch, and torch.compile needs a C++
  toolchain per process (minutes); DDP and FSDP2 (``fully_shard``) run.
- ``BroadcastingTorchSaveReader``/``DynamicMetaLoadPlanner`` (test_format_utils): a reader of torch.save
  files, not of the file-system layer; ``dcp_to_torch_save``/``torch_save_to_dcp`` run with tensorlist's storage.
- ``test_sharded_tensor_dependency`` (patches the legacy ShardedTensor ``TensorProperties`` into DCP's
  metadata module): tensorlist's metadata is JSON, with no pickled class to be compatible with.
"""
import dataclasses
import inspect
import io
import os
import sys
import warnings

import pytest

torch = pytest.importorskip("torch", reason="DCP's scenarios need torch")
import torch.distributed as dist  # noqa: E402
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner  # noqa: E402
from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: E402
from torch.distributed.checkpoint.stateful import Stateful  # noqa: E402

from tensorlist.dcp import TensorListReader, TensorListWriter, read_full  # noqa: E402

import _ranks  # noqa: E402
from _paths import SUPPORT  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


class Tiny(torch.nn.Module):
    """The originals' MyTestModule."""

    def __init__(self):
        super().__init__()
        self.linear_1 = torch.nn.Linear(5, 5)
        self.linear_2 = torch.nn.Linear(5, 1)
        self.emb = torch.nn.EmbeddingBag(5, 10)


def tiny_module():
    return Tiny()


def same_state(a, b):
    assert set(a) == set(b)
    for k, v in a.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, b[k]), k
        else:
            assert v == b[k], k


class Blob(Stateful):
    """A stateful holder of raw bytes (the original's BlobState)."""

    def __init__(self, value: bytes):
        self.state = {"blob": value}

    def state_dict(self):
        return self.state

    def load_state_dict(self, state_dict):
        self.state = state_dict

    def __eq__(self, other):
        return isinstance(other, Blob) and self.state == other.state


@dataclasses.dataclass
class TrainState(Stateful):
    """The e2e test's train state: ``losses`` travels as an io.BytesIO of its torch.save."""

    step: int = 0
    current_loss: float = -1.0
    losses: list = dataclasses.field(default_factory=list)

    def state_dict(self):
        buf = io.BytesIO()
        torch.save(self.losses, buf)
        return {"step": torch.tensor(self.step, dtype=torch.int32),
                "current_loss": torch.tensor(self.current_loss, dtype=torch.float32), "losses": buf}

    def load_state_dict(self, state_dict):
        self.step = state_dict["step"].item()
        self.current_loss = state_dict["current_loss"].item()
        state_dict["losses"].seek(0)
        self.losses = torch.load(state_dict["losses"])


class Data(Stateful):
    """The e2e test's arbitrary stateful object."""

    def __init__(self):
        self.data = torch.rand(10, 10)

    def state_dict(self):
        return {"data": self.data}

    def load_state_dict(self, state_dict):
        self.data = state_dict["data"]


def dummy_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 8))


def train(model, optim, steps):
    torch.manual_seed(0)
    state = TrainState()
    loss = None
    for _ in range(steps):
        loss = model(torch.rand(8, 8)).sum()
        loss.backward()
        state.step += 1
        state.current_loss = float(torch.rand(1))
        state.losses.append(state.current_loss)
        optim.step()
        optim.zero_grad()
    return loss, state


# --- test_file_system_checkpoint_cpu.py --------------------------------------------------------------------

@pytest.mark.parametrize("threads", [1, 2])
def test_file_system_checkpoint_cpu__test_read_write_only_tensor(tmp_path, threads):
    saved = tiny_module().state_dict()
    dcp.save(saved, storage_writer=TensorListWriter(tmp_path, threads=threads), no_dist=True)
    into = tiny_module().state_dict()
    with pytest.raises(AssertionError):
        same_state(into, saved)
    dcp.load(into, storage_reader=TensorListReader(tmp_path), no_dist=True)
    same_state(into, saved)


def test_file_system_checkpoint_cpu__test_dtype_mismatch_casting(tmp_path):
    dcp.save({"w": torch.rand(4, 3)}, storage_writer=TensorListWriter(tmp_path / "fp32"))
    narrow = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    dcp.load(narrow, storage_reader=TensorListReader(tmp_path / "fp32"))  # the default casts silently
    assert narrow["w"].dtype == torch.bfloat16 and narrow["w"].abs().sum() > 0
    assert torch.equal(narrow["w"], torch.from_numpy(read_full(tmp_path / "fp32")["w"]).bfloat16())


class NoNarrowingLoadPlanner(DefaultLoadPlanner):
    """Newer torch's ``DefaultLoadPlanner(allow_unsafe_types=False)``, for a torch without that keyword.

    The keyword is newer than torch 2.13 (CI's), whose planner casts every dtype silently; its rule, ported:
    a load whose template dtype cannot hold the saved one (``promote_types(saved, template) != template``) is
    refused while planning, from the dtype the storage reader's metadata reports, and a widening is allowed.
    """

    def create_local_plan(self):
        for fqn, obj in self.state_dict.items():
            md = self.metadata.state_dict_metadata.get(fqn)
            if isinstance(obj, torch.Tensor) and isinstance(md, TensorStorageMetadata):
                saved = md.properties.dtype
                if saved != obj.dtype and torch.promote_types(saved, obj.dtype) != obj.dtype:
                    raise RuntimeError(f"dtype mismatch for {fqn!r}: the checkpoint holds {saved}, the state dict "
                                       f"{obj.dtype}. Silent casting is not allowed (allow_unsafe_types=False)")
        return super().create_local_plan()


def strict_load_planner():
    """torch's own strict planner where it has one, else the port of its rule (this torch's is never skipped)."""
    if "allow_unsafe_types" in inspect.signature(DefaultLoadPlanner.__init__).parameters:
        return DefaultLoadPlanner(allow_unsafe_types=False)
    return NoNarrowingLoadPlanner()


def test_file_system_checkpoint_cpu__test_dtype_mismatch_casting_strict(tmp_path):
    saved = torch.rand(4, 3)
    dcp.save({"w": saved}, storage_writer=TensorListWriter(tmp_path / "fp32"))
    saved_md = TensorListReader(tmp_path / "fp32").read_metadata().state_dict_metadata["w"]
    assert saved_md.properties.dtype == torch.float32  # what the strict planner compares
    with pytest.raises(BaseException, match="dtype mismatch") as e:  # DCP's CheckpointException
        dcp.load({"w": torch.zeros(4, 3, dtype=torch.bfloat16)}, storage_reader=TensorListReader(tmp_path / "fp32"),
                 planner=strict_load_planner())
    assert "Silent casting is not allowed" in str(e.value)
    narrow = torch.rand(4, 3).bfloat16()
    dcp.save({"w": narrow}, storage_writer=TensorListWriter(tmp_path / "bf16"))
    assert TensorListReader(tmp_path / "bf16").read_metadata().state_dict_metadata["w"].properties.dtype == \
        torch.bfloat16
    wide = {"w": torch.zeros(4, 3)}
    dcp.load(wide, storage_reader=TensorListReader(tmp_path / "bf16"), planner=strict_load_planner())
    assert wide["w"].dtype == torch.float32 and torch.equal(wide["w"], narrow.float())


@pytest.mark.parametrize("threads", [1, 2])
def test_file_system_checkpoint_cpu__test_read_write_tensor_and_blob(tmp_path, threads):
    saved = tiny_module().state_dict()
    saved["test_blob"] = Blob(b"SomeBlobForTesting")
    dcp.save(saved, storage_writer=TensorListWriter(tmp_path, threads=threads))
    into = tiny_module().state_dict()
    into["test_blob"] = Blob(b"")
    with pytest.raises(AssertionError):
        same_state(into, saved)
    dcp.load(into, storage_reader=TensorListReader(tmp_path))
    same_state(into, saved)
    assert read_full(tmp_path)["test_blob.blob"] == b"SomeBlobForTesting"  # stored as bytes, no pickle


# --- test_file_system_checkpoint.py / the writer's contract ------------------------------------------------

def test_file_system_checkpoint__overwrite_false_refuses_in_dcps_words(tmp_path):
    dcp.save({"a": torch.ones(2)}, storage_writer=TensorListWriter(tmp_path))
    with pytest.raises(BaseException, match="Checkpoint already exists"):
        dcp.save({"a": torch.ones(2)}, storage_writer=TensorListWriter(tmp_path, overwrite=False))


# --- e2e/test_e2e_save_and_load.py (one process) -----------------------------------------------------------

def test_e2e_save_and_load__test_stateful_and_non_stateful_loads(tmp_path):
    class Tracking(dict):
        def __init__(self):
            super().__init__()
            self.set_called = False

        def __setitem__(self, k, v):
            self.set_called = True
            super().__setitem__(k, v)

    class Foo(Stateful):
        def __init__(self):
            self.loaded = False

        def state_dict(self):
            return {}

        def load_state_dict(self, state_dict):
            self.loaded = True

    foo, sd = Foo(), Tracking()
    sd["foo"] = foo
    sd.set_called = False
    dcp.save(sd, storage_writer=TensorListWriter(tmp_path))
    dcp.load(sd, storage_reader=TensorListReader(tmp_path))
    assert foo.loaded and not sd.set_called  # loaded in place
    sd = Tracking()
    sd["foo"] = {"replicated": torch.rand(10, 10), "bytes": [1, 2, 3, 4]}
    sd.set_called = False
    dcp.save(sd, storage_writer=TensorListWriter(tmp_path))
    dcp.load(sd, storage_reader=TensorListReader(tmp_path))
    assert sd.set_called  # replaced by the loaded state dict


def test_e2e_save_and_load__test_no_dist(tmp_path):
    dcp.save({}, storage_writer=TensorListWriter(tmp_path))
    dcp.load({}, storage_reader=TensorListReader(tmp_path))


def _e2e_round_trip(path, save):
    model, optim = dummy_model(), None
    optim = torch.optim.Adam(model.parameters(), lr=0.1)
    _, state = train(model, optim, 2)
    obj = Data()
    save({"model": model, "optimizer": optim, "s": obj, "train_state": state})
    model2 = dummy_model()
    optim2 = torch.optim.Adam(model2.parameters(), lr=0.1)
    obj2, state2 = Data(), TrainState()
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    msd, osd = get_state_dict(model2, optim2)
    sd = {"model": msd, "optimizer": osd, "s": obj2, "train_state": state2}
    dcp.load(sd, storage_reader=TensorListReader(path))
    set_state_dict(model2, optim2, model_state_dict=sd["model"], optim_state_dict=sd["optimizer"])
    assert torch.equal(obj.data, obj2.data) and state == state2
    loss, _ = train(model, optim, 1)
    loss2, _ = train(model2, optim2, 1)
    assert torch.equal(loss, loss2)


def test_e2e_save_and_load__test_e2e_none_model_type(tmp_path):
    def save(sd):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(sd["model"], sd["optimizer"])
        dcp.save({**sd, "model": msd, "optimizer": osd}, storage_writer=TensorListWriter(tmp_path))
    _e2e_round_trip(tmp_path, save)


@pytest.mark.parametrize("cached", [True, False])
def test_e2e_save_and_load__test_e2e_async_cached_thread(tmp_path, cached):
    def save(sd):
        from torch.distributed.checkpoint.state_dict import get_state_dict
        msd, osd = get_state_dict(sd["model"], sd["optimizer"])
        writer = TensorListWriter(tmp_path, cache_staged_state_dict=cached)
        kwargs = {}
        if not cached and hasattr(dcp.staging, "DefaultStager"):
            kwargs["async_stager"] = dcp.staging.DefaultStager(dcp.staging.StagingOptions(False, False, False, False))
        out = dcp.async_save({**sd, "model": msd, "optimizer": osd}, storage_writer=writer, **kwargs)
        (getattr(out, "upload_completion", None) or out).result(timeout=60)
        if "async_stager" in kwargs:
            kwargs["async_stager"].close()
    _e2e_round_trip(tmp_path, save)


# --- test_compatibility.py ----------------------------------------------------------------------------------

def test_compatibility__test_storage_meta(tmp_path):
    writer = TensorListWriter(tmp_path)
    dcp.save({"a": torch.zeros(4, 4)}, storage_writer=writer)
    reader = TensorListReader(tmp_path)
    meta = reader.read_metadata().storage_meta
    assert meta is not None and str(meta.checkpoint_id) == str(tmp_path)
    assert meta.save_id == writer.save_id and meta.load_id == reader.load_id


def test_compatibility__test_metadata_defaults():
    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                       MetadataIndex, TensorProperties, TensorStorageMetadata)
    t = torch.zeros(4, 4)
    chunk = ChunkStorageMetadata(torch.Size((1, 1)), torch.Size((1, 1)))
    tmeta = TensorStorageMetadata(properties=TensorProperties.create_from_tensor(t), size=t.size(), chunks=[chunk])
    Metadata(state_dict_metadata={"a": tmeta, "b": BytesStorageMetadata()})
    MetadataIndex(fqn="a.b.c")


# --- test_format_utils.py -----------------------------------------------------------------------------------

def test_format_utils__test_dcp_to_torch_save(tmp_path):
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict
    model = dummy_model()
    dcp.save({"model": model.state_dict(), "step": 3}, storage_writer=TensorListWriter(tmp_path / "dcp"))
    sd = {}
    _load_state_dict(sd, storage_reader=TensorListReader(tmp_path / "dcp"), planner=_EmptyStateDictLoadPlanner(),
                     no_dist=True)
    torch.save(sd, tmp_path / "model.pt")
    back = torch.load(tmp_path / "model.pt", weights_only=True)
    assert back["step"] == 3
    same_state(back["model"], model.state_dict())


def test_format_utils__test_torch_save_to_dcp(tmp_path):
    model = dummy_model()
    torch.save({"model": model.state_dict()}, tmp_path / "model.pt")
    sd = torch.load(tmp_path / "model.pt", weights_only=True)
    dcp.save(sd, storage_writer=TensorListWriter(tmp_path / "dcp"), no_dist=True)
    into = {"model": dummy_model().state_dict()}
    for v in into["model"].values():
        v.zero_()
    dcp.load(into, storage_reader=TensorListReader(tmp_path / "dcp"))
    same_state(into["model"], model.state_dict())


# --- on 2 gloo ranks: one launch runs every scenario, each reporting its own outcome -------------------------

def _dtensor_scenarios(rank, world, root):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, zeros
    one_d = [[Shard(0)], [Replicate()]]
    two_d = [[Replicate(), Replicate()], [Replicate(), Shard(0)], [Shard(0), Replicate()], [Shard(0), Shard(0)]]
    mesh1 = init_device_mesh("cpu", (world,))
    mesh2 = init_device_mesh("cpu", (2, world // 2))
    full = torch.arange(16, dtype=torch.float).view(4, 4)
    out = {}

    def reshard(name, save_mesh, save_p, load_mesh, load_p):
        path = os.path.join(root, name)
        dcp.save({"d": distribute_tensor(full, save_mesh, save_p)}, storage_writer=TensorListWriter(path))
        sd = {"d": zeros([4, 4], device_mesh=load_mesh, placements=load_p)}
        dcp.load(sd, storage_reader=TensorListReader(path))
        whole = sd["d"].redistribute(load_mesh, [Replicate()] * len(load_p)).to_local()
        assert torch.equal(whole, full), f"{save_p} -> {load_p}"

    def each(test, pairs):
        def run():
            for k, (a, b) in enumerate(pairs):
                reshard(f"{test}-{k}", *a, *b)
        out[test] = run

    each("test_dtensor_resharding::test_1d_to_1d_reshard_placement_change",
         [((mesh1, a), (mesh1, b)) for a in one_d for b in one_d if a != b])
    each("test_dtensor_resharding::test_2d_to_2d_reshard_placement_change",
         [((mesh2, a), (mesh2, b)) for a in two_d for b in two_d if a != b])
    each("test_dtensor_resharding::test_1d_to_2d_reshard_mesh_change",
         [((mesh1, a), (mesh2, b)) for a in one_d for b in two_d])
    each("test_dtensor_resharding::test_2d_to_1d_reshard_mesh_change",
         [((mesh2, a), (mesh1, b)) for a in two_d for b in one_d])
    return out


def _e2e_scenarios(rank, world, root):
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    out = {}

    def parallel(kind):
        model = dummy_model()
        if kind == "ddp":
            model = torch.nn.parallel.DistributedDataParallel(model)
        elif kind == "fsdp2":
            from torch.distributed.fsdp import fully_shard
            mesh = init_device_mesh("cpu", (world,))
            for layer in (model[0], model[2]):
                fully_shard(layer, mesh=mesh)
            fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=0.1)

    def e2e(kind, mode="sync"):
        def run():
            ref, ref_opt = dummy_model(), None
            ref_opt = torch.optim.Adam(ref.parameters(), lr=0.1)
            train(ref, ref_opt, 2)
            model, optim = parallel(kind)
            _, state = train(model, optim, 2)
            obj = Data()
            msd, osd = get_state_dict(model, optim)
            sd = {"model": msd, "optimizer": osd, "s": obj, "train_state": state}
            path = os.path.join(root, f"e2e-{kind}-{mode}")
            if mode == "process":
                from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
                from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType
                stager = DefaultStager(StagingOptions(False, True, False, False))
                r = dcp.async_save(sd, storage_writer=TensorListWriter(path), async_stager=stager,
                                   async_checkpointer_type=AsyncCheckpointerType.PROCESS)
                (getattr(r, "upload_completion", None) or r).result(timeout=120)
                stager.close()
            else:
                dcp.save(sd, storage_writer=TensorListWriter(path))
            model2, optim2 = parallel(kind)
            msd2, osd2 = get_state_dict(model2, optim2)
            obj2, state2 = Data(), TrainState()
            sd2 = {"model": msd2, "optimizer": osd2, "s": obj2, "train_state": state2}
            dcp.load(sd2, storage_reader=TensorListReader(path))
            set_state_dict(model2, optim2, model_state_dict=sd2["model"], optim_state_dict=sd2["optimizer"])
            assert torch.equal(obj.data, obj2.data) and state == state2, (state, state2)
            loss, _ = train(ref, ref_opt, 1)
            loss2, _ = train(model2, optim2, 1)
            loss2 = loss2.full_tensor() if hasattr(loss2, "full_tensor") else loss2
            assert torch.allclose(loss, loss2), (loss, loss2)
        return run

    out["e2e/test_e2e_save_and_load::test_e2e[DDP]"] = e2e("ddp")
    out["e2e/test_e2e_save_and_load::test_e2e[FSDP2]"] = e2e("fsdp2")
    out["e2e/test_e2e_save_and_load::test_e2e_async_cached[PROCESS]"] = e2e("fsdp2", "process")

    def partial_load():
        model, optim = parallel("fsdp2")
        train(model, optim, 2)
        msd, osd = get_state_dict(model, optim)
        path = os.path.join(root, "partial")
        dcp.save({"model": msd, "optimizer": osd}, storage_writer=TensorListWriter(path))
        model2, _ = parallel("fsdp2")
        msd2, _ = get_state_dict(model2, torch.optim.Adam(model2.parameters()))
        dcp.load({"model": msd2}, storage_reader=TensorListReader(path))
        for k in msd:
            assert torch.equal(msd[k].full_tensor(), msd2[k].full_tensor()), k
    out["e2e/test_e2e_save_and_load::test_partial_load"] = partial_load

    def save_load_bytes():
        path = os.path.join(root, "bytes")
        dcp.save({"bytes0": [1], "bytes1": "string", "raw": b"\x00\xff"}, storage_writer=TensorListWriter(path))
        sd = {"bytes0": [2], "bytes1": "other", "raw": b""}
        dcp.load(sd, storage_reader=TensorListReader(path))
        assert sd == {"bytes0": [1], "bytes1": "string", "raw": b"\x00\xff"}, sd
    out["test_file_system_checkpoint_cpu::test_save_load_bytes"] = save_load_bytes

    def switch():
        from torch.distributed.tensor import Shard, distribute_tensor, zeros
        mesh = init_device_mesh("cpu", (world,))
        torch.manual_seed(1)
        sharded_full, replicated = torch.rand(32), torch.rand(32)
        path = os.path.join(root, "switch")
        dcp.save({"sharded": distribute_tensor(sharded_full, mesh, [Shard(0)]), "replicated": replicated},
                 storage_writer=TensorListWriter(path))
        sd = {"sharded": torch.zeros(32), "replicated": zeros([32], device_mesh=mesh, placements=[Shard(0)])}
        dcp.load(sd, storage_reader=TensorListReader(path))
        assert torch.equal(sd["sharded"], sharded_full) and torch.equal(sd["replicated"].full_tensor(), replicated)
    out["test_file_system_checkpoint_cpu::test_switch_between_sharded_tensor_to_tensor[DTensor]"] = switch
    return out


def _worker(rank, world, port, root):
    import traceback
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    _ranks.join(rank, world, port)
    results = {}
    scenarios = {**_dtensor_scenarios(rank, world, root), **_e2e_scenarios(rank, world, root)}
    for name, fn in scenarios.items():
        try:
            fn()
            results[name] = "ok"
        except Exception:
            results[name] = traceback.format_exc()[-2000:]
        dist.barrier()
    if rank == 0:
        import json
        with open(os.path.join(root, "results.json"), "w") as f:
            json.dump(results, f)
    dist.barrier()
    dist.destroy_process_group()


MULTI_RANK = [
    "test_dtensor_resharding::test_1d_to_1d_reshard_placement_change",
    "test_dtensor_resharding::test_2d_to_2d_reshard_placement_change",
    "test_dtensor_resharding::test_1d_to_2d_reshard_mesh_change",
    "test_dtensor_resharding::test_2d_to_1d_reshard_mesh_change",
    "e2e/test_e2e_save_and_load::test_e2e[DDP]",
    "e2e/test_e2e_save_and_load::test_e2e[FSDP2]",
    "e2e/test_e2e_save_and_load::test_e2e_async_cached[PROCESS]",
    "e2e/test_e2e_save_and_load::test_partial_load",
    "test_file_system_checkpoint_cpu::test_save_load_bytes",
    "test_file_system_checkpoint_cpu::test_switch_between_sharded_tensor_to_tensor[DTensor]",
]


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    """Every multi-rank scenario, run once on 2 gloo ranks: scenario -> "ok" or its traceback."""
    import json
    root = str(tmp_path_factory.mktemp("ported"))
    with _ranks.Launch(2) as job:
        path = [SUPPORT, os.path.dirname(os.path.abspath(__file__))]  # its helpers, and this module itself
        script = [sys.executable, "-c", f"import sys; sys.path[:0] = {path!r}; "
                  "import test_dcp_torch_ported as t; t._worker(int(sys.argv[1]), 2, int(sys.argv[2]), sys.argv[3])"]
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
        for r in range(2):
            job.spawn(script + [str(r), str(job.port), root], env)
        codes = job.wait(240)
        assert codes == [0, 0], f"ranks ended with {codes}:\n{job.output(0)[-3000:]}\n{job.output(1)[-3000:]}"
    with open(os.path.join(root, "results.json")) as f:
        return json.load(f)


def _has_process_checkpointer() -> bool:
    """torch's DefaultStager and AsyncCheckpointerType.PROCESS (torch >= 2.9; 2.8, the floor, has neither)."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: F401
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("scenario", MULTI_RANK)
def test_on_two_gloo_ranks(two_ranks, scenario):
    if "[PROCESS]" in scenario and not _has_process_checkpointer():
        pytest.skip(f"torch {torch.__version__} has no DefaultStager / AsyncCheckpointerType.PROCESS (torch 2.9 does)")
    assert two_ranks[scenario] == "ok", two_ranks[scenario]
