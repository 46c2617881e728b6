"""Weights not yet read: a tensor-parallel rank reads only the bytes of its slices.

vLLM's weight loaders take a whole weight, ``narrow`` it to the rank's part and ``copy_`` that
into the parameter. :class:`Unread` is a torch tensor with a shard's shape and dtype and no bytes:
``narrow`` (``slice`` with step 1) makes another one, and ``copy_`` into a contiguous CPU
tensor reads the slice's runs of bytes straight into it with ``preadv`` (``dcp.ranges``: a
row slice is one run, a column slice one run per row, file-adjacent runs in one call), never
through a mapping, whose readahead and fault-around read the neighbours. Any other operation
reads the slice into a tensor of its own first, then runs on that. :class:`Slices` holds one
shard's open data file and counts the bytes read. Little-endian hosts only (the bytes are the
file's); imports torch.
"""
from __future__ import annotations

from typing import Any, Optional, Tuple

import numpy as np
import torch

from tensorlist.dcp.ranges import RangeReads, slice_runs
from tensorlist.reader import Reader

__all__ = ["Slices", "Unread"]


class Slices:
    """One shard's tensors as :class:`Unread` tensors; ``bytes_read`` counts what their copies read."""

    def __init__(self, reader: Reader, dtypes: Any):
        desc = reader.descriptor
        self.reader, self.file, self.data_path, self.base = reader, reader.path, desc.data_path, desc.byte_offset
        self._dtypes = dtypes  # i -> torch dtype of tensor i
        self._reads = RangeReads()
        self.bytes_read = 0

    def tensor(self, i: int) -> "Unread":
        info = self.reader.info(i)
        return Unread(self, self.base + info.byte_offset, tuple(info.shape), (0,) * len(info.shape),
                      tuple(info.shape), self._dtypes(i))

    def read_into(self, src: "Unread", dst: torch.Tensor) -> None:
        """Reads ``src``'s bytes into ``dst``, a contiguous CPU tensor of its shape and dtype."""
        flat = dst.reshape(-1).view(torch.uint8).numpy() if dst.numel() else np.empty(0, np.uint8)
        starts, run = slice_runs(src.stored, dst.element_size(), src.starts, tuple(src.shape))
        for k, s in enumerate(starts):
            self._reads.add(self.data_path, src.origin + s, flat[k * run:(k + 1) * run], self.file)
        before = self._reads.bytes_read
        self._reads.run()
        self.bytes_read += self._reads.bytes_read - before

    def close(self) -> None:
        self._reads.close()


class Unread(torch.Tensor):
    """A slice of a stored tensor, read when it is copied somewhere (see the module's docstring).

    ``origin``: the stored tensor's first byte in the data file; ``stored``: its shape;
    ``starts``: where the slice starts in each dimension (its extents are the tensor's shape).
    """

    @staticmethod
    def __new__(cls, source: Slices, origin: int, stored: Tuple[int, ...], starts: Tuple[int, ...],
                shape: Tuple[int, ...], dtype: torch.dtype):
        t = torch.Tensor._make_wrapper_subclass(cls, shape, dtype=dtype, device="cpu")
        t.source, t.origin, t.stored, t.starts = source, origin, stored, starts
        return t

    def __repr__(self) -> str:  # noqa: D105 - no bytes are read to show it
        return f"Unread({self.source.file}, shape={tuple(self.shape)}, dtype={self.dtype})"

    def _narrowed(self, dim: int, start: Optional[int], end: Optional[int]) -> "Unread":
        n = len(self.shape)
        dim = dim % n if n else 0
        size = self.shape[dim]
        lo, hi, _ = slice(start, end).indices(size)
        hi = max(lo, hi)
        shape = list(self.shape)
        shape[dim] = hi - lo
        starts = list(self.starts)
        starts[dim] += lo
        return Unread(self.source, self.origin, self.stored, tuple(starts), tuple(shape), self.dtype)

    def read(self) -> torch.Tensor:
        """The slice's values, read into a tensor of their own."""
        out = torch.empty(tuple(self.shape), dtype=self.dtype)
        self.source.read_into(self, out)
        return out

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        aten = torch.ops.aten
        if func is aten.slice.Tensor and isinstance(args[0], Unread) and not kwargs:
            self, dim, start, end, step = (*args, *(None, 0, None, None, 1)[len(args):])
            if step == 1 and len(self.shape):
                return self._narrowed(dim, start, end)
        if func in (aten.detach.default, aten.alias.default) and isinstance(args[0], Unread):
            return args[0]
        if func is aten.copy_.default and isinstance(args[1], Unread) and not isinstance(args[0], Unread):
            dst, src = args[0], args[1]
            if (dst.device.type == "cpu" and dst.dtype == src.dtype and dst.shape == src.shape
                    and dst.is_contiguous() and dst.dim()):
                src.source.read_into(src, dst)
                return dst
        return func(*_read_all(args), **_read_all(kwargs))


def _read_all(value):
    """``value`` with every :class:`Unread` in it read (lists, tuples and dicts walked)."""
    if isinstance(value, Unread):
        return value.read()
    if isinstance(value, (list, tuple)):
        return type(value)(_read_all(v) for v in value)
    if isinstance(value, dict):
        return {k: _read_all(v) for k, v in value.items()}
    return value
