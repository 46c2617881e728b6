"""``model_loader_extra_config={"verify": True, ...}``: the directory's signature is checked before any
weight is read, and a directory that fails the check (or has no signature) is not served."""
import glob
import os
import shutil
import subprocess
import sys

import pytest

pytest.importorskip("vllm")
pytest.importorskip("cryptography")
from cryptography.hazmat.primitives import serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402

from _vllm_support import generate, start  # noqa: E402
from tensorlist.errors import SignatureError  # noqa: E402


def _pem_pair(folder, name):
    key = ec.generate_private_key(ec.SECP256R1())
    priv, pub = folder / f"{name}.pem", folder / f"{name}.pub"
    priv.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))
    pub.write_bytes(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
    return str(priv), str(pub)


@pytest.fixture(scope="module")
def signed(models, tmp_path_factory):
    """A signed copy of the float32 model (``tensorlist sign DIR --key KEY``), with the public keys."""
    root = tmp_path_factory.mktemp("signed")
    priv, pub = _pem_pair(root, "key")
    _, other_pub = _pem_pair(root, "other")
    folder = root / "model"
    shutil.copytree(models("float32")[1], folder)
    subprocess.run([sys.executable, "-m", "tensorlist", "sign", str(folder), "--key", priv], check=True)
    return folder, pub, other_pub


def _copy(src, dst):
    shutil.copytree(src, dst)
    return dst


def test_verified_model_is_served(signed, models, loader_log):
    folder, pub, _ = signed
    tokens = generate(folder, "tensorlist", model_loader_extra_config={"verify": True, "public_key": pub})
    assert tokens == generate(models("float32")[0], "safetensors")
    n = len(os.listdir(folder)) - 1  # every file but the signature
    assert f"Verified {n} files of {folder} against {folder}{os.sep}model.sig" in loader_log


def test_changed_weights_are_refused(signed, tmp_path, loader_log):
    folder = _copy(signed[0], tmp_path / "model")
    (data,) = glob.glob(os.path.join(folder, "model.json.*.data"))
    with open(data, "r+b") as f:
        f.seek(1000)
        b = f.read(1)
        f.seek(1000)
        f.write(bytes([b[0] ^ 1]))
    with pytest.raises(SignatureError, match=f"{data}: changed since it was signed"):
        start(folder, "tensorlist", model_loader_extra_config={"verify": True, "public_key": signed[1]})
    assert not any(m.startswith("Loading weights took") for m in loader_log)


def test_another_key_is_refused(signed):
    with pytest.raises(SignatureError, match="model.sig"):
        start(signed[0], "tensorlist", model_loader_extra_config={"verify": True, "public_key": signed[2]})


def test_no_signature_is_refused(signed, tmp_path):
    folder = _copy(signed[0], tmp_path / "model")
    os.unlink(folder / "model.sig")
    with pytest.raises(SignatureError, match=f"{folder}{os.sep}model.sig: no signature: verify=True refuses"):
        start(folder, "tensorlist", model_loader_extra_config={"verify": True, "public_key": signed[1]})
