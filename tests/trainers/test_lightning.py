"""tensorlist.lightning: Lightning checkpoints as tensorlist documents, sharded strategies, the training record.

The fast tests drive the checkpoint IO directly (round trips, refusals, faults, AsyncCheckpointIO); the slow
ones run real ``Trainer.fit`` on CPU (tests/support/_lightning_script.py): one process in this one, two processes
(DDP, ModelParallel with FSDP2 on gloo) as scripts, each with a hard timeout. Resumes are compared with
uninterrupted runs loss by loss, exactly.
"""
import json
import math
import os
import pathlib
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="tensorlist.lightning needs torch (pip install 'tensorlist[torch]')")
pytest.importorskip("lightning", reason="tensorlist.lightning needs lightning (pip install lightning)")

import tensorlist as tl  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402
from tensorlist.lightning._pending import PendingSaves  # noqa: E402
from tensorlist.lightning import (META_NAME, TensorListCheckpointIO, TensorListFSDPStrategy,  # noqa: E402
                                  TensorListModelParallelStrategy, convert_checkpoint)
from tensorlist.provenance.record import read_training_record, weights_sha256  # noqa: E402
from _paths import SUPPORT  # noqa: E402

HERE = SUPPORT
SCRIPT = os.path.join(HERE, "_lightning_script.py")
#: A two-process run takes about 10 s on a shared 2-core machine.
PROCESS_TIMEOUT_S = 180


def _checkpoint():
    """A checkpoint shaped like Lightning's, with the values JSON lacks."""
    return {
        "epoch": 1, "global_step": 8, "pytorch-lightning_version": "2.6.6",
        "state_dict": {"net.0.weight": torch.randn(4, 4), "net.0.bias": torch.zeros(4, dtype=torch.bfloat16)},
        "optimizer_states": [{"state": {0: {"step": torch.tensor(8.0), "exp_avg": torch.ones(4, 4)}},
                              "param_groups": [{"lr": 0.05, "betas": (0.9, 0.99), "params": [0], "foreach": None}]}],
        "lr_schedulers": [{"best": float("inf"), "_last_lr": [0.025]}],
        "loops": {"fit_loop": {"mixed": [torch.arange(3), "text", {"__tensor__": "a caller's dict"}]}},
        "blob": b"\x00raw\xff", "array": np.arange(3, dtype=np.int16), "empty": {},
    }


def _same(a, b):
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and np.array_equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and math.isinf(a):
        return a == b
    return type(a) is type(b) and a == b


def test_round_trip_keeps_every_value(tmp_path):
    ckpt, path = _checkpoint(), tmp_path / "epoch=1-step=8.ckpt"
    io = TensorListCheckpointIO()
    io.save_checkpoint(ckpt, path)
    loaded = io.load_checkpoint(path)
    assert read_training_record(loaded.pop("training"))["solver"]["solver_params"]["global_step"] == 8
    assert loaded.pop("dataset_params") == {"name": None}  # the record the plugin adds, nothing else
    assert _same(loaded, ckpt)
    doc = json.loads(path.read_text())
    assert "tensors" in doc["state_dict"]  # a TensorList in place: tensorlist.load(path, pointer="/state_dict")
    assert set(tl.load(path, pointer="/state_dict")) == {"net.0.weight", "net.0.bias"}


def test_map_location_and_private_memory(tmp_path):
    path = tmp_path / "c.ckpt"
    TensorListCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(3)}}, path)
    w = TensorListCheckpointIO().load_checkpoint(path, map_location="cpu")["state_dict"]["w"]
    w += 1  # the optimizer updates loaded state in place: the tensors are not views of the file
    assert TensorListCheckpointIO().load_checkpoint(path)["state_dict"]["w"].tolist() == [1.0, 1.0, 1.0]


def test_value_json_cannot_hold_is_refused_naming_its_key(tmp_path):
    ckpt = {"hyper_parameters": {"data": {"root": pathlib.Path("runs")}}}
    with pytest.raises(TypeError, match=r"checkpoint\.hyper_parameters\.data\.root: a PosixPath .*encode="):
        TensorListCheckpointIO().save_checkpoint(ckpt, tmp_path / "c.ckpt")
    assert not os.listdir(tmp_path)  # refused before anything is written
    TensorListCheckpointIO(encode=str).save_checkpoint(ckpt, tmp_path / "c.ckpt")
    assert TensorListCheckpointIO().load_checkpoint(tmp_path / "c.ckpt") == {"hyper_parameters": {"data": {"root": "runs"}}}


def test_pickle_only_when_both_sides_opt_in(tmp_path):
    path = tmp_path / "c.ckpt"
    TensorListCheckpointIO(allow_pickle=True).save_checkpoint({"dtype": torch.float16}, path)
    with pytest.raises(FormatError, match=r"c\.ckpt.*holds a pickle.*allow_pickle=True"):
        TensorListCheckpointIO().load_checkpoint(path)
    assert TensorListCheckpointIO(allow_pickle=True).load_checkpoint(path) == {"dtype": torch.float16}


@pytest.mark.parametrize("zipped", [True, False], ids=["zip", "legacy"])
def test_stock_pickle_checkpoint_refused_with_the_conversion(tmp_path, zipped):
    src = tmp_path / "stock.ckpt"
    ckpt = {"epoch": 0, "state_dict": {"w": torch.ones(2)}, "betas": (0.9, 0.99)}
    torch.save(ckpt, src, _use_new_zipfile_serialization=zipped)
    with pytest.raises(FormatError, match=r"stock\.ckpt.*torch pickle.*convert_checkpoint\(src, dst\)"):
        TensorListCheckpointIO().load_checkpoint(src)
    convert_checkpoint(src, tmp_path / "converted.ckpt")
    assert _same(TensorListCheckpointIO().load_checkpoint(tmp_path / "converted.ckpt"), ckpt)


def test_truncated_or_lying_checkpoint_names_the_file(tmp_path):
    path = tmp_path / "c.ckpt"
    TensorListCheckpointIO().save_checkpoint({"state_dict": {"w": torch.ones(256)}}, path)
    doc = json.loads(path.read_text())
    data = tmp_path / doc["state_dict"]["location"]
    full = data.read_bytes()
    data.write_bytes(full[:100])
    with pytest.raises(FormatError, match=r"c\.ckpt"):
        TensorListCheckpointIO().load_checkpoint(path)
    data.write_bytes(full)
    doc["state_dict"]["tensors"][0]["dims"] = [512]  # the descriptor lies about the tensor's size
    path.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"c\.ckpt"):
        TensorListCheckpointIO().load_checkpoint(path)
    path.write_text('{"state_dict": {"__tensor__": {"0": 1}}}')
    with pytest.raises(FormatError, match=r"c\.ckpt.*__tensor__ value must be a TensorList"):
        TensorListCheckpointIO().load_checkpoint(path)
    path.write_text('{"epoch": {"__float__": [1]}}')  # a tag no writer makes
    with pytest.raises(FormatError, match=r"c\.ckpt.*tagged JSON value that does not read back"):
        TensorListCheckpointIO().load_checkpoint(path)


def test_crash_mid_save_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    import tensorlist._storage.commit as commit

    path = tmp_path / "last.ckpt"
    io = TensorListCheckpointIO()
    io.save_checkpoint({"epoch": 0, "state_dict": {"w": torch.zeros(8)}}, path)
    before = sorted(os.listdir(tmp_path))

    def killed(self, *args, **kwargs):
        raise OSError("killed before the descriptor's rename")

    monkeypatch.setattr(commit.Commit, "commit", killed)
    with pytest.raises(OSError, match="killed"):
        io.save_checkpoint({"epoch": 1, "state_dict": {"w": torch.ones(8)}}, path)
    monkeypatch.undo()
    assert sorted(os.listdir(tmp_path)) == before
    assert io.load_checkpoint(path)["epoch"] == 0


def test_remove_checkpoint_takes_its_data_file_only(tmp_path):
    io = TensorListCheckpointIO()
    for name in ("a.ckpt", "b.ckpt"):
        io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / name)
    io.remove_checkpoint(tmp_path / "a.ckpt")
    assert [n for n in os.listdir(tmp_path) if n.startswith("a.ckpt")] == []
    assert io.load_checkpoint(tmp_path / "b.ckpt")["state_dict"]["w"].tolist() == [1.0, 1.0]
    io.remove_checkpoint(tmp_path / "a.ckpt")  # gone already: nothing to do


def test_async_checkpoint_io_wraps_it(tmp_path):
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    io = AsyncCheckpointIO(TensorListCheckpointIO())
    w = torch.ones(4)
    io.save_checkpoint({"state_dict": {"w": w}}, tmp_path / "c.ckpt")
    w += 1  # after the call returns: the save holds its own copy
    io.teardown()
    assert io.load_checkpoint(tmp_path / "c.ckpt")["state_dict"]["w"].tolist() == [1.0] * 4


# --------------------------------------------------------------------------
# a removal wins over a pending save of its path, whichever async wrapper runs the saves

#: Seconds any one step of these tests may wait for another thread before it fails (never reached when right).
_WAIT_S = 30


class _Gate:
    """Holds the save of one checkpoint name inside TensorListCheckpointIO (in flight) until released."""

    def __init__(self, name: str) -> None:
        self.name, self.started, self.release = name, threading.Event(), threading.Event()
        self.written: list = []  # the names whose document was written, in order

    def install(self, monkeypatch) -> None:
        import tensorlist.lightning as tll

        write = tll._save_document

        def held(path, *args, **kwargs):
            if os.path.basename(path) == self.name:
                self.started.set()
                assert self.release.wait(_WAIT_S), "the test never released the held save"
            self.written.append(os.path.basename(path))
            return write(path, *args, **kwargs)

        monkeypatch.setattr(tll, "_save_document", held)


class _Driver:
    """One way of running TensorListCheckpointIO's saves off the caller's thread: save, remove, drain."""

    def __init__(self, kind: str, io: TensorListCheckpointIO) -> None:
        from lightning.pytorch.plugins.io import AsyncCheckpointIO

        from tensorlist.lightning import TensorListAsyncCheckpointIO

        self.kind, self.plugin = kind, io
        self._pool = ThreadPoolExecutor(max_workers=1) if kind == "thread_pool" else None
        self.io = {"AsyncCheckpointIO": AsyncCheckpointIO, "TensorListAsyncCheckpointIO": TensorListAsyncCheckpointIO,
                   "thread_pool": lambda plugin: plugin}[kind](io)
        self._futures: list = []

    def save(self, checkpoint, path) -> None:
        if self._pool is None:
            self.io.save_checkpoint(checkpoint, path)
        else:  # a caller's own worker: the saves in order on one thread, the removals on the caller's
            self._futures.append(self._pool.submit(self.plugin.save_checkpoint, checkpoint, path))

    def remove(self, path) -> None:
        self.io.remove_checkpoint(path)

    def drain(self) -> None:
        if self._pool is None:
            self.io.teardown()  # AsyncCheckpointIO: waits for the queue, raises a save's error
            return
        self._pool.shutdown(wait=True)
        for f in self._futures:
            f.result()


def _names(path):
    return sorted(os.listdir(path))


def _state(value: float):
    return {"state_dict": {"w": torch.full((4,), value)}}


@pytest.fixture(params=["AsyncCheckpointIO", "TensorListAsyncCheckpointIO", "thread_pool"])
def driver(request):
    made = _Driver(request.param, TensorListCheckpointIO())
    yield made
    made.drain()


class TestRemovalWinsOverPendingSave:
    """ModelCheckpoint's top-k removal of a checkpoint whose save is pending, on every way of saving asynchronously.

    Lightning's AsyncCheckpointIO removes on the caller's thread while the save runs or waits on the worker;
    TensorListAsyncCheckpointIO queues the removal behind it; a caller's own thread pool is Lightning's case by
    hand. In each the removal must win, and a save requested after a removal must stay.
    """

    def test_removal_while_the_save_runs(self, driver, tmp_path, monkeypatch):
        gate = _Gate("a.ckpt")
        gate.install(monkeypatch)
        driver.save(_state(1.0), tmp_path / "a.ckpt")
        assert gate.started.wait(_WAIT_S)
        driver.remove(tmp_path / "a.ckpt")  # returns at once: the running save removes what it writes
        gate.release.set()
        driver.drain()
        assert _names(tmp_path) == []  # no checkpoint, no data file, nothing swept later

    def test_removal_while_the_save_is_queued(self, driver, tmp_path, monkeypatch):
        gate = _Gate("a.ckpt")
        gate.install(monkeypatch)
        driver.save(_state(1.0), tmp_path / "a.ckpt")
        assert gate.started.wait(_WAIT_S)
        driver.save(_state(2.0), tmp_path / "b.ckpt")  # queued behind a.ckpt's
        remover = ThreadPoolExecutor(max_workers=1)  # the caller may be held until b.ckpt's save begins
        removed = remover.submit(driver.remove, tmp_path / "b.ckpt")
        gate.release.set()
        removed.result(timeout=_WAIT_S)
        remover.shutdown()
        driver.drain()
        assert [n for n in _names(tmp_path) if not n.startswith("a.ckpt.")] == ["a.ckpt"]
        assert TensorListCheckpointIO().load_checkpoint(tmp_path / "a.ckpt")["state_dict"]["w"].tolist() == [1.0] * 4
        if driver.kind != "TensorListAsyncCheckpointIO":  # that wrapper writes it, then removes it in order
            assert gate.written == ["a.ckpt"]  # b.ckpt's queued save was skipped, not written and removed

    def test_save_requested_after_a_removal_stays(self, driver, tmp_path, monkeypatch):
        monkeypatch.setattr(PendingSaves, "handover_s", 0.2)  # the hold for a path that is not queued: shorter
        gate = _Gate("a.ckpt")
        gate.install(monkeypatch)
        driver.remove(tmp_path / "b.ckpt")  # nothing saved or pending: nothing to do
        driver.save(_state(1.0), tmp_path / "a.ckpt")
        assert gate.started.wait(_WAIT_S)
        remover = ThreadPoolExecutor(max_workers=1)
        removed = remover.submit(driver.remove, tmp_path / "b.ckpt")  # while a save runs: b.ckpt may be queued
        gate.release.set()
        removed.result(timeout=_WAIT_S)
        remover.shutdown()
        driver.save(_state(2.0), tmp_path / "b.ckpt")  # requested after both removals
        driver.drain()
        assert TensorListCheckpointIO().load_checkpoint(tmp_path / "b.ckpt")["state_dict"]["w"].tolist() == [2.0] * 4
        assert gate.written == ["a.ckpt", "b.ckpt"]

    def test_removal_after_the_save_ended(self, driver, tmp_path):
        driver.save(_state(1.0), tmp_path / "a.ckpt")
        driver.save(_state(2.0), tmp_path / "b.ckpt")
        driver.drain()
        driver.remove(tmp_path / "a.ckpt")
        if driver.kind == "TensorListAsyncCheckpointIO":
            driver.drain()  # its removal runs on the worker
        assert [n for n in _names(tmp_path) if not n.startswith("b.ckpt.")] == ["b.ckpt"]


def test_removal_while_a_signed_save_runs_takes_its_signature(tmp_path, monkeypatch):
    """The running save's signature is written after its document: the removal it defers takes that too."""
    from cryptography.hazmat.primitives.asymmetric import ec

    gate = _Gate("a.ckpt")
    gate.install(monkeypatch)
    driver = _Driver("AsyncCheckpointIO", TensorListCheckpointIO(signing_key=ec.generate_private_key(ec.SECP256R1())))
    driver.save(_state(1.0), tmp_path / "a.ckpt")
    assert gate.started.wait(_WAIT_S)
    driver.remove(tmp_path / "a.ckpt")
    gate.release.set()
    driver.drain()
    assert _names(tmp_path) == []


def test_the_plugin_pickles_and_copies_without_its_pending_saves(tmp_path):
    """A spawned strategy pickles its checkpoint IO: the lock of what is under way is made anew, empty."""
    import copy
    import pickle

    io = TensorListCheckpointIO(encode=str)
    for other in (pickle.loads(pickle.dumps(io)), copy.deepcopy(io)):
        assert other.encode is str and other._pending is not io._pending
        other.save_checkpoint(_state(3.0), tmp_path / "c.ckpt")
        other.remove_checkpoint(tmp_path / "c.ckpt")
        assert _names(tmp_path) == []


def test_sharded_stock_meta_pt_refused(tmp_path):
    strategy = TensorListModelParallelStrategy()
    torch.save({"epoch": 0}, tmp_path / "meta.pt")
    with pytest.raises(FormatError, match=r"stock Lightning sharded checkpoint \(meta\.pt is a pickle"):
        strategy._load_meta(tmp_path)


#: DCP in one process without a process group says so on every save and load: expected here.
ONE_PROCESS = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@ONE_PROCESS
@pytest.mark.parametrize("make", [TensorListModelParallelStrategy,
                                  lambda: TensorListFSDPStrategy(state_dict_type="sharded")],
                         ids=["model_parallel", "fsdp"])
def test_sharded_save_killed_in_place_keeps_the_previous_checkpoint(tmp_path, monkeypatch, make):
    """The save path of both strategies, in one process (FSDP1 itself needs an accelerator in torch 2.13)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from tensorlist.dcp import TensorListReader, TensorListWriter

    strategy, path = make(), tmp_path / "last.ckpt"  # one process, no process group
    key = strategy._model_key  # "state_dict" (ModelParallel) or "model" (FSDP), as Lightning names them

    def save(epoch):
        strategy.save_checkpoint({"state_dict": {"w": torch.full((2,), float(epoch))}, "optimizer_states": [],
                                  "epoch": epoch}, path)

    save(0)
    assert strategy._load_meta(path) == {"epoch": 0}  # the tensors are DCP's, not the meta's

    def killed(self, *args, **kwargs):
        raise OSError("killed before the DCP commit")

    monkeypatch.setattr(TensorListWriter, "finish", killed)
    with pytest.raises(CheckpointException, match="killed before the DCP commit"):
        save(1)  # its meta document was written, its shards too: nothing names them
    monkeypatch.undo()
    assert strategy._load_meta(path) == {"epoch": 0}
    state = {key: {"w": torch.empty(2)}}
    dcp.load(state, storage_reader=TensorListReader(path))
    assert state[key]["w"].tolist() == [0.0, 0.0]
    save(2)
    assert strategy._load_meta(path) == {"epoch": 2}
    assert TensorListCheckpointIO().load_checkpoint(path / META_NAME) == {"epoch": 2}
    assert len([n for n in os.listdir(path) if n.startswith("meta.") and n.endswith(".json")]) == 2  # + meta.json
    TensorListCheckpointIO().remove_checkpoint(path)
    assert not path.exists()


@pytest.mark.parametrize("make", [TensorListModelParallelStrategy,
                                  lambda: TensorListFSDPStrategy(state_dict_type="sharded")],
                         ids=["model_parallel", "fsdp"])
def test_a_sharded_save_records_provenance_by_itself(tmp_path, make):
    """No callback: the meta document carries the record a Lightning dict gives (weights' hash null: sharded)."""
    from tensorlist.provenance.record import read_training_record

    strategy, path = make(), tmp_path / "last.ckpt"
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.5)
    checkpoint = {"state_dict": {"w": torch.ones(2)}, "optimizer_states": [sgd.state_dict()], "epoch": 1,
                  "global_step": 6, "loops": {}}
    strategy.save_checkpoint(checkpoint, path)
    record = read_training_record(path / META_NAME)
    assert record["weights"] == {"kind": "checkpoint", "epoch": 1, "validation": None, "sha256": None}
    assert record["solver"]["solver_params"]["global_step"] == 6
    assert record["optimizer"]["parameter_groups"][0]["initial_lr"] == 0.5
    assert "training" not in checkpoint and "state_dict" in checkpoint  # the caller's dict is left as it was


@ONE_PROCESS
def test_sharded_directory_not_ours_uncommitted_or_truncated(tmp_path):
    import torch.distributed.checkpoint as dcp
    from tensorlist.dcp import TensorListWriter

    strategy = TensorListModelParallelStrategy()
    (tmp_path / "killed").mkdir()
    with pytest.raises(FormatError, match=r"killed: holds no committed save"):
        strategy._load_meta(tmp_path / "killed")
    dcp.save({"w": torch.ones(2)}, storage_writer=TensorListWriter(tmp_path / "plain"))
    with pytest.raises(FormatError, match=r"plain: is not a tensorlist Lightning checkpoint: no 'tensorlist_meta'"):
        strategy._load_meta(tmp_path / "plain")
    path = tmp_path / "ckpt"
    strategy.save_checkpoint({"state_dict": {"w": torch.ones(1024)}, "optimizer_states": [], "epoch": 0}, path)
    for name in os.listdir(path):
        if name.endswith(".data") and not name.startswith("meta"):
            (path / name).write_bytes((path / name).read_bytes()[:64])
    with pytest.raises(FormatError, match=r"ckpt/0\.[0-9a-f]+\.tl"):
        strategy._load_meta(path)


# --- real Trainer.fit runs -------------------------------------------------------------------------


@pytest.fixture()
def fit(monkeypatch):
    monkeypatch.syspath_prepend(HERE)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import _lightning_script

    return _lightning_script.fit


def _record_cli(path, capsys):
    from tensorlist.cli import main

    assert main(["record", os.fspath(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_fit_resume_is_bit_exact_and_recorded(tmp_path, fit, capsys):
    losses, _, _ = fit(tmp_path / "run", 3)
    assert len(losses) == 12
    resumed, _, _ = fit(tmp_path / "resumed", 3, ckpt_path=tmp_path / "run" / "epoch=0-step=4.ckpt")
    assert resumed == losses[4:]
    last = tmp_path / "resumed" / "epoch=2-step=12.ckpt"
    record = read_training_record(last)
    assert record["epochs"] == {"asked": 3, "done": 3} and record["seed"] == 7
    assert record["optimizer"]["class"] == "torch.optim.adam.Adam"
    assert record["history"]["learning_rate"] == [0.05, 0.025, 0.0125]
    assert record["weights"]["sha256"] == weights_sha256(tl.load(last, pointer="/state_dict"))
    first = read_training_record(tmp_path / "run" / "epoch=0-step=4.ckpt")
    assert record["initial_weights_sha256"] == first["initial_weights_sha256"] is not None
    assert record["history"]["training_loss"][0] == first["history"]["training_loss"][0]
    assert "epochs: 3 done of 3 asked" in _record_cli(last, capsys)


@pytest.mark.slow
def test_fit_with_async_checkpoint_io(tmp_path, fit):
    from lightning.pytorch.plugins.io import AsyncCheckpointIO

    fit(tmp_path, 2, plugins=[AsyncCheckpointIO(TensorListCheckpointIO())])
    ckpt = TensorListCheckpointIO().load_checkpoint(tmp_path / "epoch=1-step=8.ckpt")
    assert ckpt["epoch"] == 1 and ckpt["training"]["epochs"]["done"] == 2


@pytest.mark.slow
def test_fit_with_validation_records_each_epoch_value(tmp_path, fit):
    fit(tmp_path, 2, validate=True)
    record = read_training_record(tmp_path / "epoch=1-step=8.ckpt")  # saved after validation, inside the epoch
    assert record["epochs"]["done"] == 2
    values = record["history"]["validation"]
    assert len(values) == 2 and all(isinstance(v, float) for v in values)
    assert values == read_training_record(tmp_path / "epoch=1-step=8.ckpt")["history"]["validation"]
    assert read_training_record(tmp_path / "epoch=0-step=4.ckpt")["history"]["validation"] == values[:1]


def _script(strategy, out, epochs, ckpt=None):
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, SCRIPT, strategy, os.fspath(out), str(epochs)] + ([os.fspath(ckpt)] if ckpt else [])
    done = subprocess.run(cmd, env=env, cwd=out, capture_output=True, text=True, timeout=PROCESS_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads((out / "losses.json").read_text())


@pytest.mark.slow
def test_ddp_two_processes_resume_is_bit_exact(tmp_path, capsys):
    losses = _script("ddp", tmp_path / "ddp", 3)
    assert len(losses) == 6  # 16 samples, batch 4, 2 ranks: 2 steps an epoch
    resumed = _script("ddp", tmp_path / "resumed", 3, tmp_path / "ddp" / "epoch=0-step=2.ckpt")
    assert resumed == losses[2:]
    last = tmp_path / "resumed" / "epoch=2-step=6.ckpt"
    ckpt = TensorListCheckpointIO().load_checkpoint(last)
    assert set(ckpt["state_dict"]) == {"net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias"}
    assert "solver: lightning.pytorch.Trainer" in _record_cli(last, capsys)
    assert read_training_record(last)["solver"]["solver_params"]["world_size"] == 2


@pytest.mark.slow
def test_model_parallel_sharded_resume_is_bit_exact(tmp_path, capsys):
    losses = _script("model_parallel", tmp_path / "run", 3)
    first = tmp_path / "run" / "epoch=0-step=2.ckpt"
    assert (first / META_NAME).is_file() and not (first / "meta.pt").exists()
    assert (first / ".metadata.json").is_file()  # tensorlist.dcp's layout, no pickled .metadata
    resumed = _script("model_parallel", tmp_path / "resumed", 3, first)
    assert resumed == losses[2:]
    assert "epochs: 3 done of 3 asked" in _record_cli(tmp_path / "resumed" / "epoch=2-step=6.ckpt" / META_NAME, capsys)


def test_remove_checkpoint_of_a_link_keeps_its_target(tmp_path):
    """ModelCheckpoint(save_last="link")'s last.ckpt is a symlink: removing it leaves the checkpoint it names whole."""
    io = TensorListCheckpointIO()
    io.save_checkpoint({"state_dict": {"w": torch.ones(2)}}, tmp_path / "epoch=0.ckpt")
    os.symlink("epoch=0.ckpt", tmp_path / "last.ckpt")
    before = sorted(os.listdir(tmp_path))
    io.remove_checkpoint(tmp_path / "last.ckpt")
    assert sorted(os.listdir(tmp_path)) == [n for n in before if n != "last.ckpt"]
    assert io.load_checkpoint(tmp_path / "epoch=0.ckpt")["state_dict"]["w"].tolist() == [1.0, 1.0]
