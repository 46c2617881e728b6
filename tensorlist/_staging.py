"""The device load path: a TensorList read straight into accelerator memory.

The list's region is read once, front to back, in chunks. Each chunk is read
into one of a few pinned host buffers (``Reader.readinto``: parallel
``pread`` for a local file, concurrent ranged reads for a URL) and copied to
the device on a side stream, in one ``copy_`` per tensor piece, while the next
chunk is being read into the next buffer. A buffer is refilled only after the
copies out of it have finished (an event per buffer). Nothing else is staged:
no whole-file host copy, no pageable ``Tensor.to`` per tensor.

On a device without streams or pinned memory (any non-CUDA device, and the
CPU, which the tests use to exercise the chunking), the same plan runs with
ordinary buffers and synchronous copies.

Imports torch, ``reader``, ``_torch_bridge``, ``_lowlevel`` (CRC32C),
``_dtypes`` (the host's byte order) and ``errors``; the package facade
registers :func:`load` as the ``"device"`` backend, so
``tensorlist.load(path, device=...)`` reaches it without the core importing
torch.
"""
from __future__ import annotations

import warnings
from typing import Dict, List, Mapping, NamedTuple, Optional

import torch

from . import _dtypes, _lowlevel, reader
from ._torch_bridge import from_numpy, from_numpy_all, torch_dtype
from .errors import ChecksumError

__all__ = ["load", "load_into_device", "plan_chunks", "Chunk", "Piece", "Ring", "CHUNK_BYTES", "BUFFERS"]

#: Bytes per staging buffer (one chunk of the region).
CHUNK_BYTES = 32 << 20
#: Staging buffers in flight: one being filled while the others are copied out.
BUFFERS = 3
#: A gap between tensors larger than this starts a new chunk instead of being read.
MAX_GAP = 1 << 20


class Piece(NamedTuple):
    """Bytes ``[src, src + length)`` of a chunk go to bytes ``[dst, dst + length)`` of tensor ``index``."""

    index: int
    src: int
    dst: int
    length: int


class Chunk(NamedTuple):
    """Region bytes ``[start, start + length)``, read into one staging buffer, and where they go."""

    start: int
    length: int
    pieces: List[Piece]


def plan_chunks(offsets, lengths, chunk_bytes: int = CHUNK_BYTES, max_gap: int = MAX_GAP) -> List[Chunk]:
    """Cuts the region into chunks of at most ``chunk_bytes`` that cover every tensor's bytes.

    Tensors are taken in offset order; a chunk holds whole neighbours until the
    next would overflow it, a tensor larger than a chunk is split over several,
    and a gap wider than ``max_gap`` (a hand-made layout) is skipped rather
    than read. Empty tensors get no piece.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: offsets[i])
    chunks: List[Chunk] = []
    start = end = None
    pieces: List[Piece] = []

    def flush():
        if pieces:
            chunks.append(Chunk(start, end - start, list(pieces)))
            pieces.clear()

    for i in order:
        off, n, done = offsets[i], lengths[i], 0
        while done < n:
            at, rest = off + done, n - done
            if (start is None or at - end > max_gap or at < end or at + 1 - start > chunk_bytes
                    or (rest <= chunk_bytes and at + rest - start > chunk_bytes)):  # whole in a fresh chunk
                flush()
                start = end = at
            take = min(rest, start + chunk_bytes - at)
            pieces.append(Piece(i, at - start, done, take))
            end = at + take
            done += take
    flush()
    return chunks


def _staging_buffers(count: int, nbytes: int, pinned: bool) -> List[torch.Tensor]:
    return [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(count)]


def _usable(device, path) -> torch.device:
    """``device`` as a torch.device with its index; an error naming the file when torch cannot use it.

    Raises:
        ValueError: ``device`` names no torch device.
        RuntimeError: a CUDA device this torch cannot use.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{path}: {device!r} is not a torch device: {e}") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device or driver is visible"
        raise RuntimeError(f"{path}: cannot load onto {device}: {why}")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
        raise RuntimeError(f"{path}: cannot load onto {device}: torch sees {torch.cuda.device_count()} CUDA devices")
    return device


def load_into_device(r, device, *, keys=None, into: Optional[Mapping[str, torch.Tensor]] = None,
                     verify: bool = False, chunk_bytes: int = CHUNK_BYTES,
                     buffers: int = BUFFERS) -> Dict[str, torch.Tensor]:
    """Reads tensors of an open Reader (local or remote) into memory on ``device``.

    Args:
        r: a ``tensorlist.Reader`` (open it with ``mmap=False`` for parallel
            ``pread``s into the staging buffers) or a ``RemoteReader``.
        device: the target torch device.
        keys: the tensors to read (default: all), keyed as ``load`` keys them.
        into: existing destinations by key (a module's parameters): each must
            be contiguous, on ``device``, of the stored dtype and shape; it is
            written in place instead of a new tensor being allocated.
        verify: check each tensor's stored CRC32C on the staged bytes; a
            mismatch raises ChecksumError naming the tensor (tensors written
            through ``into`` may then hold the bad bytes).
        chunk_bytes, buffers: the staging ring (pinned on CUDA).

    Returns:
        dict key -> tensor on ``device``, in file order.

    Raises:
        FormatError: the data file was truncated while being read.
        ValueError: an ``into`` tensor does not fit its entry.
    """
    device = _usable(device, r.path)
    table = r.descriptor.tensors
    all_keys = table.keys()
    wanted = range(len(all_keys)) if keys is None else [r.info(k).index for k in keys]
    out: Dict[str, torch.Tensor] = {}
    flat: Dict[int, torch.Tensor] = {}  # index -> the destination's bytes
    for i in wanted:
        key = all_keys[i]
        dtype, shape = torch_dtype(table.dtypes[i].name), tuple(table.shapes[i])
        dst = into.get(key) if into is not None else None
        if dst is None:
            dst = torch.empty(shape, dtype=dtype, device=device)
        elif dst.dtype != dtype or tuple(dst.shape) != shape or dst.device != device or not dst.is_contiguous():
            raise ValueError(f"{r.path}: tensor {key!r} is {dtype} {list(shape)}; its destination is "
                             f"{dst.dtype} {list(dst.shape)} on {dst.device}"
                             f"{'' if dst.is_contiguous() else ', not contiguous'}")
        out[key] = dst
        if table.lengths[i]:
            flat[i] = dst.detach().reshape(-1).view(torch.uint8)
    if not _dtypes.NATIVE_LITTLE:  # the stored bytes are little-endian: let numpy swap them
        arrays = r.get_many([all_keys[i] for i in flat])
        with torch.no_grad():
            for i, a in zip(flat, arrays.values()):
                out[all_keys[i]].copy_(from_numpy(a))
        return out
    offsets = table.offsets
    chunks = plan_chunks([offsets[i] if i in flat else 0 for i in range(len(table))],
                         [table.lengths[i] if i in flat else 0 for i in range(len(table))], chunk_bytes)
    crcs = {i: 0 for i in flat if table.crcs is not None and table.crcs[i] is not None} if verify else {}
    _copy_chunks(r, chunks, flat, crcs, device, buffers)
    for i, got in crcs.items():
        if got != table.crcs[i]:
            raise ChecksumError(f"CRC32C of the data is {got:#010x}, the descriptor says {table.crcs[i]:#010x}",
                                file=r.path, tensor_index=i, tensor_name=table.names[i] if table.names else None,
                                field="crc32c")
    return out


class Ring:
    """The staging ring: ``count`` host buffers of ``nbytes``, pinned on CUDA and copied out on a side stream.

    Use: ``slot = ring.next()`` (waits until the copies out of that buffer
    have finished), fill ``ring.hosts[slot]`` (numpy, uint8), then
    ``ring.copy(slot, pairs)`` with ``(destination, view of ring.bufs[slot])``
    pairs. On a device without streams or pinned memory (the CPU included)
    the buffers are ordinary memory and the copies synchronous. Leaving the
    ``with`` block waits for every copy: none outlives its buffer or its
    caller. The one ring of every device load (``load_into_device``,
    ``tensorlist.dcp.TensorListReader``).
    """

    def __init__(self, device: torch.device, nbytes: int, count: int):
        self.cuda = device.type == "cuda"
        self.bufs = _staging_buffers(count, nbytes, pinned=self.cuda)
        self.hosts = [b.numpy() for b in self.bufs]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._done: List[Optional[torch.cuda.Event]] = [None] * count
        self._k = 0
        if self.cuda:  # the destinations were allocated on the current stream
            self.stream.wait_stream(torch.cuda.current_stream(device))

    def next(self) -> int:
        """The next buffer's index, once the copies out of it have finished."""
        slot = self._k % len(self.bufs)
        self._k += 1
        if self._done[slot] is not None:
            self._done[slot].synchronize()
        return slot

    def copy(self, slot: int, pairs) -> None:
        """``dst.copy_(src)`` for each pair, on the side stream (then an event marks the buffer busy)."""
        with torch.no_grad():
            if self.cuda:
                with torch.cuda.stream(self.stream):
                    for dst, src in pairs:
                        dst.copy_(src, non_blocking=True)
                    self._done[slot] = torch.cuda.Event()
                    self._done[slot].record(self.stream)
            else:
                for dst, src in pairs:
                    dst.copy_(src)

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:  # complete when the load returns (or raises)
            self.stream.synchronize()


def _copy_chunks(r, chunks: List[Chunk], flat: Dict[int, torch.Tensor], crcs: Dict[int, int],
                 device: torch.device, buffers: int) -> None:
    """Runs the plan: read chunk k into buffer k % buffers, copy it out on a side stream."""
    if not chunks:
        return
    with Ring(device, max(c.length for c in chunks), min(buffers, len(chunks))) as ring:
        for chunk in chunks:
            slot = ring.next()
            host, src = ring.hosts[slot][:chunk.length], ring.bufs[slot]
            r.readinto(host, chunk.start)
            ring.copy(slot, [(flat[p.index][p.dst:p.dst + p.length], src[p.src:p.src + p.length])
                             for p in chunk.pieces])
            for p in chunk.pieces:  # while the copies run: they only read the buffer
                if p.index in crcs:
                    crcs[p.index] = _lowlevel.crc32c(host[p.src:p.src + p.length], crcs[p.index])


def load(path, device, *, pointer: Optional[str] = None, mmap=True, verify: bool = False,
         chunk_bytes: int = CHUNK_BYTES, buffers: int = BUFFERS, **reader_options) -> Dict[str, torch.Tensor]:
    """Every tensor of a TensorList as torch tensors on ``device`` (``tensorlist.load(path, device=...)``).

    On the CPU the tensors share the file's memory mapping (zero-copy,
    read-only by contract) as ``tensorlist.torch.load_state`` returns them,
    or, with ``mmap="copy"``, share a copy-on-write mapping (writable; the
    file never changes), or with ``mmap=False`` live in one private, writable
    read. On any other device the list goes through the staging ring of
    :func:`load_into_device` (any ``mmap`` reads the same way there).
    """
    mmap = reader.read_mode(mmap)
    device = _usable(device, path)
    if device.type == "cpu":
        # bit carriers: torch holds bfloat16/float8 itself, so ml_dtypes is never imported here
        # (tensorlist.torch.load_state makes the same two calls for "cpu", without importing this module)
        arrays = reader.load(path, pointer=pointer, mmap=mmap, verify=verify, bits=True, **reader_options)
        return from_numpy_all(arrays)
    with reader.open(path, pointer=pointer, mmap=False, **reader_options) as r:
        if verify and len(r) and (r.descriptor.tensors.crcs is None
                                  or all(c is None for c in r.descriptor.tensors.crcs)):
            warnings.warn(f"{r.path}: verify=True but the file stores no checksums", stacklevel=3)
        return load_into_device(r, device, verify=verify, chunk_bytes=chunk_bytes, buffers=buffers)
