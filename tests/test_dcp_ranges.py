"""Loads read only what they need: byte ranges of the requested slices, sorted, adjacent ones joined.

``slice_runs`` against numpy's own slicing for any shape and slice (hypothesis); ``RangeReads`` against
the file's bytes, with file-adjacent ranges joined into one ``preadv``; ``TensorListReader`` loading
resharded slices (rows, blocks, columns past ``MAX_RUNS``, a dtype cast, a non-contiguous target) equal
to what was saved while reading exactly the bytes the slices hold.
"""
import os

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from tensorlist.dcp.ranges import MAX_RUNS, RangeReads, bounding, slice_runs
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


# --- through dcp.load ------------------------------------------------------------------------

torch = pytest.importorskip("torch", reason="TensorListReader needs torch")
from torch.distributed.checkpoint.planner import LoadItemType  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402

from tensorlist.dcp import TensorListReader, TensorListWriter  # noqa: E402


class _Req:
    def __init__(self, fqn, chunk_offset, storage_offsets, lengths):
        self.type = LoadItemType.TENSOR
        self.storage_index = MetadataIndex(fqn, torch.Size(chunk_offset))
        self.storage_offsets = storage_offsets
        self.lengths = lengths


class _Planner:
    """A LoadPlanner's read side: each request resolves to its own target tensor."""

    def __init__(self, targets):
        self.targets, self.committed = targets, []

    def resolve_tensor(self, req):
        return self.targets[id(req)]

    def commit_tensor(self, req, tensor):
        self.committed.append(req)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    import warnings
    import torch.distributed.checkpoint as dcp
    path = tmp_path_factory.mktemp("ranges")
    g = torch.Generator().manual_seed(0)
    sd = {"w": torch.randn(64, 32, generator=g), "h": torch.randn(16, 8, generator=g).bfloat16(),
          "tall": torch.randn(MAX_RUNS + 10, 3, generator=g), "s": torch.tensor(2.5)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save(sd, storage_writer=TensorListWriter(path))
    return path, sd


CASES = [  # fqn, storage offsets, lengths, target maker
    ("w", (16, 0), (16, 32), lambda s: torch.empty(s)),                       # rows: one range
    ("w", (3, 5), (7, 11), lambda s: torch.empty(s)),                         # a block: a run per row
    ("w", (0, 0), (64, 32), lambda s: torch.empty(s, dtype=torch.float64)),   # a cast
    ("w", (8, 4), (4, 8), lambda s: torch.empty(s[::-1]).t()),                # a non-contiguous target
    ("h", (2, 0), (5, 8), lambda s: torch.empty(s, dtype=torch.bfloat16)),
    ("tall", (0, 1), (MAX_RUNS + 10, 1), lambda s: torch.empty(s)),           # past MAX_RUNS: bounding range
    ("s", (), (), lambda s: torch.empty(s)),
]


@pytest.fixture(params=["direct", "ring"])
def path_kind(request, monkeypatch):
    """Every case both ways: read straight into CPU targets, and through the staging ring that targets off the
    CPU take (``_storage._through_ring``; on the CPU its buffers are ordinary memory and its copies synchronous),
    with buffers of 256 bytes, so slices are cut into pieces, packed and the three buffers reused."""
    if request.param == "ring":
        from tensorlist.dcp import _storage
        monkeypatch.setattr(_storage, "_through_ring", lambda target: True)
        monkeypatch.setattr(_storage, "RING_BYTES", 256)
    return request.param


def _read_plan(path, cases):
    reader = TensorListReader(path)
    reader.set_up_storage_reader(reader.read_metadata(), True)
    reqs = [_Req(fqn, (0,) * len(offs), offs, lens) for fqn, offs, lens, _ in cases]
    targets = {id(req): make(torch.Size(lens)) for req, (_, _, lens, make) in zip(reqs, cases)}
    planner = _Planner(targets)
    reader.read_data(type("Plan", (), {"items": reqs})(), planner).wait()
    assert planner.committed == reqs
    return reader, [targets[id(req)] for req in reqs]


def _slice(sd, fqn, offs, lens):
    return sd[fqn][tuple(slice(o, o + n) for o, n in zip(offs, lens))]


@pytest.mark.parametrize("fqn,offs,lens,make", CASES, ids=[f"{c[0]}{list(c[2])}" for c in CASES])
def test_a_planned_slice_loads_exactly_and_reads_only_its_bytes(saved, path_kind, fqn, offs, lens, make):
    path, sd = saved
    reader, (target,) = _read_plan(path, [(fqn, offs, lens, make)])
    assert torch.equal(target, _slice(sd, fqn, offs, lens).to(target.dtype))
    needed = int(np.prod(lens)) * sd[fqn].element_size()
    if fqn == "tall":
        assert reader.bytes_read <= (MAX_RUNS + 10) * 3 * 4
    else:
        assert reader.bytes_read == needed


def test_one_plan_of_every_case_loads_exactly(saved, path_kind):
    """All the cases in one plan: through the ring, small slices share a buffer and large ones span several."""
    path, sd = saved
    _, targets = _read_plan(path, CASES)
    for (fqn, offs, lens, _), target in zip(CASES, targets):
        assert torch.equal(target, _slice(sd, fqn, offs, lens).to(target.dtype)), (fqn, lens)


def test_the_ring_path_names_a_truncated_data_file(saved, tmp_path, monkeypatch):
    import shutil
    from tensorlist.dcp import _storage
    path, _ = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(path, copy)
    data = max((f for f in os.listdir(copy) if f.endswith(".data")), key=lambda f: os.path.getsize(copy / f))
    with open(copy / data, "r+b") as f:
        f.truncate(os.path.getsize(copy / data) // 2)
    monkeypatch.setattr(_storage, "_through_ring", lambda target: True)
    with pytest.raises(FormatError, match="truncated") as e:
        _read_plan(copy, [("w", (0, 0), (64, 32), CASES[0][3])])
    assert e.value.file == str(copy / data[:-len(".data")].rsplit(".", 1)[0])


def test_a_whole_load_through_dcp_reads_every_byte_once(tmp_path, path_kind):
    """Through dcp.load and its planner (the resharded slices are the parametrized test's, with real gloo ranks
    tests/test_dcp.py's and bench/bench_dcp.py's)."""
    import warnings
    import torch.distributed.checkpoint as dcp
    w = torch.randn(64, 128)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dcp.save({"w": w}, storage_writer=TensorListWriter(tmp_path))
        reader = TensorListReader(tmp_path)
        part = {"w": torch.zeros(64, 128)}
        dcp.load(part, storage_reader=reader)
    assert torch.equal(part["w"], w) and reader.bytes_read == w.numel() * 4
    assert os.path.exists(tmp_path / ".metadata.json")

