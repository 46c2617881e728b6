"""The single dtype table: torch ScalarType codes <-> numpy/ml_dtypes <-> names.

``dataType`` in a descriptor is the raw value of PyTorch's ``c10::ScalarType``
enum, as lamp writes it. Only the codes that numpy (with ml_dtypes) can
represent with a fixed whole-byte itemsize are supported; every other code is
reported as unknown or unsupported by name.

ml_dtypes is imported on first need, not with the package: its extension costs
0.5 to 2 s at import (0.7.0), more than everything else ``import tensorlist``
does. A row's code, name and itemsize are known without it (the validator, the
C fast path and ``inspect`` use only those); the numpy dtype of an ml_dtypes
row (``row.numpy``) is resolved when first read, that is when an array of it
is made. A numpy dtype handed in by a caller that is not one of numpy's own
comes from ml_dtypes, which the caller has then already imported, so
:func:`from_numpy` of a builtin dtype never imports it. A row whose type the
installed ml_dtypes lacks (``float8_e8m0fnu`` before 0.5.0) is unsupported at
use: reading ``row.numpy`` raises :class:`~tensorlist.errors.UnsupportedDTypeError`
naming the dtype and the version that has it; everything else works.
"""
from __future__ import annotations

import os
import sys
from typing import Dict, Optional

import numpy as np

from tensorlist.errors import FormatError, UnsupportedDTypeError

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
    "check_held",
    "BITS_KEY",
    "bits_row",
    "bfloat16_bits",
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

    The copy swaps bytes (per part for complex) and relabels the order, rather
    than asking numpy to convert values: so it follows this module's answer
    about the host, never changes ``a``, and keeps the values. It swaps through
    an unsigned-integer view, never the dtype's own ``byteswap``: ml_dtypes
    before 0.5.4 swaps nothing there for bfloat16 and float8.
    """
    dt = a.dtype
    if is_little(dt):
        return a
    part = dt.itemsize // 2 if dt.kind == "c" else dt.itemsize
    if part == 1:
        return a.view(dt.newbyteorder("<"))
    flat = np.ascontiguousarray(a).reshape(-1).view(f"u{part}")  # the same bytes, as whole parts
    return flat.byteswap().view(dt.newbyteorder("<")).reshape(a.shape)


class DType:
    """One row of the dtype table.

    Attributes:
        code: torch ScalarType code stored in ``dataType``.
        name: canonical framework-agnostic name (torch's, without ``torch.``;
            for an ml_dtypes row also the ml_dtypes attribute).
        itemsize: bytes per element.
        ml_dtypes_since: the oldest ml_dtypes release (0.4.0, the declared
            floor, or later) with this type; None for numpy's own types.
        numpy: the little-endian numpy dtype of the stored bytes (an attribute
            set when the row is built for numpy's own types, on first access
            for ml_dtypes rows; ``UnsupportedDTypeError`` when the installed
            ml_dtypes lacks the type).
        bits: the dtype of a *bit carrier* (see :func:`bits_row`): ``numpy``
            for numpy's own types; for an ml_dtypes row the same-size unsigned
            integer, tagged with the row's name in its ``metadata``, so that
            framework bridges (torch, MLX) move bfloat16/float8 bytes without
            importing ml_dtypes and :func:`from_numpy` still finds the row.

    Immutable, compared and hashed by its four fields, as a frozen dataclass
    would be; written out because ``@dataclass`` costs 0.4 to 0.7 ms at import.
    """

    code: int
    name: str
    itemsize: int
    ml_dtypes_since: Optional[str]

    def __init__(self, code: int, name: str, itemsize: int, ml_dtypes_since: Optional[str] = None):
        set_ = object.__setattr__
        set_(self, "code", code)
        set_(self, "name", name)
        set_(self, "itemsize", itemsize)
        set_(self, "ml_dtypes_since", ml_dtypes_since)

    def __setattr__(self, attr, value):
        raise AttributeError(f"cannot assign to field {attr!r}")

    def __delattr__(self, attr):
        raise AttributeError(f"cannot delete field {attr!r}")

    def _key(self):
        return self.code, self.name, self.itemsize, self.ml_dtypes_since

    def __eq__(self, other):
        return self._key() == other._key() if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self):
        return hash(self._key())

    def __repr__(self):
        return (f"{type(self).__qualname__}(code={self.code!r}, name={self.name!r}, itemsize={self.itemsize!r}, "
                f"ml_dtypes_since={self.ml_dtypes_since!r})")

    @property
    def carried(self) -> bool:
        """Whether the type is not one of numpy's own: frameworks take its bytes by view (``bits``)."""
        return self.bits.metadata is not None

    @property
    def supported(self) -> bool:
        """Whether this installation can make arrays of the row (imports ml_dtypes for its rows)."""
        try:
            self.numpy
        except UnsupportedDTypeError:
            return False
        return True

    def __reduce__(self):  # one object per row, and an unpickled row resolves in its own process
        return from_code, (self.code,)


class _LazyDType(DType):
    """An ml_dtypes row not yet resolved: its first ``numpy`` resolves it, and it becomes a plain DType.

    The ``__getattr__`` lives here, not on DType: a class with one makes CPython's
    attribute loads generic for all its instances (``row.numpy`` over 10k rows:
    0.23 ms instead of 0.09), and readers read ``row.numpy`` once per tensor.
    """

    def __getattr__(self, attr):
        # Reached only for attributes the instance lacks: ``numpy``, until resolved.
        if attr != "numpy":
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")
        return _resolve(self)


def _stored(dt: np.dtype) -> np.dtype:
    return dt.newbyteorder("<") if dt.itemsize > 1 else dt


#: The key of a bit carrier's dtype ``metadata``: the table name of the type its bits hold.
BITS_KEY = "tensorlist.dtype"


def _np_row(code: int, name: str, t) -> DType:
    dt = _stored(np.dtype(t))
    row = DType(code, name, dt.itemsize)
    object.__setattr__(row, "numpy", dt)
    object.__setattr__(row, "bits", dt)
    return row


def _carrier_row(code: int, name: str, itemsize: int) -> DType:
    """A row that neither numpy nor ml_dtypes holds with the same bytes: its arrays are always carriers."""
    dt = np.dtype(f"u{itemsize}", metadata={BITS_KEY: name})
    row = DType(code, name, itemsize)
    object.__setattr__(row, "numpy", dt)
    object.__setattr__(row, "bits", dt)
    return row


def _ml_row(code: int, name: str, itemsize: int, since: str) -> DType:
    row = _LazyDType(code, name, itemsize, since)
    object.__setattr__(row, "bits", _stored(np.dtype(f"u{itemsize}", metadata={BITS_KEY: name})))
    return row


# Ordered by code. lamp itself writes 0-7, 11 and 15. An ml_dtypes row names the
# oldest release that has its type, from the declared floor (0.4.0) on: every
# one of them is in 0.4.0 but float8_e8m0fnu, added in 0.5.0 (ml_dtypes'
# release notes, and checked by installing both).
DTYPES: tuple = (
    _np_row(0, "uint8", np.uint8),
    _np_row(1, "int8", np.int8),
    _np_row(2, "int16", np.int16),
    _np_row(3, "int32", np.int32),
    _np_row(4, "int64", np.int64),
    _np_row(5, "float16", np.float16),
    _np_row(6, "float32", np.float32),
    _np_row(7, "float64", np.float64),
    _np_row(9, "complex64", np.complex64),
    _np_row(10, "complex128", np.complex128),
    _np_row(11, "bool", np.bool_),
    _ml_row(15, "bfloat16", 2, "0.4.0"),
    _ml_row(23, "float8_e5m2", 1, "0.4.0"),
    _ml_row(24, "float8_e4m3fn", 1, "0.4.0"),
    _ml_row(25, "float8_e5m2fnuz", 1, "0.4.0"),
    _ml_row(26, "float8_e4m3fnuz", 1, "0.4.0"),
    _np_row(27, "uint16", np.uint16),
    _np_row(28, "uint32", np.uint32),
    _np_row(29, "uint64", np.uint64),
    _ml_row(44, "float8_e8m0fnu", 1, "0.5.0"),
    # two float4_e2m1fn values a byte, the first in the low nibble (torch's and safetensors' F4 order);
    # ml_dtypes' float4_e2m1fn holds one value a byte, so numpy gets the packed bytes (a carrier)
    _carrier_row(45, "float4_e2m1fn_x2", 1),
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
}

_BY_CODE: Dict[int, DType] = {d.code: d for d in DTYPES}
_BY_NAME: Dict[str, DType] = {d.name: d for d in DTYPES}
_ML_ROWS = tuple(d for d in DTYPES if d.ml_dtypes_since is not None)
# numpy dtypes compare equal across byte orders only when native; key on the native form.
# ml_dtypes rows join when resolved.
_BY_NUMPY: Dict[np.dtype, DType] = {d.numpy.newbyteorder("="): d for d in DTYPES if not d.carried}


def _resolve(row: DType) -> np.dtype:
    """Sets (and returns) ``row.numpy`` from ml_dtypes, importing it; the one place a row meets ml_dtypes."""
    try:
        import ml_dtypes
    except ImportError:
        ml_dtypes = None
    t = getattr(ml_dtypes, row.name, None)
    if t is None:
        have = (f"ml_dtypes {getattr(ml_dtypes, '__version__', '?')} is installed" if ml_dtypes is not None
                else "ml_dtypes is not installed")
        raise UnsupportedDTypeError(f"dtype {row.name} (dataType {row.code}) needs ml_dtypes >= "
                                    f"{row.ml_dtypes_since}, but {have} (pip install 'ml_dtypes>="
                                    f"{row.ml_dtypes_since}')", dtype=row.name)
    dt = _stored(np.dtype(t))
    object.__setattr__(row, "numpy", dt)
    object.__setattr__(row, "__class__", DType)  # resolved: an ordinary row, the same object
    _BY_NUMPY[dt.newbyteorder("=")] = row
    return dt


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
    """The row for a numpy dtype of either byte order (or anything ``np.dtype`` takes, or a table name).

    A dtype that is not one of numpy's own can only be an ml_dtypes type, so
    ml_dtypes rows are resolved only when ml_dtypes is already imported: a
    builtin dtype never imports it.

    Raises:
        TypeError: the dtype has no tensorlist code (object, strings, structured...).
    """
    if isinstance(dtype, str) and dtype in _BY_NAME:  # "bfloat16" works before ml_dtypes registers the name
        return _BY_NAME[dtype]
    dt = np.dtype(dtype)
    carried = bits_row(dt)
    if carried is not None:
        return carried
    if dt.fields is not None:
        row = None
    else:
        key = dt.newbyteorder("=")
        row = _BY_NUMPY.get(key)
        if row is None and "ml_dtypes" in sys.modules:
            for ml_row in _ML_ROWS:
                if "numpy" not in ml_row.__dict__:
                    ml_row.supported  # resolves it, or leaves it unsupported
            row = _BY_NUMPY.get(key)
    if row is None:
        raise TypeError(f"numpy dtype {dt!r} has no tensorlist dataType code; supported: "
                        + ", ".join(d.name for d in DTYPES))
    return row


def bits_row(dt: np.dtype) -> Optional[DType]:
    """The row whose bits a carrier dtype holds (``row.bits`` of an ml_dtypes row), else None.

    A carrier compares equal to its plain unsigned integer dtype, so every
    lookup keyed by dtype asks here first.
    """
    meta = dt.metadata
    if meta is None or BITS_KEY not in meta:
        return None
    row = _BY_NAME.get(meta[BITS_KEY]) if isinstance(meta[BITS_KEY], str) else None
    if row is None or row.itemsize != dt.itemsize or dt.kind != "u":
        raise TypeError(f"numpy dtype {dt!r} carries the bits of an unknown tensorlist dtype")
    return row


def bfloat16_bits(values) -> np.ndarray:
    """``values`` rounded to bfloat16 (nearest, ties to even) as a bit carrier, without ml_dtypes.

    The carrier is saved as bfloat16, so a program (the CLI's demo, a test) makes
    bfloat16 data on any host, s390x included (ml_dtypes has no wheel there).
    NaN stays NaN (its payload truncated to the top bits, quiet bit kept).
    """
    x = np.asarray(values, np.float32).view(np.uint32).astype(np.uint64)
    nan = (x & 0x7FFFFFFF) > 0x7F800000
    rounded = (x + 0x7FFF + ((x >> 16) & 1)) >> 16
    bits = np.where(nan, (x >> 16) | 0x40, rounded).astype(np.uint16)
    return bits.view(from_name("bfloat16").bits.newbyteorder("="))  # native, as the bits were made


def check_held(path, arrays, why_not, max_dim: Optional[int] = None, framework: str = "") -> None:
    """Refuses, before anything is converted, the first array a framework cannot hold.

    Args:
        path: the file, for the message.
        arrays: name -> numpy array (a load's result, in file order), or name ->
            the descriptor's ``TensorInfo`` (which carries its own index: a
            loader checks the tensors it reads before reading them).
        why_not: a framework bridge's ``refusal``: dtype name -> reason, or None
            when the framework holds that dtype.
        max_dim: the largest dimension the framework's shapes hold (MLX's are
            32-bit), None for no bound beyond the format's; ``framework`` names it.

    Raises:
        UnsupportedDTypeError: naming the file, the tensor (index and name) and the dtype.
        FormatError: a dimension past ``max_dim`` (an empty tensor may have
            any), naming the file, the tensor and the field ``dims``.

    Example:
        >>> check_held("m.tl", {"w": np.zeros(2, np.complex128)}, lambda n: "no complex128" if n == "complex128"
        ...            else None)
        Traceback (most recent call last):
        tensorlist.errors.UnsupportedDTypeError: m.tl: tensor 0 ('w') has dtype complex128: no complex128
    """
    for position, (k, a) in enumerate(arrays.items()):
        described = isinstance(a.dtype, DType)  # a TensorInfo row
        i = a.index if described else position
        name = a.dtype.name if described else from_numpy(a.dtype).name
        why = why_not(name)
        if why is not None:
            raise UnsupportedDTypeError(f"{path}: tensor {i} ({k!r}) has dtype {name}: {why}", dtype=name)
        if max_dim is not None and any(d > max_dim for d in a.shape):
            raise FormatError(f"dims {list(a.shape)}: {framework} holds dimensions up to {max_dim} only (read the "
                              "file with tensorlist.load)", file=os.fspath(path), tensor_index=i, tensor_name=k,
                              field="dims")
