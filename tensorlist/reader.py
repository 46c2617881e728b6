"""Reading: the lazy :class:`Reader`, ``load`` and ``load_document``.

A Reader parses and validates the descriptor, opens the data file and checks
its size, and maps it read-only (or, with ``mmap="copy"``, copy-on-write:
writable views whose writes never reach the file); no page of tensor data is touched until a
tensor is used. The open file (or mapping) pins the data the descriptor
described, so a concurrent ``save`` that replaces the file does not change
what an open Reader returns.
"""
from __future__ import annotations

import os
import warnings
from typing import Any, Dict, Iterable, Iterator, List, Optional, Union

import numpy as np

from tensorlist._base import backends
from tensorlist._storage.datafile import ListData, ReadMode, open_consistently, read_mode
from tensorlist._base.jsonio import resolve_pointer, set_at_pointer
from tensorlist.format import Limits, ListDescriptor, TensorInfo, find_tensor_lists, parse_list, read_json_file, select_list

__all__ = ["Reader", "open", "load", "load_document"]

def _base_dir(path: str) -> str:
    return os.path.dirname(os.path.abspath(path))


class TensorMapping:
    """The mapping protocol shared by :class:`Reader` and ``remote.RemoteReader``.

    Subclasses set ``path``, ``descriptor`` and ``_index = None`` and define
    ``__getitem__`` and ``close``.
    """

    path: str
    descriptor: ListDescriptor
    _index: Optional[Dict[str, int]]
    _data: Optional[ListData]

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

    def get_many(self, keys: Iterable) -> Dict[Any, np.ndarray]:
        """Several tensors, keyed as given (``RemoteReader`` fetches them in one batch of reads)."""
        return {k: self[k] for k in keys}

    def __enter__(self) -> "Reader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Reader(TensorMapping):
    """A lazy view of one TensorList; also a context manager.

    Only the descriptor is parsed when it is made; tensors are mapped (or, with
    ``mmap=False``, read) when asked for. Tensors are keyed by name, or by
    position as ``"0"``, ``"1"``... in a positional (lamp) list; integer
    indexing works for both.

    Args:
        path: the JSON document holding the descriptor.
        pointer: RFC 6901 pointer to a TensorList embedded in a bigger document.
        mmap: True (the default): map the data file read-only, zero-copy
            read-only views. ``"copy"``: map it copy-on-write, zero-copy
            writable views (fine-tune in place: a page is copied on its first
            write, and no write ever reaches the file; the mapping outlives
            the Reader). False: read with pread into private, writable memory
            (for network filesystems, or where another process may truncate
            the file: a truncated mapping kills the process with SIGBUS on
            access, pread raises FormatError instead). Anything else is a
            ValueError.
        allow_outside: trust a ``location`` that is absolute or leaves the
            document's directory.
        max_descriptor_bytes, max_tensors, max_total_bytes: policy limits
            (see ``format.Limits``).
        bits: bfloat16 and float8 tensors as *bit carriers*: uint16/uint8
            arrays of the same bytes whose ``dtype.metadata`` names the type
            (``{"tensorlist.dtype": "bfloat16"}``), which ``save`` stores as
            that type. For programs whose framework holds these types itself
            (torch, MLX): ml_dtypes is then not imported. Other dtypes are
            unaffected.
        key: the key of an encrypted list (a ``tensorlist.Key`` or its 32
            bytes), checked at once. Without it, an encrypted list still shows
            its names, dtypes and shapes, and reading a tensor raises
            ``EncryptionError``. Its tensors are decrypted into private memory
            whatever ``mmap`` says.

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "w.tl")
        >>> tensorlist.save(path, {"w": np.eye(2, dtype=np.float32)})
        >>> with tensorlist.open(path) as r:
        ...     print(r.keys(), r["w"].sum())
        ['w'] 2.0
    """

    def __new__(cls, path=None, *args, **kwargs):
        if backends.is_remote(path):  # served by the registered URL backend (tensorlist.remote)
            return backends.dispatch("reader", path)(path, *args, **kwargs)
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
        bits: bool = False,
        key=None,
    ):
        self.path = backends.localize(os.fspath(path))
        self._bits = bool(bits)
        self._limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
        self._mmap = mmap = read_mode(mmap)
        self._index: Optional[Dict[str, int]] = None
        (desc,), (self._data,), _ = open_consistently(lambda: [self._read_descriptor(pointer, allow_outside)],
                                                      mmap, allow_outside, file=self.path, share=False)
        try:
            metadata = self._data.unlock(key)
        except BaseException:
            self.close()
            raise
        self.descriptor: ListDescriptor = desc._replace(metadata=metadata) if key is not None else desc

    @property
    def encrypted(self) -> bool:
        """Whether the list is encrypted (its metadata reads as None until opened with its key)."""
        return self.descriptor.encryption is not None

    def require_key(self) -> None:
        """Raises ``EncryptionError`` naming the file if the list is encrypted and was opened without its key.

        For readers of the metadata, which reads as None until the key opens it.
        """
        if self._data is not None:
            self._data.require_key()

    def _read_descriptor(self, pointer, allow_outside) -> ListDescriptor:
        doc = read_json_file(self.path, self._limits, fast=True)
        obj, ptr = select_list(doc, pointer, self.path)
        return parse_list(obj, file=self.path, pointer=ptr, base_dir=_base_dir(self.path),
                          allow_outside=allow_outside, limits=self._limits)

    # --- mapping protocol ----------------------------------------------------
    def __getitem__(self, key: Union[str, int]) -> np.ndarray:
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        return self._data.array_at(self._position(key), self._bits)

    def items(self):
        return [(k, self[k]) for k in self.keys()]

    def values(self):
        return [self[k] for k in self.keys()]

    def to_dict(self) -> Dict[str, np.ndarray]:
        """Every tensor, keyed as ``load`` keys them."""
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        return self._data.read_all(self._bits)

    def readinto(self, buffer, offset: int = 0) -> None:
        """Copies the list's raw bytes at ``offset`` into the writable ``buffer``, filling it.

        ``offset`` counts from the first byte of the list's region (tensor
        ``t`` starts at ``info(t).byte_offset``). With ``mmap=False`` the bytes
        are read with parallel ``pread``s straight into ``buffer`` (a pinned
        staging buffer, say), with no intermediate copy.

        Raises:
            ValueError: the range leaves the list's region, or ``buffer`` is
                read-only or not contiguous.
            FormatError: the data file was truncated meanwhile (``mmap=False``).
        """
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        self._data.readinto(buffer, offset)

    def verify(self, keys=None) -> int:
        """Checks stored CRC32Cs (in parallel, in C); returns how many were checked.

        Raises:
            ChecksumError: naming the first tensor whose bytes do not match.
        """
        if self._data is None:
            raise ValueError("I/O operation on a closed Reader")
        return self._data.verify([self.info(k) for k in (self.keys() if keys is None else keys)])

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


def open(path, **kwargs) -> Reader:  # noqa: A001 - mirrors builtins.open on purpose
    """Opens a TensorList lazily: see :class:`Reader` for the arguments."""
    return Reader(path, **kwargs)


def load(path, *, pointer: Optional[str] = None, mmap: Union[bool, str] = True, verify: bool = False, device=None,
         **kwargs) -> Dict[str, np.ndarray]:
    """Loads every tensor of a TensorList as numpy arrays (or, given ``device``, torch tensors there).

    Args:
        path: the JSON document holding the descriptor.
        pointer: RFC 6901 pointer to a TensorList embedded in a bigger document.
        mmap: True (default): read-only zero-copy views of the mapped file,
            no byte read until used. ``"copy"``: writable zero-copy views of a
            copy-on-write mapping (a page is copied on its first write; the
            file never changes). False: one parallel read into private,
            writable memory. Anything else is a ValueError.
        verify: check the stored CRC32Cs first (ChecksumError on mismatch).
        device: None (numpy arrays), or a torch device (``"cuda"``,
            ``"cuda:1"``, ``torch.device(...)``, ``"cpu"``): torch tensors on
            it. An accelerator is filled straight from the file through
            pinned staging buffers with overlapped chunked copies, with no
            whole-file host copy; on ``"cpu"`` the tensors share the mapping
            as numpy's arrays do. Needs torch.
        **kwargs: ``allow_outside``, ``max_descriptor_bytes``, ``max_tensors``,
            ``max_total_bytes``, ``bits``, ``key`` (see :class:`Reader`) (and, with ``device``, ``chunk_bytes`` and
            ``buffers``: the staging ring).

    Returns:
        dict name -> array (or tensor), in file order; unnamed tensors keyed
        "0", "1", ...

    Raises:
        FormatError: the descriptor or data file breaks the format.
        OSError: the descriptor cannot be read.
    """
    mmap = read_mode(mmap)
    if device is not None:  # served by the registered device backend (tensorlist.torch): torch
        return backends.dispatch("device", path)(path, device, pointer=pointer, mmap=mmap, verify=verify,
                                                  **kwargs)
    with Reader(path, pointer=pointer, mmap=mmap, **kwargs) as r:
        if verify:
            if r.verify() == 0 and len(r):
                warnings.warn(f"{r.path}: verify=True but the file stores no checksums", stacklevel=2)
        return r.to_dict()


def load_document(path, *, mmap: Union[bool, str] = True, allow_outside: bool = False,
                  max_descriptor_bytes: Optional[int] = None, max_tensors: Optional[int] = None,
                  max_total_bytes: Optional[int] = None, key=None):
    """Loads a JSON document, replacing every embedded TensorList by its tensors.

    Lists that share a data file share one mapping (or, with ``mmap=False``,
    one private copy of the bytes they cover). ``mmap`` is as for :func:`load`;
    with ``"copy"`` lists over the same bytes share those bytes, so a write
    through one list's array shows in the other's.

    Returns:
        The document in which each TensorList object became a dict name ->
        array (as ``load`` returns it); the parsed document is not kept.
        ``key`` opens its encrypted lists (see :class:`Reader`).
    """
    mmap = read_mode(mmap)
    path = backends.localize(os.fspath(path))
    if backends.is_remote(path):
        return backends.dispatch("load_document", path)(
            path, mmap=mmap, allow_outside=allow_outside, max_descriptor_bytes=max_descriptor_bytes,
            max_tensors=max_tensors, max_total_bytes=max_total_bytes, **({"key": key} if key is not None else {}))
    limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
    base = _base_dir(path)
    state = {}

    def read():
        doc = state["doc"] = read_json_file(path, limits)
        return [parse_list(resolve_pointer(doc, ptr), file=path, pointer=ptr, base_dir=base,
                           allow_outside=allow_outside, limits=limits) for ptr in find_tensor_lists(doc)]

    descs, datas, shared = open_consistently(read, mmap, allow_outside, file=path)
    doc = state["doc"]
    try:
        for data in datas:
            data.unlock(key)
        if mmap is ReadMode.READ:
            _read_spans(descs, shared)
        for desc, data in zip(descs, datas):
            tensors = data.read_all()
            if desc.pointer == "":
                return tensors
            doc = set_at_pointer(doc, desc.pointer, tensors)
    finally:
        for f in shared.values():
            f.close()
    return doc


def _read_spans(descs, shared) -> None:
    """mmap=False: one private copy of the bytes that overlapping lists of one data file cover.

    Memory then stays below both the lists' total and the data file's size,
    whatever the document repeats.
    """
    by_file: dict = {}
    for d in descs:
        if d.byte_length:
            by_file.setdefault(d.data_path, []).append(d)
    for p, group in by_file.items():
        start = min(d.byte_offset for d in group)
        end = max(d.byte_offset + d.byte_length for d in group)
        if sum(d.byte_length for d in group) > end - start:
            shared[p].read_span(start, end, group[0])
