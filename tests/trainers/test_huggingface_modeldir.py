"""A real ``TensorListTrainer`` run's ``save_model`` output is a tensorlist model directory as it is.

A tiny Llama trained for a few steps on the CPU (nothing downloaded, one torch
thread is enough): its directory loads with ``tensorlist.huggingface.from_pretrained``,
converts to a directory stock ``from_pretrained`` loads, keeps its training
record through the round trip and validates, the logits equal all the way.
"""
import os

import pytest

torch = pytest.importorskip("torch", reason="the Trainer needs torch")
transformers = pytest.importorskip("transformers", reason="the Trainer tests need transformers")
pytest.importorskip("accelerate", reason="the Trainer needs accelerate")

from _hf_support import Tokens, tiny_llama  # noqa: E402
from tensorlist.cli import main as cli_main  # noqa: E402
from tensorlist.convert import convert  # noqa: E402
from tensorlist.huggingface import TensorListTrainer, from_pretrained  # noqa: E402
from tensorlist.provenance.record import verify_model_file  # noqa: E402


@pytest.fixture(autouse=True)
def _fresh_accelerator_state():
    yield
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def _logits(model, ids):
    model.eval()
    with torch.no_grad():
        return model(ids).logits


def _record(capsys, path) -> str:
    assert cli_main(["record", os.fspath(path)]) == 0
    return capsys.readouterr().out


@pytest.mark.slow
def test_a_trainers_saved_model_is_a_model_directory(tmp_path, capsys):
    args = transformers.TrainingArguments(
        output_dir=os.fspath(tmp_path / "run"), max_steps=3, per_device_train_batch_size=4, save_strategy="no",
        logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, learning_rate=1e-2,
        dataloader_num_workers=0)
    trainer = TensorListTrainer(model=tiny_llama(), args=args, train_dataset=Tokens())
    trainer.train()
    d = tmp_path / "final"
    trainer.save_model(os.fspath(d))
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    want = _logits(trainer.model, ids)

    ours = from_pretrained(transformers.LlamaForCausalLM, d)  # (a) the directory as it is
    assert type(ours) is transformers.LlamaForCausalLM and torch.equal(_logits(ours, ids), want)

    assert cli_main(["convert", os.fspath(d), os.fspath(tmp_path / "hf")]) == 0  # (b) stock loads the conversion
    stock = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "hf")
    assert torch.equal(_logits(stock, ids), want)

    record = verify_model_file(d / "model.json")  # (c) the record verifies, and survives the round trip
    assert record["weights"]["kind"] == "final" and record["seed"] == 0
    assert cli_main(["convert", os.fspath(tmp_path / "hf"), os.fspath(tmp_path / "back")]) == 0
    capsys.readouterr()
    assert _record(capsys, tmp_path / "back" / "model.json") == _record(capsys, d / "model.json")
    assert verify_model_file(tmp_path / "back" / "model.json") == record

    assert cli_main(["validate", "--verify", os.fspath(d)]) == 0  # (d)
    out = capsys.readouterr().out
    assert out.startswith(f"{d}: ok (tensorlist-model, ") and "checksums verified" in out
