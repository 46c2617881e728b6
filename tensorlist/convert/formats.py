"""What the converters share: format names and their inference, the dtype tables, ``Entry`` and ``Source``.

A :class:`Source` (built by ``sources``) is the tensors of a file as lazy
:class:`Entry` objects; a sink (``sinks``) writes them one at a time. Imports
``_backends``, ``_dtypes``, ``format`` and ``errors`` only.
"""
from __future__ import annotations

import math
import os
import struct
import sys
import zipfile
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from .. import _dtypes
from .._backends import is_remote, localize
from ..errors import FormatError
from ..format import open_regular

__all__ = ["FORMATS", "MAX_SAFETENSORS_HEADER", "DEFAULT_SHARD_BYTES", "NPZ_SIDECAR", "ST_DTYPES", "ST_NAMES",
           "RAW_DTYPES", "UINT", "check_format", "infer_format", "Entry", "Source"]

FORMATS = ("tensorlist", "lamp", "safetensors", "hf", "npz", "npy", "pt")

#: Largest safetensors header read (the safetensors library uses the same 100 MB cap).
MAX_SAFETENSORS_HEADER = 100_000_000
#: Default largest shard written for a Hugging Face checkpoint (``save_pretrained``'s 5GB).
DEFAULT_SHARD_BYTES = 5_000_000_000
#: npz entry holding what npz cannot say itself (dtype names, metadata, named or positional).
NPZ_SIDECAR = "__tensorlist__"

#: safetensors dtype names -> tensorlist dtype names (and back).
ST_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
    "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
    "F32": "float32", "F64": "float64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "C64": "complex64",
}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
#: dtypes numpy's .npy header cannot name (ml_dtypes): stored as same-size unsigned ints
RAW_DTYPES = frozenset({"bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
                        "float8_e8m0fnu"})
UINT = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


def check_format(fmt: str) -> str:
    """``fmt`` itself, or a ValueError naming the formats there are."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def infer_format(path, *, for_reading: bool = False) -> str:
    """The format a file name implies (see the package's table); reading also sniffs the bytes.

    >>> infer_format("model.safetensors.index.json"), infer_format("x.npz"), infer_format("w.tl")
    ('hf', 'npz', 'tensorlist')
    """
    p = os.fspath(path).lower()
    if p.endswith(".index.json"):
        return "hf"
    for ext, fmt in ((".safetensors", "safetensors"), (".npz", "npz"), (".npy", "npy"), (".pt", "pt"),
                     (".pth", "pt"), (".bin", "pt"), (".ckpt", "pt"), (".lamp", "lamp")):
        if p.endswith(ext):
            return fmt
    if for_reading and not is_remote(os.fspath(path)):
        sniffed = _sniff(localize(os.fspath(path)))
        if sniffed:
            return sniffed
    return "tensorlist"


def _sniff(path: str) -> Optional[str]:
    try:
        # a FIFO or device is not sniffed (and never blocks here): the opener refuses it by name
        fd = open_regular(path, what="file")
    except (OSError, FormatError):
        return None
    with os.fdopen(fd, "rb") as f:
        head = f.read(16)
        if head.startswith(b"\x93NUMPY"):
            return "npy"
        if head.startswith(b"PK"):
            f.seek(0)
            try:
                with zipfile.ZipFile(f) as z:
                    return "pt" if any(n.endswith("data.pkl") for n in z.namelist()) else "npz"
            except zipfile.BadZipFile:
                return None
    if len(head) >= 9 and head[8:9] == b"{":
        n = struct.unpack("<Q", head[:8])[0]
        if 2 <= n <= MAX_SAFETENSORS_HEADER:
            return "safetensors"
    return None


class Entry:
    """One tensor of a source, described before any of its bytes are read."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "_get")

    def __init__(self, name: str, dtype: _dtypes.DType, shape: Tuple[int, ...], get: Callable[[], np.ndarray]):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.nbytes = int(math.prod(self.shape)) * dtype.itemsize
        self._get = get

    def array(self) -> np.ndarray:
        """The tensor, little-endian and C-contiguous (usually a view of a mapped file)."""
        a = self._get()
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big" and a.dtype.itemsize > 1):
            a = a.astype(a.dtype.newbyteorder("<"))
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)


class Source:
    """The tensors of a file, in order, with the list-level metadata.

    Attributes:
        path: the source file.
        format: its format name.
        entries: one :class:`Entry` per tensor.
        named: False for a positional list (lamp, ``.npy``): names are ``"0"``, ``"1"``...
        metadata: list-level metadata (any JSON value) or None.
    """

    def __init__(self, path: str, fmt: str, entries: List[Entry], named: bool, metadata: Any, closers=()):
        self.path, self.format, self.entries, self.named, self.metadata = path, fmt, entries, named, metadata
        self._closers = list(closers)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Has :meth:`close` call ``closer`` (closers run last added first)."""
        self._closers.append(closer)

    def close(self) -> None:
        for c in reversed(self._closers):
            try:
                c()
            except Exception:
                pass
        self._closers = []

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
