"""Writing: ``save``, the streaming :class:`Writer`, ``write_data`` and ``save_document``.

Tensors are prepared here (contiguous bytes, dtype row, byte-swap size; torch
tensors through ``_torch_bridge``, imported only when one is passed), laid out
(aligned offsets, padded lengths), written by the C core straight from the
caller's buffers, and committed through ``_commit``'s one atomic replacement
protocol. URLs go to the registered backend (``_backends``).

Imports ``format``, ``_commit``, ``_backends``, ``_jsonio``, ``_dtypes`` and
``_lowlevel``; never ``remote`` or torch.
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from json.encoder import encode_basestring as _encode_string

from . import _backends, _dtypes, _lowlevel
from ._commit import Commit, atomic_file
from ._jsonio import check_json, dumps, dumps_lamp, escape_pointer, resolve_pointer, walk
from .errors import FormatError
from .format import DEFAULT_ALIGNMENT, FORMAT_VERSION, LIST_ALIGNMENT, MAX_ALIGNMENT, MIN_TENSOR_ALIGNMENT, find_tensor_lists

__all__ = ["save", "Writer", "Tensors", "write_data", "save_document"]

_LITTLE_HOST = sys.byteorder == "little"


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def _check_alignment(alignment: int) -> int:
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < MIN_TENSOR_ALIGNMENT
            or alignment > MAX_ALIGNMENT or alignment & (alignment - 1)):
        raise ValueError(f"alignment must be a power of two in [{MIN_TENSOR_ALIGNMENT}, {MAX_ALIGNMENT}], "
                         f"got {alignment!r}")
    return alignment


def _as_array(value, where: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        arr = value
    elif type(value).__module__.startswith("torch"):
        from ._torch_bridge import to_numpy  # torch is imported only when torch tensors come in

        arr = to_numpy(value, where)
    else:
        try:
            arr = np.asarray(value)
        except Exception as e:  # e.g. a torch bfloat16 tensor: use tensorlist.torch
            raise TypeError(f"{where}: cannot convert {type(value).__name__} to a numpy array ({e})") from e
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        raise TypeError(f"{where}: dtype {arr.dtype} cannot be stored (no tensorlist dataType code)")
    return arr


_DTYPE_CACHE: Dict[np.dtype, Tuple[_dtypes.DType, int]] = {}
_MAX_ITEMSIZE = max(d.itemsize for d in _dtypes.DTYPES)
# Hashing a numpy dtype costs more than everything else done per tiny tensor;
# arrays of a builtin type share one dtype object, so look it up by identity
# first. Each entry holds its dtype, so an id in here is never reused.
_DTYPE_BY_ID: Dict[int, Tuple[np.dtype, Tuple[_dtypes.DType, int]]] = {}


def _dtype_info(dt: np.dtype) -> Tuple[_dtypes.DType, int]:
    """(table row, byte-swap element size or 0) for a numpy dtype, cached."""
    by_id = _DTYPE_BY_ID.get(id(dt))
    if by_id is not None and by_id[0] is dt:
        return by_id[1]
    hit = _DTYPE_CACHE.get(dt)
    if hit is None:
        row = _dtypes.from_numpy(dt)
        order = dt.byteorder
        little = order == "<" or order == "|" or (order == "=" and _LITTLE_HOST)
        size = dt.itemsize // (2 if dt.kind == "c" else 1)
        hit = _DTYPE_CACHE[dt] = (row, 0 if little or size == 1 else size)
    if len(_DTYPE_BY_ID) < 1024:
        _DTYPE_BY_ID[id(dt)] = (dt, hit)
    return hit


class _Item:
    """One tensor ready to write: contiguous bytes, dtype row, byte-swap size."""

    __slots__ = ("name", "array", "dtype", "swap", "shape", "nbytes")

    def __init__(self, name: Optional[str], value, where):
        arr = value if type(value) is np.ndarray else _as_array(value, where())
        try:
            self.dtype, self.swap = _dtype_info(arr.dtype)
        except TypeError as e:
            raise TypeError(f"{where()}: {e}") from None
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # the one copy: the format stores C order
        self.name = name
        self.shape = arr.shape
        self.nbytes = arr.nbytes
        self.array = arr


_GC_PAUSE_MIN = 10_000


class _GCPaused:
    """Pauses the cyclic garbage collector around the per-tensor loops of a long list.

    Preparing 100,000 tensors allocates a few hundred thousand small tracked
    objects, and such a burst triggers a full collection that walks every
    object of the caller's process: 0.2 s of a 0.7 s save of 100k tiny
    tensors in bench/bench_io.py, more in a large training process. These
    loops create no reference cycles (reference counting frees everything),
    so pausing loses nothing; msgpack advises the same for large unpacks.
    """

    __slots__ = ("on",)

    def __init__(self, n: int):
        self.on = n >= _GC_PAUSE_MIN and gc.isenabled()

    def __enter__(self) -> None:
        if self.on:
            gc.disable()

    def __exit__(self, *exc) -> None:
        if self.on:
            gc.enable()


def _known_len(obj) -> int:
    try:
        return len(obj)
    except TypeError:  # a generator: its code is the caller's, leave the collector alone
        return 0


def _items(tensors, where: str) -> Tuple[List[_Item], bool]:
    """Prepared items and whether they are named (mapping) or positional (sequence)."""
    # The common case inline (a C-contiguous ndarray of a dtype seen before):
    # what _Item.__init__ does, without its call and error-context closure.
    new, by_id, ndarray = _Item.__new__, _DTYPE_BY_ID, np.ndarray
    named = isinstance(tensors, Mapping)
    if named:
        pairs = tensors.items()
    elif isinstance(tensors, (str, bytes)) or not isinstance(tensors, Iterable):
        raise TypeError(f"{where}: tensors must be a mapping name -> array or a sequence of arrays, "
                        f"got {type(tensors).__name__}")
    else:
        pairs = ((None, v) for v in tensors)
    items = []
    append = items.append
    for i, (k, v) in enumerate(pairs):
        if named and type(k) is not str:
            raise TypeError(f"{where}: tensor names must be str, got {k!r}")
        if type(v) is ndarray:
            dt = v.dtype
            hit = by_id.get(id(dt))
            if hit is not None and hit[0] is dt and v.flags.c_contiguous:
                it = new(_Item)
                it.name, it.array, (it.dtype, it.swap), it.shape, it.nbytes = k, v, hit[1], v.shape, v.nbytes
                append(it)
                continue
        append(_Item(k, v, lambda k=k, i=i: f"{where}: tensor {k!r}" if named else f"{where}: tensor {i}"))
    if named:
        _check_names([it.name for it in items], where)
    return items, named


def _check_names(names: List[str], where: str) -> None:
    """Refuses names that cannot be written as UTF-8 (lone surrogates) before any byte is written."""
    try:
        "\x00".join(names).encode("utf-8")
    except UnicodeEncodeError:
        for n in names:
            try:
                n.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"{where}: tensor name {n!r} is not valid Unicode ({e.reason})") from None


def _layout(items: Sequence[_Item], start: int, alignment: int) -> Tuple[List[int], int]:
    """Offsets relative to ``start`` and the list's padded byteLength."""
    if alignment >= _MAX_ITEMSIZE and len(items) > 64:
        # every tensor then starts at the end of the previous one rounded up to
        # `alignment`: a prefix sum of the rounded sizes (the loop below, vectorized)
        padded = np.fromiter([it.nbytes for it in items], dtype=np.int64, count=len(items))
        padded += alignment - 1
        padded &= -alignment
        ends = np.cumsum(padded)
        offsets = (ends - padded).tolist()
        return offsets, int(ends[-1])
    offsets, cursor = [], 0
    append = offsets.append
    for it in items:
        # a tensor must also start at a multiple of its item size (complex128: 16)
        a = it.dtype.itemsize if it.dtype.itemsize > alignment else alignment
        off = -(-cursor // a) * a
        append(off)
        cursor = off + it.nbytes
    return offsets, _align(cursor, alignment)


def _tensor_entries(items, offsets, crcs, lamp: bool) -> List[Dict[str, Any]]:
    out = []
    for i, (it, off) in enumerate(zip(items, offsets)):
        e: Dict[str, Any] = {}
        if lamp:
            if it.shape:
                e["dims"] = list(it.shape)
        else:
            if it.name is not None:
                e["name"] = it.name
            e["dims"] = list(it.shape)
        e["dataType"] = it.dtype.code
        e["byteOffset"] = off
        e["byteLength"] = it.nbytes
        if crcs is not None and not lamp:
            e["crc32c"] = crcs[i]
        out.append(e)
    return out


def _descriptor(entries, location, offset, length, metadata, lamp: bool) -> Dict[str, Any]:
    d: Dict[str, Any] = {}
    if not lamp:
        d["formatVersion"] = FORMAT_VERSION
    if entries or not lamp:
        d["tensors"] = entries
    d["location"] = location
    d["byteOffset"] = offset
    d["byteLength"] = length
    if metadata is not None and not lamp:
        d["metadata"] = metadata
    return d


def _fast_descriptor_text(items, offsets, crcs, location: str, length: int, metadata) -> str:
    """The text ``_descriptor_text(_descriptor(...))`` gives in tensorlist mode, made directly.

    Saving a million tiny tensors should not build a million dicts: one
    f-string per tensor, with the dims text of each distinct shape made once.
    """
    enc = _encode_string
    dims_text: Dict[Tuple[int, ...], str] = {}
    lines = []
    append = lines.append
    for i, (it, off) in enumerate(zip(items, offsets)):
        shape = it.shape
        dims = dims_text.get(shape)
        if dims is None:
            dims = dims_text[shape] = ",".join(map(str, shape))
        if it.name is not None:
            if crcs is not None:
                append(f'{{"name":{enc(it.name)},"dims":[{dims}],"dataType":{it.dtype.code},"byteOffset":{off},'
                       f'"byteLength":{it.nbytes},"crc32c":{crcs[i]}}}')
            else:
                append(f'{{"name":{enc(it.name)},"dims":[{dims}],"dataType":{it.dtype.code},"byteOffset":{off},'
                       f'"byteLength":{it.nbytes}}}')
        elif crcs is not None:
            append(f'{{"dims":[{dims}],"dataType":{it.dtype.code},"byteOffset":{off},"byteLength":{it.nbytes},'
                   f'"crc32c":{crcs[i]}}}')
        else:
            append(f'{{"dims":[{dims}],"dataType":{it.dtype.code},"byteOffset":{off},"byteLength":{it.nbytes}}}')
    body = "\n" + ",\n".join(lines) if lines else ""
    meta = f',"metadata":{dumps(metadata)}' if metadata is not None else ""
    return (f'{{"formatVersion":{FORMAT_VERSION},"tensors":[{body}],"location":{enc(location)},'
            f'"byteOffset":0,"byteLength":{length}{meta}}}\n')


def _descriptor_text(desc: Dict[str, Any], lamp: bool) -> str:
    if lamp:
        return dumps_lamp(desc)
    # one tensor per line: pleasant to grep and diff
    tensors = desc.get("tensors") or []
    body = "\n" + ",\n".join(dumps(t) for t in tensors) if tensors else ""
    rest = dumps({k: v for k, v in desc.items() if k not in ("formatVersion", "tensors")})
    return f'{{"formatVersion":{desc["formatVersion"]},"tensors":[{body}],{rest[1:]}\n'


def _check_metadata(metadata, lamp: bool):
    if metadata is None:
        return None
    if lamp:
        raise ValueError("lamp=True writes exactly what lamp writes: metadata cannot be stored")
    try:
        check_json(metadata)
    except FormatError as e:
        raise ValueError(f"metadata must be strict JSON (str keys, no NaN/Infinity): {e.reason}"
                         + (f" at {e.field}" if e.field not in (None, "/") else "")) from None
    return metadata


def _write_lists(fd, lists, alignment, checksum, durable, threads, path, lamp):
    """Writes several prepared lists into one new file at 4096-aligned offsets.

    Returns:
        [(list_offset, tensor_offsets, list_length, crcs or None)] per list.
    """
    bufs, offs, swaps, layout = [], [], [], []
    start = 0
    for items in lists:
        start = _align(start, LIST_ALIGNMENT)
        rel, length = _layout(items, start, alignment)
        layout.append((start, rel, length))
        for it, o in zip(items, rel):
            bufs.append(it.array)
            offs.append(start + o)
            swaps.append(it.swap)
        start += length
    crcs = _lowlevel.write_items(fd, bufs, offs, swaps, 0, start, crc=checksum and not lamp,
                                 fsync=False, sparse=True, threads=threads, path=path, writeback=durable)
    out, k = [], 0
    for (s, rel, length), items in zip(layout, lists):
        out.append((s, rel, length, crcs[k:k + len(items)] if crcs is not None else None))
        k += len(items)
    return out


def save(path, tensors, *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
         lamp: bool = False, durable: bool = True, threads: Optional[int] = None) -> None:
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
        threads: writer threads (default: usable cores, at most 8).

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
    if _backends.is_remote(path):  # served by the registered URL backend (tensorlist.remote)
        return _backends.dispatch("save", path)(path, tensors, metadata=metadata, alignment=alignment,
                                                checksum=checksum, lamp=lamp, durable=durable, threads=threads)
    path = _backends.localize(os.fspath(path))
    if lamp:
        alignment = MIN_TENSOR_ALIGNMENT
    _check_alignment(alignment)
    metadata = _check_metadata(metadata, lamp)
    with _GCPaused(_known_len(tensors)):
        items, named = _items(tensors, os.fspath(path))
    if lamp and named:
        # lamp lists are positional: the mapping's order is kept, its keys are not stored
        pass
    commit = Commit(path, lamp=lamp, durable=durable)
    try:
        fd = commit.open_data()
        [(_, offsets, length, crcs)] = _write_lists(fd, [items], alignment, checksum, durable, threads,
                                                    commit.data_tmp, lamp)
        commit.finish_data()
        with _GCPaused(len(items)):
            if lamp:
                text = _descriptor_text(_descriptor(_tensor_entries(items, offsets, crcs, True), commit.data_name,
                                                    0, length, None, True), True)
            else:
                text = _fast_descriptor_text(items, offsets, crcs, commit.data_name, length, metadata)
        commit.commit(text)
    except BaseException:
        commit.abort()
        raise


class Writer:
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
        >>> tensorlist.load(path)["b"].sum()
        np.float32(28.0)
    """

    def __new__(cls, path=None, *args, **kwargs):
        if _backends.is_remote(path):  # served by the registered URL backend (tensorlist.remote)
            return _backends.dispatch("writer", path)(path, *args, **kwargs)
        return super().__new__(cls)

    def __init__(self, path, *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT,
                 checksum: bool = True, lamp: bool = False, durable: bool = True,
                 threads: Optional[int] = None):
        self.alignment = MIN_TENSOR_ALIGNMENT if lamp else _check_alignment(alignment)
        self.metadata = _check_metadata(metadata, lamp)
        self.checksum = checksum and not lamp
        self.lamp = lamp
        self.threads = threads
        self._commit = Commit(_backends.localize(os.fspath(path)), lamp=lamp, durable=durable)
        self._fd = self._commit.open_data()
        self._entries: List[Dict[str, Any]] = []
        self._names: set = set()
        self._named: Optional[bool] = None
        self._end = 0
        self._reserved: List[Tuple[int, np.ndarray, Any]] = []  # (entry index, array, sync)
        self._state = "open"

    @property
    def path(self) -> str:
        return self._commit.path

    def __len__(self) -> int:
        return len(self._entries)

    def _check_open(self):
        if self._state != "open":
            raise ValueError(f"Writer for {self.path} is {self._state}")

    def _entry(self, name: Optional[str], item_shape, dtype: _dtypes.DType, nbytes: int) -> Tuple[int, Dict]:
        named = name is not None
        if self._named is None:
            self._named = named
        elif self._named != named:
            raise TypeError("a list is either all named or all positional: "
                            + ("pass a name" if self._named else "do not pass names"))
        if named:
            if not isinstance(name, str):
                raise TypeError(f"tensor names must be str, got {name!r}")
            if name in self._names:
                raise ValueError(f"duplicate tensor name {name!r}")
            _check_names([name], self.path)
            self._names.add(name)
        offset = _align(self._end, max(self.alignment, dtype.itemsize))
        e: Dict[str, Any] = {}
        if named and not self.lamp:
            e["name"] = name
        if item_shape or not self.lamp:
            e["dims"] = list(item_shape)
        e["dataType"] = dtype.code
        e["byteOffset"] = offset
        e["byteLength"] = nbytes
        return offset, e

    def add(self, name_or_value, value=None) -> None:
        """Appends a tensor: ``add(name, array)``, or ``add(array)`` in a positional list."""
        self._check_open()
        name, value = (name_or_value, value) if value is not None else (None, name_or_value)
        item = _Item(name, value, lambda: f"{self.path}: tensor {name if name is not None else len(self._entries)!r}")
        offset, e = self._entry(name, item.shape, item.dtype, item.nbytes)
        try:
            crcs = _lowlevel.write_items(self._fd, [item.array], [offset], [item.swap], self._end,
                                         offset + item.nbytes, crc=self.checksum, fsync=False, sparse=True,
                                         threads=self.threads, path=self._commit.data_tmp,
                                         writeback=self._commit.durable)
        except BaseException:
            self.abort()
            raise
        if crcs is not None:
            e["crc32c"] = crcs[0]
        self._entries.append(e)
        self._end = offset + item.nbytes

    def reserve(self, name_or_shape, shape=None, dtype=None) -> np.ndarray:
        """Reserves a tensor and returns a writable array mapped into the data file.

        ``reserve(name, shape, dtype)``, or ``reserve(shape, dtype)`` in a
        positional list. The bytes start as zeros.
        """
        self._check_open()
        if dtype is None:
            name, shape, dtype = None, name_or_shape, shape
        else:
            name = name_or_shape
        shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
        if any(d < 0 for d in shape):
            raise ValueError(f"negative dimension in {shape}")
        dt = _dtypes.from_numpy(dtype)
        nbytes = int(np.prod(shape, dtype=object)) * dt.itemsize
        offset, e = self._entry(name, shape, dt, nbytes)
        if nbytes == 0:
            arr = np.empty(shape, dtype=dt.numpy)
            sync = None
        else:
            _lowlevel.preallocate(self._fd, offset + nbytes, self._commit.data_tmp)
            view, sync = _lowlevel.map_writable(self._fd, offset, nbytes, self._commit.data_tmp)
            arr = np.frombuffer(view, dtype=dt.numpy).reshape(shape)
        self._reserved.append((len(self._entries), arr, sync))
        self._entries.append(e)
        self._end = offset + nbytes
        return arr

    def close(self) -> None:
        """Commits the list (idempotent)."""
        if self._state == "committed":
            return
        self._check_open()
        try:
            length = _align(self._end, self.alignment)
            for idx, arr, sync in self._reserved:
                if sync is not None:
                    sync()
                if self.checksum:
                    self._entries[idx]["crc32c"] = _lowlevel.crc32c(arr.reshape(-1).view(np.uint8)) if arr.size else 0
            _lowlevel.preallocate(self._fd, length, self._commit.data_tmp) if length else None
            self._commit.finish_data()
            self._fd = None
            desc = _descriptor(self._entries, self._commit.data_name, 0, length, self.metadata, self.lamp)
            self._commit.commit(_descriptor_text(desc, self.lamp))
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        self._reserved = []

    commit = close

    def abort(self) -> None:
        """Discards everything written; the previous file at ``path`` stays as it was."""
        if self._state == "open":
            self._commit.abort()
            self._state = "aborted"
            self._reserved = []

    def __enter__(self) -> "Writer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        if getattr(self, "_state", None) == "open":
            self.abort()


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
               threads: Optional[int] = None) -> List[Dict[str, Any]]:
    """Writes several tensor lists into one data file and returns their descriptors.

    For documents the caller owns (as lamp's StateIO does): embed each
    returned descriptor anywhere in a JSON document placed in the same
    directory as the data file. The data file is written atomically (temp
    file, fsync, rename); lists start at 4096-aligned offsets.

    Args:
        data_path: the data file to create (replaced atomically if it exists).
        lists: each a mapping, a sequence, or a :class:`Tensors` (with metadata).
        location: the ``location`` to record (default: the data file's name).

    Returns:
        One TensorList descriptor (a JSON-ready dict) per list, in order.
    """
    alignment = MIN_TENSOR_ALIGNMENT if lamp else _check_alignment(alignment)
    data_path = os.path.abspath(_backends.localize(os.fspath(data_path)))
    prepared, metas = [], []
    for i, lst in enumerate(lists):
        meta = None
        if isinstance(lst, Tensors):
            lst, meta = lst.tensors, lst.metadata
        prepared.append(_items(lst, f"{data_path}: list {i}")[0])
        metas.append(_check_metadata(meta, lamp))
    with atomic_file(data_path, durable) as tmp:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        try:
            layout = _write_lists(fd, prepared, alignment, checksum, durable, threads, tmp, lamp)
        finally:
            os.close(fd)
    loc = location if location is not None else os.path.basename(data_path)
    return [
        _descriptor(_tensor_entries(items, offs, crcs, lamp), loc, start, length, meta, lamp)
        for items, meta, (start, offs, length, crcs) in zip(prepared, metas, layout)
    ]


def save_document(path, document: Any, *, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
                  durable: bool = True, threads: Optional[int] = None) -> Any:
    """Writes a JSON document in which :class:`Tensors` placeholders become TensorLists.

    All lists share one data file beside the document, at 4096-aligned
    offsets. The whole save is atomic, like :func:`save`. Read a list back
    with ``load(path, pointer=...)`` or everything with ``load_document``.

    Returns:
        The document as written (placeholders replaced by their descriptors).

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt.json")
        >>> doc = tensorlist.save_document(path, {"epoch": 3,
        ...     "model": tensorlist.Tensors({"w": np.zeros(4)}),
        ...     "optimizer": tensorlist.Tensors([np.ones(4)])})
        >>> tensorlist.load(path, pointer="/optimizer")["0"].sum()
        np.float64(4.0)
    """
    _check_alignment(alignment)
    if _backends.is_remote(path):
        return _backends.dispatch("save_document", path)(path, document, alignment=alignment, checksum=checksum,
                                                         durable=durable, threads=threads)
    path = _backends.localize(os.fspath(path))
    try:
        check_json(document, skip=(Tensors,))  # before the old file is touched
    except FormatError as e:
        raise ValueError(f"{os.fspath(path)}: the document must be strict JSON: {e.reason}"
                         + (f" at {e.field}" if e.field not in (None, "/") else "")) from None
    found: List[Tuple[str, Tensors]] = [(p, v) for p, v in walk(document) if isinstance(v, Tensors)]
    prepared = [(_items(t.tensors, f"{path}: {p or '/'}")[0], _check_metadata(t.metadata, False))
                for p, t in found]
    commit = Commit(path, lamp=False, durable=durable)
    try:
        fd = commit.open_data()
        layout = _write_lists(fd, [p[0] for p in prepared], alignment, checksum, durable, threads,
                              commit.data_tmp, False)
        commit.finish_data()
        descs = {
            p: _descriptor(_tensor_entries(items, offs, crcs, False), commit.data_name, start, length, meta, False)
            for (p, _), (items, meta), (start, offs, length, crcs) in zip(found, prepared, layout)
        }
        written = _replace(document, "", descs)
        # lists the caller embedded as descriptors (kept from an earlier save) keep their data file
        kept = [resolve_pointer(written, p)["location"] for p in find_tensor_lists(written) if p not in descs]
        commit.commit(dumps(written) + "\n", keep=kept)
    except BaseException:
        commit.abort()
        raise
    return written


def _replace(node, ptr: str, descs: Dict[str, Dict]):
    if ptr in descs:
        return descs[ptr]
    if isinstance(node, dict):
        return {k: _replace(v, f"{ptr}/{escape_pointer(k)}", descs) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_replace(v, f"{ptr}/{i}", descs) for i, v in enumerate(node)]
    return node
