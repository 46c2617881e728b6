"""torch.distributed.checkpoint's own layout (``FileSystemWriter``), read without running its pickle.

DCP's ``FileSystemWriter`` saves a directory of ``__<rank>_<n>.distcp`` files
and a ``.metadata`` file: a pickle of DCP's ``Metadata``. DCP's reader loads
that with ``pickle.load``, which runs whatever the file says. Here it is read
by a restricted unpickler that resolves only these globals, each to a stand-in
that holds data and runs nothing of torch or DCP:

- DCP's metadata dataclasses (``Metadata``, ``TensorStorageMetadata``,
  ``BytesStorageMetadata``, ``ChunkStorageMetadata``, ``TensorProperties``,
  ``MetadataIndex``, ``StorageMeta``, the filesystem's ``_StorageInfo``) and
  the memory-format enum: objects that only keep the state the pickle gives them;
- ``torch.Size`` (a tuple of integers), torch dtypes, layouts (``torch.strided``,
  ``torch.serialization._get_layout``) and memory formats: their names;
- ``collections.OrderedDict`` and ``pathlib`` paths: an empty dict (filled
  by pickle's own opcodes), a string. (Lists, tuples, dicts, sets, strings and
  numbers need no global.)

Any other global (``os.system``, ``builtins.eval``, ``torch.load``...) is
refused before anything is called, with a FormatError naming the file and the
global: nothing of the pickle runs. The result is then checked field by field
and turned into the tensorlist layout's metadata (:func:`tensorlist.dcp.parse_metadata`
runs every rule of that layout on it: chunks inside their tensor, no overlap, no
gap, one record per chunk), and each record's byte range must lie inside its
``.distcp`` file.

The records are read at the metadata's offsets. In torch 2.x (2.13 checked:
``torch/distributed/checkpoint/filesystem.py``, ``_write_item``) a tensor chunk
is a ``torch.save`` of the chunk, loaded here with
``torch.load(weights_only=True)`` after its zip records are sized; a bytes
value is the raw ``torch.save`` of a Python object (what the save planner
gave), loaded the same way and kept as JSON when JSON can hold it, else kept
as those raw bytes, never unpickled. Checkpoints saved with
``serialization_format=SAFETENSORS`` or with stream extensions
(``_extensions``) are refused with a message saying so.

The checkpoint directory is a local path or an fsspec URL (``s3://bucket/ck``,
``memory://ck``): every file is reached through :class:`_Folder`, the one
place that opens them (locally through ``format.open_regular`` and ``pread``,
remotely through fsspec's ``size`` and ranged ``cat_file``), so both go through
the same checks. A remote record is fetched alone, by its byte range.

Imports ``format``, ``errors``, ``_base.jsonio``, ``_base.dtypes``, ``_base.backends``,
``dcp`` and ``formats``; fsspec for URLs; torch (and ``_bridges.torch``)
only when a record is loaded, so the metadata reads without torch.
"""
from __future__ import annotations

import io
import math
import os
import pickle
import posixpath
import re
import warnings
import zipfile
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np

from tensorlist._base import dtypes as _dtypes
from tensorlist._base.backends import filesystem, is_remote, localize
from tensorlist._base.jsonio import MAX_DEPTH, dumps, to_tagged
from tensorlist.dcp import (DCP_VERSION, Checkpoint, StorageEntry, TensorMeta, bytes_key, confine, encode_value,
                        join, metadata_document, parse_metadata, shard_name, tensor_key)
from tensorlist.errors import FormatError
from tensorlist.format import MAX_DIMS, Limits, open_regular, short_repr
from tensorlist.convert.formats import TORCH_DCP_METADATA, expansion_cap

__all__ = ["TorchCheckpoint", "Record", "read_torch_metadata", "load_chunk", "load_value", "record_bytes"]

#: The data files FileSystemWriter names (``__<rank>_<n>.distcp``); no other name is read.
_DISTCP = re.compile(r"\A__([0-9]{1,9})_([0-9]{1,9})\.distcp\Z")
#: The saveId of the plan's shard names: a plan is never written under it (the sink draws a fresh one).
_PLAN_ID = "00000000"
#: Slack allowed beside a chunk's bytes in its torch.save record (the pickle, version and byte-order records).
_RECORD_SLACK = 1 << 20

_DCP_CLASSES = {("torch.distributed.checkpoint.metadata", n) for n in (
    "Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata", "TensorProperties",
    "MetadataIndex", "StorageMeta")} | {("torch.distributed.checkpoint.filesystem", "_StorageInfo")}
_TL_DTYPES = frozenset(d.name for d in _dtypes.DTYPES)
# every dtype torch 2.13 has (``torch.<name>``), so that one tensorlist lacks is named as such, not as a stray global
_TORCH_DTYPES = frozenset(_TL_DTYPES | {
    "bit", "bits16", "bits1x8", "bits2x4", "bits4x2", "bits8", "cdouble", "cfloat", "chalf", "complex32", "double",
    "float", "float4_e2m1fn_x2", "half", "int", "int1", "int2", "int3", "int4", "int5", "int6", "int7", "long",
    "qint32", "qint8", "quint2x4", "quint4x2", "quint8", "short", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6",
    "uint7"})
_TORCH_LAYOUTS = frozenset({"strided", "sparse_coo", "sparse_csr", "sparse_csc", "sparse_bsr", "sparse_bsc",
                            "jagged", "_mkldnn"})
_TORCH_MEMORY_FORMATS = frozenset({"contiguous_format", "channels_last", "channels_last_3d", "preserve_format",
                                   "legacy_contiguous_format"})
# DCP's _MEM_FORMAT_ENCODING values
_MEMORY_FORMAT_CODES = {0: "contiguous_format", 1: "channels_last", 2: "preserve_format"}
_PATHS = {("pathlib", n) for n in ("Path", "PosixPath", "WindowsPath", "PurePath", "PurePosixPath",
                                   "PureWindowsPath")}
_PATHS |= {("pathlib._local", n) for _, n in _PATHS}


class _Standin:
    """One of DCP's metadata classes as data: ``BUILD`` hands its state to ``__setstate__``, which keeps it."""

    __slots__ = ("state",)
    kind = ""

    def __setstate__(self, state) -> None:
        self.state = state


_STANDINS = {key: type(key[1], (_Standin,), {"__slots__": (), "kind": key[1]}) for key in _DCP_CLASSES}


class _Torch:
    """A torch dtype, layout or memory format, by name."""

    __slots__ = ("kind", "name")

    def __init__(self, kind: str, name: str):
        self.kind, self.name = kind, name

    def __repr__(self) -> str:
        return f"torch.{self.name}"


class _Refused(Exception):
    def __init__(self, name: str):
        self.name = name


def _what(v) -> str:
    """A few words about an unpickled value, for messages: never ``repr`` of a whole container.

    (A container from a pickle may nest thousands deep, hold itself, or share one list a million times:
    ``repr`` would recurse, never end, or take as long; an integer may have more digits than ``str`` takes.)
    """
    if isinstance(v, (list, tuple)) and len(v) <= 16 and \
            all(type(x) is int and x.bit_length() <= 64 for x in v):
        return repr(v)  # a shape or offsets: shown whole
    if isinstance(v, (list, tuple, dict, set, frozenset)):
        return f"a {type(v).__name__} of {len(v)} items"
    if isinstance(v, _Standin):
        return f"DCP's {v.kind}"
    if isinstance(v, _Torch) or v is None or isinstance(v, (bool, float)):
        return repr(v)
    if isinstance(v, int):
        return repr(v) if v.bit_length() <= 64 else f"an integer of {v.bit_length()} bits"
    if isinstance(v, (str, bytes)):
        return short_repr(v[:100])
    return f"a {type(v).__name__}"


def _size(values=()) -> tuple:
    # checked before it is copied: one pickle may apply torch.Size to one huge list many times
    if not isinstance(values, (list, tuple)) or len(values) > MAX_DIMS:
        raise ValueError(f"torch.Size of {_what(values)}: not a list of at most {MAX_DIMS} integers")
    if not all(type(v) is int for v in values):
        raise ValueError(f"torch.Size of {_what(values)}: not integers")
    return tuple(values)


def _ordered_dict() -> dict:
    return {}  # pickle fills it with SETITEMS, as it does an OrderedDict


def _layout(name) -> _Torch:
    if not isinstance(name, str) or name.removeprefix("torch.") not in _TORCH_LAYOUTS:
        raise ValueError(f"{_what(name)} is not a torch layout")
    return _Torch("layout", name.removeprefix("torch."))


def _memory_format(code) -> _Torch:
    if type(code) is not int or code not in _MEMORY_FORMAT_CODES:
        raise ValueError(f"{_what(code)} is not one of DCP's memory format codes")
    return _Torch("memory_format", _MEMORY_FORMAT_CODES[code])


def _path(*parts) -> str:
    if len(parts) > 4096 or not all(isinstance(p, str) for p in parts):
        raise ValueError(f"a path of {_what(parts)}")
    return posixpath.join(*parts) if parts else ""


class _Unpickler(pickle.Unpickler):
    """pickle's own machine, resolving only the globals of the module docstring (pickle docs: "Restricting Globals")."""

    def find_class(self, module: str, name: str):
        key = (module, name)
        if key in _STANDINS:
            return _STANDINS[key]
        if key == ("torch.distributed.checkpoint.metadata", "_MEM_FORMAT_ENCODING"):
            return _memory_format
        if key == ("torch.serialization", "_get_layout"):
            return _layout
        if module == "torch":
            if name == "Size":
                return _size
            for kind, names in (("dtype", _TORCH_DTYPES), ("layout", _TORCH_LAYOUTS),
                                ("memory_format", _TORCH_MEMORY_FORMATS)):
                if name in names:
                    return _Torch(kind, name)
        if key == ("collections", "OrderedDict"):
            return _ordered_dict
        if key in _PATHS:
            return _path
        raise _Refused(f"{module}.{name}")

    def persistent_load(self, pid):
        raise _Refused(f"a persistent id ({_what(pid)})")


@dataclass(frozen=True)
class Record:
    """Where a chunk or a bytes value lies: ``length`` bytes at ``offset`` of ``file`` (a ``.distcp`` name)."""

    file: str
    offset: int
    length: int


@dataclass(frozen=True, eq=False)
class TorchCheckpoint:
    """A FileSystemWriter checkpoint's metadata, read under restrictions and checked.

    Attributes:
        path: the checkpoint directory.
        metadata_file: its ``.metadata``.
        plan: the same checkpoint in the tensorlist layout's terms (shards ``<rank>.00000000.tl``,
            one per rank; a bytes entry's ``byteLength`` is its pickle's length), every rule of that layout checked.
        records: (fqn, offsets or None) -> :class:`Record`.
        ranks: each plan file's rank.
    """

    path: str
    metadata_file: str
    plan: Checkpoint
    records: Dict[Tuple[str, Optional[Tuple[int, ...]]], Record]
    ranks: Dict[str, int]


class _Walk:
    """Checks the unpickled stand-ins field by field; a problem is a FormatError naming the file and the field."""

    def __init__(self, file: str, limits: Limits):
        self.file = file
        self.budget = limits.max_tensors

    def fail(self, at: str, what: str):
        raise FormatError(f"not DCP metadata: {what}", file=self.file, field=at)

    def state(self, obj, kind: str, at: str):
        if not isinstance(obj, _Standin) or obj.kind != kind:
            self.fail(at, f"expected DCP's {kind}, got {_what(obj)}")
        return getattr(obj, "state", {})

    def fields(self, obj, kind: str, at: str) -> dict:
        state = self.state(obj, kind, at)
        if not isinstance(state, dict) or not all(isinstance(k, str) for k in state):
            self.fail(at, f"the state of its {kind} is {_what(state)}, not its fields")
        return state

    def dims(self, v, at: str) -> Tuple[int, ...]:
        if not isinstance(v, tuple) or not all(type(x) is int and x >= 0 for x in v):
            self.fail(at, f"{_what(v)} is not a torch.Size of non-negative integers")
        return v

    def count(self, n: int) -> None:
        self.budget -= n
        if self.budget < 0:
            self.fail("", "more chunks than max_tensors allows (raise it with max_tensors=)")

    def tensor(self, fqn: str, obj, at: str) -> TensorMeta:
        d = self.fields(obj, "TensorStorageMetadata", at)
        props = self.state(d.get("properties"), "TensorProperties", f"{at}.properties")
        if isinstance(props, dict):  # DCP before __getstate__ (torch 2.0)
            props = tuple(props.get(k) for k in ("dtype", "layout", "requires_grad", "memory_format", "pin_memory"))
        if not isinstance(props, tuple) or len(props) != 5:
            self.fail(f"{at}.properties", f"{_what(props)} is not (dtype, layout, requires_grad, "
                                          "memory_format, pin_memory)")
        dtype, layout, requires_grad, memory_format, pin_memory = props
        if not isinstance(dtype, _Torch) or dtype.kind != "dtype":
            self.fail(f"{at}.properties.dtype", f"{_what(dtype)} is not a torch dtype")
        if dtype.name not in _TL_DTYPES:
            raise FormatError(f"{fqn!r}: torch dtype {dtype.name} has no tensorlist dataType code", file=self.file,
                              field=f"{at}.properties.dtype")
        if not isinstance(layout, _Torch) or layout.name != "strided":
            raise FormatError(f"{fqn!r}: layout {_what(layout)} is not strided (only dense tensors are read)",
                              file=self.file, field=f"{at}.properties.layout")
        if memory_format is None:
            memory_format = _Torch("memory_format", "contiguous_format")
        if not isinstance(memory_format, _Torch) or memory_format.name not in _MEMORY_FORMAT_CODES.values():
            self.fail(f"{at}.properties.memory_format", f"{_what(memory_format)} is not a memory format")
        for name, v in (("requires_grad", requires_grad), ("pin_memory", pin_memory)):
            if not isinstance(v, bool):
                self.fail(f"{at}.properties.{name}", f"{_what(v)} is not a boolean")
        size = self.dims(d.get("size"), f"{at}.size")
        chunks = d.get("chunks")
        if not isinstance(chunks, list):
            self.fail(f"{at}.chunks", f"{_what(chunks)} is not a list")
        self.count(len(chunks))
        out = []
        for i, c in enumerate(chunks):
            cd = self.fields(c, "ChunkStorageMetadata", f"{at}.chunks[{i}]")
            out.append((self.dims(cd.get("offsets"), f"{at}.chunks[{i}].offsets"),
                        self.dims(cd.get("sizes"), f"{at}.chunks[{i}].sizes")))
        return TensorMeta(fqn, dtype.name, size, tuple(out), requires_grad, memory_format.name, pin_memory, "strided")

    def record(self, index, info, at: str) -> Tuple[Tuple[str, Optional[Tuple[int, ...]]], Record]:
        i = self.fields(index, "MetadataIndex", f"{at} (key)")
        fqn, offset = i.get("fqn"), i.get("offset")
        if not isinstance(fqn, str):
            self.fail(f"{at} (key)", f"fqn {_what(fqn)} is not a string")
        if offset is not None:
            offset = self.dims(offset, f"{at} (key).offset")
        s = self.fields(info, "_StorageInfo", at)
        name, start, length = s.get("relative_path"), s.get("offset"), s.get("length")
        if not isinstance(name, str) or not _DISTCP.match(name):
            self.fail(f"{at}.relative_path", f"{_what(name)} is not a file FileSystemWriter writes "
                                             "(__<rank>_<n>.distcp, in the checkpoint's directory)")
        for field, v in (("offset", start), ("length", length)):
            if type(v) is not int or v < 0:
                self.fail(f"{at}.{field}", f"{_what(v)} is not a non-negative integer")
        if s.get("transform_descriptors"):
            raise FormatError(f"{fqn!r} was written through stream extensions {_what(s['transform_descriptors'])}"
                              " (FileSystemWriter(_extensions=...)): not supported", file=self.file, field=at)
        return (fqn, offset), Record(name, start, length)


class _Folder:
    """The files of a checkpoint directory, a local path or an fsspec URL: the one place they are opened.

    Locally each file goes through ``format.open_regular`` (a FIFO, device or
    directory refused by name) and is read with ``pread`` on that descriptor;
    at a URL through fsspec (``size``, and ``cat_file`` of a byte range). A
    missing file is a FileNotFoundError either way.
    """

    def __init__(self, path: str):
        self.path = path
        self.fs, self.root = None, ""
        if is_remote(path):
            self.fs, self.root = filesystem(path)

    def where(self, name: str) -> str:
        """The path or URL of file ``name`` (what messages name)."""
        return join(self.path, name)

    def _key(self, name: str) -> str:
        return posixpath.join(self.root, name) if self.root else name

    def exists(self, name: str) -> bool:
        if self.fs is None:
            return os.path.lexists(self.where(name))
        return bool(self.fs.exists(self._key(name)))

    def size(self, name: str, what: str) -> int:
        if self.fs is None:
            fd = open_regular(confine(self.path, name, what), what=what)
            try:
                return os.fstat(fd).st_size
            finally:
                os.close(fd)
        return int(self.fs.size(self._key(name)))

    def read(self, name: str, what: str, offset: int = 0, length: Optional[int] = None,
             cap: Optional[int] = None) -> bytes:
        """``length`` bytes at ``offset`` (all with None); a file larger than ``cap`` is refused unread."""
        if self.fs is None:
            fd = open_regular(confine(self.path, name, what), what=what)
            try:
                size = os.fstat(fd).st_size
                _check_cap(size, cap, self.where(name))
                return os.pread(fd, size - offset if length is None else length, offset)
            finally:
                os.close(fd)
        key = self._key(name)
        if cap is not None:
            _check_cap(int(self.fs.size(key)), cap, self.where(name))
        return self.fs.cat_file(key, start=offset, end=None if length is None else offset + length)


def _check_cap(size: int, cap: Optional[int], file: str) -> None:
    if cap is not None and size > cap:
        raise FormatError(f"metadata is {size} bytes, above the limit of {cap}", file=file)


def _load_pickle(raw: bytes, file: str):
    try:
        return _Unpickler(io.BytesIO(raw)).load()
    except _Refused as e:
        raise FormatError(f"refused: the pickle asks for {e.name}, which is none of DCP's metadata classes, torch "
                          "dtypes, sizes, layouts and memory formats, or plain containers; loading it would run code "
                          "(nothing of it was run)", file=file) from None
    except Exception as e:  # UnpicklingError, EOFError, TypeError from a stand-in, MemoryError...
        text = " ".join(str(e).split())[:200] or type(e).__name__
        raise FormatError(f"is not DCP metadata: the pickle cannot be read ({type(e).__name__}: {text})",
                          file=file) from None


def read_torch_metadata(path, *, limits: Limits = Limits()) -> TorchCheckpoint:
    """Reads and checks the ``.metadata`` of a FileSystemWriter checkpoint in directory ``path`` (a path or a URL).

    Raises:
        FileNotFoundError: there is no ``.metadata``.
        FormatError: the pickle asks for anything but the globals of the module
            docstring, or its content breaks a rule (naming the file and the
            field, or the fqn); a ``.distcp`` file is missing or shorter than a
            record the metadata places in it (naming that file).
    """
    path = localize(os.fspath(path))
    folder = _Folder(path)
    file = folder.where(TORCH_DCP_METADATA)
    if not folder.exists(TORCH_DCP_METADATA):
        raise FileNotFoundError(f"{file}: no checkpoint metadata (the save never committed, or not a checkpoint)")
    raw = folder.read(TORCH_DCP_METADATA, "checkpoint metadata", cap=limits.max_descriptor_bytes)
    if raw[:1] in (b"{", b" ", b"\n") and raw.lstrip()[:1] == b"{":
        raise FormatError("is JSON, not DCP's pickled metadata (tensorlist's layout names its metadata "
                          ".metadata.json)", file=file)
    walk = _Walk(file, limits)
    md = walk.fields(_load_pickle(raw, file), "Metadata", "Metadata")
    sdm = md.get("state_dict_metadata")
    if not isinstance(sdm, dict):
        walk.fail("state_dict_metadata", f"{_what(sdm)} is not a dict")
    entries: Dict[str, Optional[TensorMeta]] = {}
    for fqn, v in sdm.items():
        at = f"state_dict_metadata[{_what(fqn)}]"
        if not isinstance(fqn, str):
            walk.fail(at, "a key that is not a string")
        if isinstance(v, _Standin) and v.kind == "BytesStorageMetadata":
            entries[fqn] = None
        else:
            entries[fqn] = walk.tensor(fqn, v, at)
    storage = md.get("storage_data")
    if not isinstance(storage, dict):
        walk.fail("storage_data", f"{_what(storage)} is not a dict")
    walk.count(len(storage))
    records: Dict[Tuple[str, Optional[Tuple[int, ...]]], Record] = {}
    for k, (index, info) in enumerate(storage.items()):
        key, rec = walk.record(index, info, f"storage_data[{k}]")
        if key in records:
            walk.fail(f"storage_data[{k}]", f"a second record for {key[0]!r} at offsets {_what(key[1])}")
        records[key] = rec
    plan, ranks = _plan(path, file, entries, records, md)
    _check_ranges(folder, records, plan)
    return TorchCheckpoint(path, file, plan, records, ranks)


def _plan(path: str, file: str, entries, records, md: dict):
    """The checkpoint in the tensorlist layout's terms, checked by ``parse_metadata`` (every rule of the layout)."""
    chunk_sizes = {(fqn, off): sz for fqn, t in entries.items() if t is not None for off, sz in t.chunks}
    storage: List[Tuple[int, int, StorageEntry]] = []
    for k, ((fqn, off), rec) in enumerate(records.items()):
        rank = int(_DISTCP.match(rec.file).group(1))
        target = shard_name(rank, _PLAN_ID)
        t = entries.get(fqn)
        if off is None:
            e = StorageEntry(fqn, None, target, bytes_key(fqn), rec.length, "torch_save", "uint8", (rec.length,))
        else:
            sizes = chunk_sizes.get((fqn, off), ())
            itemsize = _dtypes.from_name(t.dtype).itemsize if t is not None else 1
            e = StorageEntry(fqn, off, target, tensor_key(fqn, off), math.prod(sizes) * itemsize,
                             None, t.dtype if t is not None else "uint8", sizes)
        storage.append((rank, k, e))
    storage.sort(key=lambda r: r[:2])
    planner = md.get("planner_data")
    if planner is not None and not _small(planner, 64 * len(entries) + 4096):
        raise FormatError(f"not DCP metadata: planner_data nests deeper than {MAX_DEPTH} levels or holds more "
                          "items than its state dict could need (a cycle, or a pickle bomb)", file=file,
                          field="planner_data")
    try:
        planner = None if planner is None else to_tagged(planner, "planner_data")
        dumps(planner)
    except (TypeError, ValueError):
        planner = None  # only a resharded load without a template needs it (DCP's _EmptyStateDictLoadPlanner)
    version = md.get("version")
    doc = metadata_document(save_id=_PLAN_ID, dcp_version=version if isinstance(version, str) else DCP_VERSION,
                            entries=entries, storage=[e for _, _, e in storage], planner_data=planner,
                            storage_meta=None)
    plan = parse_metadata(doc, file=file, path=path)
    return plan, {shard_name(r, _PLAN_ID): r for r, _, _ in storage}


def _small(value, budget: int) -> bool:
    """Whether ``value`` has at most ``budget`` nodes, counting shared ones each time, and ``MAX_DEPTH`` levels.

    A pickle can make a list hold itself, or share one list at every level
    (a few bytes that expand exponentially): walked before anything
    (``to_tagged``, ``dumps``) copies it.
    """
    stack = [(value, 0)]
    while stack:
        v, depth = stack.pop()
        budget -= 1
        if budget < 0 or depth > MAX_DEPTH:
            return False
        if isinstance(v, (list, tuple, set, frozenset)):
            stack.extend((x, depth + 1) for x in v)
        elif isinstance(v, dict):
            stack.extend((x, depth + 1) for kv in v.items() for x in kv)
    return True


def _check_ranges(folder: _Folder, records, plan: Checkpoint) -> None:
    sizes: Dict[str, int] = {}
    for (fqn, off), rec in records.items():
        where = folder.where(rec.file)
        if rec.file not in sizes:
            try:
                sizes[rec.file] = folder.size(rec.file, "checkpoint data file")
            except FileNotFoundError as e:
                raise FormatError(f"data file {rec.file!r} of the checkpoint is missing ({fqn!r} is stored there)",
                                  file=where) from e
        if rec.offset + rec.length > sizes[rec.file]:
            what = "the bytes value" if off is None else f"the chunk at offsets {list(off)}"
            raise FormatError(f"{fqn!r}: the metadata places {what} at bytes [{rec.offset}, {rec.offset + rec.length}),"
                              f" past the file's end at {sizes[rec.file]} (truncated, or the metadata points outside "
                              "it)", file=where)
        if off is not None:
            e = plan.storage[(fqn, off)]
            if rec.length < e.byte_length:
                raise FormatError(f"{fqn!r}: the record of the chunk at offsets {list(off)} is {rec.length} bytes, "
                                  f"less than its {e.byte_length} bytes of data", file=where)


def record_bytes(ckpt: TorchCheckpoint, key) -> bytes:
    """The raw bytes of one record (a ``torch.save`` record), read at its offset."""
    rec = ckpt.records[key]
    folder = _Folder(ckpt.path)
    where = folder.where(rec.file)
    raw = folder.read(rec.file, "checkpoint data file", rec.offset, rec.length)
    if len(raw) != rec.length:
        raise FormatError(f"{key[0]!r}: {len(raw)} bytes at offset {rec.offset}, the metadata says {rec.length} "
                          "(the file shrank while read)", file=where)
    return raw


def _torch_load(raw: bytes, cap: int, where: str, what: str):
    """``torch.load(weights_only=True)`` of one record, its zip records sized first; a FormatError otherwise."""
    try:
        import torch
    except ImportError as e:
        raise ImportError(f"{where}: reading a torch.distributed.checkpoint record needs torch: pip install "
                          "'tensorlist[torch]'") from e
    if raw[:4] != b"PK\x03\x04":
        raise FormatError(f"{what} is not a torch.save record (a checkpoint saved with "
                          "serialization_format=SAFETENSORS or an older layout is not supported)", file=where)
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            total = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise FormatError(f"{what} is not a readable torch.save record: {e}", file=where) from None
    if total > cap:
        raise FormatError(f"{what}: its records expand to {total} bytes, above the {cap} it may hold",
                          file=where)
    try:
        return torch.load(io.BytesIO(raw), map_location="cpu", weights_only=True)
    except Exception as e:  # UnpicklingError (a refused global), RuntimeError (a bad archive)...
        msg = " ".join(str(e).split())[:200] or type(e).__name__
        raise FormatError(f"{what} cannot be loaded with torch.load(weights_only=True): {type(e).__name__}: {msg}",
                          file=where) from None


def load_chunk(ckpt: TorchCheckpoint, fqn: str, offsets: Tuple[int, ...]) -> np.ndarray:
    """One tensor chunk, loaded from its record and checked against the metadata (dtype, shape)."""
    from tensorlist._bridges.torch import to_numpy

    e = ckpt.plan.storage[(fqn, offsets)]
    where = join(ckpt.path, ckpt.records[(fqn, offsets)].file)
    what = f"{fqn!r}: the chunk at offsets {list(offsets)}"
    t = _torch_load(record_bytes(ckpt, (fqn, offsets)), e.byte_length + _RECORD_SLACK, where, what)
    import torch

    if type(t) is not torch.Tensor and type(t) is not torch.nn.Parameter:
        raise FormatError(f"{what} holds {type(t).__name__}, not a tensor", file=where)
    got = str(t.dtype).removeprefix("torch.")
    if got != e.dtype or tuple(t.shape) != tuple(e.shape):
        raise FormatError(f"{what}: the metadata says {e.dtype}{list(e.shape)}, the record holds "
                          f"{got}{list(t.shape)}", file=where)
    try:
        return to_numpy(t.detach(), f"{fqn!r}")
    except TypeError as err:
        raise FormatError(f"{what}: {err}", file=where) from None


def load_value(ckpt: TorchCheckpoint, fqn: str) -> Tuple[bytes, str]:
    """A bytes value as the tensorlist layout stores it: ``(JSON text, "json")``, ``(raw bytes, "bytes")`` for a
    ``bytes`` value, or ``(its pickle, "torch_save")``.

    The pickle is loaded with ``torch.load(weights_only=True)`` only; a value
    that this refuses, or that JSON cannot hold, is kept as its raw bytes (with
    a warning) and never unpickled.
    """
    raw = record_bytes(ckpt, (fqn, None))
    where = join(ckpt.path, ckpt.records[(fqn, None)].file)
    try:
        value = _torch_load(raw, expansion_cap(len(raw), None), where, f"{fqn!r}")
        if isinstance(value, (bytes, bytearray)):  # raw bytes need no pickle and no JSON: kept as they are
            return bytes(value), "bytes"
        return encode_value(value, fqn), "json"
    except (FormatError, TypeError) as e:
        warnings.warn(f"{where}: {fqn!r} is kept as its torch.save bytes (encoding torch_save, never unpickled): "
                      f"{' '.join(str(e).split())[:300]}", stacklevel=2)
        return raw, "torch_save"

