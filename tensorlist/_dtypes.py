"""The single dtype table: torch ScalarType codes <-> numpy/ml_dtypes <-> names.

``dataType`` in a descriptor is the raw value of PyTorch's ``c10::ScalarType``
enum, as lamp writes it. Only the codes that numpy (with ml_dtypes) can
represent with a fixed whole-byte itemsize are supported; every other code is
reported as unknown or unsupported by name.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Dict, Optional

import ml_dtypes
import numpy as np

__all__ = [
    "NATIVE_LITTLE",
    "is_little",
    "as_little",
    "DType",
    "DTYPES",
    "from_code",
    "from_numpy",
    "from_name",
    "UNSUPPORTED_CODES",
]


#: The host's byte order: the one place the Python layer asks it (the stored
#: bytes are little-endian, docs/FORMAT.md). Read at each use, so a test can set
#: it False and run a big-endian host's branches on any machine.
NATIVE_LITTLE = sys.byteorder == "little"


def is_little(dt: np.dtype) -> bool:
    """Whether arrays of numpy dtype ``dt`` already hold the stored (little-endian) bytes.

    ``<`` and ``|`` (one-byte items) do, ``=`` (native) does on a
    little-endian host, ``>`` never does; a complex dtype's order is its parts'.
    Every writer that decides whether to byte-swap asks here.
    """
    order = dt.byteorder
    return order == "<" or order == "|" or (order == "=" and NATIVE_LITTLE) or dt.itemsize == 1


def as_little(a: np.ndarray) -> np.ndarray:
    """``a`` itself when it holds little-endian bytes (:func:`is_little`), else a little-endian copy.

    The copy swaps bytes (``byteswap``, per part for complex) and relabels the
    order, rather than asking numpy to convert values: so it follows this
    module's answer about the host, never changes ``a``, and keeps the values.
    """
    if is_little(a.dtype):
        return a
    return a.byteswap().view(a.dtype.newbyteorder("<"))


@dataclass(frozen=True)
class DType:
    """One row of the dtype table.

    Attributes:
        code: torch ScalarType code stored in ``dataType``.
        name: canonical framework-agnostic name (torch's, without ``torch.``).
        numpy: the little-endian numpy dtype of the stored bytes.
    """

    code: int
    name: str
    numpy: np.dtype

    @property
    def itemsize(self) -> int:
        return self.numpy.itemsize


def _row(code: int, name: str, dt) -> DType:
    return DType(code, name, np.dtype(dt).newbyteorder("<") if np.dtype(dt).itemsize > 1 else np.dtype(dt))


# Ordered by code. lamp itself writes 0-7, 11 and 15.
DTYPES: tuple = (
    _row(0, "uint8", np.uint8),
    _row(1, "int8", np.int8),
    _row(2, "int16", np.int16),
    _row(3, "int32", np.int32),
    _row(4, "int64", np.int64),
    _row(5, "float16", np.float16),
    _row(6, "float32", np.float32),
    _row(7, "float64", np.float64),
    _row(9, "complex64", np.complex64),
    _row(10, "complex128", np.complex128),
    _row(11, "bool", np.bool_),
    _row(15, "bfloat16", ml_dtypes.bfloat16),
    _row(23, "float8_e5m2", ml_dtypes.float8_e5m2),
    _row(24, "float8_e4m3fn", ml_dtypes.float8_e4m3fn),
    _row(25, "float8_e5m2fnuz", ml_dtypes.float8_e5m2fnuz),
    _row(26, "float8_e4m3fnuz", ml_dtypes.float8_e4m3fnuz),
    _row(27, "uint16", np.uint16),
    _row(28, "uint32", np.uint32),
    _row(29, "uint64", np.uint64),
    _row(44, "float8_e8m0fnu", ml_dtypes.float8_e8m0fnu),
)

# torch codes that exist but have no whole-byte numpy representation.
UNSUPPORTED_CODES: Dict[int, str] = {
    8: "complex32 (ComplexHalf)",
    12: "qint8",
    13: "quint8",
    14: "qint32",
    16: "quint4x2",
    17: "quint2x4",
    18: "bits1x8",
    19: "bits2x4",
    20: "bits4x2",
    21: "bits8",
    22: "bits16",
    **{30 + i: f"uint{i + 1}" for i in range(7)},
    **{37 + i: f"int{i + 1}" for i in range(7)},
    45: "float4_e2m1fn_x2",
}

_BY_CODE: Dict[int, DType] = {d.code: d for d in DTYPES}
_BY_NAME: Dict[str, DType] = {d.name: d for d in DTYPES}
# numpy dtypes compare equal across byte orders only when native; key on (kind-insensitive) native form.
_BY_NUMPY: Dict[np.dtype, DType] = {d.numpy.newbyteorder("="): d for d in DTYPES}


def from_code(code: int) -> Optional[DType]:
    """The row for a ``dataType`` code, or None when it is not supported (any value: a file's too)."""
    try:
        return _BY_CODE.get(code)
    except TypeError:  # unhashable: a list or an object where a code belongs
        return None


def from_name(name: str) -> DType:
    """The row for a canonical name such as ``"bfloat16"``; KeyError if unknown (any value: a file's too)."""
    try:
        return _BY_NAME[name]
    except TypeError:  # unhashable: a list or an object where a name belongs
        raise KeyError(name) from None


def from_numpy(dtype) -> DType:
    """The row for a numpy dtype of either byte order.

    Raises:
        TypeError: the dtype has no tensorlist code (object, strings, structured...).
    """
    dt = np.dtype(dtype)
    row = _BY_NUMPY.get(dt.newbyteorder("=")) if dt.fields is None else None
    if row is None:
        raise TypeError(f"numpy dtype {dt!r} has no tensorlist dataType code; supported: "
                        + ", ".join(d.name for d in DTYPES))
    return row
