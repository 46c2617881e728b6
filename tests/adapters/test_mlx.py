"""What the MLX adapter alone does: float8_e4m3fn as MLX's uint8 bytes, MLX-made bfloat16, 32-bit shapes,
the bridge's refusals and its zero-copy save.

What every adapter promises (round trips of every dtype, refusals on load,
strided inputs, metadata, broken files...) is tests/adapters/test_contract.py's.
"""
import json

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the MLX adapter needs mlx (pip install 'mlx[cpu]' off macOS)")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and float8 arrays need ml_dtypes")

from _framework_support import bits as _bits, sample as _sample  # noqa: E402
import tensorlist as tl  # noqa: E402
import tensorlist.mlx as tm  # noqa: E402
from tensorlist._base import dtypes  # noqa: E402
from tensorlist._bridges.mlx import refusal  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402

REFUSED = sorted(d.name for d in dtypes.DTYPES if refusal(d.name) is not None)  # the contract pins this set


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


def test_bfloat16_from_mlx_keeps_its_bits(tmp_path):
    x = mx.array([1.5, -2.0, 3.0e38, float("inf")], dtype=mx.bfloat16)
    tm.save(tmp_path / "b.tl", {"b": x})
    a = tl.load(tmp_path / "b.tl")["b"]
    assert a.dtype == np.dtype(ml_dtypes.bfloat16)
    assert _bits(a) == _bits(np.array(x.view(mx.uint16), copy=False))
    assert mx.array_equal(tm.load(tmp_path / "b.tl")["b"], x).item()


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


@pytest.mark.parametrize("name", REFUSED)
def test_from_numpy_refuses_before_mlx_raises_bad_cast(name):
    with pytest.raises(TypeError, match=rf"tensor 'w': MLX has no {name} type"):
        tm.from_numpy(_sample(name, (2,)), "tensor 'w'")


def test_save_is_zero_copy_and_load_copies():
    x = mx.arange(8, dtype=mx.float32)
    mx.eval(x)
    assert tm.to_numpy(x).ctypes.data == tm.to_numpy(x).ctypes.data == np.array(x, copy=False).ctypes.data
    b = mx.arange(8).astype(mx.bfloat16)
    assert tm.to_numpy(b).ctypes.data == np.array(b.view(mx.uint16), copy=False).ctypes.data
    a = np.arange(8, dtype=np.float32)
    assert np.array(tm.from_numpy(a), copy=False).ctypes.data != a.ctypes.data  # mx.array copies
