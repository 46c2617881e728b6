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

Writes build the files in a local temporary directory, upload the data
object (under a fresh unique name, as a local save does), then the
descriptor last: a failed upload never leaves a descriptor that points at
missing data. The data object of the replaced descriptor is deleted after
the new descriptor is in place. (lamp mode keeps lamp's fixed data name, so
as locally there is a window in which the old descriptor meets new data.)

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
from typing import Dict, Iterable, List, Optional

import numpy as np

from . import _backends, reader, writer
from ._backends import is_url
from ._commit import own_locations
from ._datafile import check_crcs
from ._jsonio import loads_strict, resolve_pointer
from .errors import FormatError, TensorListError
from .format import Limits, ListDescriptor, check_data_size, find_tensor_lists, parse_list, read_json_bytes, select_list
from .reader import TensorMapping

__all__ = ["is_url", "RemoteError", "RemoteReader", "RemoteWriter", "open", "load", "save"]

#: Tensors closer than this are fetched in one ranged read (the padding between them is read too).
MERGE_GAP = 64 << 10
#: Largest single ranged read when tensors are merged.
MAX_RANGE = 64 << 20

class RemoteError(TensorListError, OSError):
    """A remote store could not be reached or refused an operation."""


def _filesystem(url: str, storage_options: Optional[dict]):
    try:
        import fsspec
    except ImportError as e:
        raise ImportError(f"{url}: remote URLs need fsspec: pip install 'tensorlist[remote]'") from e
    try:
        return fsspec.core.url_to_fs(url, **(storage_options or {}))
    except ImportError as e:
        raise ImportError(f"{url}: {e}") from None
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


class RemoteReader(TensorMapping):
    """A Reader over a remote TensorList: the interface of :class:`tensorlist.Reader`.

    Tensors are fetched when asked for (``r["w"]``, ``r.get_many([...])``,
    ``to_dict()``) as read-only numpy arrays; nothing is mapped.

    Args:
        url: the descriptor's URL.
        pointer, allow_outside, max_descriptor_bytes, max_tensors, max_total_bytes: as for Reader.
        storage_options: passed to fsspec (credentials, endpoint...).
        mmap: accepted for compatibility; remote data is always read.
    """

    def __init__(self, url: str, *, pointer: Optional[str] = None, mmap: bool = True, allow_outside: bool = False,
                 max_descriptor_bytes: Optional[int] = None, max_tensors: Optional[int] = None,
                 max_total_bytes: Optional[int] = None, storage_options: Optional[dict] = None):
        self.path = url
        self._limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
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
        self.descriptor: ListDescriptor = desc

    def _read_descriptor(self, pointer, allow_outside) -> ListDescriptor:
        url, fs, path = self.path, self.fs, self._fspath
        try:
            fs.invalidate_cache(path)  # a listing cached by fsspec may predate the last save
        except Exception:
            pass
        try:
            size = _call(url, "read the descriptor's size", fs.size, path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: no such file") from None
        if size is not None and size > self._limits.max_descriptor_bytes:
            raise FormatError(f"descriptor is {size} bytes, above the limit of {self._limits.max_descriptor_bytes} "
                              "(raise it with max_descriptor_bytes=)", file=url)
        try:
            buf = _call(url, "read the descriptor", fs.cat_file, path)
        except FileNotFoundError:
            raise FileNotFoundError(f"{url}: no such file") from None
        doc = read_json_bytes(buf, file=url, limits=self._limits, fast=True)
        obj, ptr = select_list(doc, pointer, url)
        return parse_list(obj, file=url, pointer=ptr, base_dir=None, allow_outside=allow_outside,
                          limits=self._limits)

    # --- the Reader interface ----------------------------------------------------
    def _fetch(self, positions: List[int]) -> List[np.ndarray]:
        if self._closed:
            raise ValueError("I/O operation on a closed Reader")
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
        try:
            blobs = self._ranges(starts, ends) if groups else []
        except RemoteError as e:
            # S3 answers a range past the end with 416, not with fewer bytes: say "truncated"
            # as the local pread reader and the short-read check below do
            size = self._size_now()
            for g, end in zip(groups, ends):
                if size is not None and end > size:
                    raise FormatError(f"data object was truncated while reading ({size} bytes left, "
                                      f"{end} needed)", file=self.path, tensor_index=g[0],
                                      tensor_name=table[g[0]].name) from e
            raise
        got: Dict[int, memoryview] = {}
        for g, s, e, b in zip(groups, starts, ends, blobs):
            if isinstance(b, BaseException):
                raise RemoteError(f"{self.path}: cannot read tensor {table.keys()[g[0]]!r}: {_oneline(b)}") from b
            if len(b) != e - s:
                raise FormatError(f"data object was truncated while reading ({len(b)} of {e - s} bytes)",
                                  file=self.path, tensor_index=g[0], tensor_name=table[g[0]].name)
            view = memoryview(b)
            for i in g:
                o = base + table.offsets[i] - s
                got[i] = view[o:o + table.lengths[i]]
        out = []
        for i in positions:
            dt, shape = table.dtypes[i].numpy, table.shapes[i]
            if i in got:
                out.append(np.frombuffer(got[i], dtype=dt).reshape(shape))
            else:
                a = np.empty(shape, dtype=dt)
                a.flags.writeable = False
                out.append(a)
        return out

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
        """Fetches the tensors and checks their stored CRC32Cs; returns how many were checked."""
        keys = self.keys() if keys is None else list(keys)
        infos = [self.info(k) for k in keys]
        infos = [t for t in infos if t.crc32c is not None]
        return check_crcs(infos, self._fetch([t.index for t in infos]), self.path)

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


# --- writing -----------------------------------------------------------------------

def _old_locations(fs, path: str, base: str) -> List[str]:
    """Data objects of the descriptor being replaced that this library named (safe to delete)."""
    try:
        doc = read_json_bytes(fs.cat_file(path), file=path)
    except Exception:
        return []
    return own_locations(doc, base)


def _upload(fs, path: str, url: str, local_desc: str) -> None:
    """Uploads a local save: the data object first, the descriptor last, then removes the old data."""
    with builtins.open(local_desc, "rb") as f:
        text = f.read()
    doc = loads_strict(text, file=local_desc)
    locations = sorted({resolve_pointer(doc, p)["location"] for p in find_tensor_lists(doc)})
    base = posixpath.basename(path)
    old = _old_locations(fs, path, base)
    folder = posixpath.dirname(path)
    if folder:
        try:
            fs.makedirs(folder, exist_ok=True)
        except Exception:
            pass  # object stores have no directories; the upload says if the place is bad
    uploaded = []
    try:
        for loc in locations:
            target = posixpath.join(folder, loc)
            _call(url, f"upload the data object {loc!r}", fs.put_file,
                  os.path.join(os.path.dirname(local_desc), loc), target)
            uploaded.append(target)
        _call(url, "upload the descriptor", fs.pipe_file, path, text)  # the commit point
    except BaseException:
        for target in uploaded:
            if posixpath.basename(target) in old:
                continue  # lamp's fixed name: it was the old descriptor's data too
            try:
                fs.rm_file(target)
            except Exception:
                pass
        raise
    for loc in old:
        if loc not in locations:
            try:
                fs.rm_file(posixpath.join(folder, loc))
            except Exception:
                pass


def save(url: str, tensors, *, storage_options: Optional[dict] = None, **kwargs) -> None:
    """``tensorlist.save`` to a URL: written locally, then uploaded data first, descriptor last.

    Args:
        url: where the descriptor goes (the data object is written beside it).
        storage_options: passed to fsspec.
        **kwargs: those of :func:`tensorlist.save`.
    """
    local = _backends.local_path(url)
    if local is not None:
        return writer.save(local, tensors, **kwargs)
    fs, path = _filesystem(url, storage_options)
    base = posixpath.basename(path)
    if not base:
        raise ValueError(f"{url!r} names a directory, not a file")
    tmp = tempfile.mkdtemp(prefix="tensorlist-upload-")
    try:
        local = os.path.join(tmp, base)
        writer.save(local, tensors, **kwargs)
        _upload(fs, path, url, local)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class RemoteWriter:
    """``tensorlist.Writer`` to a URL: tensors go to a local temporary file, uploaded on commit.

    The interface (``add``, ``reserve``, ``close``/``commit``, ``abort``, the
    context manager) is :class:`tensorlist.Writer`'s.
    """

    def __init__(self, url: str, *, storage_options: Optional[dict] = None, **kwargs):
        self.url = url
        self.fs, self._fspath = _filesystem(url, storage_options)
        base = posixpath.basename(self._fspath)
        if not base:
            raise ValueError(f"{url!r} names a directory, not a file")
        self._tmp = tempfile.mkdtemp(prefix="tensorlist-upload-")
        self._local = os.path.join(self._tmp, base)
        try:
            self._writer = writer.Writer(self._local, **kwargs)
        except BaseException:
            shutil.rmtree(self._tmp, ignore_errors=True)
            raise
        self._state = "open"

    @property
    def path(self) -> str:
        return self.url

    def __len__(self) -> int:
        return len(self._writer)

    def add(self, name_or_value, value=None) -> None:
        self._writer.add(name_or_value, value)

    def reserve(self, name_or_shape, shape=None, dtype=None) -> np.ndarray:
        return self._writer.reserve(name_or_shape, shape, dtype)

    def close(self) -> None:
        if self._state == "committed":
            return
        if self._state != "open":
            raise ValueError(f"Writer for {self.url} is {self._state}")
        try:
            self._writer.close()
            _upload(self.fs, self._fspath, self.url, self._local)
        except BaseException:
            self.abort()
            raise
        self._state = "committed"
        shutil.rmtree(self._tmp, ignore_errors=True)

    commit = close

    def abort(self) -> None:
        if self._state == "open":
            self._writer.abort()
            self._state = "aborted"
            shutil.rmtree(self._tmp, ignore_errors=True)

    def __enter__(self) -> "RemoteWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


# --- the URL backend -------------------------------------------------------------------

def _local_only(operation: str):
    def handler(url: str, *args, **kwargs):
        raise ValueError(f"{url}: {operation} takes local paths and file:// URLs, not remote URLs")
    return handler


_backends.register("reader", RemoteReader)
_backends.register("writer", RemoteWriter)
_backends.register("save", save)
_backends.register("load_document", _local_only("load_document"))
_backends.register("save_document", _local_only("save_document"))
