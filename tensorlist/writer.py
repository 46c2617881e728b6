"""Writing: ``save``, the streaming :class:`Writer`, ``write_data`` and ``save_document``.

Tensors are prepared and laid out by ``_storage.items`` (shared with the remote
writer), written by the C core straight from the caller's buffers, and
committed through ``_storage.commit``'s one atomic replacement protocol (data file,
then descriptor; see its docstring). URLs go to the registered backend
(``backends``).

Imports ``_storage.items``, ``_storage.commit``, ``backends``, ``format``, ``_base.jsonio``,
``_base.dtypes`` and ``lowlevel``; never ``remote`` or torch.
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist._base import backends
from tensorlist._base import lowlevel
from tensorlist._storage.commit import Commit, atomic_file
from tensorlist._storage.items import (GCPaused, Item, WriterBase, align, check_alignment, check_metadata, descriptor,
                     descriptor_text, fast_descriptor_text, known_len, prepare, tensor_entries)
from tensorlist._storage.items import layout as place
from tensorlist._storage.sealed import Seal, check_key_use, le_bytes
from tensorlist._base.jsonio import check_json, dumps, escape_pointer, resolve_pointer, walk
from tensorlist.errors import FormatError
from tensorlist.format import DEFAULT_ALIGNMENT, LIST_ALIGNMENT, MIN_TENSOR_ALIGNMENT, find_tensor_lists

__all__ = ["save", "Writer", "Tensors", "write_data", "save_document", "document_lists", "document_with_descriptors"]

def _write_lists(fd, lists, alignment, checksum, durable, threads, path, lamp):
    """Writes several prepared lists into one new file at 4096-aligned offsets.

    Returns:
        [(list_offset, tensor_offsets, list_length, crcs or None)] per list.
    """
    bufs, offs, swaps, layout = [], [], [], []
    start = 0
    for items in lists:
        start = align(start, LIST_ALIGNMENT)
        rel, length = place(items, start, alignment, lamp)  # lamp's refusals come before any byte
        layout.append((start, rel, length))
        end = start + length
        for it, o in zip(items, rel):
            bufs.append(it.array)
            # an empty tensor writes nothing; a trailing one's rounded offset may lie past the list
            offs.append(start + o if it.nbytes else min(start + o, end))
            swaps.append(it.swap)
        start = end
    crcs = lowlevel.write_items(fd, bufs, offs, swaps, 0, start, crc=checksum and not lamp,
                                 fsync=False, sparse=True, threads=threads, path=path, writeback=durable)
    out, k = [], 0
    for (s, rel, length), items in zip(layout, lists):
        out.append((s, rel, length, crcs[k:k + len(items)] if crcs is not None else None))
        k += len(items)
    return out


def _sealed_lists(fd, lists, metas, alignment, threads, path, key, location) -> List[Dict[str, Any]]:
    """Writes several lists encrypted, each with its own salt, at 4096-aligned offsets; returns their descriptors."""
    out, start = [], 0
    for items, meta in zip(lists, metas):
        start = align(start, LIST_ALIGNMENT)
        seal = Seal(key, threads)
        rel, length = seal.write_list(fd, items, start, alignment, path)
        out.append(seal.list_descriptor(items, rel, location, start, length, meta))
        start += length
    return out


def save(path, tensors, *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
         lamp: bool = False, durable: bool = True, threads: Optional[int] = None, key=None) -> None:
    """Writes a list of tensors: a JSON descriptor at ``path`` and a data file beside it.

    Atomic and durable: whenever the process dies, ``path`` loads either the
    complete old content or the complete new content.

    Args:
        path: where the descriptor goes.
        tensors: a mapping name -> array (named) or a sequence of arrays
            (positional, as in lamp). Anything ``numpy.asarray`` takes; non-C-
            contiguous arrays are copied once, big-endian ones are byte-swapped
            while writing; the caller's arrays are never modified.
        metadata: any JSON value, stored as the list's ``metadata``.
        alignment: byte alignment of every tensor (power of two, 8 to 1 MiB).
        checksum: store each tensor's CRC32C (computed in C while writing).
        lamp: write exactly what lamp's ``writeTensorsIntoFile`` writes: data
            file ``<name>.data``, 8-byte padding, compact JSON in lamp's key
            order, no names, no metadata, no checksums.
        durable: fsync the data, the descriptor and the directory.
        threads: threads the save may use (default: usable cores, at most 8): one writes, the others checksum (all but two on a durable save).
        key: encrypt the list (a ``tensorlist.Key`` or 32 bytes): tensor
            values and metadata are sealed with AES-256-GCM, names, dtypes and
            shapes stay readable and authenticated (docs/SECURITY.md). No
            checksums are stored: every chunk's tag replaces them.

    Raises:
        TypeError: a value cannot be stored (object dtype, non-str name...).
        ValueError: bad alignment, or metadata that is not strict JSON.
        OSError: the files cannot be written; the old content is left intact.

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "model.tl")
        >>> tensorlist.save(path, {"w": np.ones((2, 3), np.float32)}, metadata={"step": 3})
        >>> tensorlist.load(path)["w"].shape
        (2, 3)
    """
    key = check_key_use(key, lamp)
    if backends.is_remote(path):  # served by the registered URL backend (tensorlist.remote)
        return backends.dispatch("save", path)(path, tensors, metadata=metadata, alignment=alignment,
                                                checksum=checksum, lamp=lamp, durable=durable, threads=threads,
                                                **({"key": key} if key is not None else {}))
    path = backends.localize(os.fspath(path))
    if lamp:
        alignment = MIN_TENSOR_ALIGNMENT
    check_alignment(alignment)
    metadata = check_metadata(metadata, lamp)
    with GCPaused(known_len(tensors)):
        items, named = prepare(tensors, os.fspath(path))
    if lamp and named:
        # lamp lists are positional: the mapping's order is kept, its keys are not stored
        pass
    commit = Commit(path, lamp=lamp, durable=durable)
    try:
        fd = commit.open_data()
        if key is not None:
            seal = Seal(key, threads)
            offsets, length = seal.write_list(fd, items, 0, alignment, commit.data_tmp)
            commit.finish_data()
            commit.commit(descriptor_text(seal.list_descriptor(items, offsets, commit.data_name, 0, length,
                                                               metadata), False))
            return
        [(_, offsets, length, crcs)] = _write_lists(fd, [items], alignment, checksum, durable, threads,
                                                    commit.data_tmp, lamp)
        commit.finish_data()
        with GCPaused(len(items)):
            if lamp:
                text = descriptor_text(descriptor(tensor_entries(items, offsets, crcs, True), commit.data_name,
                                                    0, length, None, True), True)
            else:
                text = fast_descriptor_text(items, offsets, crcs, commit.data_name, length, metadata)
        commit.commit(text)
    except BaseException:
        commit.abort()
        raise


class Writer(WriterBase):
    """Writes a TensorList one tensor at a time; the descriptor is committed last.

    Use it as a context manager: on normal exit the file is committed
    atomically (as ``save`` does), on an exception everything written is
    discarded and the previous file at ``path`` is left untouched.

    ``add`` writes an array now (from its buffer, without holding earlier ones
    in memory); ``reserve`` returns a writable array mapped into the data
    file to fill in place (e.g. a model larger than RAM, shard by shard).

    Args are those of :func:`save`.

    Safety: arrays returned by ``reserve`` map the data file; do not write to
    them after the Writer is closed (that would change the committed file).

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "big.tl")
        >>> with tensorlist.Writer(path, metadata={"kind": "demo"}) as w:
        ...     w.add("a", np.arange(3))
        ...     b = w.reserve("b", (2, 2), np.float32)
        ...     b[:] = 7
        >>> float(tensorlist.load(path)["b"].sum())
        28.0
    """

    def __new__(cls, path=None, *args, **kwargs):
        if backends.is_remote(path):  # served by the registered URL backend (tensorlist.remote)
            return backends.dispatch("writer", path)(path, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, path, *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT,
                 checksum: bool = True, lamp: bool = False, durable: bool = True,
                 threads: Optional[int] = None, key=None):
        path = backends.localize(os.fspath(path))
        key = check_key_use(key, lamp)
        self._setup(os.path.abspath(path), metadata, alignment, checksum and key is None, lamp)
        self.threads = threads
        self._seal = Seal(key, threads) if key is not None else None
        self._commit = Commit(path, lamp=lamp, durable=durable)
        self._fd = self._commit.open_data()

    @property
    def path(self) -> str:
        return self._commit.path

    def _write(self, item: Item, offset: int) -> Optional[int]:
        if self._seal is not None:
            self._seal.sealer.write(self._fd, [(len(self._book), le_bytes(item.array, item.swap), offset)],
                                    self._commit.data_tmp)
            return None
        crcs = lowlevel.write_items(self._fd, [item.array], [offset], [item.swap], self._book.end,
                                     offset + item.nbytes, crc=self.checksum, fsync=False, sparse=True,
                                     threads=self.threads, path=self._commit.data_tmp,
                                     writeback=self._commit.durable)
        return crcs[0] if crcs is not None else None

    def _reserve(self, shape, dt, nbytes: int, offset: int):
        if self._seal is not None:  # private memory, sealed at close: no plaintext in the data file
            return np.zeros(shape, dtype=dt.numpy), None
        lowlevel.preallocate(self._fd, offset + nbytes, self._commit.data_tmp)
        view, sync = lowlevel.map_writable(self._fd, offset, nbytes, self._commit.data_tmp)
        return np.frombuffer(view, dtype=dt.numpy).reshape(shape), sync

    def _finish(self, length: int, reserved) -> None:
        if self._seal is not None:
            self._seal.sealer.write(self._fd, [(idx, le_bytes(arr, 0), off) for idx, off, arr, _ in reserved if arr.size],
                                    self._commit.data_tmp)
            count = len(self._book)
            for i in range(count):  # tensors with no sealed bytes yet: empty reserved ones
                if i not in self._seal.sealer.tags:
                    self._seal.sealer.write(self._fd, [(i, np.empty(0, np.uint8), 0)], self._commit.data_tmp)
            length = self._seal.finish(self._fd, count, 0, length, self._commit.data_tmp)
            self._commit.finish_data()
            self._fd = None
            self._commit.commit(descriptor_text(self._seal.descriptor(self._book.entries, self._commit.data_name, 0,
                                                                      length, self.metadata), False))
            return
        if length:
            lowlevel.preallocate(self._fd, length, self._commit.data_tmp)
        self._commit.finish_data()
        self._fd = None
        self._commit.commit(self._descriptor_text(self._commit.data_name, length))

    def _discard(self) -> None:
        self._commit.abort()


class Tensors:
    """A placeholder for a TensorList inside a document given to :func:`save_document`.

    Args:
        tensors: a mapping name -> array or a sequence of arrays.
        metadata: the list's ``metadata`` (any JSON value).
    """

    __slots__ = ("tensors", "metadata")

    def __init__(self, tensors, metadata: Any = None):
        self.tensors = tensors
        self.metadata = metadata

    def __repr__(self) -> str:
        return f"Tensors({len(self.tensors)} tensors)"


def write_data(data_path, lists: Sequence, *, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
               lamp: bool = False, durable: bool = True, location: Optional[str] = None,
               threads: Optional[int] = None, key=None) -> List[Dict[str, Any]]:
    """Writes several tensor lists into one data file and returns their descriptors.

    For documents the caller owns (as lamp's StateIO does): embed each
    returned descriptor anywhere in a JSON document placed in the same
    directory as the data file. The data file is written atomically (temp
    file, fsync, rename); lists start at 4096-aligned offsets.

    Args:
        data_path: the data file to create (replaced atomically if it exists).
        lists: each a mapping, a sequence, or a :class:`Tensors` (with metadata).
        location: the ``location`` to record (default: the data file's name).
        key: encrypt every list (see :func:`save`); each gets its own salt.

    Returns:
        One TensorList descriptor (a JSON-ready dict) per list, in order.
    """
    alignment = MIN_TENSOR_ALIGNMENT if lamp else check_alignment(alignment)
    key = check_key_use(key, lamp)
    data_path = os.path.abspath(backends.localize(os.fspath(data_path)))
    prepared, metas = [], []
    for i, lst in enumerate(lists):
        meta = None
        if isinstance(lst, Tensors):
            lst, meta = lst.tensors, lst.metadata
        prepared.append(prepare(lst, f"{data_path}: list {i}")[0])
        metas.append(check_metadata(meta, lamp))
    with atomic_file(data_path, durable) as tmp:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            if key is not None:
                return _sealed_lists(fd, prepared, metas, alignment, threads, tmp, key,
                                     location if location is not None else os.path.basename(data_path))
            layout = _write_lists(fd, prepared, alignment, checksum, durable, threads, tmp, lamp)
        finally:
            os.close(fd)
    loc = location if location is not None else os.path.basename(data_path)
    return [
        descriptor(tensor_entries(items, offs, crcs, lamp), loc, start, length, meta, lamp)
        for items, meta, (start, offs, length, crcs) in zip(prepared, metas, layout)
    ]


def save_document(path, document: Any, *, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
                  durable: bool = True, threads: Optional[int] = None, key=None) -> Any:
    """Writes a JSON document in which :class:`Tensors` placeholders become TensorLists.

    All lists share one data file beside the document, at 4096-aligned
    offsets. The whole save is atomic, like :func:`save`. Read a list back
    with ``load(path, pointer=...)`` or everything with ``load_document``.
    With ``key`` every list is encrypted (see :func:`save`); the rest of the
    document stays plain JSON.

    Returns:
        The document as written (placeholders replaced by their descriptors).

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.json")
        >>> doc = tensorlist.save_document(path, {"epoch": 3,
        ...     "model": tensorlist.Tensors({"w": np.zeros(4)}),
        ...     "optimizer": tensorlist.Tensors([np.ones(4)])})
        >>> float(tensorlist.load(path, pointer="/optimizer")["0"].sum())
        4.0
    """
    check_alignment(alignment)
    key = check_key_use(key, False)
    if backends.is_remote(path):
        return backends.dispatch("save_document", path)(path, document, alignment=alignment, checksum=checksum,
                                                         durable=durable, threads=threads,
                                                         **({"key": key} if key is not None else {}))
    path = backends.localize(os.fspath(path))
    found = document_lists(document, path)
    commit = Commit(path, lamp=False, durable=durable)
    try:
        fd = commit.open_data()
        if key is not None:
            descs = _sealed_lists(fd, [items for _, items, _ in found], [m for _, _, m in found], alignment,
                                  threads, commit.data_tmp, key, commit.data_name)
            commit.finish_data()
            written, kept = document_with_descriptors(document, found, None, commit.data_name, descs)
            commit.commit(dumps(written) + "\n", keep=kept)
            return written
        placed = _write_lists(fd, [items for _, items, _ in found], alignment, checksum, durable, threads,
                              commit.data_tmp, False)
        commit.finish_data()
        written, kept = document_with_descriptors(document, found, placed, commit.data_name)
        commit.commit(dumps(written) + "\n", keep=kept)
    except BaseException:
        commit.abort()
        raise
    return written


def document_lists(document: Any, where) -> List[Tuple[str, List[Item], Any]]:
    """The :class:`Tensors` placeholders of a document to save: ``[(pointer, items, metadata)]``.

    Checks everything before any byte is written: the document is strict JSON
    that reads back (``_base.jsonio.check_json``, placeholders skipped), each list's
    tensors can be stored and its metadata is strict JSON at the depth it will
    sit. Shared by the local and the remote ``save_document``.

    Raises:
        ValueError: the document or a list's metadata is not strict JSON.
        TypeError: a tensor cannot be stored.
    """
    try:
        check_json(document, skip=(Tensors,))
    except FormatError as e:
        raise ValueError(f"{os.fspath(where)}: the document must be strict JSON: {e.reason}"
                         + (f" at {e.field}" if e.field not in (None, "/") else "")) from None
    # a list's metadata sits inside the list object, which sits at its pointer's depth
    return [(p, prepare(t.tensors, f"{where}: {p or '/'}")[0], check_metadata(t.metadata, False, depth=p.count("/") + 2))
            for p, t in walk(document) if isinstance(t, Tensors)]


def document_with_descriptors(document: Any, found, placed, data_name: str,
                              descriptors: Optional[List[Dict[str, Any]]] = None) -> Tuple[Any, List[str]]:
    """The document with each placeholder replaced by its descriptor, and the other lists' locations.

    Args:
        found: :func:`document_lists`' result.
        placed: ``[(list offset, tensor offsets, list length, crcs)]`` per list, as written.
        data_name: the data file's name (``location``).
        descriptors: the lists' descriptors, already made (encrypted lists); then ``placed`` is unused.

    Returns:
        (the document to write, the locations of lists the caller embedded as
        descriptors: their data files must be kept).
    """
    if descriptors is not None:
        descs = {p: d for (p, _, _), d in zip(found, descriptors)}
    else:
        descs = {
            p: descriptor(tensor_entries(items, offs, crcs, False), data_name, start, length, meta, False)
            for (p, items, meta), (start, offs, length, crcs) in zip(found, placed)
        }
    written = _replace(document, "", descs)
    kept = [resolve_pointer(written, p)["location"] for p in find_tensor_lists(written) if p not in descs]
    return written, kept


def _replace(node, ptr: str, descs: Dict[str, Dict]):
    if ptr in descs:
        return descs[ptr]
    if isinstance(node, dict):
        return {k: _replace(v, f"{ptr}/{escape_pointer(k)}", descs) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_replace(v, f"{ptr}/{i}", descs) for i, v in enumerate(node)]
    return node
