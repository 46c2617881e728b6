"""One contract for every framework adapter, so that the adapters cannot drift apart.

Each test of :class:`TestContract` runs once per adapter (or once per adapter and dtype):

========== ======================================== ================================= ==============================
kind       saves with                               loads with                        a default load gives
========== ======================================== ================================= ==============================
numpy      ``tensorlist.save``                      ``tensorlist.load``               read-only views of the mapping
torch      ``tensorlist.torch.save_module_state``   ``tensorlist.torch.load_state``   tensors over the mapping
jax        ``tensorlist.jax.save``                  ``tensorlist.jax.load``           arrays aliasing the mapping
mlx        ``tensorlist.mlx.save``                  ``tensorlist.mlx.load``           ``mx.array`` copies
tensorflow ``tensorlist.tensorflow.save``           ``tensorlist.tensorflow.load``    tensors over a copy-on-write map
========== ======================================== ================================= ==============================

The contract: every dtype of the table is held (round trips bit-exact, at
every rank from 0-d to 10, empty included), refused on load by name
(``UnsupportedDTypeError`` naming the file, the tensor and the dtype), or, for
MLX's float8_e4m3fn only, loaded as the framework's bytes; strided inputs save
their values; every adapter writes the same bytes as ``tensorlist.save`` for
the same values; metadata comes back as given; loads alias the file or copy as
each adapter documents, and nothing written to what a load returned reaches the
file; every broken file raises the project's error naming the file, the tensor
and the field; ``import tensorlist.<adapter>`` imports no other framework.

A case skips only where its framework is not installed (CI installs them all).
The jax adapter runs with ``jax_enable_x64`` on, so that it holds every 64-bit
dtype; its refusal of 64-bit leaves with x64 off is jax's own (tests/adapters/test_jax.py).
What one adapter alone does (MLX's float8 bytes, TensorFlow's alignment copies,
jax's trees and shardings, torch's module states) stays in that adapter's module.
"""
from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's start-up banner, not a test's output
ml_dtypes = pytest.importorskip("ml_dtypes", reason="bfloat16 and float8 arrays need ml_dtypes")

from _framework_support import bits as _bits, sample as _sample  # noqa: E402
import tensorlist as tl  # noqa: E402
from tensorlist._base import dtypes  # noqa: E402
from tensorlist.errors import ChecksumError, FormatError, UnsupportedDTypeError  # noqa: E402

KINDS = ["numpy", "torch", "jax", "mlx", "tensorflow"]
TABLE = frozenset(d.name for d in dtypes.DTYPES)
SHAPES = [(), (0,), (3, 5), (2, 0, 4), (2, 1, 3, 1, 1, 2, 1, 2, 1, 1)]
METADATA = {"epoch": 3, "note": ["a", None, 1.5, True], "nested": {"\u00fc": {"deep": [1, [2, 3]]}},
            "big": 2 ** 63 - 1, "neg": -0.5}


class Adapter:
    """One framework adapter, as the contract drives it: its spec (class attributes) and its calls.

    The spec is stated here, not read from the adapter, so that a test fails
    when an adapter changes what it holds; ``bridge_refuses`` asks the adapter.
    """

    kind: str
    framework: str = ""                      #: the module ``import tensorlist.<adapter>`` brings in
    module: str = "tensorlist"               #: the adapter's module
    label: str = ""                          #: how its refusals name the framework
    refused: frozenset = frozenset()         #: table dtypes a load refuses
    as_bytes: frozenset = frozenset()        #: table dtypes a load gives as the framework's bytes
    aliases: bool = True                     #: a default (mapped) load's tensors are the file's pages
    copied: frozenset = frozenset()          #: table dtypes a load copies all the same
    plain_save: bool = False                 #: ``tensorlist.save`` takes the framework's tensors too
    tree_files: bool = False                 #: reads only the files it writes (a structure in the metadata)
    writable_load: dict = {}                 #: the load options documented for writing to what comes back
    mapping_metadata: bool = False           #: metadata must be a mapping (else any JSON value)
    unstorable: tuple = ()                   #: ids of the values ``save`` refuses (see ``unstorable_value``)

    @classmethod
    def held(cls) -> list:
        return sorted(TABLE - cls.refused - cls.as_bytes)

    @contextlib.contextmanager
    def session(self):
        """Imports the framework (skipping the case where it is not installed) for one test."""
        yield

    # --- the adapter's calls --------------------------------------------------------
    def save(self, path, tensors, **kwargs) -> None:
        tl.save(path, tensors, **kwargs)

    def load(self, path, **kwargs) -> dict:
        return tl.load(path, **kwargs)

    def saved_metadata(self, path):
        """The caller's metadata of a file the adapter saved."""
        return tl.open(path).metadata

    def save_numpy(self, path, arrays, metadata=None) -> None:
        """A file the adapter reads, written from numpy arrays (``tensorlist.save``, or jax's tree file)."""
        tl.save(path, arrays, metadata=metadata)

    def embedded(self, arrays, folder: Path) -> tl.Tensors:
        """A list to embed in a JSON document, readable by the adapter by pointer (``folder``: scratch space)."""
        return tl.Tensors(arrays)

    def bridge_refuses(self, name: str) -> bool:
        """Whether the adapter's own rule refuses table dtype ``name`` on load."""
        return False

    # --- the framework's values -----------------------------------------------------
    def from_numpy(self, a: np.ndarray):
        return a

    def inputs(self, a: np.ndarray) -> dict:
        """Every kind of value ``save`` takes holding ``a`` (a tensor, a variable...), by name."""
        return {"t": self.from_numpy(a)}

    def bits(self, x) -> bytes:
        return _bits(x)

    def has_dtype(self, x, name: str) -> bool:
        return dtypes.from_numpy(np.dtype(x.dtype)).name == name  # a bit carrier by its tag (uint8 == FP4 pairs)

    def address(self, x) -> "int | None":
        """Where a loaded tensor's bytes are; None where the framework does not say (then the load copied)."""
        return x.ctypes.data

    def writable(self, x):
        """Whether a loaded tensor says it may be written to; None where the framework has no such flag."""
        return x.flags.writeable

    def strided(self, base: np.ndarray):
        """``base[:, ::2].T`` as the framework's non-contiguous value (a view where it has views)."""
        view = base[:, ::2].T
        assert not view.flags.c_contiguous
        return view

    def bump(self, x):
        """Adds one to a loaded tensor the way the framework writes (in place where it can), returns the result."""
        x += 1
        return x

    def unstorable_value(self, case: str):
        return {"str": np.array(["adam"]), "object": np.array([object()])}[case]


class NumpyAdapter(Adapter):
    kind = "numpy"
    writable_load = {"mmap": "copy"}
    unstorable = ("str", "object")
    unstorable_match = r"tensor 'w': numpy dtype .* has no tensorlist dataType code"


class TorchAdapter(Adapter):
    kind = "torch"
    framework = module = "torch"
    plain_save = True
    writable_load = {"mmap": "copy"}
    mapping_metadata = True                   # a model file's metadata keys sit beside its records'
    unstorable = ("complex32", "quantized", "sparse", "numpy")

    @contextlib.contextmanager
    def session(self):
        self.torch = pytest.importorskip("torch", reason="the torch adapter needs torch (pip install "
                                                         "'tensorlist[torch]')")
        import tensorlist.torch as tt

        self.tt = tt
        yield

    def save(self, path, tensors, **kwargs):
        self.tt.save_module_state(path, tensors, **kwargs)

    def load(self, path, **kwargs):
        return self.tt.load_state(path, **kwargs)

    def bridge_refuses(self, name):
        try:
            self.tt.torch_dtype(name)
        except (AttributeError, ValueError):
            return True
        return False

    def from_numpy(self, a):
        # torch's own conversion, through a same-size integer view (torch.from_numpy knows no ml_dtypes type)
        torch, row = self.torch, dtypes.from_numpy(a.dtype)
        if not row.carried:
            return torch.from_numpy(a.copy())
        if not a.size:  # torch views no empty byte tensor as a wider type
            return torch.empty(a.shape, dtype=getattr(torch, row.name))
        flat = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8).copy())
        return flat.view(getattr(torch, row.name)).reshape(a.shape)

    def inputs(self, a):
        t = self.from_numpy(a)
        # a second copy made the way from_numpy made the first: torch 2.8 has no copy kernel for float4_e2m1fn_x2
        return {"t": t, "p": self.torch.nn.Parameter(self.from_numpy(a), requires_grad=False)}

    def bits(self, x):
        x = x.detach().contiguous().reshape(-1)
        return x.view(self.torch.uint8).numpy().tobytes() if x.numel() else b""

    def has_dtype(self, x, name):
        return x.dtype == getattr(self.torch, name)

    def address(self, x):
        return x.data_ptr()

    def writable(self, x):
        return None  # torch has no read-only tensors: a mapped load's are read-only by contract (docs/FRAMEWORKS.md)

    def strided(self, base):
        view = self.from_numpy(base)[:, ::2].T
        assert not view.is_contiguous()
        return view

    def bump(self, x):
        return x.add_(1)

    def unstorable_value(self, case):
        torch = self.torch
        return {"complex32": lambda: torch.zeros(2, dtype=torch.complex32),
                "quantized": lambda: torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.qint8),
                "sparse": lambda: torch.eye(2).to_sparse(),
                "numpy": lambda: np.zeros(1)}[case]()

    unstorable_match = r"tensor 'w': (torch dtype torch.complex32 has no tensorlist dataType code|a quantized " \
                       r"tensor|a sparse tensor|expected a torch.Tensor, got ndarray)"


class JaxAdapter(Adapter):
    kind = "jax"
    framework = module = "jax"
    label = "jax"
    refused = frozenset({"float4_e2m1fn_x2"})
    tree_files = True
    plain_save = True
    unstorable = ("int4", "str")
    unstorable_match = r"tensor 'w': (dtype int4 has no tensorlist dataType code|a builtins.str is not an array)"

    @contextlib.contextmanager
    def session(self):
        self.jax = pytest.importorskip("jax", reason="the jax adapter needs jax (pip install 'jax[cpu]')")
        import tensorlist.jax as tlj
        from tensorlist._bridges import jax as bridge

        self.tlj, self.bridge = tlj, bridge
        with self.jax.enable_x64(True):  # jax holds 64-bit dtypes only with x64 on
            yield

    def save(self, path, tensors, **kwargs):
        self.tlj.save(path, dict(tensors), **kwargs)

    def load(self, path, **kwargs):
        return self.tlj.load(path, **kwargs)

    def saved_metadata(self, path):
        return tl.open(path).metadata["metadata"]

    def save_numpy(self, path, arrays, metadata=None):
        self.tlj.save(path, arrays, metadata=metadata)  # numpy leaves are stored as they are

    def embedded(self, arrays, folder):
        self.tlj.save(folder / "tree.tl", arrays)  # the tree's structure, as a tree file's metadata holds it
        return tl.Tensors(arrays, metadata=tl.open(folder / "tree.tl").metadata)

    def bridge_refuses(self, name):
        return self.bridge.refusal(name) is not None

    def from_numpy(self, a):
        return self.jax.numpy.asarray(a)

    def inputs(self, a):
        return {"t": self.from_numpy(a), "np": a}  # a tree's leaves may be numpy arrays

    def bits(self, x):
        return _bits(np.asarray(x))

    def address(self, x):
        return x.unsafe_buffer_pointer()

    def writable(self, x):
        return None  # jax arrays are immutable

    def strided(self, base):
        return super().strided(base)  # jax arrays have no strides: a tree's numpy leaf may

    def bump(self, x):
        return self.jax.jit(lambda y: y + 1, donate_argnums=0)(x)  # jax's only way to reuse a buffer

    def unstorable_value(self, case):
        return {"int4": lambda: self.jax.numpy.zeros(2, self.jax.numpy.int4), "str": lambda: "adam"}[case]()


class MlxAdapter(Adapter):
    kind = "mlx"
    framework, module, label = "mlx", "mlx", "MLX"
    refused = frozenset({"complex128", "float8_e5m2", "float8_e5m2fnuz", "float8_e4m3fnuz", "float8_e8m0fnu",
                         "float4_e2m1fn_x2"})
    as_bytes = frozenset({"float8_e4m3fn"})   # MLX's uint8 convention for mx.from_fp8 (tests/adapters/test_mlx.py)
    aliases = False                           # MLX owns its buffers: a load copies each tensor once
    unstorable = ("numpy", "str")
    unstorable_match = r"tensor 'w': expected an mlx.core.array, got (ndarray|str)"

    @contextlib.contextmanager
    def session(self):
        self.mx = pytest.importorskip("mlx.core", reason="the MLX adapter needs mlx (pip install 'mlx[cpu]' "
                                                         "off macOS)")
        import tensorlist.mlx as tm
        from tensorlist._bridges import mlx as bridge

        self.tm, self.bridge = tm, bridge
        yield

    def save(self, path, tensors, **kwargs):
        self.tm.save(path, tensors, **kwargs)

    def load(self, path, **kwargs):
        return self.tm.load(path, **kwargs)

    def bridge_refuses(self, name):
        return self.bridge.refusal(name) is not None

    def from_numpy(self, a):
        return self.tm.from_numpy(a)  # mx.array knows no ml_dtypes type, and makes float64 float32

    def bits(self, x):
        return _bits(self.tm.to_numpy(x))

    def has_dtype(self, x, name):
        return x.dtype == (self.mx.bool_ if name == "bool" else getattr(self.mx, name))

    def address(self, x):
        # numpy reads MLX's buffer in place (the buffer protocol), bfloat16 as its bits
        return np.array(x.view(self.mx.uint16) if x.dtype == self.mx.bfloat16 else x, copy=False).ctypes.data

    def writable(self, x):
        return None  # a copy MLX owns

    def strided(self, base):
        return self.from_numpy(base)[:, ::2].T  # a lazy strided view

    def bump(self, x):
        x[...] = x + 1  # MLX's item assignment
        return x

    def unstorable_value(self, case):
        return {"numpy": np.zeros(1), "str": "adam"}[case]


class TensorFlowAdapter(Adapter):
    kind = "tensorflow"
    framework, module, label = "tensorflow", "tensorflow", "TensorFlow"
    refused = frozenset({"float8_e8m0fnu", "float4_e2m1fn_x2"})
    copied = frozenset({"float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz"})  # tf.bitcast refuses
    plain_save = True
    unstorable = ("string", "sparse", "ragged", "numpy")
    unstorable_match = (r"tensor 'w': (TensorFlow dtype string has no tensorlist dataType code|expected a "
                        r"tf.Tensor .*(SparseTensor|RaggedTensor)|expected a tf.Tensor or tf.Variable, got ndarray)")
    #: TensorFlow 2.21 has no AssignVariableOp kernel for these: no tf.Variable holds them
    no_variable = frozenset({"float8_e5m2fnuz", "float8_e4m3fnuz"})

    @contextlib.contextmanager
    def session(self):
        self.tf = pytest.importorskip("tensorflow", reason="the TensorFlow adapter needs tensorflow "
                                                           "(pip install tensorflow-cpu)")
        import tensorlist.tensorflow as ttf
        from tensorlist._bridges import tf as bridge

        self.ttf, self.bridge = ttf, bridge
        yield

    def save(self, path, tensors, **kwargs):
        self.ttf.save(path, tensors, **kwargs)

    def load(self, path, **kwargs):
        return self.ttf.load(path, **kwargs)

    def bridge_refuses(self, name):
        return self.bridge.refusal(name) is not None

    def from_numpy(self, a):
        return self.tf.constant(a)  # tf.constant takes ml_dtypes arrays

    def inputs(self, a):
        t = self.from_numpy(a)
        name = dtypes.from_numpy(a.dtype).name
        return {"t": t} if name in self.no_variable else {"t": t, "v": self.tf.Variable(t)}

    def bits(self, x):
        return _bits(x.numpy())

    def has_dtype(self, x, name):
        return isinstance(x, (self.tf.Tensor, self.tf.Variable)) and x.dtype == self.tf.as_dtype(
            dtypes.from_name(name).numpy)

    def address(self, x):
        if x.dtype.name in self.copied:
            return None  # TensorFlow exports no float8 tensor by DLPack: there is no address to ask
        return self.ttf.address(x)

    def writable(self, x):
        return None  # TensorFlow's tensors are immutable

    def strided(self, base):
        return self.ttf.from_numpy(base[:, ::2].T)  # TensorFlow has no strides: the bridge takes a strided view

    def bump(self, x):
        v = self.tf.Variable(x)
        v.assign_add(self.tf.ones_like(x))  # TensorFlow's in-place write (its tensors are immutable)
        return v

    def unstorable_value(self, case):
        tf = self.tf
        return {"string": lambda: tf.constant(["a"]), "sparse": lambda: tf.sparse.from_dense([1, 0]),
                "ragged": lambda: tf.ragged.constant([[1], []]), "numpy": lambda: np.zeros(1)}[case]()


ADAPTERS = {a.kind: a for a in (NumpyAdapter, TorchAdapter, JaxAdapter, MlxAdapter, TensorFlowAdapter)}
assert list(ADAPTERS) == KINDS


@pytest.fixture(params=KINDS)
def adapter(request):
    a = ADAPTERS[request.param]()
    with a.session():
        yield a


def _cases(attribute) -> list:
    """``(kind, item)`` for every adapter and every item of its ``attribute`` (a list or a method's result)."""
    out = []
    for kind, cls in ADAPTERS.items():
        items = getattr(cls, attribute)
        for item in (items() if callable(items) else sorted(items)):
            out.append(pytest.param(kind, item, id=f"{kind}-{item}"))
    return out


def _data_file(path) -> Path:
    return Path(path).parent / json.loads(Path(path).read_text())["location"]


def _file_offset(ptr: int, data_file) -> "int | None":
    """The offset in ``data_file`` that address ``ptr`` maps in this process (Linux's /proc/self/maps), or None."""
    real = os.path.realpath(data_file)
    with open("/proc/self/maps") as f:
        for line in f:
            fields = line.split(maxsplit=5)
            if len(fields) == 6 and fields[5].strip() == real:
                lo, hi = (int(x, 16) for x in fields[0].split("-"))
                if lo <= ptr < hi:
                    return ptr - lo + int(fields[2], 16)
    return None


needs_maps = pytest.mark.skipif(not os.path.exists("/proc/self/maps"),
                                reason="where a tensor lives is read from /proc/self/maps (Linux)")


def _descriptor(path, adapter) -> dict:
    """The descriptor, less the data file's (random) name and a tree file's structure metadata."""
    d = json.loads(Path(path).read_text())
    d.pop("location")
    if adapter.tree_files:
        d.pop("metadata", None)
    return d


# --- corruptions: (id, what to do to a saved file, load options, error, tensor name, field) ---------------

def _flip_a_byte_of_w(path):
    d = json.loads(Path(path).read_text())
    w = next(t for t in d["tensors"] if t["name"] == "w")
    data = _data_file(path)
    raw = bytearray(data.read_bytes())
    raw[d["byteOffset"] + w["byteOffset"] + 5] ^= 1
    data.write_bytes(raw)


def _edit_w(**fields):
    def edit(path):
        d = json.loads(Path(path).read_text())
        next(t for t in d["tensors"] if t["name"] == "w").update(fields)
        Path(path).write_text(json.dumps(d))
    return edit


CORRUPTIONS = [
    ("flipped-byte", _flip_a_byte_of_w, {"verify": True}, ChecksumError, "w", "crc32c"),
    ("truncated-data", lambda p: os.truncate(_data_file(p), 20), {}, FormatError, None, "byteLength"),
    ("missing-data", lambda p: _data_file(p).unlink(), {}, FormatError, None, "location"),
    ("unknown-dtype", _edit_w(dataType=99), {}, FormatError, "w", "dataType"),
    ("dims-past-byte-length", _edit_w(dims=[65]), {}, FormatError, "w", "byteLength"),
    ("not-json", lambda p: Path(p).write_text('{"formatVersion":1,"tensors":['), {}, FormatError, None, None),
]


class TestContract:
    """What every adapter promises (parametrized by the ``adapter`` fixture, or by adapter and dtype)."""

    def test_every_table_dtype_is_held_refused_or_given_as_bytes(self, adapter):
        held, refused, as_bytes = set(adapter.held()), adapter.refused, adapter.as_bytes
        assert held | refused | as_bytes == TABLE
        assert not (held & refused or held & as_bytes or refused & as_bytes)
        assert {n for n in TABLE if adapter.bridge_refuses(n)} == refused

    @pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)) or "0d")
    @pytest.mark.parametrize("adapter, name", _cases("held"), indirect=["adapter"])
    def test_every_held_dtype_round_trips_bit_exact(self, adapter, name, shape, tmp_path):
        a = _sample(name, shape)
        given = adapter.inputs(a)
        assert all(adapter.has_dtype(x, name) and tuple(x.shape) == shape for x in given.values())
        adapter.save(tmp_path / "m.tl", given)
        on_disk = tl.load(tmp_path / "m.tl")
        assert list(on_disk) == list(given)
        for k in given:
            assert dtypes.from_numpy(on_disk[k].dtype).name == name and on_disk[k].shape == shape
            assert _bits(on_disk[k]) == _bits(a), k
        back = adapter.load(tmp_path / "m.tl")
        assert list(back) == list(given)
        for k, x in back.items():
            assert adapter.has_dtype(x, name) and tuple(x.shape) == shape, k
            assert adapter.bits(x) == _bits(a), k

    @settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(data=st.data(), shape=st.lists(st.integers(0, 4), max_size=4), seed=st.integers(0, 99),
           mmap=st.booleans())
    def test_hypothesis_round_trip(self, adapter, tmp_path_factory, data, shape, seed, mmap):
        name = data.draw(st.sampled_from(adapter.held()), label="dtype")
        path = tmp_path_factory.mktemp("h") / "m.tl"
        a = _sample(name, tuple(shape), seed)
        adapter.save(path, {"a": adapter.from_numpy(a)})
        assert adapter.bits(adapter.load(path, mmap=mmap)["a"]) == _bits(a)

    @pytest.mark.parametrize("adapter, name", _cases("refused"), indirect=["adapter"])
    def test_a_dtype_the_framework_lacks_is_refused_naming_file_tensor_and_dtype(self, adapter, name, tmp_path):
        path = tmp_path / "r.tl"
        adapter.save_numpy(path, {"fine": np.ones(2, np.float32), "bad.w": _sample(name, (3,))})
        with pytest.raises(UnsupportedDTypeError, match=rf"r\.tl: tensor 1 \('bad\.w'\) has dtype {name}: "
                                                        rf"{adapter.label} has no") as e:
            adapter.load(path)
        assert e.value.dtype == name and str(e.value).startswith(str(path))

    @pytest.mark.parametrize("adapter, case", _cases("unstorable"), indirect=["adapter"])
    def test_save_refuses_what_it_cannot_store_naming_the_tensor(self, adapter, case, tmp_path):
        ok = adapter.from_numpy(np.ones(1, np.float32))
        with pytest.raises(TypeError, match=adapter.unstorable_match):
            adapter.save(tmp_path / "x.tl", {"ok": ok, "w": adapter.unstorable_value(case)})
        assert not (tmp_path / "x.tl").exists()

    @pytest.mark.parametrize("name", ["float32", "bfloat16", "int8", "complex64", "bool"])
    def test_strided_inputs_save_their_values(self, adapter, name, tmp_path):
        base = _sample(name, (4, 6))
        adapter.save(tmp_path / "s.tl", {"s": adapter.strided(base)})
        got = tl.load(tmp_path / "s.tl")["s"]
        assert got.shape == (3, 4) and _bits(got) == _bits(base[:, ::2].T)
        assert adapter.bits(adapter.load(tmp_path / "s.tl")["s"]) == _bits(base[:, ::2].T)

    def test_every_adapter_writes_the_bytes_numpy_writes(self, adapter, tmp_path):
        arrays = {name: _sample(name, (3, 5), seed=i) for i, name in enumerate(adapter.held())}
        arrays.update(scalar=_sample("float32", ()), empty=_sample("int16", (0, 3)))
        tl.save(tmp_path / "numpy.tl", arrays)
        tensors = {k: adapter.from_numpy(a) for k, a in arrays.items()}
        adapter.save(tmp_path / "a.tl", tensors)
        saved = ["a.tl"]
        if adapter.plain_save:
            tl.save(tmp_path / "plain.tl", tensors)
            saved.append("plain.tl")
        for name in saved:
            assert _data_file(tmp_path / name).read_bytes() == _data_file(tmp_path / "numpy.tl").read_bytes(), name
            assert _descriptor(tmp_path / name, adapter) == _descriptor(tmp_path / "numpy.tl", adapter), name
        back = adapter.load(tmp_path / "a.tl", verify=True)
        assert {k: adapter.bits(x) for k, x in back.items()} == {k: _bits(a) for k, a in arrays.items()}

    @pytest.mark.parametrize("metadata", [METADATA, None, [1, "two"], "text"], ids=["dict", "none", "list", "str"])
    def test_metadata_round_trips(self, adapter, metadata, tmp_path):
        w = {"w": adapter.from_numpy(np.ones(2, np.float32))}
        if adapter.mapping_metadata and not isinstance(metadata, (dict, type(None))):
            with pytest.raises(TypeError, match=rf"metadata must be a mapping of metadata keys, not a "
                                                rf"{type(metadata).__name__}"):
                adapter.save(tmp_path / "m.tl", w, metadata=metadata)
            assert list(tmp_path.iterdir()) == []
            return
        adapter.save(tmp_path / "m.tl", w, metadata=metadata)
        assert adapter.saved_metadata(tmp_path / "m.tl") == metadata

    @pytest.mark.parametrize("bad", [{"s": {1, 2}}, {"n": float("nan")}, {1: "int key"}], ids=["set", "nan", "key"])
    def test_metadata_that_is_not_json_is_refused_before_any_file(self, adapter, bad, tmp_path):
        with pytest.raises(ValueError, match="metadata must be strict JSON"):
            adapter.save(tmp_path / "m.tl", {"w": adapter.from_numpy(np.ones(2, np.float32))}, metadata=bad)
        assert list(tmp_path.iterdir()) == []

    @pytest.mark.parametrize("source", ["tensorlist", "safetensors"])
    def test_plain_files_load_and_save_back(self, adapter, source, tmp_path):
        """A file of numpy's (or converted from safetensors) loads; saved back, it is the same list."""
        path = tmp_path / "plain.tl"
        if source == "tensorlist":
            arrays = {"w": _sample("float32", (4, 3)), "b": _sample("bfloat16", (5,)), "n": _sample("int64", ())}
            tl.save(path, arrays, metadata={"from": "numpy"})
        else:
            st_numpy = pytest.importorskip("safetensors.numpy", reason="the conversion case needs safetensors")
            from tensorlist.convert import convert

            arrays = {"w": np.arange(6, dtype=np.float16).reshape(2, 3)}
            st_numpy.save_file(arrays, str(tmp_path / "m.safetensors"))
            convert(str(tmp_path / "m.safetensors"), str(path))
        if adapter.tree_files:  # documented: a jax tree file holds its structure; tensorlist.load reads the rest
            with pytest.raises(FormatError, match="not a tensorlist.jax tree file") as e:
                adapter.load(path)
            assert (e.value.file, e.value.field) == (str(path), "/metadata")
            return
        loaded = adapter.load(path, verify=True)
        assert list(loaded) == list(arrays)
        assert all(adapter.has_dtype(loaded[k], dtypes.from_numpy(v.dtype).name) for k, v in arrays.items())
        assert all(adapter.bits(loaded[k]) == _bits(v) for k, v in arrays.items())
        adapter.save(tmp_path / "back.tl", loaded, metadata={"from": adapter.kind})
        with tl.open(tmp_path / "back.tl") as r:
            assert r.metadata == {"from": adapter.kind}
            assert all(_bits(r[k]) == _bits(v) for k, v in arrays.items())

    def test_an_embedded_list_loads_by_pointer(self, adapter, tmp_path):
        arrays = {"w": np.arange(3, dtype=np.int32), "b": _sample("bfloat16", (2, 2))}
        (tmp_path / "stage").mkdir()
        tl.save_document(tmp_path / "doc.json", {"note": "x", "model": adapter.embedded(arrays, tmp_path / "stage")})
        loaded = adapter.load(tmp_path / "doc.json", pointer="/model")
        assert {k: adapter.bits(x) for k, x in loaded.items()} == {k: _bits(a) for k, a in arrays.items()}

    @needs_maps
    @pytest.mark.parametrize("mmap", [True, False], ids=["mapped", "read"])
    def test_loads_alias_the_file_or_copy_as_documented(self, adapter, mmap, tmp_path):
        names = ["float32", "bfloat16", "float8_e4m3fn"]
        arrays = {n: _sample(n, (1024,)) for n in names}
        adapter.save_numpy(tmp_path / "z.tl", arrays)
        loaded = adapter.load(tmp_path / "z.tl", mmap=mmap)
        d = tl.open(tmp_path / "z.tl").descriptor
        offsets = {t.key: d.byte_offset + t.byte_offset for t in d.tensors}
        for k, x in loaded.items():
            aliased = adapter.aliases and mmap and k not in adapter.copied
            p = adapter.address(x)
            if p is None:
                assert not aliased, k
            else:
                assert _file_offset(p, _data_file(tmp_path / "z.tl")) == (offsets[k] if aliased else None), k
                assert p % tl.DEFAULT_ALIGNMENT == 0 or not aliased, k
            assert adapter.writable(x) in (None, not mmap), k  # numpy's mapped views say they are read-only
            assert adapter.bits(x) == _bits(arrays[k]), k

    def test_writes_to_what_a_load_returned_never_reach_the_file(self, adapter, tmp_path):
        w = _sample("float32", (256,))
        adapter.save_numpy(tmp_path / "k.tl", {"w": w})
        before = _data_file(tmp_path / "k.tl").read_bytes()
        bumped = adapter.bump(adapter.load(tmp_path / "k.tl", **adapter.writable_load)["w"])
        gc.collect()
        assert adapter.bits(bumped) == _bits(w + 1)
        assert _data_file(tmp_path / "k.tl").read_bytes() == before
        assert adapter.bits(adapter.load(tmp_path / "k.tl")["w"]) == _bits(w)

    def test_loaded_tensors_outlive_the_file_being_replaced(self, adapter, tmp_path):
        old, new = _sample("float32", (512,)), _sample("float32", (512,), seed=1)
        adapter.save_numpy(tmp_path / "r.tl", {"w": old})
        x = adapter.load(tmp_path / "r.tl")["w"]
        adapter.save_numpy(tmp_path / "r.tl", {"w": new})  # a new data file; the old one is swept away
        gc.collect()
        assert adapter.bits(x) == _bits(old)
        assert adapter.bits(adapter.load(tmp_path / "r.tl")["w"]) == _bits(new)

    @pytest.mark.parametrize("case, corrupt, options, error, tensor, field", CORRUPTIONS,
                             ids=[c[0] for c in CORRUPTIONS])
    def test_a_broken_file_raises_the_projects_error(self, adapter, case, corrupt, options, error, tensor,
                                                     field, tmp_path):
        path = tmp_path / "c.tl"
        adapter.save_numpy(path, {"a": np.arange(4, dtype=np.int32), "w": np.ones(64, np.float32)})
        corrupt(path)
        with pytest.raises(error) as e:
            adapter.load(path, **options)
        assert (e.value.file, e.value.tensor_name, e.value.field) == (str(path), tensor, field)
        assert str(e.value).startswith(str(path))

    def test_a_bad_mmap_value_is_refused(self, adapter, tmp_path):
        adapter.save_numpy(tmp_path / "m.tl", {"w": np.ones(1, np.float32)})
        with pytest.raises(ValueError, match=r"mmap must be True, False or 'copy', not 'yes'"):
            adapter.load(tmp_path / "m.tl", mmap="yes")

    @pytest.mark.slow
    def test_importing_the_adapter_imports_no_other_framework(self, adapter):
        """``import tensorlist`` imports no framework; the adapter adds none its framework does not import.

        A fresh interpreter (seconds for TensorFlow). TensorFlow 2.21 itself
        imports jax when it is installed, so the child compares with ``import <framework>`` alone.
        """
        code = ("import json, sys\n"
                "def fw(): return sorted(m for m in ('mlx', 'tensorflow', 'torch', 'jax') if m in sys.modules)\n"
                "import tensorlist; bare = fw()\n"
                f"import {adapter.framework or 'numpy'}; base = fw()\n"
                f"import {'tensorlist.' + adapter.module if adapter.framework else 'tensorlist'}\n"
                "print(json.dumps([bare, base, fw()]))")
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        bare, base, after = json.loads(out.stdout.strip().splitlines()[-1])
        assert bare == [] and after == base
        assert (adapter.framework in base) if adapter.framework else base == []
