"""Loads through ``TensorListReader`` read only what they need: resharded slices (rows, blocks, columns
past ``MAX_RUNS``, a dtype cast, a non-contiguous target) equal to what was saved while reading exactly
the bytes the slices hold (the range planning itself: test_dcp_ranges.py).
"""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="TensorListReader needs torch")
from torch.distributed.checkpoint.planner import LoadItemType  # noqa: E402
from torch.distributed.checkpoint.metadata import MetadataIndex  # noqa: E402

from tensorlist.dcp import TensorListReader, TensorListWriter  # noqa: E402
from tensorlist.dcp.ranges import MAX_RUNS  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402


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
    CPU take (``torch_storage._through_ring``; on the CPU its buffers are ordinary memory and its copies synchronous),
    with buffers of 256 bytes, so slices are cut into pieces, packed and the three buffers reused."""
    if request.param == "ring":
        from tensorlist.dcp import torch_storage
        monkeypatch.setattr(torch_storage, "_through_ring", lambda target: True)
        monkeypatch.setattr(torch_storage, "RING_BYTES", 256)
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
    from tensorlist.dcp import torch_storage
    path, _ = saved
    copy = tmp_path / "ckpt"
    shutil.copytree(path, copy)
    data = max((f for f in os.listdir(copy) if f.endswith(".data")), key=lambda f: os.path.getsize(copy / f))
    with open(copy / data, "r+b") as f:
        f.truncate(os.path.getsize(copy / data) // 2)
    monkeypatch.setattr(torch_storage, "_through_ring", lambda target: True)
    with pytest.raises(FormatError, match="truncated") as e:
        _read_plan(copy, [("w", (0, 0), (64, 32), CASES[0][3])])
    assert e.value.file == str(copy / data[:-len(".data")].rsplit(".", 1)[0])


def test_a_whole_load_through_dcp_reads_every_byte_once(tmp_path, path_kind):
    """Through dcp.load and its planner (the resharded slices are the parametrized test's, with real gloo ranks
    tests/dcp/test_dcp.py's and bench/bench_dcp.py's)."""
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

