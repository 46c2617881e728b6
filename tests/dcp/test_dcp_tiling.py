"""The tiling check (tensorlist.dcp.tiling) against a brute-force oracle, on both of its paths.

Tensors of at most 3 dimensions of at most 5 elements each: the oracle counts, element by element, how
many chunks hold it. ``check_tiling`` must accept exactly the tilings where every chunk lies inside the
tensor and every element is held once, and refuse the others with the same message whether the small
pairwise path (up to ``SMALL_CHUNKS`` chunks) or the numpy path (grid, sweep) looks at it first.
"""
import itertools

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorlist.dcp import TensorMeta
from tensorlist.dcp import tiling
from tensorlist.dcp.tiling import check_tiling
from tensorlist.errors import FormatError


@st.composite
def grid_tilings(draw):
    """A valid grid tiling of a random shape, then perhaps broken (a cut moved, a chunk dropped or doubled)."""
    size = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
    cuts = []
    for d in size:
        inner = sorted(draw(st.sets(st.integers(1, max(d - 1, 1)), max_size=3))) if d > 1 else []
        cuts.append([0] + inner + [d])
    chunks = [(tuple(c[i] for c, i in zip(cuts, idx)), tuple(c[i + 1] - c[i] for c, i in zip(cuts, idx)))
              for idx in itertools.product(*(range(len(c) - 1) for c in cuts))]
    chunks = draw(st.permutations(chunks))
    damage = draw(st.sampled_from(["none", "drop", "double", "grow", "shrink", "shift", "empty", "dims"]))
    if chunks and damage != "none":
        k = draw(st.integers(0, len(chunks) - 1))
        off, sz = chunks[k]
        d = draw(st.integers(0, max(len(sz) - 1, 0)))
        if damage == "drop":
            del chunks[k]
        elif damage == "double":
            chunks.insert(draw(st.integers(0, len(chunks))), chunks[k])
        elif damage in ("grow", "shrink") and sz:
            sz = sz[:d] + (max(sz[d] + (1 if damage == "grow" else -1), 0),) + sz[d + 1:]
            chunks[k] = (off, sz)
        elif damage == "shift" and sz:  # an overlap and a gap of the same volume, or a chunk outside
            off = off[:d] + (max(off[d] + draw(st.sampled_from([-1, 1])), 0),) + off[d + 1:]
            chunks[k] = (off, sz)
        elif damage == "empty":
            chunks.insert(k, (tuple(0 for _ in size), tuple(0 for _ in size)))
        elif damage == "dims":
            chunks[k] = (off + (0,), sz + (1,))
    return size, chunks


@st.composite
def random_boxes(draw):
    size = tuple(draw(st.lists(st.integers(0, 4), max_size=3)))
    n = draw(st.integers(0, 6))
    chunks = []
    for _ in range(n):
        off = tuple(draw(st.integers(0, d)) for d in size)
        sz = tuple(draw(st.integers(0, d + 1 - o)) for d, o in zip(size, off))
        chunks.append((off, sz))
    return size, chunks


def oracle(size, chunks) -> bool:
    count = np.zeros(size, np.int64)
    for off, sz in chunks:
        if len(off) != len(size) or len(sz) != len(size):
            return False
        if any(o + s > d for o, s, d in zip(off, sz, size)):
            return False
        count[tuple(slice(o, o + s) for o, s in zip(off, sz))] += 1
    return bool((count == 1).all())


def verdict(size, chunks):
    try:
        check_tiling(TensorMeta("w", "float32", size, tuple(chunks)), "m.json", "/stateDict/w")
    except FormatError as e:
        return str(e)
    return None


@settings(max_examples=400, deadline=None)
@given(st.one_of(grid_tilings(), random_boxes()))
def test_the_check_agrees_with_the_oracle_on_both_paths(case):
    size, chunks = case
    small = verdict(size, chunks)
    assert (small is None) == oracle(size, chunks), (size, chunks, small)
    saved = tiling.SMALL_CHUNKS
    tiling.SMALL_CHUNKS = -1  # the numpy path alone
    try:
        full = verdict(size, chunks)
    finally:
        tiling.SMALL_CHUNKS = saved
    assert small == full, (size, chunks)


@pytest.mark.parametrize("size,chunks,message", [
    ((4, 6), [((0, 0), (4, 3)), ((0, 2), (4, 4))], "chunks 0 and 1 overlap"),
    ((4, 6), [((0, 0), (4, 3))], "cover 12 of the tensor's 24"),
    ((2, 3), [((0, 0), (1, 3)), ((0, 0), (1, 3))], "chunks 0 and 1 overlap"),  # the volume adds up
    ((4,), [((0,), (2,)), ((1,), (2,))], "chunks 0 and 1 overlap"),
    ((4, 6), [((0, 0), (4, 3)), ((0, 3), (4, 4))], "chunk 1 .* lies outside the tensor"),
    ((4, 6), [((0, 0), (4, 6)), ((0,), (4,))], "chunk 1 has 1 offsets and 1 sizes"),
    ((), [((), ()), ((), ())], "chunks 0 and 1 overlap"),
])
def test_small_tilings_are_refused_with_the_full_checks_message(size, chunks, message):
    assert len(chunks) <= tiling.SMALL_CHUNKS
    with pytest.raises(FormatError, match=message):
        check_tiling(TensorMeta("w", "float32", size, tuple(chunks)), "m.json", "/stateDict/w")
