"""Reads into private memory choose between the page cache and O_DIRECT by residency (lowlevel.read_new).

Every ``mmap=False`` reader goes through ``DataFile.read`` -> ``read_new``: the same bytes whichever
way is taken, on cold and warm files, at offsets that are and are not block-aligned, with tails
shorter than a block; a cold read that went direct leaves the page cache as it found it.
"""
import os

import numpy as np
import pytest

import tensorlist
from tensorlist._base import lowlevel

MiB = 1 << 20


def _evict(path):
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _direct_supported(path) -> bool:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    try:
        buf = lowlevel.alloc(4 << 20)[:4096]  # page-aligned
        os.preadv(fd, [buf], 0)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


@pytest.fixture
def small_direct_min(monkeypatch):
    # the rule is size-independent; a small threshold keeps the files small
    monkeypatch.setattr(lowlevel, "DIRECT_MIN", 1 * MiB)


@pytest.mark.parametrize("offset, length", [(0, 3 * MiB), (4096, 2 * MiB + 4096), (64, 2 * MiB + 100),
                                            (8192 + 640, 3 * MiB - 8192 - 640 - 1), (4096 * 3, 3 * MiB - 4096 * 3),
                                            (4096 + 64, 40 * MiB - 4096 - 64)])  # more pieces than threads
def test_read_new_same_bytes_cold_and_warm(tmp_path, small_direct_min, offset, length):
    data = np.random.default_rng(offset).integers(0, 256, max(3 * MiB, offset + length), dtype=np.uint8)
    path = tmp_path / "blob"
    path.write_bytes(data.tobytes())
    fd = os.open(path, os.O_RDONLY)
    try:
        _evict(path)
        assert lowlevel.resident_fraction(fd, 0, len(data)) < 0.5
        cold = lowlevel.read_new(fd, offset, length)
        assert cold.ctypes.data % 64 == 0 and cold.flags.writeable
        np.testing.assert_array_equal(cold, data[offset:offset + length])
        if _direct_supported(path):
            # went around the page cache: what was evicted stays evicted (the tail under one block aside)
            assert lowlevel.resident_fraction(fd, offset, length) < 0.5
        with open(path, "rb") as f:
            f.read()
        # warm enough for the cache path (a busy machine may evict a few pages in between)
        assert lowlevel.resident_fraction(fd, 0, len(data)) >= lowlevel.DIRECT_BELOW_RESIDENT
        warm = lowlevel.read_new(fd, offset, length)
        np.testing.assert_array_equal(warm, data[offset:offset + length])
    finally:
        os.close(fd)


def test_read_new_past_the_end_is_eof_both_ways(tmp_path, small_direct_min):
    path = tmp_path / "blob"
    path.write_bytes(bytes(2 * MiB))
    fd = os.open(path, os.O_RDONLY)
    try:
        for warm in (False, True):
            if not warm:
                _evict(path)
            with pytest.raises(EOFError):
                lowlevel.read_new(fd, 0, 2 * MiB + 4096 + 64)
    finally:
        os.close(fd)


@pytest.mark.parametrize("entry", ["load", "reader", "torch"])
def test_every_private_memory_reader_reads_a_cold_file_right(tmp_path, small_direct_min, entry):
    rng = np.random.default_rng(3)
    tensors = {f"t{i}": rng.standard_normal((97 + i, 1031)).astype(np.float32) for i in range(6)}
    p = str(tmp_path / "m.tl")
    tensorlist.save(p, tensors)
    for name in os.listdir(tmp_path):
        _evict(str(tmp_path / name))
    if entry == "load":
        got = tensorlist.load(p, mmap=False)
    elif entry == "reader":
        with tensorlist.open(p, mmap=False) as r:
            got = {k: r[k] for k in tensors}
    else:
        pytest.importorskip("torch", reason="tensorlist.torch needs torch (the torch extra)")
        import tensorlist.torch as tlt
        got = {k: v.numpy() for k, v in tlt.load_state(p, mmap=False).items()}
    assert set(got) == set(tensors)
    for k, v in tensors.items():
        np.testing.assert_array_equal(got[k], v)
    # and the checksums agree with what was read
    assert tensorlist.load(p, mmap=False, verify=True).keys() == tensors.keys()
