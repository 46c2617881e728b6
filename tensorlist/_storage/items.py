"""Preparing tensors for writing: items, layout and descriptor text (shared by every writer).

An :class:`Item` is one tensor ready for the C core: C-contiguous bytes, its
dtype row and the element size to byte-swap (0 for little-endian input). A
torch tensor is converted through ``_bridges.torch``, imported only when one is
passed. :func:`layout` places items at aligned offsets; :func:`descriptor_text`
and :func:`fast_descriptor_text` make the descriptor JSON. ``writer`` (local
files) and ``remote`` (streamed uploads) both write through these, so the two
lay out and describe tensors identically.

Imports ``dtypes``, ``_base.lowlevel`` (CRC32C), ``_base.jsonio``, ``errors`` and ``format`` (constants) only.
"""
from __future__ import annotations

import gc
import sys
from json.encoder import encode_basestring as _encode_string
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

import numpy as np

from tensorlist._base import dtypes
from tensorlist._base.lowlevel import crc32c
from tensorlist._base.jsonio import check_json, dumps, dumps_lamp
from tensorlist.errors import FormatError
from tensorlist.format import FORMAT_VERSION, MAX_ALIGNMENT, MIN_TENSOR_ALIGNMENT

__all__ = ["Item", "prepare", "layout", "align", "check_alignment", "check_metadata", "check_names",
           "tensor_entries", "descriptor", "descriptor_text", "fast_descriptor_text", "GCPaused", "known_len",
           "as_array", "dtype_info", "GC_PAUSE_MIN", "EntryBook", "reserved_shape", "lamp_offset",
           "check_lamp_layout", "inside_offsets"]


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def check_alignment(alignment: int) -> int:
    if (not isinstance(alignment, int) or isinstance(alignment, bool) or alignment < MIN_TENSOR_ALIGNMENT
            or alignment > MAX_ALIGNMENT or alignment & (alignment - 1)):
        raise ValueError(f"alignment must be a power of two in [{MIN_TENSOR_ALIGNMENT}, {MAX_ALIGNMENT}], "
                         f"got {alignment!r}")
    return alignment


def _is_torch_tensor(value) -> bool:
    """A torch tensor, subclasses defined anywhere included, without importing torch to ask."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def as_array(value, where: str) -> np.ndarray:
    if isinstance(value, np.ndarray):
        arr = value
    elif _is_torch_tensor(value):
        from tensorlist._bridges.torch import to_numpy  # torch is imported only when torch tensors come in

        arr = to_numpy(value, where, bits=True)
    else:
        try:
            arr = np.asarray(value)
        except Exception as e:  # e.g. a torch bfloat16 tensor: use tensorlist.torch
            raise TypeError(f"{where}: cannot convert {type(value).__name__} to a numpy array ({e})") from e
    if arr.dtype.hasobject or arr.dtype.fields is not None:
        what = "" if isinstance(value, np.ndarray) else f"a {type(value).__name__} is not an array: "
        raise TypeError(f"{where}: {what}dtype {arr.dtype} cannot be stored (no tensorlist dataType code)")
    return arr


_DTYPE_CACHE: Dict[np.dtype, Tuple[dtypes.DType, int]] = {}
_MAX_ITEMSIZE = max(d.itemsize for d in dtypes.DTYPES)
# Hashing a numpy dtype costs more than everything else done per tiny tensor;
# arrays of a builtin type share one dtype object, so look it up by identity
# first. Each entry holds its dtype, so an id in here is never reused.
_DTYPE_BY_ID: Dict[int, Tuple[np.dtype, Tuple[dtypes.DType, int]]] = {}


def dtype_info(dt: np.dtype) -> Tuple[dtypes.DType, int]:
    """(table row, byte-swap element size or 0) for a numpy dtype, cached."""
    by_id = _DTYPE_BY_ID.get(id(dt))
    if by_id is not None and by_id[0] is dt:
        return by_id[1]
    # a bit carrier (``dtypes.bits_row``) equals its plain unsigned dtype: never keyed by value
    hit = _DTYPE_CACHE.get(dt) if dt.metadata is None else None
    if hit is None:
        row = dtypes.from_numpy(dt)
        size = dt.itemsize // (2 if dt.kind == "c" else 1)
        hit = (row, 0 if dtypes.is_little(dt) or size == 1 else size)
        if dt.metadata is None:
            _DTYPE_CACHE[dt] = hit
    if len(_DTYPE_BY_ID) < 1024:
        _DTYPE_BY_ID[id(dt)] = (dt, hit)
    return hit


class Item:
    """One tensor ready to write: contiguous bytes, dtype row, byte-swap size."""

    __slots__ = ("name", "array", "dtype", "swap", "shape", "nbytes")

    def __init__(self, name: Optional[str], value, where):
        arr = value if type(value) is np.ndarray else as_array(value, where())
        try:
            self.dtype, self.swap = dtype_info(arr.dtype)
        except TypeError as e:
            raise TypeError(f"{where()}: {e}") from None
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # the one copy: the format stores C order
        self.name = name
        self.shape = arr.shape
        self.nbytes = arr.nbytes
        self.array = arr


GC_PAUSE_MIN = 10_000


class GCPaused:
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
        self.on = n >= GC_PAUSE_MIN and gc.isenabled()

    def __enter__(self) -> None:
        if self.on:
            gc.disable()

    def __exit__(self, *exc) -> None:
        if self.on:
            gc.enable()


def known_len(obj) -> int:
    try:
        return len(obj)
    except TypeError:  # a generator: its code is the caller's, leave the collector alone
        return 0


def prepare(tensors, where: str) -> Tuple[List[Item], bool]:
    """Prepared items and whether they are named (mapping) or positional (sequence)."""
    # The common case inline (a C-contiguous ndarray of a dtype seen before):
    # what Item.__init__ does, without its call and error-context closure.
    new, by_id, ndarray = Item.__new__, _DTYPE_BY_ID, np.ndarray
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
                it = new(Item)
                it.name, it.array, (it.dtype, it.swap), it.shape, it.nbytes = k, v, hit[1], v.shape, v.nbytes
                append(it)
                continue
        append(Item(k, v, lambda k=k, i=i: f"{where}: tensor {k!r}" if named else f"{where}: tensor {i}"))
    if named:
        check_names([it.name for it in items], where)
    return items, named


def check_names(names: List[str], where: str) -> None:
    """Refuses names that cannot be written as UTF-8 (lone surrogates) before any byte is written."""
    try:
        "\x00".join(names).encode("utf-8")
    except UnicodeEncodeError:
        for n in names:
            try:
                n.encode("utf-8")
            except UnicodeEncodeError as e:
                raise ValueError(f"{where}: tensor name {n!r} is not valid Unicode ({e.reason})") from None


def lamp_offset(cursor: int, dtype: dtypes.DType, index: int) -> int:
    """Where lamp's Writer puts the next tensor (``cursor`` rounded up to 8), or a ValueError.

    lamp pads each tensor to 8 bytes and nothing more, so a complex128 (16-byte
    items) after an odd number of 8-byte blocks would start at a multiple of 8
    only: lamp's own Reader ("tensorOffset % itemsize") and tensorlist (rule 9)
    both refuse such a file, so lamp mode refuses to write it.
    """
    off = align(cursor, MIN_TENSOR_ALIGNMENT)
    if off % dtype.itemsize:
        raise ValueError(f"lamp=True: tensor {index} ({dtype.name}) would start at byte {off}, where lamp's Writer "
                         f"puts it (8-byte padding), which is not a multiple of its item size {dtype.itemsize}: "
                         "neither lamp's Reader nor tensorlist reads such a file. Put it where the padded sizes "
                         f"before it add up to a multiple of {dtype.itemsize}, or save without lamp=True")
    return off


def check_lamp_layout(items: Sequence[Item]) -> None:
    """Refuses (ValueError) a list lamp's Writer would lay out with a tensor off its item size (see ``lamp_offset``)."""
    cursor = 0
    for i, it in enumerate(items):
        if it.dtype.itemsize > MIN_TENSOR_ALIGNMENT or cursor % MIN_TENSOR_ALIGNMENT:
            cursor = lamp_offset(cursor, it.dtype, i)
        cursor += it.nbytes


def inside_offsets(entries: List[Dict[str, Any]], length: int) -> List[Dict[str, Any]]:
    """The entries with each trailing empty tensor moved from the list's end to offset 0 (tensorlist mode).

    An empty tensor after the last bytes would sit at exactly ``byteLength``;
    lamp's Reader refuses any tensor offset >= the list's byteLength when that
    is not 0 ("Out of bounds."), so such a file could not be read by lamp.
    Offset 0 is inside the list, aligned for every dtype, and an empty tensor
    overlaps nothing (FORMAT.md 5.1). lamp mode keeps lamp's own offsets.
    """
    if length:
        for e in reversed(entries):
            if e["byteLength"] or e["byteOffset"] < length:
                break
            e["byteOffset"] = 0
    return entries


def layout(items: Sequence[Item], start: int, alignment: int, lamp: bool = False) -> Tuple[List[int], int]:
    """Offsets relative to ``start`` and the list's padded byteLength.

    ``lamp``: the list is written in lamp mode, whose layout cannot hold a
    tensor lamp's Writer would put off its item size (ValueError, before any
    byte is written; see :func:`lamp_offset`).
    """
    if lamp:
        check_lamp_layout(items)
    if alignment >= _MAX_ITEMSIZE and len(items) > 64:
        # every tensor then starts at the end of the previous one rounded up to
        # `alignment`: a prefix sum of the rounded sizes (the loop below, vectorized)
        padded = np.fromiter([it.nbytes for it in items], dtype=np.int64, count=len(items))
        padded += alignment - 1
        padded &= -alignment
        ends = np.cumsum(padded)
        offsets = (ends - padded).tolist()
        return offsets, int(ends[-1])
    offsets, cursor, end = [], 0, 0
    append = offsets.append
    for it in items:
        # a tensor must also start at a multiple of its item size (complex128: 16)
        a = it.dtype.itemsize if it.dtype.itemsize > alignment else alignment
        off = -(-cursor // a) * a
        append(off)
        cursor = off + it.nbytes
        if it.nbytes:
            end = cursor
    # the list ends with its last bytes: an empty tensor's rounded offset adds no padding
    # (trailing ones are recorded at offset 0, inside_offsets)
    return offsets, align(end, alignment)


def tensor_entries(items, offsets, crcs, lamp: bool) -> List[Dict[str, Any]]:
    if lamp:  # whoever laid the items out without lamp=True: still nothing lamp would misplace is described
        check_lamp_layout(items)
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


def descriptor(entries, location, offset, length, metadata, lamp: bool) -> Dict[str, Any]:
    d: Dict[str, Any] = {}
    if not lamp:
        d["formatVersion"] = FORMAT_VERSION
        inside_offsets(entries, length)
    if entries or not lamp:
        d["tensors"] = entries
    d["location"] = location
    d["byteOffset"] = offset
    d["byteLength"] = length
    if metadata is not None and not lamp:
        d["metadata"] = metadata
    return d


def fast_descriptor_text(items, offsets, crcs, location: str, length: int, metadata) -> str:
    """The text ``descriptor_text(descriptor(...))`` gives in tensorlist mode, made directly.

    Saving a million tiny tensors should not build a million dicts: one
    f-string per tensor, with the dims text of each distinct shape made once.
    """
    enc = _encode_string
    if length and items and not items[-1].nbytes and offsets[-1] >= length:
        offsets = list(offsets)  # trailing empty tensors inside the list, as inside_offsets() does
        for i in range(len(items) - 1, -1, -1):
            if items[i].nbytes or offsets[i] < length:
                break
            offsets[i] = 0
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


def descriptor_text(desc: Dict[str, Any], lamp: bool) -> str:
    if lamp:
        return dumps_lamp(desc)
    # one tensor per line: pleasant to grep and diff
    tensors = desc.get("tensors") or []
    body = "\n" + ",\n".join(dumps(t) for t in tensors) if tensors else ""
    rest = dumps({k: v for k, v in desc.items() if k not in ("formatVersion", "tensors")})
    return f'{{"formatVersion":{desc["formatVersion"]},"tensors":[{body}],{rest[1:]}\n'


def check_metadata(metadata, lamp: bool, depth: int = 2):
    """``metadata`` if strict JSON that reads back where it goes.

    ``depth``: the nesting level the value sits at in the written document (2
    in a descriptor file: inside the list object), counted against MAX_DEPTH.
    """
    if metadata is None:
        return None
    if lamp:
        raise ValueError("lamp=True writes exactly what lamp writes: metadata cannot be stored")
    try:
        check_json(metadata, depth=depth)
    except FormatError as e:
        raise ValueError(f"metadata must be strict JSON (str keys, no NaN/Infinity): {e.reason}"
                         + (f" at {e.field}" if e.field not in (None, "/") else "")) from None
    return metadata




class EntryBook:
    """The tensor entries of a list written one tensor at a time (``Writer``, local or remote).

    One place for the streaming writers' rules: a list is all named or all
    positional, names are str, unique and UTF-8, each tensor starts at the
    next multiple of the alignment (and of its item size), lamp entries have
    lamp's keys.
    """

    def __init__(self, alignment: int, lamp: bool, where: str):
        self.alignment = alignment
        self.lamp = lamp
        self.where = where
        self.entries: List[Dict[str, Any]] = []
        self.names: set = set()
        self.named: Optional[bool] = None
        self.end = 0
        self.data_end = 0  # end of the last tensor with bytes

    def __len__(self) -> int:
        return len(self.entries)

    def next(self, name: Optional[str], shape, dtype: dtypes.DType, nbytes: int) -> Tuple[int, Dict[str, Any]]:
        """(offset, entry) for the next tensor; the entry is added with :meth:`append`."""
        named = name is not None
        if self.named is None:
            self.named = named
        elif self.named != named:
            raise TypeError("a list is either all named or all positional: "
                            + ("pass a name" if self.named else "do not pass names"))
        if named:
            if not isinstance(name, str):
                raise TypeError(f"tensor names must be str, got {name!r}")
            if name in self.names:
                raise ValueError(f"duplicate tensor name {name!r}")
            check_names([name], self.where)
        if self.lamp:
            offset = lamp_offset(self.end, dtype, len(self.entries))
        else:
            offset = align(self.end, max(self.alignment, dtype.itemsize))
        e: Dict[str, Any] = {}
        if named and not self.lamp:
            e["name"] = name
        if shape or not self.lamp:
            e["dims"] = list(shape)
        e["dataType"] = dtype.code
        e["byteOffset"] = offset
        e["byteLength"] = nbytes
        return offset, e

    def append(self, entry: Dict[str, Any], name: Optional[str] = None) -> None:
        if name is not None:
            self.names.add(name)
        self.entries.append(entry)
        self.end = entry["byteOffset"] + entry["byteLength"]
        if entry["byteLength"]:
            self.data_end = self.end

    def length(self) -> int:
        """The list's padded byteLength."""
        return align(self.data_end, self.alignment)  # an empty tensor's rounded offset adds no padding


def reserved_shape(shape, dtype) -> Tuple[Tuple[int, ...], dtypes.DType, int]:
    """(shape, dtype row, nbytes) of a ``reserve`` call, checked."""
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(d) for d in shape)
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in {shape}")
    dt = dtypes.from_numpy(dtype)
    return shape, dt, int(np.prod(shape, dtype=object)) * dt.itemsize


class WriterBase:
    """The ``Writer`` protocol, once for the local and the remote writer.

    Arguments, the entries (:class:`EntryBook`), ``add``/``reserve``/``close``/
    ``abort``, the reserved tensors' checksums at close, and the context
    manager live here; a subclass says where bytes go:

    - ``_write(item, offset)``: store one prepared tensor, return its CRC32C
      (or None without checksums);
    - ``_reserve(shape, dtype_row, nbytes, offset)``: a writable zeroed array
      for a reserved tensor, and a ``sync`` callable (or None) run at close
      before its checksum is taken;
    - ``_finish(length, reserved)``: write what is left and commit the
      descriptor (``self._descriptor_text(location, length)``);
    - ``_discard()``: abandon everything; the previous file stays.
    """

    path: str

    def _setup(self, where: str, metadata: Any, alignment: int, checksum: bool, lamp: bool) -> None:
        self.alignment = MIN_TENSOR_ALIGNMENT if lamp else check_alignment(alignment)
        self.metadata = check_metadata(metadata, lamp)
        self.checksum = checksum and not lamp
        self.lamp = lamp
        self._book = EntryBook(self.alignment, lamp, where)
        self._reserved: List[Tuple[int, int, np.ndarray, Any]] = []  # (entry index, offset, array, sync)
        self._state = "open"

    def __len__(self) -> int:
        return len(self._book)

    def _check_open(self) -> None:
        if self._state != "open":
            raise ValueError(f"Writer for {self.path} is {self._state}")

    def add(self, name_or_value, value=None) -> None:
        """Appends a tensor: ``add(name, array)``, or ``add(array)`` in a positional list."""
        self._check_open()
        name, value = (name_or_value, value) if value is not None else (None, name_or_value)
        item = Item(name, value, lambda: f"{self.path}: tensor {name if name is not None else len(self._book)!r}")
        offset, e = self._book.next(name, item.shape, item.dtype, item.nbytes)
        try:
            # an empty tensor writes nothing (its rounded offset may lie past the list's end)
            crc = self._write(item, offset) if item.nbytes else (0 if self.checksum else None)
        except BaseException:
            self.abort()
            raise
        if crc is not None:
            e["crc32c"] = crc
        self._book.append(e, name)

    def reserve(self, name_or_shape, shape=None, dtype=None) -> np.ndarray:
        """Reserves a tensor and returns a writable array to fill before ``close``.

        ``reserve(name, shape, dtype)``, or ``reserve(shape, dtype)`` in a
        positional list. The bytes start as zeros.
        """
        self._check_open()
        if dtype is None:
            name, shape, dtype = None, name_or_shape, shape
        else:
            name = name_or_shape
        shape, dt, nbytes = reserved_shape(shape, dtype)
        offset, e = self._book.next(name, shape, dt, nbytes)
        if nbytes == 0:
            arr, sync = np.empty(shape, dtype=dt.numpy), None
        else:
            arr, sync = self._reserve(shape, dt, nbytes, offset)
        self._reserved.append((len(self._book), offset, arr, sync))
        self._book.append(e, name)
        return arr

    def close(self) -> None:
        """Commits the list (idempotent)."""
        if self._state == "committed":
            return
        self._check_open()
        try:
            for idx, _, arr, sync in self._reserved:
                if sync is not None:
                    sync()
                if self.checksum:
                    self._book.entries[idx]["crc32c"] = crc32c(arr.reshape(-1).view(np.uint8)) if arr.size else 0
            self._finish(self._book.length(), self._reserved)
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        self._reserved = []

    commit = close

    def abort(self) -> None:
        """Discards everything written; the previous file at ``path`` stays as it was."""
        if getattr(self, "_state", None) == "open":
            self._state = "aborted"
            self._reserved = []
            self._discard()

    def _descriptor_text(self, location: str, length: int) -> str:
        return descriptor_text(descriptor(self._book.entries, location, 0, length, self.metadata, self.lamp),
                               self.lamp)

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()

    def __del__(self):
        if getattr(self, "_state", None) == "open":
            self.abort()
