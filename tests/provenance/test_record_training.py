"""Records built from a real torch training loop, and the model files that carry them."""
from __future__ import annotations

import json
import math
import os
import re
import tempfile
import warnings

import jsonschema
import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")
from hypothesis import HealthCheck, example, given, settings
from torch.utils.data import DataLoader, TensorDataset

import tensorlist
from _record_support import records
from tensorlist.errors import FormatError
from tensorlist.schema import load_schema
from tensorlist.provenance.record import (
    RecordWarning,
    anchor_paths,
    TrainingRecorder,
    build_training_record,
    dataset_content_hash,
    model_file_origin,
    optimizer_record,
    read_dataset_params,
    read_training_record,
    save_model_file,
    validate_training_record,
    verify_model_file,
    weights_sha256,
)

X = torch.linspace(-1, 1, 64).reshape(32, 2)
Y = (X[:, :1] * 3 - X[:, 1:] * 2).contiguous()
DATA = TensorDataset(X, Y)
DATA_PARAMS = {"name": "toy-linear", "samples": 32, "content_hash": dataset_content_hash({"x": X, "y": Y})}


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def minimal(**overrides):
    model = make_model()
    kwargs = dict(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1), model=model,
        train_loader=DataLoader(DATA, batch_size=8), epochs_asked=5, epochs_done=2,
        training_loss=[1.0, 0.5, 0.0, 0.0, 0.0], loss=torch.nn.MSELoss(),
    )
    kwargs.update(overrides)
    return build_training_record(**kwargs)


# --- the builder -----------------------------------------------------------------

def test_builder_makes_a_valid_record_from_torch_objects():
    """Optimizer, loss, loader and loop settings become the record's fields."""
    record = minimal(seed=7, solver="lab.Loop", solver_params={"clip": 1.0, "device": "cuda", "verbose": True,
                                                               "save_folder": "/x", "model": 1})
    validate_training_record(record)
    jsonschema.Draft202012Validator(load_schema("training-record.schema.json")).validate(record)
    assert record.optimizer["class"] == "torch.optim.sgd.SGD"
    assert record.optimizer["hyperparameters"]["lr"] == 0.1
    assert record.optimizer["parameter_groups"] is None  # one group of all parameters, defaults
    assert record.optimizer["scheduler"] is None and record.optimizer["scheduler_step"] is None
    assert record.solver == {"class": "lab.Loop", "solver_params": {"clip": 1.0},
                             "loss": {"class": "torch.nn.modules.loss.MSELoss", "args": {"reduction": "mean"},
                                      "importable": True}}
    assert record.train == {"batch_size": 8, "shuffle": False, "drop_last": False, "sampler": None}
    assert record.history.training_loss == [1.0, 0.5]  # cut to done: no placeholder zeros
    assert record.history.validation == [None, None] and record.history.learning_rate == [None, None]
    assert record.seed == 7 and record.epochs == {"asked": 5, "done": 2}
    assert record.weights == {"kind": "final", "epoch": 2, "validation": None, "sha256": None}
    assert record.initial_weights == {"from": None, "origin": None}
    assert record.environment.torch == torch.__version__


def test_parameter_groups_are_named_with_their_starting_rates():
    """Several groups: each one's parameters by name, its initial lr and settings."""
    model = make_model()
    opt = torch.optim.Adam([
        {"params": model[0].parameters(), "lr": 0.01},
        {"params": model[2].parameters(), "weight_decay": 0.1},
    ], lr=0.001)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.1)
    for _ in range(3):
        opt.step()
        sched.step()  # the current lr has moved; the record keeps the starting ones
    section = optimizer_record(opt, model=model, scheduler=sched, scheduler_step="epoch")
    groups = section["parameter_groups"]
    assert [g["parameters"] for g in groups] == [["0.weight", "0.bias"], ["2.weight", "2.bias"]]
    assert [g["initial_lr"] for g in groups] == [0.01, 0.001]
    assert groups[0]["settings"]["weight_decay"] == 0 and groups[1]["settings"]["weight_decay"] == 0.1
    assert groups[0]["settings"]["betas"] == [0.9, 0.999]
    assert section["scheduler"] == {"class": "torch.optim.lr_scheduler.StepLR",
                                    "args": {"step_size": 1, "gamma": 0.1}, "importable": True}


def test_a_single_group_that_leaves_out_parameters_is_listed():
    """One group of only some parameters (a frozen layer) is not 'all the parameters'."""
    model = make_model()
    opt = torch.optim.SGD(model[2].parameters(), lr=0.1)
    assert optimizer_record(opt, model=model)["parameter_groups"] == [
        {"parameters": ["2.weight", "2.bias"], "initial_lr": 0.1,
         "settings": {k: v for k, v in json.loads(json.dumps(opt.defaults)).items() if k != "lr"}}]


def test_parameters_without_a_model_are_named_by_position_with_a_warning():
    """Without the model, listed groups name parameters '#0', '#1', ..., and say so."""
    model = make_model()
    opt = torch.optim.SGD([{"params": [model[0].weight]}, {"params": [model[0].bias], "lr": 1.0}], lr=0.1)
    with pytest.warns(RecordWarning, match="named by position"):
        section = optimizer_record(opt)
    assert [g["parameters"] for g in section["parameter_groups"]] == [["#0"], ["#1"]]


@pytest.mark.parametrize("make, step, expected_class, expected_args", [
    (lambda o: torch.optim.lr_scheduler.OneCycleLR(o, max_lr=1.0, total_steps=20), "batch",
     "torch.optim.lr_scheduler.OneCycleLR", {"total_steps": 20}),
    (lambda o: torch.optim.lr_scheduler.ReduceLROnPlateau(o, patience=3, factor=0.5, min_lr=1e-5), "epoch",
     "torch.optim.lr_scheduler.ReduceLROnPlateau", {"mode": "min", "factor": 0.5, "patience": 3,
                                                    "min_lr": [1e-5]}),
    (lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=10, eta_min=0.001), "epoch",
     "torch.optim.lr_scheduler.CosineAnnealingLR", {"T_max": 10, "eta_min": 0.001}),
    (lambda o: torch.optim.lr_scheduler.SequentialLR(o, [torch.optim.lr_scheduler.ConstantLR(o, factor=0.5,
                                                                                                total_iters=2),
                                                         torch.optim.lr_scheduler.ExponentialLR(o, gamma=0.9)],
                                                     milestones=[2]), "epoch",
     "torch.optim.lr_scheduler.SequentialLR", {"milestones": [2]}),
])
def test_scheduler_specs(make, step, expected_class, expected_args):
    """Common schedulers are recorded by class and the arguments they keep."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    section = optimizer_record(opt, model=model, scheduler=make(opt), scheduler_step=step)
    assert section["scheduler"]["class"] == expected_class and section["scheduler_step"] == step
    for key, value in expected_args.items():
        assert section["scheduler"]["args"][key] == value
    json.dumps(section, allow_nan=False)


def test_sequential_scheduler_records_its_children():
    """Nested schedulers are specs inside the parent's args."""
    opt = torch.optim.SGD(make_model().parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.SequentialLR(
        opt, [torch.optim.lr_scheduler.ConstantLR(opt, factor=0.5, total_iters=2),
              torch.optim.lr_scheduler.ExponentialLR(opt, gamma=0.9)], milestones=[2])
    children = optimizer_record(opt, scheduler=sched, scheduler_step="epoch")["scheduler"]["args"]["schedulers"]
    assert [c["class"] for c in children] == ["torch.optim.lr_scheduler.ConstantLR",
                                              "torch.optim.lr_scheduler.ExponentialLR"]
    assert children[1]["args"]["gamma"] == 0.9


def test_lambda_scheduler_and_loss_are_named_with_warnings():
    """A LambdaLR's lambda and a lambda loss are named in the record, with warnings."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda epoch: 0.95 ** epoch)
    with pytest.warns(RecordWarning) as caught:
        record = minimal(optimizer=opt, model=model, scheduler=sched, scheduler_step="epoch",
                         loss=lambda out, y: ((out - y) ** 2).mean())
    assert record.solver["loss"]["callable"].endswith("<lambda>") and record.solver["loss"]["importable"] is False
    [fn] = record.optimizer["scheduler"]["args"]["lr_lambda"]
    assert fn["callable"].endswith("<lambda>") and fn["importable"] is False
    texts = [str(w.message) for w in caught]
    assert any("solver.loss" in t for t in texts) and any("optimizer.scheduler.args.lr_lambda[0]" in t for t in texts)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(scheduler_step="epoch"), ValueError, "without a scheduler"),
    (dict(weights_kind="best"), ValueError, "weights_kind must be one of"),
    (dict(weights_kind="best_validation"), ValueError, "needs the weights' validation value"),
    (dict(weights_kind="best_validation", weights_validation=0.5), FormatError,
     "field 'weights.kind': is 'best_validation' but the record has no validation"),
    (dict(weights_epoch=3), FormatError, "field 'weights.epoch': epoch 3 is after the last epoch done"),
    (dict(training_loss=[1.0]), ValueError, "2 epochs done but only 1 values"),
    (dict(initial_weights={"from": "file"}), FormatError, "field 'initial_weights.file': missing required field"),
    (dict(initial_weights_sha256="abc"), FormatError, "field 'initial_weights_sha256': expected 64 lowercase hex"),
    (dict(validation={"every": 0}), FormatError, "field 'validation.every': expected at least 1"),
    (dict(validation={"evry": 2}), ValueError, "unexpected keys"),
    (dict(seed=1.5), TypeError, "seed must be an integer or None, got 1.5"),
    (dict(epochs_done="2"), TypeError, "epochs_done must be an integer, got '2'"),
])
def test_builder_errors_name_the_problem(kwargs, error, message):
    """Inconsistent pieces are refused before any file is written."""
    with pytest.raises(error, match=re.escape(message)):
        minimal(**kwargs)


def test_scheduler_needs_its_step():
    """A scheduler without scheduler_step is refused."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="scheduler_step must be 'epoch' or 'batch'"):
        optimizer_record(opt, scheduler=torch.optim.lr_scheduler.StepLR(opt, 1))


def test_non_finite_history_and_hyperparameters_become_null():
    """NaN/inf losses become null in history; a non-finite setting is nulled with a warning."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.defaults["max_grad"] = math.inf
    with pytest.warns(RecordWarning, match=r"optimizer.hyperparameters.max_grad is inf"):
        record = minimal(optimizer=opt, model=model, epochs_done=3,
                         training_loss=[math.nan, math.inf, 0.5], learning_rates=[0.1, float("nan"), 0.1])
    assert record.history.training_loss == [None, None, 0.5] and record.history.learning_rate == [0.1, None, 0.1]
    assert record.optimizer["hyperparameters"]["max_grad"] is None
    assert "NaN" not in record.to_json() and "Infinity" not in record.to_json()


# --- a real training loop -------------------------------------------------------------

def train(tmp_path, *, epochs=4, resume_from=None, seed=0):
    """A small real loop that saves a checkpoint each epoch, the best and the final weights."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    model = make_model(seed)
    start = weights_sha256(model)
    opt = torch.optim.AdamW([{"params": model[0].parameters(), "lr": 0.05},
                             {"params": model[2].parameters()}], lr=0.02)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    g = torch.Generator().manual_seed(seed)
    loader = DataLoader(DATA, batch_size=8, shuffle=True, generator=g)
    val_loader = DataLoader(DATA, batch_size=16)
    loss_fn = torch.nn.MSELoss()
    recorder = TrainingRecorder(
        model, opt, loss=loss_fn, train_loader=loader, epochs=epochs, scheduler=sched, scheduler_step="epoch",
        seed=seed, initial_weights={"from": "random_state"},
        validation={"loader": val_loader, "every": 2, "dataset_params": {"name": "toy-val"}},
        solver="tests.train", solver_params={"device": "cpu", "clip_norm": None},
    )
    assert recorder.initial_weights_sha256 == start
    if resume_from is not None:
        recorder.resume(read_training_record(resume_from))
        model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensorlist.load(resume_from).items()})
    paths = {}
    for epoch in range(recorder.epochs_done + 1, epochs + 1):
        total = 0.0
        for x, y in loader:
            opt.zero_grad()
            loss = loss_fn(model(x), y)
            loss.backward()
            opt.step()
            total += loss.detach().item() / len(loader)
        val = None
        if epoch % 2 == 0:
            with torch.no_grad():
                val = sum(float(loss_fn(model(x), y)) for x, y in val_loader) / len(val_loader)
        assert recorder.epoch_done(total, validation=val) == epoch
        sched.step()
        paths[f"checkpoint{epoch}"] = tmp_path / f"checkpoint{epoch}.json"
        recorder.save(paths[f"checkpoint{epoch}"], model, kind="checkpoint", dataset_params=DATA_PARAMS)
        if val is not None and recorder.best_epoch == epoch:
            paths["best"] = tmp_path / "best.json"
            recorder.save(paths["best"], model, kind="best_validation", dataset_params=DATA_PARAMS)
    paths["final"] = tmp_path / "final.json"
    recorder.save(paths["final"], model.state_dict(), dataset_params=DATA_PARAMS)
    return model, recorder, paths, start


def test_every_saved_file_carries_a_valid_record(tmp_path):
    """Final, best-validation and each checkpoint: a model file with both records and matching hashes."""
    model, recorder, paths, start = train(tmp_path)
    assert set(paths) == {"checkpoint1", "checkpoint2", "checkpoint3", "checkpoint4", "best", "final"}
    for name, path in paths.items():
        tensorlist.validate(path)
        record = verify_model_file(path)
        assert read_dataset_params(path) == DATA_PARAMS
        assert record.initial_weights_sha256 == start
        assert record.weights.sha256 == weights_sha256(path)
        assert record.epochs.asked == 4
        doc = json.loads(open(path).read())  # strict JSON all through, valid for any validator
        jsonschema.Draft202012Validator(load_schema("training-record.schema.json")).validate(doc["metadata"]["training"])
        jsonschema.Draft202012Validator(load_schema("dataset-params.schema.json")).validate(doc["metadata"]["dataset_params"])
    final = read_training_record(paths["final"])
    assert final.weights.kind == "final" and final.weights.epoch == 4 and final.epochs.done == 4
    assert final.weights.sha256 == weights_sha256(model)
    assert final.history.learning_rate == [[0.05, 0.02], [0.05, 0.02], [0.025, 0.01], [0.025, 0.01]]
    assert final.history.validation[0] is None and final.history.validation[2] is None
    assert all(isinstance(v, float) for v in final.history.validation[1::2])
    assert final.train == {"batch_size": 8, "shuffle": True, "drop_last": False, "sampler": None}
    assert final.validation["every"] == 2 and final.validation["loader"]["batch_size"] == 16
    assert final.validation["function"] == final.solver["loss"]
    assert final.solver["solver_params"] == {"clip_norm": None}
    best = read_training_record(paths["best"])
    assert best.weights.kind == "best_validation"
    assert best.weights.validation == min(v for v in final.history.validation if v is not None)
    assert best.weights.sha256 == read_training_record(paths[f"checkpoint{best.weights.epoch}"]).weights.sha256
    for epoch in range(1, 5):
        ck = read_training_record(paths[f"checkpoint{epoch}"])
        assert ck.weights.kind == "checkpoint" and ck.weights.epoch == ck.epochs.done == epoch
        assert ck.history.training_loss == final.history.training_loss[:epoch]


def test_a_fixed_seed_gives_the_same_weights_and_hash(tmp_path):
    """Two runs with the same seed end with the same weights hash; the record lets you check it."""
    _, _, a, _ = train(tmp_path / "a", epochs=2)
    _, _, b, _ = train(tmp_path / "b", epochs=2)
    assert read_training_record(a["final"]).weights.sha256 == read_training_record(b["final"]).weights.sha256


def test_resumed_run_continues_the_history(tmp_path):
    """Resuming from a checkpoint keeps the earlier epochs and adds no placeholders."""
    _, _, first, _ = train(tmp_path / "first", epochs=2)
    _, recorder, second, _ = train(tmp_path / "second", epochs=4, resume_from=first["checkpoint2"])
    final = read_training_record(second["final"])
    earlier = read_training_record(first["checkpoint2"])
    assert final.epochs.done == 4 and len(final.history.training_loss) == 4
    assert final.history.training_loss[:2] == earlier.history.training_loss
    assert {"checkpoint3", "checkpoint4", "final"} <= set(second) and "checkpoint1" not in second
    assert recorder.initial_weights_sha256 == earlier.initial_weights_sha256  # the run's true start


def test_fine_tuned_model_names_its_origin(tmp_path):
    """Weights loaded from a model file: initial_weights.origin holds that file and its weights hash."""
    _, _, base, _ = train(tmp_path / "base", epochs=1)
    origin = model_file_origin(base["final"])
    assert origin == {"file": str(base["final"]), "weights_sha256": read_training_record(base["final"]).weights.sha256}
    model = make_model()
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensorlist.load(base["final"]).items()})
    record = minimal(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.01),
                     initial_weights={"from": None, "origin": origin},
                     initial_weights_sha256=weights_sha256(model))
    assert record.initial_weights_sha256 == origin["weights_sha256"]


def test_best_validation_without_any_validation_is_refused(tmp_path):
    """A recorder with no validated epoch has no best weights to save."""
    model = make_model()
    recorder = TrainingRecorder(model, torch.optim.SGD(model.parameters(), lr=0.1),
                                train_loader=DataLoader(DATA, batch_size=4), epochs=1)
    recorder.epoch_done(0.5)
    with pytest.raises(ValueError, match="no validated epoch"):
        recorder.record("best_validation")
    assert recorder.record().history.learning_rate == [0.1]


# --- model files ------------------------------------------------------------------------

def test_model_file_is_a_tensorlist_file_with_both_records(tmp_path):
    """load gives the weights, validate passes, the records sit in metadata."""
    weights = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": torch.ones(3, dtype=torch.bfloat16)}
    record = minimal()
    path = tmp_path / "model.json"
    saved = save_model_file(path, weights, training=record, dataset_params={"name": "toy"},
                            metadata={"notes": "ok"}, alignment=4096)
    assert record.weights.sha256 is None  # the caller's record is not modified
    assert saved.weights.sha256 == weights_sha256(weights) == weights_sha256(path)
    loaded = tensorlist.load(path)
    assert list(loaded) == ["w", "b"] and np.array_equal(loaded["w"], weights["w"])
    assert loaded["b"].dtype.name == "bfloat16"
    tensorlist.validate(path)
    doc = json.loads(path.read_text())
    assert doc["metadata"]["notes"] == "ok" and doc["metadata"]["dataset_params"] == {"name": "toy"}
    assert read_training_record(path) == saved
    assert tensorlist.open(path).metadata["training"] == saved


def test_model_file_with_positional_weights_and_a_module(tmp_path):
    """A sequence is saved under "0", "1", ...; a module as its state_dict."""
    record = minimal()
    save_model_file(tmp_path / "a.json", [np.zeros(2), np.ones(3)], training=record, dataset_params={})
    assert list(tensorlist.load(tmp_path / "a.json")) == ["0", "1"]
    model = make_model()
    saved = save_model_file(tmp_path / "b.json", model, training=record, dataset_params={})
    assert list(tensorlist.load(tmp_path / "b.json")) == list(model.state_dict())
    assert saved.weights.sha256 == weights_sha256(model)


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(dataset_params={"content_hash": "x"}), FormatError, "field 'dataset_params.content_hash'"),
    (dict(metadata={"training": 1}), ValueError, "reserved"),
    (dict(training={"format": "tensorlist.training-record/1"}), FormatError, "field 'training.created'"),
    (dict(training=[1]), TypeError, "training must be a training record"),
    (dict(weights={"w": [1.0, 2.0]}), TypeError, "expected a numpy array or a torch tensor"),
])
def test_save_model_file_refuses_bad_records_before_writing(tmp_path, kwargs, error, message):
    """Nothing is written when a record is invalid."""
    args = dict(training=minimal(), dataset_params={}, weights={"w": np.zeros(2)})
    args.update(kwargs)
    weights = args.pop("weights")
    with pytest.raises(error, match=re.escape(message)):
        save_model_file(tmp_path / "m.json", weights, **args)
    assert os.listdir(tmp_path) == []


def test_save_refuses_a_record_of_other_weights(tmp_path):
    """A record whose weights.sha256 names other weights is refused."""
    record = save_model_file(tmp_path / "a.json", {"w": np.zeros(2)}, training=minimal(), dataset_params={})
    with pytest.raises(FormatError, match="field 'training.weights.sha256': is .* but the weights being saved"):
        save_model_file(tmp_path / "b.json", {"w": np.ones(2)}, training=record, dataset_params={})
    save_model_file(tmp_path / "c.json", {"w": np.zeros(2)}, training=record, dataset_params={})


def test_verify_detects_tampered_weights(tmp_path):
    """Changing the data file after saving is caught by the record's hash."""
    path = tmp_path / "m.json"
    save_model_file(path, {"w": np.arange(64, dtype=np.float32)}, training=minimal(), dataset_params={},
                    checksum=False)
    verify_model_file(path)
    data = tmp_path / json.loads(path.read_text())["location"]
    raw = bytearray(data.read_bytes())
    raw[8] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="field 'metadata.training.weights.sha256'.*weights were changed"):
        verify_model_file(path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(records())
@example(dict(minimal(), initial_weights={"from": "file", "file": "/", "origin": None}))
def test_generated_records_round_trip_through_model_files(record):
    """Any valid record saved in a model file reads back identical (plus the weights hash), its absolute
    paths anchored to the file's directory (``anchor_paths``: "/" is "../.." from a directory two deep)."""
    weights = {"w": np.arange(3, dtype=np.float32)}
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "m.json")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            record["weights"]["sha256"] = None
            saved = save_model_file(path, weights, training=record, dataset_params={"n": 3}, durable=False)
        back = read_training_record(path)
        assert back == saved
        expected = dict(record, weights=dict(record["weights"], sha256=weights_sha256(weights)))
        assert back == anchor_paths(expected, d)
        verify_model_file(path)
