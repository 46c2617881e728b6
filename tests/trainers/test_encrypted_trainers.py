"""Encrypted checkpoints of the trainers: Lightning, transformers' Trainer, Accelerate.

Each run is real (a tiny model on the CPU, a few steps) and carries two sentinels: a buffer whose float32
bytes spell a distinctive pattern, and a data record whose name is a distinctive string. With the key the run
resumes exactly (bit-identical weights); without it, or with another, the load is an EncryptionError naming the
file; and neither sentinel is in any file the run wrote, nor in any file it committed by a rename (the
temporary files of every atomic save, scanned as they are renamed into place).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the trainer integrations need torch")

import tensorlist as tl  # noqa: E402
from tensorlist.errors import EncryptionError  # noqa: E402
from _hf_support import accelerate_epoch  # noqa: E402
from _paths import SUPPORT  # noqa: E402

pytest.importorskip("cryptography", reason="encrypted lists need cryptography (pip install 'tensorlist[crypto]')")

#: The sentinel's bytes: float32s of moderate size (each fourth byte an exponent byte in "<=>"), 24 of them.
PATTERN = b"Sen<tin=el-<Ten=sor>!#$<" * 4
NAME = "sentinel-dataset-7f3a"


def _sentinel() -> torch.Tensor:
    return torch.from_numpy(np.frombuffer(PATTERN, np.float32).copy())


def _leaks(path) -> bool:
    with open(path, "rb") as f:
        data = f.read()
    return PATTERN in data or NAME.encode() in data


@pytest.fixture()
def renamed(monkeypatch):
    """Every regular file committed by os.replace/os.rename during the test: a plaintext one is recorded."""
    seen = []
    for fn in ("replace", "rename"):
        original = getattr(os, fn)

        def wrapped(src, dst, *args, _original=original, **kwargs):
            if isinstance(src, (str, bytes, os.PathLike)) and os.path.isfile(src) and _leaks(src):
                seen.append(os.fsdecode(dst))
            return _original(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, fn, wrapped)
    return seen


def _no_plaintext(directory, renamed):
    written = [os.path.join(r, n) for r, _, names in os.walk(directory) for n in names]
    assert written
    assert [p for p in written if _leaks(p)] == []
    assert renamed == []


def _key_error(path_part):
    return pytest.raises(EncryptionError, match=path_part)


# --------------------------------------------------------------------------
# Lightning


@pytest.fixture()
def lightning_fit(monkeypatch):
    pytest.importorskip("lightning", reason="tensorlist.lightning needs lightning")
    monkeypatch.syspath_prepend(SUPPORT)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint

    import _lightning_script as script
    from tensorlist.lightning import TensorListCheckpointIO, TrainingRecordCallback

    class Sentinel(script.Tiny):
        def __init__(self):
            super().__init__()
            self.register_buffer("sentinel", _sentinel())

    def fit(out_dir, epochs, key, *, ckpt_path=None, lend=True):
        """(losses, trainer); ``lend``: the key goes to the record callback, else to the checkpoint IO."""
        torch.set_num_threads(1)
        pl.seed_everything(7, verbose=False)
        losses = script.Losses()
        trainer = pl.Trainer(
            max_epochs=epochs, accelerator="cpu", devices=1, enable_progress_bar=False, logger=False,
            enable_model_summary=False, num_sanity_val_steps=0,
            plugins=[TensorListCheckpointIO(encryption_key=None if lend else key)],
            callbacks=[losses, TrainingRecordCallback(dataset_params={"name": NAME}, encryption_key=key if lend else None),
                       ModelCheckpoint(dirpath=os.fspath(out_dir), every_n_epochs=1, save_top_k=-1)])
        trainer.fit(Sentinel(), train_dataloaders=script.loader(), ckpt_path=ckpt_path)
        return losses.losses, trainer

    return fit


@pytest.mark.slow
def test_lightning_fit_resumes_encrypted_bit_exactly_and_writes_no_plaintext(tmp_path, lightning_fit, renamed):
    from tensorlist.lightning import TensorListCheckpointIO

    key = tl.Key.generate()
    losses, _ = lightning_fit(tmp_path / "run", 2, key)
    first, last = tmp_path / "run" / "epoch=0-step=4.ckpt", tmp_path / "run" / "epoch=1-step=8.ckpt"
    resumed, trainer = lightning_fit(tmp_path / "resumed", 2, key, ckpt_path=first, lend=False)
    assert resumed == losses[4:]
    want = TensorListCheckpointIO(encryption_key=key).load_checkpoint(last)
    got = trainer.lightning_module.state_dict()
    assert set(got) == set(want["state_dict"]) and all(torch.equal(got[k], want["state_dict"][k]) for k in got)
    assert want["training"]["epochs"]["done"] == 2 and want["dataset_params"] == {"name": NAME}
    assert torch.equal(want["state_dict"]["sentinel"], _sentinel())
    assert tl.load(last, pointer="/state_dict", key=key.material(None))["sentinel"].tobytes() == PATTERN
    _no_plaintext(tmp_path, renamed)
    with _key_error(r"epoch=1-step=8\.ckpt"):
        TensorListCheckpointIO().load_checkpoint(last)
    with _key_error(r"epoch=1-step=8\.ckpt: the key does not open"):
        TensorListCheckpointIO(encryption_key=tl.Key.generate()).load_checkpoint(last)
    with _key_error(r"epoch=0-step=4\.ckpt"):  # resuming without the key
        lightning_fit(tmp_path / "nokey", 2, None, ckpt_path=first)


def test_lightning_checkpoint_io_seals_every_json_value(tmp_path, renamed):
    pytest.importorskip("lightning", reason="tensorlist.lightning needs lightning")
    from tensorlist.lightning import TensorListCheckpointIO

    key = tl.Key.generate()
    ckpt = {"epoch": 3, "hyper_parameters": {"data": NAME, "pair": (1, 2), "best": float("inf")},
            "state_dict": {"sentinel": _sentinel(), "w": torch.ones(2)},
            "optimizer_states": [{"state": {0: {"exp_avg": torch.zeros(2)}},
                                  "param_groups": [{"lr": 0.1, "params": [0]}]}],
            "loops": {"mixed": [NAME, torch.arange(3), {"__list__": None}]}, "blob": PATTERN}
    io = TensorListCheckpointIO(encryption_key=bytes(key.material(None)))
    io.save_checkpoint(ckpt, tmp_path / "c.ckpt")
    back = io.load_checkpoint(tmp_path / "c.ckpt")
    assert back["hyper_parameters"] == ckpt["hyper_parameters"] and back["blob"] == PATTERN
    assert back["loops"]["mixed"][0] == NAME and back["loops"]["mixed"][2] == {"__list__": None}
    assert torch.equal(back["loops"]["mixed"][1], torch.arange(3))
    assert back["optimizer_states"][0]["param_groups"] == ckpt["optimizer_states"][0]["param_groups"]
    assert torch.equal(back["state_dict"]["sentinel"], _sentinel())
    _no_plaintext(tmp_path, renamed)
    with _key_error(r"c\.ckpt"):
        TensorListCheckpointIO().load_checkpoint(tmp_path / "c.ckpt")


def test_lightning_callback_refuses_a_different_key(tmp_path):
    pytest.importorskip("lightning", reason="tensorlist.lightning needs lightning")
    from types import SimpleNamespace

    from tensorlist.lightning import TensorListCheckpointIO, TrainingRecordCallback

    key = tl.Key.generate()
    io = TensorListCheckpointIO(encryption_key=key)
    trainer = SimpleNamespace(strategy=SimpleNamespace(checkpoint_io=io))
    TrainingRecordCallback(encryption_key=key.material(None)).setup(trainer, None, "fit")  # the same key: fine
    with pytest.raises(ValueError, match="different encryption keys"):
        TrainingRecordCallback(encryption_key=tl.Key.generate()).setup(trainer, None, "fit")


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
def test_lightning_sharded_save_is_encrypted(tmp_path, renamed):
    """ModelParallel's save and meta load in one process: the shards and the meta documents encrypted."""
    pytest.importorskip("lightning", reason="tensorlist.lightning needs lightning")
    import inspect

    import torch.distributed.checkpoint as dcp

    from tensorlist.dcp import TensorListReader, TensorListWriter
    from tensorlist.lightning import TensorListModelParallelStrategy

    if "encryption_key" not in inspect.signature(TensorListWriter).parameters:
        pytest.skip("tensorlist.dcp takes no encryption_key yet")
    key = tl.Key.generate()
    strategy, path = TensorListModelParallelStrategy(encryption_key=key), tmp_path / "last.ckpt"
    strategy.save_checkpoint({"state_dict": {"w": _sentinel()}, "optimizer_states": [], "epoch": 4,
                              "hyper_parameters": {"data": NAME}}, path)
    assert strategy._load_meta(path) == {"epoch": 4, "hyper_parameters": {"data": NAME}}
    state = {"state_dict": {"w": torch.empty(len(PATTERN) // 4)}}
    dcp.load(state, storage_reader=TensorListReader(path, encryption_key=key))
    assert state["state_dict"]["w"].numpy().tobytes() == PATTERN
    _no_plaintext(tmp_path, renamed)
    with _key_error(r"last\.ckpt"):
        TensorListModelParallelStrategy()._load_meta(path)


# --------------------------------------------------------------------------
# transformers' Trainer and Accelerate


@pytest.fixture()
def hf(monkeypatch):
    pytest.importorskip("accelerate", reason="the Hugging Face integrations need accelerate")
    monkeypatch.syspath_prepend(SUPPORT)
    from tensorlist import huggingface

    yield huggingface
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)


def _trainer(out, key, steps=6):
    transformers = pytest.importorskip("transformers", reason="the Trainer tests need transformers")
    from _hf_support import Tokens, tiny_gpt2
    from tensorlist.huggingface import TensorListTrainer

    model = tiny_gpt2()
    wpe = model.transformer.wpe.weight  # frozen, so every checkpoint holds the sentinel as it is
    wpe.requires_grad_(False).copy_(torch.from_numpy(np.resize(np.frombuffer(PATTERN, np.float32), wpe.shape)))
    args = transformers.TrainingArguments(
        output_dir=os.fspath(out), max_steps=steps, per_device_train_batch_size=4, save_steps=3, logging_steps=1,
        report_to=[], use_cpu=True, seed=0, disable_tqdm=True, learning_rate=1e-2, dataloader_num_workers=0)
    return TensorListTrainer(model=model, args=args, train_dataset=Tokens(), dataset_params={"name": NAME},
                             encryption_key=key)


def _losses(trainer, after=0):
    return [e["loss"] for e in trainer.state.log_history if "loss" in e and e["step"] > after]


@pytest.mark.slow
def test_trainer_resumes_encrypted_bit_exactly_and_writes_no_plaintext(tmp_path, hf, renamed):
    import transformers

    key = tl.Key.generate()
    full = _trainer(tmp_path / "run", key)
    full.train()
    full.save_model(os.fspath(tmp_path / "final"))
    want = {k: v.clone() for k, v in full.model.state_dict().items()}
    resumed = _trainer(tmp_path / "run", key)
    resumed.train(resume_from_checkpoint=os.fspath(tmp_path / "run" / "checkpoint-3"))
    assert _losses(resumed, after=3) == _losses(full)[3:]
    got = resumed.model.state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    loaded = hf.from_pretrained(transformers.GPT2LMHeadModel, tmp_path / "final", key=key)
    assert all(torch.equal(loaded.state_dict()[k], want[k]) for k in loaded.state_dict())
    _no_plaintext(tmp_path, renamed)
    for wrong in (None, tl.Key.generate()):
        with _key_error(r"checkpoint-3/(model|rng_state)\.json"):
            _trainer(tmp_path / "run", wrong).train(resume_from_checkpoint=os.fspath(tmp_path / "run" / "checkpoint-3"))
        with _key_error(r"final/model\.json"):
            hf.from_pretrained(transformers.GPT2LMHeadModel, tmp_path / "final", key=wrong)
    with pytest.raises(ValueError, match="export_safetensors writes the weights in plaintext"):
        hf.TensorListTrainer(model=torch.nn.Linear(1, 1), encryption_key=key, export_safetensors=True)


def _accelerate_run(seed=0):
    from accelerate import Accelerator

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
    model.register_buffer("sentinel", _sentinel())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2)
    x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8,
                                         shuffle=True)
    acc = Accelerator(cpu=True)
    return (acc, *acc.prepare(model, opt, loader, sched))




def test_accelerate_state_encrypted_round_trip_and_no_plaintext(tmp_path, hf, renamed):
    key = tl.Key.generate()
    acc, model, opt, loader, sched = _accelerate_run()
    accelerate_epoch(acc, model, opt, loader, sched)
    hf.save_state(acc, tmp_path / "ckpt", dataset_params={"name": NAME}, key=key)
    want = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    uninterrupted = accelerate_epoch(acc, model, opt, loader, sched)
    _no_plaintext(tmp_path, renamed)
    for wrong in (None, tl.Key.generate()):
        acc2, model2, opt2, loader2, sched2 = _accelerate_run(seed=5)
        with _key_error(r"ckpt/optimizer\.json"):
            hf.load_state(acc2, tmp_path / "ckpt", key=wrong)
    acc2, model2, opt2, loader2, sched2 = _accelerate_run(seed=5)
    hf.load_state(acc2, tmp_path / "ckpt", key=key)
    got = acc2.unwrap_model(model2).state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    assert accelerate_epoch(acc2, model2, opt2, loader2, sched2) == uninterrupted
    assert hf.read_state_file(tmp_path / "ckpt" / "scheduler.json", "scheduler", key=key)["last_epoch"] == 4
    with _key_error(r"ckpt/scheduler\.json"):
        hf.read_state_file(tmp_path / "ckpt" / "scheduler.json", "scheduler")
