"""vLLM serves an encrypted tensorlist model directory: ``model_loader_extra_config={"key_file": PATH}``.

Each shard of a tiny Llama's tensorlist twin is re-saved encrypted (``tensorlist.save(key=...)``, the
index copied as it is); the engine given the key file generates the tokens of the plain directory.
Without the key, with another key, or with a key file that holds no key, the engine is not built and
the error names the file.
"""
import json
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("vllm")
pytest.importorskip("cryptography")

import tensorlist as tl  # noqa: E402
from _vllm_support import generate, start  # noqa: E402
from tensorlist.errors import EncryptionError  # noqa: E402

KEY = tl.Key(bytes(range(100, 132)))


def _shards(folder) -> list:
    index = os.path.join(folder, "model.index.json")
    if not os.path.isfile(index):
        return [os.path.join(folder, "model.json")]
    with open(index, encoding="utf-8") as f:
        return sorted({os.path.join(folder, v) for v in json.load(f)["weight_map"].values()})


@pytest.fixture(scope="module")
def encrypted(models, tmp_path_factory):
    """``(plain tensorlist dir, encrypted copy, key file)`` of the several-shard model."""
    plain = models("shards")[1]
    root = tmp_path_factory.mktemp("encrypted")
    out = shutil.copytree(plain, root / "tl")
    for path in _shards(out):
        with tl.open(path, bits=True) as r:
            arrays, meta = {k: np.array(v) for k, v in r.to_dict().items()}, r.metadata
        tl.save(path, arrays, metadata=meta, key=KEY)
        assert tl.open(path).encrypted
    key_file = root / "model.key"
    KEY.save(key_file)
    return plain, os.fspath(out), os.fspath(key_file)


def test_an_encrypted_model_generates_the_plain_ones_tokens(encrypted, loader_log):
    plain, folder, key_file = encrypted
    assert len(_shards(folder)) > 1
    want = generate(plain, "tensorlist")
    assert generate(folder, "tensorlist", model_loader_extra_config={"key_file": key_file}) == want
    assert len({t for seq in want for t in seq}) > 8  # tokens that vary: the weights are used
    assert any(m.startswith("Loading weights took ") for m in loader_log)


def test_without_the_key_the_load_fails_naming_the_file(encrypted):
    _, folder, _ = encrypted
    with pytest.raises(EncryptionError, match="key_file") as e:
        start(folder, "tensorlist")
    assert e.value.file in _shards(folder) and e.value.file in str(e.value)


def test_another_key_fails_naming_the_file(encrypted, tmp_path):
    _, folder, _ = encrypted
    other = tmp_path / "other.key"
    tl.Key.generate().save(other)
    with pytest.raises(EncryptionError, match="another key") as e:
        start(folder, "tensorlist", model_loader_extra_config={"key_file": os.fspath(other)})
    assert e.value.file in _shards(folder) and e.value.file in str(e.value)


@pytest.mark.parametrize("content", [None, b"short", bytes(33)], ids=["missing", "short", "long"])
def test_a_key_file_that_holds_no_key_is_one_clear_error(tmp_path, content):
    from vllm.config.load import LoadConfig

    from tensorlist.vllm.loader import TensorListModelLoader

    path = tmp_path / "bad.key"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ValueError, match=f"key_file '{path}' gives no key") as e:
        TensorListModelLoader(LoadConfig(load_format="tensorlist", model_loader_extra_config={"key_file": str(path)}))
    assert ("No such file" in str(e.value)) == (content is None)
