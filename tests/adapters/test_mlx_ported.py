"""MLX's own save/load scenarios, run against MLX's safetensors functions and tensorlist.mlx.

Ported from MLX's ``python/tests/test_load.py`` (MIT License, Copyright © 2023 Apple Inc.): the safetensors,
non-contiguous, empty-array and float8 scenarios, each once with ``mx.save_safetensors``/``mx.load`` (stock) and
once with ``tensorlist.mlx.save``/``load``. Where the two differ on purpose the test says so (`DIFFERS`) and checks
tensorlist's own behaviour. The ``.npy``, ``.npz`` and GGUF scenarios test formats tensorlist does not write.
"""
import os
from pathlib import Path

import numpy as np
import pytest

mx = pytest.importorskip("mlx.core", reason="the MLX adapter needs mlx (pip install 'tensorlist[mlx]')")

import tensorlist  # noqa: E402
import tensorlist.mlx as tm  # noqa: E402

DTYPES = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float32", "float16",
          "complex64", "bfloat16"]
SHAPES = [(1,), (23,), (1024, 1024), (4, 6, 3, 1, 2)]


class Stock:
    name = "stock"
    suffix = ".safetensors"

    @staticmethod
    def save(path, tensors, metadata=None):
        if metadata is None:
            mx.save_safetensors(path, tensors)
        else:
            mx.save_safetensors(path, tensors, metadata)

    @staticmethod
    def load(path, return_metadata=False):
        return mx.load(path, return_metadata=return_metadata)


class Ours:
    name = "tensorlist"
    suffix = ".tl"

    @staticmethod
    def save(path, tensors, metadata=None):
        tm.save(path, tensors, metadata=metadata)

    @staticmethod
    def load(path, return_metadata=False):
        loaded = tm.load(path)
        if not return_metadata:
            return loaded
        with tensorlist.open(path) as r:
            return loaded, r.descriptor.metadata


@pytest.fixture(params=[Stock, Ours], ids=["stock", "tensorlist"])
def impl(request):
    return request.param


def test_metadata_round_trips_with_str_and_path(impl, tmp_path):
    for obj in (str, Path):
        path = obj(tmp_path / ("test" + impl.suffix))
        impl.save(path, {"test": mx.ones((2, 2))}, {"testing": "test", "format": "mlx"})
        res = impl.load(path, return_metadata=True)
        assert len(res) == 2
        assert res[1] == {"testing": "test", "format": "mlx"}


def test_metadata_that_is_not_strings(impl, tmp_path):
    path = tmp_path / ("test" + impl.suffix)
    if impl is Stock:
        with pytest.raises(Exception):
            impl.save(str(path), {"a": mx.ones((4, 4))}, {"testing": 0})
    else:  # DIFFERS: tensorlist's metadata is any JSON value, and comes back as it was
        impl.save(path, {"a": mx.ones((4, 4))}, {"testing": 0})
        assert impl.load(path, return_metadata=True)[1] == {"testing": 0}


@pytest.mark.parametrize("dt", DTYPES)
def test_save_and_load_every_dtype_and_shape(impl, tmp_path, dt):
    for i, shape in enumerate(SHAPES):
        dtype = getattr(mx, dt)
        value = mx.random.normal(shape=shape, dtype=dtype) if dt in ("float32", "float16", "bfloat16") \
            else mx.ones(shape, dtype=dtype)
        path = str(tmp_path / f"mlx_{dt}_{i}{impl.suffix}")
        impl.save(path, {"test": value})
        loaded = impl.load(path)
        assert "test" in loaded
        assert loaded["test"].dtype == dtype
        assert mx.array_equal(loaded["test"], value)


def test_non_contiguous(impl, tmp_path):
    path = str(tmp_path / ("a" + impl.suffix))
    a = mx.broadcast_to(mx.array([1, 2]), [4, 2])
    impl.save(path, {"a": a})
    assert mx.array_equal(a, impl.load(path)["a"])
    a = mx.arange(4).reshape(2, 2).T  # column-major: saved row-major, read back equal
    impl.save(path, {"a": a})
    assert mx.array_equal(a, impl.load(path)["a"])


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4)])
def test_save_and_load_empty(impl, tmp_path, shape):
    path = str(tmp_path / ("empty" + impl.suffix))
    impl.save(path, {"x": mx.zeros(shape)})
    assert impl.load(path)["x"].shape == shape


def test_an_empty_array_beside_a_normal_one(impl, tmp_path):
    path = str(tmp_path / ("mixed" + impl.suffix))
    impl.save(path, {"x": mx.zeros((0, 3)), "y": mx.ones((2, 2))})
    loaded = impl.load(path)
    assert loaded["x"].shape == (0, 3)
    assert mx.array_equal(loaded["y"], mx.ones((2, 2)))


#: MLX's float8 scenario: ten float8_e4m3fn bytes and the values they hold.
F8_BYTES = b"\x00~\xfe\xb6.\x83\xba\xba\xbc\x82"
F8_VALUES = [0, 448, -448, -0.875, 0.4375, -0.005859, -1.25, -1.25, -1.5, -0.0039]


def test_load_f8_e4m3(impl, tmp_path):
    """MLX has no float8 type: its loader hands the bytes over as uint8, for ``mx.from_fp8``."""
    if impl is Stock:
        header = b'{"tensor":{"dtype":"F8_E4M3","shape":[10],"data_offsets":[0,10]}}       '
        path = tmp_path / "f8.safetensors"
        path.write_bytes(len(header).to_bytes(8, "little") + header + F8_BYTES)
    else:
        path = tmp_path / "f8.tl"
        carrier = np.frombuffer(F8_BYTES, np.dtype(np.uint8, metadata={"tensorlist.dtype": "float8_e4m3fn"}))
        tensorlist.save(path, {"tensor": carrier})
    out = impl.load(str(path))["tensor"]
    assert out.dtype == mx.uint8
    assert mx.allclose(mx.from_fp8(out), mx.array(F8_VALUES, dtype=mx.bfloat16))
