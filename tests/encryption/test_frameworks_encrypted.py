"""key= through the framework adapters: numpy, JAX, MLX and TensorFlow save and load encrypted files.

Each adapter's save seals with the key, its load opens with it, and without
the key its load raises ``EncryptionError`` naming the file; the file is the
same format (``tensorlist.load(key=)`` reads what each adapter wrote).
"""
import numpy as np
import pytest

import tensorlist as tl

pytest.importorskip("cryptography")

KEY = tl.Key(bytes(range(32)))
VALUES = np.arange(12, dtype=np.float32).reshape(3, 4)


def _jax():
    jnp = pytest.importorskip("jax.numpy")
    import tensorlist.jax as tlj
    return (lambda p, k: tlj.save(p, {"w": jnp.asarray(VALUES)}, key=k),
            lambda p, k: np.asarray(tlj.load(p, key=k)["w"]))


def _mlx():
    mx = pytest.importorskip("mlx.core")
    import tensorlist.mlx as tm
    return (lambda p, k: tm.save(p, {"w": mx.array(VALUES)}, key=k),
            lambda p, k: np.array(tm.load(p, key=k)["w"]))


def _tensorflow():
    tf = pytest.importorskip("tensorflow")
    import tensorlist.tensorflow as ttf
    return (lambda p, k: ttf.save(p, {"w": tf.constant(VALUES)}, key=k),
            lambda p, k: ttf.load(p, key=k)["w"].numpy())


def _numpy():
    return (lambda p, k: tl.save(p, {"w": VALUES}, key=k), lambda p, k: tl.load(p, key=k)["w"])


@pytest.mark.parametrize("adapter", [_numpy, _jax, _mlx, _tensorflow], ids=["numpy", "jax", "mlx", "tensorflow"])
def test_an_adapter_saves_and_loads_encrypted(tmp_path, adapter):
    save, load = adapter()
    path = str(tmp_path / "m.tl")
    save(path, KEY)
    assert (load(path, KEY) == VALUES).all()
    assert (tl.load(path, key=KEY)["w"] == VALUES).all()
    assert tl.open(path).encrypted
    with pytest.raises(tl.EncryptionError, match="encrypted: pass key=") as info:
        load(path, None)
    assert info.value.file == path
    with pytest.raises(tl.EncryptionError, match="another key"):
        load(path, tl.Key.generate())
