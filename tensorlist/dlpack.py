"""Handing a loaded tensor to any DLPack consumer, with numpy alone: :func:`to_dlpack`.

``to_dlpack(array)`` wraps a numpy array (a view of a mapped file, as
``tensorlist.load`` returns) in a small object that speaks the DLPack protocol
(``__dlpack__`` and ``__dlpack_device__``), so that ``jax.numpy.from_dlpack``,
``torch.from_dlpack``, ``mlx.core.array``... take it without going through a
numpy copy, and without tensorlist importing any framework. What each
framework then does (aliases the file's pages or copies them) is measured in
docs/FRAMEWORKS.md, "DLPack and zero-copy", and checked by tests/adapters/test_dlpack.py.

The protocol, in order:

1. A consumer that announces ``max_version`` (DLPack 1.x, "versioned"
   capsules) gets numpy's versioned export; a read-only view is exported
   flagged ``READ_ONLY`` (the consumer decides what it does with the flag:
   torch ignores it, see the table).
2. A consumer of the legacy protocol (no ``max_version``: JAX asks so) gets a
   legacy capsule, which cannot say "read-only". A writable array (loaded with
   ``mmap="copy"`` or ``mmap=False``) is exported as it is. A read-only view is
   refused with a BufferError that says to load with ``mmap="copy"``, unless
   the caller asked for a copy (``to_dlpack(a, copy=True)``, or a consumer
   passing ``copy=True``): then one 64-byte aligned private copy is exported.
   tensorlist never copies unasked.

bfloat16 and the float8 types (ml_dtypes arrays, which numpy's own exporter
refuses) are exported as numpy exports the unsigned integers of their width,
with the capsule's type code then set to DLPack's (``kDLBfloat``,
``kDLFloat8_*``, DLPack 1.1): the same bytes, no copy.

Imports numpy, ``ctypes`` (which numpy imports already: the DLPack structs
cost nothing at import) and ``lowlevel`` (its ``alloc``) only.
"""
from __future__ import annotations

import ctypes
from typing import Optional, Tuple

import numpy as np

from tensorlist._base import lowlevel
from tensorlist._base.dtypes import BITS_KEY

__all__ = ["DLPackExport", "to_dlpack", "LEGACY_READ_ONLY_MESSAGE"]

#: The DLPack version whose versioned capsules (with their READ_ONLY flag) are asked of numpy first.
VERSIONED = (1, 0)

#: DLDataTypeCode of dlpack.h (DLPack 1.1) for the dtypes numpy's exporter does not know, by ml_dtypes name.
_ML_CODES = {
    "bfloat16": 4,          # kDLBfloat
    "float8_e3m4": 7,
    "float8_e4m3": 8,
    "float8_e4m3b11fnuz": 9,
    "float8_e4m3fn": 10,
    "float8_e4m3fnuz": 11,
    "float8_e5m2": 12,
    "float8_e5m2fnuz": 13,
    "float8_e8m0fnu": 14,
}
#: ``dtype.isbuiltin`` of a dtype registered from outside numpy (ml_dtypes' kinds vary: float8_e5m2 says "f").
_USER_DTYPE = 2
#: The float8 codes (7 and up) are DLPack 1.1's: a versioned capsule carrying one says 1.1.
_FLOAT8_FIRST_CODE, _FLOAT8_MINOR = 7, 1

LEGACY_READ_ONLY_MESSAGE = (
    "this consumer asks for a legacy DLPack capsule (no max_version), which cannot mark a tensor read-only, "
    "and the array is a read-only view of a mapped file: load it with mmap=\"copy\" (writable copy-on-write "
    "views, still zero-copy), or ask for a copy with tensorlist.to_dlpack(array, copy=True)"
)


class DLPackExport:
    """A numpy array offered to a DLPack consumer (what :func:`to_dlpack` returns).

    Holds the array (so the mapping stays alive as long as this object, and
    each capsule made from it holds the array itself).

    Args:
        array: the numpy array to export.
        copy: with a legacy consumer and a read-only array, export a private
            copy instead of refusing.
    """

    __slots__ = ("array", "copy")

    def __init__(self, array: np.ndarray, *, copy: bool = False):
        if not isinstance(array, np.ndarray):
            raise TypeError(f"to_dlpack takes a numpy array, not {type(array).__name__}")
        if not isinstance(copy, bool):
            raise TypeError(f"copy must be a bool, not {type(copy).__name__}")
        carried = (array.dtype.metadata or {}).get(BITS_KEY)
        if carried is not None:  # a bit carrier (float4_e2m1fn_x2's packed pairs): no DLPack type says what
            raise TypeError(f"to_dlpack: a {carried} array has no DLPack type (export its bytes: a.view(np.uint8))")
        self.array = array
        self.copy = copy

    def __dlpack_device__(self) -> Tuple[int, int]:
        return self.array.__dlpack_device__()

    def __dlpack__(self, *, stream=None, max_version: Optional[Tuple[int, int]] = None, dl_device=None,
                   copy: Optional[bool] = None):
        a = self.array
        if not a.dtype.isnative:  # numpy's own refusal names nothing; a copy converts
            if not (self.copy or copy is True):
                raise BufferError(NON_NATIVE_MESSAGE)
            a = _private_copy(a)
        elif copy is True:
            a = _private_copy(a)
        code = _ML_CODES.get(a.dtype.name) if a.dtype.isbuiltin == _USER_DTYPE else None
        src = a.view(f"u{a.dtype.itemsize}") if code is not None else a
        if max_version is not None and tuple(max_version) >= VERSIONED:
            try:
                capsule = src.__dlpack__(stream=stream, max_version=max_version, dl_device=dl_device,
                                         copy=False if copy is True else copy)
            except TypeError:  # a numpy without versioned export (numpy 1.x): the legacy protocol below
                pass
            else:
                return _retyped(capsule, code) if code is not None else capsule
        if dl_device is not None and tuple(dl_device) != tuple(a.__dlpack_device__()):
            raise BufferError(f"cannot export to device {tuple(dl_device)}: the array is on the CPU")
        if not a.flags.writeable:
            if not self.copy:
                raise BufferError(LEGACY_READ_ONLY_MESSAGE)
            a = _private_copy(a)
            src = a.view(f"u{a.dtype.itemsize}") if code is not None else a
        capsule = src.__dlpack__(stream=stream)
        return _retyped(capsule, code) if code is not None else capsule

    def __repr__(self) -> str:
        return (f"<tensorlist.DLPackExport {self.array.dtype.name}{list(self.array.shape)}"
                f"{'' if self.array.flags.writeable else ', read-only'}>")


def to_dlpack(array: np.ndarray, *, copy: bool = False) -> DLPackExport:
    """Offers a numpy array (a loaded tensor) to any DLPack consumer, zero-copy where the consumer allows.

    Args:
        array: a numpy array, typically a view of a file loaded by
            ``tensorlist.load`` (read-only with ``mmap=True``, writable with
            ``mmap="copy"``); bfloat16 and float8 included.
        copy: a consumer speaking only the legacy protocol cannot receive a
            read-only array; with ``copy=True`` it gets one private (64-byte
            aligned) copy instead of a BufferError. Default False: never a
            copy unasked.

    Returns:
        A :class:`DLPackExport`: pass it to ``jax.numpy.from_dlpack``,
        ``torch.from_dlpack``, ``mlx.core.array``...; TensorFlow takes a
        capsule: ``tf.experimental.dlpack.from_dlpack(x.__dlpack__())``.

    Raises:
        TypeError: ``array`` is not a numpy array.

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tl")
        >>> tensorlist.save(path, {"w": np.arange(4, dtype=np.float32)})
        >>> w = tensorlist.load(path, mmap="copy")["w"]
        >>> same = np.from_dlpack(tensorlist.to_dlpack(w))
        >>> same.ctypes.data == w.ctypes.data
        True
    """
    return DLPackExport(array, copy=copy)


def _private_copy(a: np.ndarray) -> np.ndarray:
    """A writable C-contiguous copy of ``a`` in 64-byte aligned memory (XLA aliases only such buffers).

    The copy is in the host's byte order (DLPack has no other): a file's
    little-endian values on a big-endian host are converted.
    """
    dt = a.dtype if a.dtype.isnative else a.dtype.newbyteorder("=")
    out = lowlevel.alloc(a.nbytes).view(dt).reshape(a.shape) if a.size else np.empty(a.shape, dt)
    out[...] = a
    return out


NON_NATIVE_MESSAGE = (
    "the array's bytes are not in this host's byte order (a file's little-endian values on a big-endian "
    "host) and DLPack shares native values only: ask for a converted copy with tensorlist.to_dlpack(array, "
    "copy=True)"
)


def _retyped(capsule, code: int):
    """Sets the type code of an unconsumed DLPack capsule that numpy made over unsigned integers of that width.

    Safety: the capsule must be numpy's, not yet consumed; its DLManagedTensor
    (numpy's own allocation) is changed in place, its deleter kept.
    """
    api = ctypes.pythonapi
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if api.PyCapsule_IsValid(capsule, b"dltensor_versioned"):
        managed = _ManagedVersioned.from_address(api.PyCapsule_GetPointer(capsule, b"dltensor_versioned"))
        if code >= _FLOAT8_FIRST_CODE:
            managed.version.minor = max(managed.version.minor, _FLOAT8_MINOR)
        tensor = managed.dl_tensor
    elif api.PyCapsule_IsValid(capsule, b"dltensor"):
        tensor = _Managed.from_address(api.PyCapsule_GetPointer(capsule, b"dltensor")).dl_tensor
    else:
        raise BufferError("numpy returned no unconsumed DLPack capsule")
    tensor.dtype.code = code
    return capsule


# The DLPack structs of dlpack.h (1.x), to retype a capsule numpy made (:func:`_retyped`).


class _Device(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _Tensor(ctypes.Structure):
    """DLTensor."""

    _fields_ = [("data", ctypes.c_void_p), ("device", _Device), ("ndim", ctypes.c_int32), ("dtype", _DataType),
                ("shape", ctypes.c_void_p), ("strides", ctypes.c_void_p), ("byte_offset", ctypes.c_uint64)]


class _Managed(ctypes.Structure):
    """DLManagedTensor: the legacy capsule's (``"dltensor"``)."""

    _fields_ = [("dl_tensor", _Tensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _ManagedVersioned(ctypes.Structure):
    """DLManagedTensorVersioned: the versioned capsule's (``"dltensor_versioned"``)."""

    _fields_ = [("version", _Version), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _Tensor)]

