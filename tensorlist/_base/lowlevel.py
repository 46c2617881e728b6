"""The one module that touches the C core (``tensorlist._core``).

One thin wrapper per C function: arguments become cffi objects, status codes
become exceptions, and the owners of every buffer handed to C stay alive for
the whole call. cffi releases the GIL around each call.
"""
from __future__ import annotations

import os
from typing import Any, Callable, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist._core import ffi, lib

__all__ = [
    "LIST_ALIGNMENT",
    "MIN_TENSOR_ALIGNMENT",
    "STATUS_NAMES",
    "check_layout",
    "map_readonly",
    "map_copy",
    "owned",
    "map_writable",
    "preallocate",
    "fsync",
    "write_items",
    "pread_into",
    "read_new",
    "resident_fraction",
    "alloc",
    "crc32c",
    "crc32c_many",
    "CRC32C_IMPLS",
    "crc32c_impl",
    "crc32c_impls",
    "default_threads",
]

LIST_ALIGNMENT = int(lib.TL_LIST_ALIGNMENT)
MIN_TENSOR_ALIGNMENT = int(lib.TL_MIN_TENSOR_ALIGNMENT)

STATUS_NAMES = {
    lib.TL_OK: "ok",
    lib.TL_ERR_IO: "io",
    lib.TL_ERR_OVERFLOW: "overflow",
    lib.TL_ERR_BOUNDS: "bounds",
    lib.TL_ERR_ALIGN: "align",
    lib.TL_ERR_OVERLAP: "overlap",
    lib.TL_ERR_LENGTH: "length",
    lib.TL_ERR_ARG: "arg",
    lib.TL_ERR_NOMEM: "nomem",
    lib.TL_ERR_SHORT: "short",
    lib.TL_ERR_JSON: "json",
    lib.TL_ERR_FALLBACK: "fallback",
    lib.TL_ERR_FORMAT: "format",
}

def _mirror(ctype: str, fields: Sequence[Tuple[str, Any]]) -> np.dtype:
    """The numpy mirror of C struct ``ctype``, checked field by field against C's layout.

    Memory numpy and C share is in the host's byte order: each field's dtype is
    native (``np.dtype(t)`` of a sized integer type, never ``"<"``, the file's
    order), else a big-endian host hands C swapped lengths and offsets. cffi's
    compiled module knows C's ``sizeof`` and ``offsetof`` (it measured them
    with the C compiler), so names, order, offsets, sizes and the struct's size
    are compared with it here, at import.

    Raises:
        ImportError: the package and its ``_core`` disagree on the layout.
    """
    dt = np.dtype([(name, np.dtype(t)) for name, t in fields], align=True)
    c_fields = ffi.typeof(ctype).fields
    same = [name for name, _ in c_fields] == list(dt.names) and ffi.sizeof(ctype) == dt.itemsize and all(
        dt.fields[name][1] == f.offset and dt.fields[name][0].itemsize == ffi.sizeof(f.type)
        and dt.fields[name][0].byteorder in "=|" for name, f in c_fields)
    if not same:
        raise ImportError(f"tensorlist._core was built with a different layout of {ctype}; rebuild the package")
    return dt


# The numpy mirrors of the C structs (tensorlist_cdef.h), in the host's byte order.
SPAN_DTYPE = _mirror("tl_span", [("offset", np.int64), ("length", np.int64), ("itemsize", np.int64)])
ITEM_DTYPE = _mirror(
    "tl_write_item",
    [("src", np.uintp), ("length", np.uint64), ("offset", np.uint64), ("swap", np.uint32), ("crc", np.uint32)],
)


def default_threads() -> int:
    """Threads for parallel I/O: the usable cores, at most 8 (C lowers it for small jobs)."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 8))


def _raise(status: int, err_no: int, what: str, path: Optional[str] = None):
    if status == lib.TL_ERR_IO:
        raise OSError(err_no, f"{what}: {os.strerror(err_no)}", path)
    if status == lib.TL_ERR_NOMEM:
        raise MemoryError(f"{what}: out of memory")
    if status == lib.TL_ERR_SHORT:
        raise EOFError(f"{what}: {ffi.string(lib.tl_strerror(status)).decode()}")
    raise ValueError(f"{what}: {ffi.string(lib.tl_strerror(status)).decode()}")


def check_layout(spans: np.ndarray, list_length: int, min_alignment: int) -> Tuple[int, int, int]:
    """Runs the C layout check over a SPAN_DTYPE array.

    Returns:
        (status, bad_index, other_index); status is a TL_* code, 0 when the layout is sound.
    """
    spans = np.ascontiguousarray(spans, dtype=SPAN_DTYPE)
    bad = ffi.new("int64_t *")
    other = ffi.new("int64_t *")
    cspans = ffi.from_buffer("tl_span[]", spans) if len(spans) else ffi.NULL
    status = lib.tl_check_layout(len(spans), cspans, list_length, min_alignment, bad, other)
    if status == lib.TL_ERR_ARG or status == lib.TL_ERR_NOMEM:
        _raise(status, 0, "layout check")
    return int(status), int(bad[0]), int(other[0])


def owned(addr, length: int, release: Callable[[Any, int], int]):
    """A ``char *`` over ``[addr, addr + length)`` that calls ``release(addr, length)`` when collected.

    Every C-owned region of the package (mappings, tl_alloc memory) is handed
    out through here. ``release`` is a C function (``lib.tl_unmap``,
    ``lib.tl_free``) bound now, at creation: the callback may run while the
    interpreter tears down, when this module's globals (``lib`` included) are
    already None, and it must not look anything up then. It looks up no name
    and raises nothing: a release that fails at exit has no one to tell.

    Safety: ``release`` must accept exactly this address and length once.
    """
    def _release(p, _release=release, _length=length):
        _release(p, _length)

    return ffi.gc(ffi.cast("char *", addr), _release, size=length)


def map_readonly(fd: int, length: int, path: Optional[str] = None) -> memoryview:
    """Maps the first ``length`` bytes of ``fd`` read-only (MAP_PRIVATE).

    Returns a read-only memoryview; the mapping is released when the last view
    of it (every numpy array made from it included) is garbage-collected.
    """
    addr = ffi.new("void **")
    err = ffi.new("int *")
    status = lib.tl_map_readonly(fd, length, addr, err)
    if status:
        _raise(status, err[0], "mmap", path)
    owner = owned(addr[0], length, lib.tl_unmap)
    # ffi.buffer keeps `owner` alive; toreadonly() stops numpy from ever writing
    # into the PROT_READ pages (which would kill the process).
    return memoryview(ffi.buffer(owner, length)).toreadonly()


def map_copy(fd: int, length: int, path: Optional[str] = None) -> memoryview:
    """Maps the first ``length`` bytes of ``fd`` copy-on-write (MAP_PRIVATE, readable and writable).

    Returns a writable memoryview: writes go to pages private to this process
    and never reach the file (``fd`` may be read-only). The mapping is released
    when the last view of it is garbage-collected, as for :func:`map_readonly`.

    Raises:
        OSError: the system refused the mapping (under strict overcommit, one
            larger than the memory that may still be committed: ENOMEM).
    """
    addr = ffi.new("void **")
    err = ffi.new("int *")
    status = lib.tl_map_copy(fd, length, addr, err)
    if status:
        _raise(status, err[0], "mmap", path)
    return memoryview(ffi.buffer(owned(addr[0], length, lib.tl_unmap), length))


def map_writable(fd: int, offset: int, length: int, path: Optional[str] = None):
    """Maps ``[offset, offset + length)`` of ``fd`` shared and writable.

    Returns:
        (memoryview over exactly that range, sync) where ``sync()`` msyncs it.
    """
    map_addr = ffi.new("void **")
    map_len = ffi.new("uint64_t *")
    data = ffi.new("void **")
    err = ffi.new("int *")
    status = lib.tl_map_writable(fd, offset, length, map_addr, map_len, data, err)
    if status:
        _raise(status, err[0], "mmap", path)
    span = int(map_len[0])
    owner = owned(map_addr[0], span, lib.tl_unmap)
    delta = int(ffi.cast("uintptr_t", data[0])) - int(ffi.cast("uintptr_t", map_addr[0]))
    whole = ffi.buffer(owner, span)

    def sync() -> None:
        e = ffi.new("int *")
        st = lib.tl_msync(owner, span, e)
        if st:
            _raise(st, e[0], "msync", path)

    return memoryview(whole)[delta : delta + length], sync


def preallocate(fd: int, length: int, path: Optional[str] = None) -> None:
    """Sizes the file to ``length`` bytes, reserving disk space where possible."""
    err = ffi.new("int *")
    status = lib.tl_preallocate(fd, length, err)
    if status:
        _raise(status, err[0], "preallocate", path)


def fsync(fd: int, path: Optional[str] = None) -> None:
    """Flushes ``fd`` (a file or a directory) to stable storage: the one durability rule.

    ``tl_fsync``: ``F_FULLFSYNC`` on macOS (whose ``fsync`` leaves the data in
    the drive's cache), ``fsync`` where that is refused and on other systems
    (docs/SECURITY.md, "Durability per platform"). Every fsync of the package goes through here.

    Raises:
        OSError: the system refused (errno and ``path`` set).
    """
    err = ffi.new("int *")
    status = lib.tl_fsync(fd, err)
    if status:
        _raise(status, err[0], "fsync", path)


#: write_items gathers buffers up to this size with one bytes.join instead of pinning each.
_GATHER_MAX = 4096


def write_items(
    fd: int,
    buffers: Sequence[np.ndarray],
    offsets: Sequence[int],
    swaps: Sequence[int],
    region_start: int,
    region_end: int,
    *,
    crc: bool,
    fsync: bool,
    sparse: bool,
    threads: Optional[int] = None,
    path: Optional[str] = None,
    writeback: bool = False,
) -> Optional[List[int]]:
    """Writes C-contiguous arrays at absolute file offsets with zero padding.

    Safety: ``buffers`` must stay alive and unmodified during the call; they
    are read in place (no copy), except small ones, which are gathered into a
    staging buffer, and byte-swapped ones, which are swapped into it.

    Returns:
        The CRC32C of each item's stored bytes when ``crc``; else None.
    """
    n = len(buffers)
    items = np.zeros(n, dtype=ITEM_DTYPE)
    keep = None
    if n:
        lengths = np.array([b.nbytes for b in buffers], dtype=np.uint64)
        items["length"] = lengths
        items["offset"] = offsets
        items["swap"] = swaps
        small = lengths <= _GATHER_MAX
        src = np.empty(n, dtype=ITEM_DTYPE["src"])
        keep = []
        if small.any():
            # Pinning costs about 1 us a buffer; one bytes.join copies all the
            # small ones (C copies them into its staging buffer anyway).
            idx = np.flatnonzero(small)
            blob = ffi.from_buffer(b"".join([buffers[i] for i in idx.tolist()]))
            keep.append(blob)
            part = lengths[idx]
            src[idx] = np.cumsum(part) - part + src.dtype.type(int(ffi.cast("uintptr_t", blob)))
        if not small.all():
            idx = np.flatnonzero(~small)
            pinned = [ffi.from_buffer(buffers[i]) for i in idx.tolist()]  # pins each buffer for the call
            keep.extend(pinned)
            src[idx] = np.frombuffer(ffi.buffer(ffi.new("const void *[]", pinned)), src.dtype)
        items["src"] = src
    flags = (lib.TL_WRITE_CRC if crc else 0) | (lib.TL_WRITE_FSYNC if fsync else 0)
    flags |= lib.TL_WRITE_SPARSE if sparse else 0
    flags |= lib.TL_WRITE_WRITEBACK if writeback else 0  # the caller fsyncs later: start the disk early
    err = ffi.new("int *")
    citems = ffi.from_buffer("tl_write_item[]", items) if n else ffi.NULL
    status = lib.tl_write_items(
        fd, citems, n, region_start, region_end, threads or default_threads(), flags, err
    )
    del keep
    if status:
        _raise(status, err[0], "write", path)
    return items["crc"].tolist() if crc else None


def pread_into(fd: int, dst, offset: int, threads: Optional[int] = None, path: Optional[str] = None) -> None:
    """Fills the writable buffer ``dst`` from ``fd`` at ``offset`` with parallel preads.

    Raises:
        EOFError: the file ends before ``offset + len(dst)``.
    """
    cdst = ffi.from_buffer(dst, require_writable=True)
    n = len(cdst)
    if n == 0:
        return
    err = ffi.new("int *")
    status = lib.tl_pread_full(fd, cdst, n, offset, threads or default_threads(), err)
    if status:
        _raise(status, err[0], "read", path)


#: read_new() reads at least this much with O_DIRECT when the range is cold (smaller reads: the page cache).
DIRECT_MIN = 64 << 20
#: ... and when less than this fraction of the range is in the page cache.
DIRECT_BELOW_RESIDENT = 0.5


def resident_fraction(fd: int, offset: int, length: int, path: Optional[str] = None) -> float:
    """The fraction of the pages of ``[offset, offset + length)`` of ``fd`` in the page cache (mincore)."""
    resident, pages, err = ffi.new("uint64_t *"), ffi.new("uint64_t *"), ffi.new("int *")
    status = lib.tl_resident(fd, offset, length, resident, pages, err)
    if status:
        _raise(status, err[0], "mincore", path)
    return resident[0] / pages[0] if pages[0] else 1.0


def read_new(fd: int, offset: int, length: int, path: Optional[str] = None) -> np.ndarray:
    """``length`` bytes of ``fd`` at ``offset`` in fresh memory (see :func:`alloc`), the fastest way here.

    The one choice between the two ways to read: from the page cache (parallel
    ``pread``), or, when at least ``DIRECT_MIN`` bytes are wanted and less than
    ``DIRECT_BELOW_RESIDENT`` of them are cached (``mincore``), with O_DIRECT
    (Linux) into 2 MiB pages, 8 requests of up to 64 MiB in flight: the disk writes
    into the buffer, and nothing is copied through, or evicted from, the page
    cache. Direct reads need 4 KiB-aligned ranges, so
    the buffer then starts at the page holding ``offset`` and the result is a
    view at ``offset``'s place in that page (the same address alignment as the
    offset has in the file; 64-byte aligned offsets only, as alloc() promises).

    Raises:
        EOFError: the file ends before ``offset + length``.
    """
    align = int(lib.TL_DIRECT_ALIGN)
    if (length < DIRECT_MIN or offset % ALLOC_ALIGNMENT
            or resident_fraction(fd, offset, length, path) >= DIRECT_BELOW_RESIDENT):
        out = alloc(length)
        pread_into(fd, out, offset, path=path)
        return out
    head = offset % align
    start, end = offset - head, offset + length
    body = (end - start) // align * align  # the direct part; the tail under one block goes through the cache
    buf = alloc(end - start, huge=True)
    err = ffi.new("int *")
    status = lib.tl_pread_direct(fd, ffi.from_buffer(buf[:body], require_writable=True), body, start,
                                 default_threads(), err)
    if status == lib.TL_ERR_FALLBACK:  # the filesystem refuses O_DIRECT: ordinary pages, through the cache
        del buf
        out = alloc(length)
        pread_into(fd, out, offset, path=path)
        return out
    if status:
        _raise(status, err[0], "read", path)
    if end > start + body:
        pread_into(fd, buf[body:], start + body, path=path)
    return buf[head:]


#: Where alloc() starts a small buffer: XLA aliases a host buffer (``jax.device_put`` on the CPU)
#: only at a 64-byte aligned address, and malloc promises 16.
ALLOC_ALIGNMENT = 64


def alloc(length: int, huge: bool = False) -> np.ndarray:
    """A writable uint8 array of ``length`` bytes in fresh memory, at least 64-byte aligned.

    Small requests are a slice of a numpy buffer, ``ALLOC_ALIGNMENT`` aligned.
    Large requests use their own anonymous mapping (returned to the system
    when the last view goes), with 2 MiB pages only if ``huge``: an O_DIRECT
    read into them is faster, a read through the page cache about 2x slower
    on the VMs we measure on (numpy's allocator advises them for every large
    array; see csrc/tl_map.c, tl_alloc).
    """
    if length < (2 << 20):
        raw = np.empty(length + ALLOC_ALIGNMENT - 1, dtype=np.uint8)
        skip = -raw.ctypes.data % ALLOC_ALIGNMENT
        return raw[skip:skip + length]
    out = ffi.new("void **")
    err = ffi.new("int *")
    status = lib.tl_alloc(length, 1 if huge else 0, out, err)
    if status:
        _raise(status, err[0], "alloc")
    owner = owned(out[0], length, lib.tl_free)
    return np.frombuffer(ffi.buffer(owner, length), dtype=np.uint8)


def crc32c(data, crc: int = 0) -> int:
    """CRC32C of a buffer (bytes, memoryview or contiguous array), continuing ``crc``."""
    buf = ffi.from_buffer(data)
    return int(lib.tl_crc32c(crc, buf, len(buf)))


#: The CRC32C implementations of csrc/crc32c*.c by name; "auto" is the dispatcher's choice,
#: what crc32c() and the writes run.
CRC32C_IMPLS = {
    "auto": lib.TL_CRC_AUTO,
    "portable": lib.TL_CRC_PORTABLE,
    "sse42": lib.TL_CRC_SSE42,
    "sse42_3way": lib.TL_CRC_SSE42_3WAY,
    "arm64": lib.TL_CRC_ARM64,
    "arm64_3way": lib.TL_CRC_ARM64_3WAY,
    "arm64_3way_soft": lib.TL_CRC_ARM64_3WAY_SOFT,
    "vpclmul": lib.TL_CRC_VPCLMUL,
}
if sorted(CRC32C_IMPLS.values()) != list(range(lib.TL_CRC_IMPLS)):
    raise ImportError("tensorlist._core was built with different CRC32C implementations; rebuild the package")
_CRC32C_NAMES = {code: name for name, code in CRC32C_IMPLS.items()}


def crc32c_impl(impl: str, data, crc: int = 0) -> int:
    """CRC32C of a buffer through one named implementation (``CRC32C_IMPLS``), continuing ``crc``.

    Raises:
        ValueError: ``impl`` is unknown, or not compiled into this build, or this CPU lacks it.
    """
    code = CRC32C_IMPLS.get(impl) if isinstance(impl, str) else None
    buf = ffi.from_buffer(data)
    out = ffi.new("uint32_t *")
    if code is None or lib.tl_crc32c_impl(code, crc, buf, len(buf), out):
        raise ValueError(f"crc32c implementation {impl!r} is not available here (available: "
                         f"{', '.join(crc32c_impls()[0])})")
    return int(out[0])


def crc32c_impls(length: int = 1 << 20) -> Tuple[List[str], str]:
    """The CRC32C implementations this build and CPU run, and the one crc32c() uses for ``length`` bytes.

    Returns:
        (names of the available implementations, "auto" excluded; the dispatcher's choice).
    """
    mask = ffi.new("uint32_t *")
    chosen = ffi.new("int *")
    status = lib.tl_crc32c_impls(length, mask, chosen)
    if status:
        _raise(status, 0, "crc32c")
    names = [name for name, code in CRC32C_IMPLS.items() if code and mask[0] >> code & 1]
    return names, _CRC32C_NAMES[chosen[0]]


def crc32c_many(buffers: Sequence, threads: Optional[int] = None) -> List[int]:
    """CRC32C of each buffer, computed in parallel with the GIL released."""
    n = len(buffers)
    if n == 0:
        return []
    keep = [ffi.from_buffer(b) for b in buffers]
    ptrs = ffi.new("const void *[]", keep)
    lengths = ffi.new("uint64_t[]", [len(k) for k in keep])
    out = ffi.new("uint32_t[]", n)
    status = lib.tl_crc32c_many(n, ptrs, lengths, out, threads or default_threads())
    if status:
        _raise(status, 0, "crc32c")
    return list(out)


# --- descriptor fast path (csrc/descriptor.c) -----------------------------------

JSON_OK, JSON_INVALID, JSON_FALLBACK = 0, int(lib.TL_ERR_JSON), int(lib.TL_ERR_FALLBACK)
MAX_SPANS = 4096


def json_scan(buf: bytes) -> Tuple[int, List[Tuple[int, int]], int]:
    """Strict-JSON check of a whole document in C.

    Returns:
        (status, spans, error_pos): status is JSON_OK, JSON_INVALID or
        JSON_FALLBACK; spans are the [start, end) byte ranges of the
        ``tensors`` arrays of TensorList objects.
    """
    spans = ffi.new("uint64_t[]", 2 * MAX_SPANS)
    n = ffi.new("uint64_t *")
    pos = ffi.new("uint64_t *")
    status = lib.tl_json_scan(ffi.from_buffer(buf), len(buf), spans, MAX_SPANS, n, pos)
    if status == lib.TL_ERR_NOMEM:
        raise MemoryError("json scan: out of memory")
    if status not in (JSON_OK, JSON_INVALID, JSON_FALLBACK):
        return JSON_FALLBACK, [], int(pos[0])
    return int(status), [(int(spans[2 * i]), int(spans[2 * i + 1])) for i in range(n[0])], int(pos[0])


#: parse_tensors reads spans up to this size in one pass into columns sized for
#: the most tensors, dims and name bytes the span can hold (a tensor object
#: takes at least 44 bytes, a dim 2); larger spans are counted first.
_ONE_PASS_MAX = 1 << 20


def _parse_tensors_one_pass(cbuf, start, end, table, max_tensors, n, nd, nu, bad):
    """One fill pass with upper-bound capacities; False when the two-pass path must decide."""
    span = end - start
    cap, dcap = span // 40 + 1, span // 2 + 1
    cols = {k: np.empty(cap, np.int64) for k in ("codes", "offsets", "lengths", "crcs", "ndims")}
    cols["dims"] = np.empty(dcap, np.int64)
    names = bytearray(span)
    flags = np.empty(cap, np.uint8)
    status = lib.tl_parse_tensors(
        cbuf, start, end, table, cap, ffi.from_buffer("int64_t[]", cols["codes"]),
        ffi.from_buffer("int64_t[]", cols["offsets"]), ffi.from_buffer("int64_t[]", cols["lengths"]),
        ffi.from_buffer("int64_t[]", cols["crcs"]), ffi.from_buffer("int64_t[]", cols["ndims"]),
        ffi.from_buffer("int64_t[]", cols["dims"]), dcap, ffi.from_buffer("char[]", names), span,
        ffi.from_buffer("uint8_t[]", flags), n, nd, nu, bad)
    if status == lib.TL_ERR_ARG:
        return False  # a capacity was too small after all (or a real argument error): count first
    if status != lib.TL_OK or n[0] > max_tensors:
        return None
    count, ndim_total, names_len = int(n[0]), int(nd[0]), int(nu[0])
    out = {k: v[:count] for k, v in cols.items()}
    out["dims"] = cols["dims"][:ndim_total]
    out["names"] = bytes(names[:names_len])
    out["name_flags"] = flags[:count]
    return out


def parse_tensors(buf: bytes, start: int, end: int, itemsize_by_code: np.ndarray, max_tensors: int):
    """Reads a ``tensors`` array span into columns, or returns None when a rule is broken.

    Returns:
        dict with int64 arrays ``codes``, ``offsets``, ``lengths``, ``crcs`` (-1 =
        none), ``ndims``, ``dims``; ``names`` (bytes, NUL-separated) and uint8
        ``name_flags`` (1 named, 2 escaped); or None (use the exact reader).
        Raises OverflowError-free: a count above ``max_tensors`` also returns None.
    """
    cbuf = ffi.from_buffer(buf)
    table = ffi.from_buffer("int64_t[]", itemsize_by_code)
    n = ffi.new("uint64_t *")
    nd = ffi.new("uint64_t *")
    nu = ffi.new("uint64_t *")
    bad = ffi.new("int64_t *")
    null = ffi.NULL
    if end - start <= _ONE_PASS_MAX:
        cols = _parse_tensors_one_pass(cbuf, start, end, table, max_tensors, n, nd, nu, bad)
        if cols is not False:
            return cols
    status = lib.tl_parse_tensors(cbuf, start, end, table, 0, null, null, null, null, null, null, 0, null, 0,
                                  null, n, nd, nu, bad)
    if status != lib.TL_OK or n[0] > max_tensors:
        return None
    count, ndim_total, names_len = int(n[0]), int(nd[0]), int(nu[0])
    cols = {k: np.empty(count, np.int64) for k in ("codes", "offsets", "lengths", "crcs", "ndims")}
    cols["dims"] = np.empty(ndim_total, np.int64)
    names = bytearray(names_len)
    flags = np.empty(count, np.uint8)

    def ptr(a, t="int64_t[]"):
        return ffi.from_buffer(t, a) if len(a) else null

    status = lib.tl_parse_tensors(
        cbuf, start, end, table, count, ptr(cols["codes"]), ptr(cols["offsets"]), ptr(cols["lengths"]),
        ptr(cols["crcs"]), ptr(cols["ndims"]), ptr(cols["dims"]), ndim_total,
        ffi.from_buffer("char[]", names) if names_len else null, names_len, ptr(flags, "uint8_t[]"), n, nd, nu, bad)
    if status != lib.TL_OK:
        return None
    cols["names"] = bytes(names)
    cols["name_flags"] = flags
    return cols
