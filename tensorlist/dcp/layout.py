"""The DCP layout's names and records, without torch: files, keys, entries, the commit, the listing.

A checkpoint of this layout (docs/FORMAT.md, "Distributed checkpoints (DCP)") is a directory of

- ``<rank>.<saveId>.tl``, with its data file ``<rank>.<saveId>.tl.<8 hex>.data``:
  the chunks one rank saved, each a tensor named ``<fqn>@<offsets>``, and its
  non-tensor values as uint8 tensors named ``<fqn>@bytes`` (UTF-8 JSON, or raw bytes);
- ``.metadata.json``: the global metadata (``schemas/dcp-metadata.schema.json``),
  written last, atomically, by the coordinator: the commit point of the save.

Imports ``_storage.commit``, ``_base.jsonio``, ``backends`` and ``errors``; never torch.

Example:
    >>> shard_name(3, "0a1b2c3d"), tensor_key("w", (0, 4)), is_save_file("3.0a1b2c3d.tl")
    ('3.0a1b2c3d.tl', 'w@0,4', '0a1b2c3d')
"""
from __future__ import annotations

import io
import os
import posixpath
import re
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence, Tuple, Dict

from tensorlist._base import backends
from tensorlist._storage.commit import atomic_file
from tensorlist.format import confine as format_confine
from tensorlist._base.jsonio import dumps, from_tagged, loads_strict, to_tagged

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
# The metadata's temporary name while it is committed (``_storage.commit.tmp_beside``): a coordinator killed before the
# rename leaves it behind. It belongs to no save.
_METADATA_TMP = re.compile(r"\A\.\.metadata\.json\.[0-9a-f]{8}\.tmp\Z")
#: What :func:`is_save_file` answers for a metadata temporary file: no saveId, so every sweep deletes it.
NO_SAVE = ""


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
        encoding: bytes only: one of ``ENCODINGS`` (``"torch_save"``: a pickle, opt-in).
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
        tree: a framework adapter's description of the saved object (``"tree"``), or None.
        planner_value: the planner data decoded (``from_tagged``: tuples and non-finite floats back), or None.
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
    tree: Optional[Dict[str, Any]] = None
    planner_value: Any = None

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
    """The saveId of a file a save of this layout creates (shard, data, temporary), else None.

    A temporary metadata file (``..metadata.json.<8 hex>.tmp``, left by a
    coordinator killed before its commit's rename) answers ``NO_SAVE``: it
    is no save's, so the sweep after every commit (``saveId not in (None,
    this save's)``) deletes it. One save per directory at a time: no live
    commit's temporary file is ever swept.

    Example:
        >>> is_save_file("0.0a1b2c3d.tl.1f2e3d4c.data"), is_save_file("..metadata.json.0a1b2c3d.tmp"), \\
        ...     is_save_file("notes.txt")
        ('0a1b2c3d', '', None)
    """
    if _METADATA_TMP.match(name):
        return NO_SAVE
    m = _SAVE_FILE.match(name)
    return m.group(2) if m else None


def join(path, name: str) -> str:
    """``name`` inside the checkpoint directory ``path`` (a local path or a URL)."""
    path = os.fspath(path)
    if backends.is_remote(path):
        return posixpath.join(path.rstrip("/") + "/", name) if path.rstrip("/") else name
    return os.path.join(backends.localize(path), name)


def holds(path, name: str) -> bool:
    """Whether the checkpoint directory ``path`` (a local path or a URL) holds an entry ``name``."""
    target = join(path, name)
    if backends.is_remote(os.fspath(path)):
        fs, p = backends.filesystem(target)
        return bool(fs.exists(p))
    return os.path.lexists(target)


def confine(path, name: str, what: str = "file") -> str:
    """``join(path, name)``, refused when it resolves (symlinks followed) outside the checkpoint directory.

    ``format.confine`` (the one confinement rule of every checkpoint
    directory) for a checkpoint's files, shard descriptors, their data files,
    the metadata and stock ``.distcp`` files alike. A URL has no links: it is
    returned as it is.

    Raises:
        FormatError: the file resolves outside the directory (naming the file and where it leads).
    """
    if backends.is_remote(os.fspath(path)):
        return join(path, name)
    return format_confine(backends.localize(os.fspath(path)), name, what=what)


def commit_metadata(path, doc: dict, *, durable: bool = True) -> None:
    """Writes ``doc`` as the checkpoint's ``.metadata.json``: the commit point of every save of this layout.

    At a URL it is one put (an object store's put is atomic); locally it goes
    through ``_storage.commit.atomic_file`` (temporary name, fsync, rename, directory
    fsync), so a reader sees the old metadata or the new, never a part.
    """
    text = (dumps(doc) + "\n").encode("utf-8")
    target = join(path, METADATA_NAME)
    if backends.is_remote(path):
        fs, p = backends.filesystem(target)
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
    if backends.is_remote(path):
        fs, root = backends.filesystem(path)
        root = root.rstrip("/")
        names = [n.rsplit("/", 1)[-1] for n in fs.ls(root, detail=False)] if fs.exists(root) else []
        return names, (lambda n: fs.rm_file(f"{root}/{n}" if root else n))
    folder = backends.localize(path)
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


#: How a bytes entry's stored bytes make its value: UTF-8 tagged JSON; raw ``bytes``; raw bytes as an
#: ``io.BytesIO`` (both no pickle); or a torch.save pickle (opt-in, never unpickled here).
ENCODINGS = ("json", "bytes", "bytes_io", "torch_save")


def encode_entry(value: Any, fqn: str) -> Tuple[bytes, str]:
    """A non-tensor value's stored bytes and encoding: raw for ``bytes``/``bytearray``/``io.BytesIO``, else JSON.

    Raises:
        TypeError: as :func:`encode_value`.

    Example:
        >>> import io
        >>> encode_entry(b"\\x00\\xff", "blob"), encode_entry(io.BytesIO(b"ab"), "buf"), encode_entry((1, 2), "t")
        ((b'\\x00\\xff', 'bytes'), (b'ab', 'bytes_io'), (b'{"__tuple__":[1,2]}', 'json'))
    """
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value), "bytes"
    if isinstance(value, io.BytesIO):
        return value.getvalue(), "bytes_io"
    return encode_value(value, fqn), "json"


def decode_value(raw: bytes, entry: StorageEntry, file: str) -> Any:
    """The value :func:`encode_entry` stored: JSON decoded, ``bytes``, a fresh ``io.BytesIO``.

    A ``torch_save`` entry comes back as its raw bytes, never unpickled.
    """
    if entry.encoding == "json":
        return from_tagged(loads_strict(raw, file=file), file=file, where=repr(entry.fqn))
    if entry.encoding == "bytes_io":
        return io.BytesIO(bytes(raw))
    return bytes(raw)


# --- the metadata document ---------------------------------------------------------
