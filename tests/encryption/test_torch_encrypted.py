"""key= through the torch adapter and the training record: module and optimizer states, device loads, model files.

Each entry point writes an encrypted file with the key and reads it back
with it; without the key, or with another, it raises ``EncryptionError``
naming the file and returns nothing. The device load path decrypts each
tensor once (not once per staging chunk it spans).
"""
import os

import numpy as np
import pytest

import tensorlist as tl

pytest.importorskip("cryptography")
torch = pytest.importorskip("torch")
import tensorlist.torch as tt  # noqa: E402
from tensorlist.provenance.record import (TrainingRecorder, read_dataset_params, read_training_record,  # noqa: E402
                                          save_model_file, verify_model_file)

KEY = tl.Key(bytes(range(32)))
LOADER = {"batch_size": 4, "shuffle": False, "drop_last": False, "sampler": None}


def _state():
    g = torch.Generator().manual_seed(0)
    return {"w": torch.randn(300, 1000, generator=g), "h": torch.randn(5, 7, generator=g).to(torch.bfloat16),
            "e": torch.zeros(0, 3), "i": torch.arange(5)}


def _refused(read, path):
    """``read(key)`` raises EncryptionError naming ``path`` without the key and with another."""
    for key, words in ((None, "pass key="), (tl.Key.generate(), "another key")):
        with pytest.raises(tl.EncryptionError, match=words) as info:
            read(key)
        assert info.value.file == path or path in str(info.value)


def _equal(a, b):
    assert list(a) == list(b)
    for n in a:
        assert a[n].dtype == b[n].dtype and torch.equal(a[n].cpu(), b[n].cpu()), n


@pytest.mark.parametrize("mmap", [True, False, "copy"])
def test_load_state_round_trip(tmp_path, mmap):
    path = str(tmp_path / "m.json")
    tt.save_module_state(path, _state(), key=KEY)
    assert tl.open(path).encrypted
    _equal(tt.load_state(path, key=KEY, mmap=mmap), _state())
    _equal(tl.load(path, device="cpu", key=KEY, mmap=mmap), _state())
    _refused(lambda k: tt.load_state(path, key=k), path)


def test_load_module_state_round_trip_and_refusal_leaves_the_module(tmp_path):
    path = str(tmp_path / "lin.json")
    src = torch.nn.Linear(4, 3)
    tt.save_module_state(path, src, key=KEY)
    dst = torch.nn.Linear(4, 3)
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    _refused(lambda k: tt.load_module_state(path, dst, key=k), path)
    _equal(dst.state_dict(), before)
    assert tt.load_module_state(path, dst, key=KEY).complete
    _equal(dst.state_dict(), src.state_dict())


def test_optimizer_state_round_trip(tmp_path):
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    model(torch.ones(2, 4)).sum().backward()
    opt.step()
    path = str(tmp_path / "opt.json")
    tt.save_optimizer_state(path, opt, key=KEY)
    assert "param_groups" not in open(path).read()  # the optimizer's JSON is sealed with the metadata
    _refused(lambda k: tt.load_optimizer_state(path, key=k), path)
    sd = tt.load_optimizer_state(path, key=KEY)
    want = opt.state_dict()
    assert sd["param_groups"] == want["param_groups"]
    for pid, entry in want["state"].items():
        for k, v in entry.items():
            assert torch.equal(sd["state"][pid][k], v)


def test_the_device_path_decrypts_each_tensor_once(tmp_path):
    """Chunks of 4 KiB cut "w" (1.2 MB) into hundreds of pieces: it is still decrypted once."""
    path = str(tmp_path / "m.json")
    tt.save_module_state(path, _state(), key=KEY)
    with tl.open(path, key=KEY, mmap=False) as r:
        calls = []
        decrypt = r._data._decrypt
        r._data._decrypt = lambda indices, outs: (calls.extend(indices), decrypt(indices, outs))
        got = tt.load_into_device(r, "cpu", chunk_bytes=4096)
    _equal(got, _state())
    assert sorted(calls) == [0, 1, 3]  # every tensor with bytes, each once ("e" is empty)
    with tl.open(path, mmap=False) as r, pytest.raises(tl.EncryptionError, match="pass key=") as info:
        tt.load_into_device(r, "cpu")
    assert info.value.file == path


def test_model_file_record_is_sealed(tmp_path):
    path = str(tmp_path / "final.json")
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = TrainingRecorder(model, opt, train_loader=LOADER, epochs=2, encryption_key=KEY)
    rec.epoch_done(0.5)
    saved = rec.save(path, model, dataset_params={"name": "toy"})
    text = open(path).read()
    assert '"training"' not in text and '"toy"' not in text  # JSON keys and strings, never in base64: sealed
    assert verify_model_file(path, key=KEY) == saved
    assert read_training_record(path, key=KEY) == saved
    assert read_dataset_params(path, key=KEY) == {"name": "toy"}
    _refused(lambda k: verify_model_file(path, key=k), path)
    _refused(lambda k: read_training_record(path, key=k), path)
    again = TrainingRecorder(model, opt, train_loader=LOADER, epochs=2, encryption_key=KEY)
    again.resume(path)
    assert again.epochs_done == 1
    other = str(tmp_path / "other.json")
    save_model_file(other, model, training=saved, dataset_params={"name": "toy"}, key=KEY)
    assert verify_model_file(other, key=KEY)["history"] == saved["history"]
    _equal(tt.load_state(other, key=KEY), {k: v.detach() for k, v in model.state_dict().items()})


def test_a_plain_model_file_ignores_no_key(tmp_path):
    path = os.path.join(tmp_path, "plain.json")
    model = torch.nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    rec = TrainingRecorder(model, opt, train_loader=LOADER, epochs=1)
    rec.epoch_done(0.5)
    saved = rec.save(path, model, dataset_params={"name": "toy"})
    assert verify_model_file(path) == saved
    assert np.array_equal(tl.load(path)["bias"], model.bias.detach().numpy())
