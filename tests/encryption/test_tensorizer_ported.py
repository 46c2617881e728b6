"""tensorizer's own encryption tests (tests/test_serialization.py, ``TestEncryption``), ported.

Each scenario runs against tensorizer 2.12 itself (the stock: ``TensorSerializer(encryption=)`` and
``TensorDeserializer``) and against tensorlist's torch functions (``save_module_state(key=)``,
``load_state(key=)``, a lazy ``tensorlist.open``), on the same small module, so that each can pass
and each can fail: a passphrase key at the lowest cost with the right, a missing and a wrong
passphrase; the same at the default cost; a random key against the right one and an all-zero one;
an unencrypted model read with a key. tensorizer's model (gpt-neo-125M, downloaded) becomes a
module built here. tensorizer runs where it is installed (with libnacl and libsodium: the vLLM leg of
``.ci/pythons.sh``); tensorlist's side runs everywhere torch does.
"""
from __future__ import annotations

import os

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("cryptography")

import tensorlist as tl  # noqa: E402
from tensorlist.torch import load_state, save_module_state  # noqa: E402


def _module():
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Embedding(64, 32), torch.nn.Linear(32, 48), torch.nn.LayerNorm(48),
                            torch.nn.Linear(48, 8))
    m[3].weight.data = m[3].weight.data.to(torch.bfloat16)
    return m


def _check_deserialized(got, module):
    """tensorizer's check_deserialized: every tensor there, of its size and dtype, equal."""
    want = module.state_dict()
    assert set(got) == set(want)
    for k, v in got.items():
        assert v.size() == want[k].size() and v.dtype == want[k].dtype and torch.equal(v, want[k]), k


class Tensorizer:
    name = "tensorizer"

    def __init__(self):
        pytest.importorskip("libnacl", reason="tensorizer's encryption needs libnacl and libsodium")
        self.s = pytest.importorskip("tensorizer.serialization")

    def passphrase(self, text, lowest_cost):
        P = self.s.EncryptionParams
        costs = dict(opslimit=P.OpsLimit.MIN, memlimit=P.MemLimit.MIN) if lowest_cost else {}
        return P.from_string(source=text, salt=bytes(16), **costs), self.s.DecryptionParams.from_string(text)

    def wrong_passphrase(self, text):
        return self.s.DecryptionParams.from_string(text)

    def random(self):
        enc = self.s.EncryptionParams.random()
        return enc, self.s.DecryptionParams.from_key(enc.key), self.s.DecryptionParams.from_key(bytes(len(enc.key)))

    def save(self, path, module, enc):
        ser = self.s.TensorSerializer(path, encryption=enc)
        ser.write_module(module)
        ser.close()

    def load(self, path, dec, lazy):
        with self.s.TensorDeserializer(path, device="cpu", lazy_load=lazy, verify_hash=True,
                                       encryption=dec) as d:
            return {k: v.clone() for k, v in d.items()}

    def refused(self):
        return pytest.raises(self.s.CryptographyError)


class TensorList:
    name = "tensorlist"

    def passphrase(self, text, lowest_cost):
        costs = dict(memory_kib=8, iterations=1, lanes=1) if lowest_cost else {}
        return tl.Key.from_passphrase(text, **costs), tl.Key.from_passphrase(text)

    def wrong_passphrase(self, text):
        return tl.Key.from_passphrase(text)

    def random(self):
        raw = os.urandom(32)
        return tl.Key(raw), tl.Key(raw), tl.Key(bytes(32))

    def save(self, path, module, enc):
        save_module_state(path, module, key=enc)

    def load(self, path, dec, lazy):
        if not lazy:
            assert tl.validate(path, verify=True, key=dec)  # tensorizer's verify_hash: every tag checked
            return load_state(path, key=dec, mmap=False)
        with tl.open(path, key=dec, bits=True) as r:
            from tensorlist._bridges.torch import from_numpy
            return {k: from_numpy(r[k]).clone() for k in r.keys()}

    def refused(self):
        return pytest.raises(tl.EncryptionError)


@pytest.fixture(params=[Tensorizer, TensorList], ids=lambda c: c.name)
def side(request):
    return request.param()


def _first_key_negative(side, path, dec):
    """tensorizer's _test_first_key_negative: reading the first tensor raises, nothing comes back."""
    with side.refused():
        got = side.load(path, dec, lazy=True)
        assert not got


def test_encryption(side, tmp_path):
    module = _module()
    enc, dec = side.passphrase("test", lowest_cost=True)
    path = os.fspath(tmp_path / "model")
    side.save(path, module, enc)
    for lazy in (False, True):
        _check_deserialized(side.load(path, dec, lazy), module)
    _first_key_negative(side, path, None)
    _first_key_negative(side, path, side.wrong_passphrase("tset"))
    plain = os.fspath(tmp_path / "plain")
    side.save(plain, module, None)
    _first_key_negative(side, plain, dec)


def test_from_string(side, tmp_path):
    module = _module()
    enc, dec = side.passphrase("test", lowest_cost=False)
    _encryption_params(side, tmp_path, module, enc, dec, side.wrong_passphrase("tset"))


def test_random_encryption_params(side, tmp_path):
    module = _module()
    _encryption_params(side, tmp_path, module, *side.random())


def _encryption_params(side, tmp_path, module, enc, dec, wrong):
    path = os.fspath(tmp_path / "model")
    side.save(path, module, enc)
    _check_deserialized(side.load(path, dec, lazy=False), module)
    _first_key_negative(side, path, None)
    _first_key_negative(side, path, wrong)
