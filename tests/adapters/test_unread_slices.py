"""tensorlist.vllm.slices: a tensor-parallel rank's slices read from the file, and only their bytes.

vLLM's weight loaders ``narrow`` a weight and ``copy_`` it into a parameter; every other use reads
the slice first. Each case is checked against the same operations on the loaded tensor, and the
bytes read against the slice's size. Needs torch, not vLLM.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")

import tensorlist as tl  # noqa: E402
from tensorlist._bridges.torch import torch_dtype  # noqa: E402
from tensorlist.vllm.slices import Slices, Unread  # noqa: E402


def _open(tmp_path, arrays):
    tl.save(tmp_path / "m.tl", arrays)
    r = tl.open(tmp_path / "m.tl", mmap=False, bits=True)
    return r, Slices(r, lambda i: torch_dtype(r.info(i).dtype.code))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 7), min_size=1, max_size=3), st.data())
def test_a_narrowed_copy_reads_the_slice_and_only_its_bytes(tmp_path_factory, shape, data):
    want = torch.arange(int(np.prod(shape)), dtype=torch.float32).reshape(shape) * 1.5
    r, shard = _open(tmp_path_factory.mktemp("s"), {"w": want.numpy()})
    try:
        u, ref = shard.tensor(0), want
        for _ in range(data.draw(st.integers(0, 3))):
            dim = data.draw(st.integers(0, len(shape) - 1))
            start = data.draw(st.integers(0, ref.shape[dim]))
            length = data.draw(st.integers(0, ref.shape[dim] - start))
            u, ref = u.narrow(dim, start, length), ref.narrow(dim, start, length)
        assert isinstance(u, Unread) and u.shape == ref.shape and shard.bytes_read == 0
        dst = torch.full(tuple(ref.shape), -1.0)
        dst.copy_(u)
        assert torch.equal(dst, ref)
        assert shard.bytes_read == ref.numel() * 4
    finally:
        shard.close()
        r.close()


def test_any_other_use_reads_the_slice_first(tmp_path):
    w = torch.randn(6, 8)
    b = torch.randn(8).to(torch.bfloat16)
    r, shard = _open(tmp_path, {"w": w.numpy(), "b": b.view(torch.int16).numpy(), "s": np.float32(3.5)})
    try:
        u = shard.tensor(0)
        assert torch.equal(u.narrow(1, 2, 4).t().contiguous(), w[:, 2:6].t().contiguous())
        assert torch.equal(u[1:3] + 1, w[1:3] + 1)
        assert torch.equal(u.narrow(0, 1, 2).reshape(-1), w[1:3].reshape(-1))
        strided = torch.zeros(8, 6).t()  # not contiguous: read, then copied
        strided.copy_(u)
        assert torch.equal(strided, w)
        scalar = shard.tensor(2)
        assert scalar.shape == () and scalar.item() == 3.5 and torch.equal(scalar.reshape(1), torch.tensor([3.5]))
        assert torch.equal(shard.tensor(1).view(torch.int16), b.view(torch.int16))
        assert "m.tl" in repr(u)
    finally:
        shard.close()
        r.close()


def test_a_file_cut_under_the_reader_is_a_format_error_naming_it(tmp_path):
    r, shard = _open(tmp_path, {"w": np.ones((64, 64), np.float32)})
    try:
        with open(shard.data_path, "r+b") as f:
            f.truncate(shard.base + 100)
        with pytest.raises(tl.FormatError, match="m.tl"):
            torch.empty(32, 64).copy_(shard.tensor(0).narrow(0, 32, 32))
    finally:
        shard.close()
        r.close()
