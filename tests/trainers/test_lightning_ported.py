"""Lightning's own checkpointing scenarios, run on the stock ``TorchCheckpointIO`` and on ``TensorListCheckpointIO``.

Origin: the scenarios of Lightning's ``tests/tests_pytorch/`` (https://github.com/Lightning-AI/pytorch-lightning,
Apache-2.0 license, Copyright The Lightning AI team): ``checkpointing/test_model_checkpoint.py``
(``test_model_checkpoint_topk_all``, ``test_current_score``, ``test_model_checkpoint_save_last``,
``test_model_checkpoint_save_last_checkpoint_contents``, ``test_ckpt_every_n_train_steps``, the
``save_last="link"`` and ``save_weights_only`` cases), ``checkpointing/test_checkpoint_callback_frequency.py``
(``test_top_k`` with ``save_last`` in ``False, True, "link"``), ``checkpointing/test_trainer_checkpoint.py``
(``test_finetuning_with_ckpt_path``), ``plugins/test_checkpoint_io_plugin.py`` (``test_checkpoint_plugin_called``,
``test_async_checkpoint_plugin``) and ``trainer/test_trainer.py`` / ``models/test_hparams.py`` (``ckpt_path="last"``
and ``"best"``, ``save_hyperparameters`` restored by ``load_from_checkpoint``). Each is re-written for a tiny
BoringModel-like module on the CPU (a few steps, no progress bar, no logger) and checks what the original
checks, with real files in place of mocked ``torch.save`` calls; every scenario runs on both plugins, so each is
known to pass with Lightning's own one. Names listed are the checkpoints (``*.ckpt``); tensorlist's data files
sit beside them (``<name>.ckpt.<hex>.data``) and are checked separately: none is left without its checkpoint.

Not ported: ``train_time_interval`` (mocks the clock), DDP/XLA variants (tests/trainers/test_lightning.py runs DDP and
ModelParallel on 2 processes), omegaconf hparams (not installed), ``storage_options`` (refused by both plugins).
"""
import json
import os
from unittest import mock

import pytest

torch = pytest.importorskip("torch", reason="tensorlist.lightning needs torch")
pytest.importorskip("lightning", reason="tensorlist.lightning needs lightning")

import lightning.pytorch as pl  # noqa: E402
from lightning.fabric.plugins import TorchCheckpointIO  # noqa: E402
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.plugins.io import AsyncCheckpointIO  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import tensorlist as tl  # noqa: E402
from tensorlist.lightning import TensorListAsyncCheckpointIO, TensorListCheckpointIO, load_from_checkpoint  # noqa: E402
from tensorlist.provenance.record import read_training_record, verify_model_file, weights_sha256  # noqa: E402

PLUGINS = {"torch": TorchCheckpointIO, "tensorlist": TensorListCheckpointIO}
#: Lightning's own warnings for a tiny run (few batches, no workers, no logger) say nothing about checkpoints.
pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::lightning.fabric.utilities.warnings.PossibleUserWarning")]


@pytest.fixture(params=list(PLUGINS))
def kind(request):
    return request.param


class Boring(pl.LightningModule):
    """Lightning's BoringModel, smaller: Linear(4, 2), SGD with a step schedule; ``score`` logs ``scores[epoch]``."""

    def __init__(self, scores=None, width: int = 4):
        super().__init__()
        self.save_hyperparameters()
        self.layer = torch.nn.Linear(width, 2)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch[0]), torch.ones(len(batch[0]), 2))
        if self.hparams.scores is not None:
            self.log("score", float(self.hparams.scores[self.current_epoch]), on_epoch=True, on_step=False)
        return loss

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(batch[0]), torch.ones(len(batch[0]), 2)))

    def configure_optimizers(self):
        opt = torch.optim.SGD(self.parameters(), lr=0.1)
        return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1)]


def _loader():
    return DataLoader(TensorDataset(torch.randn(8, 4, generator=torch.Generator().manual_seed(0))), batch_size=4)


def _trainer(kind, callbacks, epochs=2, io=None, **kwargs):
    return pl.Trainer(max_epochs=epochs, accelerator="cpu", plugins=[io if io is not None else PLUGINS[kind]()],
                      callbacks=callbacks, enable_progress_bar=False, enable_model_summary=False, logger=False,
                      num_sanity_val_steps=0, **kwargs)


def _fit(kind, tmp_path, epochs=2, io=None, val=False, model=None, **checkpoint_kwargs):
    mc = ModelCheckpoint(dirpath=tmp_path, **checkpoint_kwargs)
    trainer = _trainer(kind, [mc], epochs, io=io)
    model = model if model is not None else Boring()
    trainer.fit(model, _loader(), _loader() if val else None)
    return mc, trainer, model


def _load(kind, path):
    return PLUGINS[kind]().load_checkpoint(path)


def _ckpts(path):
    return {n for n in os.listdir(path) if n.endswith(".ckpt")}


def _locations(node):
    if isinstance(node, dict):
        return ({node["location"]} if isinstance(node.get("location"), str) else set()) \
            | set().union(*map(_locations, node.values()))
    return set().union(*map(_locations, node)) if isinstance(node, list) else set()


def _no_orphans(kind, path):
    """Every file in ``path`` is a checkpoint or the data file a present checkpoint names (nothing left over)."""
    others = set(os.listdir(path)) - _ckpts(path)
    if kind == "torch":
        assert others == set()
        return
    named = set().union(*(_locations(json.loads((path / n).read_text())) for n in _ckpts(path)))
    assert others == named


def _provenance(path):
    """What a model file passes: the file validates, its record reads, and its weights hash to the record's."""
    tl.validate(path)
    record = read_training_record(path)
    assert record["weights"]["sha256"] == weights_sha256(tl.load(path, pointer="/state_dict"))
    assert verify_model_file(path, pointer="/state_dict") == record  # what an auditor runs
    return record


def test_top_k_with_monitor_keeps_the_k_best(kind, tmp_path):
    """test_model_checkpoint_topk_all / test_current_score: the k best by the monitor stay, the rest is removed."""
    scores = [0.5, 0.2, 0.4, 0.1]
    mc, _, _ = _fit(kind, tmp_path, epochs=4, model=Boring(scores), monitor="score", mode="min", save_top_k=2,
                    filename="{epoch}")
    assert _ckpts(tmp_path) == {"epoch=1.ckpt", "epoch=3.ckpt"}
    _no_orphans(kind, tmp_path)
    assert mc.best_model_path == str(tmp_path / "epoch=3.ckpt")
    assert float(mc.best_model_score) == pytest.approx(0.1)
    assert mc.kth_best_model_path == str(tmp_path / "epoch=1.ckpt")
    assert {os.path.basename(p): float(v) for p, v in mc.best_k_models.items()} == \
        pytest.approx({"epoch=1.ckpt": 0.2, "epoch=3.ckpt": 0.1})
    for epoch in (1, 3):
        ckpt = _load(kind, tmp_path / f"epoch={epoch}.ckpt")
        assert ckpt["epoch"] == epoch and ckpt["global_step"] == 2 * (epoch + 1)
        assert float(ckpt["callbacks"][mc.state_key]["current_score"]) == pytest.approx(scores[epoch])


@pytest.mark.parametrize("save_last", [True, "link"])
def test_save_last(kind, tmp_path, save_last):
    """test_model_checkpoint_save_last(_checkpoint_contents), test_top_k[save_last]: one last.ckpt, the newest."""
    mc, trainer, model = _fit(kind, tmp_path, epochs=3, model=Boring([0.3, 0.2, 0.1]), monitor="score",
                              save_top_k=1, save_last=save_last, filename="{epoch}")
    assert _ckpts(tmp_path) == {"epoch=2.ckpt", "last.ckpt"}
    _no_orphans(kind, tmp_path)
    last = tmp_path / "last.ckpt"
    assert mc.last_model_path == str(last)
    assert os.path.islink(last) == (save_last == "link")
    if save_last == "link":
        assert os.readlink(last) == "epoch=2.ckpt"
    a, b = _load(kind, last), _load(kind, tmp_path / "epoch=2.ckpt")
    assert (a["epoch"], a["global_step"]) == (b["epoch"], b["global_step"]) == (2, 6)
    assert a["callbacks"][mc.state_key]["best_model_path"] == b["callbacks"][mc.state_key]["best_model_path"]
    for key, value in model.state_dict().items():
        assert torch.equal(a["state_dict"][key], value) and torch.equal(b["state_dict"][key], value)
    if kind == "tensorlist":
        assert _provenance(last)["epochs"]["done"] == 3


def test_save_last_link_after_a_saved_last(kind, tmp_path):
    """A run resumed with save_last="link" where a saved last.ckpt is: Lightning os.removes it for the link."""
    _fit(kind, tmp_path, epochs=1, model=Boring([0.3, 0.2, 0.1]), monitor="score", save_top_k=1, save_last=True,
         filename="{epoch}")
    assert not os.path.islink(tmp_path / "last.ckpt")
    mc = ModelCheckpoint(dirpath=tmp_path, monitor="score", save_top_k=1, save_last="link", filename="{epoch}")
    _trainer(kind, [mc], 3).fit(Boring([0.3, 0.2, 0.1]), _loader(), ckpt_path=str(tmp_path / "last.ckpt"))
    assert os.readlink(tmp_path / "last.ckpt") == "epoch=2.ckpt"
    assert _ckpts(tmp_path) == {"epoch=2.ckpt", "last.ckpt"}
    _no_orphans(kind, tmp_path)  # the replaced last.ckpt's data file went with it (at teardown)
    assert _load(kind, tmp_path / "last.ckpt")["epoch"] == 2


def test_save_weights_only(kind, tmp_path):
    """save_weights_only=True: the weights and the loop's counters, no optimizer, scheduler or callback state."""
    _, _, model = _fit(kind, tmp_path, save_top_k=-1, save_weights_only=True)
    assert _ckpts(tmp_path) == {"epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"}
    ckpt = _load(kind, tmp_path / "epoch=1-step=4.ckpt")
    assert not {"optimizer_states", "lr_schedulers", "callbacks"} & set(ckpt)
    assert ckpt["epoch"] == 1 and ckpt["global_step"] == 4
    assert all(torch.equal(ckpt["state_dict"][k], v) for k, v in model.state_dict().items())
    if kind == "tensorlist":
        record = _provenance(tmp_path / "epoch=1-step=4.ckpt")
        assert record["optimizer"]["parameter_groups"] is None and record["epochs"]["done"] == 2


def test_every_n_train_steps(kind, tmp_path):
    """test_ckpt_every_n_train_steps: a checkpoint every n steps, named by the step, none at epoch ends."""
    _fit(kind, tmp_path, epochs=3, filename="{step}", every_n_epochs=0, every_n_train_steps=2, save_top_k=-1)
    assert _ckpts(tmp_path) == {"step=2.ckpt", "step=4.ckpt", "step=6.ckpt"}
    _no_orphans(kind, tmp_path)
    assert [_load(kind, tmp_path / f"step={s}.ckpt")["global_step"] for s in (2, 4, 6)] == [2, 4, 6]


def test_fit_resumes_from_last(kind, tmp_path):
    """trainer.fit(ckpt_path="last"): the run goes on from last.ckpt's step, with its weights and optimizer state."""
    _fit(kind, tmp_path, epochs=1, save_last=True)
    saved = _load(kind, tmp_path / "last.ckpt")
    mc = ModelCheckpoint(dirpath=tmp_path, save_last=True)
    trainer = _trainer(kind, [mc], epochs=3)
    model = Boring()
    resumed = {}

    class Peek(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            resumed.update(step=trainer.global_step, epoch=trainer.current_epoch,
                           weights={k: v.clone() for k, v in pl_module.state_dict().items()})

    trainer.callbacks.append(Peek())
    trainer.fit(model, _loader(), ckpt_path="last")
    assert trainer.ckpt_path == str(tmp_path / "last.ckpt")
    assert (resumed["step"], resumed["epoch"]) == (2, 1)
    assert all(torch.equal(resumed["weights"][k], v) for k, v in saved["state_dict"].items())
    assert trainer.global_step == 6 and _load(kind, tmp_path / "last.ckpt")["global_step"] == 6


def test_validate_best(kind, tmp_path):
    """trainer.validate(ckpt_path="best") (test_finetuning_with_ckpt_path's best_model_path): the best one is loaded."""
    mc, trainer, model = _fit(kind, tmp_path, epochs=3, model=Boring([0.2, 0.1, 0.3]), monitor="score", save_top_k=1,
                              filename="{epoch}", val=True)
    assert mc.best_model_path == str(tmp_path / "epoch=1.ckpt") and _ckpts(tmp_path) == {"epoch=1.ckpt"}
    best = _load(kind, tmp_path / "epoch=1.ckpt")["state_dict"]
    assert not all(torch.equal(best[k], v) for k, v in model.state_dict().items())  # the last epoch moved on
    trainer.validate(model, _loader(), ckpt_path="best", verbose=False)
    assert trainer.ckpt_path == mc.best_model_path
    assert all(torch.equal(best[k], v) for k, v in model.state_dict().items())


def test_hyperparameters_saved_and_restored(kind, tmp_path):
    """save_hyperparameters() goes into every checkpoint; load_from_checkpoint makes the module from it."""
    _, _, model = _fit(kind, tmp_path, epochs=1, model=Boring(width=4), save_top_k=-1)
    path = tmp_path / "epoch=0-step=2.ckpt"
    assert _load(kind, path)["hyper_parameters"] == {"scores": None, "width": 4}
    restored = Boring.load_from_checkpoint(path) if kind == "torch" else load_from_checkpoint(Boring, path)
    assert isinstance(restored, Boring) and dict(restored.hparams) == {"scores": None, "width": 4}
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in model.state_dict().items())
    if kind == "tensorlist":
        record = _provenance(path)
        assert record["solver"]["solver_params"]["hyper_parameters"] == {"scores": None, "width": 4}


class _WrappedOnFitStart(Boring):
    """test_async_checkpoint_plugin's CustomBoringModel: the base checkpoint IO's calls counted once fit starts."""

    def on_fit_start(self):
        base = self.trainer.strategy.checkpoint_io.checkpoint_io
        base.save_checkpoint = mock.Mock(wraps=base.save_checkpoint)
        base.remove_checkpoint = mock.Mock(wraps=base.remove_checkpoint)


@pytest.mark.parametrize("wrapper", [AsyncCheckpointIO, TensorListAsyncCheckpointIO], ids=lambda w: w.__name__)
def test_async_checkpoint_plugin(kind, tmp_path, wrapper):
    """test_async_checkpoint_plugin, with real files: save_top_k=2 over 3 one-batch epochs removes epoch 0's.

    Lightning's AsyncCheckpointIO removes on the caller's thread while the worker may still be writing (or not
    yet have begun) the checkpoint removed; the removal must win all the same. A validate before the fit, as
    in the original: the wrapper's thread pool is set up again after a teardown.
    """
    io = wrapper(PLUGINS[kind]())
    io.save_checkpoint = mock.Mock(wraps=io.save_checkpoint)
    io.remove_checkpoint = mock.Mock(wraps=io.remove_checkpoint)
    mc = ModelCheckpoint(dirpath=tmp_path, save_top_k=2, monitor="step", mode="max")
    trainer = _trainer(kind, [mc], epochs=3, io=io, limit_train_batches=1, limit_val_batches=0)
    model = _WrappedOnFitStart()
    trainer.validate(model, _loader(), verbose=False)
    trainer.fit(model, _loader())
    assert io.save_checkpoint.call_count == 3 and io.remove_checkpoint.call_count == 1
    base = trainer.strategy.checkpoint_io.checkpoint_io
    assert base.save_checkpoint.call_count == 3 and base.remove_checkpoint.call_count == 1
    assert base.remove_checkpoint.call_args.args[0] == str(tmp_path / "epoch=0-step=1.ckpt")
    kept = _ckpts(tmp_path)
    if kind == "torch" and wrapper is AsyncCheckpointIO:
        # Lightning's own pair, the reference, can be held to everything but this: it removes on the caller's
        # thread, and a first save slower than the two epochs after it leaves the removed checkpoint behind
        # (Lightning-AI/pytorch-lightning#14035; seen in 1 of 12 fresh runs on two busy cores)
        kept.discard("epoch=0-step=1.ckpt")
    assert kept == {"epoch=1-step=2.ckpt", "epoch=2-step=3.ckpt"}
    _no_orphans(kind, tmp_path)
    assert mc.best_model_path == str(tmp_path / "epoch=2-step=3.ckpt")
    assert _load(kind, mc.best_model_path)["global_step"] == 3


def test_the_plugin_alone_records_provenance(tmp_path, monkeypatch):
    """No TrainingRecordCallback: each checkpoint still is a model file whose record says what the dict says."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)  # set by seed_everything, removed after the test
    pl.seed_everything(11, verbose=False)
    _fit("tensorlist", tmp_path, epochs=2, save_top_k=-1, val=True)
    for name, done in (("epoch=0-step=2.ckpt", 1), ("epoch=1-step=4.ckpt", 2)):
        record = _provenance(tmp_path / name)
        assert record["epochs"] == {"asked": None, "done": done} and record["weights"]["epoch"] == done
        assert record["seed"] == 11 and record["solver"]["class"] == "lightning.pytorch.Trainer"
        assert record["solver"]["solver_params"]["global_step"] == 2 * done
        assert record["optimizer"]["parameter_groups"][0]["initial_lr"] == 0.1
        assert record["optimizer"]["parameter_groups"][0]["parameters"] == ["#0", "#1"]
    # a weight changed after saving: the auditor's check names the field
    path = tmp_path / "epoch=1-step=4.ckpt"
    doc = json.loads(path.read_text())
    data = tmp_path / doc["state_dict"]["location"]
    raw = bytearray(data.read_bytes())
    raw[doc["state_dict"]["byteOffset"]] ^= 1
    data.write_bytes(bytes(raw))
    with pytest.raises(tl.FormatError, match="weights.sha256.*the weights were changed after saving"):
        verify_model_file(path, pointer="/state_dict")
