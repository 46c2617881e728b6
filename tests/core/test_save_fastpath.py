"""The save path's fast paths give exactly what the plain code gives.

_items.prepare inlines the common case, _items.layout vectorizes the offsets of long
lists, _fast_descriptor_text writes the descriptor without building dicts, and
lowlevel.write_items gathers small buffers with one bytes.join: each is
checked here against the straightforward computation it replaces.
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlist._storage import items as _items
from tensorlist._base import lowlevel

DTYPES = [np.float32, np.int8, np.complex128, np.bool_, np.float64, np.uint16, ">f4", ">i8", ">c8"]
NAMES = ["w", "ü é", 'q"uote', "back\\slash", "ctl\x01\n\t", "emoji 😀", '},{"x', "", "\x7f"]


def _plain_item(name, value):
    """What _Item.__init__ makes, attribute by attribute."""
    it = _items.Item(name, value, lambda: "test")
    return (it.name, it.dtype, it.swap, it.shape, it.nbytes, it.array.tobytes(), it.array.flags.c_contiguous)


def _plain_layout(items, alignment):
    """Each tensor at the cursor rounded up to max(alignment, itemsize); the list ends with its last bytes
    (an empty tensor's rounded offset adds no padding: test_hostile's trailing-empty-tensor rule)."""
    offsets, cursor, end = [], 0, 0
    for it in items:
        a = max(alignment, it.dtype.itemsize)
        off = -(-cursor // a) * a
        offsets.append(off)
        cursor = off + it.nbytes
        end = cursor if it.nbytes else end
    return offsets, -(-end // alignment) * alignment


arrays = st.builds(
    lambda shape, dt, transpose: (np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape).astype(dt).T
                                  if transpose else np.arange(int(np.prod(shape))).reshape(shape).astype(dt)),
    st.lists(st.integers(0, 4), max_size=3).map(tuple),
    st.sampled_from(DTYPES),
    st.booleans(),
)
values = st.one_of(arrays, arrays.map(lambda a: a.tolist() if a.dtype.kind in "if" and a.size else a),
                   st.sampled_from([1.5, 3, True, np.float32(2.0)]))


@settings(max_examples=150, deadline=None)
@given(vals=st.lists(values, max_size=80), named=st.booleans(), alignment=st.sampled_from([8, 16, 64, 4096]))
def test_items_and_layout_match_the_plain_code(vals, named, alignment):
    tensors = {f"t{i}": v for i, v in enumerate(vals)} if named else vals
    items, is_named = _items.prepare(tensors, "x")
    assert is_named == named
    expect = [_plain_item(f"t{i}" if named else None, v) for i, v in enumerate(vals)]
    got = [(it.name, it.dtype, it.swap, it.shape, it.nbytes, it.array.tobytes(), it.array.flags.c_contiguous)
           for it in items]
    assert got == expect
    assert _items.layout(items, 0, alignment) == _plain_layout(items, alignment)


def test_layout_of_a_long_list_with_zero_sizes_and_wide_items():
    vals = [np.zeros(n % 5, dtype=[np.float32, np.complex128, np.int8][n % 3]) for n in range(500)]
    items, _ = _items.prepare(vals, "x")
    for alignment in (8, 16, 32, 64, 1 << 20):
        assert _items.layout(items, 0, alignment) == _plain_layout(items, alignment)


@settings(max_examples=100, deadline=None)
@given(
    shapes=st.lists(st.lists(st.integers(0, 3), max_size=3).map(tuple), max_size=12),
    names=st.lists(st.sampled_from(NAMES), max_size=12),
    named=st.booleans(),
    with_crc=st.booleans(),
    metadata=st.sampled_from([None, {"a": [{"b": 1}, {"c": 2}]}, [1, 2], "s", {"tensors": [{"x": 1}]}, {}]),
)
def test_fast_descriptor_text_is_the_dict_path_text(shapes, names, named, with_crc, metadata):
    arrs = [np.zeros(s, dtype=DTYPES[i % len(DTYPES)]) for i, s in enumerate(shapes)]
    tensors = {f"{names[i % len(names)] if names else ''}#{i}": a for i, a in enumerate(arrs)} if named else arrs
    items, _ = _items.prepare(tensors, "x")
    offsets, length = _items.layout(items, 0, 64)
    crcs = [(i * 2654435761) % (1 << 32) for i in range(len(items))] if with_crc else None
    fast = _items.fast_descriptor_text(items, offsets, crcs, "m.tl.0123abcd.data", length, metadata)
    slow = _items.descriptor_text(_items.descriptor(_items.tensor_entries(items, offsets, crcs, False),
                                                      "m.tl.0123abcd.data", 0, length, metadata, False), False)
    assert fast == slow


def _expected_file(bufs, offsets, end):
    out = bytearray(end)
    for b, o in zip(bufs, offsets):
        raw = b.astype(b.dtype.newbyteorder("<")).tobytes() if b.dtype.byteorder == ">" else b.tobytes()
        out[o:o + len(raw)] = raw
    return bytes(out)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_write_items_gathers_small_buffers_and_pins_large_ones(tmp_path, threads):
    rng = np.random.default_rng(0)
    # 3 MiB items: with threads=4, helper threads checksum the large items (9 MiB of them in all)
    sizes = [0, 1, 7, 64, lowlevel._GATHER_MAX, lowlevel._GATHER_MAX + 1, 70_000, 3, 0, 5000, 3 << 20]
    bufs = []
    for i, k in enumerate(sizes * 3):
        a = rng.integers(0, 255, k, dtype=np.uint8)
        if k % 8 == 0 and i % 2:
            a = a.view(">u4")  # byte-swapped while written
        bufs.append(a)
    offsets, cur = [], 0
    for b in bufs:
        cur = (cur + 63) // 64 * 64
        offsets.append(cur)
        cur += b.nbytes
    end = (cur + 63) // 64 * 64
    swaps = [4 if b.dtype.byteorder == ">" else 0 for b in bufs]
    path = tmp_path / "f"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        crcs = lowlevel.write_items(fd, bufs, offsets, swaps, 0, end, crc=True, fsync=False, sparse=True,
                                     threads=threads)
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data == _expected_file(bufs, offsets, end)
    assert crcs == [lowlevel.crc32c(data[o:o + b.nbytes]) for b, o in zip(bufs, offsets)]


@pytest.mark.parametrize("n", [0, 1, 3 * 8192 - 1, 3 * 8192, 3 * 8192 + 9, 200_003])
def test_crc32c_three_way_path_matches_piecewise(n):
    # below 3 x 8 KiB the single-stream loop runs; pieces of 1000 bytes never reach the 3-way loop
    data = np.random.default_rng(n).integers(0, 256, n + 5, dtype=np.uint8)
    for start in (0, 1, 5):
        view = data[start:start + n]
        crc = 0
        for i in range(0, len(view), 1000):
            crc = lowlevel.crc32c(view[i:i + 1000], crc)
        assert lowlevel.crc32c(view) == crc


def test_save_of_a_long_list_leaves_the_garbage_collector_as_it_was(tmp_path):
    import gc

    import tensorlist

    tensors = {f"t{i}": np.full(2, i, np.float32) for i in range(_items.GC_PAUSE_MIN)}
    assert gc.isenabled()
    tensorlist.save(tmp_path / "a.tl", tensors, durable=False)
    assert gc.isenabled()
    bad = dict(tensors, zzz=np.array(["not a number"]))
    with pytest.raises(TypeError):
        tensorlist.save(tmp_path / "b.tl", bad, durable=False)
    assert gc.isenabled()
    gc.disable()
    try:
        tensorlist.save(tmp_path / "c.tl", tensors, durable=False)
        assert not gc.isenabled()
    finally:
        gc.enable()
    assert tensorlist.load(tmp_path / "a.tl")["t9999"].tolist() == [9999.0, 9999.0]
