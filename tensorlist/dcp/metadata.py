"""The DCP metadata document: its shape (the schema's rules by hand), its parse, its read.

The checks run in this order and stop at the first failure; each ``FormatError``
names the metadata file and, in its message, the fqn at fault:

1. the metadata file: regular file, size cap, strict JSON (``format.read_json_file``);
2. the shape the JSON Schema gives (``schemas/dcp-metadata.schema.json``), by
   hand-written checks on every read, and by jsonschema too in
   ``validate_checkpoint`` (jsonschema needs seconds for a checkpoint of
   thousands of chunks; a test keeps the two in agreement);
3. the tensors (:mod:`tensorlist.dcp.tiling`): each chunk has the tensor's
   number of dimensions and lies inside it; no two non-empty chunks overlap;
   together they cover every element (no gap);
4. the storage: each entry names a key of ``stateDict`` and, for a tensor,
   one of its chunks; exactly one entry per chunk and per bytes key; its file
   is one of ``files``; ``byteLength`` is the chunk's ``numel x itemsize``.

Imports ``dcp.layout``, ``dcp.tiling``, ``format``, ``schema``, ``_base.jsonio``, ``dtypes``, ``backends``,
``errors`` (jsonschema for :func:`schema_check`); never torch.

Example:
    >>> doc = metadata_document(save_id="0a1b2c3d", dcp_version="1.0.0", entries={"step": None},
    ...                         storage=[StorageEntry("step", None, "0.0a1b2c3d.tl", "step@bytes", 1, "json")])
    >>> parse_metadata(doc, file="ckpt/.metadata.json").bytes_keys
    ['step']
"""
from __future__ import annotations

import os
import posixpath
import re
from itertools import chain
from typing import Any, Dict, Optional, Sequence, Tuple, List

from tensorlist._base import backends
from tensorlist._base import dtypes
from tensorlist._base.jsonio import from_tagged
from tensorlist.errors import FormatError
from tensorlist.format import MAX_DIMS, Limits, read_json_bytes, read_json_file, short_repr
from tensorlist.schema import schema_validator
from tensorlist.dcp.layout import (DCP_FORMAT_VERSION, ENCODINGS, FORMAT_NAME, METADATA_NAME, SCHEMA, Checkpoint, StorageEntry,
                     TensorMeta, confine, join)
from tensorlist.dcp.tiling import check_tiling, numel


def metadata_document(*, save_id: str, dcp_version: Optional[str], entries: Dict[str, Optional[TensorMeta]],
                      storage: Sequence[StorageEntry], planner_data: Any = None,
                      storage_meta: Optional[Dict[str, Any]] = None,
                      tree: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """The metadata as a JSON value, in the layout of ``schemas/dcp-metadata.schema.json``.

    Args:
        save_id: 8 lowercase hex digits.
        dcp_version: DCP's ``Metadata.version``.
        entries: fqn -> TensorMeta, or None for a bytes value, in state-dict order.
        storage: one entry per chunk and per bytes value.
        planner_data: JSON (tagged) planner data, or None.
        storage_meta: ``{"checkpointId", "saveId", "modules"}`` or None.
        tree: a framework adapter's object with a ``"format"`` string (``tensorlist.jax``'s tree header), or
            None (the key is then left out).
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
    doc = {"format": FORMAT_NAME, "formatVersion": DCP_FORMAT_VERSION, "dcpVersion": dcp_version,
           "saveId": save_id, "files": files, "stateDict": state, "storage": stored,
           "plannerData": planner_data, "storageMeta": storage_meta}
    if tree is not None:
        doc["tree"] = tree
    return doc


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
_DTYPE_NAMES = frozenset(d.name for d in dtypes.DTYPES)
_SAVE_ID = re.compile(r"\A[0-9a-f]{8}\Z")
_FILE_NAME = re.compile(r"\A[A-Za-z0-9_][A-Za-z0-9._-]*\.tl\Z")
_TOP = {"format", "formatVersion", "dcpVersion", "saveId", "files", "stateDict", "storage", "plannerData",
        "storageMeta", "tree"}
_TOP_REQUIRED = ("format", "formatVersion", "saveId", "files", "stateDict", "storage")
_TENSOR_KEYS = {"type", "dtype", "size", "chunks", "properties"}
_PROPERTY_KEYS = {"layout", "requiresGrad", "memoryFormat", "pinMemory"}
_ENTRY_REQUIRED = ("fqn", "offset", "file", "tensor", "byteLength")
_ENTRY_KEYS = set(_ENTRY_REQUIRED) | {"encoding"}
_MEMORY_FORMATS = frozenset(("contiguous_format", "channels_last", "preserve_format"))


class _Shape:
    """The schema's rules written out by hand (step 2 on every read: jsonschema takes seconds on big files).

    ``tests/dcp/test_dcp.py`` feeds the same table of documents to this and to
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
        if len(v) > MAX_DIMS:
            self.fail(at, f"{len(v)} dimensions, more than the {MAX_DIMS} a tensor may have")
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
        if _chunks_ok(d["chunks"]):
            return self.properties(d, at)
        for i, c in enumerate(d["chunks"]):  # the slow walk: only to name what is wrong
            self.object(c, f"{at}/chunks/{i}", ("offsets", "sizes"), ("offsets", "sizes"))
            self.dims(c["offsets"], f"{at}/chunks/{i}/offsets")
            self.dims(c["sizes"], f"{at}/chunks/{i}/sizes")
        self.properties(d, at)

    def properties(self, d: dict, at: str) -> None:
        p = self.object(d["properties"], f"{at}/properties", _PROPERTY_KEYS, tuple(_PROPERTY_KEYS))
        self.string(p["layout"], f"{at}/properties/layout", choices=("strided",))
        self.boolean(p["requiresGrad"], f"{at}/properties/requiresGrad")
        self.string(p["memoryFormat"], f"{at}/properties/memoryFormat", choices=_MEMORY_FORMATS)
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
        for fqn, d in doc["stateDict"].items() if not _state_dict_ok(doc["stateDict"]) else ():  # slow: to name it
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
        for k, e in enumerate(doc["storage"] if not _entries_ok(doc["storage"]) else ()):  # slow: to name it
            at = f"/storage/{k}"
            self.object(e, at, _ENTRY_KEYS, _ENTRY_REQUIRED)
            self.string(e["fqn"], f"{at}/fqn")
            if e["offset"] is not None:
                self.dims(e["offset"], f"{at}/offset")
            self.string(e["file"], f"{at}/file", _FILE_NAME)
            self.string(e["tensor"], f"{at}/tensor")
            self.count(e["byteLength"], f"{at}/byteLength")
            if "encoding" in e:
                self.string(e["encoding"], f"{at}/encoding", choices=ENCODINGS)
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
        if "tree" in doc:  # the adapter that wrote it checks the rest (tensorlist.jax: _tree.decode)
            tree = doc["tree"]
            if not isinstance(tree, dict):
                self.fail("/tree", f"{short_repr(tree)} is not an object")
            if "format" not in tree:
                self.fail("/tree", "'format' is a required property")
            self.string(tree["format"], "/tree/format")


def _numbers_ok(lists) -> bool:
    """Every list a list of at most ``MAX_DIMS`` ints in [0, 2^63) (one pass over all of them)."""
    if not all(type(v) is list and len(v) <= MAX_DIMS for v in lists):
        return False
    nums = list(chain.from_iterable(lists))
    return all(type(x) is int for x in nums) and (not nums or (min(nums) >= 0 and max(nums) <= _MAX_COUNT))


def _state_dict_ok(state_dict: dict) -> bool:
    """The fast check of every stateDict entry (``_Shape.tensor`` walks them only when this says no).

    Every number of every tensor goes through one ``_numbers_ok`` call.
    """
    lists = []
    for d in state_dict.values():
        if type(d) is not dict:
            return False
        if d.get("type") == "bytes" and len(d) == 1:
            continue
        if d.keys() != _TENSOR_KEYS or d["type"] != "tensor":
            return False
        p, dtype, chunks = d["properties"], d["dtype"], d["chunks"]
        if type(p) is not dict or p.keys() != _PROPERTY_KEYS or p["layout"] != "strided":
            return False
        if type(p["requiresGrad"]) is not bool or type(p["pinMemory"]) is not bool:
            return False
        if type(p["memoryFormat"]) is not str or p["memoryFormat"] not in _MEMORY_FORMATS:
            return False
        if type(dtype) is not str or dtype not in _DTYPE_NAMES or type(chunks) is not list:
            return False
        if not all(type(c) is dict and len(c) == 2 and "offsets" in c and "sizes" in c for c in chunks):
            return False
        lists.append(d["size"])
        lists.extend(c["offsets"] for c in chunks)
        lists.extend(c["sizes"] for c in chunks)
    return _numbers_ok(lists)


def _chunks_ok(chunks: list) -> bool:
    """The fast check of a tensor's chunks (the hand-written walk runs only when this says no)."""
    if not all(type(c) is dict and len(c) == 2 and "offsets" in c and "sizes" in c for c in chunks):
        return False
    return _numbers_ok([c["offsets"] for c in chunks]) and _numbers_ok([c["sizes"] for c in chunks])


def _entries_ok(entries: list) -> bool:
    """The fast check of the storage entries (the hand-written walk runs only when this says no)."""
    files_ok: Dict[str, bool] = {}
    offsets = []
    for e in entries:
        if type(e) is not dict or not _ENTRY_KEYS.issuperset(e) or len(e) < len(_ENTRY_REQUIRED):
            return False
        try:
            fqn, off, file, tensor, n = e["fqn"], e["offset"], e["file"], e["tensor"], e["byteLength"]
        except KeyError:
            return False
        if type(fqn) is not str or type(tensor) is not str or type(n) is not int or not 0 <= n <= _MAX_COUNT:
            return False
        if type(file) is not str:
            return False
        ok = files_ok.get(file)
        if ok is None:
            ok = files_ok[file] = bool(_FILE_NAME.match(file))
        if not ok or ("encoding" in e and e["encoding"] not in ENCODINGS):
            return False
        if off is not None:
            offsets.append(off)
    return _numbers_ok(offsets)


def check_shape(doc: Any, *, file: str, schema: bool = False) -> None:
    """Step 2: the document has the schema's shape (hand-written checks; also jsonschema with ``schema``).

    Raises:
        FormatError: naming ``file`` and the field (a JSON pointer).
    """
    _Shape(file).document(doc)
    if schema:
        schema_check(doc, file)


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
        path = posixpath.dirname(file) if backends.is_remote(file) else os.path.dirname(file)
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
        check_tiling(t, file, at)
        for off, sz in t.chunks:
            chunk_of.setdefault((fqn, off), sz)  # equal offsets twice: both chunks are empty (tiling checked)
        entries[fqn] = t
    files = tuple(doc["files"])
    known_files = frozenset(files)
    itemsize = {fqn: dtypes.from_name(t.dtype).itemsize for fqn, t in entries.items() if t is not None}
    storage: Dict[Tuple[str, Optional[Tuple[int, ...]]], StorageEntry] = {}
    names: Dict[Tuple[str, str], int] = {}
    for k, d in enumerate(doc["storage"]):
        at = f"/storage/{k}"
        fqn = d["fqn"]
        if fqn not in entries:
            raise FormatError(f"storage entry {k} is for {short_repr(fqn)}, which is not in stateDict",
                              file=file, field=f"{at}/fqn")
        if d["file"] not in known_files:
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
            want = numel(sizes) * itemsize[fqn]
            if d["byteLength"] != want:
                raise FormatError(f"{fqn!r}: storage entry {k} says {d['byteLength']} bytes, the chunk of sizes "
                                  f"{list(sizes)} ({t.dtype}) has {want}", file=file, field=f"{at}/byteLength")
            e = StorageEntry(fqn, off, d["file"], d["tensor"], d["byteLength"], None, t.dtype, sizes)
        key, where = (fqn, e.offset), (e.file, e.tensor)
        if key in storage:
            raise FormatError(f"{fqn!r}: two storage entries for offsets "
                              f"{'(bytes)' if e.offset is None else list(e.offset)}", file=file, field=at)
        if where in names:
            raise FormatError(f"{fqn!r}: storage entries {names[where]} and {k} both point to "
                              f"tensor {e.tensor!r} of {e.file!r}", file=file, field=f"{at}/tensor")
        names[where] = k
        storage[key] = e
    for fqn, t in entries.items():
        for off in ([None] if t is None else [o for o, _ in t.chunks]):
            if (fqn, off) not in storage:
                what = "the bytes value" if off is None else f"the chunk at offsets {list(off)}"
                raise FormatError(f"{fqn!r}: {what} has no storage entry", file=file,
                                  field=f"/stateDict/{_escape(fqn)}")
    planner = doc.get("plannerData")  # decoded here, once: a malformed tag is refused by every reader
    planner_value = None if planner is None else from_tagged(planner, file=file, where="plannerData")
    return Checkpoint(os.fspath(path), file, doc["saveId"], doc.get("dcpVersion"), files, entries, storage,
                      planner, doc.get("storageMeta"), doc.get("tree"), planner_value)


def read_metadata(path, *, limits: Limits = Limits(), schema: bool = False) -> Checkpoint:
    """Reads and checks the metadata of the checkpoint in directory ``path`` (a local path or a URL).

    Raises:
        FileNotFoundError: there is no ``.metadata.json`` (no committed checkpoint).
        FormatError: the metadata breaks a rule (steps 1 to 4), naming the file.
    """
    path = os.fspath(path)
    file = join(path, METADATA_NAME)
    if backends.is_remote(path):
        fs, fpath = backends.filesystem(file)
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
        doc = read_json_file(confine(path, METADATA_NAME, "metadata file"), limits)
    return parse_metadata(doc, file=file, path=path, schema=schema)


# --- the shards --------------------------------------------------------------------
