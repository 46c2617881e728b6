"""Where people train: each integration given a signing key signs what it saves; without one nothing changes.

Real components throughout: the reference loops, TrainingRecorder, a Lightning Trainer with tensorlist's
checkpoint plugin, a transformers Trainer and an Accelerator. Each signature is checked with
tensorlist.signing.verify (with the attestation), and one checkpoint directory with the stock library.
"""
import os
import sys

import numpy as np
import pytest

pytest.importorskip("model_signing", reason="tensorlist[sign] (model-signing) is not installed")
torch = pytest.importorskip("torch", reason="the trainer integrations need torch")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from tensorlist import loops, signing  # noqa: E402
from tensorlist.record import TrainingRecorder, read_training_record  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
LOADER = {"batch_size": 8, "shuffle": False, "drop_last": False, "sampler": None}


@pytest.fixture
def key(tmp_path):
    k = ec.generate_private_key(ec.SECP256R1())
    path = tmp_path / "signing.pem"
    path.write_bytes(k.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))
    return str(path), k.public_key()


def _verified(path, public):
    """The signature and attestation sign_saved wrote for ``path``, verified; the files they cover."""
    if os.path.isdir(path):
        sig, prov = os.path.join(path, "model.sig"), os.path.join(path, "model.provenance.json")
    else:
        sig, prov = path + ".sig", path + ".provenance.json"
    return signing.verify(path, public_key=public, signature=sig, provenance=prov)


def _data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 3, generator=g)
    return [(x, x.sum(1, keepdim=True))]


def test_reference_loop_signs_model_files_and_checkpoints(tmp_path, key):
    m = torch.nn.Linear(3, 1)
    out = tmp_path / "run"
    res = loops.epochs(m, torch.optim.SGD(m.parameters(), lr=0.1), _data(), loss_fn=torch.nn.functional.mse_loss,
                       max_epochs=2, out_dir=out, progress=False, signing_key=key[0])
    for kind in ("final", "checkpoint"):
        files = _verified(res.files[kind], key[1])
        assert os.path.basename(res.files[kind]) in files
    plain = tmp_path / "plain"
    loops.epochs(m, torch.optim.SGD(m.parameters(), lr=0.1), _data(), loss_fn=torch.nn.functional.mse_loss,
                 max_epochs=1, out_dir=plain, progress=False)
    assert not [n for n in os.listdir(plain) if n.endswith((".sig", ".provenance.json"))]


def test_training_recorder_signs_each_save(tmp_path, key):
    m = torch.nn.Linear(3, 1)
    rec = TrainingRecorder(m, torch.optim.SGD(m.parameters(), lr=0.1), train_loader=LOADER, epochs=1, signing_key=key[0])
    rec.epoch_done(0.5)
    path = str(tmp_path / "final.json")
    rec.save(path, m, dataset_params={"name": "toy"})
    assert "final.json" in _verified(path, key[1])
    torch.nn.init.zeros_(m.weight)  # a newer save replaces the model file: its signature follows it
    rec.save(path, m, dataset_params={"name": "toy"})
    assert read_training_record(path)["weights"]["sha256"] is not None
    _verified(path, key[1])


def test_lightning_checkpoint_plugin_signs_each_checkpoint(tmp_path, key, monkeypatch):
    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    monkeypatch.syspath_prepend(HERE)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import _lightning_script
    from tensorlist.lightning import TensorListCheckpointIO

    io = TensorListCheckpointIO(signing_key=key[0])
    _, ckpt, _ = _lightning_script.fit(tmp_path / "ckpts", 2, plugins=[io])
    paths = sorted(str(tmp_path / "ckpts" / n) for n in os.listdir(tmp_path / "ckpts") if n.endswith(".ckpt"))
    assert len(paths) == 2
    for p in paths:
        assert os.path.basename(p) in _verified(p, key[1])
    io.remove_checkpoint(paths[0])  # a checkpoint removed takes its signature with it
    assert signing.signature_files(paths[0]) == [] and not os.path.exists(paths[0] + ".sig")


def test_hugging_face_trainer_and_accelerate_sign_their_checkpoints(tmp_path, key):
    transformers = pytest.importorskip("transformers", reason="the Trainer integration needs transformers")
    pytest.importorskip("accelerate", reason="the Accelerate integration needs accelerate")
    sys.path.insert(0, HERE)
    try:
        from _hf_support import Tokens, tiny_gpt2
    finally:
        sys.path.remove(HERE)
    from tensorlist import huggingface as hf

    args = transformers.TrainingArguments(
        output_dir=os.fspath(tmp_path / "hf"), max_steps=2, per_device_train_batch_size=4, save_steps=2,
        logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
    hf.TensorListTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(), signing_key=key[0]).train()
    ckpt = os.path.join(tmp_path, "hf", "checkpoint-2")
    assert "model.json" in _verified(ckpt, key[1])
    stock = __import__("model_signing.verifying").verifying
    pub = tmp_path / "k.pub"
    pub.write_bytes(key[1].public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    stock.Config().use_elliptic_key_verifier(public_key=pub).verify(ckpt, os.path.join(ckpt, "model.sig"))

    import accelerate
    acc = accelerate.Accelerator(cpu=True)
    m = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    m, opt = acc.prepare(m, opt)
    rec = TrainingRecorder(m, opt, train_loader=LOADER, epochs=1, signing_key=key[0])
    out = hf.save_state(acc, tmp_path / "acc", training=rec, dataset_params={"name": "toy"})
    assert "model.json" in _verified(out, key[1])
    hf.load_state(acc, out)  # the signature inside does not disturb the checkpoint's own manifest
    plain = hf.save_state(acc, tmp_path / "acc-plain")
    assert not os.path.exists(os.path.join(plain, "model.sig"))
    assert np.isfinite(read_training_record(os.path.join(out, "model.json"))["epochs"]["done"])
