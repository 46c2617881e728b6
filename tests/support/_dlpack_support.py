"""Shared by test_dlpack.py and test_dlpack_tf.py: the files of the DLPack table and a capsule reader.

Files are saved twice: with the default 64-byte alignment, and with alignment=8 behind a 4-byte
tensor, so that every tensor after it starts 8 bytes past a 64-byte boundary.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import tensorlist as tl

#: DLDataTypeCode (dlpack.h 1.1) and DLPACK_FLAG_BITMASK_READ_ONLY.
K_DL_UINT, K_DL_FLOAT, K_DL_BFLOAT, READ_ONLY = 1, 2, 4, 1
#: mmap mode, 64-byte aligned: the four columns of the table.
COLUMNS = [(True, True), (True, False), ("copy", True), ("copy", False)]
DTYPES = ["float32", "bfloat16", "float8_e4m3fn"]


def tensors():
    return {
        "pad": np.zeros(1, np.float32),  # with alignment=8, puts every later tensor 8 bytes past 64
        "float32": np.arange(64, dtype=np.float32),
        "bfloat16": np.arange(64).astype(ml_dtypes.bfloat16),
        "float8_e4m3fn": np.arange(64).astype(ml_dtypes.float8_e4m3fn),
        "float8_e5m2": np.arange(64).astype(ml_dtypes.float8_e5m2),
    }


def _numpy_exports_versioned() -> bool:
    try:
        np.ones(1).__dlpack__(max_version=(1, 0))
    except TypeError:
        return False
    return True


#: numpy 2.1 and later export versioned capsules (``__dlpack__(max_version=...)``); before, only legacy ones,
#: so to_dlpack refuses every read-only view there.
NUMPY_VERSIONED = _numpy_exports_versioned()
needs_versioned = pytest.mark.skipif(not NUMPY_VERSIONED, reason=f"numpy {np.__version__} exports no versioned "
                                     "DLPack capsule (its __dlpack__ takes no max_version: numpy 2.1 does)")


def save_files(root) -> dict:
    """64-byte aligned (True) -> the file saved with alignment=64, and False -> with alignment=8."""
    out = {}
    for aligned, alignment in ((True, 64), (False, 8)):
        out[aligned] = str(root / f"a{alignment}.tl")
        tl.save(out[aligned], tensors(), alignment=alignment)
    return out


def view(files, mode, aligned, dtype):
    a = tl.load(files[aligned], mmap=mode)[dtype]
    assert (a.ctypes.data % 64 == 0) == aligned  # the column is what it says
    assert a.flags.writeable == (mode == "copy")
    return a


# --- a DLPack capsule, read with ctypes (dlpack.h's structs) --------------------------------------

def _api():
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api


def capsule_info(capsule) -> dict:
    """name, data pointer (byte_offset added), type code, bits, flags and version of an unconsumed capsule."""
    api = _api()
    if api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        base = api.PyCapsule_GetPointer(capsule, b"dltensor_versioned")
        major, minor = ctypes.c_uint32.from_address(base).value, ctypes.c_uint32.from_address(base + 4).value
        flags = ctypes.c_uint64.from_address(base + 24).value
        name, tensor = "dltensor_versioned", base + 32
    else:
        assert api.PyCapsule_IsValid(capsule, b"dltensor")
        name, tensor, flags, major, minor = "dltensor", api.PyCapsule_GetPointer(capsule, b"dltensor"), 0, 0, 0
    # DLTensor: data (8), device (8), ndim (4), dtype {code u8, bits u8, lanes u16}, shape, strides, byte_offset
    data = ctypes.c_void_p.from_address(tensor).value or 0
    return {"name": name, "data": data + ctypes.c_uint64.from_address(tensor + 40).value,
            "code": ctypes.c_uint8.from_address(tensor + 20).value,
            "bits": ctypes.c_uint8.from_address(tensor + 21).value, "flags": flags, "version": (major, minor)}


class Capsule:
    """A DLPack producer handing over one capsule made beforehand (numpy consumes only objects)."""

    def __init__(self, capsule):
        self.capsule = capsule

    def __dlpack__(self, **_):
        return self.capsule

    def __dlpack_device__(self):
        return (1, 0)


def cells(table):
    """The pytest params (how, column, dtype, want) of a table how -> dtype ("*": any other) -> outcomes."""
    for how, rows in table.items():
        for column, (mode, aligned) in enumerate(COLUMNS):
            for dtype in DTYPES:
                want = rows.get(dtype, rows["*"])[column]
                if mode is True and "to_dlpack" in how and not NUMPY_VERSIONED:
                    want = "refuses"  # a legacy capsule only: every read-only view is refused
                if want is not None:
                    yield pytest.param(how, column, dtype, want,
                                       id=f"{how}-mmap={mode!r}-{'aligned' if aligned else 'off64'}-{dtype}")
