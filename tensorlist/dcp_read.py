"""Distributed checkpoints without torch: their layout, its validation, and ``read_full``.

:mod:`tensorlist.dcp` writes ``torch.distributed.checkpoint`` (DCP) checkpoints
as a directory of TensorList files (docs/FORMAT.md, "Distributed checkpoints
(DCP)"):

- ``<rank>.<saveId>.tl``, with its data file ``<rank>.<saveId>.tl.<8 hex>.data``:
  the chunks one rank saved, each a tensor named ``<fqn>@<offsets>``, and its
  non-tensor values as uint8 tensors named ``<fqn>@bytes`` (UTF-8 JSON);
- ``.metadata.json``: the global metadata (``schemas/dcp-metadata.schema.json``),
  written last, atomically, by the coordinator: the commit point of the save.

This module reads and checks that layout with numpy alone. The checks run in
this order and stop at the first failure; each ``FormatError`` names the file
(the metadata or the shard) and, in its message, the fqn at fault:

1. the metadata file: regular file, size cap, strict JSON (``format.read_json_file``);
2. the shape the JSON Schema gives (``schemas/dcp-metadata.schema.json``), by
   hand-written checks on every read, and by jsonschema too in
   :func:`validate_checkpoint` (jsonschema needs seconds for a checkpoint of
   thousands of chunks; a test keeps the two in agreement);
3. the tensors: each chunk has the tensor's number of dimensions and lies
   inside it; no two non-empty chunks overlap; together they cover every
   element (no gap);
4. the storage: each entry names a key of ``stateDict`` and, for a tensor,
   one of its chunks; exactly one entry per chunk and per bytes key; its file
   is one of ``files``; ``byteLength`` is the chunk's ``numel x itemsize``;
5. the shards, when read: each file is a valid TensorList (every rule of
   FORMAT.md 2.3: a truncated data file is refused) and holds the named
   tensor with the chunk's dtype and shape (uint8 ``[byteLength]`` for bytes).

Imports ``format``, ``reader``, ``schema``, ``_commit`` (the metadata's
atomic commit), ``_jsonio``, ``_dtypes``, ``_backends``, ``errors`` and numpy (jsonschema for :func:`schema_check`,
fsspec only for URLs); never torch, so it works where torch is not installed.
:mod:`tensorlist.dcp` (the torch adapter) builds on it and re-exports
:func:`read_full` and :func:`validate_checkpoint`.
"""
from __future__ import annotations

import math
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from . import _backends, _dtypes
from ._commit import atomic_file
from ._jsonio import dumps, from_tagged, loads_strict, to_tagged
from .errors import FormatError
from .format import Limits, read_json_bytes, read_json_file, short_repr
from .reader import Reader, read_mode
from .schema import schema_validator

__all__ = ["METADATA_NAME", "FORMAT_NAME", "DCP_FORMAT_VERSION", "SCHEMA", "TensorMeta", "StorageEntry",
           "Checkpoint", "Shards", "metadata_document", "parse_metadata", "read_metadata", "validate_checkpoint",
           "read_full", "check_shape", "schema_check", "encode_value", "decode_value", "shard_name", "tensor_key",
           "bytes_key", "join", "is_save_file", "holds", "commit_metadata", "listing", "assemble", "DCP_VERSION"]

#: The global metadata's file name in the checkpoint directory (DCP's own is ``.metadata``, a pickle).
METADATA_NAME = ".metadata.json"
#: The ``format`` field: no other JSON document is taken for a checkpoint's metadata.
FORMAT_NAME = "tensorlist-dcp"
#: The layout's version (``formatVersion``); a reader refuses a higher one (the schema's maximum).
DCP_FORMAT_VERSION = 1
#: The shipped JSON Schema of the metadata.
SCHEMA = "dcp-metadata.schema.json"
#: DCP's ``Metadata.version`` written with a checkpoint that no DCP save made (DCP's FileSystemWriter writes the same).
DCP_VERSION = "1.0.0"

# Files a save of this layout creates: shard descriptors, their data files, and
# the temporary names of both (a killed save leaves those); group 2 is the saveId.
_SAVE_FILE = re.compile(r"\A\.?([0-9]+)\.([0-9a-f]{8})\.tl(\.[0-9a-f]{8}\.data)?(\.[0-9a-f]{8}\.tmp)?\Z")


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of the state dict (DCP's ``TensorStorageMetadata``).

    Attributes:
        fqn: the flattened state-dict key.
        dtype: canonical dtype name (``"float32"``, ``"bfloat16"``...).
        size: the full tensor's shape.
        chunks: ``(offsets, sizes)`` of each saved piece, in the saver's order.
        requires_grad, memory_format, pin_memory, layout: DCP's ``TensorProperties``.
    """

    fqn: str
    dtype: str
    size: Tuple[int, ...]
    chunks: Tuple[Tuple[Tuple[int, ...], Tuple[int, ...]], ...]
    requires_grad: bool = False
    memory_format: str = "contiguous_format"
    pin_memory: bool = False
    layout: str = "strided"


@dataclass(frozen=True)
class StorageEntry:
    """Where one chunk (or one bytes value) is stored.

    Attributes:
        fqn: the state-dict key.
        offset: the chunk's offsets (DCP's ``MetadataIndex.offset``); None for bytes.
        file: the shard descriptor's name in the checkpoint directory.
        tensor: the tensor's name in that file.
        byte_length: length of the stored bytes.
        encoding: bytes only: ``"json"`` or ``"torch_save"`` (a pickle, opt-in).
        dtype, shape: what the shard must hold (the chunk's, or uint8 ``[byte_length]``).
    """

    fqn: str
    offset: Optional[Tuple[int, ...]]
    file: str
    tensor: str
    byte_length: int
    encoding: Optional[str] = None
    dtype: str = "uint8"
    shape: Tuple[int, ...] = ()

    @property
    def key(self) -> Tuple[str, Optional[Tuple[int, ...]]]:
        return (self.fqn, self.offset)


@dataclass(frozen=True, eq=False)
class Checkpoint:
    """A checkpoint's metadata, checked (steps 1 to 4 of the module docstring).

    Attributes:
        path: the checkpoint directory (a local path or a URL).
        metadata_file: the metadata file's path or URL (named by errors).
        save_id: the save's 8 hex digits.
        dcp_version: DCP's ``Metadata.version`` at save time.
        files: the shard files.
        entries: the stateDict in file order: fqn -> TensorMeta, or None for a bytes value.
        storage: (fqn, offset) -> StorageEntry.
        planner_data: the planner data as stored (tagged JSON; ``from_tagged`` restores tuples).
        storage_meta: the stored StorageMeta fields, or None.
    """

    path: str
    metadata_file: str
    save_id: str
    dcp_version: Optional[str]
    files: Tuple[str, ...]
    entries: Dict[str, Optional[TensorMeta]]
    storage: Dict[Tuple[str, Optional[Tuple[int, ...]]], StorageEntry]
    planner_data: Any = None
    storage_meta: Optional[Dict[str, Any]] = None

    @property
    def tensors(self) -> Dict[str, TensorMeta]:
        return {k: v for k, v in self.entries.items() if v is not None}

    @property
    def bytes_keys(self) -> List[str]:
        return [k for k, v in self.entries.items() if v is None]


# --- names -------------------------------------------------------------------------

def shard_name(rank: int, save_id: str) -> str:
    """The shard descriptor of ``rank`` in save ``save_id``: ``<rank>.<saveId>.tl``."""
    return f"{rank}.{save_id}.tl"


def tensor_key(fqn: str, offsets: Sequence[int]) -> str:
    """A chunk's tensor name in its shard: ``<fqn>@<offsets, comma-separated>`` (unique per fqn and offsets)."""
    return f"{fqn}@{','.join(str(int(o)) for o in offsets)}"


def bytes_key(fqn: str) -> str:
    """A bytes value's tensor name in its shard: ``<fqn>@bytes`` (no chunk name ends so)."""
    return f"{fqn}@bytes"


def is_save_file(name: str) -> Optional[str]:
    """The saveId of a file a save of this layout creates (shard, data, temporary), else None."""
    m = _SAVE_FILE.match(name)
    return m.group(2) if m else None


def join(path, name: str) -> str:
    """``name`` inside the checkpoint directory ``path`` (a local path or a URL)."""
    path = os.fspath(path)
    if _backends.is_remote(path):
        return posixpath.join(path.rstrip("/") + "/", name) if path.rstrip("/") else name
    return os.path.join(_backends.localize(path), name)


def holds(path, name: str) -> bool:
    """Whether the checkpoint directory ``path`` (a local path or a URL) holds an entry ``name``."""
    target = join(path, name)
    if _backends.is_remote(os.fspath(path)):
        fs, p = _backends.filesystem(target)
        return bool(fs.exists(p))
    return os.path.lexists(target)


def commit_metadata(path, doc: dict, *, durable: bool = True) -> None:
    """Writes ``doc`` as the checkpoint's ``.metadata.json``: the commit point of every save of this layout.

    At a URL it is one put (an object store's put is atomic); locally it goes
    through ``_commit.atomic_file`` (temporary name, fsync, rename, directory
    fsync), so a reader sees the old metadata or the new, never a part.
    """
    text = (dumps(doc) + "\n").encode("utf-8")
    target = join(path, METADATA_NAME)
    if _backends.is_remote(path):
        fs, p = _backends.filesystem(target)
        fs.pipe_file(p, text)
        return
    with atomic_file(target, durable=durable) as tmp:
        with open(tmp, "wb") as f:
            f.write(text)


def listing(path) -> Tuple[List[str], Callable[[str], None]]:
    """The file names in checkpoint directory ``path`` and a function removing one by name.

    A URL prefix holding nothing lists as empty; a missing local directory is
    a FileNotFoundError.
    """
    path = os.fspath(path)
    if _backends.is_remote(path):
        fs, root = _backends.filesystem(path)
        root = root.rstrip("/")
        names = [n.rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)] if fs.exists(root) else []
        return names, (lambda n: fs.rm_file(f"{root}/{n}" if root else n))
    folder = _backends.localize(path)
    return os.listdir(folder), (lambda n: os.unlink(os.path.join(folder, n)))


# --- values ------------------------------------------------------------------------

def encode_value(value: Any, fqn: str) -> bytes:
    """A non-tensor state-dict value as UTF-8 tagged JSON (tuples and non-finite floats kept exactly).

    Raises:
        TypeError: the value is not None, bool, int, float, str, or a list,
            tuple or dict of those (naming ``fqn``).
    """
    try:
        return dumps(to_tagged(value, where=repr(fqn))).encode("utf-8")
    except (TypeError, ValueError) as e:  # UnicodeEncodeError (lone surrogates) is a ValueError
        raise TypeError(f"state dict value {fqn!r} cannot be stored as JSON: {e}") from None


def decode_value(raw: bytes, entry: StorageEntry, file: str) -> Any:
    """The value :func:`encode_value` stored; a ``torch_save`` entry comes back as its raw bytes, never unpickled."""
    if entry.encoding == "json":
        return from_tagged(loads_strict(raw, file=file))
    return bytes(raw)


# --- the metadata document ---------------------------------------------------------

def metadata_document(*, save_id: str, dcp_version: Optional[str], entries: Dict[str, Optional[TensorMeta]],
                      storage: Sequence[StorageEntry], planner_data: Any = None,
                      storage_meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The metadata as a JSON value, in the layout of ``schemas/dcp-metadata.schema.json``.

    Args:
        save_id: 8 lowercase hex digits.
        dcp_version: DCP's ``Metadata.version``.
        entries: fqn -> TensorMeta, or None for a bytes value, in state-dict order.
        storage: one entry per chunk and per bytes value.
        planner_data: JSON (tagged) planner data, or None.
        storage_meta: ``{"checkpointId", "saveId", "modules"}`` or None.
    """
    files: List[str] = []
    for e in storage:
        if e.file not in files:
            files.append(e.file)
    state: Dict[str, Any] = {}
    for fqn, t in entries.items():
        if t is None:
            state[fqn] = {"type": "bytes"}
        else:
            state[fqn] = {"type": "tensor", "dtype": t.dtype, "size": list(t.size),
                          "chunks": [{"offsets": list(o), "sizes": list(s)} for o, s in t.chunks],
                          "properties": {"layout": t.layout, "requiresGrad": t.requires_grad,
                                         "memoryFormat": t.memory_format, "pinMemory": t.pin_memory}}
    stored = []
    for e in storage:
        d: Dict[str, Any] = {"fqn": e.fqn, "offset": None if e.offset is None else list(e.offset), "file": e.file,
                             "tensor": e.tensor, "byteLength": e.byte_length}
        if e.encoding is not None:
            d["encoding"] = e.encoding
        stored.append(d)
    return {"format": FORMAT_NAME, "formatVersion": DCP_FORMAT_VERSION, "dcpVersion": dcp_version,
            "saveId": save_id, "files": files, "stateDict": state, "storage": stored,
            "plannerData": planner_data, "storageMeta": storage_meta}


def _escape(token: str) -> str:
    return token.replace("~", "~0").replace("/", "~1")


def schema_check(doc: Any, file: str) -> None:
    """The shipped JSON Schema, through jsonschema alone (seconds on big documents: see :func:`check_shape`).

    Raises:
        FormatError: the most relevant schema error, naming ``file`` and the field.
    """
    from jsonschema.exceptions import best_match  # the deepest error: inside oneOf, the branch that nearly matched

    e = best_match(schema_validator(SCHEMA).iter_errors(doc))
    if e is not None:
        field = "/" + "/".join(_escape(str(p)) for p in e.absolute_path)
        message = e.message if len(e.message) <= 200 else e.message[:200] + "..."
        raise FormatError(f"not a tensorlist DCP metadata document: {message}", file=file, field=field)


_MAX_COUNT = (1 << 63) - 1
_DTYPE_NAMES = frozenset(d.name for d in _dtypes.DTYPES)
_SAVE_ID = re.compile(r"\A[0-9a-f]{8}\Z")
_FILE_NAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._-]*\.tl\Z")
_TOP = {"format", "formatVersion", "dcpVersion", "saveId", "files", "stateDict", "storage", "plannerData",
        "storageMeta"}
_TOP_REQUIRED = ("format", "formatVersion", "saveId", "files", "stateDict", "storage")
_TENSOR_KEYS = {"type", "dtype", "size", "chunks", "properties"}
_PROPERTY_KEYS = {"layout", "requiresGrad", "memoryFormat", "pinMemory"}
_ENTRY_REQUIRED = ("fqn", "offset", "file", "tensor", "byteLength")
_ENTRY_KEYS = set(_ENTRY_REQUIRED) | {"encoding"}


class _Shape:
    """The schema's rules written out by hand (step 2 on every read: jsonschema takes seconds on big files).

    ``tests/test_dcp.py`` feeds the same table of documents to this and to
    jsonschema and checks that both accept and refuse the same ones.
    """

    def __init__(self, file: str):
        self.file = file

    def fail(self, at: str, what: str):
        raise FormatError(f"not a tensorlist DCP metadata document: {what}", file=self.file, field=at or "/")

    def object(self, v, at: str, keys, required) -> dict:
        if not isinstance(v, dict):
            self.fail(at, f"{short_repr(v)} is not an object")
        for k in required:
            if k not in v:
                self.fail(at, f"{k!r} is a required property")
        for k in v:
            if k not in keys:
                self.fail(f"{at}/{_escape(k)}", f"unexpected property {short_repr(k)}")
        return v

    def count(self, v, at: str) -> int:
        if type(v) is not int or not 0 <= v <= _MAX_COUNT:
            self.fail(at, f"{short_repr(v)} is not an integer in [0, 2^63)")
        return v

    def dims(self, v, at: str) -> list:
        if not isinstance(v, list):
            self.fail(at, f"{short_repr(v)} is not an array")
        for i, x in enumerate(v):
            if type(x) is not int or not 0 <= x <= _MAX_COUNT:
                self.count(x, f"{at}/{i}")
        return v

    def string(self, v, at: str, pattern=None, choices=None) -> str:
        if not isinstance(v, str):
            self.fail(at, f"{short_repr(v)} is not a string")
        if pattern is not None and not pattern.match(v):
            self.fail(at, f"{short_repr(v)} does not match {pattern.pattern!r}")
        if choices is not None and v not in choices:
            self.fail(at, f"{short_repr(v)} is not one of {sorted(choices)}")
        return v

    def boolean(self, v, at: str) -> None:
        if not isinstance(v, bool):
            self.fail(at, f"{short_repr(v)} is not a boolean")

    def tensor(self, d: dict, at: str) -> None:
        self.object(d, at, _TENSOR_KEYS, tuple(_TENSOR_KEYS))
        self.string(d["dtype"], f"{at}/dtype", choices=_DTYPE_NAMES)
        self.dims(d["size"], f"{at}/size")
        if not isinstance(d["chunks"], list):
            self.fail(f"{at}/chunks", "chunks is not an array")
        for i, c in enumerate(d["chunks"]):
            self.object(c, f"{at}/chunks/{i}", ("offsets", "sizes"), ("offsets", "sizes"))
            self.dims(c["offsets"], f"{at}/chunks/{i}/offsets")
            self.dims(c["sizes"], f"{at}/chunks/{i}/sizes")
        p = self.object(d["properties"], f"{at}/properties", _PROPERTY_KEYS, tuple(_PROPERTY_KEYS))
        self.string(p["layout"], f"{at}/properties/layout", choices=("strided",))
        self.boolean(p["requiresGrad"], f"{at}/properties/requiresGrad")
        self.string(p["memoryFormat"], f"{at}/properties/memoryFormat",
                    choices=("contiguous_format", "channels_last", "preserve_format"))
        self.boolean(p["pinMemory"], f"{at}/properties/pinMemory")

    def document(self, doc: Any) -> None:
        self.object(doc, "", _TOP, _TOP_REQUIRED)
        if doc["format"] != FORMAT_NAME:
            self.fail("/format", f"{short_repr(doc['format'])} is not {FORMAT_NAME!r}")
        v = doc["formatVersion"]
        if type(v) is not int or not 1 <= v <= DCP_FORMAT_VERSION:
            self.fail("/formatVersion", f"{short_repr(v)} is not a version this reader knows "
                                        f"(1 to {DCP_FORMAT_VERSION})")
        if doc.get("dcpVersion") is not None:
            self.string(doc["dcpVersion"], "/dcpVersion")
        self.string(doc["saveId"], "/saveId", _SAVE_ID)
        files = doc["files"]
        if not isinstance(files, list):
            self.fail("/files", "files is not an array")
        for i, f in enumerate(files):
            self.string(f, f"/files/{i}", _FILE_NAME)
        if len(set(files)) != len(files):
            self.fail("/files", "files has non-unique elements")
        if not isinstance(doc["stateDict"], dict):
            self.fail("/stateDict", "stateDict is not an object")
        for fqn, d in doc["stateDict"].items():
            at = f"/stateDict/{_escape(fqn)}"
            kind = d.get("type") if isinstance(d, dict) else None
            if kind == "bytes":
                self.object(d, at, ("type",), ("type",))
            elif kind == "tensor":
                self.tensor(d, at)
            else:
                self.fail(at, f"{short_repr(d)} is neither a tensor nor a bytes entry")
        if not isinstance(doc["storage"], list):
            self.fail("/storage", "storage is not an array")
        for k, e in enumerate(doc["storage"]):
            at = f"/storage/{k}"
            self.object(e, at, _ENTRY_KEYS, _ENTRY_REQUIRED)
            self.string(e["fqn"], f"{at}/fqn")
            if e["offset"] is not None:
                self.dims(e["offset"], f"{at}/offset")
            self.string(e["file"], f"{at}/file", _FILE_NAME)
            self.string(e["tensor"], f"{at}/tensor")
            self.count(e["byteLength"], f"{at}/byteLength")
            if "encoding" in e:
                self.string(e["encoding"], f"{at}/encoding", choices=("json", "torch_save"))
        meta = doc.get("storageMeta")
        if meta is not None:
            self.object(meta, "/storageMeta", ("checkpointId", "saveId", "modules"), ())
            for k in ("checkpointId", "saveId"):
                if meta.get(k) is not None:
                    self.string(meta[k], f"/storageMeta/{k}")
            if "modules" in meta:
                if not isinstance(meta["modules"], list):
                    self.fail("/storageMeta/modules", "modules is not an array")
                for i, m in enumerate(meta["modules"]):
                    self.string(m, f"/storageMeta/modules/{i}")


def check_shape(doc: Any, *, file: str, schema: bool = False) -> None:
    """Step 2: the document has the schema's shape (hand-written checks; also jsonschema with ``schema``).

    Raises:
        FormatError: naming ``file`` and the field (a JSON pointer).
    """
    _Shape(file).document(doc)
    if schema:
        schema_check(doc, file)


def _numel(dims: Sequence[int]) -> int:
    return math.prod(dims)


def _overlap(a_off, a_sz, b_off, b_sz) -> bool:
    return all(ao < bo + bs and bo < ao + as_ for ao, as_, bo, bs in zip(a_off, a_sz, b_off, b_sz))


def _check_tiling(t: TensorMeta, file: str, at: str) -> None:
    """Chunks inside the tensor, pairwise disjoint, covering it (step 3)."""
    n = len(t.size)
    boxes = []
    covered = 0
    for i, (off, sz) in enumerate(t.chunks):
        where = f"{at}/chunks/{i}"
        if len(off) != n or len(sz) != n:
            raise FormatError(f"{t.fqn!r}: chunk {i} has {len(off)} offsets and {len(sz)} sizes for a tensor "
                              f"of {n} dimensions {list(t.size)}", file=file, field=where)
        for d in range(n):
            if off[d] + sz[d] > t.size[d]:
                raise FormatError(f"{t.fqn!r}: chunk {i} (offsets {list(off)}, sizes {list(sz)}) lies outside the "
                                  f"tensor of size {list(t.size)} in dimension {d}", file=file, field=where)
        volume = _numel(sz)
        if volume:
            boxes.append((off, sz, i))
            covered += volume
    # sweep along dimension 0: only chunks still open at a chunk's start can overlap it
    boxes.sort(key=lambda b: b[0][:1])
    active: List[tuple] = []
    for off, sz, i in boxes:
        if n:
            active = [b for b in active if b[0][0] + b[1][0] > off[0]]
        for o2, s2, j in active:
            if _overlap(off, sz, o2, s2):
                raise FormatError(f"{t.fqn!r}: chunks {min(i, j)} and {max(i, j)} overlap (offsets {list(o2)} "
                                  f"sizes {list(s2)} and offsets {list(off)} sizes {list(sz)})",
                                  file=file, field=f"{at}/chunks/{max(i, j)}")
        active.append((off, sz, i))
    total = _numel(t.size)
    if covered != total:
        raise FormatError(f"{t.fqn!r}: the chunks cover {covered} of the tensor's {total} elements (a gap): "
                          "the checkpoint is incomplete", file=file, field=f"{at}/chunks")


def parse_metadata(doc: Any, *, file: str, path: Optional[str] = None, schema: bool = False) -> Checkpoint:
    """Checks a metadata document (steps 2 to 4 of the module docstring) and returns it as a :class:`Checkpoint`.

    Args:
        doc: the parsed JSON value.
        file: the metadata file's name, for errors.
        path: the checkpoint directory (default: ``file``'s directory).
        schema: also run jsonschema with the shipped schema (the hand-written
            checks of the same rules always run; jsonschema takes seconds on
            checkpoints of thousands of chunks).

    Raises:
        FormatError: the first rule broken, naming ``file``, the field and the fqn.
    """
    check_shape(doc, file=file, schema=schema)
    if path is None:
        path = posixpath.dirname(file) if _backends.is_remote(file) else os.path.dirname(file)
    entries: Dict[str, Optional[TensorMeta]] = {}
    chunk_of: Dict[Tuple[str, Tuple[int, ...]], Tuple[int, ...]] = {}
    for fqn, d in doc["stateDict"].items():
        at = f"/stateDict/{_escape(fqn)}"
        if d["type"] == "bytes":
            entries[fqn] = None
            continue
        p = d["properties"]
        t = TensorMeta(fqn, d["dtype"], tuple(d["size"]),
                       tuple((tuple(c["offsets"]), tuple(c["sizes"])) for c in d["chunks"]),
                       p["requiresGrad"], p["memoryFormat"], p["pinMemory"], p["layout"])
        _check_tiling(t, file, at)
        for off, sz in t.chunks:
            chunk_of.setdefault((fqn, off), sz)  # equal offsets twice: both chunks are empty (tiling checked)
        entries[fqn] = t
    files = tuple(doc["files"])
    storage: Dict[Tuple[str, Optional[Tuple[int, ...]]], StorageEntry] = {}
    names: Dict[Tuple[str, str], int] = {}
    for k, d in enumerate(doc["storage"]):
        at = f"/storage/{k}"
        fqn = d["fqn"]
        if fqn not in entries:
            raise FormatError(f"storage entry {k} is for {short_repr(fqn)}, which is not in stateDict",
                              file=file, field=f"{at}/fqn")
        if d["file"] not in files:
            raise FormatError(f"{fqn!r}: storage entry {k} names file {d['file']!r}, which is not in files",
                              file=file, field=f"{at}/file")
        t = entries[fqn]
        if t is None:
            if d["offset"] is not None or "encoding" not in d:
                raise FormatError(f"{fqn!r} is a bytes value: its storage entry needs offset null and an encoding",
                                  file=file, field=at)
            e = StorageEntry(fqn, None, d["file"], d["tensor"], d["byteLength"], d["encoding"], "uint8",
                             (d["byteLength"],))
        else:
            if d["offset"] is None or "encoding" in d:
                raise FormatError(f"{fqn!r} is a tensor: its storage entry needs the chunk's offsets and no "
                                  "encoding", file=file, field=at)
            off = tuple(d["offset"])
            sizes = chunk_of.get((fqn, off))
            if sizes is None:
                raise FormatError(f"{fqn!r}: storage entry {k} is for offsets {list(off)}, which no chunk of the "
                                  "tensor has", file=file, field=f"{at}/offset")
            want = _numel(sizes) * _dtypes.from_name(t.dtype).itemsize
            if d["byteLength"] != want:
                raise FormatError(f"{fqn!r}: storage entry {k} says {d['byteLength']} bytes, the chunk of sizes "
                                  f"{list(sizes)} ({t.dtype}) has {want}", file=file, field=f"{at}/byteLength")
            e = StorageEntry(fqn, off, d["file"], d["tensor"], d["byteLength"], None, t.dtype, sizes)
        if e.key in storage:
            raise FormatError(f"{fqn!r}: two storage entries for offsets "
                              f"{'(bytes)' if e.offset is None else list(e.offset)}", file=file, field=at)
        if (e.file, e.tensor) in names:
            raise FormatError(f"{fqn!r}: storage entries {names[(e.file, e.tensor)]} and {k} both point to "
                              f"tensor {e.tensor!r} of {e.file!r}", file=file, field=f"{at}/tensor")
        names[(e.file, e.tensor)] = k
        storage[e.key] = e
    for fqn, t in entries.items():
        for off in ([None] if t is None else [o for o, _ in t.chunks]):
            if (fqn, off) not in storage:
                what = "the bytes value" if off is None else f"the chunk at offsets {list(off)}"
                raise FormatError(f"{fqn!r}: {what} has no storage entry", file=file,
                                  field=f"/stateDict/{_escape(fqn)}")
    return Checkpoint(os.fspath(path), file, doc["saveId"], doc.get("dcpVersion"), files, entries, storage,
                      doc.get("plannerData"), doc.get("storageMeta"))


def read_metadata(path, *, limits: Limits = Limits(), schema: bool = False) -> Checkpoint:
    """Reads and checks the metadata of the checkpoint in directory ``path`` (a local path or a URL).

    Raises:
        FileNotFoundError: there is no ``.metadata.json`` (no committed checkpoint).
        FormatError: the metadata breaks a rule (steps 1 to 4), naming the file.
    """
    path = os.fspath(path)
    file = join(path, METADATA_NAME)
    if _backends.is_remote(path):
        fs, fpath = _backends.filesystem(file)
        if not fs.exists(fpath):
            raise FileNotFoundError(f"{file}: no checkpoint metadata (the save never committed, or not a checkpoint)")
        size = fs.size(fpath)
        if size is not None and size > limits.max_descriptor_bytes:
            raise FormatError(f"metadata is {size} bytes, above the limit of {limits.max_descriptor_bytes}",
                              file=file)
        doc = read_json_bytes(fs.cat_file(fpath), file=file, limits=limits)
    else:
        if not os.path.lexists(file):
            raise FileNotFoundError(f"{file}: no checkpoint metadata (the save never committed, or not a checkpoint)")
        doc = read_json_file(file, limits)
    return parse_metadata(doc, file=file, path=path, schema=schema)


# --- the shards --------------------------------------------------------------------

class Shards:
    """The shard files of a checkpoint, each opened once when first needed and checked (step 5).

    Args:
        path: the checkpoint directory (a local path or a URL).
        mmap: map the data files (zero-copy, read-only views); ``"copy"``
            maps them copy-on-write (writable views, the files never change);
            False reads with pread (safer where files may be truncated under
            the reader). Anything else is a ValueError.
        verify: check each tensor's CRC32C when it is first read.
        limits: policy limits for the shard descriptors.

    Example:
        >>> ckpt = read_metadata(ckpt_dir)  # doctest: +SKIP
        >>> with Shards(ckpt.path) as shards:  # doctest: +SKIP
        ...     arrays = [shards.array(e) for e in ckpt.storage.values() if e.offset is not None]
    """

    def __init__(self, path, *, mmap=True, verify: bool = False, limits: Limits = Limits()):
        self.path = os.fspath(path)
        self.mmap = read_mode(mmap)
        self.verify = verify
        self.limits = limits
        self._readers: Dict[str, Any] = {}

    def reader(self, name: str):
        """The open reader of shard ``name`` (opened and checked on first use)."""
        r = self._readers.get(name)
        if r is None:
            path = join(self.path, name)
            try:
                r = Reader(path, mmap=self.mmap, max_descriptor_bytes=self.limits.max_descriptor_bytes,
                           max_tensors=self.limits.max_tensors, max_total_bytes=self.limits.max_total_bytes)
            except FileNotFoundError as e:
                missing = getattr(e, "filename", None) or path
                raise FormatError(f"shard file {name!r} of the checkpoint is missing ({missing})",
                                  file=path) from e
            self._readers[name] = r
        return r

    def _checked(self, entry: StorageEntry):
        r = self.reader(entry.file)
        where = "the bytes value" if entry.offset is None else f"the chunk at offsets {list(entry.offset)}"
        if entry.tensor not in r:
            raise FormatError(f"{entry.fqn!r}: {where} should be tensor {entry.tensor!r}, which the shard lacks",
                              file=r.path)
        info = r.info(entry.tensor)
        if info.dtype.name != entry.dtype or tuple(info.shape) != tuple(entry.shape):
            raise FormatError(f"{entry.fqn!r}: the metadata says {where} is {entry.dtype}{list(entry.shape)}, the "
                              f"shard holds {info.dtype.name}{list(info.shape)}", file=r.path,
                              tensor_index=info.index, tensor_name=entry.tensor)
        if self.verify:
            r.verify([entry.tensor])
        return r

    def check(self, entry: StorageEntry) -> None:
        """Opens the entry's shard and checks its tensor's dtype and shape (and CRC with ``verify``)."""
        self._checked(entry)

    def array(self, entry: StorageEntry) -> np.ndarray:
        """The stored chunk (a read-only view of the mapped file with ``mmap``), checked against the metadata."""
        return self._checked(entry)[entry.tensor]

    def raw(self, entry: StorageEntry) -> bytes:
        """The stored bytes of a bytes value."""
        return self.array(entry).tobytes()

    def value(self, entry: StorageEntry) -> Any:
        """A bytes value decoded (:func:`decode_value`)."""
        return decode_value(self.raw(entry), entry, join(self.path, entry.file))

    def close(self) -> None:
        """Closes every opened shard; arrays already returned stay valid."""
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def __enter__(self) -> "Shards":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def validate_checkpoint(path, *, verify: bool = False, schema: bool = True, limits: Limits = Limits()) -> Checkpoint:
    """Checks a whole checkpoint: the metadata, then every shard file and every stored chunk.

    Args:
        path: the checkpoint directory (a local path or a URL).
        verify: also check every tensor's CRC32C (reads every byte).
        schema: also validate the metadata with jsonschema against the shipped schema.
        limits: policy limits for the metadata and the shard descriptors.

    Returns:
        the checked :class:`Checkpoint`.

    Raises:
        FileNotFoundError: no committed checkpoint in ``path``.
        FormatError: the first rule broken (module docstring), naming the file
            and the fqn: a missing or truncated shard, a chunk that does not
            match its stored tensor, overlapping chunks, a gap...
    """
    ckpt = read_metadata(path, limits=limits, schema=schema)
    with Shards(ckpt.path, mmap=False, verify=verify, limits=limits) as shards:
        for name in ckpt.files:
            shards.reader(name)
        for entry in ckpt.storage.values():
            shards.check(entry)
    return ckpt


def read_full(path, *, verify: bool = False, mmap=True, limits: Limits = Limits()) -> Dict[str, Any]:
    """Every tensor of a checkpoint assembled whole from its chunks, with numpy alone.

    Args:
        path: the checkpoint directory (a local path or a URL).
        verify: check the CRC32C of every chunk read.
        mmap: read the shards through memory maps (the default; ``"copy"`` is
            accepted, the result being new arrays anyway) or with pread.
        limits: policy limits for the metadata and the shard descriptors.

    Returns:
        fqn -> value, in the saved state dict's order (flattened keys, as DCP
        stores them): a new numpy array per tensor (bfloat16/float8 through
        ml_dtypes), the decoded value per JSON bytes entry, and the raw bytes
        of a ``torch_save`` entry (a pickle: never unpickled here).

    Raises:
        FileNotFoundError: no committed checkpoint in ``path``.
        FormatError: as :func:`validate_checkpoint`.

    Example:
        >>> import numpy as np
        >>> read_full(ckpt_dir)["model.weight"].shape  # doctest: +SKIP
        (1024, 512)
    """
    mmap = read_mode(mmap)
    ckpt = read_metadata(path, limits=limits)
    out: Dict[str, Any] = {}
    with Shards(ckpt.path, mmap=mmap, verify=verify, limits=limits) as shards:
        for fqn, t in ckpt.entries.items():
            if t is None:
                out[fqn] = shards.value(ckpt.storage[(fqn, None)])
            else:
                out[fqn] = assemble(t, lambda off, fqn=fqn: shards.array(ckpt.storage[(fqn, off)]), copy=True)
    return out


def assemble(t: TensorMeta, chunk, *, copy: bool = False) -> np.ndarray:
    """The whole tensor ``t`` from its chunks, ``chunk(offsets)`` giving each (checked metadata: they tile it).

    A tensor saved as one chunk comes back as that chunk itself (a view of a
    mapped shard, say) unless ``copy``; empty chunks are not asked for.
    """
    if len(t.chunks) == 1 and tuple(t.chunks[0][1]) == tuple(t.size):
        part = chunk(t.chunks[0][0])
        return np.array(part) if copy else part
    full = np.empty(t.size, dtype=_dtypes.from_name(t.dtype).numpy)
    for off, sz in t.chunks:
        if _numel(sz):
            full[tuple(slice(o, o + s) for o, s in zip(off, sz))] = chunk(off)
    return full
