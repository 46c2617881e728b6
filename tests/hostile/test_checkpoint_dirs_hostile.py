"""Hostile checkpoint directories, one class for every directory kind (docs/SECURITY.md G23, G24).

Each kind is saved for real (a DCP directory through ``TensorListWriter``, Orbax items through a
``CheckpointManager``, a Lightning sharded directory through ``TensorListModelParallelStrategy``,
``tensorlist.huggingface.save_state`` of an ``Accelerator``, a ``TensorListTrainer``'s
``checkpoint-N``), with a byte-identical twin beside it. Then every file and subdirectory in turn
is replaced by: a symlink to its twin (so following it would load fine; relative, through ``..``),
the same reached through a symlinked subdirectory, a FIFO, a symlink to ``/dev/zero`` and the file's
bytes followed by a hole up to 64 GiB (a sparse file); and every loader entry point of that kind is run under a hang guard. Each one that
reads the file must raise tensorlist's FormatError naming it; none may hang, raise anything else,
or run out of memory; one that does not read the file may succeed, and so may a load from a sparse
data file (a regular file holding the right bytes where its descriptor says) or past a data file
its descriptor needs no byte of (a state without tensors). ``dcp.load`` is torch's: it reports a
failure to read the metadata in an AssertionError of its own, which must name the file.
"""
import os
import shutil
import threading
import warnings

import pytest

from tensorlist.errors import FormatError

torch = pytest.importorskip("torch", reason="the checkpoint directories are saved from torch objects")

REPLACEMENTS = ("link to its twin", "link through a linked subdirectory", "FIFO", "/dev/zero", "64 GiB sparse file")

#: Seconds one entry point may take before it counts as hung (a generous guard, not a timing).
HANG_GUARD = 120


def _replace(path, kind, twin):
    """Puts ``kind`` in place of the file or directory ``path``; ``twin`` is its copy outside the checkpoint."""
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
        head = b""
    else:
        with open(path, "rb") as f:
            head = f.read()
        os.unlink(path)
    parent = os.path.dirname(path)
    if kind == "link to its twin":
        os.symlink(os.path.relpath(twin, parent), path)
    elif kind == "link through a linked subdirectory":
        via = os.path.join(parent, "elsewhere")
        os.symlink(os.path.relpath(os.path.dirname(twin), parent), via)
        os.symlink(os.path.join("elsewhere", os.path.basename(twin)), path)
    elif kind == "FIFO":
        os.mkfifo(path)
    elif kind == "/dev/zero":
        os.symlink("/dev/zero", path)
    else:  # the file's own bytes, then a hole: a data file stays right where its descriptor looks
        with open(path, "wb") as f:
            f.write(head)
            f.truncate(64 << 30)


def _unblock_fifos(root):
    """Opens every FIFO under ``root`` for writing and closes it: a reader blocked in it sees EOF."""
    for folder, dirs, names in os.walk(root):
        for name in dirs + names:
            p = os.path.join(folder, name)
            if os.path.exists(p) and not os.path.isdir(p) and not os.path.isfile(p) and not os.path.islink(p):
                try:
                    os.close(os.open(p, os.O_WRONLY | os.O_NONBLOCK))
                except OSError:
                    pass


def _unwrap(e):
    """The error DCP's CheckpointException gathered (its first failure), else ``e``."""
    failures = getattr(e, "failures", None)
    if isinstance(failures, dict) and failures:
        first = next(iter(failures.values()))
        return first[0] if isinstance(first, tuple) else first
    return e


def _guarded(fn, root):
    """``fn()``'s outcome: None, the exception it raised, or "hung"."""
    box = []

    def run():
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
            box.append(None)
        except BaseException as e:  # noqa: B036 - MemoryError and DCP's CheckpointException included
            box.append(_unwrap(e))
    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(HANG_GUARD)
    if t.is_alive():
        _unblock_fifos(root)
        t.join(10)
        return "hung"
    return box[0]


def _entries(ckpt, skip=()):
    """Every file and subdirectory under ``ckpt``, relative, deepest first (a subdirectory after its files)."""
    found = []
    for folder, dirs, names in os.walk(ckpt, topdown=False):
        for name in names + dirs:
            rel = os.path.relpath(os.path.join(folder, name), ckpt)
            if name not in skip:
                found.append(rel)
    return found


def _descriptor_of(rel):
    """The descriptor a data file belongs to (``model.json.0a1b2c3d.data`` -> ``model.json``), else ``rel``."""
    parts = rel.split(".")
    return ".".join(parts[:-2]) if rel.endswith(".data") and len(parts) > 2 else rel


def _run_class(tmp_path, pristine, ckpt_rel, twin_rel, entry_points, skip=()):
    """Every replacement of every entry of ``pristine/ckpt_rel`` through every entry point, each as it must end.

    ``entry_points``: (name, reads, fn(root, ckpt)), ``reads(rel)`` saying whether it opens the entry;
    torch's ``dcp.load`` is let rewrap the error (any exception naming the file).
    """
    failures = []
    entries = _entries(os.path.join(pristine, ckpt_rel), skip)
    unread = {rel for rel in entries if rel.endswith(".data") and not os.path.getsize(os.path.join(pristine, ckpt_rel, rel))}
    assert entries
    for rel in entries:
        for kind in REPLACEMENTS:
            for name, reads, fn in entry_points:
                root = os.path.join(tmp_path, "case")
                shutil.rmtree(root, ignore_errors=True)
                shutil.copytree(pristine, root, symlinks=True)
                ckpt = os.path.join(root, ckpt_rel)
                target = os.path.join(ckpt, rel)
                _replace(target, kind, os.path.join(root, twin_rel, rel))
                outcome = _guarded(lambda: fn(root, ckpt), root)
                named = (isinstance(outcome, FormatError) or (name == "dcp.load" and isinstance(outcome, Exception))) \
                    and target in str(outcome)
                may_pass = (not reads(rel) or rel in unread
                            or (kind == "64 GiB sparse file" and rel.endswith(".data")))
                if not (named or (outcome is None and may_pass)):
                    failures.append(f"{name}: {rel} as {kind}: {outcome!r}")
                shutil.rmtree(root, ignore_errors=True)
    assert not failures, "\n".join(failures)


def _pristine(tmp_path, build, ckpt_rel, twin_rel):
    """``build(root)`` into a fresh folder, then the checkpoint's byte-identical twin beside it."""
    root = os.path.join(tmp_path, "pristine")
    os.makedirs(root)
    build(root)
    shutil.copytree(os.path.join(root, ckpt_rel), os.path.join(root, twin_rel), symlinks=True)
    return root


ALL = lambda rel: True  # noqa: E731 - the entry point opens every entry


# --------------------------------------------------------------------------
# the five directory kinds


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_dcp_directory(tmp_path):
    import torch.distributed.checkpoint as dcp

    from tensorlist.dcp import TensorListReader, TensorListWriter
    from tensorlist.dcp import read_full, validate_checkpoint

    def build(root):
        dcp.save({"w": torch.arange(4.0), "note": "text"}, storage_writer=TensorListWriter(os.path.join(root, "dcp")))

    def torch_load(root, ckpt):
        state = {"w": torch.zeros(4), "note": ""}
        dcp.load(state, storage_reader=TensorListReader(ckpt))
        assert state["w"].tolist() == [0.0, 1.0, 2.0, 3.0]

    pristine = _pristine(tmp_path, build, "dcp", "twin")
    _run_class(tmp_path, pristine, "dcp", "twin", [
        ("read_full", ALL, lambda root, ckpt: read_full(ckpt)),
        ("validate_checkpoint", ALL, lambda root, ckpt: validate_checkpoint(ckpt, schema=False)),
        ("dcp.load", ALL, torch_load),
    ])


@pytest.mark.parametrize("sharded", [False, True], ids=["tree_file", "sharded_tree_dir"])
def test_orbax_item(tmp_path, sharded):
    pytest.importorskip("jax", reason="the Orbax adapter needs jax")
    ocp = pytest.importorskip("orbax.checkpoint", reason="the Orbax adapter needs orbax-checkpoint")
    import jax.numpy as jnp

    from tensorlist.orbax import TensorListCheckpointHandler, TensorListRestore, TensorListSave

    def build(root):
        with ocp.CheckpointManager(os.path.join(root, "run"), item_handlers=TensorListCheckpointHandler()) as m:
            m.save(0, args=TensorListSave({"w": jnp.arange(4.0)}, sharded=sharded))
            m.wait_until_finished()

    def restore(root, ckpt):
        with ocp.CheckpointManager(os.path.join(root, "run"), item_handlers=TensorListCheckpointHandler()) as m:
            assert m.restore(0, args=TensorListRestore())["w"].tolist() == [0.0, 1.0, 2.0, 3.0]

    def metadata(root, ckpt):
        assert TensorListCheckpointHandler().metadata(ckpt)["w"].shape == (4,)

    item = os.path.join("run", "0", "default")
    pristine = _pristine(tmp_path, build, item, "twin")
    # commit_success.txt is Orbax's own marker, not an item file tensorlist reads
    _run_class(tmp_path, pristine, item, "twin", [
        ("CheckpointManager.restore", ALL, restore),
        ("handler.metadata", lambda rel: not rel.endswith(".data"), metadata),
    ], skip=("commit_success.txt",))


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_lightning_sharded_directory(tmp_path):
    pl = pytest.importorskip("lightning.pytorch", reason="the Lightning integration needs lightning")
    from tensorlist.lightning import META_NAME, TensorListModelParallelStrategy

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)

    torch.manual_seed(0)
    saved = Module()

    def build(root):
        TensorListModelParallelStrategy().save_checkpoint(
            {"state_dict": saved.state_dict(), "optimizer_states": [], "epoch": 3}, os.path.join(root, "last.ckpt"))

    def load(root, ckpt):
        strategy, module = TensorListModelParallelStrategy(), Module()
        strategy.connect(module)
        assert strategy.load_checkpoint(ckpt) == {"epoch": 3}
        assert torch.equal(module.lin.weight, saved.lin.weight)

    pristine = _pristine(tmp_path, build, "last.ckpt", "twin")
    # meta.json is the readers' copy of the newest meta document: the strategy reads the one DCP names
    _run_class(tmp_path, pristine, "last.ckpt", "twin", [
        ("strategy.load_checkpoint", lambda rel: _descriptor_of(rel) != META_NAME, load),
    ])


def test_accelerate_save_state_directory(tmp_path):
    pytest.importorskip("accelerate", reason="the Accelerate integration needs accelerate")
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    from tensorlist import huggingface as hf

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, 1)
    acc = Accelerator(cpu=True)
    model, opt, sched = acc.prepare(model, opt, sched)
    try:
        acc.backward(model(torch.ones(2, 4)).sum())
        opt.step()
        sched.step()
        saved = model.weight.detach().clone()

        def load(root, ckpt):
            hf.load_state(acc, ckpt)
            assert torch.equal(model.weight, saved)

        pristine = _pristine(tmp_path, lambda root: hf.save_state(acc, os.path.join(root, "ckpt")), "ckpt", "twin")
        _run_class(tmp_path, pristine, "ckpt", "twin", [("load_state", ALL, load)])
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


@pytest.mark.slow
def test_trainer_checkpoint_directory(tmp_path):
    transformers = pytest.importorskip("transformers", reason="the Trainer integration needs transformers")
    from accelerate.state import AcceleratorState
    from _hf_support import Tokens, tiny_gpt2

    from tensorlist import huggingface as hf

    def trainer(out, steps, save):
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=4, save_steps=3, report_to=[],
            use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0, save_strategy=save)
        return hf.TensorListTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens())

    def resume(root, ckpt):  # one step after the checkpoint: every state file is read
        t = trainer(os.path.join(root, "resumed"), 4, "no")
        t.train(resume_from_checkpoint=ckpt)
        assert t.state.global_step == 4

    read_on_resume = {"model.json", "optimizer.json", "scheduler.json", "rng_state.json", "trainer_state.json"}
    try:
        pristine = _pristine(tmp_path, lambda root: trainer(os.path.join(root, "run"), 3, "steps").train(),
                             os.path.join("run", "checkpoint-3"), "twin")
        _run_class(tmp_path, pristine, os.path.join("run", "checkpoint-3"), "twin", [
            ("train(resume_from_checkpoint=)", lambda rel: _descriptor_of(rel) in read_on_resume, resume),
            ("export_pretrained", lambda rel: _descriptor_of(rel) in {"model.json", "config.json",
                                                                     "generation_config.json"},
             lambda root, ckpt: hf.export_pretrained(ckpt, os.path.join(root, "exported"))),
        ])
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)
