"""tensorlist.to_dlpack: the protocol with numpy alone, then what each framework does with it.

The framework cases check the table of docs/FRAMEWORKS.md ("DLPack and zero-copy") by pointer
equality: ``jax.Array.unsafe_buffer_pointer()``, ``torch.Tensor.data_ptr()``, and for MLX (and
TensorFlow, in test_dlpack_tf.py) the data pointer of the DLPack capsule the framework exports,
against ``array.ctypes.data``; the files and the capsule reader are _dlpack_support's.
"""
from __future__ import annotations

import gc
import subprocess
import sys

import ml_dtypes
import numpy as np
import pytest

import tensorlist as tl
from tensorlist.dlpack import DLPackExport

from _dlpack_support import (COLUMNS, K_DL_BFLOAT, K_DL_FLOAT, NUMPY_VERSIONED, READ_ONLY, Capsule, capsule_info,
                             cells, needs_versioned, save_files, view)



@pytest.fixture(scope="module")
def files(tmp_path_factory):
    return save_files(tmp_path_factory.mktemp("dlpack"))


# --- the protocol, with numpy alone --------------------------------------------------------------

class TestProtocol:
    @needs_versioned
    def test_a_numpy_consumer_aliases_and_keeps_read_only(self, files):
        for mode in (True, "copy"):
            a = view(files, mode, True, "float32")
            got = np.from_dlpack(tl.to_dlpack(a))
            assert got.ctypes.data == a.ctypes.data
            assert got.flags.writeable == (mode == "copy")
            np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32))

    @needs_versioned
    def test_a_versioned_capsule_flags_a_read_only_view(self, files):
        for mode in (True, "copy"):
            a = view(files, mode, True, "float32")
            info = capsule_info(tl.to_dlpack(a).__dlpack__(max_version=(1, 0)))
            assert info["name"] == "dltensor_versioned" and info["data"] == a.ctypes.data
            assert bool(info["flags"] & READ_ONLY) == (mode is True)
            assert (info["code"], info["bits"]) == (K_DL_FLOAT, 32)

    def test_a_legacy_consumer_is_refused_a_read_only_view_naming_the_way_out(self, files):
        e = tl.to_dlpack(view(files, True, True, "float32"))
        with pytest.raises(BufferError, match=r'legacy DLPack capsule.*read-only.*load it with mmap="copy"'):
            e.__dlpack__()
        with pytest.raises(BufferError, match=r"to_dlpack\(array, copy=True\)"):
            e.__dlpack__(max_version=(0, 8))  # a consumer that announces a pre-1.0 version is legacy too

    def test_a_legacy_consumer_gets_a_writable_view_itself(self, files):
        a = view(files, "copy", True, "float32")
        info = capsule_info(tl.to_dlpack(a).__dlpack__())
        assert info["name"] == "dltensor" and info["data"] == a.ctypes.data

    @needs_versioned
    def test_copy_true_exports_one_aligned_private_copy_only_when_needed(self, files):
        a = view(files, True, False, "float32")  # read-only, not 64-byte aligned
        e = tl.to_dlpack(a, copy=True)
        capsule = e.__dlpack__()
        info = capsule_info(capsule)
        assert info["data"] != a.ctypes.data and info["data"] % 64 == 0
        got = np.from_dlpack(Capsule(capsule))
        np.testing.assert_array_equal(got, a)
        # a versioned consumer still gets the view itself, flagged
        assert capsule_info(e.__dlpack__(max_version=(1, 0)))["data"] == a.ctypes.data

    @needs_versioned
    def test_a_consumer_asking_for_a_copy_gets_one(self, files):
        a = view(files, True, True, "float32")
        info = capsule_info(tl.to_dlpack(a).__dlpack__(max_version=(1, 0), copy=True))
        assert info["data"] != a.ctypes.data and not info["flags"] & READ_ONLY

    @needs_versioned
    @pytest.mark.parametrize("dtype,code,bits", [("bfloat16", K_DL_BFLOAT, 16), ("float8_e4m3fn", 10, 8),
                                                 ("float8_e5m2", 12, 8)])
    def test_bfloat16_and_float8_are_the_same_bytes_retyped(self, files, dtype, code, bits):
        for mode in (True, "copy"):
            a = view(files, mode, True, dtype)
            info = capsule_info(tl.to_dlpack(a).__dlpack__(max_version=(1, 0)))
            assert (info["code"], info["bits"], info["data"]) == (code, bits, a.ctypes.data)
            assert bool(info["flags"] & READ_ONLY) == (mode is True)
            assert info["version"] >= ((1, 1) if code > K_DL_BFLOAT else (1, 0))  # float8 codes are DLPack 1.1's
        legacy = capsule_info(tl.to_dlpack(a).__dlpack__())
        assert (legacy["name"], legacy["code"], legacy["data"]) == ("dltensor", code, a.ctypes.data)
        assert a.dtype == getattr(ml_dtypes, dtype)  # the array itself is untouched

    def test_a_numpy_without_versioned_export_falls_back_to_the_legacy_protocol(self, files):
        class LegacyOnly(np.ndarray):  # numpy before 2.1: __dlpack__(stream=None) and nothing else
            def __dlpack__(self, *, stream=None):
                return np.asarray(self).__dlpack__(stream=stream)

        for dtype, code in (("float32", K_DL_FLOAT), ("bfloat16", K_DL_BFLOAT)):
            ro = view(files, True, True, dtype).view(LegacyOnly)
            with pytest.raises(BufferError, match='load it with mmap="copy"'):
                tl.to_dlpack(ro).__dlpack__(max_version=(1, 0))
            rw = view(files, "copy", True, dtype).view(LegacyOnly)
            info = capsule_info(tl.to_dlpack(rw).__dlpack__(max_version=(1, 0)))
            assert (info["name"], info["code"], info["data"]) == ("dltensor", code, rw.ctypes.data)

    def test_the_export_keeps_the_mapping_alive(self, files):
        e = tl.to_dlpack(tl.load(files[True], mmap="copy")["float32"])
        capsule = e.__dlpack__()
        del e
        gc.collect()
        got = np.from_dlpack(Capsule(capsule))
        np.testing.assert_array_equal(got, np.arange(64, dtype=np.float32))

    def test_device_and_repr(self, files):
        e = tl.to_dlpack(view(files, True, True, "bfloat16"))
        assert e.__dlpack_device__() == (1, 0)
        assert repr(e) == "<tensorlist.DLPackExport bfloat16[64], read-only>"
        assert isinstance(e, DLPackExport) and e.array.dtype == ml_dtypes.bfloat16

    def test_bad_arguments(self, files):
        with pytest.raises(TypeError, match="to_dlpack takes a numpy array, not list"):
            tl.to_dlpack([1.0])
        with pytest.raises(TypeError, match="copy must be a bool, not str"):
            tl.to_dlpack(np.ones(2), copy="yes")
        with pytest.raises(BufferError, match=r"cannot export to device \(2, 0\): the array is on the CPU"):
            tl.to_dlpack(view(files, "copy", True, "float32")).__dlpack__(dl_device=(2, 0))


# --- what each framework does (docs/FRAMEWORKS.md, "DLPack and zero-copy") -----------------------

#: how -> dtype ("*": any other) -> outcome per column (mmap, 64-byte aligned). "refuses" means the call
#: raises; every other call is checked by pointer equality.
TABLE = {
    "jnp.from_dlpack(tl.to_dlpack(a))": {"*": ["refuses", "refuses", "aliases", "copies"]},
    "jax.device_put(a)": {"*": ["aliases", "copies", "aliases", "copies"]},
    "jnp.asarray(a)": {"*": ["copies"] * 4},
    "jnp.array(a)": {"*": ["copies"] * 4},
    "jnp.from_dlpack(a)": {"float32": ["refuses", "refuses", "aliases", "copies"], "*": ["refuses"] * 4},
    "torch.from_dlpack(tl.to_dlpack(a))": {"*": ["aliases"] * 4},
    "mx.array(tl.to_dlpack(a))": {"*": ["copies"] * 4, "float8_e4m3fn": ["refuses"] * 4},
    "mx.from_dlpack(tl.to_dlpack(a))": {"*": ["copies"] * 4, "float8_e4m3fn": ["refuses"] * 4},
    "mx.array(a)": {"*": ["copies"] * 4, "float8_e4m3fn": ["refuses"] * 4},
}
FRAMEWORK = {"jnp": "jax", "jax": "jax", "torch": "torch", "mx": "mlx.core"}
#: JAX 0.12 (0.10.2 does not) asks for DLPack 1.x (``max_version``): it then takes read-only views (its arrays are
#: immutable) and numpy arrays of any dtype, aliasing where 64-byte aligned. The rows above are JAX 0.10's
#: (CI's Python 3.11 runs jax 0.10.2, 3.12 and 3.13 jax 0.12).
TABLE_JAX_DLPACK_1 = {
    "jnp.from_dlpack(tl.to_dlpack(a))": {"*": ["aliases", "copies", "aliases", "copies"]},
    "jnp.from_dlpack(a)": {"*": ["aliases", "copies", "aliases", "copies"]},
}


def _jax_asks_dlpack_1() -> bool:
    """Whether ``jnp.from_dlpack`` passes ``max_version`` to ``__dlpack__`` (asked of a probe, not guessed)."""
    jnp = pytest.importorskip("jax.numpy", reason="needs jax (pip install 'tensorlist[test]')")
    seen = {}

    class Probe:
        def __dlpack_device__(self):
            return (1, 0)

        def __dlpack__(self, **kwargs):
            seen.update(kwargs)
            raise BufferError("probe")

    with pytest.raises(BufferError, match="probe"):
        jnp.from_dlpack(Probe())
    return seen.get("max_version") is not None


def _convert(how: str, a):
    name = FRAMEWORK[how.split(".")[0]]
    mod = pytest.importorskip(name, reason=f"the {name} rows of the DLPack table need {name.split('.')[0]} "
                              "(pip install 'tensorlist[test]')")
    if name == "jax":
        jnp = pytest.importorskip("jax.numpy", reason="jax without jax.numpy")
        x = {"jnp.from_dlpack(tl.to_dlpack(a))": lambda: jnp.from_dlpack(tl.to_dlpack(a)),
             "jax.device_put(a)": lambda: mod.device_put(a),
             "jnp.asarray(a)": lambda: jnp.asarray(a),
             "jnp.array(a)": lambda: jnp.array(a),
             "jnp.from_dlpack(a)": lambda: jnp.from_dlpack(a)}[how]()
        return x.unsafe_buffer_pointer()
    if name == "torch":
        return mod.from_dlpack(tl.to_dlpack(a)).data_ptr()
    x = {"mx.array(tl.to_dlpack(a))": lambda: mod.array(tl.to_dlpack(a)),
         "mx.from_dlpack(tl.to_dlpack(a))": lambda: mod.from_dlpack(tl.to_dlpack(a)),
         "mx.array(a)": lambda: mod.array(a)}[how]()
    return capsule_info(x.__dlpack__())["data"]


def _torch_takes_dlpack_float8() -> bool:
    """Whether this torch imports a DLPack float8 tensor (torch 2.13 does; 2.8, the 3.9 leg's, raises
    "Unsupported code 10"): asked of a writable float8 array, not guessed from the version."""
    torch = pytest.importorskip("torch", reason="the torch row of the DLPack table needs torch")
    try:
        torch.from_dlpack(tl.to_dlpack(np.zeros(4, ml_dtypes.float8_e4m3fn)))
    except RuntimeError as e:
        assert "Unsupported code" in str(e), e
        return False
    return True


@pytest.mark.parametrize("how,column,dtype,want", list(cells(TABLE)))
def test_the_framework_table(files, how, column, dtype, want):
    mode, aligned = COLUMNS[column]
    if how.startswith("torch.") and dtype.startswith("float8") and not _torch_takes_dlpack_float8():
        want = "refuses"
    if how in TABLE_JAX_DLPACK_1 and _jax_asks_dlpack_1():
        row = TABLE_JAX_DLPACK_1[how]
        want = row.get(dtype, row["*"])[column]
    a = view(files, mode, aligned, dtype)
    if want == "refuses":
        with pytest.raises(Exception) as e:
            _convert(how, a)
        if how == "jnp.from_dlpack(tl.to_dlpack(a))":  # ours, naming the way out
            assert e.type is BufferError and 'mmap="copy"' in str(e.value)
        return
    got = _convert(how, a)
    assert (got == a.ctypes.data) == (want == "aliases"), (how, mode, aligned, dtype)


def test_a_jax_array_over_a_copy_view_sees_numpy_writes(files):
    """Aliasing for real: JAX assumes immutability, the copy-on-write pages are this process's to change."""
    jnp = pytest.importorskip("jax.numpy", reason="needs jax (pip install 'tensorlist[test]')")
    a = tl.load(files[True], mmap="copy")["float32"]
    x = jnp.from_dlpack(tl.to_dlpack(a))
    a[0] = 42
    assert float(x[0]) == 42.0
    assert tl.load(files[True])["float32"][0] == 0  # and the file never changed


@pytest.mark.slow
def test_torch_writing_a_tensor_over_read_only_pages_kills_the_process(tmp_path):
    """torch ignores DLPack's READ_ONLY flag: the reason the docs say mmap="copy" for torch."""
    pytest.importorskip("torch", reason="the torch row of the DLPack table needs torch")
    script = ("import numpy as np, sys, torch, tensorlist as tl\n"
              "tl.save(sys.argv[1], {'a': np.ones(4, np.float32)})\n"
              "t = torch.from_dlpack(tl.to_dlpack(tl.load(sys.argv[1])['a']))\n"
              "assert not t.is_inference()\n"
              "t[0] = 5\n")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "t.tl")], capture_output=True, timeout=120)
    if not NUMPY_VERSIONED:  # numpy < 2.1 exports legacy capsules only: to_dlpack refuses the read-only view first
        assert out.returncode == 1 and b'load it with mmap="copy"' in out.stderr, out.stderr[-2000:]
        return
    assert out.returncode < 0, "torch now honours READ_ONLY: update docs/FRAMEWORKS.md's torch row"


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c8", "<f4" if sys.byteorder == "big" else ">u2"])
def test_an_array_in_the_other_byte_order_is_refused_by_name_or_copied_converted(dtype):
    """A file's little-endian values on a big-endian host (here: big-endian values on this host) are not native."""
    a = np.arange(6).astype(dtype).reshape(2, 3)
    with pytest.raises(BufferError, match=r"not in this host's byte order .* copy=True"):
        np.from_dlpack(tl.to_dlpack(a))
    got = np.from_dlpack(tl.to_dlpack(a, copy=True))
    assert got.dtype.isnative and np.array_equal(got, a) and got.dtype == a.dtype.newbyteorder("=")
