"""tensorlist.jax: pytrees saved and loaded (zero-copy on CPU), the bridge's dtype rules, bad tree metadata,
and what the CLI and the converters make of a tree file (those without jax).

What every adapter promises (round trips of every dtype, refusals, aliasing the file's pages, broken
files...) is tests/adapters/test_contract.py's."""
import collections
import json
import os
import subprocess
import sys

import numpy as np
import pytest

import tensorlist
from tensorlist._base import dtypes as _dtypes, tree as _tree
from tensorlist.errors import FormatError

try:
    import jax
    import jax.numpy as jnp
except ImportError:  # the CLI and converter tests below run without jax
    jax = jnp = None

needs_jax = pytest.mark.skipif(jax is None, reason="jax is not installed (pip install 'jax[cpu]'); CI installs it")
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16/float8 leaves need ml_dtypes (tensorlist's dependency)")

Pair = collections.namedtuple("Pair", "first second")


def _data_file(path) -> str:
    return os.path.join(os.path.dirname(path), tensorlist.open(path).descriptor.location)


def _file_offset(ptr: int, data_file: str):
    """The offset in ``data_file`` that ``ptr`` maps in this process (Linux's /proc/self/maps), or None."""
    real = os.path.realpath(data_file)
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split(maxsplit=5)
            if len(parts) == 6 and parts[5].strip() == real:
                lo, hi = (int(x, 16) for x in parts[0].split("-"))
                if lo <= ptr < hi:
                    return ptr - lo + int(parts[2], 16)
    return None


def _file_offsets(path) -> dict:
    """Each tensor's first byte in the data file, as the descriptor says."""
    d = tensorlist.open(path).descriptor
    return {t.key: d.byte_offset + t.byte_offset for t in d.tensors}


needs_maps = pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="the mapping check reads /proc/self/maps")


def _tree_sample():
    try:
        from flax.core import FrozenDict
    except ImportError:  # the FrozenDict node is tested where flax is installed
        FrozenDict = dict

    return {
        "params": FrozenDict({"dense": {"kernel": jnp.arange(6, dtype=jnp.bfloat16).reshape(2, 3),
                                        "bias": jnp.zeros(3, jnp.float32)}}),
        "layers": {0: [jnp.arange(4, dtype=jnp.int32), None, (jnp.ones(8, jnp.float8_e4m3fn),)],
                   1: Pair(jnp.ones((), jnp.float16), np.arange(3, dtype=np.uint8))},
        "order": collections.OrderedDict(b=jnp.ones(2, jnp.float8_e5m2), a=jnp.zeros((0, 2), jnp.int8)),
        "empty": (),
    }


def _assert_same_tree(a, b):
    assert jax.tree_util.tree_structure(a) == jax.tree_util.tree_structure(b)
    for x, y in zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b)):
        assert isinstance(y, jax.Array)
        assert np.dtype(x.dtype) == np.dtype(y.dtype) and x.shape == y.shape
        assert np.asarray(x).tobytes() == np.asarray(y).tobytes()


@needs_jax
class TestRoundTrip:
    def test_every_node_comes_back_as_it_was(self, tmp_path):
        import tensorlist.jax as tlj

        FrozenDict = pytest.importorskip("flax.core", reason="FrozenDict nodes need flax (CI installs it)").FrozenDict
        tree = _tree_sample()
        tlj.save(tmp_path / "t.tl", tree, metadata={"step": 7})
        back = tlj.load(tmp_path / "t.tl")
        _assert_same_tree(tree, back)
        assert type(back["params"]) is FrozenDict and type(back["params"]["dense"]) is FrozenDict
        assert type(back["layers"][1]) is Pair and list(back["layers"]) == [0, 1]
        assert type(back["order"]) is collections.OrderedDict and list(back["order"]) == ["b", "a"]
        with tensorlist.open(tmp_path / "t.tl") as r:
            assert r.keys()[:3] == ["params/dense/kernel", "params/dense/bias", "layers/0/0"]
            assert r.metadata["format"] == tlj.JAX_TREE_FORMAT and r.metadata["metadata"] == {"step": 7}

    def test_a_single_array_and_an_empty_tree(self, tmp_path):
        import tensorlist.jax as tlj

        tlj.save(tmp_path / "a.tl", jnp.ones(3))
        assert tensorlist.open(tmp_path / "a.tl").keys() == [_tree.ROOT_NAME]
        assert tlj.load(tmp_path / "a.tl").shape == (3,)
        tlj.save(tmp_path / "e.tl", {"nothing": None})
        assert tlj.load(tmp_path / "e.tl") == {"nothing": None}

    def test_device(self, tmp_path):
        import tensorlist.jax as tlj

        dev = jax.devices()[-1]
        tlj.save(tmp_path / "t.tl", {"w": jnp.ones(4), "b": [jnp.zeros(2)]})
        back = tlj.load(tmp_path / "t.tl", device=dev)
        assert all(x.devices() == {dev} for x in jax.tree_util.tree_leaves(back))
        with pytest.raises(TypeError, match="device must be a jax.Device"):
            tlj.load(tmp_path / "t.tl", device="cpu:1")

    def test_save_refuses_what_is_not_an_array(self, tmp_path):
        import tensorlist.jax as tlj

        with pytest.raises(TypeError, match=r"tree at opt/step: the int 1180591620717411303424 is outside int64"):
            tlj.save(tmp_path / "t.tl", {"opt": {"step": 2 ** 70}})
        with pytest.raises(TypeError, match=r"tree at a: key \(1, 2\) is a tuple"):
            tlj.save(tmp_path / "t.tl", {"a": {(1, 2): jnp.ones(1)}})
        assert not os.path.exists(tmp_path / "t.tl")

    def test_an_array_of_several_processes_points_to_sharded_save(self, tmp_path, monkeypatch):
        import tensorlist.jax as tlj

        class Global:  # what a jax.Array sharded across processes answers (one process cannot make one)
            is_fully_addressable = False

        monkeypatch.setattr(tlj, "is_array", lambda v: isinstance(v, (Global, jax.Array)))
        with pytest.raises(ValueError, match=r"tensor 'w' is sharded across processes.*sharded=True"):
            tlj.save(tmp_path / "t.tl", {"b": jnp.ones(1), "w": Global()})
        assert not os.path.exists(tmp_path / "t.tl")


@needs_jax
class TestNNX:
    def test_state_saved_through_its_pure_dict_and_loaded_into_a_model(self, tmp_path):
        import tensorlist.jax as tlj

        nnx = pytest.importorskip("flax.nnx", reason="NNX states need flax (CI installs it)")

        def model(seed):
            return nnx.Sequential(nnx.Linear(2, 3, rngs=nnx.Rngs(seed)), nnx.BatchNorm(3, rngs=nnx.Rngs(seed)))

        a, b = model(0), model(1)
        tlj.save(tmp_path / "m.tl", nnx.state(a))
        pure = tlj.load(tmp_path / "m.tl")
        assert type(pure) is dict and list(pure["layers"]) == [0, 1]
        tlj.load_nnx(tmp_path / "m.tl", b)
        x = jnp.ones((1, 2))
        assert np.array_equal(np.asarray(a(x)), np.asarray(b(x)))


@needs_jax
class TestDtypes:
    def test_64_bit_refused_without_x64(self, tmp_path):
        import tensorlist.jax as tlj

        tlj.save(tmp_path / "t.tl", {"i": np.array([2**40, -1], np.int64), "f": np.array([1 / 3])})
        tlj.save(tmp_path / "f.tl", [np.ones(2, np.complex128), {"f": np.array([1 / 3])}])
        assert not jax.config.jax_enable_x64
        with pytest.raises(TypeError, match=r"tensor 'i': dtype int64 needs jax_enable_x64.*downcast=True"):
            tlj.load(tmp_path / "t.tl")
        with pytest.raises(TypeError, match=r"tensor '0': dtype complex128 needs jax_enable_x64.*to complex64"):
            tlj.load(tmp_path / "f.tl")
        small = tlj.load(tmp_path / "t.tl", downcast=True)
        assert small["i"].dtype == jnp.int32 and small["f"].dtype == jnp.float32
        with jax.enable_x64(True):
            full = tlj.load(tmp_path / "t.tl")
            assert full["i"].dtype == jnp.int64 and int(full["i"][0]) == 2**40
            assert float(full["f"][0]) == 1 / 3

    def test_bridge_put_aliases_aligned_views_only(self):
        from tensorlist._bridges import jax as _jax_bridge

        buf = np.zeros(4096 + 128, np.uint8)
        start = -buf.ctypes.data % _jax_bridge.XLA_ALIGNMENT
        for dtype in (np.float32, ml_dtypes.bfloat16, ml_dtypes.float8_e4m3fn):
            aligned = buf[start:start + 4096].view(dtype)
            aligned.flags.writeable = False
            a = _jax_bridge.put(aligned, None, "w")
            assert a.addressable_data(0).unsafe_buffer_pointer() == aligned.ctypes.data
            off = buf[start + 8:start + 8 + 4096 - 64].view(dtype)
            assert _jax_bridge.put(off, None, "w").addressable_data(0).unsafe_buffer_pointer() != off.ctypes.data

    def test_bridge_refusals(self):
        from tensorlist._bridges import jax as _jax_bridge

        with pytest.raises(TypeError, match="tensor 'o': jax cannot hold dtype object"):
            _jax_bridge.check_dtype(np.dtype(object), "o")
        with pytest.raises(TypeError, match="target must be None, a jax.Device or a jax.sharding.Sharding"):
            _jax_bridge.put(np.ones(2, np.float32), "cpu", "w")
        assert _jax_bridge.check_dtype(np.dtype(">f4"), "w") == np.dtype("float32")
        assert _jax_bridge.put(np.arange(3, dtype=">f4"), None, "w").tolist() == [0.0, 1.0, 2.0]


@needs_jax
class TestSharding:
    @pytest.fixture
    def mesh(self):
        if len(jax.devices()) < 4:
            pytest.skip("needs 4 CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=4 (tests/conftest.py)"
                        " set before jax was first imported")
        return jax.sharding.Mesh(np.array(jax.devices()[:4]).reshape(2, 2), ("x", "y"))

    @needs_maps
    def test_one_sharding_for_every_leaf_aliases_row_blocks(self, tmp_path, mesh):
        import tensorlist.jax as tlj
        from jax.sharding import NamedSharding, PartitionSpec as P

        tree = {"w": jnp.arange(64 * 16, dtype=jnp.float32).reshape(64, 16),
                "b": jnp.arange(32 * 64, dtype=jnp.bfloat16).reshape(32, 64)}
        tlj.save(tmp_path / "t.tl", tree)
        sh = NamedSharding(mesh, P("x"))
        back = tlj.load(tmp_path / "t.tl", sharding=sh)
        _assert_same_tree(tree, back)
        data, offsets = _data_file(tmp_path / "t.tl"), _file_offsets(tmp_path / "t.tl")
        for name, x in back.items():
            assert x.sharding == sh and len(x.addressable_shards) == 4
            row = x.nbytes // x.shape[0]
            for s in x.addressable_shards:
                start = offsets[name] + (s.index[0].start or 0) * row
                assert _file_offset(s.data.unsafe_buffer_pointer(), data) == start

    @pytest.mark.parametrize("sharded", [False, True])
    def test_a_sharding_over_an_abstract_mesh_is_refused_naming_the_leaf(self, tmp_path, mesh, sharded):
        """jax.eval_shape of a closure can give shardings over an AbstractMesh: they name no devices."""
        import tensorlist.jax as tlj
        if not hasattr(jax.sharding, "AbstractMesh"):
            pytest.skip("this jax has no AbstractMesh")
        tree = {"a": jax.device_put(jnp.arange(8.0), jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("x"))), "b": jnp.ones(2)}
        tlj.save(tmp_path / "t.tl", tree, sharded=sharded)
        abstract = jax.sharding.NamedSharding(jax.sharding.AbstractMesh((2, 2), ("x", "y")), jax.sharding.PartitionSpec("x"))
        target = {"a": jax.ShapeDtypeStruct((8,), jnp.float32, sharding=abstract), "b": None}
        for sharding in (target, abstract):
            with pytest.raises(ValueError, match=r"t\.tl: the target of leaf 'a' is a sharding over an abstract mesh"):
                tlj.load(tmp_path / "t.tl", sharding=sharding)

    def test_a_tree_of_targets_with_none_and_shape_dtype_structs(self, tmp_path, mesh):
        import tensorlist.jax as tlj
        from jax.sharding import NamedSharding, PartitionSpec as P

        tree = {"w": jnp.ones((4, 8)), "opt": [jnp.zeros((8,)), jnp.zeros((2, 2))], "none": None}
        tlj.save(tmp_path / "t.tl", tree)
        rows, cols = NamedSharding(mesh, P("x")), NamedSharding(mesh, P(None, "y"))
        abstract = jax.eval_shape(lambda: tree)
        target = {"w": jax.ShapeDtypeStruct((4, 8), jnp.float32, sharding=cols), "opt": [rows, None], "none": None}
        back = tlj.load(tmp_path / "t.tl", sharding=target)
        assert back["w"].sharding == cols and back["opt"][0].sharding == rows
        assert back["opt"][1].sharding.device_set == {jax.devices()[0]}
        assert back["none"] is None
        assert tlj.load(tmp_path / "t.tl", sharding={"w": rows, "opt": None, "none": None})["w"].sharding == rows
        _assert_same_tree(tree, tlj.load(tmp_path / "t.tl", sharding=abstract))

    @pytest.mark.parametrize("target, error, match", [
        ({"w": jax.ShapeDtypeStruct((4, 9), np.float32) if jax else None, "b": None}, FormatError,
         r"t\.tl: tree at w: the file stores float32 \(4, 8\), the target ShapeDtypeStruct "
         r"asks for float32 \(4, 9\)"),
        ({"w": jax.ShapeDtypeStruct((4, 8), np.int32) if jax else None, "b": None}, FormatError,
         r"asks for int32 \(4, 8\) \(load with cast=True to convert\)"),
        ({"w": jnp.ones((4, 9)) if jax else None, "b": None}, FormatError, "the target ArrayImpl asks for float32"),
        ({"w": jax.random.key(0) if jax else None, "b": None}, FormatError, r"asks for key<fry> \(\)"),
        ({"w": None}, ValueError, r"t\.tl: sharding tree at \(root\): keys \['w'\] do not match the file's "
                                  r"\['w', 'b'\]"),
        ({"w": None, "b": (None,)}, ValueError, r"t\.tl: sharding tree at b: the file holds a list of 2, the "
                                                "sharding tree a tuple of 1"),
        ({"w": None, "b": [None, "x"]}, ValueError, r"t\.tl: sharding tree at b/1: the file holds a leaf here; a "
                                                    "leaf's target is a Sharding, .* not a str"),
        ({"w": {"x": None}, "b": None}, ValueError, r"t\.tl: sharding tree at w: the file holds a leaf here; .* "
                                                    "not a dict"),
        ({"w": None, "b": collections.defaultdict(list)}, ValueError, "sharding tree at b: the file holds a list "
                                                                      "here, the sharding tree a defaultdict"),
        ([None], ValueError, r"t\.tl: sharding tree at \(root\): keys None do not match"),
    ])
    def test_bad_targets(self, tmp_path, target, error, match):
        import tensorlist.jax as tlj

        tlj.save(tmp_path / "t.tl", {"w": jnp.ones((4, 8)), "b": [jnp.ones(2), jnp.ones(2)]})
        with pytest.raises(error, match=match):
            tlj.load(tmp_path / "t.tl", sharding=target)


@needs_jax
class TestScalarsKeysPytrees:
    """What Orbax's StandardCheckpointHandler stores besides arrays (tests/adapters/test_orbax_ported.py runs its scenarios)."""

    def test_python_scalars_come_back_as_the_same_type(self, tmp_path):
        import tensorlist.jax as tlj

        tree = {"step": 3, "lr": 0.1, "done": False, "neg": -(2 ** 63), "big": 2 ** 63 - 1, "zero": -0.0,
                "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"), "np": np.float64(1.5)}
        tlj.save(tmp_path / "t.tl", tree)
        back = tlj.load(tmp_path / "t.tl", downcast=True)  # for the float64 array, with x64 off
        for k in ("step", "lr", "done", "neg", "big", "inf", "-inf"):
            assert type(back[k]) is type(tree[k]) and back[k] == tree[k], k
        assert str(back["zero"]) == "-0.0" and back["nan"] != back["nan"] and type(back["nan"]) is float
        assert isinstance(back["np"], jax.Array)  # a numpy scalar is an array (np.float64 subclasses float)
        assert tensorlist.open(tmp_path / "t.tl").keys() == ["np"]
        spec = tensorlist.open(tmp_path / "t.tl").metadata["tree"]
        assert spec["children"][0] == {"kind": "scalar", "type": "int", "value": 3}
        assert spec["children"][6] == {"kind": "scalar", "type": "float", "value": "nan"}
        target = {**tree, "np": None, "step": None, "lr": jax.devices()[0]}  # a scalar takes any target
        assert tlj.load(tmp_path / "t.tl", sharding=target, downcast=True)["step"] == 3

    @pytest.mark.parametrize("impl", ["threefry2x32", "rbg", "unsafe_rbg"])
    def test_prng_keys_come_back_typed(self, tmp_path, impl):
        import tensorlist.jax as tlj

        keys = jax.random.split(jax.random.key(7, impl=impl), 3)
        tlj.save(tmp_path / "t.tl", {"rng": keys, "one": keys[0]})
        spec = tensorlist.open(tmp_path / "t.tl").metadata["tree"]
        assert spec["children"][0] == {"kind": "key", "name": "rng", "impl": impl}
        for target in (None, jax.eval_shape(lambda: {"rng": keys, "one": keys[0]}),
                       {"rng": jax.ShapeDtypeStruct(jax.random.key_data(keys).shape, np.uint32), "one": keys[1]}):
            back = tlj.load(tmp_path / "t.tl", sharding=target)
            for k, want in (("rng", keys), ("one", keys[0])):
                assert jax.random.key_impl(back[k]) == impl and back[k].shape == want.shape
                assert (jax.random.key_data(back[k]) == jax.random.key_data(want)).all()
        with pytest.raises(FormatError, match=rf"tree at rng: the file stores a {impl} PRNG key array of shape "
                                              r"\(3,\), the target asks for"):
            tlj.load(tmp_path / "t.tl", sharding={"rng": keys[0], "one": None})

    def test_a_key_of_an_impl_tensorlist_does_not_store_is_refused(self, tmp_path, monkeypatch):
        import tensorlist.jax as tlj

        monkeypatch.setattr(tlj, "key_impl", lambda x: "philox" if isinstance(x, jax.Array) else None)
        with pytest.raises(TypeError, match=r"tree at k: a PRNG key of impl 'philox': tensorlist stores keys of"):
            tlj.save(tmp_path / "t.tl", {"k": jnp.ones(2)})

    def test_a_flax_struct_dataclass_is_saved_by_its_key_paths(self, tmp_path):
        import tensorlist.jax as tlj
        optax = pytest.importorskip("optax", reason="a TrainState needs an optax optimizer")
        train_state = pytest.importorskip("flax.training.train_state", reason="needs flax")

        def apply_fn(params, x):
            return x @ params["w"]

        state = train_state.TrainState.create(apply_fn=apply_fn, params={"w": jnp.ones((2, 3))},
                                              tx=optax.adam(1e-3))
        state = state.replace(step=5)
        tlj.save(tmp_path / "t.tl", state)
        spec = tensorlist.open(tmp_path / "t.tl").metadata["tree"]
        assert spec["kind"] == "pytree" and spec["type"] == "flax.training.train_state:TrainState"
        assert spec["keys"] == ["step", "params", "opt_state"]  # apply_fn and tx are static: not saved
        plain = tlj.load(tmp_path / "t.tl")  # no target: a dict, as Orbax gives
        assert type(plain) is dict and plain["params"]["w"].shape == (2, 3)
        fresh = train_state.TrainState.create(apply_fn=apply_fn, params={"w": jnp.zeros((2, 3))},
                                              tx=optax.adam(1e-3))
        back = tlj.load(tmp_path / "t.tl", sharding=jax.eval_shape(lambda: fresh))
        assert type(back) is train_state.TrainState and back.apply_fn is apply_fn and back.step == 5
        _assert_same_tree(state.opt_state, back.opt_state)
        assert type(back.opt_state[0]).__name__ == "ScaleByAdamState"
        with pytest.raises(ValueError, match=r"sharding tree at \(root\): keys \['step', 'params'\] do not match"):
            tlj.load(tmp_path / "t.tl", sharding={"step": None, "params": None})

    def test_an_empty_node_takes_a_leaf_s_target(self, tmp_path):
        import tensorlist.jax as tlj
        optax = pytest.importorskip("optax", reason="optax.MaskedNode")

        tlj.save(tmp_path / "t.tl", {"a": optax.MaskedNode(), "b": jnp.ones(2), "c": {}})
        target = {"a": jax.ShapeDtypeStruct((8,), jnp.float32), "b": jnp.zeros(2), "c": jax.devices()[0]}
        back = tlj.load(tmp_path / "t.tl", sharding=target)
        assert back["a"] == optax.MaskedNode() and back["c"] == {}
        with pytest.raises(ValueError, match=r"sharding tree at b: the file holds a leaf here"):
            tlj.load(tmp_path / "t.tl", sharding={**target, "b": {}})


@needs_jax
class TestTargets:
    def test_a_concrete_array_target_gives_its_shape_dtype_and_sharding(self, tmp_path):
        import tensorlist.jax as tlj

        if len(jax.devices()) < 2:
            pytest.skip("needs 2 CPU devices: XLA_FLAGS=--xla_force_host_platform_device_count=4 (tests/conftest.py)")
        tree = {"w": jnp.arange(8.0), "b": jnp.ones(2)}
        tlj.save(tmp_path / "t.tl", tree)
        rows = jax.sharding.NamedSharding(jax.sharding.Mesh(np.array(jax.devices()[:2]), ("x",)),
                                          jax.sharding.PartitionSpec("x"))
        target = {"w": jax.device_put(jnp.zeros(8), rows), "b": jnp.zeros(2)}
        back = tlj.load(tmp_path / "t.tl", sharding=target)
        assert back["w"].sharding == rows and back["w"].tolist() == list(range(8))

    def test_cast_converts_to_the_target_dtype_and_keeps_the_shape_rule(self, tmp_path):
        import tensorlist.jax as tlj

        tlj.save(tmp_path / "t.tl", {"w": jnp.arange(6, dtype=jnp.float32).reshape(2, 3) / 3, "i": jnp.arange(3)})
        target = {"w": jax.ShapeDtypeStruct((2, 3), jnp.bfloat16), "i": jax.ShapeDtypeStruct((3,), jnp.float16)}
        with pytest.raises(FormatError, match=r"tree at w: .* asks for bfloat16 \(2, 3\) \(load with cast=True"):
            tlj.load(tmp_path / "t.tl", sharding=target)
        back = tlj.load(tmp_path / "t.tl", sharding=target, cast=True)
        assert back["w"].dtype == jnp.bfloat16 and back["i"].dtype == jnp.float16
        want = (np.arange(6, dtype=np.float32).reshape(2, 3) / 3).astype(jnp.bfloat16)
        assert np.asarray(back["w"]).tobytes() == want.tobytes() and back["i"].tolist() == [0, 1, 2]
        with pytest.raises(FormatError, match=r"tree at w: the file stores float32 \(2, 3\), the target "
                                              r"ShapeDtypeStruct asks for bfloat16 \(3, 2\)"):
            tlj.load(tmp_path / "t.tl", sharding={**target, "w": jax.ShapeDtypeStruct((3, 2), jnp.bfloat16)},
                     cast=True)
        x64 = tlj.load(tmp_path / "t.tl", sharding={**target, "i": jax.ShapeDtypeStruct((3,), np.int64)}, cast=True)
        assert x64["i"].dtype == jax.dtypes.canonicalize_dtype(np.int64)  # as jax holds it: int32 without x64

    def test_skip_leaves_a_leaf_or_subtree_out_unread(self, tmp_path, monkeypatch):
        import tensorlist.jax as tlj

        tlj.save(tmp_path / "t.tl", {"w": jnp.ones(2), "opt": {"mu": jnp.ones(3), "nu": [jnp.ones(1), 4]}})
        read = []
        real = tlj.put
        monkeypatch.setattr(tlj, "put", lambda view, t, name, **k: read.append(name) or real(view, t, name, **k))
        back = tlj.load(tmp_path / "t.tl", sharding={"w": None, "opt": tlj.SKIP})
        assert back == {"w": back["w"], "opt": None} and read == ["w"]
        back = tlj.load(tmp_path / "t.tl", sharding={"w": tlj.SKIP, "opt": {"mu": None, "nu": [tlj.SKIP, tlj.SKIP]}})
        assert back["w"] is None and back["opt"]["nu"] == [None, None] and read == ["w", "opt/mu"]
        assert repr(tlj.SKIP) == "tensorlist.jax.SKIP"

    def test_a_leaf_jax_cannot_hold_is_refused_unless_skipped(self, tmp_path):
        import tensorlist.jax as tlj
        from tensorlist.errors import UnsupportedDTypeError

        fp4 = np.arange(4, dtype=np.uint8).view(_dtypes.from_name("float4_e2m1fn_x2").numpy)  # a bit carrier
        tlj.save(tmp_path / "t.tl", {"w": jnp.ones(2), "packed": fp4})
        with pytest.raises(UnsupportedDTypeError, match=r"t\.tl: tensor 1 \('packed'\) has dtype float4_e2m1fn_x2: "
                                                        "jax has no float4_e2m1fn_x2 type"):
            tlj.load(tmp_path / "t.tl")
        back = tlj.load(tmp_path / "t.tl", sharding={"w": None, "packed": tlj.SKIP})
        assert back["packed"] is None and back["w"].tolist() == [1, 1]


def _write(path, spec, arrays):
    tensorlist.save(path, arrays, metadata=_tree.make_header(spec))


def _leaf(name):
    return {"kind": "leaf", "name": name}


_W = {"w": np.ones(2, np.float32)}
_WB = {"w": np.ones(2, np.float32), "b": np.zeros(1, np.float32)}


@needs_jax
class TestBadTreeMetadata:
    """Tree metadata that does not match the tensors: a FormatError naming the file, the field and the tree path,
    raised before any leaf reaches a device."""

    CASES = [
        ("missing leaf", {"kind": "dict", "keys": ["w", "x"], "children": [_leaf("w"), _leaf("x")]}, _W,
         "/metadata/tree/children/1/name", "tree at x: the leaf names tensor 'x', which the file does not store"),
        ("extra leaf", {"kind": "dict", "keys": ["w"], "children": [_leaf("w")]}, _WB,
         "/metadata/tree", r"tensor 1 \('b'\).*tensor 'b' is stored but no leaf of the tree names it"),
        ("leaf twice", {"kind": "list", "children": [_leaf("w"), _leaf("w")]}, _W,
         "/metadata/tree/children/1/name", "tree at 1: tensor 'w' is already a leaf"),
        ("unknown kind", {"kind": "dict", "keys": ["w"], "children": [{"kind": "set", "children": []}]}, _W,
         "/metadata/tree/children/0/kind", "tree at w: unknown node kind 'set'"),
        ("float key", {"kind": "dict", "keys": [1.5], "children": [_leaf("w")]}, _W,
         "/metadata/tree/keys/0", "key 0 is 1.5: a key is a string or an integer"),
        ("bool key", {"kind": "dict", "keys": [True], "children": [_leaf("w")]}, _W,
         "/metadata/tree/keys/0", "key 0 is True"),
        ("duplicate key", {"kind": "dict", "keys": [0, 0], "children": [_leaf("w"), {"kind": "none"}]}, _W,
         "/metadata/tree/keys/1", "key 0 appears twice"),
        ("keys and children", {"kind": "dict", "keys": ["w", "b"], "children": [_leaf("w")]}, _W,
         "/metadata/tree/keys", r"'keys' must be an array as long as 'children' \(1\)"),
        ("namedtuple fields", {"kind": "namedtuple", "type": f"{__name__}:Pair", "fields": ["second", "first"],
                               "children": [_leaf("w"), {"kind": "none"}]}, _W,
         "/metadata/tree/fields", r"namedtuple .*Pair' has the fields \['first', 'second'\]"),
        ("unknown field", {"kind": "leaf", "name": "w", "shape": [2]}, _W,
         "/metadata/tree", r"a 'leaf' node has exactly the fields \['kind', 'name'\]; unexpected \['shape'\]"),
        ("children not a list", {"kind": "tuple", "children": {"0": _leaf("w")}}, _W,
         "/metadata/tree/children", "'children' must be an array"),
        ("leaf name", {"kind": "list", "children": [{"kind": "leaf", "name": 0}]}, _W,
         "/metadata/tree/children/0/name", "tree at 0: a leaf's 'name' must be a string"),
        ("node not an object", {"kind": "list", "children": [_leaf("w"), "x"]}, _W,
         "/metadata/tree/children/1", "tree at 1: a node must be an object"),
        ("too deep for the codec", None, _W, None, "the tree is deeper than"),
        ("scalar type", {"kind": "scalar", "type": "complex", "value": 1}, {}, "/metadata/tree/type",
         r"a scalar's 'type' is one of \['bool', 'float', 'int'\], not 'complex'"),
        ("scalar bool as int", {"kind": "scalar", "type": "int", "value": True}, {}, "/metadata/tree/value",
         "a scalar of type 'int' has as 'value' an integer within int64's range, not True"),
        ("scalar int too big", {"kind": "scalar", "type": "int", "value": 2 ** 63}, {}, "/metadata/tree/value",
         "an integer within int64's range"),
        ("scalar float text", {"kind": "scalar", "type": "float", "value": "Infinity"}, {}, "/metadata/tree/value",
         r"a finite number or one of \['-inf', 'inf', 'nan'\], not 'Infinity'"),
        ("key impl", {"kind": "key", "name": "w", "impl": "philox"}, _W, "/metadata/tree/impl",
         r"a key's 'impl' is one of \['rbg', 'threefry2x32', 'unsafe_rbg'\], not 'philox'"),
        ("key data", {"kind": "key", "name": "w", "impl": "threefry2x32"}, _W, None,
         r"tensor 'w'.*a threefry2x32 PRNG key leaf holds uint32 key data of shape \(\.\.\., 2\), not float32"),
        ("pytree type", {"kind": "pytree", "type": "TrainState", "keys": ["w"], "children": [_leaf("w")]}, _W,
         "/metadata/tree/type", "a node's 'type' must be 'module:qualname', not 'TrainState'"),
        ("pytree keys", {"kind": "pytree", "type": "m:T", "keys": [[0]], "children": [_leaf("w")]}, _W,
         "/metadata/tree/keys/0", "key 0 is"),
    ]

    @staticmethod
    def _deep_spec(levels):
        spec = _leaf("w")
        for _ in range(levels):
            spec = {"kind": "list", "children": [spec]}
        return spec

    @pytest.mark.parametrize("label, spec, arrays, field, match", CASES, ids=[c[0] for c in CASES])
    def test_refused(self, tmp_path, monkeypatch, label, spec, arrays, field, match):
        import tensorlist.jax as tlj

        puts = []
        monkeypatch.setattr(tlj, "put", lambda *a, **k: puts.append(a))
        path = str(tmp_path / "bad.tl")
        _write(path, spec if spec is not None else self._deep_spec(_tree.MAX_TREE_DEPTH + 1), arrays)
        with pytest.raises(FormatError, match=match) as e:
            tlj.load(path)
        assert e.value.file == path and puts == []
        if field is not None:
            assert e.value.field == field and f"field {field!r}" in str(e.value)

    def test_a_hundred_thousand_levels_refused_at_read_naming_the_file(self, tmp_path):
        import tensorlist.jax as tlj

        path = tmp_path / "deep.tl"
        _write(path, "DEEP", _W)
        n = 10**5
        deep = '{"kind":"list","children":[' * n + '{"kind":"leaf","name":"w"}' + "]}" * n
        path.write_text(path.read_text().replace('"DEEP"', deep))
        with pytest.raises(FormatError, match=rf"{path}: invalid JSON: nesting deeper than 256 levels") as e:
            tlj.load(path)
        assert e.value.file == str(path)

    def test_header_fields(self, tmp_path):
        import tensorlist.jax as tlj

        tensorlist.save(tmp_path / "h.tl", _W, metadata={"format": _tree.JAX_TREE_FORMAT, "tree": _leaf("w")})
        with pytest.raises(FormatError, match=r"h\.tl: field '/metadata': a tensorlist.jax-tree/1 header has "
                                              r"exactly the fields"):
            tlj.load(tmp_path / "h.tl")


# --------------------------------------------------------------------------
# the CLI and the converters (numpy only: a tree file written without jax)


def _numpy_tree_file(path):
    bf16 = np.arange(6, dtype=np.float32).astype(ml_dtypes.bfloat16).reshape(2, 3)
    f8 = np.array([0.5, -2, 448], np.float32).astype(ml_dtypes.float8_e4m3fn)
    tree = {"params": {"dense": {"kernel": bf16, "bias": np.array([1.5, -0.25], np.float32)}},
            "layers": [f8, None, (np.arange(4, dtype=np.int32),)]}
    spec, leaves = _tree.encode(tree)
    tensorlist.save(path, dict(leaves), metadata=_tree.make_header(spec, {"step": 5}))
    return dict(leaves)


def test_cli_inspect_shows_the_tree_without_jax(tmp_path):
    path = tmp_path / "t.tl"
    _numpy_tree_file(path)
    code = ("import sys; from tensorlist import cli; rc = cli.main(['inspect', sys.argv[1]]); "
            "assert 'jax' not in sys.modules, 'the CLI imported jax'; sys.exit(rc)")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "  tree (tensorlist.jax-tree/1):\n    dict\n    ├── 'params': dict\n" in text
    assert "│       ├── 'kernel': params/dense/kernel  bfloat16 (2, 3)" in text
    assert "        ├── [1]: None" in text
    assert '  metadata: {\n  "step": 5\n}' in text and '"kind"' not in text


def test_cli_inspect_of_a_bad_tree_header(tmp_path, capsys):
    from tensorlist import cli

    tensorlist.save(tmp_path / "h.tl", _W, metadata={"format": _tree.JAX_TREE_FORMAT, "tree": 1})
    assert cli.main(["inspect", str(tmp_path / "h.tl")]) == 0
    assert "  tree: invalid (a tensorlist.jax-tree/1 header has exactly the fields" in capsys.readouterr().out


def test_convert_to_safetensors_and_back_keeps_every_leaf(tmp_path):
    from tensorlist import cli

    leaves = _numpy_tree_file(tmp_path / "t.tl")
    assert cli.main(["convert", str(tmp_path / "t.tl"), str(tmp_path / "t.safetensors")]) == 0
    assert cli.main(["convert", str(tmp_path / "t.safetensors"), str(tmp_path / "back.tl")]) == 0
    with tensorlist.open(tmp_path / "back.tl") as r:
        assert sorted(r.keys()) == sorted(leaves)
        for name, a in leaves.items():
            assert r[name].dtype == a.dtype and r[name].shape == a.shape
            assert r[name].tobytes() == a.tobytes()
        header = _tree.tree_header(r.metadata)
        assert header == tensorlist.open(tmp_path / "t.tl").metadata
        assert _tree.check(header["tree"], r.keys()).leaves == tuple(leaves)


@needs_jax
def test_converted_file_loads_as_the_same_tree(tmp_path):
    import tensorlist.jax as tlj
    from tensorlist import cli

    _numpy_tree_file(tmp_path / "t.tl")
    assert cli.main(["convert", str(tmp_path / "t.tl"), str(tmp_path / "t.safetensors")]) == 0
    assert cli.main(["convert", str(tmp_path / "t.safetensors"), str(tmp_path / "back.tl")]) == 0
    _assert_same_tree(tlj.load(tmp_path / "t.tl"), tlj.load(tmp_path / "back.tl"))


@needs_jax
def test_a_sharded_save_loads_back_through_the_same_entry_points(tmp_path):
    """``sharded=True`` writes a checkpoint directory; ``load`` of it takes ``device=``, ``verify=`` and targets."""
    import tensorlist.jax as tlj
    from tensorlist import dcp as dcp_read

    tree = {"w": jnp.ones((2, 2)), "opt": (np.zeros(3, np.float32), None)}
    tlj.save(tmp_path / "ckpt", tree, sharded=True, metadata={"step": 2}, durable=False)
    ck = dcp_read.read_metadata(str(tmp_path / "ckpt"))
    assert ck.tree["format"] == tlj.JAX_TREE_FORMAT and ck.tree["metadata"] == {"step": 2}
    assert sorted(ck.tensors) == ["opt/0", "w"]
    dev = jax.devices()[-1]
    back = tlj.load(tmp_path / "ckpt", device=dev, verify=True)
    _assert_same_tree(tree, back)
    assert back["w"].devices() == {dev} and back["opt"][0].devices() == {dev}
    sds = {"w": jax.ShapeDtypeStruct((2, 3), jnp.float32), "opt": None}
    with pytest.raises(FormatError, match=r"ckpt: tree at w: the file stores float32 \(2, 2\)"):
        tlj.load(tmp_path / "ckpt", sharding=sds)
    with pytest.raises(ValueError, match=r"ckpt: a checkpoint directory takes .* not \['max_tensors'\]"):
        tlj.load(tmp_path / "ckpt", max_tensors=3)


@needs_jax
def test_cli_inspect_draws_a_sharded_checkpoints_tree(tmp_path, capsys):
    import tensorlist.jax as tlj
    from tensorlist import cli

    tlj.save(tmp_path / "ckpt", {"w": jnp.ones((2, 3)), "opt": [None]}, sharded=True, metadata={"step": 4})
    assert cli.main(["inspect", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "  tree (tensorlist.jax-tree/1):\n    dict\n    ├── 'w': w  float32 (2, 3)\n" in out
    assert '"step": 4' in out
