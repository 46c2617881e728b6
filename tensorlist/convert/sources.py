"""Sources: each format's reader, giving a :class:`~tensorlist.convert.formats.Source` of lazy entries.

Every local file is opened through :func:`tensorlist.format.open_regular` (a
FIFO or device is refused by name instead of blocking), JSON is read through
the capped :func:`tensorlist.format.read_json_file`, Hugging Face shards are
confined to the index's directory as data files are to their descriptor's
(:func:`tensorlist.format.check_data_path`), and torch tensors cross to numpy
only through ``tensorlist._torch_bridge``, imported when a torch file is read.
"""
from __future__ import annotations

import json
import math
import mmap
import os
import struct
import zipfile
from typing import Any, Dict, Iterator, List, Optional, Tuple

import numpy as np

from .. import _dtypes
from .._backends import is_remote, localize
from .._jsonio import loads_strict
from ..errors import FormatError
from ..format import ListDescriptor, check_data_path, check_location, open_regular, read_json_file
from ..reader import Reader
from .formats import MAX_SAFETENSORS_HEADER, NPZ_SIDECAR, RAW_DTYPES, ST_DTYPES, Entry, Source, check_format, \
    infer_format

__all__ = ["open_source", "SafetensorsFile"]


def open_source(path, fmt: Optional[str] = None, *, allow_outside: bool = False,
                pointer: Optional[str] = None) -> Source:
    """Opens ``path`` as a :class:`Source` (lazily: tensors are read when asked for).

    Args:
        path: a path (or, for tensorlist/lamp files, an fsspec URL).
        fmt: one of ``FORMATS``; inferred from the name (and the bytes) when None.
        allow_outside: trust a data file (tensorlist) or shard (Hugging Face) outside the
            directory of the file naming it.
        pointer: the list to read in a tensorlist document embedding several (``/model``).

    Raises:
        FormatError: the file is not a valid file of that format (or not a regular file).
        OSError: it cannot be read.
    """
    path = localize(os.fspath(path))
    fmt = check_format(fmt or infer_format(path, for_reading=True))
    if is_remote(path) and fmt not in ("tensorlist", "lamp"):
        raise ValueError(f"{path}: remote URLs are supported for tensorlist and lamp files, not {fmt}; "
                         "copy the file locally first")
    if fmt in ("tensorlist", "lamp"):
        return _open_tensorlist(path, fmt, allow_outside, pointer)
    if pointer is not None:
        raise ValueError(f"{path}: a JSON pointer selects a list in a tensorlist document, not in a {fmt} file")
    if fmt == "hf":
        return _open_hf(path, allow_outside)
    return {"safetensors": _open_safetensors, "npz": _open_npz, "npy": _open_npy, "pt": _open_pt}[fmt](path)


def _open_tensorlist(path: str, fmt: str, allow_outside: bool, pointer: Optional[str]) -> Source:
    r = Reader(path, allow_outside=allow_outside, pointer=pointer)
    d = r.descriptor
    named = d.tensors.names is not None
    entries = [Entry(k, t.dtype, t.shape, (lambda i=i: r[i])) for i, (k, t) in enumerate(zip(r.keys(), d.tensors))]
    return Source(path, fmt, entries, named, d.metadata, [r.close])


# --- safetensors and Hugging Face shards ---------------------------------------------

class SafetensorsFile:
    """A parsed, checked safetensors file, memory-mapped.

    ``what``, ``file`` and ``field`` name it in the error raised when it is not
    a regular file (a shard is named by its index file and ``weight_map`` entry).
    """

    def __init__(self, path: str, *, what: str = "safetensors file", file=None, field: Optional[str] = None):
        self.path = path
        with os.fdopen(open_regular(path, what=what, file=file, field=field), "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise FormatError(f"is {size} bytes, too short for a safetensors file (8-byte header length)",
                                  file=path)
            n = struct.unpack("<Q", f.read(8))[0]
            if n > MAX_SAFETENSORS_HEADER or 8 + n > size:
                raise FormatError(f"header length {n} does not fit the file's {size} bytes "
                                  "(truncated or not a safetensors file)", file=path)
            raw = f.read(n)
            self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size > 8 + n else None
        try:
            header = loads_strict(raw, file=path)
        except FormatError:
            raise
        except ValueError as e:
            raise FormatError(f"header is not valid JSON: {e}", file=path) from e
        if not isinstance(header, dict):
            raise FormatError("header is not a JSON object", file=path)
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise FormatError("__metadata__ must be an object of strings", file=path, field="__metadata__")
        self.metadata = meta
        self.data_start = 8 + n
        self.rows = self._rows(header, size - self.data_start)

    def _rows(self, header: Dict[str, Any], data_len: int) -> list:
        path = self.path
        rows = []
        for name, t in header.items():
            if not isinstance(t, dict) or set(t) - {"dtype", "shape", "data_offsets"} or len(t) != 3:
                raise FormatError("must be an object with exactly dtype, shape and data_offsets",
                                  file=path, field=name)
            dt = ST_DTYPES.get(t["dtype"]) if isinstance(t["dtype"], str) else None
            if dt is None:
                raise FormatError(f"unsupported dtype {t['dtype']!r}", file=path, field=f"{name}/dtype")
            shape, offs = t["shape"], t["data_offsets"]
            if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
                raise FormatError(f"shape must be a list of non-negative integers, got {shape!r}",
                                  file=path, field=f"{name}/shape")
            if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int for o in offs)
                    and 0 <= offs[0] <= offs[1] <= data_len):
                raise FormatError(f"data_offsets {offs!r} are not within the {data_len} data bytes "
                                  "(truncated file?)", file=path, field=f"{name}/data_offsets")
            row = _dtypes.from_name(dt)
            if math.prod(shape) * row.itemsize != offs[1] - offs[0]:
                raise FormatError(f"shape {shape} x {row.itemsize} bytes != {offs[1] - offs[0]} bytes of data",
                                  file=path, field=f"{name}/data_offsets")
            rows.append((offs[0], offs[1], name, row, tuple(shape)))
        rows.sort(key=lambda r: (r[0], r[1]))
        end = 0
        for b, e, name, _, _ in rows:
            if b < end:
                raise FormatError("overlaps the previous tensor", file=path, field=f"{name}/data_offsets")
            end = max(end, e)
        return rows

    def array(self, begin: int, end: int, row: _dtypes.DType, shape) -> np.ndarray:
        if end == begin:
            return np.empty(shape, row.numpy)
        return np.frombuffer(self.mm, np.uint8, end - begin, self.data_start + begin).view(row.numpy).reshape(shape)

    def entries(self) -> List[Entry]:
        return [Entry(name, row, shape, (lambda b=b, e=e, row=row, shape=shape: self.array(b, e, row, shape)))
                for b, e, name, row, shape in self.rows]

    def close(self) -> None:
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # arrays still handed out keep it open; the GC closes it later
                pass


def _st_metadata_in(meta: Optional[Dict[str, str]], path: str) -> Any:
    if not meta:
        return None
    if set(meta) == {"tensorlist.metadata"}:
        try:
            return loads_strict(meta["tensorlist.metadata"], file=path)
        except ValueError as e:
            raise FormatError(f"tensorlist.metadata is not valid JSON: {e}", file=path, field="__metadata__") from e
    return dict(meta)


def _open_safetensors(path: str) -> Source:
    st = SafetensorsFile(path)
    return Source(path, "safetensors", st.entries(), True, _st_metadata_in(st.metadata, path), [st.close])


def _shard_path(index: str, base: str, shard: str, field: str, allow_outside: bool) -> str:
    """The shard's path, refused when it (or a symlink on its way) leaves the index's directory.

    The confinement is the one data files get (``format.check_data_path``): the
    index's directory or, when the index is itself a symlink, its target's
    (the Hugging Face cache links both the index and the shards into one blob
    directory).
    """
    # the shard stands in for a list's data file; only these fields are read
    desc = ListDescriptor(location=shard, byte_offset=0, byte_length=0, tensors=None, metadata=None, version=None,
                          file=index, pointer="", base_dir=base, raw={})
    path = desc.data_path
    if not os.path.exists(path):
        raise FormatError(f"shard {shard!r} named in weight_map does not exist", file=index, field=field)
    try:
        check_data_path(desc, allow_outside)
    except FormatError as e:
        raise FormatError(f"shard {shard!r} resolves to {os.path.realpath(path)!r}, outside the index's directory "
                          "(a symlink; pass allow_outside=True to trust it)", file=index, field=field) from e
    return path


def _open_hf(path: str, allow_outside: bool = False) -> Source:
    index = read_json_file(path)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise FormatError("is not a Hugging Face index: no 'weight_map' object", file=path)
    base = os.path.dirname(os.path.abspath(path))
    entries: List[Entry] = []
    src = Source(path, "hf", entries, True, None, [])
    try:
        wanted: Dict[str, List[str]] = {}
        for name, shard in index["weight_map"].items():
            if not isinstance(shard, str):
                raise FormatError(f"shard must be a file name, got {shard!r}", file=path, field=f"weight_map/{name}")
            check_location(shard, file=path, field=f"weight_map/{name}", allow_outside=allow_outside)
            wanted.setdefault(shard, []).append(name)
        for shard, names in wanted.items():
            field = f"weight_map/{names[0]}"
            st = SafetensorsFile(_shard_path(path, base, shard, field, allow_outside), what="shard", file=path,
                                 field=field)
            src.on_close(st.close)
            have = {e.name: e for e in st.entries()}
            missing = [n for n in names if n not in have]
            if missing:
                raise FormatError(f"tensor {missing[0]!r} listed in weight_map is missing from shard {shard!r}",
                                  file=path, field=f"weight_map/{missing[0]}")
            keep = set(names)
            entries.extend(e for e in st.entries() if e.name in keep)
        meta = index.get("metadata")
        if isinstance(meta, dict) and "tensorlist_metadata" in meta:
            src.metadata = meta["tensorlist_metadata"]
        elif isinstance(meta, dict):
            rest = {k: v for k, v in meta.items() if k != "total_size"}
            src.metadata = rest or None
    except BaseException:
        src.close()
        raise
    return src


# --- numpy: .npz and .npy ---------------------------------------------------------

def _npz_sidecar(arrays) -> dict:
    if NPZ_SIDECAR not in arrays:
        return {}
    side = arrays[NPZ_SIDECAR]
    try:
        info = json.loads(str(side[()]))
    except (ValueError, TypeError) as e:
        raise FormatError(f"{NPZ_SIDECAR} entry is not tensorlist's JSON: {e}", field=NPZ_SIDECAR) from e
    return info if isinstance(info, dict) else {}


def _open_npz(path: str) -> Source:
    f = os.fdopen(open_regular(path, what=".npz file"), "rb")
    try:
        if f.read(6) == b"\x93NUMPY":
            raise FormatError("is a .npy file, not .npz (use --from npy)", file=path)
        f.seek(0)
        try:
            z = np.load(f, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise FormatError(f"is not a readable .npz file: {e}", file=path) from e
    except BaseException:
        f.close()
        raise
    try:
        try:
            side = _npz_sidecar(z)
        except FormatError as e:
            raise FormatError(str(e.reason) if hasattr(e, "reason") else str(e), file=path) from e
        dtypes = side.get("dtypes", {})
        entries = []
        for name in z.files:
            if name == NPZ_SIDECAR:
                continue
            shape, dt = _npz_header(z, name, path)
            row_name = dtypes.get(name)
            row = _dtypes.from_name(row_name) if row_name in RAW_DTYPES else _row_of(dt, path, name)
            entries.append(Entry(name, row, shape, (lambda n=name, row=row: _npz_get(z, n, row, path))))
    except BaseException:
        z.close()
        f.close()
        raise
    return Source(path, "npz", entries, side.get("named", True), side.get("metadata"), [f.close, z.close])


def _npy_header(f) -> Tuple[tuple, bool, np.dtype]:
    """(shape, fortran_order, dtype) from a .npy header (any version), ``f`` left at the data."""
    version = np.lib.format.read_magic(f)
    read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read(f)


def _npz_header(z, name: str, path: str):
    """(shape, dtype) of an npz member, from its .npy header alone."""
    try:
        with z.zip.open(name + ".npy") as f:
            shape, _, dt = _npy_header(f)
    except Exception as e:  # zip and header errors come in many types
        raise FormatError(f"entry {name!r} is not a readable .npy array: {e}", file=path) from e
    return shape, dt


def _npz_get(z, name: str, row: _dtypes.DType, path: str) -> np.ndarray:
    try:
        a = z[name]
    except Exception as e:
        raise FormatError(f"entry {name!r} cannot be read: {e}", file=path) from e
    if row.name in RAW_DTYPES:
        a = np.ascontiguousarray(a).view(row.numpy)
    return a


def _row_of(dt: np.dtype, path: str, name: str) -> _dtypes.DType:
    try:
        return _dtypes.from_numpy(dt)
    except (TypeError, KeyError) as e:
        raise FormatError(f"dtype {dt} has no tensorlist code", file=path, field=name) from e


def _open_npy(path: str) -> Source:
    # The header is read and the data mapped through the one checked fd (np.load would open the name again).
    with os.fdopen(open_regular(path, what=".npy file"), "rb") as f:
        if f.read(6).startswith(b"PK"):
            raise FormatError("is a .npz archive, not .npy (use --from npz)", file=path)
        f.seek(0)
        try:
            shape, fortran, dt = _npy_header(f)
        except Exception as e:  # header errors come in many types
            raise FormatError(f"is not a readable .npy file: {e}", file=path) from e
        row = _row_of(dt, path, "0")
        offset, size = f.tell(), os.fstat(f.fileno()).st_size
        need = math.prod(shape) * dt.itemsize
        if offset + need > size:
            raise FormatError(f"has {size - offset} data bytes, but its header's shape {shape} needs {need} "
                              "(truncated?)", file=path)
        order = "F" if fortran else "C"
        if need:
            a = np.memmap(f, dt, mode="r", offset=offset, shape=shape, order=order)
        else:  # mmap cannot map zero bytes
            a = np.empty(shape, dt, order=order)
    return Source(path, "npy", [Entry("0", row, shape, lambda: a)], False, None)


# --- torch ---------------------------------------------------------------------------

def _open_pt(path: str) -> Source:
    try:
        import torch
    except ImportError as e:
        raise ImportError("reading torch files needs torch: pip install 'tensorlist[torch]'") from e
    from .._torch_bridge import to_numpy

    # torch.load maps the file by name: check it is a regular file first (a FIFO would block the open)
    os.close(open_regular(path, what="torch file"))

    def _load(use_mmap):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=use_mmap)

    try:
        try:
            obj = _load(True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            obj = _load(False)  # the legacy (pre-1.6) format cannot be mapped
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle.UnpicklingError and friends
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e) or type(e).__name__ == "UnpicklingError":
            raise FormatError("refused: it holds Python objects other than tensors, and loading it would run "
                              f"arbitrary code (torch.load weights_only=True said: {msg})", file=path) from None
        raise FormatError(f"is not a readable torch file: {msg}", file=path) from None

    def tensor(v, name: str) -> np.ndarray:
        try:
            return to_numpy(v, f"tensor {name!r}")
        except TypeError as e:  # sparse, quantized, meta: the bridge says why, the file is named here
            raise FormatError(str(e), file=path) from e

    entries: List[Entry] = []
    named = True
    if isinstance(obj, torch.Tensor):
        obj, named = [obj], False
    elif isinstance(obj, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in obj):
        named = False
    for name, v in _flatten(obj, "", path):
        if isinstance(v, torch.Tensor):
            try:
                row = _dtypes.from_name(str(v.dtype).replace("torch.", ""))
            except KeyError:
                raise FormatError(f"dtype {v.dtype} has no tensorlist code", file=path, field=name) from None
            entries.append(Entry(name, row, tuple(v.shape), (lambda v=v, name=name: tensor(v, name))))
        else:
            arr = np.asarray(v)
            entries.append(Entry(name, _dtypes.from_numpy(arr.dtype), arr.shape, (lambda arr=arr: arr)))
    return Source(path, "pt", entries, named, None)


def _flatten(obj, prefix: str, path: str) -> Iterator[Tuple[str, Any]]:
    import torch

    if isinstance(obj, torch.Tensor) or (type(obj) in (int, float, bool)):
        yield (prefix or "0"), obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _flatten(v, f"{prefix}.{k}" if prefix else str(k), path)
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _flatten(v, f"{prefix}.{i}" if prefix else str(i), path)
    else:
        raise FormatError(f"holds a {type(obj).__name__} at {prefix or '/'!r}, which is not a tensor or a number; "
                          "save the state_dict alone to convert it", file=path)
