"""Orbax's own StandardCheckpointHandler scenarios, run against the stock handler and tensorlist's.

Ported from orbax-checkpoint's ``checkpoint/orbax/checkpoint/_src/handlers/standard_checkpoint_handler_test.py``
(Apache License 2.0, Copyright The Orbax Authors): the same trees (``test_utils.setup_pytree`` and
``setup_sharded_pytree``: numpy leaves, Python scalars and arrays sharded over 0-, 1- and 2-d meshes), the same
calls and the same checks, once with ``StandardCheckpointHandler`` (``StandardSave``/``StandardRestore``) and once
with ``TensorListCheckpointHandler`` (``TensorListSave``/``TensorListRestore``). Where the two differ on purpose
the test says so by name (`DIFFERS`), and checks tensorlist's own behaviour instead. Scenarios of the original that
test Orbax internals (OCDBT layout, TensorStore drivers, custom memory layouts, restore-args construction) are
left out.
"""
import functools
from typing import Any

import numpy as np
import pytest

pytest.importorskip("jax", reason="the Orbax adapter needs jax (pip install 'tensorlist[jax]')")
ocp = pytest.importorskip("orbax.checkpoint",
                          reason="the Orbax adapter needs orbax-checkpoint (pip install orbax-checkpoint)")
flax = pytest.importorskip("flax", reason="the Flax scenarios need flax")
optax = pytest.importorskip("optax", reason="the masked-tree scenario needs optax")

import flax.struct  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from absl.testing import absltest  # noqa: E402 (orbax depends on absl)
from etils import epath  # noqa: E402
from orbax.checkpoint import test_utils  # noqa: E402

from tensorlist.orbax import TensorListCheckpointHandler, TensorListRestore, TensorListSave  # noqa: E402

if len(jax.devices()) < 2 or len(jax.devices()) % 2:
    pytest.skip("Orbax's sharded trees need an even number ≥ 2 of devices: tests/conftest.py sets "
                "XLA_FLAGS=--xla_force_host_platform_device_count=4", allow_module_level=True)


class Impl:
    """One handler with its argument classes."""

    def __init__(self, name, handler, save, restore):
        self.name, self.handler, self.save_cls, self.restore_cls = name, handler, save, restore

    def save(self, directory, item, **kwargs):
        """As the original's handler subclass: into an existing directory, then ``finalize``."""
        directory = epath.Path(directory)
        directory.mkdir(exist_ok=True)
        self.handler.save(directory, args=self.save_cls(item, **kwargs))
        self.handler.finalize(directory)

    def restore(self, directory, item=None):
        if item is None:
            return self.handler.restore(directory)
        return self.handler.restore(directory, args=self.restore_cls(item))


def stock():
    handler = ocp.StandardCheckpointHandler()
    return Impl("stock", handler, ocp.args.StandardSave, ocp.args.StandardRestore)


def ours():
    return Impl("tensorlist", TensorListCheckpointHandler(), TensorListSave, TensorListRestore)


@pytest.fixture(params=[stock, ours], ids=["stock", "tensorlist"])
def impl(request):
    made = request.param()
    yield made
    made.handler.close()


@pytest.fixture
def trees():
    """The original's ``setUp``: a numpy tree with Python scalars, its sharded twin and zeros of that."""
    numpy_pytree = test_utils.setup_pytree()
    pytree, _, _ = test_utils.setup_sharded_pytree(numpy_pytree)
    zeros = jax.tree.map(np.zeros_like, numpy_pytree, is_leaf=test_utils.is_leaf)
    zeros_pytree, _, _ = test_utils.setup_sharded_pytree(zeros)
    numpy_pytree.update({"x": 4.5, "y": 3})
    return {"numpy": numpy_pytree, "sharded": pytree, "zeros": zeros_pytree,
            "mixed": {"sharded": pytree, "numpy": numpy_pytree}}


#: ``test_utils.assert_tree_equal`` asserts through an absl TestCase's methods.
CASE = absltest.TestCase()


def assert_tree_equal(expected, actual):
    test_utils.assert_tree_equal(CASE, expected, actual)


def assert_values_on_default_device(expected, actual):
    """tensorlist's restore without a sharding to go by: the same values (and key impls), each on one device."""
    def _eq(x, y):
        if x is None:
            return
        if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
            assert jax.random.key_impl(x) == jax.random.key_impl(y)
            x, y = jax.random.key_data(x), jax.random.key_data(y)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
        assert y.devices() == {jax.devices()[0]}
    jax.tree.map(_eq, expected, actual, is_leaf=lambda x: x is None)


#: Why tensorlist's leaves may land elsewhere than Orbax's: the file records shapes and dtypes, not the saving
#: program's meshes; a leaf with no sharding in the target goes to jax's default device.
NO_SAVED_SHARDING = "the file records no sharding"


def test_basic(impl, trees, tmp_path):
    impl.save(tmp_path / "c", trees["sharded"])
    assert_tree_equal(trees["sharded"], impl.restore(tmp_path / "c", trees["zeros"]))


def test_basic_no_item_arg(impl, trees, tmp_path):
    impl.save(tmp_path / "c", trees["sharded"])
    if impl.name == "stock":
        assert_tree_equal(trees["sharded"], impl.restore(tmp_path / "c"))
    else:  # DIFFERS: NO_SAVED_SHARDING: without a target every leaf goes to jax's default device
        assert_values_on_default_device(trees["sharded"], impl.restore(tmp_path / "c"))


def test_shape_dtype_struct(impl, trees, tmp_path):
    impl.save(tmp_path / "c", trees["mixed"])
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, trees["mixed"])
    restored = impl.restore(tmp_path / "c", target)
    if impl.name == "stock" or jax.config.jax_enable_x64:
        assert_tree_equal(trees["mixed"], restored)
    else:  # DIFFERS: leaves come back as jax.Arrays, so numpy's int64 as jax holds it without x64 (int32)
        def _eq(want, got):
            if isinstance(want, (int, float)):
                assert type(got) is type(want) and got == want
                return
            assert got.dtype == jax.dtypes.canonicalize_dtype(want.dtype)
            np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
        jax.tree.map(_eq, trees["mixed"], restored)


def test_restored_leaves_keep_the_target_sharding(impl, trees, tmp_path):
    impl.save(tmp_path / "c", trees["sharded"])
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, trees["sharded"])
    restored = impl.restore(tmp_path / "c", target)
    for want, got in zip(jax.tree.leaves(trees["sharded"]), jax.tree.leaves(restored)):
        assert got.sharding.is_equivalent_to(want.sharding, want.ndim)


def test_save_unsupported_type(impl, trees, tmp_path):
    pytree = {"str_key": "str_value", **trees["sharded"]}
    with pytest.raises((ValueError, TypeError)) as err:
        impl.save(tmp_path / "c", pytree)
    if impl.name == "stock":
        assert "Unsupported type" in str(err.value)
    else:  # DIFFERS: tensorlist's TypeError names the leaf's path and its type
        assert "str_key" in str(err.value) and "str" in str(err.value)


def test_restore_unsupported_type(impl, trees, tmp_path):
    pytree = {"str_key": "str_value", **trees["sharded"]}
    impl.save(tmp_path / "c", trees["sharded"])
    with pytest.raises(ValueError) as err:
        impl.restore(tmp_path / "c", pytree)
    if impl.name == "stock":
        assert "Unsupported type" in str(err.value)
    else:  # DIFFERS: the target does not match the saved tree; the error names where
        assert "str_key" in str(err.value) or "keys" in str(err.value)


def test_cast_on_restore(impl, trees, tmp_path):
    """A target of another dtype casts (the original's test_cast, without its save-time SaveArgs cast)."""
    impl.save(tmp_path / "c", trees["sharded"])
    target = jax.tree.map(functools.partial(ocp.utils.to_shape_dtype_struct, dtype=jnp.bfloat16), trees["sharded"])
    restored = impl.restore(tmp_path / "c", target)
    for want, got in zip(jax.tree.leaves(trees["sharded"]), jax.tree.leaves(restored)):
        assert got.dtype == jnp.bfloat16
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want).astype(jnp.bfloat16))


def test_flax_model(impl, trees, tmp_path):
    @flax.struct.dataclass
    class Params(flax.struct.PyTreeNode):
        params: Any
        opt_state: Any

    params = Params(params=trees["numpy"], opt_state=(optax.EmptyState(), optax.EmptyState()))
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("devices",))
    params = jax.tree.map(lambda a: test_utils.create_sharded_array(a, mesh, jax.sharding.PartitionSpec()), params)
    target = jax.tree.map(ocp.utils.to_shape_dtype_struct, params)
    impl.save(tmp_path / "c", params)
    assert_tree_equal(params, impl.restore(tmp_path / "c", target))


def test_empty_error(impl, tmp_path):
    if impl.name == "stock":
        with pytest.raises(ValueError):
            impl.save(tmp_path / "c", {})
    else:  # DIFFERS: an empty tree is a valid tensorlist file (no tensors, its spec {}), restored as {}
        impl.save(tmp_path / "c", {})
        assert impl.restore(tmp_path / "c") == {}


def test_empty_dict_node(impl, tmp_path):
    item = {"a": {}, "b": 3}
    impl.save(tmp_path / "c", item)
    assert impl.restore(tmp_path / "c", item) == item


def test_empty_none_node(impl, tmp_path):
    item = {"c": None, "d": 2}
    impl.save(tmp_path / "c", item)
    assert impl.restore(tmp_path / "c", item) == item


def test_none_node_in_restore_args(impl, tmp_path):
    mesh = jax.sharding.Mesh(np.asarray(jax.devices()), ("x",))
    arr = test_utils.create_sharded_array(np.arange(16), mesh, jax.sharding.PartitionSpec("x"))
    impl.save(tmp_path / "c", {"b": arr})
    assert impl.restore(tmp_path / "c", {"b": None}) == {"b": None}


def test_masked_shape_dtype_struct(impl, trees, tmp_path):
    def should_mask(keypath):
        return keypath[0].key == "a" or (keypath[0].key == "c" and keypath[1].key == "e")

    masked = jax.tree_util.tree_map_with_path(lambda kp, x: optax.MaskedNode() if should_mask(kp) else x,
                                              trees["sharded"])
    expected = jax.tree_util.tree_map_with_path(lambda kp, x: None if should_mask(kp) else x, trees["sharded"])
    impl.save(tmp_path / "c", masked)
    for target in (jax.tree.map(ocp.utils.to_shape_dtype_struct, trees["sharded"]),
                   jax.tree.map(ocp.utils.to_shape_dtype_struct, masked), None):
        restored = impl.restore(tmp_path / "c", target)
        if impl.name == "stock" or target is not None:
            assert_tree_equal(expected, restored)
        else:  # DIFFERS: NO_SAVED_SHARDING
            assert_values_on_default_device(expected, restored)
        if impl.name == "tensorlist":  # the MaskedNodes come back as such (the check above takes them for None)
            assert restored["a"] == optax.MaskedNode() and restored["c"]["e"] == optax.MaskedNode()


def test_custom_metadata(impl, trees, tmp_path):
    if impl.name == "stock":
        impl.save(tmp_path / "c", trees["sharded"], custom_metadata={"foo": 1})
        assert impl.handler.metadata(tmp_path / "c").custom_metadata == {"foo": 1}
    else:  # DIFFERS: TensorListSave(metadata=...); metadata() is the abstract tree, the JSON value is the file's
        import tensorlist
        from tensorlist.orbax import TREE_FILE
        impl.save(tmp_path / "c", trees["sharded"], metadata={"foo": 1})
        with tensorlist.open(tmp_path / "c" / TREE_FILE) as r:
            assert r.descriptor.metadata["metadata"] == {"foo": 1}


def random_keys(seed):
    replicated = jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), jax.sharding.PartitionSpec())
    return {"rand_orig": jax.random.key(jnp.array(seed, device=replicated)),
            "rand_rbg": jax.random.key(jnp.array(seed, device=replicated), impl="rbg")}


def test_with_random_keys(impl, trees, tmp_path):
    pytree = {**trees["sharded"], **random_keys(1)}
    zeros = {**trees["zeros"], **random_keys(0)}
    impl.save(tmp_path / "c", pytree)
    assert_tree_equal(pytree, impl.restore(tmp_path / "c", zeros))
    assert_tree_equal(pytree, impl.restore(tmp_path / "c", jax.tree.map(ocp.utils.to_shape_dtype_struct, zeros)))
    if impl.name == "stock":
        assert_tree_equal(pytree, impl.restore(tmp_path / "c", jax.eval_shape(lambda: zeros)))
    else:  # DIFFERS: NO_SAVED_SHARDING (jax.eval_shape's leaves have none)
        assert_values_on_default_device(pytree, impl.restore(tmp_path / "c", jax.eval_shape(lambda: zeros)))


def test_save_restore_random_keys_with_jax_eval_shape(impl, tmp_path):
    sharding = jax.sharding.NamedSharding(jax.sharding.Mesh(jax.devices(), ("x",)), jax.sharding.PartitionSpec())

    @functools.partial(jax.jit, in_shardings=sharding, out_shardings=sharding)
    def create(root_key):
        return dict(matrix=jnp.array([[1, 2], [3, 4], [5, 6], [7, 8]]), rngkey=jax.random.fold_in(root_key, 42))

    pytree = create(jax.random.key(0))
    impl.save(tmp_path / "c", pytree)
    assert_tree_equal(pytree, impl.restore(tmp_path / "c", jax.eval_shape(create, jax.random.key(0))))
