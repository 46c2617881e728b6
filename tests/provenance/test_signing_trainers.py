"""Where people train: each integration given a signing key signs what it saves; without one nothing changes.

Real components throughout: the reference loops, TrainingRecorder, a Lightning Trainer with tensorlist's
checkpoint plugin, a transformers Trainer and an Accelerator. Each signature is checked with
tensorlist.provenance.signing.verify (with the attestation), and one checkpoint directory with the stock library.
"""
import os
import pathlib
import sys

import numpy as np
import pytest

pytest.importorskip("model_signing", reason="tensorlist[sign] (model-signing) is not installed")
torch = pytest.importorskip("torch", reason="the trainer integrations need torch")

from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from tensorlist import loops
from tensorlist.provenance import signing
from tensorlist.provenance.record import TrainingRecorder, read_training_record  # noqa: E402
from _paths import SUPPORT  # noqa: E402

HERE = SUPPORT
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
        _signed_everywhere(res.files[kind], key, tmp_path)
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
    _signed_everywhere(path, key, tmp_path)
    plain = TrainingRecorder(m, torch.optim.SGD(m.parameters(), lr=0.1), train_loader=LOADER, epochs=1)
    plain.epoch_done(0.5)
    (tmp_path / "plain").mkdir()
    plain.save(str(tmp_path / "plain" / "final.json"), m, dataset_params={"name": "toy"})
    assert _signatures(tmp_path / "plain") == []


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
    _signed_everywhere(paths[1], key, tmp_path)


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
    assert _signatures(plain) == []
    assert np.isfinite(read_training_record(os.path.join(out, "model.json"))["epochs"]["done"])
    _signed_everywhere(out, key, tmp_path)
    _signed_everywhere(ckpt, key, tmp_path)


# --- signing as you train: every entry point, checked by both verifiers, a changed byte, no key -------------------

def _stock(path, public, tmp_path):
    """The stock model_signing verifier on what sign_saved wrote: a directory whole, a file's set in its directory."""
    verifying = __import__("model_signing.verifying").verifying
    pem = tmp_path / "stock.pub"
    pem.write_bytes(public.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    config = verifying.Config().use_elliptic_key_verifier(public_key=pem)
    path, sig = pathlib.Path(path), pathlib.Path(signing.default_signature(path))
    if path.is_dir():
        config.verify(path, sig)
    else:  # a file's signature lists the descriptor and its data file: the rest of the directory is not its
        config.set_ignore_unsigned_files(True).verify(path.parent, sig)


def _changed_byte(path):
    """Flips one byte of the largest data file the signature of ``path`` covers; returns that file's name."""
    root = path if os.path.isdir(path) else os.path.dirname(path)
    signed = signing.verify(path, public_key=_changed_byte.public, signature=signing.default_signature(path))
    name = max((n for n in signed if n.endswith(".data")), key=lambda n: os.path.getsize(os.path.join(root, n)))
    full = os.path.join(root, name)
    data = bytearray(open(full, "rb").read())
    data[len(data) // 2] ^= 1
    with open(full, "wb") as f:
        f.write(data)
    return name


def _signed_everywhere(path, key, tmp_path):
    """``path`` verifies with tensorlist (signature and attestation) and the stock verifier, and fails once changed."""
    assert _verified(path, key[1])
    _stock(path, key[1], tmp_path)
    _changed_byte.public = key[1]
    name = _changed_byte(path)
    with pytest.raises(signing.SignatureError, match=f"{name}: changed since it was signed"):
        signing.verify(path, public_key=key[1], signature=signing.default_signature(path))


def _signatures(directory):
    return sorted(os.path.relpath(os.path.join(d, n), directory) for d, _, names in os.walk(directory) for n in names
                  if n.endswith((".sig", ".provenance.json")))


@pytest.fixture
def signings(monkeypatch):
    """The paths sign_saved signs, in order (signed_save's one call per save)."""
    seen = []
    real = signing.sign_saved

    def counted(path, *args, **kwargs):
        seen.append(os.fspath(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(signing, "sign_saved", counted)
    return seen


def _lightning(monkeypatch):
    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    monkeypatch.syspath_prepend(HERE)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import _lightning_script
    return _lightning_script


def test_lightning_record_callback_signs_each_checkpoint_once(tmp_path, key, monkeypatch, signings):
    script = _lightning(monkeypatch)
    from tensorlist.lightning import TensorListCheckpointIO

    io = TensorListCheckpointIO()
    script.fit(tmp_path / "ckpts", 2, plugins=[io], signing_key=key[0])
    paths = sorted(str(tmp_path / "ckpts" / n) for n in os.listdir(tmp_path / "ckpts") if n.endswith(".ckpt"))
    assert len(paths) == 2 and signings == paths  # each checkpoint signed once, as it was saved
    assert io.signing_key is None  # the key was lent for the run only
    for p in paths:
        _signed_everywhere(p, key, tmp_path)
    script.fit(tmp_path / "plain", 1, plugins=[TensorListCheckpointIO()])
    assert _signatures(tmp_path / "plain") == []


def test_lightning_callback_and_plugin_keys_sign_once_and_two_keys_are_refused(tmp_path, key, monkeypatch, signings):
    script = _lightning(monkeypatch)
    from tensorlist.lightning import TensorListCheckpointIO

    script.fit(tmp_path / "same", 1, plugins=[TensorListCheckpointIO(signing_key=key[0])], signing_key=key[0])
    assert signings == [str(tmp_path / "same" / "epoch=0-step=4.ckpt")]
    _verified(signings[0], key[1])
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(ValueError, match="different signing keys: give one of them the key"):
        script.fit(tmp_path / "two", 1, plugins=[TensorListCheckpointIO(signing_key=other)], signing_key=key[0])
    with pytest.raises(ValueError, match=r"plugins=\[TensorListCheckpointIO\(\)\].*TorchCheckpointIO"):
        script.fit(tmp_path / "stock", 1, plugins=[], signing_key=key[0])


#: DCP in one process without a process group says so on every save and load: expected here.
ONE_PROCESS = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


@ONE_PROCESS
def test_lightning_sharded_strategy_signs_each_directory_and_a_killed_save_leaves_no_signature(tmp_path, key,
                                                                                              monkeypatch):
    """The strategies' sharded save in one process (a real 2-process fit: the slow test below)."""
    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    from torch.distributed.checkpoint.api import CheckpointException

    from tensorlist.dcp import TensorListWriter, is_save_file
    from tensorlist.lightning import META_NAME, TensorListModelParallelStrategy

    strategy, path = TensorListModelParallelStrategy(signing_key=key[0]), tmp_path / "last.ckpt"

    def save(epoch):
        strategy.save_checkpoint({"state_dict": {"w": torch.full((64,), float(epoch))}, "optimizer_states": [],
                                  "epoch": epoch}, path)

    save(0)
    save(1)  # in place: the first save's shards are gone before the directory is signed
    files = _verified(path, key[1])
    assert META_NAME in files and ".metadata.json" in files
    assert len({is_save_file(n) for n in files} - {None}) == 1  # one save's shards: the replaced save's were gone

    def killed(self, *args, **kwargs):
        raise OSError("killed before the DCP commit")

    monkeypatch.setattr(TensorListWriter, "finish", killed)
    with pytest.raises(CheckpointException, match="killed before the DCP commit"):
        save(2)
    monkeypatch.undo()
    assert _signatures(path) == []  # never the epoch-1 signature beside the epoch-2 files
    assert strategy._load_meta(path)["epoch"] == 1
    save(3)
    _signed_everywhere(path, key, tmp_path)
    plain = TensorListModelParallelStrategy()
    plain.save_checkpoint({"state_dict": {"w": torch.ones(2)}, "optimizer_states": [], "epoch": 0}, tmp_path / "p")
    assert _signatures(tmp_path / "p") == []


@pytest.mark.slow
def test_lightning_model_parallel_fit_on_two_processes_signs_each_checkpoint_directory(tmp_path, key):
    import subprocess

    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    out = tmp_path / "run"
    out.mkdir()
    env = dict(os.environ, OMP_NUM_THREADS="1", TENSORLIST_TEST_SIGNING_KEY=key[0])
    done = subprocess.run([sys.executable, os.path.join(HERE, "_lightning_script.py"), "model_parallel", str(out), "2"],
                          env=env, cwd=out, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    dirs = sorted(p for p in out.iterdir() if p.is_dir())
    assert [p.name for p in dirs] == ["epoch=0-step=2.ckpt", "epoch=1-step=4.ckpt"]
    for d in dirs:
        assert _signatures(d) == ["model.provenance.json", "model.sig"]
        _signed_everywhere(d, key, tmp_path)


def test_reference_loop_signs_its_sharded_checkpoint_and_a_killed_save_leaves_no_signature(tmp_path, key,
                                                                                          monkeypatch):
    import subprocess

    from torch.distributed.checkpoint.api import CheckpointException

    from tensorlist.dcp import TensorListWriter

    def run(out, epochs, **kw):
        m = torch.nn.Linear(3, 1)
        return loops.epochs(m, torch.optim.SGD(m.parameters(), lr=0.1), _data(), loss_fn=torch.nn.functional.mse_loss,
                            max_epochs=epochs, out_dir=out, progress=False, checkpoint_format="sharded", **kw)

    res = run(tmp_path / "run", 2, signing_key=key[0])
    ckpt = res.files["checkpoint"]
    assert os.path.isdir(ckpt) and ".metadata.json" in _verified(ckpt, key[1])
    pem = tmp_path / "k.pub"
    pem.write_bytes(key[1].public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    cli = subprocess.run([sys.executable, "-m", "tensorlist", "verify", ckpt, "--public-key", str(pem)],
                         capture_output=True, text=True, timeout=120,
                         env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    assert cli.returncode == 0 and f"against {os.path.join(ckpt, 'model.sig')}" in cli.stdout, cli.stderr
    _signed_everywhere(ckpt, key, tmp_path)

    def killed(self, *args, **kwargs):
        raise OSError("killed before the DCP commit")

    monkeypatch.setattr(TensorListWriter, "finish", killed)
    with pytest.raises(CheckpointException, match="killed before the DCP commit"):
        run(tmp_path / "run", 1, signing_key=key[0])  # a new run into the same directory, killed at its first save
    monkeypatch.undo()
    assert _signatures(ckpt) == []
    plain = run(tmp_path / "plain", 1)
    assert _signatures(tmp_path / "plain") == [] and os.path.isdir(plain.files["checkpoint"])


def test_hugging_face_save_model_signs_the_model_file(tmp_path, key, signings):
    transformers = pytest.importorskip("transformers", reason="the Trainer integration needs transformers")
    sys.path.insert(0, HERE)
    try:
        from _hf_support import Tokens, tiny_gpt2
    finally:
        sys.path.remove(HERE)
    from tensorlist import huggingface as hf

    def trainer(out, **kw):
        args = transformers.TrainingArguments(
            output_dir=os.fspath(out), max_steps=1, per_device_train_batch_size=4, save_steps=1, logging_steps=1,
            report_to=[], use_cpu=True, seed=0, disable_tqdm=True, dataloader_num_workers=0)
        t = hf.TensorListTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens(), **kw)
        t.train()
        return t

    t = trainer(tmp_path / "hf", signing_key=key[0])
    t.save_model(os.fspath(tmp_path / "final"))
    model = os.path.join(tmp_path, "final", "model.json")
    assert signings == [os.path.join(tmp_path, "hf", "checkpoint-1"), model]  # the checkpoint once, whole
    assert _signatures(tmp_path / "hf") == ["checkpoint-1/model.provenance.json", "checkpoint-1/model.sig"]
    assert sorted(_verified(model, key[1])) == sorted(["model.json"] + [n for n in os.listdir(tmp_path / "final")
                                                                        if n.startswith("model.json.")
                                                                        and n.endswith(".data")])
    _signed_everywhere(model, key, tmp_path)
    _signed_everywhere(os.path.join(tmp_path, "hf", "checkpoint-1"), key, tmp_path)
    trainer(tmp_path / "plain").save_model(os.fspath(tmp_path / "plain-final"))
    assert _signatures(tmp_path / "plain") == [] and _signatures(tmp_path / "plain-final") == []


def test_lineage_checks_the_signature_of_a_signed_lightning_checkpoint_origin(tmp_path, key, monkeypatch):
    """A model fine-tuned from a checkpoint the plugin signed: lineage verifies that signature, and a changed
    byte of the checkpoint breaks the link that names it."""
    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    monkeypatch.syspath_prepend(HERE)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import _lightning_script
    import tensorlist
    from tensorlist.lightning import TensorListCheckpointIO
    from tensorlist.provenance.lineage import lineage
    from tensorlist.provenance.record import CHECKPOINT_WEIGHTS, model_file_origin

    runs = tmp_path / "runs"
    _lightning_script.fit(runs / "pl", 1, plugins=[TensorListCheckpointIO(signing_key=key[0])])
    ckpt = str(runs / "pl" / "epoch=0-step=4.ckpt")
    net = _lightning_script.Tiny().net
    weights = tensorlist.load(ckpt, pointer=CHECKPOINT_WEIGHTS)
    net.load_state_dict({k[len("net."):]: torch.from_numpy(np.array(v)) for k, v in weights.items()})
    (runs / "ft").mkdir()
    rec = TrainingRecorder(net, torch.optim.SGD(net.parameters(), lr=0.05), train_loader=LOADER, epochs=1,
                           initial_weights={"from": None, "origin": model_file_origin(ckpt, relative_to=runs / "ft")})
    rec.epoch_done(0.5)
    child = str(runs / "ft" / "final.tl")
    rec.save(child, net, dataset_params={"name": "toy"})
    public = tmp_path / "team.pub"
    public.write_bytes(key[1].public_bytes(serialization.Encoding.PEM,
                                           serialization.PublicFormat.SubjectPublicKeyInfo))
    held = lineage(child, root=str(runs), public_key=str(public)).check()
    assert [k.signature_verified for k in held.links] == [None, True]
    assert os.path.realpath(held.links[1].signature) == os.path.realpath(ckpt + ".sig")
    with open(ckpt, "a") as f:  # one byte more in the checkpoint's document: its signature no longer holds
        f.write(" ")
    broken = lineage(child, root=str(runs), public_key=str(public))
    assert broken.broken is not None and broken.broken.index == 1 and "does not verify" in broken.broken.reason
