"""Hostile training states (docs/SECURITY.md G25): one table of mutations, every entry point that restores a state.

Real checkpoints are saved once per kind (a loops checkpoint document, an Accelerate ``save_state`` directory, a
transformers Trainer ``checkpoint-N``, a Lightning checkpoint, a torch optimizer state file); each case copies one,
edits the state in its JSON as an attacker would (re-sealing the Accelerate manifest), and restores it through
the entry point. Each must raise a FormatError (a TensorListError) naming the file and the field, leave every
file of the checkpoint as it was, and, where the entry point checks every state before taking one, leave the
generators and the model as they were.
"""
import copy
import hashlib
import json
import os
import random
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="restoring training states needs torch")

import tensorlist.torch as tt  # noqa: E402
from tensorlist import loops  # noqa: E402
from tensorlist.errors import FormatError, TensorListError  # noqa: E402

UINT8, INT8, UINT32, FLOAT32 = 0, 1, 28, 6  # dtype codes (docs/FORMAT.md)


# --------------------------------------------------------------------------
# the mutations: (name, target, edit of the JSON value at the target, a fragment of the field named)


def _tensor(name, **changes):
    """Edits the entry ``name`` of a TensorList's JSON (its ``tensors`` array)."""
    def edit(lst):
        for t in lst["tensors"]:
            if t["name"] == name:
                t.update(changes)
        return lst
    return edit


def _set(path, value):
    """Sets ``value`` at ``path`` (keys and indices) inside the target."""
    def edit(obj):
        node = obj
        for k in path[:-1]:
            node = node[k]
        node[path[-1]] = value
        return obj
    return edit


def _words(edit):
    def apply(m):
        m["random"][1] = edit(list(m["random"][1]))
        return m
    return apply


RNG = [
    ("torch state too short", "rng_tensors", _tensor("torch", dims=[100], byteLength=100), "torch"),
    ("torch state of int8", "rng_tensors", _tensor("torch", dataType=INT8), "torch"),
    ("numpy words of float32", "rng_tensors", _tensor("numpy", dataType=FLOAT32), "numpy"),
    ("numpy position past 2**64", "rng_meta", _set(["numpy", 1], 10 ** 30), "numpy[1]"),
    ("numpy position past the words", "rng_meta", _set(["numpy", 1], 625), "numpy[1]"),
    ("numpy generator unknown", "rng_meta", _set(["numpy", 0], "PCG64"), "numpy[0]"),
    ("numpy state an object", "rng_meta", _set(["numpy"], {"a": 1}), "numpy"),
    ("random version a string", "rng_meta", _set(["random", 0], "3"), "random[0]"),
    ("random words one short", "rng_meta", _words(lambda w: w[:-1]), "random[1]"),
    ("random word past 32 bits", "rng_meta", _words(lambda w: w[:5] + [2 ** 40] + w[6:]), "random[1][5]"),
    ("random position past 624", "rng_meta", _words(lambda w: w[:-1] + [700]), "random[1][624]"),
    ("random gauss a list", "rng_meta", _set(["random", 2], [1]), "random[2]"),
    ("random state missing", "rng_meta", lambda m: {"numpy": m["numpy"]}, "random"),
]

GROUPS = [  # a param_groups list, in every optimizer format
    ("param_groups a string", "param_groups", lambda g: "x", "param_groups"),
    ("a group a number", "param_groups", lambda g: [5] + g[1:], "param_groups[0]"),
    ("params not integers", "param_groups", _set([0, "params", 0], "a"), "param_groups[0].params[0]"),
    ("params a number", "param_groups", _set([0, "params"], 3), "param_groups[0].params"),
    ("a parameter twice", "param_groups", lambda g: _set([0, "params"], g[0]["params"][:1] * 2)(g),
     "param_groups[0].params[1]"),
    ("lr a string", "param_groups", _set([0, "lr"], "fast"), "param_groups[0].lr"),
]

PARTS = [  # tensorlist.torch's optimizer metadata (loops, optimizer files, Hugging Face)
    ("state not a list", "optimizer", _set(["state"], {"a": 1}), "state"),
    ("a state entry of one item", "optimizer", _set(["state", 0], [0]), "state[0]"),
    ("a state id not an integer", "optimizer", _set(["state", 0, 0], "w"), "state[0][0]"),
    ("a malformed tag", "optimizer", _set(["param_groups", 0, "lr"], {"__float__": "1.5"}), "param_groups"),
]

SCHEDULER = [
    ("last_epoch a string", "scheduler", _set(["last_epoch"], "x"), "last_epoch"),
    ("base_lrs a string", "scheduler", _set(["base_lrs"], "x"), "base_lrs"),
    ("_last_lr of strings", "scheduler", _set(["_last_lr"], ["a"]), "_last_lr"),
    ("an optimizer in the state", "scheduler", _set(["optimizer"], 1), ""),
]

TAGGED_SCHEDULER = [("a malformed tag", "scheduler", _set(["_last_lr"], {"__tuple__": 5}), "")]

SAMPLER = [
    ("sampler epoch a string", "sampler", _set(["seedable_sampler", "epoch"], "x"), "seedable_sampler.epoch"),
    ("sampler state a list", "sampler", lambda s: [1], "state"),
    ("sampler seed missing", "sampler", lambda s: {"seedable_sampler": {"epoch": 0}}, "seedable_sampler"),
]


# --------------------------------------------------------------------------
# the checkpoints and where each target lives in them: (file, pointer into its JSON)


def _digest(directory):
    return {os.path.relpath(os.path.join(r, n), directory): hashlib.sha256(open(os.path.join(r, n), "rb").read())
            .hexdigest() for r, _, names in os.walk(directory) for n in names}


def _edit(directory, name, pointer, edit):
    path = os.path.join(directory, name)
    with open(path) as f:
        doc = json.load(f)
    node = doc
    for k in pointer[:-1]:
        node = node[k]
    node[pointer[-1]] = edit(copy.deepcopy(node[pointer[-1]]))
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def _generators():
    return random.getstate(), np.random.get_state()[1].copy(), torch.get_rng_state().clone()


def _same_generators(a, b):
    return a[0] == b[0] and np.array_equal(a[1], b[1]) and torch.equal(a[2], b[2])


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 1))


def _params(module):
    return [p.detach().clone() for p in module.parameters()]


# ---- the loops' checkpoint document


def _loop_run(path, resume):
    model = _model(1 if resume else 0)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    data = [(x, x.sum(1, keepdim=True))]
    before = _params(model)
    loops.epochs(model, opt, data, loss_fn=torch.nn.functional.mse_loss, max_epochs=2 if resume else 1,
                 checkpoint=path, resume=resume, lr_scheduler=sched, progress=False)
    return model, before


LOOP_TARGETS = {"rng_meta": ["tensorlist", "rng"], "rng_tensors": ["tensorlist", "rngTensors"],
                "optimizer": ["optimizer", "metadata"], "param_groups": ["optimizer", "metadata", "param_groups"],
                "scheduler": ["tensorlist", "lrScheduler"]}


@pytest.fixture(scope="module")
def loop_checkpoint(tmp_path_factory):
    d = tmp_path_factory.mktemp("loop")
    _loop_run(os.fspath(d / "ckpt.json"), None)
    return d


@pytest.mark.parametrize("name,target,edit,field", RNG + GROUPS + PARTS + SCHEDULER + TAGGED_SCHEDULER,
                         ids=[m[0] for m in RNG + GROUPS + PARTS + SCHEDULER + TAGGED_SCHEDULER])
def test_loops_resume_refuses_a_bad_state(loop_checkpoint, tmp_path, name, target, edit, field):
    d = tmp_path / "ckpt"
    shutil.copytree(loop_checkpoint, d)
    path = _edit(d, "ckpt.json", LOOP_TARGETS[target], edit)
    model = _model(1)
    files, gens, before = _digest(d), _generators(), _params(model)
    with pytest.raises(FormatError) as e:
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        loops.epochs(model, opt, [(torch.zeros(2, 3), torch.zeros(2, 1))], loss_fn=torch.nn.functional.mse_loss,
                     max_epochs=2, checkpoint=path, resume=True,
                     lr_scheduler=torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5), progress=False)
    _check(e.value, path, field)
    assert _digest(d) == files
    assert _same_generators(gens, _generators())
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model)))


def _check(err, path, field):
    assert isinstance(err, TensorListError)
    assert err.file == os.fspath(path), str(err)
    assert field in (err.field or "") or field in str(err), str(err)


# ---- tensorlist.torch's optimizer state file


OPTIMIZER_FILE_TARGETS = {"optimizer": ["metadata", "optimizer"],
                          "param_groups": ["metadata", "optimizer", "param_groups"]}


@pytest.mark.parametrize("name,target,edit,field", GROUPS + PARTS, ids=[m[0] for m in GROUPS + PARTS])
def test_optimizer_state_file_refuses_a_bad_state(tmp_path, name, target, edit, field):
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    tt.save_optimizer_state(tmp_path / "opt.json", opt)
    path = _edit(tmp_path, "opt.json", OPTIMIZER_FILE_TARGETS[target], edit)
    files = _digest(tmp_path)
    other = torch.optim.Adam(_model(1).parameters(), lr=0.5)
    saved = copy.deepcopy(other.state_dict())
    with pytest.raises(FormatError) as e:
        tt.load_optimizer_state(path, other)
    _check(e.value, path, field)
    assert _digest(tmp_path) == files
    assert other.state_dict() == saved


# ---- Accelerate's save_state directory


@pytest.fixture()
def _fresh_accelerator():
    pytest.importorskip("accelerate", reason="the Accelerate cases need accelerate")
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def _accelerated(seed):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    model = _model(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.randn(16, 3, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8,
                                         shuffle=True)
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True))
    return (acc, *acc.prepare(model, opt, loader, sched))


ACCELERATE_TARGETS = {"rng_meta": ("random_states_0.json", ["metadata", "state"]),
                      "rng_tensors": ("random_states_0.json", None),
                      "optimizer": ("optimizer.json", ["metadata", "optimizer"]),
                      "param_groups": ("optimizer.json", ["metadata", "optimizer", "param_groups"]),
                      "scheduler": ("scheduler.json", ["metadata", "state"]),
                      "sampler": ("sampler.json", ["metadata", "state"])}


@pytest.fixture(scope="module")
def accelerate_checkpoint(tmp_path_factory):
    pytest.importorskip("accelerate", reason="the Accelerate cases need accelerate")
    from accelerate.state import AcceleratorState
    from tensorlist import huggingface as hf

    d = tmp_path_factory.mktemp("accelerate") / "ckpt"
    acc, model, opt, loader, sched = _accelerated(0)
    for x, y in loader:
        acc.backward(torch.nn.functional.mse_loss(model(x), y))
        opt.step()
        sched.step()
        opt.zero_grad()
    hf.save_state(acc, d)
    AcceleratorState._reset_state(reset_partial_state=True)
    return d


def _edit_at(directory, name, pointer, edit):
    if pointer is None:  # the descriptor's own TensorList
        path = os.path.join(directory, name)
        with open(path) as f:
            doc = json.load(f)
        with open(path, "w") as f:
            json.dump(edit(doc), f)
        return path
    return _edit(directory, name, pointer, edit)


@pytest.mark.parametrize("name,target,edit,field", RNG + GROUPS + PARTS + SCHEDULER + TAGGED_SCHEDULER + SAMPLER,
                         ids=[m[0] for m in RNG + GROUPS + PARTS + SCHEDULER + TAGGED_SCHEDULER + SAMPLER])
def test_accelerate_load_state_refuses_a_bad_state(accelerate_checkpoint, tmp_path, _fresh_accelerator,
                                                   name, target, edit, field):
    from tensorlist import huggingface as hf

    d = tmp_path / "ckpt"
    shutil.copytree(accelerate_checkpoint, d)
    file, pointer = ACCELERATE_TARGETS[target]
    path = _edit_at(d, file, pointer, edit)
    manifest = json.loads((d / hf.MANIFEST_FILE).read_text())  # re-sealed, as one who edits a checkpoint would
    manifest["files"][file] = hashlib.sha256((d / file).read_bytes()).hexdigest()
    (d / hf.MANIFEST_FILE).write_text(json.dumps(manifest))
    acc, model, opt, loader, sched = _accelerated(1)
    files, gens, before = _digest(d), _generators(), _params(model)
    opt_before, sched_before = copy.deepcopy(opt.state_dict()), copy.deepcopy(sched.state_dict())
    with pytest.raises(FormatError) as e:
        hf.load_state(acc, d)
    _check(e.value, path, field)
    assert _digest(d) == files
    assert _same_generators(gens, _generators())
    assert all(torch.equal(a, b) for a, b in zip(before, _params(model)))
    assert opt.state_dict() == opt_before and sched.state_dict() == sched_before


# ---- the transformers Trainer's checkpoint-N


TRAINER_TARGETS = {"rng_meta": ("rng_state.json", ["metadata", "state"]), "rng_tensors": ("rng_state.json", None),
                   "optimizer": ("optimizer.json", ["metadata", "optimizer"]),
                   "param_groups": ("optimizer.json", ["metadata", "optimizer", "param_groups"]),
                   "scheduler": ("scheduler.json", ["metadata", "state"])}


def _trainer(out, steps):
    transformers = pytest.importorskip("transformers", reason="the Trainer cases need transformers")
    from _hf_support import Tokens, tiny_gpt2
    from tensorlist import huggingface as hf

    args = transformers.TrainingArguments(
        output_dir=os.fspath(out), max_steps=steps, per_device_train_batch_size=4, save_steps=2, report_to=[],
        use_cpu=True, seed=0, disable_tqdm=True, learning_rate=1e-2, dataloader_num_workers=0)
    return hf.TensorListTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens())


@pytest.fixture(scope="module")
def trainer_checkpoint(tmp_path_factory):
    out = tmp_path_factory.mktemp("trainer")
    _trainer(out, 2).train()
    return out / "checkpoint-2"


@pytest.fixture(scope="module")
def resuming_trainer(tmp_path_factory):
    """A Trainer whose optimizer and scheduler exist, for its own resume hooks (as ``train`` calls them)."""
    trainer = _trainer(tmp_path_factory.mktemp("resuming"), 4)
    trainer.create_optimizer_and_scheduler(num_training_steps=4)
    return trainer


@pytest.mark.slow
@pytest.mark.parametrize("name,target,edit,field", RNG + GROUPS + PARTS + SCHEDULER + TAGGED_SCHEDULER,
                         ids=[m[0] for m in RNG + GROUPS + PARTS + SCHEDULER + TAGGED_SCHEDULER])
def test_trainer_resume_refuses_a_bad_state(trainer_checkpoint, resuming_trainer, tmp_path, name, target, edit,
                                            field):
    d = tmp_path / "checkpoint-2"
    shutil.copytree(trainer_checkpoint, d)
    file, pointer = TRAINER_TARGETS[target]
    path = _edit_at(d, file, pointer, edit)
    files, gens = _digest(d), _generators()
    t = resuming_trainer
    opt_before = copy.deepcopy(t.optimizer.state_dict())
    with pytest.raises(FormatError) as e:
        if target.startswith("rng"):
            t._load_rng_state(os.fspath(d))
        else:
            t._load_optimizer_and_scheduler(os.fspath(d))
    _check(e.value, path, field)
    assert _digest(d) == files
    assert _same_generators(gens, _generators())
    assert t.optimizer.state_dict() == opt_before


@pytest.mark.slow
def test_trainer_train_refuses_a_bad_rng_state_before_loading_anything(trainer_checkpoint, tmp_path):
    d = tmp_path / "run" / "checkpoint-2"
    shutil.copytree(trainer_checkpoint, d)
    path = _edit_at(d, "rng_state.json", ["metadata", "state"], _set(["numpy", 1], 10 ** 30))
    trainer = _trainer(tmp_path / "run", 4)
    before = _params(trainer.model)
    with pytest.raises(FormatError, match=r"numpy\[1\]") as e:
        trainer.train(resume_from_checkpoint=os.fspath(d))
    assert e.value.file == path
    assert all(torch.equal(a, b) for a, b in zip(before, _params(trainer.model)))


# ---- Lightning's checkpoint


LIGHTNING_GROUPS = [m for m in GROUPS]
LIGHTNING = LIGHTNING_GROUPS + [
    ("optimizer state a list", "optimizer", _set(["state"], [1]), "optimizer_states[0].state"),
    ("optimizer states an object", "optimizer_states", lambda s: {"a": 1}, "optimizer_states"),
    ("epoch a list", "checkpoint", _set(["epoch"], [1]), "epoch"),
    ("global_step a string", "checkpoint", _set(["global_step"], "8"), "global_step"),
] + SCHEDULER + TAGGED_SCHEDULER

LIGHTNING_TARGETS = {"param_groups": ["optimizer_states", 0, "param_groups"], "optimizer": ["optimizer_states", 0],
                     "optimizer_states": ["optimizer_states"], "scheduler": ["lr_schedulers", 0],
                     "checkpoint": None}


@pytest.fixture(scope="module")
def lightning_checkpoint(tmp_path_factory):
    pytest.importorskip("lightning", reason="the Lightning cases need lightning")
    import sys

    import _lightning_script

    out = tmp_path_factory.mktemp("lightning")
    _lightning_script.fit(out, 1)
    (ckpt,) = [n for n in os.listdir(out) if n.endswith(".ckpt")]
    return out, ckpt, _lightning_script.fit


@pytest.mark.parametrize("name,target,edit,field", LIGHTNING, ids=[m[0] for m in LIGHTNING])
def test_lightning_load_refuses_a_bad_state(lightning_checkpoint, tmp_path, name, target, edit, field):
    from tensorlist.lightning import TensorListCheckpointIO

    src, ckpt, _ = lightning_checkpoint
    d = tmp_path / "ckpt"
    shutil.copytree(src, d)
    path = _edit_at(d, ckpt, LIGHTNING_TARGETS[target], edit)
    files = _digest(d)
    with pytest.raises(FormatError) as e:
        TensorListCheckpointIO().load_checkpoint(path)
    _check(e.value, path, field)
    assert _digest(d) == files


@pytest.mark.slow
def test_lightning_fit_refuses_a_bad_optimizer_state_naming_it(lightning_checkpoint, tmp_path):
    src, ckpt, fit = lightning_checkpoint
    d = tmp_path / "ckpt"
    shutil.copytree(src, d)
    path = _edit_at(d, ckpt, LIGHTNING_TARGETS["param_groups"], _set([0, "params", 0], "a"))
    files = _digest(d)
    with pytest.raises(FormatError, match=r"optimizer_states\[0\]\.param_groups\[0\]\.params\[0\]") as e:
        fit(tmp_path / "resumed", 2, ckpt_path=path)
    assert e.value.file == path
    assert _digest(d) == files
