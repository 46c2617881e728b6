"""tensorlist export: CycloneDX 1.6 ML-BOMs valid under the official schema, model cards huggingface_hub parses.

The BOM is checked by cyclonedx-python-lib's strict JSON validator (the official 1.6 schema it bundles, with
format checks); the card by ``huggingface_hub.ModelCard``. Hostile records (controls, bidi overrides, markup,
huge lists) must come out escaped and still valid; invalid ones must be refused before anything is written.
"""
from __future__ import annotations

import copy
import hashlib
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from huggingface_hub import ModelCard

import tensorlist
from _record_support import full_record
from tensorlist.errors import FormatError
from tensorlist.provenance.exports import cyclonedx_bom, export, model_card, model_files
from tensorlist.provenance.record import save_model_file, weights_sha256

from _paths import ROOT
WEIGHTS = {"layer.weight": np.arange(6, dtype=np.float32).reshape(2, 3), "layer.bias": np.ones(2, np.float32)}
DATA = {"name": "LIDC-IDRI", "split": "train", "samples": 1000,
        "content_hash": {"method": "file_sha256", "sha256": "b" * 64}}


def _record(**changes):
    rec = full_record()
    rec["weights"] = dict(rec["weights"], sha256=None)
    rec.update(changes)
    return rec


def _model(tmp_path, name="final.tl", record=None, data=DATA):
    path = str(tmp_path / name)
    save_model_file(path, WEIGHTS, training=record or _record(), dataset_params=data)
    return path


def _valid(bom: dict) -> None:
    error = JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(bom))
    assert error is None, error.data.message


def _cli(*args):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    return subprocess.run([sys.executable, "-m", "tensorlist", *map(str, args)], capture_output=True, text=True,
                          env=env, timeout=300)


def _props(items) -> dict:
    return {p["name"]: p["value"] for p in items}


def test_cyclonedx_bom_is_valid_and_names_files_datasets_and_settings(tmp_path):
    path = _model(tmp_path)
    out = tmp_path / "final.cdx.json"
    run = _cli("export", path, "--cyclonedx", out)
    assert run.returncode == 0, run.stderr
    bom = json.loads(out.read_text(encoding="utf-8"))
    _valid(bom)
    assert bom["specVersion"] == "1.6" and bom["bomFormat"] == "CycloneDX"
    (model,) = bom["components"]
    assert model["type"] == "machine-learning-model" and model["name"] == "final.tl"
    files = {c["name"]: c["hashes"] for c in model["components"]}
    expected = {name: hashlib.sha256(open(p, "rb").read()).hexdigest() for name, p in model_files(path)}
    assert len(expected) == 2 and "final.tl" in expected
    assert files == {name: [{"alg": "SHA-256", "content": digest}] for name, digest in expected.items()}
    assert _props(model["properties"])["tensorlist:weights_sha256"] == weights_sha256(path)
    card = model["modelCard"]
    datasets = card["modelParameters"]["datasets"]
    assert [d["name"] for d in datasets] == ["LIDC-IDRI", "val"] and {d["type"] for d in datasets} == {"dataset"}
    first = _props(datasets[0]["contents"]["properties"])
    assert first["tensorlist:dataset_params:content_hash.sha256"] == "b" * 64
    assert first["tensorlist:role"] == "training" and first["tensorlist:dataset_params:samples"] == "1000"
    assert _props(datasets[1]["contents"]["properties"])["tensorlist:role"] == "validation"
    settings = _props(card["properties"])
    assert settings["tensorlist:training:optimizer.class"] == "torch.optim.adam.Adam"
    assert settings["tensorlist:training:optimizer.hyperparameters.betas"] == "[0.9,0.999]"
    assert settings["tensorlist:training:optimizer.scheduler.args.gamma"] == "0.5"
    assert settings["tensorlist:training:seed"] == "42" and settings["tensorlist:training:epochs.done"] == "3"
    assert settings["tensorlist:training:history.validation.min"] == "0.25"
    assert settings["tensorlist:training:history.validation.min_epoch"] == "2"
    assert not any(k.startswith("tensorlist:training:validation.dataset_params") for k in settings)
    metrics = {m["type"]: m for m in card["quantitativeAnalysis"]["performanceMetrics"]}
    assert metrics["validation (torch.nn.modules.loss.MSELoss)"]["value"] == "0.25"
    ancestor = model["pedigree"]["ancestors"][0]
    assert ancestor["name"] == "base.json" and _props(ancestor["properties"]) == {
        "tensorlist:weights_sha256": full_record()["initial_weights"]["origin"]["weights_sha256"]}


def test_model_card_parses_with_huggingface_hub(tmp_path):
    path = _model(tmp_path)
    out = tmp_path / "README.md"
    run = _cli("export", path, "--model-card", out)
    assert run.returncode == 0, run.stderr
    card = ModelCard.load(out)
    assert card.data.library_name == "tensorlist"
    assert card.data.datasets == ["LIDC-IDRI", "val"]
    assert card.data.base_model == "base.json"
    text = card.text
    for expected in ("## Training procedure", "torch.optim.adam.Adam", "torch.optim.lr_scheduler.StepLR",
                     "Epochs: ` 3 ` done of ` 10 ` asked", "Seed: ` 42 `", "lowest ` 0.25 ` at epoch ` 2 `",
                     weights_sha256(path)):
        assert expected in text, expected


def test_a_record_from_a_real_training_run(tmp_path):
    torch = pytest.importorskip("torch", reason="trains a model (pip install 'tensorlist[torch]')")
    from tensorlist.provenance.record import TrainingRecorder

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    x = torch.randn(8, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=4)
    rec = TrainingRecorder(model, opt, loss=torch.nn.MSELoss(), train_loader=loader, epochs=2, scheduler=sched,
                           scheduler_step="epoch", seed=0, initial_weights={"from": "random_state"},
                           validation={"loader": loader, "dataset_params": {"name": "toy-val"}})
    for epoch in range(2):
        for xb, yb in loader:
            opt.zero_grad()
            torch.nn.functional.mse_loss(model(xb), yb).backward()
            opt.step()
        rec.epoch_done(1.0 / (epoch + 1), validation=0.5 / (epoch + 1))
        sched.step()
    path = str(tmp_path / "final.tl")
    rec.save(path, model, dataset_params={"name": "toy"})
    export(path, cyclonedx=tmp_path / "bom.json", model_card_path=tmp_path / "card.md")
    bom = json.loads((tmp_path / "bom.json").read_text())
    _valid(bom)
    settings = _props(bom["components"][0]["modelCard"]["properties"])
    assert settings["tensorlist:training:optimizer.class"] == "torch.optim.sgd.SGD"
    assert settings["tensorlist:training:optimizer.hyperparameters.momentum"] == "0.9"
    assert settings["tensorlist:training:history.learning_rate.last"] == "0.05"
    card = ModelCard.load(tmp_path / "card.md")
    assert card.data.datasets == ["toy", "toy-val"] and card.data.base_model is None
    assert "torch.optim.sgd.SGD" in card.text and "StepLR" in card.text


HOSTILE = "x\x1b]0;owned\x07\u202e<script>alert(1)</script>\n---\nlibrary_name: evil\r``` `\x85\u2028\U0001f600"


def test_hostile_strings_come_out_escaped_and_valid(tmp_path):
    rec = _record()
    rec["solver"]["solver_params"] = {"note": HOSTILE, "big": list(range(20000)), HOSTILE: 1}
    rec["optimizer"] = dict(rec["optimizer"], **{"class": HOSTILE})
    path = _model(tmp_path, record=rec, data={"name": HOSTILE, "files": ["f%d" % i for i in range(5000)]})
    export(path, cyclonedx=tmp_path / "bom.json", model_card_path=tmp_path / "card.md")
    raw_bom = (tmp_path / "bom.json").read_text(encoding="utf-8")
    assert "\x1b" not in raw_bom and "\u202e" not in raw_bom
    bom = json.loads(raw_bom)
    _valid(bom)
    settings = _props(bom["components"][0]["modelCard"]["properties"])
    assert settings["tensorlist:training:optimizer.class"] == HOSTILE  # JSON keeps the value whole
    assert json.loads(settings["tensorlist:training:solver.solver_params.big"]) == list(range(20000))
    text = (tmp_path / "card.md").read_text(encoding="utf-8")
    for bad in ("\x1b", "\x07", "\u202e", "\x85", "\u2028", "\r"):
        assert bad not in text, repr(bad)
    body = text.split("\n---\n", 1)[1]
    outside_code = re.sub(r"(`+) .*? \1", "", body)  # markup in a code span is shown, not run
    assert "<script>" in body and "<script>" not in outside_code and "library_name" not in outside_code
    assert text.count("\n---\n") == 1  # the front matter ends once; the record cannot close or reopen it
    card = ModelCard.load(tmp_path / "card.md")
    assert card.data.library_name == "tensorlist"
    assert card.data.datasets == [HOSTILE, "val"]  # escaped in YAML, the same string read back
    assert "(cut; the file's record holds it whole)" in card.text


def test_invalid_or_tampered_models_are_refused_before_anything_is_written(tmp_path):
    path = _model(tmp_path)
    out = tmp_path / "bom.json"
    out.write_text("previous")
    data = tensorlist.open(path).descriptor.data_path
    with open(data, "r+b") as f:
        f.write(b"\x01\x02\x03\x04")
    for args in (("--cyclonedx", out), ("--model-card", out)):
        run = _cli("export", path, *args)
        assert run.returncode == 1 and "weights were changed after saving" in run.stderr
    assert out.read_text() == "previous"
    with pytest.raises(FormatError, match="weights were changed"):
        cyclonedx_bom(path)
    doc = json.loads(open(path).read())
    doc["metadata"]["training"]["epochs"]["done"] = "three"
    broken = tmp_path / "wrong_type.tl"
    broken.write_text(json.dumps(doc))
    with pytest.raises(FormatError, match="epochs.done"):
        model_card(str(broken))
    run = _cli("export", broken, "--model-card", out)
    assert run.returncode == 1 and "epochs.done" in run.stderr and out.read_text() == "previous"
    run = _cli("export", path)
    assert run.returncode == 1 and "at least one output" in run.stderr


def test_a_file_without_record_is_refused(tmp_path):
    path = str(tmp_path / "plain.tl")
    tensorlist.save(path, WEIGHTS)
    with pytest.raises(FormatError, match="no training record"):
        cyclonedx_bom(path)


def test_an_export_never_overwrites_the_model_or_itself(tmp_path):
    path = _model(tmp_path)
    before = {p: open(p, "rb").read() for _, p in model_files(path)}
    for _, target in model_files(path):
        run = _cli("export", path, "--cyclonedx", target)
        assert run.returncode == 1 and "a file of the model itself" in run.stderr
    with pytest.raises(ValueError, match="both be written to"):
        export(path, cyclonedx=tmp_path / "x", model_card_path=tmp_path / "x")
    assert {p: open(p, "rb").read() for p in before} == before
    assert not (tmp_path / "x").exists()
