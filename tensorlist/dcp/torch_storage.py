"""The torch storage layer of :mod:`tensorlist.dcp`: DCP storage on tensorlist files, with no pickle anywhere.

:class:`TensorListWriter` and :class:`TensorListReader` plug into
``dcp.save``, ``dcp.async_save`` and ``dcp.load`` in place of DCP's
``FileSystemWriter``/``FileSystemReader``. DCP still plans: it deduplicates
replicated tensors when saving and reshards when loading (a checkpoint saved
on 4 ranks loads on 1, 2 or 3, as plain tensors, DTensors or FSDP2 shards).
What changes is the storage (docs/FORMAT.md, "Distributed checkpoints (DCP)"):

- each rank writes its chunks as one TensorList, ``<rank>.<saveId>.tl``, with
  ``tensorlist.save`` (atomic and durable: data file, fsync, descriptor); a
  chunk is a tensor named ``<fqn>@<offsets>``; a load reads only the byte
  ranges of the slices it is asked for (:mod:`tensorlist.dcp.ranges`: preadv,
  sorted by file offset, adjacent ones joined, straight into the targets);
- non-tensor values (DCP's bytes entries) are stored in uint8 tensors: raw
  ``bytes`` and ``io.BytesIO`` as they are, everything else as JSON; values
  JSON cannot hold are refused (a TypeError naming the key) unless the caller
  opts in with ``allow_pickle=True``;
- the coordinator writes the global metadata last, as JSON
  (``.metadata.json``, checked against ``schemas/dcp-metadata.schema.json``
  before it is written and when read), with ``dcp.layout.commit_metadata``:
  that rename (or put) is the commit point. Every save draws a fresh ``saveId``, so a save
  killed before its commit leaves the previous checkpoint in the same
  directory intact; the next committed save deletes what older saves left.

With ``encryption_key=`` (a ``tensorlist.Key`` or 32 bytes) each shard is
an encrypted list (``tensorlist.save(key=)``: chunks, bytes entries and
shard metadata sealed) and ``TensorListReader(encryption_key=)`` reads each
chunk whole through the keyed reader (no raw byte ranges: they would be
ciphertext). ``.metadata.json`` stays plain: it holds the fqns, dtypes,
shapes and chunk offsets (what DCP plans with before any shard is opened),
never a tensor's bytes or a bytes entry's value.

``dcp.async_save`` works with this writer as its own stager (a CPU copy kept
across saves) and with torch's ``DefaultStager(StagingOptions(...))`` and
``async_checkpointer_type=PROCESS`` (tests/dcp/test_dcp_async.py).

Imports torch (an adapter), ``dcp.layout``, ``dcp.metadata``, ``dcp.ranges``,
``dcp.shards``, ``writer``, ``format``, ``_bridges.torch``, ``backends``,
``_base.jsonio``, ``dtypes`` and ``errors`` (fsspec for URLs). Loaded by
:mod:`tensorlist.dcp` when a storage class is first asked for; ``loops.sharded``
imports it (lazily, for sharded checkpoints).

Example:
    >>> import torch, tempfile, torch.distributed.checkpoint as dcp
    >>> from tensorlist.dcp import TensorListWriter, TensorListReader, read_full
    >>> ckpt = tempfile.mkdtemp()
    >>> sd = {"w": torch.arange(6.0).reshape(2, 3), "step": 7}
    >>> _ = dcp.save(sd, storage_writer=TensorListWriter(ckpt))
    >>> back = {"w": torch.zeros(2, 3), "step": 0}
    >>> dcp.load(back, storage_reader=TensorListReader(ckpt))
    >>> back["w"][1].tolist(), back["step"], float(read_full(ckpt)["w"].sum())
    ([3.0, 4.0, 5.0], 7, 15.0)
"""
from __future__ import annotations

import dataclasses
import io
import math
import os
import copy
import secrets
import threading
import warnings
from typing import Any, Dict, List, Optional

import numpy as np
import torch
from torch.distributed.checkpoint.metadata import (BytesStorageMetadata, ChunkStorageMetadata, Metadata,
                                                   MetadataIndex, StorageMeta, TensorProperties,
                                                   TensorStorageMetadata)
from torch.distributed.checkpoint.planner import (LoadItemType, LoadPlan, LoadPlanner, SavePlan, SavePlanner,
                                                  WriteItem, WriteItemType)
from torch.distributed.checkpoint.staging import BlockingAsyncStager
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.distributed.tensor import DTensor
from torch.futures import Future

from tensorlist._base import backends
from tensorlist._base import dtypes
import tensorlist.torch as staging
from tensorlist._base.jsonio import dumps, to_tagged
from tensorlist._bridges.torch import from_numpy, to_numpy, torch_dtype
from tensorlist.crypto.keys import as_key
from tensorlist.dcp.layout import (DCP_VERSION, METADATA_NAME, Checkpoint, StorageEntry, TensorMeta, bytes_key, commit_metadata,
                     encode_entry, holds, is_save_file, join, listing, shard_name, tensor_key)
from tensorlist.dcp.metadata import metadata_document, parse_metadata, read_metadata
from tensorlist.dcp.ranges import MAX_RUNS, RangeReads, bounding, slice_runs
from tensorlist.dcp.shards import Shards
from tensorlist.errors import FormatError
from tensorlist.format import Limits
from tensorlist.reader import read_mode
from tensorlist.writer import save

__all__ = ["TensorListWriter", "TensorListReader"]

#: Whether this torch's DCP Metadata takes ``version`` (torch >= 2.9; 2.8 and older have no such field).
_METADATA_HAS_VERSION = "version" in {f.name for f in dataclasses.fields(Metadata)}

_MEMORY_FORMATS = {torch.contiguous_format: "contiguous_format", torch.channels_last: "channels_last",
                   torch.preserve_format: "preserve_format"}


@dataclasses.dataclass(frozen=True)
class _ShardFile:
    """A rank's place in one save (``SavePlan.storage_data``, set by the coordinator)."""

    name: str
    save_id: str


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor_meta(fqn: str, md: TensorStorageMetadata) -> TensorMeta:
    p = md.properties
    memory_format = _MEMORY_FORMATS.get(p.memory_format)
    if memory_format is None:
        raise TypeError(f"state dict tensor {fqn!r}: memory format {p.memory_format} cannot be recorded")
    return TensorMeta(fqn, _dtype_name(p.dtype), tuple(md.size),
                      tuple((tuple(c.offsets), tuple(c.sizes)) for c in md.chunks),
                      bool(p.requires_grad), memory_format, bool(p.pin_memory), str(p.layout).removeprefix("torch."))


def _planner_json(data: Any) -> Any:
    """The planner data as tagged JSON, or None (with a warning) when it is not JSON."""
    if data is None:
        return None
    try:
        tagged = to_tagged(data, "planner_data")
        dumps(tagged).encode("utf-8")
        return tagged
    except (TypeError, ValueError) as e:
        warnings.warn(f"the save planner's planner_data is not JSON and is not stored ({e})", stacklevel=3)
        return None


class _CheckpointPath:
    """What DCP asks both storage classes about their checkpoint: a path or URL."""

    path: str

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        return isinstance(checkpoint_id, (str, os.PathLike))

    @property
    def checkpoint_id(self) -> str:
        return self.path


class TensorListWriter(_CheckpointPath, StorageWriter, BlockingAsyncStager):
    """A DCP ``StorageWriter`` that saves each rank's chunks as a TensorList and the metadata as JSON.

    Use it as ``dcp.save(state_dict, storage_writer=TensorListWriter(path))``
    or with ``dcp.async_save`` (it is its own stager: the state dict is copied
    to CPU memory before ``async_save`` returns). One save per directory at a
    time, and one save per writer at a time (wait for an ``async_save``'s
    future before the next save with the same writer); a new save replaces
    the checkpoint in ``path`` atomically.

    Args:
        path: the checkpoint directory (created if missing), or an fsspec URL.
        allow_pickle: store non-tensor values that JSON cannot hold with
            ``torch.save`` (a pickle; loading them needs
            ``TensorListReader(..., allow_pickle=True)``). Off by default:
            such a value is refused with a TypeError naming its key.
        durable: fsync the shard files, the metadata and the directory.
        overwrite: replace an existing checkpoint in ``path`` (else RuntimeError).
        checksum: store a CRC32C per chunk.
        threads: writer threads per rank (default: usable cores, at most 8).
        cache_staged_state_dict: for ``async_save``: keep the staged copy
            while this writer lives and copy the next save's state into it
            while the state dict keeps its structure (as DCP's DefaultStager
            keeps its staged storages). Faulting in fresh memory for every
            save makes the loop wait several times longer (bench/bench_dcp.py);
            pass False to give the copy back after each save.
        encryption_key: encrypt every shard (a ``tensorlist.Key`` or 32
            bytes); ``.metadata.json`` stays plain (shapes, dtypes, offsets).
            A Key is never pickled: no ``async_checkpointer_type=PROCESS``.

    Raises (from ``dcp.save``, wrapped by DCP in a CheckpointException):
        TypeError: a non-tensor value is not JSON, or a tensor cannot be
            stored (sparse, quantized, a dtype without a tensorlist code).
    """

    def __init__(self, path, *, allow_pickle: bool = False, durable: bool = True, overwrite: bool = True,
                 checksum: bool = True, threads: Optional[int] = None, cache_staged_state_dict: bool = True,
                 encryption_key=None):
        StorageWriter.__init__(self)
        self.encryption_key = as_key(encryption_key)
        BlockingAsyncStager.__init__(self, cache_staged_state_dict=cache_staged_state_dict)
        self.path = os.fspath(path)
        self.allow_pickle = allow_pickle
        self.durable = durable
        self.overwrite = overwrite
        self.checksum = checksum
        self.threads = threads
        self.rank = 0
        self.is_coordinator = True
        self.save_id: Optional[str] = None
        self._cleanup: Optional[threading.Thread] = None

    # --- DCP's StorageWriter protocol ----------------------------------------------
    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.save_id = None

    def storage_meta(self) -> Optional[StorageMeta]:
        return StorageMeta(checkpoint_id=self.path, save_id=self.save_id)

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        if not kwargs.get("use_collectives", True):
            raise ValueError("TensorListWriter needs use_collectives=True: the coordinator writes the one metadata "
                             "file of the checkpoint")
        self.is_coordinator = is_coordinator
        rank = kwargs.get("rank")  # passed from torch 2.9 on; 2.8 and older pass none: ask the process group
        if rank is None and torch.distributed.is_available() and torch.distributed.is_initialized():
            rank = torch.distributed.get_rank()
        self.rank = int(rank or 0)

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        self.wait()
        if not backends.is_remote(self.path):
            os.makedirs(backends.localize(self.path), exist_ok=True)
        if not self.overwrite and holds(self.path, METADATA_NAME):
            # DCP's FileSystemWriter's words: callers (and torch's own tests) match on them
            raise RuntimeError(f"Checkpoint already exists and self.overwrite=False. ({join(self.path, METADATA_NAME)};"
                               " pass TensorListWriter(..., overwrite=True) to replace it)")
        return plan

    def prepare_global_plan(self, plans: List[SavePlan]) -> List[SavePlan]:
        self.save_id = secrets.token_hex(4)
        return [dataclasses.replace(p, storage_data=_ShardFile(shard_name(rank, self.save_id), self.save_id))
                for rank, p in enumerate(plans)]

    def _encode(self, item: WriteItem, planner: SavePlanner):
        """A bytes entry's stored bytes and encoding: JSON, or (opted in) torch.save's pickle."""
        fqn = item.index.fqn
        lookup = getattr(planner, "lookup_object", None)  # DefaultSavePlanner's: the value itself
        if lookup is not None:
            try:
                return encode_entry(lookup(item.index), fqn)
            except TypeError as e:
                if not self.allow_pickle:
                    raise TypeError(f"{e}; pass TensorListWriter(..., allow_pickle=True) to store it with torch.save "
                                    "(a pickle: loading it then needs TensorListReader(..., allow_pickle=True))") \
                        from None
        elif not self.allow_pickle:
            raise TypeError(f"state dict value {fqn!r}: the planner {type(planner).__name__} has no lookup_object, so "
                            "the value is only available as a torch.save pickle; pass allow_pickle=True to store it")
        data = planner.resolve_data(item)
        return bytes(data.getbuffer()), "torch_save"

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future:
        shard: _ShardFile = plan.storage_data
        arrays: Dict[str, np.ndarray] = {}
        results: List[WriteResult] = []
        for item in plan.items:
            fqn = item.index.fqn
            if item.type == WriteItemType.BYTE_IO:
                raw, encoding = self._encode(item, planner)
                name = bytes_key(fqn)
                arrays[name] = np.frombuffer(raw, np.uint8)
                entry = StorageEntry(fqn, None, shard.name, name, len(raw), encoding, "uint8", (len(raw),))
            else:
                chunk = item.tensor_data.chunk
                offsets, sizes = tuple(chunk.offsets), tuple(chunk.sizes)
                where = f"state dict tensor {fqn!r} (chunk at {list(offsets)})"
                a = to_numpy(planner.resolve_data(item), where, bits=True)
                if a.shape != sizes:
                    raise ValueError(f"{where}: the planner resolved a tensor of shape {list(a.shape)} for a chunk of "
                                     f"sizes {list(sizes)}")
                name = tensor_key(fqn, offsets)
                arrays[name] = a
                entry = StorageEntry(fqn, offsets, shard.name, name, a.nbytes, None, dtypes.from_numpy(a.dtype).name,
                                     sizes)
            results.append(WriteResult(index=item.index, size_in_bytes=entry.byte_length, storage_data=entry))
        if arrays:
            save(join(self.path, shard.name), arrays, metadata={"dcp": {"saveId": shard.save_id, "rank": self.rank}},
                 durable=self.durable, checksum=self.checksum, threads=self.threads, key=self.encryption_key)
        fut: Future = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata: Metadata, results: List[List[WriteResult]]) -> None:
        """Writes ``.metadata.json`` (checked first), the commit point; then removes older saves' files."""
        entries: Dict[str, Optional[TensorMeta]] = {}
        for fqn, md in metadata.state_dict_metadata.items():
            entries[fqn] = None if isinstance(md, BytesStorageMetadata) else _tensor_meta(fqn, md)
        storage = [r.storage_data for rank_results in results for r in rank_results]
        modules = list(metadata.storage_meta.modules) if metadata.storage_meta is not None else []
        doc = metadata_document(save_id=self.save_id, dcp_version=DCP_VERSION, entries=entries, storage=storage,
                                planner_data=_planner_json(metadata.planner_data),
                                storage_meta={"checkpointId": self.path, "saveId": self.save_id, "modules": modules})
        parse_metadata(doc, file=join(self.path, METADATA_NAME), path=self.path)  # never commit what a reader refuses
        commit_metadata(self.path, doc, durable=self.durable)
        self._sweep()

    def _sweep(self) -> None:
        """Deletes, in a background thread, the files of other saves: the replaced checkpoint and killed saves.

        Deleting a big file frees its page cache and blocks, which takes about
        as long as writing a tenth of it; after the commit nothing needs those
        files, so :meth:`dcp.save` returns without waiting. :meth:`wait` (and
        this writer's next save) joins the thread; the interpreter does at exit.
        """
        names, remove = listing(self.path)
        # the list is taken now: a file a later save creates is never in it
        doomed = [n for n in names if is_save_file(n) not in (None, self.save_id)]
        if doomed:
            self._cleanup = threading.Thread(target=_remove_all, args=(remove, doomed),
                                             name="tensorlist-dcp-cleanup")
            self._cleanup.start()

    def wait(self) -> None:
        """Waits until the files that the last save replaced are deleted."""
        if self._cleanup is not None:
            self._cleanup.join()
            self._cleanup = None

    # --- async_save staging ----------------------------------------------------------
    def stage(self, state_dict):
        """The copy ``dcp.async_save`` writes from, made before it returns.

        CPU tensors and DTensors are copied into the copy of the previous
        save when the state dict has the same structure (with
        ``cache_staged_state_dict``, the default), else into fresh memory;
        other values are deep-copied.
        A state dict with tensors on other devices goes through DCP's own
        stager (a CPU copy).
        """
        if not _all_cpu(state_dict):
            return super().stage(state_dict)
        cache = self.state_dict_cache if self.cache_staged_state_dict else None
        if cache is not None and _copy_into(cache, state_dict):
            return cache
        staged = _staged(state_dict)
        if self.cache_staged_state_dict:
            self.state_dict_cache = staged
        return staged


def _remove_all(remove, names: List[str]) -> None:
    for n in names:
        try:
            remove(n)
        except OSError:
            pass  # gone already, or not ours to remove: a later save tries again


def _all_cpu(value) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, torch.Tensor):
            if v.device.type != "cpu" or (not isinstance(v, DTensor) and type(v) is not torch.Tensor
                                          and not isinstance(v, torch.nn.Parameter)):
                return False
        elif isinstance(v, dict):
            stack.extend(v.values())
        elif isinstance(v, (list, tuple)):
            stack.extend(v)
    return True


def _staged(v):
    """A copy of a state dict: tensors (DTensors: their local shard) in fresh CPU memory."""
    if isinstance(v, DTensor):
        local = v.to_local().detach().clone()
        return DTensor.from_local(local, v.device_mesh, v.placements, run_check=False, shape=v.shape,
                                  stride=v.stride())
    if isinstance(v, torch.Tensor):
        return v.detach().clone()
    if isinstance(v, dict):
        return {k: _staged(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_staged(x) for x in v]
    if isinstance(v, tuple):
        return tuple(_staged(x) for x in v)
    return copy.deepcopy(v)


def _same_value(a, b) -> bool:
    try:
        return type(a) is type(b) and bool(a == b)
    except Exception:  # e.g. an object whose == is not a truth value
        return False


def _copy_into(cache, v) -> bool:
    """Copies ``v``'s values into ``cache`` (a :func:`_staged` copy of an earlier ``v``).

    Returns False, having copied nothing, when they differ in structure, shape or a non-tensor value.
    """
    pairs, tensors = [(cache, v)], []
    while pairs:
        c, x = pairs.pop()
        if isinstance(x, torch.Tensor):
            if not isinstance(c, torch.Tensor) or isinstance(c, DTensor) != isinstance(x, DTensor):
                return False
            if isinstance(x, DTensor):
                if c.placements != x.placements or c.device_mesh != x.device_mesh or c.shape != x.shape:
                    return False
                c, x = c.to_local(), x.to_local()
            if c.shape != x.shape or c.dtype != x.dtype or c.stride() != x.stride():
                return False
            tensors.append((c, x))
        elif isinstance(x, dict):
            if not isinstance(c, dict) or c.keys() != x.keys():
                return False
            pairs.extend((c[k], x[k]) for k in x)
        elif isinstance(x, (list, tuple)):
            if type(c) is not type(x) or len(c) != len(x):
                return False
            pairs.extend(zip(c, x))
        elif not _same_value(c, x):
            return False  # a changed non-tensor value: stage afresh (the cache holds the old one)
    with torch.no_grad():
        for c, x in tensors:
            c.copy_(x.detach())
    return True


def _writable_bytes(target: torch.Tensor, dtype: torch.dtype) -> Optional[np.ndarray]:
    """``target``'s own memory as a writable uint8 array, when it can be read into directly (else None)."""
    if target.device.type != "cpu" or target.dtype != dtype or not target.is_contiguous() or target.is_conj() \
            or target.is_neg() or type(target) is not torch.Tensor:
        return None
    try:
        return target.reshape(-1).view(torch.uint8).numpy()
    except (RuntimeError, TypeError):
        return None


def _add_slice(reads: RangeReads, data_path: str, base: int, file: str, entry: StorageEntry, req, target):
    """Adds the byte ranges of one planned slice; returns None (read into ``target``) or what gives the staged copy."""
    row = dtypes.from_name(entry.dtype)
    shape, offs, lengths = tuple(entry.shape), tuple(req.storage_offsets), tuple(req.lengths)
    starts, run = slice_runs(shape, row.itemsize, offs, lengths)
    if len(starts) > MAX_RUNS:  # a thin slice across many rows: its bounding range once, narrowed in memory
        first, length = bounding(shape, row.itemsize, offs, lengths)
        buf = np.empty(length, np.uint8)
        reads.add(data_path, base + first, buf, file)
        strides = tuple(row.itemsize * math.prod(shape[d + 1:]) for d in range(len(shape)))
        return lambda: from_numpy(np.ndarray(lengths, row.bits, buf, 0, strides))
    dest = _writable_bytes(target, torch_dtype(entry.dtype))
    staged = None
    if dest is None:
        tmp = np.empty(lengths, row.bits)
        dest = tmp.reshape(-1).view(np.uint8)
        staged = lambda: from_numpy(tmp)  # noqa: E731
    for k, start in enumerate(starts):
        reads.add(data_path, base + start, dest[k * run:(k + 1) * run], file)
    return staged


#: Bytes per staging buffer of a device load, and buffers in flight (the torch adapter's staging ring).
RING_BYTES, RING_BUFFERS = staging.CHUNK_BYTES, staging.BUFFERS
_RING_ALIGN = 64


def _through_ring(target: torch.Tensor) -> bool:
    """A target off the CPU is filled through the staging ring (pinned buffers and a copy stream on CUDA)."""
    return target.device.type != "cpu" and dtypes.NATIVE_LITTLE


def _ring_pieces(entry: StorageEntry, req, target: torch.Tensor, limit: int):
    """The planned slice cut along its first dimension into pieces of at most ``limit`` bytes (a row at least)."""
    offs, lengths = tuple(req.storage_offsets), tuple(req.lengths)
    if not lengths or 0 in lengths:
        return [(offs, lengths, target)]
    row = dtypes.from_name(entry.dtype).itemsize * math.prod(lengths[1:])
    step = max(1, limit // row)
    return [((offs[0] + r,) + offs[1:], (min(step, lengths[0] - r),) + lengths[1:],
             target.narrow(0, r, min(step, lengths[0] - r))) for r in range(0, lengths[0], step)]


def _read_through_ring(items) -> int:
    """Reads planned slices for targets off the CPU through ``staging.Ring``; returns the bytes read.

    ``items``: ``(data_path, base, file, entry, req, target)``. Each slice's
    byte ranges (``slice_runs``, or past ``MAX_RUNS`` its bounding range) are
    read with ``RangeReads`` into a staging buffer, packed with others up to
    ``RING_BYTES``, and copied to the target from there, while the next
    buffer is read. The copies have finished when this returns.
    """
    plans: Dict[torch.device, list] = {}
    for data_path, base, file, entry, req, target in items:
        row, shape, dtype = dtypes.from_name(entry.dtype), tuple(entry.shape), torch_dtype(entry.dtype)
        for offs, lengths, dst in _ring_pieces(entry, req, target, RING_BYTES):
            starts, run = slice_runs(shape, row.itemsize, offs, lengths)
            if not starts:
                continue
            if len(starts) > MAX_RUNS:  # a thin slice across many rows: its bounding range, narrowed in the buffer
                first, nbytes = bounding(shape, row.itemsize, offs, lengths)
                ranges = [(base + first, nbytes, 0)]
                strides = tuple(math.prod(shape[d + 1:]) for d in range(len(shape)))
                make = (lambda b, dt=dtype, ls=lengths, st=strides: b.view(dt).as_strided(ls, st))
            else:
                nbytes = run * len(starts)
                ranges = [(base + st, run, k * run) for k, st in enumerate(starts)]
                make = (lambda b, dt=dtype, ls=lengths: b.view(dt).view(ls))
            plans.setdefault(dst.device, []).append((data_path, file, nbytes, ranges, make, dst))
    read = 0
    for device, plan in plans.items():
        padded = [-(-p[2] // _RING_ALIGN) * _RING_ALIGN for p in plan]
        size = min(max(RING_BYTES, max(padded)), sum(padded))
        with staging.Ring(device, size, min(RING_BUFFERS, len(plan))) as ring:
            i = 0
            while i < len(plan):
                slot = ring.next()
                host, buf, used, pairs = ring.hosts[slot], ring.bufs[slot], 0, []
                with RangeReads() as reads:
                    while i < len(plan) and (not pairs or used + padded[i] <= size):
                        data_path, file, nbytes, ranges, make, dst = plan[i]
                        for offset, n, at in ranges:
                            reads.add(data_path, offset, host[used + at:used + at + n], file)
                        pairs.append((dst, make(buf[used:used + nbytes])))
                        used += padded[i]
                        i += 1
                    reads.run()
                    read += reads.bytes_read
                ring.copy(slot, pairs)
    return read


def _torch_metadata(ckpt: Checkpoint, load_id: Optional[str]) -> Metadata:
    """DCP's Metadata for a checked checkpoint; storage_data maps MetadataIndex -> StorageEntry."""
    state: Dict[str, Any] = {}
    for fqn, t in ckpt.entries.items():
        if t is None:
            state[fqn] = BytesStorageMetadata()
            continue
        props = TensorProperties(dtype=torch_dtype(t.dtype), layout=getattr(torch, t.layout),
                                 requires_grad=t.requires_grad, memory_format=getattr(torch, t.memory_format),
                                 pin_memory=t.pin_memory)
        state[fqn] = TensorStorageMetadata(props, torch.Size(t.size),
                                           [ChunkStorageMetadata(torch.Size(o), torch.Size(s)) for o, s in t.chunks])
    storage = {MetadataIndex(e.fqn, e.offset): e for e in ckpt.storage.values()}
    sm = ckpt.storage_meta or {}
    meta = StorageMeta(checkpoint_id=sm.get("checkpointId"), save_id=sm.get("saveId"), load_id=load_id,
                       modules=list(sm.get("modules") or []))
    planner_data = ckpt.planner_value
    version = {"version": ckpt.dcp_version} if _METADATA_HAS_VERSION else {}
    return Metadata(state_dict_metadata=state, planner_data=planner_data, storage_data=storage, storage_meta=meta,
                    **version)


class TensorListReader(_CheckpointPath, StorageReader):
    """A DCP ``StorageReader`` for checkpoints written by :class:`TensorListWriter`.

    Use it as ``dcp.load(state_dict, storage_reader=TensorListReader(path))``;
    DCP reshards to the state dict's layout. Each load reads only the bytes of
    the slices its plan asks for (a rank that needs half of a saved chunk
    reads that half), with ``preadv`` straight into the target tensors where
    they are contiguous CPU tensors of the stored dtype; a target on a GPU is
    filled through the staging ring of ``tensorlist.load(path, device=...)``
    (pinned buffers, copies on a side stream while the next buffer is read).
    :attr:`bytes_read` counts the bytes read.

    Args:
        path: the checkpoint directory, or an fsspec URL.
        allow_pickle: load bytes entries stored with ``torch.save`` (they run
            pickle; only for checkpoints you trust). Refused by default with a
            FormatError naming the key.
        mmap: with ``verify`` or at a URL, where whole chunks are read: map
            the shards (default; ``"copy"`` is accepted, DCP copying every
            chunk into its own tensors anyway) or read them with pread. The
            byte-range reads of every other load never map.
        verify: check the CRC32C of every chunk read (each chunk is then read
            whole: a CRC covers the chunk).
        limits: policy limits for the metadata and shard descriptors.
        encryption_key: the key of encrypted shards: each chunk is then read
            whole and decrypted (into private memory), then narrowed, as
            with ``verify``. Without it an encrypted shard raises
            ``EncryptionError`` naming the shard.

    Raises (from ``dcp.load``, wrapped by DCP in a CheckpointException):
        FormatError: the checkpoint breaks a rule of its layout (naming the
            file and the fqn): see :mod:`tensorlist.dcp.metadata` and :mod:`tensorlist.dcp.shards`.
    """

    def __init__(self, path, *, allow_pickle: bool = False, mmap=True, verify: bool = False,
                 limits: Limits = Limits(), encryption_key=None):
        super().__init__()
        self.encryption_key = as_key(encryption_key)
        self.path = os.fspath(path)
        self.allow_pickle = allow_pickle
        self.mmap = read_mode(mmap)
        self.verify = verify
        self.limits = limits
        self.load_id = secrets.token_hex(8)
        self.storage: Dict[MetadataIndex, StorageEntry] = {}
        self.is_coordinator = False
        #: Bytes read from the shards' data files by this reader's loads (the ranges asked for, or whole chunks).
        self.bytes_read = 0

    def reset(self, checkpoint_id=None) -> None:
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self.storage = {}
        self.load_id = secrets.token_hex(8)

    # No **kwargs on purpose: DCP then does not retry with a rank-local metadata
    # file (this layout has none), so the error it reports is this one.
    def read_metadata(self, *args: Any) -> Metadata:
        return _torch_metadata(read_metadata(self.path, limits=self.limits), self.load_id)

    def set_up_storage_reader(self, metadata: Metadata, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        self.storage = metadata.storage_data
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan: LoadPlan) -> LoadPlan:
        return plan

    def prepare_global_plan(self, plans: List[LoadPlan]) -> List[LoadPlan]:
        return plans

    def read_data(self, plan: LoadPlan, planner: LoadPlanner) -> Future:
        """Reads the plan's slices: only their bytes (``dcp.ranges``), sorted by (file, offset), adjacent ones joined.

        With ``verify`` (a CRC covers a whole chunk), at a URL, or with an
        ``encryption_key`` (a chunk is decrypted whole), each chunk is read
        whole (mapped with ``mmap``) and narrowed instead.
        """
        if self.verify or backends.is_remote(self.path) or self.encryption_key is not None:
            self._read_whole(plan, planner)
        else:
            self._read_ranges(plan, planner)
        fut: Future = Future()
        fut.set_result(None)
        return fut

    def _target(self, req, entry: StorageEntry, planner: LoadPlanner) -> torch.Tensor:
        target = planner.resolve_tensor(req).detach()
        if tuple(target.size()) != tuple(req.lengths):
            raise FormatError(f"{entry.fqn!r}: the plan reads {list(req.lengths)} from the chunk at "
                              f"{list(entry.offset)} into a target of {list(target.size())}",
                              file=join(self.path, entry.file))
        return target

    def _read_ranges(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        pending, ring = [], []
        with Shards(self.path, mmap=False, limits=self.limits) as shards, RangeReads() as reads:  # plain shards
            for req in plan.items:
                entry: StorageEntry = self.storage[req.storage_index]
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, self._bytes_for_planner(shards, entry))
                    continue
                data_path, base, file = shards.locate(entry)
                target = self._target(req, entry, planner)
                if _through_ring(target):
                    ring.append((data_path, base, file, entry, req, target))
                    pending.append((req, target, None))
                else:
                    pending.append((req, target, _add_slice(reads, data_path, base, file, entry, req, target)))
            reads.run()
            self.bytes_read += reads.bytes_read + _read_through_ring(ring)
        for req, target, staged in pending:
            if staged is not None:
                target.copy_(staged())
            planner.commit_tensor(req, target)

    def _read_whole(self, plan: LoadPlan, planner: LoadPlanner) -> None:
        with Shards(self.path, mmap=self.mmap, verify=self.verify, limits=self.limits,
                    key=self.encryption_key) as shards:
            for req in sorted(plan.items, key=lambda r: self.storage[r.storage_index].file):
                entry: StorageEntry = self.storage[req.storage_index]
                if req.type == LoadItemType.BYTE_IO:
                    planner.load_bytes(req, self._bytes_for_planner(shards, entry))
                    continue
                t = from_numpy(shards.array(entry))
                for d, (o, n) in enumerate(zip(req.storage_offsets, req.lengths)):
                    t = t.narrow(d, o, n)
                target = self._target(req, entry, planner)
                target.copy_(t)
                self.bytes_read += t.numel() * t.element_size()
                planner.commit_tensor(req, target)

    def _bytes_for_planner(self, shards: Shards, entry: StorageEntry) -> io.BytesIO:
        """The stream ``LoadPlanner.load_bytes`` expects: a torch.save of the value.

        A JSON value is re-serialized here, in memory, from what JSON can hold
        (None, bool, int, float, str, lists, tuples, dicts), so what DCP's
        planner unpickles is never bytes read from the checkpoint. A stored
        pickle is passed on only with ``allow_pickle``.
        """
        if entry.encoding != "torch_save":  # JSON, bytes, BytesIO: rebuilt here, never unpickled from the file
            buf = io.BytesIO()
            torch.save(shards.value(entry), buf)
        elif self.allow_pickle:
            buf = io.BytesIO(shards.raw(entry))
        else:
            raise FormatError(f"{entry.fqn!r} is stored as a torch.save pickle; loading it runs pickle: pass "
                              "TensorListReader(..., allow_pickle=True) for a checkpoint you trust",
                              file=join(self.path, entry.file))
        buf.seek(0)
        return buf
