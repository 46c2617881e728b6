"""Accelerate's and transformers' own checkpoint scenarios, run on the stock savers and on tensorlist's.

Origin (re-written for pytest, CPU, tiny models; what each checks is what the original checks):
- https://github.com/huggingface/accelerate, ``tests/test_state_checkpointing.py`` (Apache-2.0 license,
  Copyright The HuggingFace Team): ``CheckpointTest.test_can_resume_training_with_folder``,
  ``test_can_resume_training``, ``test_can_resume_training_checkpoints_relative_path``, ``test_with_scheduler``,
  ``test_automatic_loading``, ``test_with_save_limit``, ``test_checkpoint_deletion``; and
  ``tests/test_accelerator.py``'s ``test_save_model_with_stateful_dataloader`` (resume mid-epoch, the same
  remaining batches), here with accelerate's seedable sampler and ``skip_first_batches``, as torchdata's
  StatefulDataLoader is not a dependency; objects given to ``register_for_checkpointing``.
- https://github.com/huggingface/transformers, ``tests/trainer/test_trainer.py`` (Apache-2.0 license,
  Copyright The HuggingFace Team): ``test_can_resume_training`` (and ``resume_from_checkpoint=True``),
  ``test_checkpoint_rotation`` (``save_total_limit``, the best checkpoint kept), ``test_load_best_model_at_end``
  (``check_best_model_has_been_loaded``) with ``eval_strategy="epoch"``, and ``save_only_model``.

Every scenario runs twice, through the ``impl`` parameter: ``stock`` (``Accelerator.save_state``/``load_state``,
``transformers.Trainer``: pickles and safetensors) and ``tensorlist`` (``tensorlist.huggingface.save_state``/
``load_state``, ``TensorListTrainer``), so each is known to pass on the trainer itself. The ids name the origin.

Not run, and why: ``use_safetensors`` variants (tensorlist writes its own files either way), ``test_map_location``
(needs an accelerator device), ``test_invalid_registration`` (accelerate's own argument check, no save involved),
the Trainer's DeepSpeed/FSDP variants (sharded saves belong to ``tensorlist.dcp``).
"""
import os
import random

import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face integrations need torch")
accelerate = pytest.importorskip("accelerate", reason="the Accelerate scenarios need accelerate")

from _hf_support import Tokens, tiny_gpt2  # noqa: E402
from tensorlist import huggingface as hf  # noqa: E402
from tensorlist.torch import load_state as load_tensorlist_weights  # noqa: E402

IMPLS = ["stock", "tensorlist"]


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


@pytest.fixture(params=IMPLS)
def impl(request):
    return request.param


def _save(impl, accelerator, directory=None):
    if impl == "stock":
        return accelerator.save_state(None if directory is None else os.fspath(directory))
    return hf.save_state(accelerator, directory)


def _load(impl, accelerator, directory=None):
    if impl == "stock":
        return accelerator.load_state(None if directory is None else os.fspath(directory))
    return hf.load_state(accelerator, directory)


def _equal_states(a, b):
    """Optimizer/scheduler state dicts equal, tensors by value."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_equal_states(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return isinstance(b, (list, tuple)) and len(a) == len(b) and all(map(_equal_states, a, b))
    return a == b


# --------------------------------------------------------------------------
# Accelerate: tests/test_state_checkpointing.py


class DummyModel(torch.nn.Module):
    """y = a x + b."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Parameter(torch.randn(1))
        self.b = torch.nn.Parameter(torch.randn(1))

    def forward(self, x):
        return x * self.a + self.b


def _loaders(batch_size=16, n_train=4, n_valid=2):
    g = torch.Generator().manual_seed(0)  # the same data whatever the seed

    def dataset(n):
        x = torch.randn(batch_size * n, 1, generator=g)
        return torch.utils.data.TensorDataset(x, 2 * x + 3 + 0.1 * torch.randn(batch_size * n, 1, generator=g))

    return (torch.utils.data.DataLoader(dataset(n_train), shuffle=True, batch_size=batch_size),
            torch.utils.data.DataLoader(dataset(n_valid), shuffle=False, batch_size=batch_size))


def _setup(*, scheduler=False, **accelerator_kwargs):
    """set_seed(42), the model, Adam (and StepLR), the two loaders, all prepared."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    set_seed(42)
    model = DummyModel()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    train_dl, valid_dl = _loaders()
    acc = Accelerator(cpu=True, **accelerator_kwargs)
    objects = [model, opt, train_dl, valid_dl] + ([torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.99)] if scheduler else [])
    return (acc, *acc.prepare(*objects))


def _train(epochs, acc, model, opt, loader, sched=None):
    """The original's ``train``: epochs of MSE steps, one ``random.random()`` per epoch (what the RNG restore must repeat)."""
    rands = []
    for _ in range(epochs):
        model.train()
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
        rands.append(random.random())
        if sched is not None:
            sched.step()
    return rands


def _ab(model):
    return model.a.item(), model.b.item()


def _project(project_dir, **kwargs):
    from accelerate.utils import ProjectConfiguration

    return ProjectConfiguration(project_dir=os.fspath(project_dir), automatic_checkpoint_naming=True, **kwargs)


@pytest.mark.parametrize("origin", ["test_state_checkpointing.py::test_can_resume_training_with_folder"])
def test_resume_training_with_folder(tmp_path, impl, origin):
    acc, model, opt, train_dl, _ = _setup()
    _save(impl, acc, tmp_path / "initial")
    start, opt_start = _ab(model), opt.state_dict()
    truth = _train(3, acc, model, opt, train_dl)
    end, opt_end = _ab(model), opt.state_dict()

    acc, model, opt, train_dl, _ = _setup()
    _load(impl, acc, tmp_path / "initial")
    assert _ab(model) == start and _equal_states(opt.state_dict(), opt_start)
    rands = _train(2, acc, model, opt, train_dl)
    _save(impl, acc, tmp_path / "checkpoint")
    _load(impl, acc, tmp_path / "checkpoint")
    rands += _train(1, acc, model, opt, train_dl)
    assert _ab(model) == end and _equal_states(opt.state_dict(), opt_end)
    assert rands == truth


@pytest.mark.parametrize("relative", [False, True], ids=[
    "test_state_checkpointing.py::test_can_resume_training",
    "test_state_checkpointing.py::test_can_resume_training_checkpoints_relative_path"])
def test_resume_training_with_automatic_naming(tmp_path, monkeypatch, impl, relative):
    if relative:
        monkeypatch.chdir(tmp_path)
    project = "project" if relative else tmp_path / "project"
    acc, model, opt, train_dl, _ = _setup(project_config=_project(project))
    _save(impl, acc)  # checkpoints/checkpoint_0
    assert acc.project_configuration.iteration == 1
    start, opt_start = _ab(model), opt.state_dict()
    truth = _train(3, acc, model, opt, train_dl)
    end, opt_end = _ab(model), opt.state_dict()

    acc, model, opt, train_dl, _ = _setup(project_config=_project(project, iteration=1))
    if relative:
        _load(impl, acc)  # no directory: the newest, checkpoint_0
    else:
        _load(impl, acc, os.path.join(project, "checkpoints", "checkpoint_0"))
    assert _ab(model) == start and _equal_states(opt.state_dict(), opt_start)
    rands = _train(2, acc, model, opt, train_dl)
    _save(impl, acc)  # checkpoint_1
    assert sorted(os.listdir(os.path.join(project, "checkpoints"))) == ["checkpoint_0", "checkpoint_1"]
    _load(impl, acc, os.path.join(project, "checkpoints", "checkpoint_1"))
    rands += _train(1, acc, model, opt, train_dl)
    assert _ab(model) == end and _equal_states(opt.state_dict(), opt_end)
    assert rands == truth


@pytest.mark.parametrize("origin", ["test_state_checkpointing.py::test_with_scheduler"])
def test_scheduler_state_comes_back(tmp_path, impl, origin):
    acc, model, opt, train_dl, _, sched = _setup(scheduler=True, project_config=_project(tmp_path))
    _save(impl, acc)
    saved = sched.state_dict()
    _train(3, acc, model, opt, train_dl, sched)
    assert sched.state_dict() != saved
    _load(impl, acc, tmp_path / "checkpoints" / "checkpoint_0")
    assert sched.state_dict() == saved


@pytest.mark.parametrize("origin", ["test_state_checkpointing.py::test_automatic_loading"])
def test_load_without_a_directory_takes_the_newest(tmp_path, impl, origin):
    acc, model, opt, train_dl, _, sched = _setup(scheduler=True, project_config=_project(tmp_path))
    _save(impl, acc)
    _train(2, acc, model, opt, train_dl, sched)
    second = _ab(model)
    _save(impl, acc)
    _train(1, acc, model, opt, train_dl, sched)
    third = _ab(model)
    _load(impl, acc)
    assert _ab(model) == second != third


@pytest.mark.parametrize("origin", ["test_state_checkpointing.py::test_with_save_limit"])
def test_save_limit_of_one(tmp_path, impl, origin):
    acc, *_ = _setup(project_config=_project(tmp_path, total_limit=1))
    _save(impl, acc)
    _save(impl, acc)
    assert os.listdir(tmp_path / "checkpoints") == ["checkpoint_1"]


@pytest.mark.parametrize("origin", ["test_state_checkpointing.py::test_checkpoint_deletion"])
def test_total_limit_removes_the_oldest(tmp_path, impl, origin):
    from accelerate import Accelerator

    acc = Accelerator(cpu=True, project_config=_project(tmp_path, total_limit=2))
    acc.prepare(DummyModel())
    for _ in range(5):
        _save(impl, acc)
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_3", "checkpoint_4"]
    assert acc.project_configuration.iteration == 5
    _load(impl, acc)  # the newest


def test_existing_automatic_directory_is_refused(tmp_path, impl):
    """accelerate's ``ValueError`` when ``checkpoint_<iteration>`` exists (``save_state``), iteration unchanged."""
    acc, *_ = _setup(project_config=_project(tmp_path))
    _save(impl, acc)
    acc.project_configuration.iteration = 0
    with pytest.raises(ValueError, match="already exists"):
        _save(impl, acc)
    assert acc.project_configuration.iteration == 0


class Counter:
    """An object for ``register_for_checkpointing``: a ``state_dict`` of plain values."""

    def __init__(self):
        self.seen, self.history = 0, []

    def state_dict(self):
        return {"seen": self.seen, "history": list(self.history)}

    def load_state_dict(self, state):
        self.seen, self.history = state["seen"], list(state["history"])


def test_registered_objects_come_back(tmp_path, impl):
    """Objects given to ``register_for_checkpointing`` are saved and restored with the rest (accelerate's
    ``custom_checkpoint_<i>``), each into its own object."""
    acc, model, opt, train_dl, _ = _setup()
    first, second = Counter(), Counter()
    acc.register_for_checkpointing(first, second)
    first.seen, first.history, second.seen = 3, [0.5, 0.25], 7
    _save(impl, acc, tmp_path / "state")
    first.seen, first.history, second.seen = 100, [], 0
    _load(impl, acc, tmp_path / "state")
    assert (first.seen, first.history, second.seen) == (3, [0.5, 0.25], 7)


@pytest.mark.parametrize("origin", ["test_accelerator.py::test_save_model_with_stateful_dataloader"])
def test_resume_mid_epoch_gives_the_remaining_batches(tmp_path, impl, origin):
    from accelerate.utils import DataLoaderConfiguration, set_seed

    config = DataLoaderConfiguration(use_seedable_sampler=True)
    acc, model, opt, train_dl, _ = _setup(dataloader_config=config)
    _train(1, acc, model, opt, train_dl)  # epoch 0
    train_dl.set_epoch(1)
    seen, remaining = 2, []
    for step, (x, y) in enumerate(train_dl):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        if step == seen - 1:
            _save(impl, acc, tmp_path / "state")
        if step >= seen:
            remaining.append(x.clone())
    trained = _ab(model)

    # the same script started again (the sampler's seed comes from set_seed(42), as in the original: the stock
    # save_state keeps a seedable sampler's state for iterable datasets only); the weights, the optimizer
    # and the RNG states come from the checkpoint
    acc, model, opt, train_dl, _ = _setup(dataloader_config=config)
    set_seed(1234)
    _load(impl, acc, tmp_path / "state")
    train_dl.set_epoch(1)
    resumed = []
    for x, y in acc.skip_first_batches(train_dl, seen):
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        resumed.append(x.clone())
    assert len(resumed) == len(remaining) == 2
    assert all(torch.equal(a, b) for a, b in zip(resumed, remaining))
    assert _ab(model) == trained


# --------------------------------------------------------------------------
# transformers: tests/trainer/test_trainer.py


def _trainer(impl, out, **kwargs):
    transformers = pytest.importorskip("transformers", reason="the Trainer scenarios need transformers")
    settings = dict(output_dir=os.fspath(out), per_device_train_batch_size=4, per_device_eval_batch_size=8,
                    logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, learning_rate=1e-2,
                    dataloader_num_workers=0)
    settings.update(kwargs)
    cls = transformers.Trainer if impl == "stock" else hf.TensorListTrainer
    return cls(model=tiny_gpt2(), args=transformers.TrainingArguments(**settings), train_dataset=Tokens(),
               eval_dataset=Tokens(8) if settings.get("eval_strategy", "no") != "no" else None)


def _checkpoint_weights(impl, checkpoint):
    """The weights in a checkpoint, read by each implementation's own format."""
    if impl == "stock":
        from safetensors.torch import load_file

        return load_file(os.path.join(checkpoint, "model.safetensors"))
    return load_tensorlist_weights(os.path.join(checkpoint, "model.json"), mmap=False)


def _same_weights(model, weights):
    state = model.state_dict()
    return bool(weights) and all(torch.equal(state[k].cpu(), v) for k, v in weights.items())


def _keep_saved(saved):
    """A Trainer callback keeping a copy of the weights at each save, by global step."""
    import transformers

    class KeepSaved(transformers.TrainerCallback):
        def on_save(self, args, state, control, model=None, **kwargs):
            saved[state.global_step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    return KeepSaved()


def _checkpoints(out):
    return sorted((n for n in os.listdir(out) if n.startswith("checkpoint-")), key=lambda n: int(n.split("-")[1]))


@pytest.mark.parametrize("origin", ["test_trainer.py::test_can_resume_training"])
def test_trainer_resume_from_checkpoint(tmp_path, impl, origin):
    full = _trainer(impl, tmp_path / "run", num_train_epochs=2, save_steps=3)
    full.train()
    final = {k: v.clone() for k, v in full.model.state_dict().items()}
    state = full.state
    assert _checkpoints(tmp_path / "run") == ["checkpoint-3", "checkpoint-6", "checkpoint-8"]

    resumed = _trainer(impl, tmp_path / "run", num_train_epochs=2, save_steps=3)
    resumed.train(resume_from_checkpoint=os.fspath(tmp_path / "run" / "checkpoint-3"))  # mid-epoch
    assert _same_weights(resumed.model, final)
    assert resumed.state.global_step == state.global_step and resumed.state.epoch == state.epoch

    # resume_from_checkpoint=True: the newest checkpoint in output_dir (checkpoint-6 once 8 is gone)
    import shutil

    shutil.rmtree(tmp_path / "run" / "checkpoint-8")
    latest = _trainer(impl, tmp_path / "run", num_train_epochs=2, save_steps=3)
    latest.train(resume_from_checkpoint=True)
    assert _same_weights(latest.model, final)
    # the restored log history, then the losses of steps 7 and 8: those of the uninterrupted run
    assert [e["loss"] for e in latest.state.log_history if "loss" in e] == [
        e["loss"] for e in state.log_history if "loss" in e]


@pytest.mark.parametrize("origin", ["test_trainer.py::test_checkpoint_rotation"])
def test_trainer_save_total_limit(tmp_path, impl, origin):
    trainer = _trainer(impl, tmp_path / "run", max_steps=8, save_steps=2, save_total_limit=2)
    trainer.train()
    assert _checkpoints(tmp_path / "run") == ["checkpoint-6", "checkpoint-8"]
    assert _same_weights(trainer.model, _checkpoint_weights(impl, tmp_path / "run" / "checkpoint-8"))


@pytest.mark.parametrize("origin", ["test_trainer.py::test_load_best_model_at_end"])
def test_trainer_load_best_model_at_end(tmp_path, impl, origin):
    # "best" is the highest eval loss, so that the best checkpoint is not the last one
    trainer = _trainer(impl, tmp_path / "run", num_train_epochs=3, eval_strategy="epoch", save_strategy="epoch",
                       load_best_model_at_end=True, metric_for_best_model="loss", greater_is_better=True,
                       save_total_limit=1)
    saved = {}
    trainer.add_callback(_keep_saved(saved))
    trainer.train()
    evals = [(e["eval_loss"], e["step"]) for e in trainer.state.log_history if "eval_loss" in e]
    assert [step for _, step in evals] == [4, 8, 12]
    best_step = max(evals)[1]
    assert best_step != 12  # the scenario's premise: the last checkpoint is not the best
    best = tmp_path / "run" / f"checkpoint-{best_step}"
    assert trainer.state.best_model_checkpoint == os.fspath(best)
    # save_total_limit=1 keeps the best checkpoint; the last one goes once the best is loaded
    assert _checkpoints(tmp_path / "run") == [f"checkpoint-{best_step}"]
    assert _same_weights(trainer.model, _checkpoint_weights(impl, best))
    assert _same_weights(trainer.model, saved[best_step]) and not _same_weights(trainer.model, saved[12])


@pytest.mark.parametrize("origin", ["test_trainer.py::test_save_checkpoints (save_only_model)"])
def test_trainer_save_only_model(tmp_path, impl, origin):
    trainer = _trainer(impl, tmp_path / "run", max_steps=8, save_steps=4, save_only_model=True)
    trainer.train()
    for name in _checkpoints(tmp_path / "run"):
        files = os.listdir(tmp_path / "run" / name)
        assert "trainer_state.json" in files
        assert not [n for n in files if n.startswith(("optimizer", "scheduler", "rng_state"))], files
    final = _checkpoint_weights(impl, tmp_path / "run" / "checkpoint-8")
    assert _same_weights(trainer.model, final)
    # the weights resume; the optimizer starts afresh (nothing else was saved), so the run ends elsewhere
    again = _trainer(impl, tmp_path / "run", max_steps=8, save_steps=4, save_only_model=True)
    again.train(resume_from_checkpoint=os.fspath(tmp_path / "run" / "checkpoint-4"))
    assert again.state.global_step == 8
    assert _same_weights(again.model, _checkpoint_weights(impl, tmp_path / "run" / "checkpoint-8"))
    assert not _same_weights(again.model, final)
