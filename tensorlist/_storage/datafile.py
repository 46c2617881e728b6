"""The data side of a read: opened data files, the arrays of a list over them, CRC checks.

A :class:`DataFile` is one opened data file, checked once (confined to the
descriptor's directory, a regular file, long enough for every list read from
it) and then mapped read-only (zero-copy read-only views), mapped
copy-on-write (zero-copy writable views whose writes never reach the file) or
kept as an fd for reads into private memory (``pread`` from the page cache,
or O_DIRECT for a large range mostly not cached: ``lowlevel.read_new``
decides): the three :class:`ReadMode`
members, parsed from every reader's ``mmap=`` argument by :func:`read_mode`, the one
parser. Every list of a document that shares a data file shares its one
mapping. :func:`open_consistently` pairs descriptors with
their data while another process may be replacing both, for every reader
(``Reader``, ``load_document``, ``validate``). :func:`check_crcs` is the one
CRC32C comparison, for local and remote readers alike, and
:func:`unsupported_dtype` and :func:`too_many_dims` the FormatErrors for a tensor this
installation cannot represent (an ml_dtypes too old for its dtype, a numpy 1.x for its 33 to 64 dims).

Imports ``format``, ``lowlevel`` and ``errors`` only.
"""
from __future__ import annotations

import enum
import errno
import operator
import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist._base import lowlevel
from tensorlist.errors import ChecksumError, EncryptionError, FormatError, UnsupportedDTypeError
from tensorlist.format import ListDescriptor, TensorInfo, check_data_path, check_data_size, open_regular

__all__ = ["ReadMode", "read_mode", "DataFile", "ListData", "opener_for", "locked", "open_list", "open_consistently", "check_crcs",
           "bytes_view", "region_target", "first_tensor_in", "writable_bytes", "views", "unsupported_dtype",
           "too_many_dims", "NUMPY_MAX_DIMS"]

#: How often a reader re-reads a descriptor that a concurrent save keeps replacing.
MAX_REREADS = 100


class ReadMode(enum.Enum):
    """How a reader gets a data file's bytes: what ``mmap=True``, ``mmap="copy"`` and ``mmap=False`` select."""

    #: ``mmap=True``: read-only views of a read-only mapping; nothing is copied.
    MAP = "map"
    #: ``mmap="copy"``: writable views of a copy-on-write mapping; a page is copied on its first write,
    #: and no write reaches the file.
    COPY = "copy"
    #: ``mmap=False``: ``pread`` into private, writable memory.
    READ = "read"

    @property
    def mapped(self) -> bool:
        """The arrays are views of a mapping of the file."""
        return self is not ReadMode.READ

    @property
    def writable(self) -> bool:
        """The arrays may be written (never changing the file)."""
        return self is not ReadMode.MAP


def read_mode(mmap) -> ReadMode:
    """The one parser of the ``mmap=`` argument of every reader (local, remote, DCP, torch adapters).

    Args:
        mmap: True (a read-only mapping), ``"copy"`` (a copy-on-write
            mapping) or False (pread); a ReadMode is returned as it is.

    Returns:
        The ReadMode.

    Raises:
        ValueError: anything else, named with ``{!r}``.

    Example:
        >>> read_mode(True), read_mode("copy"), read_mode(False)
        (<ReadMode.MAP: 'map'>, <ReadMode.COPY: 'copy'>, <ReadMode.READ: 'read'>)
    """
    if isinstance(mmap, ReadMode):
        return mmap
    if mmap is True or mmap is False:  # not 1/0, not "yes": a typo must not pick a mode
        return ReadMode.MAP if mmap else ReadMode.READ
    if isinstance(mmap, str) and mmap == ReadMode.COPY.value:
        return ReadMode.COPY
    raise ValueError(f"mmap must be True, False or 'copy', not {mmap!r}")


def _location_field(desc: ListDescriptor) -> str:
    return f"{desc.pointer}/location" if desc.pointer else "location"


class DataFile:
    """One opened data file: a read-only or copy-on-write mapping, or an fd for ``pread``.

    Safety: arrays handed out keep the mapping alive on their own (numpy holds
    the memoryview), so closing a DataFile never invalidates them.
    """

    def __init__(self, desc: ListDescriptor, mode, allow_outside: bool = False):
        self.path = desc.data_path
        self.mode = mode = read_mode(mode)
        self.use_mmap = use_mmap = mode.mapped
        self.view: Optional[memoryview] = None
        self.base: Optional[np.ndarray] = None  # uint8 array over the whole mapping
        self.fd: Optional[int] = None
        self._span: Optional[Tuple[int, np.ndarray]] = None  # (start, private copy) for mmap=False
        check_data_path(desc, allow_outside)
        try:
            fd = open_regular(self.path, what="data file", file=desc.file, field=_location_field(desc))
        except OSError as e:  # FileNotFoundError goes to the caller, who may re-read the descriptor
            if e.errno not in (errno.ENOTDIR, errno.ENAMETOOLONG, errno.ELOOP, errno.EACCES, errno.EISDIR):
                raise
            # the location names no readable file: a path through a file, too long, a symlink loop
            raise FormatError(f"data file {self.path!r} cannot be opened: {e.strerror}", file=desc.file,
                              field=_location_field(desc)) from e
        try:
            self.size = os.fstat(fd).st_size
            if use_mmap:
                mapper = lowlevel.map_copy if mode is ReadMode.COPY else lowlevel.map_readonly
                self.view = mapper(fd, self.size, self.path) if self.size else None
            else:
                self.fd, fd = fd, None
        finally:
            if fd is not None:
                os.close(fd)

    def check(self, desc: ListDescriptor) -> None:
        """Refuses a list whose region does not fit in this file."""
        check_data_size(desc, self.size, self.path)

    def mapped(self) -> np.ndarray:
        if self.base is None:
            if self.view is None:
                raise ValueError("I/O operation on a closed Reader")
            self.base = np.frombuffer(self.view, np.uint8)
        return self.base

    def read(self, start: int, length: int, desc: ListDescriptor, index: Optional[int] = None) -> np.ndarray:
        """``length`` bytes at ``start`` into fresh private memory.

        ``lowlevel.read_new`` picks the way: parallel ``pread`` from the page
        cache, or O_DIRECT when the range is large and mostly not cached.
        """
        if self._span is not None:
            s, buf = self._span
            if s <= start and start + length <= s + len(buf):
                return buf[start - s:start - s + length]
        if self.use_mmap:
            out = lowlevel.alloc(length)
            self.readinto(out, start, desc, index)
            return out
        if self.fd is None:
            raise ValueError("I/O operation on a closed Reader")
        try:
            return lowlevel.read_new(self.fd, start, length, self.path)
        except EOFError as e:
            raise self._truncated(start, length, desc, index) from e

    def readinto(self, out: np.ndarray, start: int, desc: ListDescriptor, index: Optional[int] = None) -> None:
        """Fills the uint8 array ``out`` with the bytes at ``start`` (parallel ``pread``, or the mapping).

        ``index`` names the tensor being read in a truncation error; without
        it the error names the first tensor of ``desc`` that the file, as it
        is now, no longer holds.
        """
        n = len(out)
        if self.use_mmap:
            if n:
                out[:] = self.mapped()[start:start + n]
            return
        if self.fd is None:
            raise ValueError("I/O operation on a closed Reader")
        try:
            lowlevel.pread_into(self.fd, out, start, path=self.path)
        except EOFError as e:
            raise self._truncated(start, n, desc, index) from e

    def _truncated(self, start: int, n: int, desc: ListDescriptor, index: Optional[int]) -> FormatError:
        size = os.fstat(self.fd).st_size
        if index is None:
            index = first_tensor_in(desc, max(start, size), start + n)
        t = desc.tensors[index] if index is not None else None
        return FormatError(f"data file {self.path!r} was truncated while reading ({size} bytes left, "
                           f"{start + n} needed)", file=desc.file, tensor_index=index,
                           tensor_name=t.name if t is not None else None)

    def read_span(self, start: int, end: int, desc: ListDescriptor) -> None:
        """Reads ``[start, end)`` once; later reads inside it are views of that one copy.

        Several lists of a document over the same bytes then cost the file's
        size in memory, not the sum of the lists.
        """
        if self.fd is not None and end > start:
            self._span = (start, self.read(start, end - start, desc))

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        self.view = self.base = None
        self._span = None


class ListData:
    """The tensors of one list over its (possibly shared) :class:`DataFile`.

    An encrypted list is read only once :meth:`unlock` has checked its key:
    its tensors are then decrypted into private memory whatever ``mode`` is
    (``mode`` says how the ciphertext is read), and nothing of it is mapped.
    """

    #: The list's ``crypto.cipher.Opener`` once unlocked.
    opener = None

    def __init__(self, desc: ListDescriptor, file: Optional[DataFile], mode, owns_file: bool = True):
        self.desc = desc
        self.file = file
        self.mode = read_mode(mode)
        self.use_mmap = self.mode.mapped
        self.owns_file = owns_file
        self.closed = False

    @property
    def path(self) -> Optional[str]:
        return self.desc.data_path

    def unlock(self, key) -> Any:
        """Opens the list with ``key`` (:func:`opener_for`); returns its metadata, decrypted if it was sealed."""
        self.opener = opener_for(self.desc, key, self.desc.file)
        return self.opener.metadata if self.opener is not None else self.desc.metadata

    def require_key(self) -> None:
        """Raises the one ``EncryptionError`` for an encrypted list not unlocked with its key."""
        if self.desc.encryption is not None and self.opener is None:
            raise locked(self.desc.file)

    def _decrypt(self, indices: Sequence[int], outs: Sequence[np.ndarray]) -> None:
        self.require_key()
        desc = self.desc
        base = desc.byte_offset

        def read_into(dst, offset, index):
            self.file.readinto(dst, base + offset, desc, index)

        def read_tags(offset, n):
            tags = np.empty(n, np.uint8)
            self.file.readinto(tags, base + offset, desc)
            return tags.tobytes()

        self.opener.decrypt(desc.tensors, indices, outs, read_into, read_tags)

    def _decrypted_region(self, indices: Sequence[int]) -> np.ndarray:
        """The tensors ``indices`` decrypted into one buffer laid out as the list's region."""
        table = self.desc.tensors
        buf = lowlevel.alloc(self.desc.encryption.tags_offset, huge=True)
        self._decrypt(indices, [buf[table.offsets[i]:table.offsets[i] + table.lengths[i]] for i in indices])
        return buf

    def array(self, info: TensorInfo) -> np.ndarray:
        return self.array_at(info.index)

    def array_at(self, i: int, bits: bool = False) -> np.ndarray:
        """Tensor ``i``: a view of the mapping (writable with mmap="copy"), or (mmap=False) a fresh read.

        ``bits``: bfloat16/float8 as bit carriers (``DType.bits``), without ml_dtypes.
        """
        if self.closed:
            raise ValueError("I/O operation on a closed Reader")
        table = self.desc.tensors
        try:
            row = table.dtypes[i]
            dt = row.bits if bits else row.numpy
        except UnsupportedDTypeError as e:
            raise unsupported_dtype(self.desc, e, i) from None
        shape, length = table.shapes[i], table.lengths[i]
        try:
            if length == 0:
                a = np.empty(shape, dtype=dt)
                a.flags.writeable = self.mode.writable
                return a
            if self.desc.encryption is not None:
                out = lowlevel.alloc(length, huge=True)
                self._decrypt([i], [out])
                return out.view(dt).reshape(shape)
            start = self.desc.byte_offset + table.offsets[i]
            if self.use_mmap:
                return np.ndarray(shape, dt, self.file.mapped(), start)
            return self.file.read(start, length, self.desc, i).view(dt).reshape(shape)
        except ValueError as e:
            raise too_many_dims(self.desc, i, e) from None

    def read_all(self, bits: bool = False) -> Dict[str, np.ndarray]:
        """Every tensor: views of the mapping, or (mmap=False) one parallel read into one buffer.

        ``bits``: bfloat16/float8 as bit carriers (``DType.bits``), without ml_dtypes.
        """
        if self.closed:
            raise ValueError("I/O operation on a closed Reader")
        desc = self.desc
        if self.file is None:  # an empty region: no file was opened
            return views(np.empty(0, np.uint8), 0, desc, readonly=not self.mode.writable, bits=bits)
        if desc.encryption is not None:
            return views(self._decrypted_region(range(len(desc.tensors))), 0, desc, readonly=False, bits=bits)
        if self.use_mmap:
            return views(self.file.mapped(), desc.byte_offset, desc, readonly=not self.mode.writable, bits=bits)
        table = desc.tensors
        if sum(table.lengths) < desc.byte_length // 2:
            # mostly gaps (a hand-made layout): read the tensors, not the region
            keys = table.keys()
            return {keys[i]: self.array_at(i, bits) for i in range(len(keys))}
        buf = self.file.read(desc.byte_offset, desc.byte_length, desc)
        return views(buf, 0, desc, readonly=False, bits=bits)

    def readinto(self, out, offset: int) -> None:
        """Copies the list's bytes ``[offset, offset + len(out))``, counted from its region's start, into ``out``.

        Raises:
            ValueError: the range leaves the list's region.
            FormatError: the data file was truncated meanwhile (``mmap=False``).
        """
        if self.closed:
            raise ValueError("I/O operation on a closed Reader")
        dst, start = region_target(self.desc, out, offset)
        if not len(dst):
            return
        if self.desc.encryption is not None:  # the plaintext of the tensors in the range; padding reads as zeros
            lo, hi = start - self.desc.byte_offset, start - self.desc.byte_offset + len(dst)
            table = self.desc.tensors
            inside = [i for i, (o, ln) in enumerate(zip(table.offsets, table.lengths)) if ln and o < hi and lo < o + ln]
            dst[:] = 0
            if inside:
                buf = self._decrypted_region(inside)
                for i in inside:
                    s, e = max(lo, table.offsets[i]), min(hi, table.offsets[i] + table.lengths[i])
                    dst[s - lo:e - lo] = buf[s:e]
            return
        self.file.readinto(dst, start, self.desc)

    def verify(self, infos: Sequence[TensorInfo]) -> int:
        """Checks the stored CRC32Cs of ``infos``; returns how many were checked.

        The bytes are read as bit carriers: checking bfloat16/float8 needs no ml_dtypes. An encrypted
        list checks every chunk's tag instead, in groups of at most 64 MiB.
        """
        if self.desc.encryption is not None:
            table, group, size = self.desc.tensors, [], 0
            infos = list(infos)
            for n, t in enumerate(infos, 1):
                group.append(t.index)
                size += t.byte_length
                if size >= 1 << 26 or n == len(infos):
                    self._decrypt(group, [np.empty(table.lengths[i], np.uint8) for i in group])
                    group, size = [], 0
            return len(infos)
        infos = [t for t in infos if t.crc32c is not None]
        return check_crcs(infos, [self.array_at(t.index, bits=True) for t in infos], self.desc.file)

    def close(self) -> None:
        if self.owns_file and self.file is not None:
            self.file.close()
        self.closed = True


def opener_for(desc: ListDescriptor, key, file) -> Any:
    """The one rule of ``key=`` for every reader, local or remote: a ``crypto.cipher.Opener``, or None.

    No key: None (an encrypted list then shows its table and refuses its
    tensors, :func:`locked`). A key for an encrypted list: its Opener, once
    the key check and the header's tag hold. A key for a plain list is
    refused: a reader holding a key expects authenticated data, and a plain
    file put in place of an encrypted one must not pass for it.

    Raises:
        EncryptionError: the wrong key, a descriptor altered since it was
            sealed, or a plain list read with a key.
    """
    if key is None:
        return None
    if desc.encryption is None:
        raise EncryptionError("the list is not encrypted, but a key was given: it may have replaced an encrypted "
                              "one (read it without key= if it is meant to be plain)", file=file,
                              field=f"{desc.pointer}/encryption" if desc.pointer else "encryption")
    from tensorlist.crypto import as_key
    from tensorlist.crypto.cipher import Opener
    return Opener(desc.encryption, as_key(key), file, desc.pointer)


def locked(file) -> EncryptionError:
    """The error for a tensor of an encrypted list opened without its key."""
    return EncryptionError("the list is encrypted: pass key= (a tensorlist.Key or its 32 bytes) to read it", file=file)


def open_list(desc: ListDescriptor, mode, allow_outside: bool = False,
              shared: Optional[Dict[str, DataFile]] = None) -> ListData:
    """Opens the data of one list; with ``shared``, one DataFile per data path serves every list.

    Raises:
        FileNotFoundError: the data file does not exist (the caller decides
            whether the descriptor was replaced meanwhile).
        FormatError: the data file is refused (confinement, type, size).
    """
    if desc.byte_length == 0:
        return ListData(desc, None, mode)  # nothing to read: lamp does not touch the file either
    if shared is None:
        f = DataFile(desc, mode, allow_outside)
        try:
            f.check(desc)
        except BaseException:
            f.close()
            raise
        return ListData(desc, f, mode)
    f = shared.get(desc.data_path)
    if f is None:
        f = shared[desc.data_path] = DataFile(desc, mode, allow_outside)
    elif not allow_outside:
        check_data_path(desc, allow_outside)  # the same path may be confined for one file and not another
    f.check(desc)
    return ListData(desc, f, mode, owns_file=False)


def open_consistently(read: Callable[[], List[ListDescriptor]], mode, allow_outside: bool = False,
                      *, file: Optional[str] = None,
                      share: bool = True) -> Tuple[List[ListDescriptor], List[ListData], Dict[str, DataFile]]:
    """Reads descriptors with ``read()`` and opens their data, re-reading while a save replaces them.

    A concurrent save may replace the descriptor and delete the data file we
    just read about: re-read the descriptor and try again. A data file is
    missing for real only when the re-read descriptor names the same missing
    file again; a descriptor that keeps changing is being replaced.

    With ``share`` (documents), lists of one data file share one DataFile,
    which the caller closes (the third value); without it each ListData owns
    (and closes) its own.

    ``mode`` is a reader's ``mmap=`` argument (see :func:`read_mode`), parsed
    before anything is read.

    Returns:
        (descriptors, their ListData, the shared DataFiles to close).
    """
    mode = read_mode(mode)
    missing: Optional[str] = None
    for _ in range(MAX_REREADS):
        descs = read()
        shared: Dict[str, DataFile] = {}
        opened: List[ListData] = []
        try:
            for d in descs:
                opened.append(open_list(d, mode, allow_outside, shared if share else None))
            return descs, opened, shared
        except FileNotFoundError as e:
            _close(opened, shared)
            d = descs[len(opened)]
            if d.data_path == missing:
                raise FormatError(f"data file {d.data_path!r} does not exist", file=d.file,
                                  field=_location_field(d)) from e
            missing = d.data_path
        except BaseException:
            _close(opened, shared)
            raise
    raise FormatError(f"the descriptor was replaced {MAX_REREADS} times while being opened", file=file)


def _close(opened: List[ListData], shared: Dict[str, DataFile]) -> None:
    for d in opened:
        d.close()
    for f in shared.values():
        f.close()


def check_crcs(infos: Sequence[TensorInfo], arrays: Sequence[np.ndarray], file) -> int:
    """Compares the CRC32C of each array's bytes (in parallel, in C) with its descriptor entry.

    Raises:
        ChecksumError: naming the first tensor whose bytes do not match.
    """
    got = lowlevel.crc32c_many([bytes_view(a) for a in arrays])
    for t, c in zip(infos, got):
        if c != t.crc32c:
            raise ChecksumError(f"CRC32C of the data is {c:#010x}, the descriptor says {t.crc32c:#010x}",
                                file=file, tensor_index=t.index, tensor_name=t.name, field="crc32c")
    return len(infos)


def bytes_view(a: np.ndarray) -> np.ndarray:
    """The stored bytes of a C-contiguous array as uint8 (works for ml_dtypes too)."""
    return a.reshape(-1).view(np.uint8) if a.size else np.empty(0, np.uint8)


def region_target(desc: ListDescriptor, buf, offset) -> Tuple[np.ndarray, int]:
    """The checks of every ``readinto``: ``buf`` as writable uint8, and where in the data file ``offset`` is.

    ``offset`` counts from the list's first byte; ``[offset, offset + len)``
    must lie inside the list's region.

    Raises:
        TypeError: ``offset`` is not an integer.
        ValueError: the range leaves the region, or ``buf`` is read-only or
            not contiguous.
    """
    if isinstance(offset, bool):
        raise TypeError("offset must be an integer, not bool")
    offset = operator.index(offset)
    dst = writable_bytes(buf)
    if offset < 0 or offset + len(dst) > desc.byte_length:
        raise ValueError(f"bytes [{offset}, {offset + len(dst)}) lie outside the list's {desc.byte_length}-byte region")
    return dst, desc.byte_offset + offset


def first_tensor_in(desc: ListDescriptor, start: int, end: int) -> Optional[int]:
    """The first tensor (in file order) with bytes in data-file bytes ``[start, end)``, for errors; or None."""
    base, table = desc.byte_offset, desc.tensors
    return next((i for i, (o, ln) in enumerate(zip(table.offsets, table.lengths))
                 if ln and start < base + o + ln and base + o < end), None)


def writable_bytes(buf) -> np.ndarray:
    """A writable C-contiguous buffer (numpy array, bytearray, memoryview) as a flat uint8 array, no copy.

    Raises:
        ValueError: the buffer is read-only or not contiguous.
    """
    if isinstance(buf, np.ndarray):  # ml_dtypes arrays export no buffer format: take their bytes directly
        if not buf.flags.writeable:
            raise ValueError("the destination buffer is read-only")
        if not buf.flags.c_contiguous:
            raise ValueError("the destination buffer is not contiguous")
        return buf.reshape(-1).view(np.uint8) if buf.size else np.empty(0, np.uint8)
    view = memoryview(buf)
    if view.readonly:
        raise ValueError("the destination buffer is read-only")
    if not view.c_contiguous:
        raise ValueError("the destination buffer is not contiguous")
    return np.frombuffer(view.cast("B"), np.uint8) if view.nbytes else np.empty(0, np.uint8)


def views(base: np.ndarray, start: int, desc: ListDescriptor, readonly: bool,
          bits: bool = False) -> Dict[str, np.ndarray]:
    """Arrays over ``base`` for every tensor of ``desc`` (offsets relative to ``start``; ``bits``: carriers)."""
    nd = np.ndarray
    out: Dict[str, np.ndarray] = {}
    table = desc.tensors
    try:
        for key, row, shape, off, ln in zip(table.keys(), table.dtypes, table.shapes, table.offsets, table.lengths):
            dt = row.bits if bits else row.numpy
            if ln:
                out[key] = nd(shape, dt, base, start + off)
            else:
                a = np.empty(shape, dt)
                a.flags.writeable = not readonly
                out[key] = a
    except UnsupportedDTypeError as e:
        raise unsupported_dtype(desc, e) from None
    except ValueError as e:  # the tensor that failed is the one after those made
        raise too_many_dims(desc, len(out), e) from None
    return out


#: numpy 1.x arrays have at most 32 dims (NPY_MAXDIMS); the format allows 64 (``format.MAX_DIMS``), as numpy 2.
NUMPY_MAX_DIMS = 64 if int(np.__version__.split(".")[0]) >= 2 else 32


def too_many_dims(desc: ListDescriptor, i: int, e: ValueError) -> Exception:
    """The FormatError for tensor ``i`` when numpy refused its shape for having too many dims, else ``e``."""
    ndim = len(desc.tensors.shapes[i])
    if ndim <= NUMPY_MAX_DIMS:
        return e
    table = desc.tensors
    return FormatError(f"{ndim} dims: numpy {np.__version__} arrays hold at most {NUMPY_MAX_DIMS} (numpy 2 holds "
                       "the format's 64)", file=desc.file, tensor_index=i,
                       tensor_name=table.names[i] if table.names is not None else None,
                       field=f"{desc.pointer}/dims" if desc.pointer else "dims")


def unsupported_dtype(desc: ListDescriptor, e: UnsupportedDTypeError, index: Optional[int] = None) -> FormatError:
    """The FormatError for ``e`` (from a row's ``numpy``), naming tensor ``index`` or the first of that dtype."""
    table = desc.tensors
    i = index if index is not None else next(j for j, d in enumerate(table.dtypes) if d.name == e.dtype)
    return FormatError(str(e), file=desc.file, tensor_index=i,
                       tensor_name=table.names[i] if table.names is not None else None,
                       field=f"{desc.pointer}/dataType" if desc.pointer else "dataType")
