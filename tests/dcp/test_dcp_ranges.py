"""Loads read only what they need: byte ranges of the requested slices, sorted, adjacent ones joined.

``slice_runs`` against numpy's own slicing for any shape and slice (hypothesis); ``RangeReads`` against
the file's bytes, with file-adjacent ranges joined into one ``preadv``. No torch needed (the loads through
``TensorListReader`` are test_dcp_ranges_torch.py).
"""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorlist.dcp.ranges import RangeReads, bounding, slice_runs
from tensorlist.errors import FormatError


@st.composite
def slices(draw):
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=0, max_size=4)))
    offs, lens = [], []
    for n in shape:
        o = draw(st.integers(0, n - 1))
        offs.append(o)
        lens.append(draw(st.integers(1, n - o)))
    return shape, tuple(offs), tuple(lens)


@settings(max_examples=200, deadline=None)
@given(slices(), st.sampled_from([1, 2, 4, 8]))
def test_the_runs_of_a_slice_are_its_bytes_in_order(s, itemsize):
    shape, offs, lens = s
    a = np.arange(max(1, int(np.prod(shape))) * itemsize, dtype=np.uint8) % 251
    chunk = a.view(f"V{itemsize}").reshape(shape) if shape else a.view(f"V{itemsize}").reshape(())
    want = np.ascontiguousarray(chunk[tuple(slice(o, o + n) for o, n in zip(offs, lens))]).view(np.uint8).tobytes()
    starts, run = slice_runs(shape, itemsize, offs, lens)
    raw = a.tobytes()
    assert b"".join(raw[s:s + run] for s in starts) == want
    assert len(starts) * run == len(want)  # nothing read twice, nothing around
    assert all(b - a_ > run for a_, b in zip(starts, starts[1:])) or len(starts) <= 1  # runs are maximal
    first, length = bounding(shape, itemsize, offs, lens)
    assert first == starts[0] and first + length == starts[-1] + run


def test_a_row_slice_is_one_range_and_a_block_one_run_per_row():
    assert slice_runs((8, 1024), 4, (2, 0), (4, 1024)) == ([2 * 4096], 4 * 4096)
    assert slice_runs((8, 1024), 4, (0, 512), (2, 512)) == ([2048, 4096 + 2048], 2048)
    assert slice_runs((), 8, (), ()) == ([0], 8)
    assert slice_runs((3, 0), 4, (0, 0), (3, 0)) == ([], 0)


def test_adjacent_ranges_are_one_call_and_others_are_sorted(tmp_path):
    data = bytes(range(256)) * 4
    f = tmp_path / "d.bin"
    f.write_bytes(data)
    bufs = [bytearray(n) for n in (10, 20, 5, 7)]
    with RangeReads() as reads:
        reads.add(str(f), 30, bufs[1], "x.tl")   # [30, 50)
        reads.add(str(f), 20, bufs[0], "x.tl")   # [20, 30): adjacent to the one above
        reads.add(str(f), 500, bufs[3], "x.tl")
        reads.add(str(f), 100, bufs[2], "x.tl")
        reads.run()
        assert reads.calls == 3 and reads.bytes_read == 42
    assert [bytes(b) for b in bufs] == [data[20:30], data[30:50], data[100:105], data[500:507]]


def test_a_data_file_shorter_than_a_range_is_a_format_error_naming_the_shard(tmp_path):
    f = tmp_path / "d.bin"
    f.write_bytes(b"x" * 10)
    with RangeReads() as reads, pytest.raises(FormatError, match=r"ends at byte 10") as e:
        reads.add(str(f), 4, bytearray(20), str(tmp_path / "0.x.tl"))
        reads.run()
    assert e.value.file == str(tmp_path / "0.x.tl")


def test_without_preadv_the_ranges_are_read_one_by_one(tmp_path, monkeypatch):
    import tensorlist.dcp.ranges as ranges
    data = bytes(range(200))
    f = tmp_path / "d.bin"
    f.write_bytes(data)
    monkeypatch.delattr(ranges.os, "preadv")
    bufs = [bytearray(10), bytearray(5)]
    with RangeReads() as reads:
        reads.add(str(f), 0, bufs[0], "x.tl")
        reads.add(str(f), 10, bufs[1], "x.tl")
        reads.run()
    assert bytes(bufs[0] + bufs[1]) == data[:15] and reads.calls == 1
