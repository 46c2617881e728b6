"""tf.Tensor and tf.Variable go in and come out bit-exact; loads alias the file's copy-on-write mapping.

Every TensorFlow case lives in this one module: importing tensorflow costs
seconds, paid once.
"""
import gc
import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner, not a test's output
tf = pytest.importorskip("tensorflow", reason="the TensorFlow adapter needs tensorflow (pip install tensorflow-cpu)")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and float8 arrays need ml_dtypes")

from _framework_support import bits as _bits, sample as _sample  # noqa: E402
import tensorlist as tl  # noqa: E402
import tensorlist.tensorflow as ttf  # noqa: E402
from tensorlist._base import dtypes
from tensorlist import reader
from tensorlist._bridges.tf import HELD  # noqa: E402
from tensorlist.errors import UnsupportedDTypeError  # noqa: E402

REFUSED = {"float8_e8m0fnu", "float4_e2m1fn_x2"}
COPIED = {"float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz"}  # tf.bitcast refuses float8
ALIASED = sorted(set(HELD) - COPIED)
NO_VARIABLE = {"float8_e5m2fnuz", "float8_e4m3fnuz"}  # TensorFlow 2.21 has no AssignVariableOp kernel for them


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


def _file_mappings(path):
    """(start, end) of this process's mappings of file ``path`` (Linux's /proc/self/maps)."""
    real = os.path.realpath(path)
    spans = []
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == real:
                start, end = (int(x, 16) for x in fields[0].split("-"))
                spans.append((start, end))
    return spans


def _data_file(tmp_path, descriptor_name):
    return next(p for p in tmp_path.iterdir() if p.name != descriptor_name and p.is_file())


def test_every_table_dtype_is_held_or_refused():
    assert set(HELD) | REFUSED == {d.name for d in dtypes.DTYPES}
    assert not set(HELD) & REFUSED


@pytest.mark.parametrize("name", sorted(HELD))
@pytest.mark.parametrize("shape", [(), (0,), (3, 5), (2, 0, 4)])
def test_every_held_dtype_round_trips_bit_exact(tmp_path, name, shape):
    a = _sample(name, shape)
    t = ttf.from_numpy(a)
    assert t.dtype == HELD[name] and tuple(t.shape) == shape
    given = {"t": t} if name in NO_VARIABLE else {"t": t, "v": tf.Variable(t)}
    ttf.save(tmp_path / "m.tl", given)
    on_disk = tl.load(tmp_path / "m.tl")
    assert all(dtypes.from_numpy(on_disk[k].dtype).name == name and _bits(on_disk[k]) == _bits(a) for k in given)
    back = ttf.load(tmp_path / "m.tl")
    for k in given:
        assert isinstance(back[k], tf.Tensor) and back[k].dtype == HELD[name] and tuple(back[k].shape) == shape
        assert _tensor_bits(back[k]) == _bits(a)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(HELD)), shape=st.lists(st.integers(0, 4), max_size=3), seed=st.integers(0, 99),
       mmap=st.booleans())
def test_hypothesis_round_trip(tmp_path_factory, name, shape, seed, mmap):
    path = tmp_path_factory.mktemp("h") / "m.tl"
    a = _sample(name, tuple(shape), seed)
    ttf.save(path, {"a": tf.constant(a)})
    assert _tensor_bits(ttf.load(path, mmap=mmap)["a"]) == _bits(a)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_load_refuses_what_tensorflow_cannot_hold_naming_file_tensor_and_dtype(tmp_path, name, captured):
    tl.save(tmp_path / "r.tl", {"fine": np.ones(2, np.float32), "bad.w": _sample(name, (3,))})
    with pytest.raises(UnsupportedDTypeError, match=rf"r\.tl: tensor 1 \('bad\.w'\) has dtype {name}: "
                                                    "TensorFlow has no") as e:
        ttf.load(tmp_path / "r.tl")
    assert e.value.dtype == name
    with pytest.raises(TypeError, match=rf"tensor 'w': TensorFlow has no {name} type"):
        ttf.from_numpy(_sample(name, (2,)), "tensor 'w'")


@pytest.mark.parametrize("value, match", [
    (lambda: tf.constant(["a"]), r"tensor 'w': TensorFlow dtype string has no tensorlist dataType code"),
    (lambda: tf.sparse.from_dense([1, 0]), r"tensor 'w': expected a tf.Tensor .*SparseTensor .*to_dense"),
    (lambda: tf.ragged.constant([[1], []]), r"tensor 'w': expected a tf.Tensor .*RaggedTensor"),
    (lambda: np.zeros(1), r"tensor 'w': expected a tf.Tensor or tf.Variable, got ndarray"),
])
def test_save_refuses_what_it_cannot_store_naming_the_tensor(tmp_path, value, match):
    with pytest.raises(TypeError, match=match):
        ttf.save(tmp_path / "x.tl", {"ok": tf.zeros(1), "w": value()})
    assert not (tmp_path / "x.tl").exists()


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


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the process's mappings in /proc/self/maps")
def test_default_load_aliases_the_files_own_pages(tmp_path):
    tl.save(tmp_path / "z.tl", {"w": _sample("float32", (1024,)), "b": _sample("bfloat16", (1024,))})
    loaded = ttf.load(tmp_path / "z.tl")
    spans = _file_mappings(_data_file(tmp_path, "z.tl"))
    assert spans, "the data file is not mapped"
    for k, t in loaded.items():
        p = ttf.address(t)
        assert p % tl.DEFAULT_ALIGNMENT == 0
        assert any(start <= p < end for start, end in spans), k


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


def test_loaded_tensors_survive_the_file_being_replaced(tmp_path):
    old, new = _sample("float32", (512,)), _sample("float32", (512,), seed=1)
    tl.save(tmp_path / "r.tl", {"w": old})
    t = ttf.load(tmp_path / "r.tl")["w"]
    tl.save(tmp_path / "r.tl", {"w": new})  # a new data file; the old one is swept away
    gc.collect()
    assert _tensor_bits(t) == _bits(old) and _tensor_bits(ttf.load(tmp_path / "r.tl")["w"]) == _bits(new)


def test_variables_from_a_load(tmp_path):
    tl.save(tmp_path / "m.tl", {"dense/kernel": np.eye(3, dtype=np.float32)})
    variables = {k: tf.Variable(t, name=k.replace("/", "_")) for k, t in ttf.load(tmp_path / "m.tl").items()}
    assert variables["dense/kernel"].trainable and variables["dense/kernel"].shape == (3, 3)
    target = tf.Variable(tf.zeros((3, 3)))
    target.assign(ttf.load(tmp_path / "m.tl")["dense/kernel"])
    assert np.array_equal(target.numpy(), np.eye(3))


def test_numpy_files_load_in_tensorflow_and_back(tmp_path):
    arrays = {"w": _sample("float32", (4, 3)), "b": _sample("bfloat16", (5,)), "f8": _sample("float8_e4m3fn", (2,)),
              "n": _sample("int64", ())}
    tl.save(tmp_path / "np.tl", arrays, metadata={"from": "numpy"})
    loaded = ttf.load(tmp_path / "np.tl", verify=True)
    assert list(loaded) == list(arrays) and all(_tensor_bits(loaded[k]) == _bits(v) for k, v in arrays.items())
    ttf.save(tmp_path / "tf.tl", loaded, metadata={"from": "tensorflow"})
    with tl.open(tmp_path / "tf.tl") as r:
        assert r.metadata == {"from": "tensorflow"}
        assert all(_bits(r[k]) == _bits(v) for k, v in arrays.items())


def test_unaligned_files_load_right(tmp_path):
    arrays = {"a": _sample("uint8", (3,)), "w": _sample("float64", (5,)), "b": _sample("bfloat16", (7,))}
    tl.save(tmp_path / "u.tl", arrays, alignment=8)
    loaded = ttf.load(tmp_path / "u.tl")
    assert all(_tensor_bits(loaded[k]) == _bits(v) for k, v in arrays.items())
    assert float(tf.reduce_sum(tf.cast(loaded["w"], tf.float64))) == pytest.approx(arrays["w"].sum())


def test_verify_catches_a_flipped_byte(tmp_path):
    ttf.save(tmp_path / "c.tl", {"w": tf.ones((64,))})
    data = _data_file(tmp_path, "c.tl")
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(raw)
    with pytest.raises(tl.ChecksumError, match=r"'w'"):
        ttf.load(tmp_path / "c.tl", verify=True)


def test_bad_mmap_value_is_refused(tmp_path):
    ttf.save(tmp_path / "m.tl", {"w": tf.ones(1)})
    with pytest.raises(ValueError, match=r"mmap"):
        ttf.load(tmp_path / "m.tl", mmap="yes")


def test_safetensors_converted_file_loads(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy", reason="the conversion case needs safetensors")
    from tensorlist.convert import convert

    st_numpy.save_file({"w": np.arange(6, dtype=np.float16).reshape(2, 3)}, str(tmp_path / "m.safetensors"))
    convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tl"))
    w = ttf.load(tmp_path / "m.tl")["w"]
    assert w.dtype == tf.float16 and w.numpy().tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.slow
def test_imports_stay_apart():
    """``tensorlist.tensorflow`` imports no framework TensorFlow does not (a fresh interpreter: seconds).

    TensorFlow 2.21 itself imports jax when it is installed, so the child compares with ``import tensorflow``.
    """
    import json
    import subprocess

    code = ("import json, sys\n"
            "def fw(): return sorted(m for m in ('mlx', 'tensorflow', 'torch', 'jax') if m in sys.modules)\n"
            "import tensorlist; bare = fw()\n"
            "import tensorflow; base = fw()\n"
            "import tensorlist.tensorflow; print(json.dumps([bare, base, fw()]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    bare, base, after = json.loads(out.stdout.strip().splitlines()[-1])
    assert bare == [] and "tensorflow" in base and after == base
