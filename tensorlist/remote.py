"""Remote storage: tensorlist files behind fsspec URLs (``s3://``, ``gs://``, ``hdfs://``, ``memory://``...).

``tensorlist.open``, ``load``, ``Reader``, ``save`` and ``Writer`` hand any
``scheme://`` path to this module; call it directly to pass fsspec
``storage_options`` (credentials, ``client_kwargs={"endpoint_url": ...}``).
Without them, fsspec's own configuration applies (for S3: the usual
``AWS_*`` environment variables, ``AWS_ENDPOINT_URL`` included).

Reads fetch the descriptor first, validate it exactly as a local read does
(``parse_list``, the data object's size), then fetch only the byte ranges
of the tensors asked for, in parallel (fsspec ``cat_ranges``). ``location``
is resolved against the descriptor's directory and may not leave it.

Writes stream: the data object is uploaded as it is written (fsspec's
buffered files: S3 multipart uploads of ``STREAM_BLOCK`` parts), under a fresh
unique name, with CRC32Cs computed on the way; the descriptor goes last, in
one request: a failed upload never leaves a descriptor that points at missing
data, and the previous file stays readable. Nothing is staged on local disk
(except what a remote ``Writer`` receives after a ``reserve``: sealed first
with ``key=``), and memory
stays at a few parts whatever the size (measured: 62 MiB of anonymous memory
for 256 MiB and 1 GiB saves to an S3 server on loopback, 94 MiB for 2 GiB).
The data objects of the replaced descriptor are deleted after the new
descriptor is in place. (lamp mode keeps lamp's fixed data name, so as
locally there is a window in which the old descriptor meets new data.)
``save_document`` and ``load_document`` take URLs too. ``key=`` encrypts and
decrypts as locally: the same chunks and tags (``_storage.sealed``), sealed
before upload, opened after the ranged reads.

Example:
    >>> import numpy as np, tensorlist
    >>> tensorlist.save("memory://doc/remote.tl", {"w": np.arange(3.0)})
    >>> tensorlist.load("memory://doc/remote.tl")["w"]
    array([0., 1., 2.])
"""
from __future__ import annotations

import builtins
import os
import posixpath
import shutil
import tempfile
from typing import Any, Callable, Dict, Iterable, List, Optional, Tuple

import numpy as np

from tensorlist._base import backends as _backends
from tensorlist._base import lowlevel
from tensorlist import reader
from tensorlist import schema
from tensorlist import writer
from tensorlist._base.backends import is_url
from tensorlist._storage.commit import new_token, own_locations
from tensorlist._storage.datafile import (ReadMode, locked, opener_for, bytes_view, check_crcs, first_tensor_in, read_mode, region_target,
                                          too_many_dims, unsupported_dtype)
from tensorlist._storage.sealed import Seal, check_key_use, le_bytes, open_fetched
from tensorlist._storage.items import (Item, WriterBase, align, check_alignment, check_metadata, descriptor, descriptor_text,
                     fast_descriptor_text, layout, prepare, tensor_entries)
from tensorlist._base.jsonio import dumps, set_at_pointer
from tensorlist.errors import FormatError, TensorListError, UnsupportedDTypeError
from tensorlist.format import (DEFAULT_ALIGNMENT, LIST_ALIGNMENT, MIN_TENSOR_ALIGNMENT, Limits, ListDescriptor, check_data_size,
                     find_tensor_lists, parse_list, read_json_bytes, select_list)
from tensorlist.reader import TensorMapping

__all__ = ["is_url", "RemoteError", "RemoteReader", "RemoteWriter", "open", "load", "save"]

#: Tensors closer than this are fetched in one ranged read (the padding between them is read too).
MERGE_GAP = 64 << 10
#: Largest single ranged read when tensors are merged.
MAX_RANGE = 64 << 20
#: ``readinto`` fetches its range as concurrent reads of this size.
READINTO_PART = 8 << 20


class RemoteError(TensorListError, OSError):
    """A remote store could not be reached or refused an operation."""


def _filesystem(url: str, storage_options: Optional[dict]):
    try:
        return _backends.filesystem(url, storage_options)
    except ValueError as e:
        raise RemoteError(f"{url}: {e}") from None


def _oneline(e: BaseException) -> str:
    text = " ".join(str(e).split()) or type(e).__name__
    return text if len(text) < 300 else text[:300] + " ..."


def _call(url: str, what: str, fn, *args, **kwargs):
    """Runs an fsspec call, turning its many exception types into one clear error."""
    try:
        return fn(*args, **kwargs)
    except (FileNotFoundError, TensorListError):
        raise
    except Exception as e:  # botocore, aiohttp, pyarrow... each has its own tree
        raise RemoteError(f"{url}: cannot {what}: {type(e).__name__}: {_oneline(e)}") from e


def _join(fs, path: str, location: str) -> str:
    if posixpath.isabs(location):  # only accepted with allow_outside=True
        return location
    return posixpath.normpath(posixpath.join(posixpath.dirname(path), location))


def _url_of(fs, path: str) -> str:
    try:
        return fs.unstrip_protocol(path)
    except Exception:
        return path


def _read_document(fs, path: str, url: str, limits: Limits, *, fast: bool = False):
    """The JSON document at ``path``: its size checked first, then parsed by the one capped strict reader."""
    try:
        fs.invalidate_cache(path)  # a listing cached by fsspec may predate the last save
    except Exception:
        pass
    try:
        size = _call(url, "read the descriptor's size", fs.size, path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{url}: no such file") from None
    if size is not None and size > limits.max_descriptor_bytes:
        raise FormatError(f"descriptor is {size} bytes, above the limit of {limits.max_descriptor_bytes} "
                          "(raise it with max_descriptor_bytes=)", file=url)
    try:
        buf = _call(url, "read the descriptor", fs.cat_file, path)
    except FileNotFoundError:
        raise FileNotFoundError(f"{url}: no such file") from None
    return read_json_bytes(buf, file=url, limits=limits, fast=fast)


class RemoteReader(TensorMapping):
    """A Reader over a remote TensorList: the interface of :class:`tensorlist.Reader`.

    Tensors are fetched when asked for (``r["w"]``, ``r.get_many([...])``,
    ``to_dict()``) as read-only numpy arrays; nothing is mapped.

    Args:
        url: the descriptor's URL.
        pointer, allow_outside, max_descriptor_bytes, max_tensors, max_total_bytes, bits: as for Reader.
        storage_options: passed to fsspec (credentials, endpoint...).
        mmap: True or False (the default True is accepted for compatibility:
            remote data is always read): read-only arrays. ``"copy"``:
            writable private copies (each fetched range copied once more, into
            64-byte aligned memory); writes never reach the store. Anything
            else is a ValueError.
        key: as for Reader: checked at once; tensors are decrypted after
            their ranged reads, into private writable memory.
    """

    def __init__(self, url: str, *, pointer: Optional[str] = None, mmap=True, allow_outside: bool = False,
                 max_descriptor_bytes: Optional[int] = None, max_tensors: Optional[int] = None,
                 max_total_bytes: Optional[int] = None, storage_options: Optional[dict] = None, bits: bool = False,
                 key=None, _document=None):
        self.path = url
        self._mode = read_mode(mmap)
        self._document = _document  # load_document: the document already read, lists chosen by pointer
        self._limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
        self._bits = bool(bits)
        self.fs, self._fspath = _filesystem(url, storage_options)
        self._closed = False
        self._index: Optional[Dict[str, int]] = None
        last: Optional[Exception] = None
        for _ in range(3):  # a concurrent save may replace the descriptor and delete the old data
            desc = self._read_descriptor(pointer, allow_outside)
            self.data_path = _join(self.fs, self._fspath, desc.location)
            if desc.byte_length == 0:
                break
            try:
                size = _call(url, "read the data object's size", self.fs.size, self.data_path)
            except FileNotFoundError as e:
                last = e
                continue
            check_data_size(desc, size, _url_of(self.fs, self.data_path))
            break
        else:
            raise FormatError(f"data object {_url_of(self.fs, self.data_path)!r} does not exist", file=url,
                              field=f"{desc.pointer}/location" if desc.pointer else "location") from last
        self._opener = opener_for(desc, key, url)  # the one key= rule, as a local Reader's
        if self._opener is not None:
            desc = desc._replace(metadata=self._opener.metadata)
        self.descriptor: ListDescriptor = desc

    @property
    def encrypted(self) -> bool:
        """Whether the list is encrypted (its metadata reads as None until opened with its key)."""
        return self.descriptor.encryption is not None

    def require_key(self) -> None:
        """Raises ``EncryptionError`` naming the URL if the list is encrypted and was opened without its key."""
        if self.descriptor.encryption is not None and self._opener is None:
            raise locked(self.path)

    def _read_tags(self, offset: int, n: int) -> bytes:
        base = self.descriptor.byte_offset
        return bytes(self._read_ranges([base + offset], [base + offset + n], lambda k: None)[0])

    def _read_descriptor(self, pointer, allow_outside) -> ListDescriptor:
        doc = self._document
        if doc is None:
            doc = _read_document(self.fs, self._fspath, self.path, self._limits, fast=True)
        obj, ptr = select_list(doc, pointer, self.path)
        return parse_list(obj, file=self.path, pointer=ptr, base_dir=None, allow_outside=allow_outside,
                          limits=self._limits)

    # --- the Reader interface ----------------------------------------------------
    def _fetch(self, positions: List[int], bits: Optional[bool] = None) -> List[np.ndarray]:
        """Tensors ``positions``, fetched in merged ranges; ``bits`` (the Reader's choice when None): carriers."""
        bits = self._bits if bits is None else bits
        if self._closed:
            raise ValueError("I/O operation on a closed Reader")
        self.require_key()
        table, base = self.descriptor.tensors, self.descriptor.byte_offset
        todo = sorted({i for i in positions if table.lengths[i]}, key=lambda i: table.offsets[i])
        # neighbours (only alignment padding between them) are fetched as one range: a million
        # tiny tensors must not be a million requests
        groups: List[List[int]] = []
        for i in todo:
            if groups:
                last = groups[-1]
                g_start = table.offsets[last[0]]
                g_end = table.offsets[last[-1]] + table.lengths[last[-1]]
                if table.offsets[i] - g_end <= MERGE_GAP and table.offsets[i] + table.lengths[i] - g_start <= MAX_RANGE:
                    last.append(i)
                    continue
            groups.append([i])
        starts = [base + table.offsets[g[0]] for g in groups]
        ends = [base + table.offsets[g[-1]] + table.lengths[g[-1]] for g in groups]
        blobs = self._read_ranges(starts, ends, lambda k: groups[k][0])
        got: Dict[int, memoryview] = {}
        for g, s, b in zip(groups, starts, blobs):
            if self._mode is ReadMode.COPY and self._opener is None:
                b, src = lowlevel.alloc(len(b)), b
                b[:] = np.frombuffer(src, np.uint8)
            view = memoryview(b)
            for i in g:
                o = base + table.offsets[i] - s
                got[i] = view[o:o + table.lengths[i]]
        if self._opener is not None:  # ciphertext fetched: decrypted by the local reader's Opener
            got = {i: memoryview(a) for i, a in open_fetched(self._opener, table, todo, got, self._read_tags).items()}
        out = []
        for i in positions:
            try:
                row = table.dtypes[i]
                dt = row.bits if bits else row.numpy
            except UnsupportedDTypeError as e:
                raise unsupported_dtype(self.descriptor, e, i) from None
            shape = table.shapes[i]
            try:
                if i in got:
                    out.append(np.frombuffer(got[i], dtype=dt).reshape(shape))
                else:
                    a = np.empty(shape, dtype=dt)
                    a.flags.writeable = self._mode is ReadMode.COPY
                    out.append(a)
            except ValueError as e:
                raise too_many_dims(self.descriptor, i, e) from None
        return out

    def _read_ranges(self, starts: List[int], ends: List[int], tensor_of: Callable[[int], Optional[int]]) -> list:
        """The data object's bytes ``[starts[k], ends[k])``, each whole; ``tensor_of(k)`` names range k in errors.

        Raises:
            FormatError: the object is shorter than a range (truncated meanwhile).
            RemoteError: the store refused a read.
        """
        table = self.descriptor.tensors

        def truncated(k, detail, cause=None):
            i = tensor_of(k)
            raise FormatError(f"data object was truncated while reading ({detail})", file=self.path,
                              tensor_index=i, tensor_name=table[i].name if i is not None else None) from cause

        def past_end(cause):
            # S3 answers a range past the end with 416, not with fewer bytes: say "truncated"
            # as the local pread reader and the short-read check below do
            size = self._size_now()
            for k, end in enumerate(ends):
                if size is not None and end > size:
                    truncated(k, f"{size} bytes left, {end} needed", cause)

        try:
            blobs = self._ranges(starts, ends) if starts else []
        except RemoteError as e:
            past_end(e)
            raise
        for k, (s, e, b) in enumerate(zip(starts, ends, blobs)):
            if isinstance(b, BaseException):  # older fsspec (2023.5) returns a range's error despite on_error="raise"
                past_end(b)
                i = tensor_of(k)
                what = f"tensor {table.keys()[i]!r}" if i is not None else f"bytes {s}-{e}"
                raise RemoteError(f"{self.path}: cannot read {what}: {_oneline(b)}") from b
            if len(b) != e - s:
                truncated(k, f"{len(b)} of {e - s} bytes")
        return blobs

    def readinto(self, buffer, offset: int = 0) -> None:
        """Copies the list's raw bytes at ``offset`` into the writable ``buffer``, filling it.

        As :meth:`tensorlist.Reader.readinto`: ``offset`` counts from the
        list's first byte. The range is fetched as concurrent ranged reads.
        """
        if self._closed:
            raise ValueError("I/O operation on a closed Reader")
        desc = self.descriptor
        dst, start = region_target(desc, buffer, offset)
        if desc.encryption is not None and len(dst):  # the tensors' plaintext; padding reads as zeros
            lo, hi, table = start - desc.byte_offset, start - desc.byte_offset + len(dst), desc.tensors
            inside = [i for i, (o, n) in enumerate(zip(table.offsets, table.lengths)) if n and o < hi and lo < o + n]
            dst[:] = 0
            for i, a in zip(inside, self._fetch(inside, bits=True)):
                o = table.offsets[i]
                s, e = max(lo, o), min(hi, o + table.lengths[i])
                dst[s - lo:e - lo] = bytes_view(a)[s - o:e - o]
            return
        starts = list(range(start, start + len(dst), READINTO_PART))
        ends = [min(s + READINTO_PART, start + len(dst)) for s in starts]
        blobs = self._read_ranges(starts, ends, lambda k: first_tensor_in(desc, starts[k], ends[k]))
        for s, b in zip(starts, blobs):
            dst[s - start:s - start + len(b)] = np.frombuffer(b, np.uint8)

    def _size_now(self) -> Optional[int]:
        """The data object's size as the store sees it now (not fsspec's cached listing), or None."""
        try:
            self.fs.invalidate_cache(self.data_path)
        except Exception:
            pass
        try:
            return self.fs.size(self.data_path)
        except Exception:
            return None

    def _ranges(self, starts: List[int], ends: List[int]) -> list:
        """The byte ranges of the data object, fetched concurrently."""
        fs, path = self.fs, self.data_path
        if getattr(fs, "async_impl", False) or len(starts) == 1:
            return _call(self.path, "read tensor data", fs.cat_ranges, [path] * len(starts), starts, ends,
                         on_error="raise")
        # a synchronous filesystem (hdfs, memory, local) reads one range at a time: use threads
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(min(16, len(starts))) as pool:
            return list(pool.map(lambda se: _call(self.path, "read tensor data", fs.cat_file, path, se[0], se[1]),
                                 zip(starts, ends)))

    def __getitem__(self, key) -> np.ndarray:
        return self._fetch([self._position(key)])[0]

    def get_many(self, keys: Iterable) -> Dict[str, np.ndarray]:
        """Several tensors in one batch of parallel ranged reads, keyed as given."""
        keys = list(keys)
        return dict(zip(keys, self._fetch([self._position(k) for k in keys])))

    def items(self):
        return list(self.to_dict().items())

    def values(self):
        return list(self.to_dict().values())

    def to_dict(self) -> Dict[str, np.ndarray]:
        keys = self.keys()
        return dict(zip(keys, self._fetch(list(range(len(keys))))))

    def verify(self, keys=None) -> int:
        """Fetches the tensors and checks their stored CRC32Cs; returns how many were checked (as bit
        carriers: bfloat16/float8 need no ml_dtypes)."""
        keys = self.keys() if keys is None else list(keys)
        infos = [self.info(k) for k in keys]
        if self.descriptor.encryption is not None:  # every chunk's tag, at most 64 MiB fetched at a time
            group, size = [], 0
            for n, t in enumerate(infos, 1):
                group.append(t.index)
                size += t.byte_length
                if size >= 1 << 26 or n == len(infos):
                    self._fetch(group, bits=True)
                    group, size = [], 0
            return len(infos)
        infos = [t for t in infos if t.crc32c is not None]
        return check_crcs(infos, self._fetch([t.index for t in infos], bits=True), self.path)

    def close(self) -> None:
        self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __repr__(self) -> str:
        return f"<tensorlist.RemoteReader {self.path!r}: {len(self)} tensors, {self.descriptor.byte_length} bytes>"


def open(url: str, **kwargs) -> RemoteReader:  # noqa: A001 - mirrors tensorlist.open
    """Opens a remote TensorList lazily (see :class:`RemoteReader`); a file:// URL opens a local Reader."""
    local = _backends.local_path(url)
    return RemoteReader(url, **kwargs) if local is None else reader.Reader(local, **kwargs)


def load(url: str, *, verify: bool = False, **kwargs) -> Dict[str, np.ndarray]:
    """Every tensor of a remote TensorList, fetched in parallel ranged reads."""
    with open(url, **kwargs) as r:
        if verify:
            r.verify()
        return r.to_dict()


# --- writing: streamed, data object first, descriptor last ------------------------------

#: Part size of a streamed upload (fsspec ``block_size``; S3 multipart parts are at least 5 MiB):
#: what one save holds in memory besides the caller's arrays.
STREAM_BLOCK = 16 << 20
#: Bytes byte-swapped or copied at a time while streaming a big-endian array.
_CHUNK = 4 << 20
_ZEROS = bytes(1 << 16)


class _DataStream:
    """The data object of one remote save, uploaded as it is written (multipart), under a fresh name.

    lamp mode keeps lamp's fixed name ``<base>.data``: as locally, a reader of
    the old descriptor may then meet the new data once the upload completes.
    """

    def __init__(self, fs, path: str, url: str, lamp: bool):
        self.fs, self.url, self.lamp = fs, url, lamp
        self.folder, self.base = posixpath.split(path)
        if not self.base:
            raise ValueError(f"{url!r} names a directory, not a file")
        self.data_name = f"{self.base}.data" if lamp else f"{self.base}.{new_token()}.data"
        self.data_path = posixpath.join(self.folder, self.data_name)
        if self.folder:
            try:
                fs.makedirs(self.folder, exist_ok=True)
            except Exception:
                pass  # object stores have no directories; the upload says if the place is bad
        self.f = _call(url, f"open the data object {self.data_name!r}", fs.open, self.data_path, "wb",
                       block_size=STREAM_BLOCK)
        self.pos = 0

    def write(self, data) -> None:
        _call(self.url, "upload tensor data", self.f.write, data)
        self.pos += len(data)

    def pad_to(self, offset: int) -> None:
        while self.pos < offset:
            self.write(_ZEROS[:min(len(_ZEROS), offset - self.pos)])

    def write_item(self, item: Item, offset: int, crc: bool) -> Optional[int]:
        """Writes one prepared tensor at ``offset`` (little-endian); its CRC32C when asked."""
        if not item.nbytes:  # nothing to write (a trailing one's rounded offset may lie past the list)
            return 0 if crc else None
        self.pad_to(offset)
        c = 0
        raw = item.array.reshape(-1).view(np.uint8)
        if item.swap:
            elems = raw.reshape(-1, item.swap)
            step = max(1, _CHUNK // item.swap)
            for i in range(0, len(elems), step):
                piece = np.ascontiguousarray(elems[i:i + step, ::-1]).reshape(-1)
                self.write(memoryview(piece))
                if crc:
                    c = lowlevel.crc32c(piece, c)
        else:
            view = memoryview(raw)
            for i in range(0, len(view), STREAM_BLOCK):
                piece = view[i:i + STREAM_BLOCK]
                self.write(piece)
                if crc:
                    c = lowlevel.crc32c(piece, c)
        return c if crc else None

    def copy_from(self, local_path: str, length: int) -> None:
        """Appends ``length`` bytes of a local file (a spool), a block at a time."""
        with builtins.open(local_path, "rb") as f:
            left = length
            while left:
                block = f.read(min(left, STREAM_BLOCK))
                if not block:
                    raise EOFError(f"{local_path}: spool ended early")
                self.write(block)
                left -= len(block)

    def finish(self) -> None:
        _call(self.url, f"complete the upload of {self.data_name!r}", self.f.close)

    def discard(self) -> None:
        """Abandons the upload; a fresh-named object that got written anyway is removed."""
        try:
            if hasattr(self.f, "discard"):
                self.f.discard()  # aborts a multipart upload: nothing becomes visible
                self.f.closed = True  # else its __del__ would try to finish the discarded upload
            elif not self.lamp:
                self.f.close()  # a fresh name: whatever it commits is removed below
            # lamp's fixed name without discard(): never closed, never committed over the old data
        except Exception:
            pass
        if not self.lamp:  # lamp's fixed name may be the old descriptor's data: leave it
            try:
                self.fs.rm_file(self.data_path)
            except Exception:
                pass


def _old_locations(fs, path: str, base: str) -> List[str]:
    """Data objects of the descriptor being replaced that this library named (safe to delete)."""
    try:
        doc = _read_document(fs, path, path, Limits())
    except Exception:
        return []
    return own_locations(doc, base)


def _commit(fs, path: str, url: str, text: str, data_name: str, keep=()) -> None:
    """Uploads the descriptor (the commit point), then removes the old descriptor's data objects."""
    base = posixpath.basename(path)
    old = _old_locations(fs, path, base)
    _call(url, "upload the descriptor", fs.pipe_file, path, text.encode("utf-8"))
    keep = set(keep) | {data_name}
    for loc in old:
        if loc not in keep:
            try:
                fs.rm_file(posixpath.join(posixpath.dirname(path), loc))
            except Exception:
                pass


def _plan_lists(lists, alignment: int, lamp: bool):
    """[(start, offsets, length)] of prepared lists one after another at 4096-aligned offsets.

    Planned before the upload opens, so that a refusal (lamp's layout) touches nothing.
    """
    plan, end = [], 0
    for items in lists:
        start = align(end, LIST_ALIGNMENT)
        offsets, length = layout(items, start, alignment, lamp)
        plan.append((start, offsets, length))
        end = start + length
    return plan


def _stream_lists(stream: _DataStream, lists, plan, checksum: bool):
    """Streams prepared lists where ``plan`` puts them: [(start, offsets, length, crcs)]."""
    out = []
    for items, (start, offsets, length) in zip(lists, plan):
        crcs = [stream.write_item(it, start + off, checksum) for it, off in zip(items, offsets)]
        stream.pad_to(start + length)
        out.append((start, offsets, length, crcs if checksum else None))
    return out


def save(url: str, tensors, *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
         lamp: bool = False, durable: bool = True, threads: Optional[int] = None,
         storage_options: Optional[dict] = None, key=None) -> None:
    """``tensorlist.save`` to a URL, streamed: the data object is uploaded as it is written, descriptor last.

    Nothing is staged on local disk: each tensor's bytes go to the upload
    (multipart, ``STREAM_BLOCK`` at a time) and its CRC32C is computed on the
    way. A failure before the descriptor upload abandons the new data object
    and leaves the previous file readable.

    Args:
        url: where the descriptor goes (the data object is written beside it).
        storage_options: passed to fsspec.
        metadata, alignment, checksum, lamp, key: as :func:`tensorlist.save` (with ``key`` each
            window of ciphertext is sealed, ``threads`` at a time, before it is uploaded).
        durable: accepted for the local API's sake; an object store's upload
            is durable when it completes.
    """
    key = check_key_use(key, lamp)
    local = _backends.local_path(url)
    if local is not None:
        return writer.save(local, tensors, metadata=metadata, alignment=alignment, checksum=checksum, lamp=lamp,
                           durable=durable, threads=threads, key=key)
    alignment = MIN_TENSOR_ALIGNMENT if lamp else check_alignment(alignment)
    metadata = check_metadata(metadata, lamp)
    fs, path = _filesystem(url, storage_options)
    items, _ = prepare(tensors, url)
    plan = _plan_lists([items], alignment, lamp)
    stream = _DataStream(fs, path, url, lamp)
    try:
        if key is not None:
            seal = Seal(key, threads)
            offsets, length = seal.stream_list(stream.pad_to, stream.write, items, 0, alignment)
            stream.finish()
            text = descriptor_text(seal.list_descriptor(items, offsets, stream.data_name, 0, length, metadata), False)
            _commit(fs, path, url, text, stream.data_name)
            return
        [(_, offsets, length, crcs)] = _stream_lists(stream, [items], plan, checksum and not lamp)
        stream.finish()
        if lamp:
            text = descriptor_text(descriptor(tensor_entries(items, offsets, None, True), stream.data_name, 0,
                                              length, None, True), True)
        else:
            text = fast_descriptor_text(items, offsets, crcs, stream.data_name, length, metadata)
        _commit(fs, path, url, text, stream.data_name)
    except BaseException:
        stream.discard()
        raise


class RemoteWriter(WriterBase):
    """``tensorlist.Writer`` to a URL: each ``add`` is uploaded as it comes (multipart), descriptor last.

    The interface (``add``, ``reserve``, ``close``/``commit``, ``abort``, the
    context manager) is :class:`tensorlist.Writer`'s. An object store cannot
    be written in place, so ``reserve`` returns an array in memory, uploaded at
    ``close``; tensors added after the first ``reserve`` are spooled to a local
    temporary file until then (they must follow it in the data object). With
    ``key`` only ciphertext reaches the upload or the spool: reserved arrays
    are sealed at ``close``.
    """

    def __init__(self, url: str, *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT,
                 checksum: bool = True, lamp: bool = False, durable: bool = True, threads: Optional[int] = None,
                 storage_options: Optional[dict] = None, key=None):
        self.url = url
        key = check_key_use(key, lamp)
        self._setup(url, metadata, alignment, checksum and key is None, lamp)
        self._seal = Seal(key, threads) if key is not None else None
        self.fs, self._fspath = _filesystem(url, storage_options)
        self._stream = _DataStream(self.fs, self._fspath, url, lamp)
        self._spool: Optional[Tuple[str, int, int]] = None  # (temp dir, fd, data offset of its byte 0)

    @property
    def path(self) -> str:
        return self.url

    def _write(self, item: Item, offset: int) -> Optional[int]:
        sealer = self._seal.sealer if self._seal is not None else None
        if self._spool is None:
            if sealer is None:
                return self._stream.write_item(item, offset, self.checksum)
            self._stream.pad_to(offset)
            sealer.stream(len(self._book), le_bytes(item.array, item.swap), self._stream.write)
            return None
        tmp, fd, base = self._spool
        if sealer is not None:
            sealer.write(fd, [(len(self._book), le_bytes(item.array, item.swap), offset - base)], tmp)
            return None
        crcs = lowlevel.write_items(fd, [item.array], [offset - base], [item.swap], max(0, self._book.end - base),
                                     offset - base + item.nbytes, crc=self.checksum, fsync=False, sparse=False,
                                     path=tmp)
        return crcs[0] if crcs is not None else None

    def _reserve(self, shape, dt, nbytes: int, offset: int):
        if self._spool is None:  # what follows must wait for this array: spool it
            tmp = tempfile.mkdtemp(prefix="tensorlist-spool-")
            fd = os.open(os.path.join(tmp, "spool"), os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            self._spool = (tmp, fd, offset)
        return np.zeros(shape, dtype=dt.numpy), None

    def _finish(self, length: int, reserved) -> None:
        if self._spool is not None:
            tmp, fd, base = self._spool
            for idx, offset, arr, _ in reserved:
                if arr.size and self._seal is not None:
                    self._seal.sealer.write(fd, [(idx, le_bytes(arr, 0), offset - base)], tmp)
                elif arr.size:
                    os.pwrite(fd, arr.reshape(-1).view(np.uint8), offset - base)
            os.ftruncate(fd, length - base)
            self._stream.pad_to(base)
            self._stream.copy_from(os.path.join(tmp, "spool"), length - base)
        self._stream.pad_to(length)
        name = self._stream.data_name
        if self._seal is not None:  # the empty tensors' tags, then the tag region
            self._seal.seal_missing(len(self._book))
            tags = self._seal.tag_region(len(self._book), length)
            self._stream.write(tags)
            text = descriptor_text(self._seal.descriptor(self._book.entries, name, 0, length + len(tags),
                                                         self.metadata), False)
        else:
            text = self._descriptor_text(name, length)
        self._stream.finish()
        _commit(self.fs, self._fspath, self.url, text, name)
        self._drop_spool()

    def _drop_spool(self) -> None:
        if self._spool is not None:
            tmp, fd, _ = self._spool
            os.close(fd)
            shutil.rmtree(tmp, ignore_errors=True)
            self._spool = None

    def _discard(self) -> None:
        self._stream.discard()
        self._drop_spool()


def save_document(url: str, document: Any, *, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True,
                  durable: bool = True, threads: Optional[int] = None,
                  storage_options: Optional[dict] = None, key=None) -> Any:
    """``tensorlist.save_document`` to a URL: every list streamed into one data object, the document last."""
    key = check_key_use(key, False)
    local = _backends.local_path(url)
    if local is not None:
        return writer.save_document(local, document, alignment=alignment, checksum=checksum, durable=durable,
                                    threads=threads, key=key)
    check_alignment(alignment)
    found = writer.document_lists(document, url)
    fs, path = _filesystem(url, storage_options)
    lists = [items for _, items, _ in found]
    plan = _plan_lists(lists, alignment, False)
    stream = _DataStream(fs, path, url, False)
    try:
        layout_, descs = None, []
        for (_, items, meta) in (found if key is not None else ()):  # each list its own salt
            seal, start = Seal(key, threads), align(stream.pos, LIST_ALIGNMENT)
            offsets, length = seal.stream_list(stream.pad_to, stream.write, items, start, alignment)
            descs.append(seal.list_descriptor(items, offsets, stream.data_name, start, length, meta))
        if key is None:
            layout_ = _stream_lists(stream, lists, plan, checksum)
        stream.finish()
        written, kept = writer.document_with_descriptors(document, found, layout_, stream.data_name,
                                                         descs if key is not None else None)
        _commit(fs, path, url, dumps(written) + "\n", stream.data_name, keep=kept)
    except BaseException:
        stream.discard()
        raise
    return written


def load_document(url: str, *, mmap=True, allow_outside: bool = False,
                  max_descriptor_bytes: Optional[int] = None, max_tensors: Optional[int] = None,
                  max_total_bytes: Optional[int] = None, storage_options: Optional[dict] = None, key=None):
    """``tensorlist.load_document`` from a URL: the document once, then each list's tensors in ranged reads."""
    mmap = read_mode(mmap)
    local = _backends.local_path(url)
    if local is not None:
        return reader.load_document(local, mmap=mmap, allow_outside=allow_outside,
                                    max_descriptor_bytes=max_descriptor_bytes, max_tensors=max_tensors,
                                    max_total_bytes=max_total_bytes, key=key)
    limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
    fs, path = _filesystem(url, storage_options)
    doc = _read_document(fs, path, url, limits)
    for ptr in find_tensor_lists(doc):
        with RemoteReader(url, pointer=ptr, mmap=mmap, allow_outside=allow_outside,
                          max_descriptor_bytes=max_descriptor_bytes, max_tensors=max_tensors,
                          max_total_bytes=max_total_bytes, storage_options=storage_options, key=key,
                          _document=doc) as r:
            tensors = r.to_dict()
        if ptr == "":
            return tensors
        doc = set_at_pointer(doc, ptr, tensors)
    return doc


def validate(url: str, *, pointer: Optional[str] = None, check_data: bool = True, verify: bool = False,
             allow_outside: bool = False, max_descriptor_bytes: Optional[int] = None,
             max_tensors: Optional[int] = None, max_total_bytes: Optional[int] = None,
             storage_options: Optional[dict] = None, key=None) -> List[ListDescriptor]:
    """``tensorlist.validate`` of a URL: the document once, the schema and rules, then each data object.

    ``check_data`` checks that each list's data object exists and is long
    enough (and ``key`` against each encrypted list); ``verify`` also fetches
    the tensors and checks their CRC32Cs (or, encrypted, every chunk's tag).
    """
    limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
    fs, path = _filesystem(url, storage_options)
    doc = _read_document(fs, path, url, limits, fast=True)
    descs = schema.validate(doc, pointer=pointer, check_data=False, allow_outside=allow_outside,
                            max_descriptor_bytes=max_descriptor_bytes, max_tensors=max_tensors,
                            max_total_bytes=max_total_bytes, source=url)
    if check_data or verify:
        for d in descs:
            with RemoteReader(url, pointer=d.pointer, allow_outside=allow_outside,
                              max_descriptor_bytes=max_descriptor_bytes, max_tensors=max_tensors,
                              max_total_bytes=max_total_bytes, storage_options=storage_options, key=key,
                              _document=doc) as r:
                if verify:
                    r.verify()
    return descs


_backends.register("reader", RemoteReader)
_backends.register("validate", validate)
_backends.register("writer", RemoteWriter)
_backends.register("save", save)
_backends.register("load_document", load_document)
_backends.register("save_document", save_document)
