"""Origins resolve wherever the files are saved: the natural call from a working directory, absolute origins,
``relative_to=``, every writer of a record, and a chain moved as a whole.

A record's paths are read from the directory of the file holding it (what
``tensorlist lineage`` does). ``model_file_origin("A/model.tl")`` is called
from a working directory and the file is saved as ``B/model.tl``: the writer
must store the origin so that it resolves from ``B`` (``record.anchor_paths``),
and a run resumed from a checkpoint kept elsewhere must keep naming the same
file (``record.resolve_paths``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="these tests train models (pip install 'tensorlist[torch]')")

from _paths import ROOT
from tensorlist import loops
from tensorlist.cli import main
from tensorlist.provenance.lineage import lineage
from tensorlist.provenance.record import (TrainingRecorder, anchor_paths, model_file_origin, read_training_record,
                                          resolve_paths, save_model_file)

X = torch.linspace(-1, 1, 32).reshape(16, 2)
Y = X[:, :1] * 2 - X[:, 1:]
DATA = {"name": "toy-linear", "split": "train"}
LOADER = {"batch_size": 16, "shuffle": False, "drop_last": False, "sampler": None}
UP = os.path.join("..", "A", "model.tl")  # the origin as B's files must hold it


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(2, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _recorder(model, origin):
    rec = TrainingRecorder(model, torch.optim.SGD(model.parameters(), lr=0.05), train_loader=LOADER, epochs=1,
                           initial_weights={"from": "random_state"} if origin is None
                           else {"from": None, "origin": origin})
    rec.epoch_done(0.5)
    return rec


def _base(path="A/model.tl"):
    """A model trained from the random state: the chain's first file (its record names no origin)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    model = _model()
    _recorder(model, None).save(path, model, dataset_params=DATA)
    return path


ORIGINS = {
    "as the caller names it": lambda: model_file_origin("A/model.tl"),
    "absolute": lambda: model_file_origin(os.path.abspath("A/model.tl")),
    "relative_to the saving directory": lambda: model_file_origin("A/model.tl", relative_to="B"),
}


# --------------------------------------------------------------------------
# the writers of a record, each saving into B/ a file fine-tuned from A/model.tl


def _recorder_save(origin):
    model = _model(1)
    _recorder(model, origin).save("B/model.tl", model, dataset_params=DATA)
    return "B/model.tl"


def _save_model_file(origin):
    model = _model(1)
    save_model_file("B/model.tl", model, training=_recorder(model, origin).record(), dataset_params=DATA)
    return "B/model.tl"


def _save_module_state(origin):
    import tensorlist.torch as tt

    model = _model(1)
    tt.save_module_state("B/model.tl", model, training=_recorder(model, origin).record(), dataset_params=DATA)
    return "B/model.tl"


def _loop(origin, **kw):
    model = _model(1)
    return loops.epochs(model, torch.optim.SGD(model.parameters(), lr=0.05), [(X, Y)],
                        loss_fn=torch.nn.functional.mse_loss, progress=False, out_dir="B", dataset_params=DATA,
                        seed=0, initial_weights={"from": None, "origin": origin}, **kw).files["final"]


def _loops_epochs(origin):
    return _loop(origin, max_epochs=1)


def _loops_resumed_from_a_checkpoint_elsewhere(origin):
    """The checkpoint two levels down from where B is: its record's origin reads ../../A; B's must read ../A."""
    ckpt = os.path.join("ck", "deep", "run.json")
    os.makedirs(os.path.dirname(ckpt))
    _loop(origin, max_epochs=1, checkpoint=ckpt)
    assert read_training_record(ckpt)["initial_weights"]["origin"]["file"] == os.path.join("..", "..", "A",
                                                                                           "model.tl")
    return _loop(model_file_origin("A/model.tl"), max_epochs=2, checkpoint=ckpt, resume=True)


def _lightning_checkpoint(origin):
    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    from tensorlist.lightning import TensorListCheckpointIO

    model = _model(1)
    record = _recorder(model, origin).record("checkpoint")
    TensorListCheckpointIO().save_checkpoint(
        {"state_dict": model.state_dict(), "epoch": 0, "global_step": 1, "training": record,
         "dataset_params": DATA}, "B/last.ckpt")
    return "B/last.ckpt"


def _hugging_face_trainer_resumed(origin):
    """TensorListTrainer: one step checkpointed in hf/checkpoint-1 (its record's origin reads ../../A), then a
    resumed run's save_model into B (its origin must read ../A)."""
    transformers = pytest.importorskip("transformers", reason="the Trainer integration needs transformers")
    from _hf_support import Tokens, tiny_gpt2
    from tensorlist.huggingface import TensorListTrainer

    def trainer(steps):
        args = transformers.TrainingArguments(
            output_dir="hf", max_steps=steps, per_device_train_batch_size=4, save_steps=1, logging_steps=1,
            report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
        return TensorListTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(),
                                 initial_weights={"from": None, "origin": origin})

    trainer(1).train()
    saved = os.path.join("hf", "checkpoint-1", "model.json")
    assert read_training_record(saved)["initial_weights"]["origin"]["file"] == os.path.join("..", "..", "A",
                                                                                            "model.tl")
    resumed = trainer(2)
    resumed.train(resume_from_checkpoint=True)
    resumed.save_model("B")
    return os.path.join("B", "model.json")


WRITERS = {
    "Hugging Face Trainer resumed": _hugging_face_trainer_resumed,
    "TrainingRecorder.save": _recorder_save,
    "save_model_file": _save_model_file,
    "tensorlist.torch.save_module_state": _save_module_state,
    "loops.epochs": _loops_epochs,
    "loops resumed from a checkpoint elsewhere": _loops_resumed_from_a_checkpoint_elsewhere,
    "Lightning checkpoint": _lightning_checkpoint,
}


#: ``relative_to=`` names the one directory a run saves in; a checkpoint kept elsewhere is a second one,
#: which only the unambiguous forms (absolute in memory, stored from each file) serve.
CASES = [(w, o) for w in sorted(WRITERS) for o in sorted(ORIGINS)
         if not (o.startswith("relative_to") and "resumed" in w)]


class TestEveryWriterStoresOriginsFromItsFile:
    """Each writer, each way of naming the origin, from a working directory: the chain holds through
    lineage() and ``tensorlist lineage``, its origin is stored as the path from B, and it holds once the
    whole tree is moved."""

    @pytest.mark.parametrize("writer, origin", CASES)
    def test_writer(self, writer, origin, tmp_path, monkeypatch, capsys):
        work = tmp_path / "work"
        work.mkdir()
        monkeypatch.chdir(work)
        _base()
        os.mkdir("B")
        child = WRITERS[writer](ORIGINS[origin]())
        chain = lineage(child, root=".").check()
        assert len(chain.links) == 2 and chain.links[1].recorded == UP
        assert os.path.samefile(chain.links[1].file, "A/model.tl")
        assert main(["lineage", child, "--root", "."]) == 0
        assert capsys.readouterr().out.splitlines()[-1] == "lineage: 2 links, every one holds"
        moved = tmp_path / "moved"
        shutil.move(str(work), str(moved))
        monkeypatch.chdir(tmp_path)
        assert lineage(os.path.join("moved", child), root="moved").check().links[1].recorded == UP


def test_a_chain_of_natural_calls_holds_through_api_and_cli_and_when_moved(tmp_path, monkeypatch):
    """From a working directory: A, then B from model_file_origin("A/model.tl"), then C from B's; the chain
    holds through lineage() and ``python -m tensorlist lineage``, and again once the directory is moved."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    _base()
    for parent, child in (("A", "B"), ("B", "C")):
        os.makedirs(child)
        model = _model(1)
        rec = _recorder(model, model_file_origin(f"{parent}/model.tl"))
        rec.save(f"{child}/model.tl", model, dataset_params=DATA)
    chain = lineage("C/model.tl", root=".").check()
    assert [os.path.realpath(k.file) for k in chain.links] == [os.path.realpath(f"{d}/model.tl") for d in "CBA"]
    assert [k.recorded for k in chain.links] == [None, os.path.join("..", "B", "model.tl"), UP]
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    run = subprocess.run([sys.executable, "-m", "tensorlist", "lineage", "C/model.tl", "--root", "."],
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.splitlines()[-1] == "lineage: 3 links, every one holds"
    shutil.move(str(work), str(tmp_path / "elsewhere"))
    assert len(lineage(str(tmp_path / "elsewhere" / "C" / "model.tl"), root=str(tmp_path)).check().links) == 3


def test_a_symlinked_save_directory_still_leads_to_the_origin(tmp_path, monkeypatch):
    """B is a symlink to a directory deeper elsewhere: the stored path is taken from B's real place, so the
    ``..`` steps lead where the system resolves them."""
    monkeypatch.chdir(tmp_path)
    _base()
    real = tmp_path / "deep" / "er" / "B"
    real.mkdir(parents=True)
    os.symlink(real, "B")
    _recorder_save(model_file_origin("A/model.tl"))
    chain = lineage("B/model.tl", root=".").check()
    assert os.path.samefile(chain.links[1].file, "A/model.tl")


def test_an_optimizer_file_stores_its_origin_from_its_place(tmp_path, monkeypatch):
    """tensorlist.torch.save_optimizer_state writes a record too: the same rule (it is no lineage link)."""
    import tensorlist.torch as tt

    monkeypatch.chdir(tmp_path)
    _base()
    os.makedirs("B/opt")
    model = _model(1)
    record = _recorder(model, model_file_origin("A/model.tl")).record()
    tt.save_optimizer_state("B/opt/optimizer.tl", torch.optim.SGD(model.parameters(), lr=0.1), training=record,
                            dataset_params=DATA)
    stored = read_training_record("B/opt/optimizer.tl")["initial_weights"]["origin"]["file"]
    assert stored == os.path.join("..", "..", "A", "model.tl")
    assert os.path.samefile(os.path.join("B", "opt", stored), "A/model.tl")


# --------------------------------------------------------------------------
# the rule itself


def _rec(file, origin_file):
    initial = {"from": "file", "file": file, "origin": {"file": origin_file, "weights_sha256": "0" * 64}}
    return {"format": "x", "initial_weights": initial}


def test_anchor_and_resolve_are_inverse_and_change_nothing_in_place(tmp_path):
    rec = _rec(str(tmp_path / "B" / "start.tl"), str(tmp_path / "A" / "model.tl"))
    anchored = anchor_paths(rec, str(tmp_path / "B"))
    assert anchored["initial_weights"]["file"] == "start.tl"
    assert anchored["initial_weights"]["origin"] == {"file": UP, "weights_sha256": "0" * 64}
    assert rec["initial_weights"]["origin"]["file"] == str(tmp_path / "A" / "model.tl")  # the caller's kept
    back = resolve_paths(anchored, str(tmp_path / "B"))
    assert os.path.normpath(back["initial_weights"]["origin"]["file"]) == str(tmp_path / "A" / "model.tl")
    assert os.path.normpath(back["initial_weights"]["file"]) == str(tmp_path / "B" / "start.tl")


def test_urls_relative_paths_and_records_without_paths_are_kept():
    url = _rec("s3://bucket/start.tl", "https://example.org/model.tl")
    assert anchor_paths(url, "/runs/B") is url and resolve_paths(url, "/runs/B") is url
    rel = _rec("start.tl", UP)
    assert anchor_paths(rel, "/runs/B") is rel
    assert anchor_paths(_rec("/runs/A/x.tl", "/runs/A/m.tl"), "s3://bucket/B")["initial_weights"]["file"] == \
        "/runs/A/x.tl"  # a remote file: no local path is relative to it
    for shapeless in ({"initial_weights": {"from": "random_state"}}, {"initial_weights": None}, [], {}):
        assert anchor_paths(shapeless, "/runs/B") is shapeless and resolve_paths(shapeless, "/runs/B") is shapeless


def test_the_natural_call_names_one_file_wherever_the_record_goes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    _base()
    origin = model_file_origin("A/model.tl")
    assert origin["file"] == str(tmp_path / "A" / "model.tl")
    assert model_file_origin("A/model.tl", relative_to="B")["file"] == UP
    assert origin["weights_sha256"] == read_training_record("A/model.tl")["weights"]["sha256"]
