"""Sharded ``jax.Array``s saved by every process, loaded onto any mesh: the DCP layout, written from JAX.

A sharded save is a checkpoint directory in exactly the layout
:mod:`tensorlist.dcp` reads (docs/FORMAT.md, "Distributed checkpoints
(DCP)"), so ``dcp.read_full``, ``validate_checkpoint``, ``tensorlist
validate``/``inspect``/``convert`` and torch's ``dcp.load`` read it as they
read any other. Each array is a tensor whose fqn is its name (the leaf's key
path, ``params/dense/kernel``); ``tensorlist.jax``'s tree header goes in the
metadata's optional ``"tree"`` object.

Saving (:func:`save_dir`, called by every process with the same arrays):

1. the plan, which every process computes alike without communicating: each
   distinct index of ``sharding.devices_indices_map(shape)`` is one chunk,
   saved from the first device (by device id) holding it (replica 0) by the
   process owning that device; a host value (numpy), and while several
   processes run a ``jax.Array`` each process holds whole (a process-local
   value, the same in every process), is one chunk, written by process 0;
2. process 0 draws the saveId and broadcasts it (one process: no collective);
3. each process writes its chunks from its ``addressable_shards`` as
   ``<process>.<saveId>.tl`` through :func:`tensorlist.writer.save` (atomic);
   a process with no chunk writes no file;
4. every process reports whether its write succeeded (``process_allgather``:
   a barrier that also carries a failure to the others instead of leaving
   them waiting); process 0 checks the metadata, commits ``.metadata.json``
   (the commit point) and deletes the files of other saves;
5. a last exchange: :func:`save_dir` returns in every process once the commit
   is visible, or raises in every process if process 0 failed to commit.

A process that dies (rather than raising) leaves the others waiting in a
collective, as any JAX collective does; the previous checkpoint stays
loadable, and the next committed save deletes what the killed one wrote.

Loading (:func:`open_dir`): the metadata and every shard descriptor are read
and checked when the checkpoint is opened (a missing or truncated shard, a
chunk outside its array, a shard that disagrees with the metadata: a
FormatError naming the file, before any array is built). For a target
sharding, each local device gets the block
``sharding.addressable_devices_indices_map(shape)`` names, and only the bytes
of that block are touched: a block whose bytes lie in order in the mapping (a
saved chunk, rows of one, or row chunks written back to back in one shard
file) is a view of the mapping itself (zero-copy onto a CPU device when
64-byte aligned, as tensorlist's default alignment makes every chunk); any
other block is assembled from the intersecting chunks' sub-blocks into one new
buffer.

Imports jax, ``_bridges.jax`` (every jax <-> numpy conversion and dtype rule),
``dcp`` (the layout), ``writer``, ``format``, ``dtypes``, ``_base.jsonio``,
``backends`` and ``errors``.
"""
from __future__ import annotations

import math
import os
import secrets
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import jax
import numpy as np

from tensorlist._base import backends
from tensorlist._base import dtypes
from tensorlist._bridges import jax as _jax_bridge
from tensorlist._base.jsonio import check_json, escape_pointer
from tensorlist.dcp import (DCP_VERSION, METADATA_NAME, Shards, StorageEntry, TensorMeta, commit_metadata, is_save_file,
                       join, listing, metadata_document, parse_metadata, read_metadata, shard_name, tensor_key)
from tensorlist.errors import FormatError
from tensorlist.format import DEFAULT_ALIGNMENT, Limits
from tensorlist.writer import save

__all__ = ["save_dir", "open_dir", "ShardedCheckpoint", "plan_chunks"]

#: The saveId's length in bytes (8 hex digits, the layout's ``saveId``).
_SAVE_ID_BYTES = 4

Box = Tuple[Tuple[int, ...], Tuple[int, ...]]  # (offsets, sizes)


@dataclass(frozen=True)
class Chunk:
    """One saved piece of an array: where it lies and who writes it.

    Attributes:
        offsets, sizes: the piece's box in the whole array.
        device: the device whose shard is written (None: a host value).
        process: the process that writes it.
    """

    offsets: Tuple[int, ...]
    sizes: Tuple[int, ...]
    device: Any
    process: int


def _numel(sizes: Sequence[int]) -> int:
    return math.prod(sizes)


def _box(index: Tuple[slice, ...], shape: Tuple[int, ...], name: str) -> Box:
    """The (offsets, sizes) of a sharding's index (a tuple of slices) into an array of ``shape``."""
    offsets, sizes = [], []
    for d, dim in enumerate(shape):
        s = index[d] if d < len(index) else slice(None)
        start, stop, step = s.indices(dim)
        if step != 1:
            raise ValueError(f"array {name!r}: a shard indexes dimension {d} with step {step}; only contiguous "
                             "slices can be saved or loaded")
        offsets.append(start)
        sizes.append(max(stop - start, 0))
    return tuple(offsets), tuple(sizes)


def _dtype_name(dtype, name: str) -> str:
    try:
        return dtypes.from_numpy(np.dtype(dtype)).name
    except (KeyError, TypeError, ValueError) as e:
        raise TypeError(f"array {name!r}: dtype {dtype} has no tensorlist dataType code") from e


def plan_chunks(name: str, value: Any) -> Tuple[str, Tuple[int, ...], List[Chunk]]:
    """The chunks a save writes for one array: the same in every process, computed without communication.

    Each distinct index of ``value.sharding.devices_indices_map(shape)`` is one
    chunk, written from the first device (by id) holding it; empty indices are
    skipped, and an array without elements is one (empty) chunk. A value that
    is not a ``jax.Array``, or that is fully addressable while several
    processes run (each holds its own copy, on its own devices: their plans
    would disagree), is one chunk of process 0.

    Returns:
        (dtype name, shape, chunks ordered by offsets)

    Example:
        >>> import numpy as np
        >>> plan_chunks("w", np.zeros((2, 3), np.float32))[2]
        [Chunk(offsets=(0, 0), sizes=(2, 3), device=None, process=0)]
    """
    shape = tuple(int(d) for d in np.shape(value))
    dtype = _dtype_name(value.dtype, name) if hasattr(value, "dtype") else _dtype_name(np.asarray(value).dtype, name)
    if (not _jax_bridge.is_array(value) or _numel(shape) == 0
            or (jax.process_count() > 1 and value.is_fully_addressable)):
        return dtype, shape, [Chunk((0,) * len(shape), shape, None, 0)]
    owners: Dict[Box, Any] = {}
    index_map = value.sharding.devices_indices_map(shape)
    for device in sorted(index_map, key=lambda d: d.id):
        box = _box(index_map[device], shape, name)
        if _numel(box[1]) and box not in owners:
            owners[box] = device
    chunks = [Chunk(off, sz, dev, dev.process_index) for (off, sz), dev in owners.items()]
    return dtype, shape, sorted(chunks, key=lambda c: c.offsets)


def _chunk_array(name: str, value: Any, chunk: Chunk) -> np.ndarray:
    """The host bytes of one chunk this process writes."""
    if chunk.device is None:
        if _jax_bridge.is_array(value) and not _numel(chunk.sizes):  # nothing to fetch from a device
            return np.zeros(chunk.sizes, np.dtype(value.dtype))
        return _jax_bridge.to_numpy(value, name)
    for shard in value.addressable_shards:
        if shard.device == chunk.device:
            a = _jax_bridge.to_numpy(shard.data, name)
            if tuple(a.shape) != chunk.sizes:
                raise ValueError(f"array {name!r}: the shard on {chunk.device} has shape {list(a.shape)}, its index "
                                 f"says {list(chunk.sizes)}")
            return a
    raise ValueError(f"array {name!r}: device {chunk.device} of process {chunk.process} holds no addressable shard "
                     "here")


def _agree(flag: bool, what: str) -> None:
    """A barrier that also tells every process whether all of them succeeded (no collective for one process)."""
    if jax.process_count() == 1:
        return
    from jax.experimental import multihost_utils

    flags = np.asarray(multihost_utils.process_allgather(np.array([1 if flag else 0], np.int32)))
    failed = [i for i, f in enumerate(flags.reshape(-1)) if not f]
    if flag and failed:
        raise RuntimeError(f"sharded save: {what} failed in process(es) {failed} (their own error says why)")


def _save_id() -> str:
    drawn = secrets.token_bytes(_SAVE_ID_BYTES)
    if jax.process_count() > 1:
        from jax.experimental import multihost_utils

        drawn = bytes(np.asarray(multihost_utils.broadcast_one_to_all(np.frombuffer(drawn, np.uint8)),
                                 np.uint8).tobytes())
    return drawn.hex()


def _one_view(parts: List[Tuple[np.ndarray, Tuple[slice, ...]]], sizes: Tuple[int, ...]) -> Optional[np.ndarray]:
    """The block as one view when its parts are back to back in one mapping, row blocks in order; else None.

    One part: itself when C-contiguous (the box is a saved chunk, or rows of
    one). Several: each C-contiguous, spanning the box in every dimension but
    the first, consecutive along it, and each starting where the previous
    ends in the same mapped buffer (``base``; chunks of one shard file
    written in order: a 4 -> 2 reshard of a one-process save). Views of
    different buffers, or of pread copies, are never joined: the view keeps
    only the first part's buffer alive.
    """
    if len(parts) == 1:
        return parts[0][0] if parts[0][0].flags.c_contiguous else None
    parts = sorted(parts, key=lambda p: p[1][0].start)
    base = parts[0][0].base
    row = 0
    for i, (part, into) in enumerate(parts):
        if (base is None or part.base is not base or not part.flags.c_contiguous or into[0].start != row
                or any(s.start != 0 or s.stop != n for s, n in zip(into[1:], sizes[1:]))):
            return None
        if i and parts[i - 1][0].ctypes.data + parts[i - 1][0].nbytes != part.ctypes.data:
            return None
        row = into[0].stop
    if row != sizes[0]:
        return None
    first = parts[0][0]
    strides = [first.itemsize]
    for n in reversed(sizes[1:]):
        strides.insert(0, strides[0] * n)
    return np.lib.stride_tricks.as_strided(first, shape=sizes, strides=strides, writeable=False)


def save_dir(path, leaves: Dict[str, Any], header: Optional[dict], *, alignment: int = DEFAULT_ALIGNMENT,
             checksum: bool = True, durable: bool = True) -> None:
    """Saves arrays (sharded ``jax.Array``s included) as a checkpoint directory; called by every process.

    Every process passes the same names, in the same order, for the same
    global arrays; each writes the chunks its devices hold (replica 0 only),
    and process 0 commits the metadata last. Returns once the commit is
    visible to every process (module docstring: the steps).

    Args:
        path: the checkpoint directory (created if missing; a committed
            checkpoint there is replaced atomically).
        leaves: name (the fqn) -> ``jax.Array`` or host array.
        header: stored as the metadata's ``"tree"`` object (``tensorlist.jax``'s
            tree header), or None.
        alignment, checksum, durable: as :func:`tensorlist.save`, for every shard.

    Raises:
        TypeError: a dtype tensorlist cannot store, or a name that is not a str.
        FormatError: ``header`` is not strict JSON (naming the field).
        RuntimeError: another process failed to write or to commit.

    Example:
        >>> import jax.numpy as jnp, tempfile
        >>> ckpt = tempfile.mkdtemp()
        >>> save_dir(ckpt, {"w": jnp.ones((4, 2))}, None)
        >>> with open_dir(ckpt) as c:
        ...     c.names(), c.shape("w")
        (['w'], (4, 2))
    """
    path = os.fspath(path)
    if header is not None:
        check_json(header, "/tree", file=join(path, METADATA_NAME))
    plans = {}
    for name, value in leaves.items():  # every check that can fail runs before the first collective
        if not isinstance(name, str):
            raise TypeError(f"array names must be str, not {type(name).__name__} ({name!r})")
        plans[name] = plan_chunks(name, value)
    me = jax.process_index()
    save_id = _save_id()
    ok = False
    try:  # from here on a failure in one process reaches the others at the next _agree
        arrays = {tensor_key(name, c.offsets): _chunk_array(name, leaves[name], c)
                  for name, (_, _, chunks) in plans.items() for c in chunks if c.process == me}
        if not backends.is_remote(path):
            os.makedirs(backends.localize(path), exist_ok=True)
        if arrays:
            save(join(path, shard_name(me, save_id)), arrays, metadata={"dcp": {"saveId": save_id, "rank": me}},
                 alignment=alignment, checksum=checksum, durable=durable)
        ok = True
    finally:
        _agree(ok, "writing the shards")
    ok = me != 0
    try:
        if me == 0:
            _commit(path, plans, save_id, header, durable)
            ok = True
    finally:
        _agree(ok, "committing the metadata")


def _commit(path: str, plans, save_id: str, header: Optional[dict], durable: bool) -> None:
    entries: Dict[str, Optional[TensorMeta]] = {}
    storage: List[StorageEntry] = []
    for name, (dtype, shape, chunks) in plans.items():
        entries[name] = TensorMeta(name, dtype, shape, tuple((c.offsets, c.sizes) for c in chunks))
        itemsize = dtypes.from_name(dtype).itemsize
        storage += [StorageEntry(name, c.offsets, shard_name(c.process, save_id), tensor_key(name, c.offsets),
                                 _numel(c.sizes) * itemsize, None, dtype, c.sizes) for c in chunks]
    doc = metadata_document(save_id=save_id, dcp_version=DCP_VERSION, entries=entries, storage=storage, tree=header)
    parse_metadata(doc, file=join(path, METADATA_NAME), path=path)  # never commit what a reader refuses
    commit_metadata(path, doc, durable=durable)
    names, remove = listing(path)
    for n in names:  # the files of the replaced save and of killed saves (FORMAT.md, "Saving", step 4)
        if is_save_file(n) not in (None, save_id):
            try:
                remove(n)
            except OSError:
                pass  # gone already, or not ours to remove: a later save tries again


def open_dir(path, *, mmap: bool = True, verify: bool = False, limits: Limits = Limits()) -> "ShardedCheckpoint":
    """Opens a checkpoint directory for loading its arrays onto devices (:class:`ShardedCheckpoint`).

    Args:
        path: the checkpoint directory (a local path or a URL).
        mmap: map the shards (zero-copy loads onto CPU devices); False reads with pread.
        verify: check the CRC32C of each saved chunk when it is first read.
        limits: policy limits for the metadata and the shard descriptors.

    Raises:
        FileNotFoundError: no committed checkpoint in ``path``.
        FormatError: the metadata or a shard breaks a rule (docs/FORMAT.md,
            "Distributed checkpoints", rules 1 to 5), naming the file.
    """
    return ShardedCheckpoint(path, mmap=mmap, verify=verify, limits=limits)


class ShardedCheckpoint:
    """A committed checkpoint directory, checked when opened; :meth:`load` builds one array at a time.

    Attributes:
        header: the metadata's ``"tree"`` object (``tensorlist.jax``'s tree header), or None.
        path: the checkpoint directory.
        metadata_file: the metadata's path (named by errors).
        bytes_viewed: bytes handed on as views of saved chunks (no copy), over every load so far.
        bytes_copied: bytes copied from saved chunks into assembled blocks.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile
        >>> ckpt = tempfile.mkdtemp()
        >>> save_dir(ckpt, {"w": jnp.arange(8.0)}, {"format": "example"})
        >>> with open_dir(ckpt) as c:
        ...     c.header, c.load("w", jax.devices()[0]).sum().item()
        ({'format': 'example'}, 28.0)
    """

    def __init__(self, path, *, mmap: bool = True, verify: bool = False, limits: Limits = Limits()):
        ckpt = read_metadata(path, limits=limits)
        self.path = ckpt.path
        self.metadata_file = ckpt.metadata_file
        self.header = ckpt.tree
        self.verify = verify
        self._tensors = ckpt.tensors
        self._storage = ckpt.storage
        self._verified: set = set()
        self._shards = Shards(ckpt.path, mmap=mmap, verify=False, limits=limits)
        try:  # rule 5 for every shard and chunk now: a missing shard fails the open, not a later load
            for name in ckpt.files:
                self._shards.reader(name)
            for entry in ckpt.storage.values():
                self._shards.check(entry)
        except BaseException:
            self._shards.close()
            raise
        self.bytes_viewed = 0
        self.bytes_copied = 0

    def names(self) -> List[str]:
        """The saved arrays' names (fqns), in the saved order (a checkpoint's non-tensor values are not listed)."""
        return list(self._tensors)

    def _meta(self, name: str) -> TensorMeta:
        t = self._tensors.get(name)
        if t is None:
            raise KeyError(f"{self.metadata_file}: no array named {name!r} in the checkpoint")
        return t

    def shape(self, name: str) -> Tuple[int, ...]:
        """The whole array's shape."""
        return tuple(self._meta(name).size)

    def dtype(self, name: str) -> np.dtype:
        """The array's numpy dtype (ml_dtypes' for bfloat16 and float8)."""
        return dtypes.from_name(self._meta(name).dtype).numpy

    def chunks(self, name: str) -> List[Box]:
        """The saved chunks of ``name`` as (offsets, sizes), in the metadata's order."""
        return [(tuple(o), tuple(s)) for o, s in self._meta(name).chunks]

    def chunk(self, name: str, offsets: Sequence[int]) -> np.ndarray:
        """The saved chunk of ``name`` at ``offsets``: a read-only view of the mapped shard (with ``mmap``)."""
        entry = self._storage.get((name, tuple(offsets)))
        if entry is None or entry.offset is None:
            raise KeyError(f"{self.metadata_file}: array {name!r} has no chunk at offsets {list(offsets)}")
        if self.verify and entry.key not in self._verified:
            self._shards.reader(entry.file).verify([entry.tensor])
            self._verified.add(entry.key)
        return self._shards.array(entry)

    def load(self, name: str, target: Any = None, *, downcast: bool = False, dtype: Any = None) -> jax.Array:
        """The array ``name`` as a ``jax.Array`` on ``target``, reading only the bytes its local devices need.

        Args:
            name: the array's fqn.
            target: None (jax's default device), a ``jax.Device``, a
                ``jax.sharding.Sharding``, or a ``jax.ShapeDtypeStruct``
                (its shape and dtype checked against the saved ones, its
                ``.sharding`` used, or the default device without one).
            downcast: convert 64-bit values to 32 bits when ``jax_enable_x64`` is off.
            dtype: convert to this dtype (each device's block) instead of the saved one.

        Raises:
            KeyError: no such array.
            FormatError: the saved shape or dtype disagrees with a ShapeDtypeStruct.
            TypeError: a dtype jax cannot hold (or 64-bit without ``jax_enable_x64``).
        """
        t = self._meta(name)
        shape, saved = tuple(t.size), self.dtype(name)
        if isinstance(target, jax.ShapeDtypeStruct):
            if tuple(target.shape) != shape or np.dtype(target.dtype) != saved:
                raise FormatError(f"array {name!r} is saved as {t.dtype}{list(shape)}; the target asks for "
                                  f"{np.dtype(target.dtype).name}{list(target.shape)}", file=self.metadata_file,
                                  field=f"/stateDict/{escape_pointer(name)}")
            target = target.sharding
        _jax_bridge.check_dtype(saved if dtype is None else dtype, name, downcast=downcast)
        if target is None or isinstance(target, jax.Device):
            return _jax_bridge.put(self._block(t, ((0,) * len(shape), shape)), target, name, downcast=downcast,
                                   dtype=dtype)
        if not isinstance(target, jax.sharding.Sharding):
            raise TypeError(f"array {name!r}: target must be None, a jax.Device, a jax.sharding.Sharding or a "
                            f"jax.ShapeDtypeStruct, not {type(target).__name__}")
        blocks: Dict[Box, np.ndarray] = {}  # replicas on several local devices share one read
        devices, parts = [], []
        for device, index in target.addressable_devices_indices_map(shape).items():
            box = _box(index, shape, name)
            if box not in blocks:
                blocks[box] = self._block(t, box)
            devices.append(device)
            parts.append(blocks[box])
        arrays = [_jax_bridge.put(part, device, name, downcast=downcast, dtype=dtype)
                  for part, device in zip(parts, devices)]
        return jax.make_array_from_single_device_arrays(shape, target, arrays)

    def _intersecting(self, t: TensorMeta, box: Box) -> Iterator[Tuple[Box, Tuple[slice, ...], Tuple[slice, ...]]]:
        """Each non-empty saved chunk meeting ``box``: (chunk, slices into the chunk, slices into the box)."""
        off, sz = box
        for c_off, c_sz in t.chunks:
            lo = [max(a, b) for a, b in zip(off, c_off)]
            hi = [min(a + s, b + cs) for a, s, b, cs in zip(off, sz, c_off, c_sz)]
            if any(h <= l for l, h in zip(lo, hi)) or not _numel(c_sz):
                continue
            yield ((tuple(c_off), tuple(c_sz)), tuple(slice(l - b, h - b) for l, h, b in zip(lo, hi, c_off)),
                   tuple(slice(l - a, h - a) for l, h, a in zip(lo, hi, off)))

    def _block(self, t: TensorMeta, box: Box) -> np.ndarray:
        """The values of ``box``: a view of the mapping where its bytes lie there in order, else a new buffer."""
        off, sz = box
        dtype = dtypes.from_name(t.dtype).numpy
        if not _numel(sz):
            return np.empty(sz, dtype)
        hits = list(self._intersecting(t, box))
        parts = [(self.chunk(t.fqn, c_off)[inside], into) for (c_off, _), inside, into in hits]
        view = _one_view(parts, sz)
        if view is not None:
            self.bytes_viewed += view.nbytes
            return view
        out = np.empty(sz, dtype)
        for part, into in parts:
            out[into] = part
            self.bytes_copied += part.nbytes
        return out

    def close(self) -> None:
        """Closes the shard files; arrays already loaded stay valid (they keep their mappings alive)."""
        self._shards.close()

    def __enter__(self) -> "ShardedCheckpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
