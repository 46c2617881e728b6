"""safetensors' own torch, TensorFlow and Flax scenarios, run against safetensors and tensorlist.

Ported from safetensors' ``bindings/python/tests/test_pt_comparison.py``, ``test_tf_comparison.py`` and
``test_flax_comparison.py`` (Apache License 2.0, Copyright The HuggingFace team): odd dtypes (bfloat16, bool,
complex, every float8, FP4), zero-sized tensors, views of one storage, meta and sparse tensors, values that are not
tensors, non-contiguous and shared tensors, slices, metadata, and loads against ``torch.load`` and Flax's msgpack;
each once with ``safetensors.torch``/``.tensorflow``/``.flax`` (stock) and once with tensorlist (``tensorlist.save``
and ``tensorlist.torch.load_state``, ``tensorlist.tensorflow``, ``tensorlist.jax``). Where the two differ on purpose
the test says so (`DIFFERS`) and checks tensorlist's own behaviour. The byte-exact header scenarios test
safetensors' layout, and the device scenarios need accelerators.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="the torch scenarios need torch")
st_torch = pytest.importorskip("safetensors.torch", reason="the stock side needs safetensors")

import safetensors  # noqa: E402

import tensorlist  # noqa: E402
import tensorlist.torch as tlt  # noqa: E402


class Stock:
    name = "stock"
    suffix = ".safetensors"

    @staticmethod
    def save(tensors, path, metadata=None):
        st_torch.save_file(tensors, str(path), metadata=metadata)

    @staticmethod
    def load(path):
        return st_torch.load_file(str(path))

    @staticmethod
    def metadata(path):
        with safetensors.safe_open(str(path), framework="pt") as f:
            return f.metadata()

    @staticmethod
    def slice(path, name, index):
        with safetensors.safe_open(str(path), framework="pt") as f:
            return f.get_slice(name)[index]


class Ours:
    name = "tensorlist"
    suffix = ".tl"

    @staticmethod
    def save(tensors, path, metadata=None):
        tensorlist.save(path, tensors, metadata=metadata)

    @staticmethod
    def load(path):
        return tlt.load_state(path)

    @staticmethod
    def metadata(path):
        with tensorlist.open(path) as r:
            return r.descriptor.metadata

    @staticmethod
    def slice(path, name, index):
        with tensorlist.open(path) as r:  # a mapped view: only the slice's pages are read
            return torch.from_numpy(np.array(r[name][index]))


@pytest.fixture(params=[Stock, Ours], ids=["stock", "tensorlist"])
def impl(request):
    return request.param


def test_odd_dtype(impl, tmp_path):
    data = {"test": torch.randn((2, 2), dtype=torch.bfloat16), "test2": torch.randn((2, 2), dtype=torch.float16),
            "test3": torch.zeros((2, 2), dtype=torch.bool), "test4": torch.zeros((2, 2), dtype=torch.complex64)}
    data["test3"][0, 0] = True
    impl.save(data, tmp_path / ("m" + impl.suffix))
    reloaded = impl.load(tmp_path / ("m" + impl.suffix))
    for k in data:
        assert reloaded[k].dtype == data[k].dtype and torch.equal(data[k], reloaded[k])


@pytest.mark.parametrize("name,value", [("float8_e4m3fn", -0.5), ("float8_e5m2", -0.5), ("float8_e8m0fnu", 0.5),
                                        ("float8_e4m3fnuz", 0.5), ("float8_e5m2fnuz", 0.5)])
def test_odd_dtype_fp8(impl, tmp_path, name, value):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"this torch has no {name}")
    if impl is Stock and dtype not in getattr(st_torch, "_SIZE", {}):
        pytest.skip(f"safetensors {safetensors.__version__} has no {name}")
    impl.save({"test": torch.tensor([value], dtype=dtype)}, tmp_path / ("m" + impl.suffix))
    reloaded = impl.load(tmp_path / ("m" + impl.suffix))
    assert reloaded["test"].dtype == dtype and reloaded["test"].item() == value


def test_odd_dtype_fp4(impl, tmp_path):
    if not hasattr(torch, "float4_e2m1fn_x2"):
        pytest.skip("this torch has no float4_e2m1fn_x2 (2.8 and later)")
    test1 = torch.tensor([0.0], dtype=torch.float8_e8m0fnu)
    test2 = torch.arange(4, dtype=torch.uint8).reshape(2, 2).view(torch.float4_e2m1fn_x2)
    impl.save({"test1": test1, "test2": test2}, tmp_path / ("m" + impl.suffix))
    reloaded = impl.load(tmp_path / ("m" + impl.suffix))
    assert reloaded["test1"].dtype == torch.float8_e8m0fnu and reloaded["test1"] == test1
    assert reloaded["test2"].dtype == torch.float4_e2m1fn_x2 and reloaded["test2"].shape == (2, 2)
    assert torch.equal(reloaded["test2"].view(torch.uint8), test2.view(torch.uint8))  # torch has no eq for FP4


def test_zero_sized(impl, tmp_path):
    data = {"test": torch.zeros((2, 0), dtype=torch.float), "test2": torch.zeros((2, 0), dtype=torch.float)}
    impl.save(data, tmp_path / ("m" + impl.suffix))
    reloaded = impl.load(tmp_path / ("m" + impl.suffix))
    assert torch.equal(data["test"], reloaded["test"]) and torch.equal(data["test2"], reloaded["test2"])


def test_disjoint_tensors_shared_storage(impl, tmp_path):
    a = torch.arange(100, dtype=torch.float32).reshape(10, 10)
    impl.save({"test": a[1:], "test2": a[:1]}, tmp_path / ("m" + impl.suffix))
    reloaded = impl.load(tmp_path / ("m" + impl.suffix))
    assert torch.equal(reloaded["test"], a[1:]) and torch.equal(reloaded["test2"], a[:1])


def test_meta_tensor(impl, tmp_path):
    data = {"test": torch.zeros((10, 10), device=torch.device("meta"))}
    with pytest.raises((RuntimeError, TypeError, ValueError)) as err:
        impl.save(data, tmp_path / ("m" + impl.suffix))
    if impl is Stock:
        assert "Cannot copy out of meta tensor" in str(err.value)
    else:  # DIFFERS: tensorlist's message names the tensor and says why
        assert "'test'" in str(err.value) and "meta" in str(err.value)
    assert not (tmp_path / ("m" + impl.suffix)).exists()


def test_sparse(impl, tmp_path):
    data = {"test": torch.sparse_coo_tensor(size=(2, 3))}
    with pytest.raises((TypeError, ValueError)) as err:
        impl.save(data, tmp_path / ("m" + impl.suffix))
    assert "test" in str(err.value) and "sparse" in str(err.value)
    assert not (tmp_path / ("m" + impl.suffix)).exists()


def test_bogus(impl, tmp_path):
    with pytest.raises((TypeError, ValueError)) as err:
        impl.save({"test": {"some": "thing"}}, tmp_path / ("m" + impl.suffix))
    assert "test" in str(err.value) and "dict" in str(err.value)
    with pytest.raises((TypeError, ValueError)) as err:
        impl.save("notadict", tmp_path / ("m" + impl.suffix))
    assert "str" in str(err.value)
    assert not (tmp_path / ("m" + impl.suffix)).exists()


def test_non_contiguous_tensor(impl, tmp_path):
    x = torch.arange(6, dtype=torch.float32).reshape((1, 2, 3))[:, :, 1]
    assert not x.is_contiguous()
    if impl is Stock:
        with pytest.raises(ValueError):
            impl.save({"test": x}, tmp_path / "out.safetensors")
    else:  # DIFFERS: tensorlist writes a strided tensor's values (made contiguous once, by the writer)
        impl.save({"test": x}, tmp_path / "out.tl")
        assert torch.equal(impl.load(tmp_path / "out.tl")["test"], x)


@pytest.mark.parametrize("rows", [slice(None, 1), slice(1, None)])
def test_shared_tensors(impl, tmp_path, rows):
    a = torch.arange(6, dtype=torch.float32).reshape((2, 3))
    data = {"A": a, "B": a[rows]}
    if impl is Stock:
        with pytest.raises(RuntimeError):
            impl.save(data, tmp_path / "out.safetensors")
    else:  # DIFFERS: each name gets its own bytes; both read back equal, and they no longer share memory
        impl.save(data, tmp_path / "out.tl")
        back = impl.load(tmp_path / "out.tl")
        assert torch.equal(back["A"], a) and torch.equal(back["B"], a[rows])


def test_deserialization_slice(impl, tmp_path):
    tensor = torch.arange(6, dtype=torch.float32).reshape((1, 2, 3))
    impl.save({"test": tensor}, tmp_path / ("m" + impl.suffix))
    got = impl.slice(tmp_path / ("m" + impl.suffix), "test", (slice(None), slice(None), slice(1, 2)))
    assert torch.equal(got, torch.Tensor([[[1.0], [4.0]]])) and torch.equal(got, tensor[:, :, 1:2])
    assert got.numpy().astype("<f4").tobytes() == b"\x00\x00\x80?\x00\x00\x80@"


def test_deserialization_metadata(impl, tmp_path):
    tensor = torch.arange(6, dtype=torch.float32).reshape((1, 2, 3))
    impl.save({"test": tensor}, tmp_path / ("a" + impl.suffix))
    assert impl.metadata(tmp_path / ("a" + impl.suffix)) is None
    impl.save({"test": tensor}, tmp_path / ("b" + impl.suffix), metadata={"Something": "more"})
    assert impl.metadata(tmp_path / ("b" + impl.suffix)) == {"Something": "more"}


def test_deserialization_safe_against_torch_load(impl, tmp_path):
    data = {f"test{i}": torch.randn((256, 256)) for i in range(3)}
    torch.save(data, tmp_path / "pt_load.pt")
    impl.save(data, tmp_path / ("m" + impl.suffix))
    tweights = torch.load(tmp_path / "pt_load.pt")
    for k, v in impl.load(tmp_path / ("m" + impl.suffix)).items():
        assert torch.equal(v, tweights[k]) and v.device == torch.device("cpu")


class TestTensorFlow:
    """``test_tf_comparison.py``: zero-sized tensors, bfloat16, and loads against the saved values."""

    @pytest.fixture(params=["stock", "tensorlist"])
    def tf_impl(self, request):
        tf = pytest.importorskip("tensorflow", reason="the TensorFlow scenarios need tensorflow")
        if request.param == "stock":
            st_tf = pytest.importorskip("safetensors.tensorflow")
            # save_file turns the dict's values into numpy arrays in place: it gets a copy, as in the original
            return tf, (lambda d, p: st_tf.save_file(dict(d), str(p) + ".safetensors"),
                        lambda p: st_tf.load_file(str(p) + ".safetensors"))
        import tensorlist.tensorflow as tltf
        return tf, (lambda d, p: tltf.save(str(p) + ".tl", d), lambda p: tltf.load(str(p) + ".tl"))

    def test_zero_sized(self, tf_impl, tmp_path):
        tf, (save, load) = tf_impl
        data = {"test": tf.zeros((2, 0), dtype=tf.float32)}
        save(data, tmp_path / "m")
        assert load(tmp_path / "m")["test"].shape == data["test"].shape

    def test_deserialization_safe(self, tf_impl, tmp_path):
        tf, (save, load) = tf_impl
        data = {"test": tf.random.normal((256, 256)), "test4": tf.complex(tf.ones((16, 16)), tf.zeros((16, 16)))}
        save(data, tmp_path / "m")
        for k, v in load(tmp_path / "m").items():
            assert v.dtype == data[k].dtype and np.array_equal(np.asarray(v), data[k].numpy())

    def test_bfloat16(self, tf_impl, tmp_path):
        tf, (save, load) = tf_impl
        data = {"test": tf.random.normal((64, 64), dtype=tf.bfloat16)}
        save(data, tmp_path / "m")
        back = load(tmp_path / "m")["test"]
        assert back.dtype == tf.bfloat16
        assert np.array_equal(tf.bitcast(back, tf.uint16).numpy(), tf.bitcast(data["test"], tf.uint16).numpy())


class TestFlax:
    """``test_flax_comparison.py``: zero-sized arrays, and loads against Flax's own msgpack serialization."""

    @pytest.fixture(params=["stock", "tensorlist"])
    def jax_impl(self, request):
        jnp = pytest.importorskip("jax.numpy", reason="the Flax scenarios need jax")
        serialization = pytest.importorskip("flax.serialization", reason="the Flax scenarios need flax")
        if request.param == "stock":
            st_flax = pytest.importorskip("safetensors.flax")
            return jnp, serialization, (lambda d, p: st_flax.save_file(dict(d), str(p) + ".safetensors"),
                                        lambda p: st_flax.load_file(str(p) + ".safetensors"))
        import tensorlist.jax as tlj
        return jnp, serialization, (lambda d, p: tlj.save(str(p) + ".tl", d), lambda p: tlj.load(str(p) + ".tl"))

    def test_zero_sized(self, jax_impl, tmp_path):
        jnp, _, (save, load) = jax_impl
        data = {"test": jnp.zeros((2, 0), dtype=jnp.float32)}
        save(data, tmp_path / "m")
        assert load(tmp_path / "m")["test"].shape == data["test"].shape

    def test_deserialization_safe(self, jax_impl, tmp_path):
        jnp, serialization, (save, load) = jax_impl
        import jax
        key = jax.random.key(0)
        data = {"test": jax.random.normal(key, (256, 256), dtype=jnp.float32),
                "test2": jax.random.normal(key, (256, 256), dtype=jnp.float16),
                "test3": jax.random.normal(key, (256, 256), dtype=jnp.bfloat16),
                "test4": jax.random.normal(key, (256, 256), dtype=jnp.complex64)}
        (tmp_path / "flax.msgpack").write_bytes(serialization.msgpack_serialize(data))
        save(data, tmp_path / "m")
        flax_weights = serialization.msgpack_restore((tmp_path / "flax.msgpack").read_bytes())
        for k, v in load(tmp_path / "m").items():
            assert v.dtype == flax_weights[k].dtype and bool(jnp.array_equal(v, flax_weights[k]))
