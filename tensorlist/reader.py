"""Reading: the lazy :class:`Reader`, ``load`` and ``load_document``.

A Reader parses and validates the descriptor, opens the data file and checks
its size, and maps it read-only; no page of tensor data is touched until a
tensor is used. The open file (or mapping) pins the data the descriptor
described, so a concurrent ``save`` that replaces the file does not change
what an open Reader returns.
"""
from __future__ import annotations

import copy
import errno
import os
import stat
import warnings
from typing import Any, Dict, Iterator, List, Optional, Union

import numpy as np

from . import _lowlevel
from ._jsonio import resolve_pointer
from .errors import ChecksumError, FormatError
from .format import (
    Limits,
    ListDescriptor,
    TensorInfo,
    check_data_path,
    check_data_size,
    find_tensor_lists,
    parse_list,
    read_json_file,
)

__all__ = ["Reader", "open", "load", "load_document"]

_LIST_KEYS = ("tensors", "location", "byteOffset", "byteLength")


def _select_list(doc: Any, pointer: Optional[str], file: Optional[str]):
    """(object, pointer) of the TensorList to read from a parsed document."""
    if pointer is not None:
        return resolve_pointer(doc, pointer, file=file), pointer
    if isinstance(doc, dict) and any(k in doc for k in _LIST_KEYS):
        return doc, ""
    found = find_tensor_lists(doc)
    if found:
        shown = ", ".join(repr(p) for p in found[:10]) + (" ..." if len(found) > 10 else "")
        raise FormatError(
            f"is not a TensorList descriptor but a document embedding {len(found)} of them at "
            f"{shown}: pass pointer= to choose one", file=file)
    raise FormatError("is not a TensorList descriptor and embeds none", file=file)


def _base_dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


class _Data:
    """The open data file of one list: a read-only mapping or an fd for pread."""

    def __init__(self, desc: ListDescriptor, use_mmap: bool, allow_outside: bool = False):
        self.desc = desc
        self.path = desc.data_path
        self.view: Optional[memoryview] = None
        self.base: Optional[np.ndarray] = None  # uint8 array over the whole mapping
        self.fd: Optional[int] = None
        self.use_mmap = use_mmap
        if desc.byte_length == 0:
            return  # nothing to read: lamp does not touch the file either
        check_data_path(desc, allow_outside)
        flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
        try:
            fd = os.open(self.path, flags)  # FileNotFoundError is handled by the caller
        except OSError as e:
            if e.errno not in (errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP):
                raise
            # the location names no file: a path through a file, too long, or a symlink loop
            raise FormatError(f"data file {self.path!r} cannot be opened: {e.strerror}", file=desc.file,
                              field=f"{desc.pointer}/location" if desc.pointer else "location") from e
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise FormatError(f"data file {self.path!r} is not a regular file", file=desc.file,
                                  field=f"{desc.pointer}/location" if desc.pointer else "location")
            check_data_size(desc, st.st_size, self.path)
            if use_mmap:
                self.view = _lowlevel.map_readonly(fd, st.st_size, self.path)
            else:
                self.fd, fd = fd, None
        finally:
            if fd is not None:
                os.close(fd)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.view = self.base = None  # arrays already handed out keep the mapping alive

    def array(self, info: TensorInfo) -> np.ndarray:
        return self.array_at(info.index)

    def array_at(self, i: int) -> np.ndarray:
        """Tensor ``i``: a view of the mapping, or (mmap=False) a fresh read."""
        table = self.desc.tensors
        dt = table.dtypes[i].numpy
        shape = table.shapes[i]
        length = table.lengths[i]
        if length == 0:
            a = np.empty(shape, dtype=dt)
            a.flags.writeable = not self.use_mmap
            return a
        start = self.desc.byte_offset + table.offsets[i]
        if self.view is not None:
            if self.base is None:
                self.base = np.frombuffer(self.view, np.uint8)
            return np.ndarray(shape, dt, self.base, start)
        if self.fd is None:
            raise ValueError("I/O operation on a closed Reader")
        out = _lowlevel.alloc(length)
        try:
            _lowlevel.pread_into(self.fd, out, start, path=self.path)
        except EOFError as e:
            t = table[i]
            raise FormatError(f"data file {self.path!r} was truncated while reading",
                              file=self.desc.file, tensor_index=i, tensor_name=t.name) from e
        return out.view(dt).reshape(shape)

    def read_all(self) -> Dict[str, np.ndarray]:
        """Every tensor: views of the mapping, or (mmap=False) one parallel read into one buffer."""
        desc = self.desc
        if self.view is not None:
            if self.base is None:
                self.base = np.frombuffer(self.view, np.uint8)
            return _views(self.base, desc.byte_offset, desc.tensors, readonly=True)
        if self.fd is None:
            if desc.byte_length:
                raise ValueError("I/O operation on a closed Reader")
            return _views(np.empty(0, np.uint8), 0, desc.tensors, readonly=self.use_mmap)
        table = desc.tensors
        if sum(table.lengths) < desc.byte_length // 2:
            # mostly gaps (a hand-made layout): read the tensors, not the region
            keys = table.keys()
            return {keys[i]: self.array_at(i) for i in range(len(keys))}
        buf = _lowlevel.alloc(desc.byte_length)
        try:
            _lowlevel.pread_into(self.fd, buf, desc.byte_offset, path=self.path)
        except EOFError as e:
            raise FormatError(f"data file {self.path!r} was truncated while reading", file=desc.file) from e
        return _views(buf, 0, desc.tensors, readonly=False)


def _views(base: np.ndarray, start: int, table, readonly: bool) -> Dict[str, np.ndarray]:
    """Arrays over ``base`` for every tensor of ``table`` (offsets relative to ``start``)."""
    nd = np.ndarray
    out: Dict[str, np.ndarray] = {}
    for key, dt, shape, off, ln in zip(table.keys(), table.dtypes, table.shapes, table.offsets, table.lengths):
        if ln:
            out[key] = nd(shape, dt.numpy, base, start + off)
        else:
            a = np.empty(shape, dt.numpy)
            a.flags.writeable = not readonly
            out[key] = a
    return out


class TensorMapping:
    """The mapping protocol shared by :class:`Reader` and ``remote.RemoteReader``.

    Subclasses set ``path``, ``descriptor`` and ``_index = None`` and define
    ``__getitem__`` and ``close``.
    """

    path: str
    descriptor: ListDescriptor
    _index: Optional[Dict[str, int]]

    @property
    def metadata(self) -> Any:
        """The list's ``metadata`` (any JSON value), or None."""
        return self.descriptor.metadata

    def keys(self) -> List[str]:
        return self.descriptor.keys()

    def __len__(self) -> int:
        return len(self.descriptor.tensors)

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())

    def __contains__(self, key) -> bool:
        return key in self._key_index()

    def _key_index(self) -> Dict[str, int]:
        if self._index is None:
            keys = self.descriptor.tensors.keys()
            self._index = dict(zip(keys, range(len(keys))))
        return self._index

    def _position(self, key: Union[str, int]) -> int:
        if isinstance(key, str):
            i = self._key_index().get(key)
            if i is None:
                raise KeyError(f"{self.path}: no tensor {key!r}")
            return i
        if isinstance(key, (int, np.integer)) and not isinstance(key, bool):
            n = len(self.descriptor.tensors)
            i = int(key) + n if key < 0 else int(key)
            if not 0 <= i < n:
                raise IndexError(f"{self.path}: tensor index {key} out of range for {n} tensors")
            return i
        raise TypeError(f"tensors are indexed by name (str) or position (int), not {type(key).__name__}")

    def info(self, key: Union[str, int]) -> TensorInfo:
        """The descriptor entry of a tensor, by key or position."""
        return self.descriptor.tensors[self._position(key)]

    def get(self, key, default=None):
        return self[key] if key in self else default

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Reader(TensorMapping):
    """A lazy, read-only view of one TensorList; also a context manager.

    Only the descriptor is parsed when it is made; tensors are mapped (or, with
    ``mmap=False``, read) when asked for. Tensors are keyed by name, or by
    position as ``"0"``, ``"1"``... in a positional (lamp) list; integer
    indexing works for both.

    Args:
        path: the JSON document holding the descriptor.
        pointer: RFC 6901 pointer to a TensorList embedded in a bigger document.
        mmap: map the data file (zero-copy, the default), or read with pread
            into private memory (for network filesystems, or where another
            process may truncate the file: a truncated mapping kills the
            process with SIGBUS on access, pread raises FormatError instead).
        allow_outside: trust a ``location`` that is absolute or leaves the
            document's directory.
        max_descriptor_bytes, max_tensors, max_total_bytes: policy limits
            (see ``format.Limits``).

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.tl")
        >>> tensorlist.save(path, {"w": np.eye(2, dtype=np.float32)})
        >>> with tensorlist.open(path) as r:
        ...     print(r.keys(), r["w"].sum())
        ['w'] 2.0
    """

    def __new__(cls, path=None, *args, **kwargs):
        if isinstance(path, str) and "://" in path:  # an fsspec URL: see tensorlist.remote
            from .remote import RemoteReader

            return RemoteReader(path, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        path,
        *,
        pointer: Optional[str] = None,
        mmap: bool = True,
        allow_outside: bool = False,
        max_descriptor_bytes: Optional[int] = None,
        max_tensors: Optional[int] = None,
        max_total_bytes: Optional[int] = None,
    ):
        self.path = os.fspath(path)
        self._limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
        self._mmap = mmap
        self._index: Optional[Dict[str, int]] = None
        # A concurrent save may replace the descriptor and delete the data file
        # we just read about: re-read the descriptor and try again.
        # Give up when the descriptor still names the same missing file (it is
        # really missing); a descriptor that keeps changing is being replaced.
        missing: Optional[str] = None
        for _ in range(100):
            desc = self._read_descriptor(pointer, allow_outside)
            try:
                self._data = _Data(desc, mmap, allow_outside)
                break
            except FileNotFoundError as e:
                if desc.data_path == missing:
                    raise FormatError(f"data file {desc.data_path!r} does not exist", file=self.path,
                                      field=f"{desc.pointer}/location" if desc.pointer else "location") from e
                missing = desc.data_path
        else:
            raise FormatError("the descriptor was replaced 100 times while being opened", file=self.path)
        self.descriptor: ListDescriptor = desc

    def _read_descriptor(self, pointer, allow_outside) -> ListDescriptor:
        doc = read_json_file(self.path, self._limits, fast=True)
        obj, ptr = _select_list(doc, pointer, self.path)
        return parse_list(obj, file=self.path, pointer=ptr, base_dir=_base_dir(self.path),
                          allow_outside=allow_outside, limits=self._limits)

    # --- mapping protocol ----------------------------------------------------
    def __getitem__(self, key: Union[str, int]) -> np.ndarray:
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        return self._data.array_at(self._position(key))

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]

    def to_dict(self) -> Dict[str, np.ndarray]:
        """Every tensor, keyed as ``load`` keys them."""
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        return self._data.read_all()

    def verify(self, keys=None) -> int:
        """Checks stored CRC32Cs (in parallel, in C); returns how many were checked.

        Raises:
            ChecksumError: naming the first tensor whose bytes do not match.
        """
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        infos = [self.info(k) for k in (self.keys() if keys is None else keys)]
        return _verify(self._data, infos)

    # --- lifetime ------------------------------------------------------------
    def close(self) -> None:
        """Releases the file; arrays already returned stay valid."""
        if self._data is not None:
            self._data.close()
            self._data = None

    @property
    def closed(self) -> bool:
        return self._data is None

    def __repr__(self) -> str:
        d = self.descriptor
        return (f"<tensorlist.Reader {self.path!r}{' ' + d.pointer if d.pointer else ''}: "
                f"{len(d.tensors)} tensors, {d.byte_length} bytes{', closed' if self.closed else ''}>")


def _verify(data: _Data, infos) -> int:
    infos = [t for t in infos if t.crc32c is not None]
    got = _lowlevel.crc32c_many([_bytes_view(data.array(t)) for t in infos])
    for t, c in zip(infos, got):
        if c != t.crc32c:
            raise ChecksumError(f"CRC32C of the data is {c:#010x}, the descriptor says {t.crc32c:#010x}",
                                file=data.desc.file, tensor_index=t.index, tensor_name=t.name, field="crc32c")
    return len(infos)


def _bytes_view(a: np.ndarray) -> np.ndarray:
    """The stored bytes of a C-contiguous array as uint8 (works for ml_dtypes too)."""
    return a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)


def open(path, **kwargs) -> Reader:  # noqa: A001 - mirrors builtins.open on purpose
    """Opens a TensorList lazily: see :class:`Reader` for the arguments."""
    return Reader(path, **kwargs)


def load(path, *, pointer: Optional[str] = None, mmap: bool = True, verify: bool = False,
         **kwargs) -> Dict[str, np.ndarray]:
    """Loads every tensor of a TensorList as numpy arrays.

    Args:
        path: the JSON document holding the descriptor.
        pointer: RFC 6901 pointer to a TensorList embedded in a bigger document.
        mmap: True (default): read-only zero-copy views of the mapped file,
            no byte read until used. False: one parallel read into private,
            writable memory.
        verify: check the stored CRC32Cs first (ChecksumError on mismatch).
        **kwargs: ``allow_outside``, ``max_descriptor_bytes``, ``max_tensors``,
            ``max_total_bytes``.

    Returns:
        dict name -> array, in file order; unnamed tensors keyed "0", "1", ...

    Raises:
        FormatError: the descriptor or data file breaks the format.
        OSError: the descriptor cannot be read.
    """
    with Reader(path, pointer=pointer, mmap=mmap, **kwargs) as r:
        if verify:
            if r.verify() == 0 and len(r):
                warnings.warn(f"{r.path}: verify=True but the file stores no checksums", stacklevel=2)
        return r.to_dict()


def load_document(path, *, mmap: bool = True, **kwargs):
    """Loads a JSON document, replacing every embedded TensorList by its tensors.

    Returns:
        A deep copy of the document in which each TensorList object became a
        dict name -> array (as ``load`` returns it).
    """
    path = os.fspath(path)
    limits = Limits.of(kwargs.pop("max_descriptor_bytes", None), kwargs.pop("max_tensors", None),
                       kwargs.pop("max_total_bytes", None))
    allow_outside = kwargs.pop("allow_outside", False)
    if kwargs:
        raise TypeError(f"unexpected arguments {sorted(kwargs)}")
    doc = read_json_file(path, limits)
    out = copy.deepcopy(doc)
    base = _base_dir(path)
    pointers = find_tensor_lists(doc)
    for ptr in pointers:
        desc = parse_list(resolve_pointer(doc, ptr), file=path, pointer=ptr, base_dir=base,
                          allow_outside=allow_outside, limits=limits)
        try:
            data = _Data(desc, mmap, allow_outside)
        except FileNotFoundError as e:
            raise FormatError(f"data file {desc.data_path!r} does not exist", file=path,
                              field=f"{ptr}/location" if ptr else "location") from e
        tensors = data.read_all()
        data.close()
        if ptr == "":
            return tensors
        parent_ptr, _, last = ptr.rpartition("/")
        parent = resolve_pointer(out, parent_ptr)
        token = last.replace("~1", "/").replace("~0", "~")
        parent[int(token) if isinstance(parent, list) else token] = tensors
    return out
