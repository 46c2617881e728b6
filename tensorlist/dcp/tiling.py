"""Step 3 of a DCP metadata check: a tensor's chunks lie inside it, are pairwise disjoint and cover it.

The check takes O(n log n) for n chunks in every layout a planner makes, and
refuses in bounded time what it cannot afford:

1. each chunk has the tensor's number of dimensions and lies inside it;
2. the dimensions every non-empty chunk spans whole are set aside; in the
   others, each chunk's boundaries are compressed to the sorted distinct
   boundaries of all chunks (a grid of cells, each cell inside or outside
   every chunk). When that grid has few cells (a grid tiling, row or column
   chunks, bricks: about n cells) and few dimensions, every chunk adds one
   to its cells through a difference array (numpy, ``2^dims`` corners a
   chunk): a cell counted twice is an overlap, a cell never counted a gap;
3. else, in one or two such dimensions, a sweep along the first with the
   open chunks kept sorted along the second (neighbours only are compared);
4. else (three or more dimensions without a grid, over
   ``MAX_SWEEP_CHUNKS`` chunks) the metadata is refused as not checkable.

No message spells a huge integer (``errors.short_repr``).

Imports ``errors`` and numpy; never torch.

Example:
    >>> from tensorlist.dcp.layout import TensorMeta
    >>> check_tiling(TensorMeta("w", "float32", (4, 6), (((0, 0), (4, 3)), ((0, 3), (4, 3)))), "m.json", "/w")
    >>> try:
    ...     check_tiling(TensorMeta("w", "float32", (4, 6), (((0, 0), (4, 4)), ((0, 3), (4, 3)))), "m.json", "/w")
    ... except FormatError as e:
    ...     print(str(e).split(": ", 2)[2])
    'w': chunks 0 and 1 overlap (offsets [0, 0] sizes [4, 4] and offsets [0, 3] sizes [4, 3])
"""
from __future__ import annotations

import bisect
import math
from typing import List, Optional, Sequence, Tuple

import numpy as np

from tensorlist.errors import FormatError, short_repr

#: The most cells of the compressed grid counted through the difference array (besides a few per chunk).
MAX_GRID_CELLS = 1 << 22
#: The most dimensions (not spanned whole) the difference array takes: a chunk adds ``2^dims`` corners.
MAX_GRID_DIMS = 8
#: The most chunks of a tensor in three or more dimensions without a grid (checked pairwise among the open ones).
MAX_SWEEP_CHUNKS = 2048
#: Up to this many chunks, a tiling is first checked pairwise in plain Python (numpy's fixed costs dominate there).
SMALL_CHUNKS = 16


def numel(dims: Sequence[int]) -> int:
    return math.prod(dims)


def _overlap(a_off, a_sz, b_off, b_sz) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a_off, a_sz, b_off, b_sz))


class _Tiling:
    def __init__(self, t, file: str, at: str):
        self.t, self.file, self.at = t, file, at

    def fail(self, what: str, field: str):
        raise FormatError(f"{self.t.fqn!r}: {what}", file=self.file, field=field)

    def overlap(self, i: int, j: int):
        (oi, si), (oj, sj) = self.t.chunks[min(i, j)], self.t.chunks[max(i, j)]
        self.fail(f"chunks {min(i, j)} and {max(i, j)} overlap (offsets {short_repr(list(oi))} sizes "
                  f"{short_repr(list(si))} and offsets {short_repr(list(oj))} sizes {short_repr(list(sj))})",
                  f"{self.at}/chunks/{max(i, j)}")

    def gap(self, covered: int, total: int):
        self.fail(f"the chunks cover {short_repr(covered)} of the tensor's {short_repr(total)} elements (a gap): "
                  "the checkpoint is incomplete", f"{self.at}/chunks")


def _boxes(v: _Tiling) -> Tuple[List[int], np.ndarray, np.ndarray]:
    """Step 1 (vectorized; the first bad chunk named in Python): the non-empty chunks' indices, offsets, sizes."""
    t, n, m = v.t, len(v.t.size), len(v.t.chunks)
    for i, (off, sz) in enumerate(t.chunks):
        if len(off) != n or len(sz) != n:
            v.fail(f"chunk {i} has {len(off)} offsets and {len(sz)} sizes for a tensor of {n} dimensions "
                   f"{short_repr(list(t.size))}", f"{v.at}/chunks/{i}")
    # every number is in [0, 2^63) (the shape check): int64 holds each, and off > size - sz cannot overflow
    off = np.array([o for o, _ in t.chunks], np.int64).reshape(m, n)
    sz = np.array([s for _, s in t.chunks], np.int64).reshape(m, n)
    size = np.array(t.size, np.int64).reshape(n)
    outside = off > size - sz
    if outside.any():
        i, d = (int(x) for x in np.argwhere(outside)[0])
        o, s = t.chunks[i]
        v.fail(f"chunk {i} (offsets {short_repr(list(o))}, sizes {short_repr(list(s))}) lies outside the "
               f"tensor of size {short_repr(list(t.size))} in dimension {d}", f"{v.at}/chunks/{i}")
    kept = np.flatnonzero(np.all(sz > 0, axis=1)) if n else np.arange(m)
    return kept.tolist(), off[kept], sz[kept]


def _covered(t, kept: List[int]) -> int:
    return sum(numel(t.chunks[i][1]) for i in kept)


def _grid(v: _Tiling, kept: List[int], off: np.ndarray, end: np.ndarray, size: np.ndarray) -> Optional[str]:
    """Step 2: ``"exact"`` (every cell once), ``"gap"`` (a cell never), or None when the grid is too big."""
    ndims = off.shape[1]
    # the tensor's own bounds too: a gap at an end is a cell no chunk holds
    coords = [np.unique(np.concatenate([off[:, d], end[:, d], [0, size[d]]])) for d in range(ndims)]
    shape = tuple(len(c) for c in coords)
    if ndims > MAX_GRID_DIMS or math.prod(s - 1 for s in shape) > MAX_GRID_CELLS + 4 * len(kept):
        return None
    lo = np.stack([np.searchsorted(c, off[:, d]) for d, c in enumerate(coords)], axis=1)
    hi = np.stack([np.searchsorted(c, end[:, d]) for d, c in enumerate(coords)], axis=1)
    diff = np.zeros(shape, np.int64)
    for corner in range(1 << ndims):
        pick = [(corner >> d) & 1 for d in range(ndims)]
        index = tuple(np.where(p, hi[:, d], lo[:, d]) for d, p in enumerate(pick))
        np.add.at(diff, index, -1 if sum(pick) % 2 else 1)
    for d in range(ndims):
        np.cumsum(diff, axis=d, out=diff)
    cells = diff[tuple(slice(0, s - 1) for s in shape)]
    twice = np.argwhere(cells > 1)
    if len(twice):
        cell = twice[0]
        inside = np.all((lo <= cell) & (cell < hi), axis=1)
        i, j = (kept[k] for k in np.flatnonzero(inside)[:2])
        v.overlap(i, j)
    return "gap" if (cells == 0).any() else "exact"


def _sweep_2d(v: _Tiling, kept: List[int], off: np.ndarray, end: np.ndarray) -> None:
    """Step 3: along dimension 0, the open chunks' intervals along dimension 1 kept sorted (they are disjoint)."""
    events = sorted([(int(end[k, 0]), 0, k) for k in range(len(kept))] +
                    [(int(off[k, 0]), 1, k) for k in range(len(kept))])  # at one coordinate, ends before starts
    starts: List[Tuple[int, int]] = []  # (start along dim 1, chunk k), sorted
    for _, is_start, k in events:
        key = (int(off[k, 1]) if off.shape[1] > 1 else 0, k)
        if not is_start:
            del starts[bisect.bisect_left(starts, key)]
            continue
        at = bisect.bisect_left(starts, key)
        for nb in (at - 1, at):
            if 0 <= nb < len(starts):
                o = starts[nb][1]
                if off.shape[1] < 2 or (off[o, 1] < end[k, 1] and off[k, 1] < end[o, 1]):
                    v.overlap(kept[o], kept[k])
        starts.insert(at, key)


def _small_tiling_ok(t) -> bool:
    """True when a tensor of at most ``SMALL_CHUNKS`` chunks is tiled exactly (pairwise, no numpy).

    Decides nothing when it says False: the full check then finds and names what is wrong, so every
    message comes from one place.
    """
    chunks, size = t.chunks, t.size
    if len(chunks) > SMALL_CHUNKS:
        return False
    n, boxes, covered = len(size), [], 0
    for off, sz in chunks:
        if len(off) != n or len(sz) != n:
            return False
        count = 1
        for o, s, d in zip(off, sz, size):
            if o > d - s:
                return False
            count *= s
        if count:
            for b_off, b_sz in boxes:
                if _overlap(off, sz, b_off, b_sz):
                    return False
            boxes.append((off, sz))
            covered += count
    return covered == numel(size)


def check_tiling(t, file: str, at: str) -> None:
    """Chunks inside the tensor (a ``TensorMeta``), pairwise disjoint, covering it (step 3).

    Raises:
        FormatError: a chunk with the wrong number of dimensions or outside the
            tensor, two overlapping chunks, a gap, or (three or more dimensions
            without a grid, over ``MAX_SWEEP_CHUNKS`` chunks) too many chunks to check.
    """
    if _small_tiling_ok(t):
        return
    v = _Tiling(t, file, at)
    kept, off, sz = _boxes(v)
    total = numel(t.size)
    if len(kept) > 1:
        size = np.array(t.size, np.int64)
        # dimensions every chunk spans whole decide nothing: leave them out
        dims = np.flatnonzero(~np.all((off == 0) & (sz == size), axis=0))
        if not len(dims):
            v.overlap(kept[0], kept[1])
        off = off[:, dims]
        end = off + sz[:, dims]  # inside the tensor (step 1): below 2^63
        decided = _grid(v, kept, off, end, size[dims])
        if decided == "exact":
            return
        if decided is None:
            if len(dims) <= 2:
                _sweep_2d(v, kept, off, end)
            elif len(kept) <= MAX_SWEEP_CHUNKS:
                order = sorted(range(len(kept)), key=lambda k: int(off[k, 0]))
                active: List[int] = []
                for k in order:
                    active = [j for j in active if end[j, 0] > off[k, 0]]
                    for j in active:
                        if _overlap(off[k], end[k] - off[k], off[j], end[j] - off[j]):
                            v.overlap(kept[j], kept[k])
                    active.append(k)
            else:
                v.fail(f"{len(kept)} chunks in {len(dims)} sharded dimensions that form no grid: too many to check "
                       f"for overlaps (at most {MAX_SWEEP_CHUNKS} without a grid)", f"{at}/chunks")
    covered = _covered(t, kept)
    if covered != total:
        v.gap(covered, total)
