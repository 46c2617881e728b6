"""MLX arrays go in and come out bit-exact (bfloat16 included); what MLX cannot hold is refused by name."""
import json

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

mx = pytest.importorskip("mlx.core", reason="the MLX adapter needs mlx (pip install 'mlx[cpu]' off macOS)")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and float8 arrays need ml_dtypes")

from _framework_support import bits as _bits, sample as _sample  # noqa: E402
import tensorlist as tl  # noqa: E402
import tensorlist.mlx as tm  # noqa: E402
from tensorlist._base import dtypes
from tensorlist._bridges.mlx import AS_BYTES, HELD  # noqa: E402
from tensorlist.errors import FormatError, UnsupportedDTypeError  # noqa: E402

REFUSED = {"complex128", "float8_e5m2", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
           "float4_e2m1fn_x2"}


def test_every_table_dtype_is_held_or_refused():
    assert set(HELD) | set(AS_BYTES) | REFUSED == {d.name for d in dtypes.DTYPES}
    assert not (set(HELD) | set(AS_BYTES)) & REFUSED and not set(HELD) & set(AS_BYTES)


@pytest.mark.parametrize("mmap", [True, False])
def test_float8_e4m3fn_loads_as_mlx_s_uint8_bytes_for_from_fp8(tmp_path, mmap):
    # MLX's own convention (mx.load of a safetensors F8_E4M3 tensor, mx.from_fp8): the bytes as uint8
    a = np.array([0, 448, -448, -0.875, 1.25, -1.5], dtype=ml_dtypes.float8_e4m3fn).reshape(2, 3)
    tl.save(tmp_path / "f8.tl", {"w": a})
    x = tm.load(tmp_path / "f8.tl", mmap=mmap)["w"]
    assert x.dtype == mx.uint8 and tuple(x.shape) == (2, 3)
    assert _bits(np.array(x)) == _bits(a)
    np.testing.assert_array_equal(np.array(mx.from_fp8(x, dtype=mx.float32)), a.astype(np.float32))
    assert tm.mlx_dtype("float8_e4m3fn") == mx.uint8


@pytest.mark.parametrize("name", sorted(HELD))
@pytest.mark.parametrize("shape", [(), (0,), (3, 5), (2, 0, 4)])
def test_every_held_dtype_round_trips_bit_exact(tmp_path, name, shape):
    a = _sample(name, shape)
    x = tm.from_numpy(a)
    assert x.dtype == HELD[name] and tuple(x.shape) == shape
    tm.save(tmp_path / "m.tl", {"x": x})
    on_disk = tl.load(tmp_path / "m.tl")["x"]
    assert dtypes.from_numpy(on_disk.dtype).name == name and _bits(on_disk) == _bits(a)
    back = tm.load(tmp_path / "m.tl")["x"]
    assert back.dtype == HELD[name] and tuple(back.shape) == shape
    assert _bits(tm.to_numpy(back)) == _bits(a)


def test_float64_stays_float64():
    # mx.array(a) of a float64 array silently makes float32: the bridge asks for float64 by name
    a = np.array([1 + 2.0 ** -40, -3.5])
    x = tm.from_numpy(a)
    assert x.dtype == mx.float64 and _bits(tm.to_numpy(x)) == _bits(a)


def test_bfloat16_from_mlx_keeps_its_bits(tmp_path):
    x = mx.array([1.5, -2.0, 3.0e38, float("inf")], dtype=mx.bfloat16)
    tm.save(tmp_path / "b.tl", {"b": x})
    a = tl.load(tmp_path / "b.tl")["b"]
    assert a.dtype == np.dtype(ml_dtypes.bfloat16)
    assert _bits(a) == _bits(np.array(x.view(mx.uint16), copy=False))
    assert mx.array_equal(tm.load(tmp_path / "b.tl")["b"], x).item()


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(sorted(HELD)), shape=st.lists(st.integers(0, 4), max_size=3), seed=st.integers(0, 99))
def test_hypothesis_round_trip(tmp_path_factory, name, shape, seed):
    path = tmp_path_factory.mktemp("h") / "m.tl"
    a = _sample(name, tuple(shape), seed)
    tm.save(path, {"a": tm.from_numpy(a)})
    assert _bits(tm.to_numpy(tm.load(path)["a"])) == _bits(a)


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_load_refuses_what_mlx_cannot_hold_naming_file_tensor_and_dtype(tmp_path, name):
    path = tmp_path / "r.tl"
    tl.save(path, {"fine": np.ones(2, np.float32), "bad.w": _sample(name, (3,))})
    with pytest.raises(UnsupportedDTypeError, match=rf"r\.tl: tensor 1 \('bad\.w'\) has dtype {name}: MLX has no"
                                                    ) as e:
        tm.load(path)
    assert e.value.dtype == name


@pytest.mark.parametrize("dims", [[0, 2 ** 31], [2 ** 31, 0], [0, 2 ** 40, 3]])
def test_load_refuses_a_dimension_past_mlx_s_32_bit_shapes_naming_file_tensor_and_field(tmp_path, dims):
    # an empty tensor may have any dimension in the format; MLX's shapes are 32-bit (a bare OverflowError)
    path = tmp_path / "e.tl"
    tl.save(path, {"fine": np.ones(2, np.float32), "empty": np.zeros((0, 1), np.float32)})
    doc = json.loads(path.read_text())
    doc["tensors"][1]["dims"] = dims
    path.write_text(json.dumps(doc))
    assert tl.load(path)["empty"].shape == tuple(dims)  # valid for the format, and for numpy
    with pytest.raises(FormatError, match=rf"e\.tl: tensor 1 \('empty'\): field 'dims': dims \{dims}: MLX holds "
                                          r"dimensions up to 2147483647 only") as e:
        tm.load(path)
    assert (e.value.file, e.value.tensor_name, e.value.field) == (str(path), "empty", "dims")


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_from_numpy_refuses_before_mlx_raises_bad_cast(name):
    with pytest.raises(TypeError, match=rf"tensor 'w': MLX has no {name} type"):
        tm.from_numpy(_sample(name, (2,)), "tensor 'w'")


def test_save_refuses_what_is_not_an_mlx_array(tmp_path):
    with pytest.raises(TypeError, match=r"tensor 'w': expected an mlx.core.array, got ndarray"):
        tm.save(tmp_path / "x.tl", {"ok": mx.zeros(1), "w": np.zeros(1)})
    assert not (tmp_path / "x.tl").exists()


def test_save_is_zero_copy_and_load_copies():
    x = mx.arange(8, dtype=mx.float32)
    mx.eval(x)
    assert tm.to_numpy(x).ctypes.data == tm.to_numpy(x).ctypes.data == np.array(x, copy=False).ctypes.data
    b = mx.arange(8).astype(mx.bfloat16)
    assert tm.to_numpy(b).ctypes.data == np.array(b.view(mx.uint16), copy=False).ctypes.data
    a = np.arange(8, dtype=np.float32)
    assert np.array(tm.from_numpy(a), copy=False).ctypes.data != a.ctypes.data  # mx.array copies


def test_lazy_and_strided_arrays_save_their_values(tmp_path):
    x = (mx.arange(12).reshape(3, 4) * 2).T  # lazy, and a transposed view
    tm.save(tmp_path / "s.tl", {"x": x})
    assert np.array_equal(tl.load(tmp_path / "s.tl")["x"], np.arange(12).reshape(3, 4).T * 2)


@pytest.mark.parametrize("mmap", [True, False])
def test_numpy_files_load_in_mlx_and_mlx_files_in_numpy(tmp_path, mmap):
    arrays = {"w": _sample("float32", (4, 3)), "b": _sample("bfloat16", (5,)), "n": _sample("int64", ())}
    tl.save(tmp_path / "np.tl", arrays, metadata={"from": "numpy"})
    loaded = tm.load(tmp_path / "np.tl", mmap=mmap, verify=True)
    assert list(loaded) == ["w", "b", "n"]
    assert all(_bits(tm.to_numpy(loaded[k])) == _bits(v) for k, v in arrays.items())
    tm.save(tmp_path / "mx.tl", loaded, metadata={"from": "mlx"})
    with tl.open(tmp_path / "mx.tl") as r:
        assert r.metadata == {"from": "mlx"}
        assert all(_bits(r[k]) == _bits(v) for k, v in arrays.items())


def test_verify_catches_a_flipped_byte(tmp_path):
    tm.save(tmp_path / "c.tl", {"w": mx.ones((64,))})
    data = next(p for p in tmp_path.iterdir() if p.name != "c.tl")
    raw = bytearray(data.read_bytes())
    raw[0] ^= 1
    data.write_bytes(raw)
    with pytest.raises(tl.ChecksumError, match=r"'w'"):
        tm.load(tmp_path / "c.tl", verify=True)


def test_embedded_list_by_pointer(tmp_path):
    tl.save_document(tmp_path / "doc.json", {"model": tl.Tensors({"w": np.arange(3, dtype=np.int32)})})
    assert tm.load(tmp_path / "doc.json", pointer="/model")["w"].tolist() == [0, 1, 2]


def test_safetensors_converted_file_loads(tmp_path):
    st_numpy = pytest.importorskip("safetensors.numpy", reason="the conversion case needs safetensors")
    from tensorlist.convert import convert

    st_numpy.save_file({"w": np.arange(6, dtype=np.float16).reshape(2, 3)}, str(tmp_path / "m.safetensors"))
    convert(str(tmp_path / "m.safetensors"), str(tmp_path / "m.tl"))
    w = tm.load(tmp_path / "m.tl")["w"]
    assert w.dtype == mx.float16 and w.tolist() == [[0, 1, 2], [3, 4, 5]]


@pytest.mark.slow
def test_imports_stay_apart():
    """``import tensorlist`` imports no framework; ``tensorlist.mlx`` imports MLX alone (a fresh interpreter)."""
    import json
    import subprocess
    import sys

    code = ("import json, sys, tensorlist; before = sorted(m for m in ('mlx', 'tensorflow', 'torch', 'jax') "
            "if m in sys.modules); import tensorlist.mlx; after = sorted(m for m in ('mlx', 'tensorflow', "
            "'torch', 'jax') if m in sys.modules); print(json.dumps([before, after]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [[], ["mlx"]]
