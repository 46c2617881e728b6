"""Byte-range reads of DCP chunks: only the bytes a load asks for, sorted by (file, offset), adjacent ones joined.

A resharding load asks for slices of saved chunks (a rank of 4 needs half of
a chunk that one of 2 ranks saved). A chunk is stored row-major, so

- a slice along dimension 0 (every later dimension whole) is one range;
- any other slice is the minimal set of contiguous runs: the slice's
  trailing dimensions that are whole, times its extent in the last one that
  is not, make one run; every index of the dimensions before it starts one;

and :class:`RangeReads` reads every range of a load with ``preadv`` on the
data files (never the memory map, whose readahead reads around each slice:
1.38x the bytes needed on a cold 2 -> 4 reshard), sorted by (file, offset),
a run of file-adjacent ranges in one call scattered straight into their
destinations. A slice of more than ``MAX_RUNS`` runs (a column of a tall
matrix) reads its bounding range once instead, and is narrowed in memory.

The ranges are raw bytes of the data files, read past the reader: only a
plain shard's are tensor bytes. An encrypted shard's ranges are ciphertext,
so ``dcp.shards.Shards.locate`` (where every range's place comes from)
refuses it, and ``TensorListReader`` reads its chunks whole through the
keyed reader instead: nothing here ever returns ciphertext as data.

Imports ``errors``, ``format`` and numpy; never torch.

Example:
    >>> slice_runs((4, 6), 4, (1, 0), (2, 6))  # rows 1 and 2, whole: one range of 48 bytes at byte 24
    ([24], 48)
    >>> slice_runs((4, 6), 4, (0, 2), (2, 3))  # a 2 x 3 block: one run of 12 bytes per row
    ([8, 32], 12)
"""
from __future__ import annotations

import math
import os
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist.errors import FormatError
from tensorlist.format import open_regular

#: The most runs one slice is read as; a slice of more reads its bounding range once (then narrowed in memory).
MAX_RUNS = 4096
#: The most buffers one ``preadv`` call takes (Linux's IOV_MAX).
MAX_IOV = 1024
#: The most bytes one ``preadv`` call asks for (below Linux's 2 GiB cap on one read).
MAX_CALL_BYTES = 1 << 30


def slice_runs(shape: Sequence[int], itemsize: int, offsets: Sequence[int],
               lengths: Sequence[int]) -> Tuple[List[int], int]:
    """The byte offsets (from the chunk's first byte, in the slice's row-major order) and length of each run.

    Args:
        shape: the stored chunk's shape (row-major, contiguous).
        itemsize: bytes per element.
        offsets, lengths: the slice, one pair per dimension (inside ``shape``).

    Returns:
        ``(starts, run_bytes)``: the slice is the runs ``[s, s + run_bytes)`` for ``s`` in ``starts``, in order.
    """
    n = len(shape)
    if any(x == 0 for x in lengths):
        return [], 0
    strides = [itemsize * math.prod(shape[d + 1:]) for d in range(n)]
    j = n - 1  # the last dimension that is not whole; the runs span it and everything after it
    while j >= 0 and lengths[j] == shape[j] and offsets[j] == 0:
        j -= 1
    if j < 0:
        return [0], itemsize * math.prod(shape)
    run = lengths[j] * strides[j]
    base = sum(o * s for o, s in zip(offsets, strides))
    starts = np.full(1, base, np.int64)
    for d in range(j):  # every index of the dimensions before j starts a run
        starts = (starts[:, None] + np.arange(lengths[d], dtype=np.int64)[None, :] * strides[d]).reshape(-1)
    return starts.tolist(), run


class RangeReads:
    """The ranges of one load: added with :meth:`add`, read with :meth:`run` in (file, offset) order.

    Attributes:
        bytes_read: bytes read from the data files so far.
        calls: ``preadv`` calls made so far.
    """

    def __init__(self):
        self._fds: Dict[str, int] = {}
        self._ranges: List[Tuple[str, int, int, memoryview, str]] = []
        self.bytes_read = 0
        self.calls = 0

    def add(self, data_path: str, offset: int, dest, file: str) -> None:
        """Reads ``len(dest)`` bytes of ``data_path`` at ``offset`` into ``dest`` (a writable buffer) at :meth:`run`.

        ``file`` is what an error names (the shard descriptor).
        """
        view = memoryview(dest).cast("B")
        if len(view):
            self._ranges.append((data_path, offset, len(view), view, file))

    def _fd(self, path: str, file: str) -> int:
        fd = self._fds.get(path)
        if fd is None:
            fd = self._fds[path] = open_regular(path, what="data file", file=file)
            if hasattr(os, "posix_fadvise"):  # no readahead: the ranges are all this load needs
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        return fd

    def run(self) -> None:
        """Reads every range added, sorted by (file, offset), each group of file-adjacent ones in one call.

        Raises:
            FormatError: a data file ends before a range (truncated under the reader), naming the shard.
        """
        self._ranges.sort(key=lambda r: (r[0], r[1]))
        group: List[Tuple[str, int, int, memoryview, str]] = []
        size = 0
        for r in self._ranges:
            if group and (r[0] != group[-1][0] or r[1] != group[-1][1] + group[-1][2] or len(group) >= MAX_IOV
                          or size + r[2] > MAX_CALL_BYTES):
                self._read(group)
                group, size = [], 0
            group.append(r)
            size += r[2]
        if group:
            self._read(group)
        self._ranges = []

    def _read(self, group) -> None:
        path, offset, file = group[0][0], group[0][1], group[0][4]
        fd = self._fd(path, file)
        views = [r[3] for r in group]
        want = sum(len(v) for v in views)
        done = 0
        while done < want:
            # resume inside the group after a short read (a signal, or a huge call)
            skip, bufs = done, []
            for v in views:
                if skip >= len(v):
                    skip -= len(v)
                    continue
                bufs.append(v[skip:])
                skip = 0
            got = _preadv(fd, bufs, offset + done)
            self.calls += 1
            if got <= 0:
                raise FormatError(f"data file {path!r} ends at byte {offset + done}, before the "
                                  f"{want} bytes at {offset} a chunk needs (truncated while it was read?)", file=file)
            done += got
            self.bytes_read += got

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> "RangeReads":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _preadv(fd: int, bufs: List[memoryview], offset: int) -> int:
    """``os.preadv`` where the platform has it; else one positioned read per buffer (Windows: seek and read)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, bufs, offset)
    got = 0
    for b in bufs:
        if hasattr(os, "pread"):
            data = os.pread(fd, len(b), offset + got)
        else:
            os.lseek(fd, offset + got, os.SEEK_SET)
            data = os.read(fd, len(b))
        b[:len(data)] = data
        got += len(data)
        if len(data) < len(b):
            break
    return got


def bounding(shape: Sequence[int], itemsize: int, offsets: Sequence[int],
             lengths: Sequence[int]) -> Optional[Tuple[int, int]]:
    """The byte range ``(start, length)`` from a slice's first element to its last, or None when it is empty."""
    if any(x == 0 for x in lengths):
        return None
    strides = [itemsize * math.prod(shape[d + 1:]) for d in range(len(shape))]
    first = sum(o * s for o, s in zip(offsets, strides))
    last = sum((o + n - 1) * s for o, n, s in zip(offsets, lengths, strides))
    return first, last + itemsize - first
