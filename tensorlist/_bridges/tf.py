"""The only TensorFlow <-> numpy conversion of the package (a leaf: imports tensorflow, numpy, ``_base.dtypes``).

What TensorFlow 2.21 does, measured, and what follows here:

- ``tf.constant(a)`` and ``tf.convert_to_tensor(a)`` always copy.
- ``tf.experimental.dlpack.from_dlpack(a.__dlpack__())`` aliases ``a``'s
  memory, but only for a **writable** array: numpy refuses to export a
  read-only one through the legacy protocol, and TensorFlow does not take the
  versioned capsule that carries the read-only flag. Over a copy-on-write
  mapping (``tensorlist.load(path, mmap="copy")``) the tensors are zero-copy and
  the file never changes; a read-only array is copied (``tf.constant``).
- TensorFlow's kernels need 64-byte aligned data (:data:`TF_ALIGNMENT`); a
  less aligned DLPack tensor is accepted, then **aborts the process** at its
  first op. Less aligned arrays (files saved with ``alignment`` < 64) are
  copied.
- DLPack has no bfloat16 or float8 code that numpy exports: bfloat16 crosses
  as its ``uint16`` bits and is re-typed by ``tf.bitcast``, which shares the
  buffer (zero-copy too). ``tf.bitcast`` refuses the float8 types, so float8
  tensors are made by ``tf.constant`` from ml_dtypes arrays (a copy).
  TensorFlow has no ``float8_e8m0fnu``: refused, naming the tensor.
- Saving: ``t.numpy()`` copies; a CPU tensor exported with
  ``tf.experimental.dlpack.to_dlpack`` is read by numpy in place (bfloat16
  through ``tf.bitcast`` to ``uint16``), so saving converts without a copy.
  A ``tf.Variable`` is read with ``read_value()`` (which shares its buffer).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import numpy as np
import tensorflow as tf

from tensorlist._base import dtypes as _dtypes

__all__ = ["is_tensor", "refusal", "to_numpy", "from_numpy", "tf_dtype", "state_to_numpy", "HELD", "address", "TF_ALIGNMENT"]

_F8 = ("float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz")
_PLAIN = ("uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32",
          "float64", "complex64", "complex128", "bool")

#: tensorlist dtype name -> TensorFlow dtype, for every row of the table TensorFlow can hold.
HELD: Dict[str, "tf.DType"] = {
    **{name: tf.as_dtype(name) for name in _PLAIN},
    "bfloat16": tf.bfloat16,
    **{name: getattr(tf.dtypes.experimental, name) for name in _F8},
}
_BY_TF = {v: k for k, v in HELD.items()}
#: Dtypes that cross by DLPack (numpy exports them), and those re-typed from their bits by tf.bitcast.
_DLPACK = frozenset(_PLAIN)
_BITCAST = {"bfloat16": (np.uint16, tf.uint16)}
#: The alignment TensorFlow's kernels CHECK (``Tensor::CheckTypeAndIsAligned``, EIGEN_MAX_ALIGN_BYTES): a
#: DLPack tensor at a less aligned address is taken without complaint, then aborts the process at its first
#: op (``Check failed: IsAligned()``, measured at 8, 16 and 32 bytes). tensorlist's default alignment is 64.
TF_ALIGNMENT = 64


class _Capsule:
    """A DLPack capsule TensorFlow exported, as the object ``np.from_dlpack`` asks for (CPU)."""

    def __init__(self, capsule) -> None:
        self._capsule = capsule

    def __dlpack__(self, **_):
        return self._capsule

    def __dlpack_device__(self):
        return (1, 0)  # kDLCPU


def is_tensor(value) -> bool:
    return isinstance(value, (tf.Tensor, tf.Variable))


def refusal(name: str) -> Optional[str]:
    """Why TensorFlow cannot hold tensorlist dtype ``name``, or None when it can."""
    return None if name in HELD else f"TensorFlow has no {name} type"


def tf_dtype(name: str) -> "tf.DType":
    """The TensorFlow dtype of a tensorlist dtype name; TypeError when TensorFlow has none."""
    why = refusal(name)
    if why is not None:
        raise TypeError(f"dtype {name}: {why}")
    return HELD[name]


def _on_cpu(t: "tf.Tensor") -> "tf.Tensor":
    device = getattr(t, "device", "") or ""
    if "CPU" in device.upper() or not device:
        return t
    with tf.device("CPU:0"):
        return tf.identity(t)


def to_numpy(t, where: str = "tensor") -> np.ndarray:
    """A numpy array with the tensor's dtype (bfloat16/float8 via ml_dtypes) and values.

    Zero-copy for a CPU tensor of a DLPack dtype or bfloat16 (the array holds
    the tensor's buffer alive); float8 tensors and tensors on another device
    are copied.

    Raises:
        TypeError: not a dense tensor, or a dtype the table lacks (naming ``where``).
    """
    if isinstance(t, tf.Variable):
        t = t.read_value()
    if not isinstance(t, tf.Tensor):
        kind = type(t).__name__
        hint = " (call tf.sparse.to_dense or .to_tensor() first)" if kind in ("SparseTensor", "RaggedTensor") else ""
        raise TypeError(f"{where}: expected a tf.Tensor or tf.Variable, got {kind}{hint}")
    name = _BY_TF.get(t.dtype)
    if name is None:
        raise TypeError(f"{where}: TensorFlow dtype {t.dtype.name} has no tensorlist dataType code")
    t = _on_cpu(t)
    if name in _DLPACK:
        return np.from_dlpack(_Capsule(tf.experimental.dlpack.to_dlpack(t)))
    if name in _BITCAST:
        np_bits, tf_bits = _BITCAST[name]
        bits = np.from_dlpack(_Capsule(tf.experimental.dlpack.to_dlpack(tf.bitcast(t, tf_bits))))
        return bits.view(_dtypes.from_name(name).numpy)
    return t.numpy()


def from_numpy(a: np.ndarray, where: str = "tensor") -> "tf.Tensor":
    """A tf.Tensor of ``a``: aliasing it when writable, C-contiguous and 64-byte aligned (DLPack), else a copy.

    Safety: an aliased tensor shares ``a``'s memory (DLPack keeps ``a`` alive);
    TensorFlow never writes into it, but a write into ``a`` shows in the tensor.

    Raises:
        TypeError: TensorFlow cannot hold ``a``'s dtype (float8_e8m0fnu), naming ``where``.
    """
    row = _dtypes.from_numpy(a.dtype)
    why = refusal(row.name)
    if why is not None:
        raise TypeError(f"{where}: {why}")
    if not a.dtype.isnative and a.dtype.itemsize > 1:
        a = _native(a)
    if a.flags.writeable and a.flags.c_contiguous and a.size and a.ctypes.data % TF_ALIGNMENT == 0:
        if row.name in _DLPACK:
            return tf.experimental.dlpack.from_dlpack(a.__dlpack__())
        if row.name in _BITCAST:
            np_bits, tf_bits = _BITCAST[row.name]
            bits = tf.experimental.dlpack.from_dlpack(a.view(np_bits).__dlpack__())
            return tf.bitcast(bits, HELD[row.name])
    return tf.constant(a, dtype=HELD[row.name])


def _native(a: np.ndarray) -> np.ndarray:
    """``a`` in the host's byte order (a copy), swapping through unsigned-integer views (as ``_base.dtypes.as_little``)."""
    part = a.dtype.itemsize // 2 if a.dtype.kind == "c" else a.dtype.itemsize
    flat = np.ascontiguousarray(a).reshape(-1).view(np.dtype(f"u{part}").newbyteorder(a.dtype.byteorder))
    return flat.astype(f"=u{part}").view(a.dtype.newbyteorder("=")).reshape(a.shape)


def address(t) -> int:
    """The address of a CPU tensor's first byte (zero-copy checks): DLPack dtypes and bfloat16, Variables too."""
    if isinstance(t, tf.Variable):
        t = t.read_value()
    name = _BY_TF.get(t.dtype)
    if name in _BITCAST:
        t = tf.bitcast(t, _BITCAST[name][1])
    elif name not in _DLPACK:
        raise TypeError(f"TensorFlow exports no DLPack tensor of dtype {t.dtype.name}")
    return np.from_dlpack(_Capsule(tf.experimental.dlpack.to_dlpack(t))).ctypes.data


def state_to_numpy(tensors: Mapping[str, object]) -> Dict[str, np.ndarray]:
    """A dict of tf.Tensors/tf.Variables as numpy arrays (zero-copy where :func:`to_numpy` is), by name."""
    return {k: to_numpy(v, f"tensor {k!r}") for k, v in tensors.items()}
