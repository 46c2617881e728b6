"""What the TensorFlow adapter alone does: DLPack aliasing and its alignment rule, in-place saves, variables.

What every adapter promises (round trips of every dtype, tf.Variable
included, refusals, strided inputs, metadata, broken files, loads aliasing
the file's pages...) is tests/adapters/test_contract.py's.
"""
import gc
import os

import numpy as np
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner, not a test's output
tf = pytest.importorskip("tensorflow", reason="the TensorFlow adapter needs tensorflow (pip install tensorflow-cpu)")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and float8 arrays need ml_dtypes")

from _framework_support import bits as _bits, sample as _sample  # noqa: E402
import tensorlist as tl  # noqa: E402
import tensorlist.tensorflow as ttf  # noqa: E402
from tensorlist import reader  # noqa: E402
from tensorlist._base import dtypes  # noqa: E402
from tensorlist._bridges.tf import HELD, refusal  # noqa: E402

REFUSED = sorted(d.name for d in dtypes.DTYPES if refusal(d.name) is not None)  # the contract pins this set
COPIED = {"float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz"}  # tf.bitcast refuses float8
ALIASED = sorted(set(HELD) - COPIED)


def _tensor_bits(t) -> bytes:
    return _bits(ttf.to_numpy(t))


@pytest.fixture
def captured(monkeypatch):
    """The numpy arrays each ``ttf.load`` got from the reader, to compare addresses with."""
    seen = []

    def load(*args, **kwargs):
        arrays = real(*args, **kwargs)
        seen.append(arrays)
        return arrays

    real = reader.load
    monkeypatch.setattr(ttf.reader, "load", load)
    return seen


def _data_file(tmp_path, descriptor_name):
    return next(p for p in tmp_path.iterdir() if p.name != descriptor_name and p.is_file())


@pytest.mark.parametrize("name", REFUSED)
def test_from_numpy_refuses_what_tensorflow_cannot_hold_naming_the_tensor(name):
    with pytest.raises(TypeError, match=rf"tensor 'w': TensorFlow has no {name} type"):
        ttf.from_numpy(_sample(name, (2,)), "tensor 'w'")


@pytest.mark.parametrize("name", ["float32", "bfloat16", "int64", "bool", "complex128"])
def test_save_reads_cpu_tensors_in_place(name):
    t = tf.constant(_sample(name, (16,)))
    assert ttf.to_numpy(t).ctypes.data == ttf.address(t)
    v = tf.Variable(t)
    assert ttf.to_numpy(v).ctypes.data == ttf.address(v)


def _at(a: np.ndarray, misalign: int = 0) -> np.ndarray:
    """A writable copy of ``a`` at an address ``misalign`` bytes past a multiple of 64."""
    buf = np.empty(a.nbytes + 128, np.uint8)
    start = (-buf.ctypes.data) % 64 + misalign
    out = buf[start:start + a.nbytes].view(a.dtype).reshape(a.shape)
    out[...] = a
    return out


@pytest.mark.parametrize("name", ALIASED)
def test_aligned_writable_arrays_are_aliased_others_copied(name):
    a = _at(_sample(name, (4, 8)))
    assert ttf.address(ttf.from_numpy(a)) == a.ctypes.data
    a.flags.writeable = False  # numpy exports no read-only array by the legacy DLPack protocol
    t = ttf.from_numpy(a)
    assert ttf.address(t) != a.ctypes.data and _tensor_bits(t) == _bits(a)


@pytest.mark.parametrize("misalign", [8, 16, 32])
def test_less_than_64_byte_aligned_arrays_are_copied(misalign):
    # aliased, TensorFlow would abort the process at the first op ("Check failed: IsAligned()")
    a = _at(np.arange(16, dtype=np.float64), misalign)
    t = ttf.from_numpy(a)
    assert ttf.address(t) != a.ctypes.data
    assert float(tf.reduce_sum(t + 1)) == 136.0


@pytest.mark.parametrize("mmap", [True, "copy", False])
def test_load_is_zero_copy_over_what_the_reader_returned(tmp_path, captured, mmap):
    arrays = {k: _sample(k, (64,)) for k in ALIASED}
    tl.save(tmp_path / "z.tl", arrays)
    loaded = ttf.load(tmp_path / "z.tl", mmap=mmap)
    [views] = captured
    for k in ALIASED:
        assert ttf.address(loaded[k]) == views[k].ctypes.data, k
        assert _tensor_bits(loaded[k]) == _bits(arrays[k])


def test_tensors_keep_the_mapping_alive_and_the_file_never_changes(tmp_path):
    w = _sample("float32", (256,))
    tl.save(tmp_path / "k.tl", {"w": w})
    data = _data_file(tmp_path, "k.tl")
    before = data.read_bytes()
    t = ttf.load(tmp_path / "k.tl")["w"]
    gc.collect()
    var = tf.Variable(t)
    var.assign_add(tf.ones_like(t))
    assert _tensor_bits(t) == _bits(w)
    assert np.array_equal(var.numpy(), w + 1)
    del var
    gc.collect()
    assert _tensor_bits(t) == _bits(w) and data.read_bytes() == before


def test_variables_from_a_load(tmp_path):
    tl.save(tmp_path / "m.tl", {"dense/kernel": np.eye(3, dtype=np.float32)})
    variables = {k: tf.Variable(t, name=k.replace("/", "_")) for k, t in ttf.load(tmp_path / "m.tl").items()}
    assert variables["dense/kernel"].trainable and variables["dense/kernel"].shape == (3, 3)
    target = tf.Variable(tf.zeros((3, 3)))
    target.assign(ttf.load(tmp_path / "m.tl")["dense/kernel"])
    assert np.array_equal(target.numpy(), np.eye(3))


def test_unaligned_files_load_right(tmp_path):
    arrays = {"a": _sample("uint8", (3,)), "w": _sample("float64", (5,)), "b": _sample("bfloat16", (7,))}
    tl.save(tmp_path / "u.tl", arrays, alignment=8)
    loaded = ttf.load(tmp_path / "u.tl")
    assert all(_tensor_bits(loaded[k]) == _bits(v) for k, v in arrays.items())
    assert float(tf.reduce_sum(tf.cast(loaded["w"], tf.float64))) == pytest.approx(arrays["w"].sum())
