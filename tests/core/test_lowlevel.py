"""C-level tests through tensorlist._base.lowlevel: CRC32C, padded writes, parallel reads, layout checks.

These exercise the C core directly (csrc/), below the format and reader layers, so a
regression shows up here with the smallest possible surface.
"""
import errno
import gc
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tensorlist._base import lowlevel as _lowlevel
from tensorlist._core import ffi, lib

# --- CRC32C ---------------------------------------------------------------------------------------


def _crc32c_reference(data: bytes, crc: int = 0) -> int:
    """Bitwise CRC32C (Castagnoli, reflected polynomial 0x82F63B78): slow but obviously right."""
    crc ^= 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


@settings(max_examples=200, deadline=None)
@given(data=st.binary(max_size=300), start=st.integers(0, 15), split=st.integers(0, 300))
def test_crc32c_matches_reference_at_any_alignment_and_continues(data, start, split):
    # Slicing at `start` moves the buffer off 8-byte alignment (the hardware path's head loop).
    buf = bytes(16) + data
    view = memoryview(buf)[16 - start : 16 - start + len(data) + start][start:]
    assert bytes(view) == data
    assert _lowlevel.crc32c(view) == _crc32c_reference(data)
    split = min(split, len(data))
    assert _lowlevel.crc32c(data[split:], _lowlevel.crc32c(data[:split])) == _crc32c_reference(data)


@pytest.mark.parametrize("threads", [1, 2, 4])
def test_crc32c_many_equals_crc32c(threads):
    rng = np.random.default_rng(7)
    # > 8 MiB in total so that more than one thread is actually used
    sizes = [0, 1, 7, 8, 9, 4096, 3 << 20, 5 << 20, 12345, 2 << 20, 0, 17]
    bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    got = _lowlevel.crc32c_many(bufs, threads=threads)
    assert got == [_lowlevel.crc32c(b) for b in bufs]
    assert got[0] == 0 and got[1] == _crc32c_reference(bufs[1].tobytes())
    assert _lowlevel.crc32c_many([]) == []


# --- write_items ----------------------------------------------------------------------------------


def _fd(path, size=0, fill=b"\xee"):
    with open(path, "wb") as f:
        f.write(fill * size)
    return os.open(path, os.O_RDWR)


def _write(fd, bufs, offsets, start, end, *, swaps=None, crc=True, sparse=False, threads=1):
    return _lowlevel.write_items(fd, bufs, offsets, swaps or [0] * len(bufs), start, end,
                                 crc=crc, fsync=False, sparse=sparse, threads=threads)


def test_write_items_zero_fills_padding_and_gaps_over_old_bytes(tmp_path):
    path = tmp_path / "f.bin"
    fd = _fd(path, 64)  # pre-filled with 0xEE: every byte in the region must be rewritten
    try:
        a = np.array([1, 2, 3], np.uint8)
        b = np.array([0x0A0B0C0D], np.uint32)
        crcs = _write(fd, [a, b], [8, 20], 4, 40)
    finally:
        os.close(fd)
    data = path.read_bytes()
    expected = (b"\xee" * 4 + bytes(4) + b"\x01\x02\x03" + bytes(9) + b.tobytes() + bytes(16)
                + b"\xee" * 24)
    assert data == expected
    assert crcs == [_crc32c_reference(a.tobytes()), _crc32c_reference(b.tobytes())]


def test_write_items_sparse_region_reads_as_zeros_and_is_sized(tmp_path):
    path = tmp_path / "sparse.bin"
    fd = _fd(path, 0)
    a = np.arange(100, dtype=np.uint8)
    end = (3 << 20) + 4096
    try:
        _write(fd, [a, a], [8, 1 << 20], 0, end, sparse=True)  # a 1 MiB gap and a 2 MiB tail
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert len(data) == end
    assert data[8:108] == a.tobytes() and data[1 << 20 : (1 << 20) + 100] == a.tobytes()
    assert data[:8] == bytes(8)
    assert data[108 : 1 << 20] == bytes((1 << 20) - 108)
    assert data[(1 << 20) + 100 :] == bytes(end - (1 << 20) - 100)


@pytest.mark.parametrize("size", [2, 4, 8])
def test_write_items_byte_swaps_without_touching_the_source(tmp_path, size):
    path = tmp_path / "swap.bin"
    src = np.arange(1, 11, dtype=f">u{size}")  # big-endian input
    before = src.tobytes()
    fd = _fd(path, 0)
    try:
        [crc] = _write(fd, [src], [0], 0, src.nbytes, swaps=[size])
    finally:
        os.close(fd)
    stored = path.read_bytes()
    assert stored == src.astype(f"<u{size}").tobytes()
    assert src.tobytes() == before  # the caller's array is never swapped in place
    assert crc == _crc32c_reference(stored)


@pytest.mark.parametrize(
    "offsets, start, end, swaps, match",
    [
        ([16, 0], 0, 64, [0, 0], "overlap"),  # unsorted
        ([0, 4], 0, 64, [0, 0], "overlap"),  # a (8 bytes) overlaps b
        ([0, 62], 0, 64, [0, 0], "outside"),  # b ends past the region
        ([0, 8], 4, 64, [0, 0], "overlap"),  # a starts before the region
        ([0, 8], 0, 8, [0, 0], "outside"),  # region too short for b
        ([0, 8], 0, 64, [3, 0], "invalid argument"),  # swap size 3
        ([0, 8], 0, 64, [0, 8], "multiple of the item size"),  # 4 bytes cannot be swapped by 8
    ],
    ids=["unsorted", "overlap", "past-region", "before-region", "short-region", "bad-swap", "swap-length"],
)
def test_write_items_refuses_bad_items_before_writing(tmp_path, offsets, start, end, swaps, match):
    path = tmp_path / "bad.bin"
    fd = _fd(path, 80)
    a = np.arange(8, dtype=np.uint8)
    b = np.arange(4, dtype=np.uint8)
    try:
        with pytest.raises(ValueError, match=match):
            _write(fd, [a, b], offsets, start, end, swaps=swaps)
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\xee" * 80  # nothing was written


def test_write_items_empty_list_zero_fills_the_region(tmp_path):
    path = tmp_path / "e.bin"
    fd = _fd(path, 32)
    try:
        assert _write(fd, [], [], 8, 24) == []
    finally:
        os.close(fd)
    assert path.read_bytes() == b"\xee" * 8 + bytes(16) + b"\xee" * 8


def _big_item_set(rng):
    """About 14 MiB in items of very different sizes: staged, direct and byte-swapped writes."""
    sizes = [3, 1 << 20, 17, 300 << 10, 5, 4 << 20, 8, 1000, 6 << 20, 64, 2 << 20, 1]
    bufs, swaps = [], []
    for i, n in enumerate(sizes):
        if i % 3 == 1:
            arr = rng.integers(0, 2**32, max(1, n // 4), dtype=np.uint32).astype(">u4")
            bufs.append(arr)
            swaps.append(4)
        else:
            bufs.append(rng.integers(0, 256, n, dtype=np.uint8))
            swaps.append(0)
    offsets, cursor = [], 0
    for b in bufs:
        cursor = (cursor + 63) // 64 * 64
        offsets.append(cursor)
        cursor += b.nbytes
    return bufs, offsets, swaps, cursor + 100


@pytest.mark.parametrize("sparse", [False, True])
def test_write_items_multithreaded_equals_single_threaded(tmp_path, sparse):
    rng = np.random.default_rng(1)
    bufs, offsets, swaps, end = _big_item_set(rng)
    assert sum(b.nbytes for b in bufs) > 8 << 20
    results = {}
    for threads in (1, 4):
        path = tmp_path / f"t{threads}.bin"
        fd = _fd(path, 0)
        try:
            crcs = _lowlevel.write_items(fd, bufs, offsets, swaps, 0, end, crc=True, fsync=True,
                                         sparse=sparse, threads=threads)
        finally:
            os.close(fd)
        results[threads] = (path.read_bytes(), crcs)
    data, crcs = results[1]
    assert results[4] == results[1]
    assert len(data) == end
    for b, off, swap, crc in zip(bufs, offsets, swaps, crcs):
        stored = b.astype(b.dtype.newbyteorder("<")).tobytes() if swap else b.tobytes()
        assert data[off : off + b.nbytes] == stored
        assert crc == _lowlevel.crc32c(stored)


# --- pread_into -----------------------------------------------------------------------------------


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("offset", [0, 1, 4096 + 5])
def test_pread_into_equals_the_file(tmp_path, threads, offset):
    path = tmp_path / "r.bin"
    content = np.random.default_rng(3).integers(0, 256, (20 << 20) + 7, dtype=np.uint8).tobytes()
    path.write_bytes(content)
    dst = np.zeros(len(content) - offset - 3, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        _lowlevel.pread_into(fd, dst, offset, threads=threads)
    finally:
        os.close(fd)
    assert dst.tobytes() == content[offset : offset + len(dst)]


@pytest.mark.parametrize("threads", [1, 4])
def test_pread_into_raises_eof_on_a_short_file(tmp_path, threads):
    path = tmp_path / "short.bin"
    path.write_bytes(b"x" * (9 << 20))
    dst = np.zeros(9 << 20, np.uint8)
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(EOFError, match="shorter than the requested range"):
            _lowlevel.pread_into(fd, dst, 1, threads=threads)
        small = bytearray(10)
        with pytest.raises(EOFError, match="shorter"):
            _lowlevel.pread_into(fd, small, (9 << 20) - 5)
        _lowlevel.pread_into(fd, bytearray(0), 100 << 20)  # nothing to read: no error
    finally:
        os.close(fd)


def test_pread_into_refuses_a_readonly_buffer(tmp_path):
    path = tmp_path / "r.bin"
    path.write_bytes(b"abc")
    fd = os.open(path, os.O_RDONLY)
    try:
        with pytest.raises(BufferError, match="not writable"):
            _lowlevel.pread_into(fd, b"xyz", 0)
    finally:
        os.close(fd)


# --- preallocation, durability ----------------------------------------------------------------------


@pytest.mark.parametrize("before, length", [(0, 10000), (0, 0), (20000, 10000), (4096, 4096)])
def test_preallocate_makes_the_file_exactly_that_long_keeping_its_bytes(tmp_path, before, length):
    path = tmp_path / "p.bin"
    path.write_bytes(bytes(range(256)) * (before // 256) + bytes(before % 256))
    fd = os.open(path, os.O_RDWR)
    try:
        _lowlevel.preallocate(fd, length)
        assert os.fstat(fd).st_size == length
    finally:
        os.close(fd)
    kept = min(before, length)
    data = path.read_bytes()
    assert data[:kept] == (bytes(range(256)) * (before // 256 + 1))[:kept] and data[kept:] == bytes(length - kept)


def test_fsync_flushes_files_and_directories_and_names_a_bad_descriptor(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"durable")
    for target, flags in ((path, os.O_RDONLY), (tmp_path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))):
        fd = os.open(target, flags)
        try:
            _lowlevel.fsync(fd, str(target))
        finally:
            os.close(fd)
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)  # now a closed descriptor: tl_fsync reports the errno, naming the path
    with pytest.raises(OSError, match="fsync: Bad file descriptor") as info:
        _lowlevel.fsync(fd, str(path))
    assert info.value.filename == str(path) and info.value.errno == 9


# --- mapping, allocation ---------------------------------------------------------------------------


def test_map_readonly_is_a_readonly_view_of_the_file(tmp_path):
    path = tmp_path / "m.bin"
    path.write_bytes(bytes(range(256)) * 20)
    fd = os.open(path, os.O_RDONLY)
    try:
        view = _lowlevel.map_readonly(fd, 5120)
    finally:
        os.close(fd)  # the mapping outlives the descriptor
    assert view.readonly
    assert bytes(view[250:260]) == bytes(range(250, 256)) + bytes(range(4))
    arr = np.frombuffer(view, np.uint8)
    with pytest.raises(ValueError, match="read-only"):
        arr[0] = 1
    with pytest.raises(ValueError, match="WRITEABLE"):
        arr.flags.writeable = True


def test_map_writable_at_an_unaligned_offset_writes_the_file(tmp_path):
    path = tmp_path / "w.bin"
    fd = _fd(path, 0)
    try:
        _lowlevel.preallocate(fd, 10000)
        assert os.fstat(fd).st_size == 10000
        view, sync = _lowlevel.map_writable(fd, 5000, 100)
        assert len(view) == 100
        np.frombuffer(view, np.uint8)[:] = np.arange(100, dtype=np.uint8)
        sync()
    finally:
        os.close(fd)
    data = path.read_bytes()
    assert data[5000:5100] == bytes(range(100))
    assert data[:5000] == bytes(5000) and data[5100:] == bytes(4900)


def test_map_copy_is_writable_and_never_changes_the_file(tmp_path):
    path = tmp_path / "c.bin"
    path.write_bytes(bytes(range(256)) * 20)
    fd = os.open(path, os.O_RDONLY)  # a read-only descriptor is enough for a private mapping
    try:
        view = _lowlevel.map_copy(fd, 5120)
        other = _lowlevel.map_copy(fd, 5120)
    finally:
        os.close(fd)
    assert not view.readonly and len(view) == 5120
    arr = np.frombuffer(view, np.uint8)
    assert arr.flags.writeable and bytes(arr[250:252]) == bytes([250, 251])
    arr[:] = 0xEE
    assert (arr == 0xEE).all()
    assert path.read_bytes() == bytes(range(256)) * 20
    assert bytes(other[:3]) == bytes([0, 1, 2])  # each mapping's written pages are its own


def test_map_copy_and_map_readonly_name_the_errno(tmp_path):
    fd = os.open(tmp_path, os.O_RDONLY)  # a directory cannot be mapped
    try:
        for mapper in (_lowlevel.map_copy, _lowlevel.map_readonly):
            with pytest.raises(OSError, match="mmap") as e:
                mapper(fd, 10, str(tmp_path))
            assert e.value.errno == errno.ENODEV and e.value.filename == str(tmp_path)
    finally:
        os.close(fd)


def _mapped_ranges():
    with open("/proc/self/maps") as f:
        return {int(line.split("-", 1)[0], 16) for line in f}


def test_every_release_still_works_once_teardown_cleared_the_module(tmp_path, monkeypatch):
    """The release callbacks run at interpreter exit too, after module globals became None."""
    path = tmp_path / "t.bin"
    path.write_bytes(bytes(8192))
    fd = os.open(path, os.O_RDWR)
    try:
        regions = [np.frombuffer(_lowlevel.map_readonly(fd, 8192), np.uint8),
                   np.frombuffer(_lowlevel.map_copy(fd, 8192), np.uint8),
                   np.frombuffer(_lowlevel.map_writable(fd, 4096, 100)[0], np.uint8),
                   _lowlevel.alloc(3 << 20)]  # its own mapping (tl_alloc / tl_free)
    finally:
        os.close(fd)
    starts = [a.ctypes.data & ~4095 for a in regions]
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    for name in ("lib", "ffi", "os", "np"):  # what teardown clears
        monkeypatch.setattr(_lowlevel, name, None)
    regions.clear()
    gc.collect()
    monkeypatch.undo()
    assert unraisable == []
    if os.path.exists("/proc/self/maps"):
        assert not set(starts) & _mapped_ranges()  # each one unmapped


def test_every_c_owned_region_is_released_through_owned():
    """One ffi.gc in the package, in ``_base.lowlevel.owned``, and no other finalizer to fail at exit."""
    package = Path(_lowlevel.__file__).parent.parent
    found = [(p.relative_to(package).as_posix(), n) for p in sorted(package.rglob("*.py"))
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"ffi\.gc\(|weakref\.finalize|atexit\.register", line)]
    assert len(found) == 1 and found[0][0] == "_base/lowlevel.py", found


@pytest.mark.slow
def test_a_process_exits_silently_holding_views_and_an_open_writer_with_jax_imported(tmp_path):
    """Every release at exit (mappings, tl_alloc, a Writer's abort) runs after module globals were cleared."""
    pytest.importorskip("jax", reason="the exit-order defect showed with jax imported (pip install jax)")
    script = (
        "import jax, numpy as np, os, sys, tensorlist as tl\n"
        "p = os.path.join(sys.argv[1], 'm.tl')\n"
        "tl.save(p, {'a': np.arange(1 << 20, dtype=np.float32), 'b': np.ones(3)})\n"
        "KEPT = [tl.load(p), tl.load(p, mmap='copy'), tl.load(p, mmap=False), tl.open(p)]\n"
        "KEPT.append(jax.device_put(KEPT[0]['a']))\n"
        "W = tl.Writer(os.path.join(sys.argv[1], 'w.tl'))  # never committed: aborted at exit\n"
        "W.add('a', np.ones(3))\n"
        "R = W.reserve('r', (4,), np.float32)\n"
    )
    env = {**os.environ, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path)], capture_output=True,
                         text=True, timeout=120, env=env)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert sorted(p.name for p in tmp_path.iterdir() if "w.tl" in p.name) == []  # the open save was discarded


@pytest.mark.parametrize("n", [0, 10, 3 << 20])
def test_alloc_gives_writable_memory_of_the_size_asked(n):
    a = _lowlevel.alloc(n)
    assert a.dtype == np.uint8 and a.shape == (n,) and a.flags.writeable
    assert n == 0 or a.ctypes.data % _lowlevel.ALLOC_ALIGNMENT == 0
    a[:] = 7
    assert int(a.sum()) == 7 * n


# --- check_layout ---------------------------------------------------------------------------------


def _spans(rows):
    s = np.zeros(len(rows), _lowlevel.SPAN_DTYPE)
    for i, (off, ln, isz) in enumerate(rows):
        s[i] = (off, ln, isz)
    return s


@pytest.mark.parametrize(
    "rows, list_length, expected",
    [
        ([], 0, ("ok", -1, -1)),
        ([(0, 16, 4), (16, 8, 8), (24, 0, 4), (24, 0, 2)], 24, ("ok", -1, -1)),  # trailing empties
        ([(16, 8, 4), (0, 16, 4)], 24, ("ok", -1, -1)),  # unsorted but disjoint
        ([(0, 16, 4), (8, 0, 4), (16, 8, 4)], 24, ("ok", -1, -1)),  # empty inside another: no bytes
        ([(0, 8, 4), (12, 4, 4)], 16, ("align", 1, -1)),  # not a multiple of 8
        ([(0, 8, 4), (8, 16, 16)], 32, ("align", 1, -1)),  # not a multiple of the item size
        ([(0, 6, 4)], 8, ("length", 0, -1)),
        ([(0, 8, 4), (8, 16, 4)], 16, ("bounds", 1, -1)),  # ends past the list
        ([(-8, 8, 4)], 16, ("bounds", 0, -1)),  # negative offset
        ([(0, -4, 4)], 16, ("bounds", 0, -1)),  # negative length
        ([(2**63 - 8, 16, 8)], 2**63 - 1, ("overflow", 0, -1)),
        ([(0, 16, 4), (8, 8, 4)], 32, ("overlap", 1, 0)),  # sorted overlap
        ([(16, 16, 4), (0, 24, 4)], 32, ("overlap", 1, 0)),  # unsorted overlap
        ([(32, 8, 4), (0, 8, 4), (8, 32, 4)], 40, ("overlap", 2, 0)),  # unsorted, later culprit
    ],
    ids=["empty", "trailing-empty", "unsorted-ok", "empty-inside", "align8", "align-itemsize",
         "length", "bounds", "negative-offset", "negative-length", "overflow", "overlap",
         "overlap-unsorted", "overlap-unsorted-3"],
)
def test_check_layout_statuses(rows, list_length, expected):
    status, bad, other = _lowlevel.check_layout(_spans(rows), list_length, 8)
    assert (_lowlevel.STATUS_NAMES[status], bad, other) == expected


def test_check_layout_refuses_a_zero_itemsize():
    with pytest.raises(ValueError, match="invalid argument"):
        _lowlevel.check_layout(_spans([(0, 8, 0)]), 8, 8)
    with pytest.raises(ValueError, match="invalid argument"):
        _lowlevel.check_layout(_spans([(0, 8, 4)]), -1, 8)


def test_status_names_and_strerror_cover_every_code():
    codes = {getattr(lib, n): n for n in dir(lib) if n.startswith("TL_ERR_") or n == "TL_OK"}
    assert set(_lowlevel.STATUS_NAMES) == set(codes)
    messages = {ffi.string(lib.tl_strerror(c)).decode() for c in codes}
    assert len(messages) == len(codes) and "unknown status" not in messages
    assert ffi.string(lib.tl_strerror(999)).decode() == "unknown status"


@pytest.mark.parametrize("threads,writeback", [(1, False), (2, False), (2, True), (4, False), (4, True)])
def test_write_items_checksums_of_many_large_items_equal_the_stored_bytes(tmp_path, threads, writeback):
    """40 MiB in tensors of 3 MiB and odd sizes, among small and swapped ones: the checksums, by the
    writer itself (1 thread; 2 with writeback) or by helper threads over groups of items, are those of
    the stored bytes."""
    rng = np.random.default_rng(7)
    sizes = [(3 << 20) + 13 * i if i % 4 else 100 + i for i in range(18)]
    bufs = [rng.integers(0, 256, n, dtype=np.uint8) for n in sizes]
    bufs[5] = rng.integers(0, 2**32, 1 << 18, dtype=np.uint32).astype(">u4")
    swaps = [4 if b.dtype.byteorder == ">" else 0 for b in bufs]
    offsets, cursor = [], 0
    for b in bufs:
        cursor = (cursor + 63) // 64 * 64
        offsets.append(cursor)
        cursor += b.nbytes
    assert sum(b.nbytes for b, s in zip(bufs, swaps) if b.nbytes >= 256 << 10 and not s) > 32 << 20
    fd = _fd(tmp_path / "f", 0)
    try:
        crcs = _lowlevel.write_items(fd, bufs, offsets, swaps, 0, cursor, crc=True, fsync=False, sparse=False,
                                     threads=threads, writeback=writeback)
    finally:
        os.close(fd)
    data = (tmp_path / "f").read_bytes()
    for b, off, swap, crc in zip(bufs, offsets, swaps, crcs):
        stored = b.astype(b.dtype.newbyteorder("<")).tobytes() if swap else b.tobytes()
        assert data[off:off + b.nbytes] == stored
        assert crc == _lowlevel.crc32c(stored)
