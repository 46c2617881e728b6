"""tensorlist.huggingface: Accelerate's save_state/load_state and transformers' Trainer without pickles.

CPU only, tiny models built from code or a config (nothing is downloaded), a
handful of steps, one torch thread. The Trainer runs are marked slow (importing
transformers and running its loop takes seconds).
"""
import json
import math
import os
import pickle

import pytest

torch = pytest.importorskip("torch", reason="the Hugging Face integrations need torch")
accelerate = pytest.importorskip("accelerate", reason="the Accelerate tests need accelerate")

from _hf_support import Tokens, accelerate_epoch, tiny_gpt2  # noqa: E402
from tensorlist import huggingface as hf  # noqa: E402
from tensorlist.cli import main as cli_main  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402
from tensorlist.provenance.record import RecordWarning, read_training_record, verify_model_file, weights_sha256  # noqa: E402
from _paths import SUPPORT  # noqa: E402

#: Steps in an epoch of the Accelerate runs (32 samples, batches of 8).
STEPS_PER_EPOCH = 4


def _pickle_files(directory):
    """Files that are pickles, by name or by their first byte (protocol 2+ opens with 0x80)."""
    found = []
    for root, _, names in os.walk(directory):
        for name in names:
            with open(os.path.join(root, name), "rb") as f:
                head = f.read(1)
            if hf.PICKLE_NAME.search(name) or head == b"\x80":
                found.append(name)
    return found


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


class Halve:
    """An importable schedule (a lambda would be recorded by name only, with a RecordWarning)."""

    def __call__(self, step):
        return 1.0 / (1 + step)


class Counter:
    """An object registered for checkpointing: its state_dict is plain values."""

    def __init__(self):
        self.seen = 0

    def state_dict(self):
        return {"seen": self.seen}

    def load_state_dict(self, state):
        self.seen = state["seen"]


def _accelerate_run(seed=0, seedable=False):
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, Halve())
    g = torch.Generator().manual_seed(1)
    x = torch.randn(8 * STEPS_PER_EPOCH, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=True)
    acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_seedable_sampler=seedable))
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return (acc, counter, *acc.prepare(model, opt, loader, sched))


def _epoch(acc, counter, model, opt, loader, sched, epoch=0):
    losses = accelerate_epoch(acc, model, opt, loader, sched, epoch)
    counter.seen += len(losses)
    return losses


# --------------------------------------------------------------------------
# the small state files


def test_state_file_round_trip_keeps_tuples_and_non_finite(tmp_path):
    path = tmp_path / "scheduler.json"
    state = {"base_lrs": [0.1, 0.2], "best": float("inf"), "pair": (1, 2), 3: "int key"}
    hf.save_state_file(path, "scheduler", state)
    assert hf.read_state_file(path, "scheduler") == state
    assert not _pickle_files(tmp_path)


def test_state_file_of_another_kind_names_the_file(tmp_path):
    path = tmp_path / "scheduler.json"
    hf.save_state_file(path, "sampler", {"epoch": 1})
    with pytest.raises(FormatError, match=r"scheduler\.json.*'sampler' state, expected 'scheduler'"):
        hf.read_state_file(path, "scheduler")


def test_state_file_refuses_a_tensor_naming_where(tmp_path):
    with pytest.raises(TypeError, match=r"scheduler\.w: cannot store a Tensor"):
        hf.save_state_file(tmp_path / "s.json", "scheduler", {"w": torch.zeros(2)})


def test_refuse_pickles_opens_nothing(tmp_path):
    (tmp_path / "optimizer.bin").write_bytes(b"\x80\x04 not even a pickle")
    (tmp_path / "random_states_0.pkl").write_bytes(b"")
    with pytest.raises(FormatError, match=r"\['optimizer\.bin', 'random_states_0\.pkl'\].*never unpickles: fix"):
        hf.refuse_pickles(tmp_path, how="fix")


# --------------------------------------------------------------------------
# Accelerate


def test_accelerate_save_writes_no_pickle_and_loads_back(tmp_path):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    _epoch(acc, counter, model, opt, loader, sched)
    hf.save_state(acc, tmp_path / "ckpt", dataset_params={"name": "sums"})
    names = sorted(n for n in os.listdir(tmp_path / "ckpt") if n.endswith(".json"))
    assert names == ["custom_checkpoint_0.json", "model.json", "optimizer.json", "random_states_0.json",
                     "scheduler.json", "tensorlist_state.json"]
    assert not _pickle_files(tmp_path / "ckpt")
    want = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    acc2, counter2, model2, opt2, loader2, sched2 = _accelerate_run(seed=7)
    hf.load_state(acc2, tmp_path / "ckpt")
    got = acc2.unwrap_model(model2).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert sched2.state_dict()["last_epoch"] == STEPS_PER_EPOCH
    assert counter2.seen == STEPS_PER_EPOCH
    assert opt2.state_dict()["state"][0]["step"] == opt.state_dict()["state"][0]["step"]


@pytest.mark.parametrize("seedable", [False, True], ids=["random-sampler", "seedable-sampler"])
def test_accelerate_resumed_run_continues_bit_exactly(tmp_path, seedable):
    acc, counter, model, opt, loader, sched = _accelerate_run(seedable=seedable)
    _epoch(acc, counter, model, opt, loader, sched, 0)
    hf.save_state(acc, tmp_path / "ckpt")
    assert os.path.exists(tmp_path / "ckpt" / "sampler.json") == seedable
    uninterrupted = _epoch(acc, counter, model, opt, loader, sched, 1)
    acc2, counter2, model2, opt2, loader2, sched2 = _accelerate_run(seed=3, seedable=seedable)
    hf.load_state(acc2, tmp_path / "ckpt")
    assert _epoch(acc2, counter2, model2, opt2, loader2, sched2, 1) == uninterrupted


def test_accelerate_save_runs_the_accelerators_pre_hooks(tmp_path):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    seen = []

    def hook(models, weights, output_dir):
        seen.append((len(models), len(weights), os.fspath(output_dir)))
        weights.pop()  # the hook saves the model itself: save_state then writes no model file

    acc.register_save_state_pre_hook(hook)
    hf.save_state(acc, tmp_path / "ckpt")
    assert seen == [(1, 1, os.fspath(tmp_path / "ckpt"))]
    assert not os.path.exists(tmp_path / "ckpt" / "model.json")


def test_accelerate_stock_checkpoint_is_refused_with_how_to_convert(tmp_path):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    acc.save_state(os.fspath(tmp_path / "stock"))
    with pytest.raises(FormatError, match=r"optimizer\.bin.*random_states_0\.pkl.*accelerator\.load_state"):
        hf.load_state(acc, tmp_path / "stock")


def _saved(tmp_path):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    _epoch(acc, counter, model, opt, loader, sched)
    hf.save_state(acc, tmp_path / "ckpt")
    return tmp_path / "ckpt", _accelerate_run(seed=1)


def _data_file(directory, descriptor):
    return directory / json.loads((directory / descriptor).read_text())["location"]


def test_accelerate_truncated_model_file_names_it(tmp_path):
    ckpt, (acc2, *_) = _saved(tmp_path)
    data = _data_file(ckpt, "model.json")
    data.write_bytes(data.read_bytes()[:100])
    with pytest.raises(FormatError, match=r"model\.json"):
        hf.load_state(acc2, ckpt)


def _reseal(directory, name):
    """Lists ``name``'s new bytes in the manifest, as one who rewrites a checkpoint would."""
    import hashlib

    manifest = directory / hf.MANIFEST_FILE
    doc = json.loads(manifest.read_text())
    doc["files"][name] = hashlib.sha256((directory / name).read_bytes()).hexdigest()
    manifest.write_text(json.dumps(doc))


def test_accelerate_lying_optimizer_file_names_it(tmp_path):
    ckpt, (acc2, *_) = _saved(tmp_path)
    doc = json.loads((ckpt / "optimizer.json").read_text())
    doc["tensors"][1]["dims"] = [4096]  # more than the data file holds
    (ckpt / "optimizer.json").write_text(json.dumps(doc))
    with pytest.raises(FormatError, match=r"optimizer\.json.*not the file tensorlist_state\.json lists"):
        hf.load_state(acc2, ckpt)
    _reseal(ckpt, "optimizer.json")
    with pytest.raises(FormatError, match=r"optimizer\.json"):
        hf.load_state(acc2, ckpt)


def test_accelerate_rng_file_of_another_kind_names_it(tmp_path):
    ckpt, (acc2, *_) = _saved(tmp_path)
    hf.save_state_file(ckpt / "random_states_0.json", "scheduler", {})
    _reseal(ckpt, "random_states_0.json")
    with pytest.raises(FormatError, match=r"random_states_0\.json.*expected 'rng'"):
        hf.load_state(acc2, ckpt)


def test_accelerate_save_killed_midway_is_refused_and_the_previous_one_loads(tmp_path, monkeypatch):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    hf.save_state(acc, tmp_path / "one")
    _epoch(acc, counter, model, opt, loader, sched)
    hf.save_state(acc, tmp_path / "two")

    def killed(*args, **kwargs):
        raise KeyboardInterrupt("killed")

    monkeypatch.setattr(hf, "save_optimizer_state", killed)  # after model.json, before the rest
    for directory in ("two", "three"):  # into the last save's directory, and into a new one
        with pytest.raises(KeyboardInterrupt):
            hf.save_state(acc, tmp_path / directory)
    monkeypatch.undo()
    acc2, counter2, model2, *_ = _accelerate_run(seed=4)
    for directory in ("two", "three"):
        with pytest.raises(FormatError, match=r"no tensorlist_state\.json: not a complete"):
            hf.load_state(acc2, tmp_path / directory)
    hf.load_state(acc2, tmp_path / "one")
    assert counter2.seen == 0


def test_accelerate_files_of_two_saves_mixed_are_refused(tmp_path):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    hf.save_state(acc, tmp_path / "one")
    _epoch(acc, counter, model, opt, loader, sched)
    hf.save_state(acc, tmp_path / "two")
    for name in os.listdir(tmp_path / "one"):
        if name.startswith("optimizer.json"):
            (tmp_path / "two" / name).write_bytes((tmp_path / "one" / name).read_bytes())
    with pytest.raises(FormatError, match=r"two.optimizer\.json.*not the file tensorlist_state\.json lists"):
        hf.load_state(acc, tmp_path / "two")


def test_accelerate_model_file_carries_a_record_that_the_cli_reads(tmp_path, capsys):
    ckpt, _ = _saved(tmp_path)
    record = verify_model_file(ckpt / "model.json")
    assert record["optimizer"]["class"] == "torch.optim.adamw.AdamW"
    assert record["optimizer"]["scheduler"]["class"] == "torch.optim.lr_scheduler.LambdaLR"
    assert record["solver"]["solver_params"] == {"step": 0}
    assert cli_main(["record", os.fspath(ckpt / "model.json")]) == 0
    assert "torch.optim.adamw.AdamW" in capsys.readouterr().out


def test_accelerate_record_from_a_recorder(tmp_path):
    from tensorlist.provenance.record import TrainingRecorder

    acc, counter, model, opt, loader, sched = _accelerate_run()
    plain = acc.unwrap_model(model)
    recorder = TrainingRecorder(plain, opt.optimizer, train_loader=loader, epochs=2, seed=0,
                                initial_weights={"from": "random_state"})
    recorder.epoch_done(sum(_epoch(acc, counter, model, opt, loader, sched)) / STEPS_PER_EPOCH)
    hf.save_state(acc, tmp_path / "ckpt", training=recorder, dataset_params={"name": "sums"})
    record = read_training_record(tmp_path / "ckpt" / "model.json")
    assert (record["epochs"], record["seed"], record["weights"]["kind"]) == ({"asked": 2, "done": 1}, 0, "checkpoint")


def _automatic(tmp_path, total_limit=None):
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    config = ProjectConfiguration(project_dir=os.fspath(tmp_path), automatic_checkpoint_naming=True,
                                  total_limit=total_limit)
    acc = Accelerator(cpu=True, project_config=config)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    acc.prepare(torch.nn.Linear(2, 2))
    return acc, counter


def test_accelerate_automatic_save_that_fails_keeps_every_earlier_checkpoint(tmp_path):
    acc, counter = _automatic(tmp_path, total_limit=2)
    hf.save_state(acc)
    hf.save_state(acc)
    counter.seen = torch.zeros(1)  # a tensor in a custom state: refused (TypeError) midway through the save
    with pytest.raises(TypeError):
        hf.save_state(acc)
    # nothing pruned, the failed save's directory gone, the iteration where it was
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_0", "checkpoint_1"]
    assert acc.project_configuration.iteration == 2
    counter.seen = 5
    assert hf.save_state(acc) == os.fspath(tmp_path / "checkpoints" / "checkpoint_2")
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["checkpoint_1", "checkpoint_2"]
    counter.seen = 0
    hf.load_state(acc)
    assert counter.seen == 5


def test_accelerate_load_without_a_directory_passes_over_a_save_cut_short(tmp_path):
    acc, counter = _automatic(tmp_path)
    counter.seen = 1
    hf.save_state(acc)
    (tmp_path / "checkpoints" / "checkpoint_1").mkdir()  # a save killed before its manifest
    (tmp_path / "checkpoints" / "notes.txt").write_text("not a checkpoint")
    counter.seen = 0
    hf.load_state(acc)
    assert counter.seen == 1
    with pytest.raises(ValueError, match="already exists"):
        hf.save_state(acc)  # iteration 1: its directory is there


def test_accelerate_without_a_directory_or_automatic_naming_is_refused(tmp_path):
    acc, _ = _accelerate_run()[:2]
    with pytest.raises(ValueError, match="automatic checkpoint naming is disabled"):
        hf.save_state(acc)
    with pytest.raises(ValueError, match="automatic checkpoint naming is disabled"):
        hf.load_state(acc)
    assert acc.project_configuration.iteration == 0


# --------------------------------------------------------------------------
# transformers' Trainer


def _trainer(out, *, steps=8, save_steps=3, cls=None, training_args=None, **kwargs):
    transformers = pytest.importorskip("transformers", reason="the Trainer tests need transformers")
    model = tiny_gpt2()
    args = transformers.TrainingArguments(
        output_dir=os.fspath(out), max_steps=steps, per_device_train_batch_size=4, save_steps=save_steps,
        logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, learning_rate=1e-2,
        dataloader_num_workers=0, **(training_args or {}))
    cls = cls or hf.TensorListTrainer
    return cls(model=model, args=args, train_dataset=Tokens(), **kwargs)


def _losses(trainer, after=0):
    return [e["loss"] for e in trainer.state.log_history if "loss" in e and e["step"] > after]


@pytest.mark.slow
def test_trainer_checkpoints_are_tensorlist_and_resume_bit_exactly(tmp_path):
    full = _trainer(tmp_path / "run")
    full.train()
    uninterrupted = _losses(full)
    assert len(uninterrupted) == 8
    ckpt = tmp_path / "run" / "checkpoint-3"  # mid-epoch: 4 steps per epoch
    assert sorted(n for n in os.listdir(ckpt) if n.endswith(".json")) == [
        "config.json", "generation_config.json", "model.json", "optimizer.json", "rng_state.json",
        "scheduler.json", "trainer_state.json", "training_args.json"]
    assert not _pickle_files(tmp_path / "run")
    assert json.loads((ckpt / "training_args.json").read_text())["seed"] == 0
    for step in (3, 6):
        resumed = _trainer(tmp_path / "run")
        resumed.train(resume_from_checkpoint=os.fspath(tmp_path / "run" / f"checkpoint-{step}"))
        assert _losses(resumed, after=step) == uninterrupted[step:]
    cut_short = tmp_path / "run" / "checkpoint-9"  # a save killed before trainer_state.json
    cut_short.mkdir()
    for name in os.listdir(tmp_path / "run" / "checkpoint-8"):
        if name.startswith("model.json"):
            (cut_short / name).write_bytes((tmp_path / "run" / "checkpoint-8" / name).read_bytes())
    assert hf.last_checkpoint(tmp_path / "run") == os.fspath(tmp_path / "run" / "checkpoint-8")
    last = _trainer(tmp_path / "run")
    last.train(resume_from_checkpoint=True)  # the last complete one: checkpoint-8, nothing left to run
    assert last.state.global_step == 8


@pytest.mark.slow
def test_trainer_model_file_carries_the_training_record(tmp_path, capsys):
    trainer = _trainer(tmp_path / "run", dataset_params={"name": "tokens", "size": 16},
                       initial_weights={"from": "random_state"})
    start = weights_sha256(trainer.model)
    trainer.train()
    record = verify_model_file(tmp_path / "run" / "checkpoint-6" / "model.json")
    assert record["seed"] == 0 and record["initial_weights_sha256"] == start
    assert record["initial_weights"] == {"from": "random_state"}
    assert record["epochs"] == {"asked": 2, "done": 1} and record["weights"]["kind"] == "checkpoint"
    assert len(record["history"]["training_loss"]) == 1
    assert record["optimizer"]["class"] == "torch.optim.adamw.AdamW"
    assert len(record["optimizer"]["parameter_groups"]) == 2  # the Trainer's decay / no-decay groups
    params = record["solver"]["solver_params"]
    assert params["global_step"] == 6 and len([e for e in params["log_history"] if "loss" in e]) == 6
    assert params["training_args"]["learning_rate"] == 1e-2
    # the resumed run keeps the first run's starting weights and seed
    resumed = _trainer(tmp_path / "run")
    resumed.train(resume_from_checkpoint=os.fspath(tmp_path / "run" / "checkpoint-6"))
    resumed.save_model(os.fspath(tmp_path / "final"))
    final = verify_model_file(tmp_path / "final" / "model.json")
    assert final["initial_weights_sha256"] == start and final["weights"]["kind"] == "final"
    assert final["epochs"]["done"] == 2 and len(final["history"]["training_loss"]) == 2
    assert cli_main(["record", os.fspath(tmp_path / "final" / "model.json")]) == 0
    assert "TensorListTrainer" in capsys.readouterr().out


@pytest.mark.parametrize("strategy", ["epoch", "steps"])
def test_trainer_record_carries_each_epochs_evaluation(tmp_path, strategy):
    """An evaluating run's model files: a validation section and each epoch's last eval_loss; the final save
    after load_best_model_at_end holds best_validation weights."""
    trainer = _trainer(tmp_path / "run", steps=-1, save_steps=3, eval_dataset=Tokens(8),
                       eval_dataset_params={"name": "tokens", "split": "eval"},
                       training_args=dict(num_train_epochs=2, eval_strategy=strategy, eval_steps=3,
                                          save_strategy=strategy, load_best_model_at_end=True))
    trainer.train()
    evals = [e for e in trainer.state.log_history if "eval_loss" in e]
    last_of_epoch = {}
    for e in evals:
        last_of_epoch[max(1, math.ceil(e["epoch"] - 1e-9))] = e["eval_loss"]
    for name in sorted(os.listdir(tmp_path / "run")):
        record = verify_model_file(tmp_path / "run" / name / "model.json")
        done = record["epochs"]["done"]
        assert record["validation"]["dataset_params"] == {"name": "tokens", "split": "eval"}
        assert record["validation"]["loader"]["batch_size"] == 8 and record["validation"]["every"] == 1
        assert record["solver"]["solver_params"]["validation_metric"] == "eval_loss"
        step = int(name.split("-")[1])
        seen = {}
        for e in evals:
            if e["step"] <= step and math.ceil(e["epoch"] - 1e-9) <= done:
                seen[max(1, math.ceil(e["epoch"] - 1e-9))] = e["eval_loss"]
        assert record["history"]["validation"] == [seen.get(i) for i in range(1, done + 1)]
    trainer.save_model(os.fspath(tmp_path / "final"))
    final = verify_model_file(tmp_path / "final" / "model.json")
    assert final["history"]["validation"] == [last_of_epoch[1], last_of_epoch[2]]
    best = [e for e in evals if e["step"] == trainer.state.best_global_step][0]
    assert final["weights"]["kind"] == "best_validation"
    assert final["weights"]["validation"] == trainer.state.best_metric == best["eval_loss"]
    assert final["weights"]["epoch"] == max(1, math.ceil(best["epoch"] - 1e-9))


@pytest.mark.slow
def test_trainer_weights_export_for_from_pretrained(tmp_path):
    import transformers

    trainer = _trainer(tmp_path / "run", steps=3, export_safetensors=True)
    trainer.train()
    ckpt = tmp_path / "run" / "checkpoint-3"
    want = trainer.model.state_dict()
    for directory in (ckpt, hf.export_pretrained(ckpt, tmp_path / "export").rsplit(os.sep, 1)[0]):
        loaded = transformers.GPT2LMHeadModel.from_pretrained(os.fspath(directory))
        got = loaded.state_dict()
        assert all(torch.equal(got[k], want[k]) for k in want)
    from safetensors import safe_open

    with safe_open(os.fspath(tmp_path / "export" / "model.safetensors"), "pt") as f:
        assert json.loads(f.metadata()["tensorlist.training"])["seed"] == 0


@pytest.mark.slow
def test_trainer_stock_checkpoint_is_refused_never_unpickled(tmp_path, monkeypatch):
    import transformers

    stock = _trainer(tmp_path / "stock", steps=3, cls=transformers.Trainer)
    stock.train()
    ckpt = os.fspath(tmp_path / "stock" / "checkpoint-3")
    assert {"optimizer.pt", "rng_state.pth", "training_args.bin"} <= set(os.listdir(ckpt))

    def no_unpickling(*args, **kwargs):
        raise AssertionError("something was unpickled")

    monkeypatch.setattr(torch, "load", no_unpickling)
    monkeypatch.setattr(pickle, "load", no_unpickling)
    trainer = _trainer(tmp_path / "stock", steps=3)
    with pytest.raises(FormatError, match=r"optimizer\.pt.*never unpickles.*convert_stock_checkpoint"):
        trainer.train(resume_from_checkpoint=ckpt)


@pytest.mark.slow
def test_trainer_converted_stock_checkpoint_continues_the_stock_run(tmp_path):
    import transformers

    stock = _trainer(tmp_path / "stock", cls=transformers.Trainer)
    stock.train()
    converted = tmp_path / "converted" / "checkpoint-3"
    converter = _trainer(tmp_path / "converted")
    before = torch.get_rng_state()
    converter.convert_stock_checkpoint(tmp_path / "stock" / "checkpoint-3", converted)
    assert torch.equal(torch.get_rng_state(), before)  # the caller's RNG states are put back
    assert not _pickle_files(converted)
    assert (converted / "trainer_state.json").exists() and (converted / "training_args.json").exists()
    assert verify_model_file(converted / "model.json")["initial_weights_sha256"] is None  # not known
    resumed = _trainer(tmp_path / "converted")
    resumed.train(resume_from_checkpoint=os.fspath(converted))
    assert _losses(resumed, after=3) == _losses(stock)[3:]


@pytest.mark.slow
def test_importing_the_package_imports_transformers_only_when_the_trainer_is_asked_for():
    import subprocess
    import sys

    code = ("import sys, tensorlist.huggingface as h; assert 'transformers' not in sys.modules; "
            "assert 'accelerate' not in sys.modules; assert callable(h.last_checkpoint) and callable(h.trainer_record); "
            "assert 'TensorListTrainer' in dir(h); T = h.TensorListTrainer; assert 'transformers' in sys.modules; "
            "from tensorlist.huggingface.trainer import TensorListTrainer; assert T is TensorListTrainer; "
            "from tensorlist.huggingface import TensorListTrainer as U; assert U is T; print('ok')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "ok", out.stderr


def test_an_unknown_name_of_the_package_is_an_attribute_error():
    with pytest.raises(AttributeError, match="TensorListTrainers"):
        hf.TensorListTrainers  # noqa: B018 - the module __getattr__ answers only TensorListTrainer


@pytest.mark.slow
def test_trainer_records_name_the_trainer_class_importably_without_a_warning(tmp_path, recwarn):
    import importlib

    from tensorlist.provenance.record._common import name_of

    trainer = _trainer(tmp_path / "run", steps=3, save_steps=3)
    trainer.train()
    trainer.save_model(os.fspath(tmp_path / "final"))
    assert not [w for w in recwarn if issubclass(w.category, RecordWarning)], [str(w.message) for w in recwarn]
    for path in (tmp_path / "run" / "checkpoint-3" / "model.json", tmp_path / "final" / "model.json"):
        named = verify_model_file(path)["solver"]["class"]
        assert named == "tensorlist.huggingface.trainer.TensorListTrainer"
        module, _, qualname = named.rpartition(".")
        assert getattr(importlib.import_module(module), qualname) is hf.TensorListTrainer is type(trainer)
        assert name_of(hf.TensorListTrainer) == (named, True)  # what the record's importable flag is made from


def test_a_lambda_schedule_is_recorded_by_name_with_a_warning(tmp_path):
    acc, counter, model, opt, loader, sched = _accelerate_run()
    sched.scheduler.lr_lambdas = [lambda step: 1.0]
    with pytest.warns(RecordWarning, match="lambda"):
        hf.save_state(acc, tmp_path / "ckpt")


@pytest.mark.slow
def test_accelerate_ddp_two_processes_resume_bit_exactly(tmp_path):
    import _ranks

    script = os.path.join(SUPPORT, "_hf_ddp_script.py")
    _ranks.run_script(script, "save", 2, tmp_path, timeout=120)
    assert sorted(n for n in os.listdir(tmp_path / "ckpt") if n.startswith("random_states_")
                  and n.endswith(".json")) == ["random_states_0.json", "random_states_1.json"]
    assert not _pickle_files(tmp_path / "ckpt")
    _ranks.run_script(script, "resume", 2, tmp_path, timeout=120)
    for rank in range(2):
        full = json.loads((tmp_path / f"full_{rank}.json").read_text())
        assert len(full) == 4  # 32 samples, 2 ranks, batches of 4
        assert json.loads((tmp_path / f"resumed_{rank}.json").read_text()) == full


@pytest.mark.slow
@pytest.mark.parametrize("descriptor", ["model.json", "optimizer.json", "rng_state.json"])
def test_trainer_truncated_checkpoint_file_names_it_on_resume(tmp_path, descriptor):
    _trainer(tmp_path / "run", steps=3).train()
    ckpt = tmp_path / "run" / "checkpoint-3"
    data = _data_file(ckpt, descriptor)
    data.write_bytes(data.read_bytes()[:-8])
    with pytest.raises(FormatError, match=descriptor.replace(".", r"\.")):
        _trainer(tmp_path / "run", steps=6).train(resume_from_checkpoint=os.fspath(ckpt))


@pytest.mark.slow
def test_trainer_ddp_two_processes_resume_bit_exactly(tmp_path):
    import _ranks

    pytest.importorskip("transformers", reason="the Trainer tests need transformers")
    script = os.path.join(SUPPORT, "_hf_trainer_ddp_script.py")
    _ranks.run_script(script, "full", 2, tmp_path, timeout=180)
    ckpt = tmp_path / "run" / "checkpoint-3"
    assert {"rng_state_0.json", "rng_state_1.json", "model.json", "optimizer.json"} <= set(os.listdir(ckpt))
    assert not _pickle_files(tmp_path / "run")
    _ranks.run_script(script, "resume", 2, tmp_path, timeout=180)
    full = json.loads((tmp_path / "full.json").read_text())
    assert len(full) == 8
    assert json.loads((tmp_path / "resume.json").read_text()) == full[3:]
