"""``diff``: two files of any formats the converters read, compared tensor by tensor."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

import numpy as np

from tensorlist.format import Limits
from tensorlist.convert.formats import check_limits
from tensorlist.convert.sources import open_source

__all__ = ["diff", "DiffResult"]


class DiffResult:
    """What differs between two tensor files.

    Attributes:
        only_a, only_b: names present on one side only.
        dtype: {name: (dtype a, dtype b)}; shape: {name: (shape a, shape b)}.
        values: {name: max abs difference} of tensors whose bytes differ.
        same: names identical bit for bit.
    """

    def __init__(self):
        self.only_a: List[str] = []
        self.only_b: List[str] = []
        self.dtype: Dict[str, Tuple[str, str]] = {}
        self.shape: Dict[str, Tuple[tuple, tuple]] = {}
        self.values: Dict[str, float] = {}
        self.same: List[str] = []

    @property
    def identical(self) -> bool:
        return not (self.only_a or self.only_b or self.dtype or self.shape or self.values)


def _same_bytes(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 24) -> bool:
    ua, ub = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    return all(np.array_equal(ua[i:i + chunk], ub[i:i + chunk]) for i in range(0, ua.size, chunk))


def _max_abs_diff(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 22) -> float:
    """Largest |a - b| in float64 (complex: modulus; bool: 1), in chunks to bound memory."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    best = 0.0
    for i in range(0, fa.size, chunk):
        x, y = fa[i:i + chunk], fb[i:i + chunk]
        if x.dtype.kind == "c":
            d = np.abs(x.astype(np.complex128) - y.astype(np.complex128))
        else:
            d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        with np.errstate(invalid="ignore"):
            m = np.max(d) if d.size else 0.0
            if np.isnan(m) or np.isnan(d).any():
                return float("nan")
        best = max(best, float(m))
    return best


def diff(a, b, *, a_format: Optional[str] = None, b_format: Optional[str] = None, atol: float = 0.0,
         max_tensors: Optional[int] = None, max_total_bytes: Optional[int] = None) -> DiffResult:
    """Compares two files of any supported formats tensor by tensor.

    Tensors whose bytes are equal are the same; otherwise the largest absolute
    difference is computed (in float64), and tensors within ``atol`` count as the same.
    ``max_tensors`` and ``max_total_bytes`` are :func:`convert`'s limits, applied to each file
    before its tensors are read.
    """
    out = DiffResult()
    limits = Limits.of(max_tensors=max_tensors, max_total_bytes=max_total_bytes)
    with open_source(a, a_format, max_tensors=max_tensors, max_total_bytes=max_total_bytes) as sa, \
            open_source(b, b_format, max_tensors=max_tensors, max_total_bytes=max_total_bytes) as sb:
        check_limits(sa, limits)
        check_limits(sb, limits)
        eb = {e.name: e for e in sb.entries}
        ea = {e.name: e for e in sa.entries}
        out.only_a = [n for n in ea if n not in eb]
        out.only_b = [n for n in eb if n not in ea]
        for name, x in ea.items():
            y = eb.get(name)
            if y is None:
                continue
            if x.dtype.name != y.dtype.name:
                out.dtype[name] = (x.dtype.name, y.dtype.name)
            if x.shape != y.shape:
                out.shape[name] = (x.shape, y.shape)
                continue
            ax, ay = x.array(), y.array()
            if x.dtype.name == y.dtype.name and _same_bytes(ax, ay):
                out.same.append(name)
                continue
            m = _max_abs_diff(x.values(), y.values())  # values only where the bytes differ
            if name in out.dtype or not (m <= atol):
                out.values[name] = m
            else:
                out.same.append(name)
    return out
