"""Checkpoint directories in ``convert``: DCP checkpoints as sources, tensorlist's DCP layout as a destination.

Two source formats are directories of ``torch.distributed.checkpoint`` (DCP)
checkpoints:

- ``dcp``: tensorlist's layout (``<rank>.<saveId>.tl`` shards and
  ``.metadata.json``, docs/FORMAT.md "Distributed checkpoints"), read with
  :mod:`tensorlist.dcp`, without torch;
- ``torch-dcp``: DCP's own ``FileSystemWriter`` layout (``__<rank>_<n>.distcp``
  and a pickled ``.metadata``), read by :mod:`.distcp` without running the
  pickle; its records need torch (``torch.load(weights_only=True)``).

Either gives a :class:`DcpSource`: one entry per tensor, the whole tensor
assembled by numpy from its chunks when it is asked for (one tensor at a time:
a tensor saved in one chunk is that chunk itself, a view of the mapped shard
for ``dcp``), and the non-tensor values as metadata, ``{"dcpValues": {fqn:
value}}`` (the layout's tagged JSON: tuples and non-finite floats kept). A
value stored as a pickle (``torch_save``) is never unpickled: it goes to a
``dcp`` destination as its bytes and is dropped, with a warning, elsewhere.

The ``dcp`` destination (:func:`write_dcp`) writes the layout as
:class:`tensorlist.dcp.TensorListWriter` does, without torch: a fresh saveId,
one shard per source shard (the chunks kept as they were; any other source
becomes one shard holding each tensor as one chunk, and its ``dcpValues``
metadata becomes bytes entries again), each through :class:`tensorlist.Writer`,
then ``.metadata.json`` (checked first) through ``dcp.commit_metadata``,
the commit point; then the files of the checkpoint it replaced are deleted. A
failure before the commit leaves the previous checkpoint in the directory as it
was. URLs work for ``dcp`` sources and destinations, and for ``torch-dcp`` sources.

Imports ``dcp``, ``writer``, ``_base.backends``, ``_base.jsonio``,
``_base.dtypes``, ``format``, ``errors``, ``formats`` and ``distcp`` (fsspec for URLs).
"""
from __future__ import annotations

import os
import secrets
import warnings
from typing import Any, Callable, Dict, List, Optional, Tuple

import numpy as np

from tensorlist._base import dtypes as _dtypes
from tensorlist._base.backends import is_remote, localize
from tensorlist._base.jsonio import from_tagged, loads_strict
from tensorlist.dcp import (DCP_VERSION, METADATA_NAME, Checkpoint, Shards, StorageEntry, TensorMeta, assemble,
                        bytes_key, commit_metadata, encode_value, is_save_file, join, listing, metadata_document,
                        parse_metadata, read_metadata, shard_name, tensor_key)
from tensorlist.format import Limits, short_repr
from tensorlist.writer import Writer
from tensorlist.convert.distcp import TorchCheckpoint, load_chunk, load_value, read_torch_metadata
from tensorlist.convert.formats import Entry, MetadataDroppedWarning, Source

__all__ = ["DcpSource", "VALUES_KEY", "open_dcp", "open_torch_dcp", "write_dcp"]

#: The metadata key a checkpoint's non-tensor values travel under (fqn -> tagged JSON value).
VALUES_KEY = "dcpValues"


class DcpSource(Source):
    """A checkpoint directory as a :class:`Source`.

    Attributes (besides the Source's):
        checkpoint: the metadata in the tensorlist layout's terms
            (:class:`tensorlist.dcp.Checkpoint`): fqns, dtypes, global
            shapes, chunks, shard files, bytes entries. For ``torch-dcp`` the
            shard files are a plan (one per rank); a bytes entry's
            ``byte_length`` is then its pickle's.
        files: the data files in the directory (``dcp``: the shard descriptors; ``torch-dcp``: the ``.distcp`` files).
    """

    def __init__(self, path: str, fmt: str, checkpoint: Checkpoint, chunk: Callable, value: Callable,
                 closers=(), files=()):
        self.checkpoint = checkpoint
        self.files = tuple(files)
        self._chunk, self._value = chunk, value
        self._values: Optional[Dict[str, Tuple[bytes, str]]] = None
        entries = [Entry(fqn, _dtypes.from_name(t.dtype), t.size,
                         (lambda t=t: assemble(t, lambda off, fqn=t.fqn: self.chunk(fqn, off))))
                   for fqn, t in checkpoint.tensors.items()]
        disk = sum(e.byte_length for e in checkpoint.storage.values())
        super().__init__(path, fmt, entries, True, None, closers, disk_bytes=disk)

    def chunk(self, fqn: str, offsets: Tuple[int, ...]) -> np.ndarray:
        """One stored chunk of tensor ``fqn``, checked against the metadata."""
        return self._chunk(fqn, offsets)

    def values(self) -> Dict[str, Tuple[bytes, str]]:
        """fqn -> (stored bytes, encoding) of each non-tensor value, read once (``torch-dcp``: loaded with torch)."""
        if self._values is None:
            self._values = {fqn: self._value(fqn) for fqn in self.checkpoint.bytes_keys}
        return self._values

    @property
    def metadata(self) -> Any:
        """``{"dcpValues": {fqn: value}}`` for the values stored as JSON, or None (read on first use)."""
        if not self.checkpoint.bytes_keys:
            return None
        found = {}
        for fqn, (raw, enc) in self.values().items():
            if enc == "json":
                file = join(self.path, self.checkpoint.storage[(fqn, None)].file)
                found[fqn] = loads_strict(raw, file=file)
                from_tagged(found[fqn], file=file, where=repr(fqn))  # written as it is, once checked

        return {VALUES_KEY: found} if found else None

    @metadata.setter
    def metadata(self, value) -> None:
        pass  # computed from the checkpoint (Source.__init__ sets it)

    def pickled(self) -> List[str]:
        """The values not stored as JSON (pickles, ``torch_save``; raw ``bytes``/``bytes_io``): kept only by a
        ``dcp`` destination."""
        return [fqn for fqn, (_, enc) in self.values().items() if enc != "json"]


def open_dcp(path: str, limits: Limits = Limits()) -> DcpSource:
    """A checkpoint of tensorlist's layout (``.metadata.json``) as a source; a path or a URL."""
    ckpt = read_metadata(path, limits=limits)
    shards = Shards(ckpt.path, limits=limits)
    try:
        shards.check_all(ckpt)  # the shards exist and hold what the metadata says before a tensor is allocated
    except BaseException:
        shards.close()
        raise
    return DcpSource(path, "dcp", ckpt, lambda fqn, off: shards.array(ckpt.storage[(fqn, off)]),
                     lambda fqn: (shards.raw(ckpt.storage[(fqn, None)]), ckpt.storage[(fqn, None)].encoding),
                     [shards.close], ckpt.files)


def open_torch_dcp(path: str, limits: Limits = Limits()) -> DcpSource:
    """A checkpoint that DCP's FileSystemWriter saved (``.metadata`` + ``.distcp``) as a source; a path or a URL."""
    ckpt: TorchCheckpoint = read_torch_metadata(path, limits=limits)
    return DcpSource(path, "torch-dcp", ckpt.plan, lambda fqn, off: load_chunk(ckpt, fqn, off),
                     lambda fqn: load_value(ckpt, fqn), files=sorted({r.file for r in ckpt.records.values()}))


# --- the destination ----------------------------------------------------------------

_Item = Tuple[str, Callable[[], np.ndarray], int]  # tensor name in the shard, its array, bytes for the progress bar


def _from_checkpoint(src: DcpSource, save_id: str):
    """The shards, entries and storage of a copy of ``src`` keeping its chunks and shards."""
    ckpt = src.checkpoint
    names = {f: shard_name(i, save_id) for i, f in enumerate(ckpt.files)}
    shards: Dict[str, List[_Item]] = {names[f]: [] for f in ckpt.files}
    values = src.values()
    storage = []
    for e in ckpt.storage.values():
        file = names[e.file]
        if e.offset is None:
            raw, encoding = values[e.fqn]
            storage.append(StorageEntry(e.fqn, None, file, bytes_key(e.fqn), len(raw), encoding, "uint8",
                                        (len(raw),)))
            shards[file].append((storage[-1].tensor, (lambda raw=raw: np.frombuffer(raw, np.uint8)), 0))
        else:
            storage.append(StorageEntry(e.fqn, e.offset, file, tensor_key(e.fqn, e.offset), e.byte_length, None,
                                        e.dtype, e.shape))
            shards[file].append((storage[-1].tensor, (lambda e=e: src.chunk(e.fqn, e.offset)), e.byte_length))
    meta = ckpt.storage_meta or {}
    return (shards, dict(ckpt.entries), storage, ckpt.planner_data, ckpt.dcp_version or DCP_VERSION,
            list(meta.get("modules") or []))


def _from_tensors(src: Source, save_id: str):
    """Each tensor of a flat source as one chunk of shard 0; ``dcpValues`` metadata as bytes entries."""
    file = shard_name(0, save_id)
    items: List[_Item] = []
    entries: Dict[str, Optional[TensorMeta]] = {}
    storage = []
    for e in src.entries:
        if e.name in entries:
            raise ValueError(f"{src.path}: tensor name {e.name!r} appears twice; a checkpoint's keys are unique")
        zeros = (0,) * len(e.shape)
        entries[e.name] = TensorMeta(e.name, e.dtype.name, e.shape, ((zeros, e.shape),))
        storage.append(StorageEntry(e.name, zeros, file, tensor_key(e.name, zeros), e.nbytes, None, e.dtype.name,
                                    e.shape))
        items.append((storage[-1].tensor, e.array, e.nbytes))
    meta = src.metadata
    values = meta.get(VALUES_KEY) if isinstance(meta, dict) and set(meta) == {VALUES_KEY} else None
    if meta is not None and not isinstance(values, dict):
        warnings.warn(f"{src.path}: its metadata ({short_repr(meta, 60)}) is not written: a checkpoint holds "
                      f"tensors and, under {VALUES_KEY!r}, values", MetadataDroppedWarning, stacklevel=4)
    for fqn, tagged in (values or {}).items():
        if fqn in entries:
            raise ValueError(f"{src.path}: {fqn!r} is both a tensor and a value of {VALUES_KEY}")
        raw = encode_value(from_tagged(tagged, file=src.path, where=f"{VALUES_KEY}/{fqn}"), fqn)
        entries[fqn] = None
        storage.append(StorageEntry(fqn, None, file, bytes_key(fqn), len(raw), "json", "uint8", (len(raw),)))
        items.append((storage[-1].tensor, (lambda raw=raw: np.frombuffer(raw, np.uint8)), 0))
    return {file: items}, entries, storage, None, DCP_VERSION, []


def _remove(dst: str, doomed: Callable[[str], bool]) -> None:
    try:
        names, remove = listing(dst)
    except OSError:
        return
    for n in names:
        if doomed(n):
            try:
                remove(n)
            except OSError:
                pass  # gone already: a later save tries again


def write_dcp(src: Source, dst: str, bar, durable: bool, options: dict) -> None:
    """Writes ``src`` as a checkpoint of tensorlist's DCP layout in directory ``dst`` (created if missing).

    Everything is planned and the metadata checked (``parse_metadata``) before
    a byte is written; the shards go first, the metadata last (the commit
    point), then the files of the checkpoint it replaces are deleted.
    """
    remote = is_remote(dst)
    if not remote:
        dst = localize(dst)
        if os.path.lexists(dst) and not os.path.isdir(dst):
            raise NotADirectoryError(f"{dst}: is not a directory (a dcp destination is a checkpoint directory)")
    save_id = secrets.token_hex(4)
    plan = _from_checkpoint(src, save_id) if isinstance(src, DcpSource) else _from_tensors(src, save_id)
    shards, entries, storage, planner_data, version, modules = plan
    doc = metadata_document(save_id=save_id, dcp_version=version, entries=entries, storage=storage,
                            planner_data=planner_data,
                            storage_meta={"checkpointId": dst, "saveId": save_id, "modules": modules})
    parse_metadata(doc, file=join(dst, METADATA_NAME), path=dst)  # never commit what a reader would refuse
    if not remote:
        os.makedirs(dst, exist_ok=True)
    try:
        for rank, (name, items) in enumerate(shards.items()):
            if not items:
                continue
            with Writer(join(dst, name), metadata={"dcp": {"saveId": save_id, "rank": rank}}, durable=durable) as w:
                for tensor, get, nbytes in items:
                    w.add(tensor, get())
                    bar.update(nbytes)
        commit_metadata(dst, doc, durable=durable)
    except BaseException:
        _remove(dst, lambda n: is_save_file(n) == save_id)
        raise
    _remove(dst, lambda n: is_save_file(n) not in (None, save_id))
