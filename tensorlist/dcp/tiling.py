"""Step 3 of a DCP metadata check: a tensor's chunks lie inside it, are pairwise disjoint and cover it.

Imports ``errors`` and ``format`` (``short_repr``); never torch.
"""
from __future__ import annotations

import math
from typing import List, Sequence

from ..errors import FormatError
from ..format import short_repr

def numel(dims: Sequence[int]) -> int:
    return math.prod(dims)


def _overlap(a_off, a_sz, b_off, b_sz) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a_off, a_sz, b_off, b_sz))


def check_tiling(t: TensorMeta, file: str, at: str) -> None:
    """Chunks inside the tensor, pairwise disjoint, covering it (step 3)."""
    n = len(t.size)
    boxes = []
    covered = 0
    for i, (off, sz) in enumerate(t.chunks):
        where = f"{at}/chunks/{i}"
        if len(off) != n or len(sz) != n:
            raise FormatError(f"{t.fqn!r}: chunk {i} has {len(off)} offsets and {len(sz)} sizes for a tensor "
                              f"of {n} dimensions {list(t.size)}", file=file, field=where)
        for d in range(n):
            if off[d] + sz[d] > t.size[d]:
                raise FormatError(f"{t.fqn!r}: chunk {i} (offsets {list(off)}, sizes {list(sz)}) lies outside the "
                                  f"tensor of size {list(t.size)} in dimension {d}", file=file, field=where)
        volume = numel(sz)
        if volume:
            boxes.append((off, sz, i))
            covered += volume
    # sweep along dimension 0: only chunks still open at a chunk's start can overlap it
    boxes.sort(key=lambda b: b[0][:1])
    active: List[tuple] = []
    for off, sz, i in boxes:
        if n:
            active = [b for b in active if b[0][0] + b[1][0] > off[0]]
        for o2, s2, j in active:
            if _overlap(off, sz, o2, s2):
                raise FormatError(f"{t.fqn!r}: chunks {min(i, j)} and {max(i, j)} overlap (offsets {list(o2)} "
                                  f"sizes {list(s2)} and offsets {list(off)} sizes {list(sz)})",
                                  file=file, field=f"{at}/chunks/{max(i, j)}")
        active.append((off, sz, i))
    total = numel(t.size)
    if covered != total:
        raise FormatError(f"{t.fqn!r}: the chunks cover {covered} of the tensor's {total} elements (a gap): "
                          "the checkpoint is incomplete", file=file, field=f"{at}/chunks")
