"""Converting between tensorlist files and the formats checkpoints already come in.

Formats (``FORMATS``), inferred from the file name or given explicitly:

============  ===========================================  ============================
name          files                                        notes
============  ===========================================  ============================
tensorlist    ``*.tl``, ``*.json``, anything else          metadata kept
lamp          ``*.lamp``                                   positional, no metadata (lamp's own bytes)
safetensors   ``*.safetensors``                            metadata kept (``__metadata__``)
hf            ``*.safetensors.index.json``                 Hugging Face sharded checkpoint
npz           ``*.npz``                                    bfloat16/float8 kept through a side entry
npy           ``*.npy``                                    exactly one tensor; no bfloat16/float8
pt            ``*.pt``, ``*.pth``, ``*.bin``, ``*.ckpt``   read with ``weights_only=True`` only
============  ===========================================  ============================

Every conversion streams tensor by tensor: sources are memory-mapped (or,
for torch files, loaded with ``mmap=True``), so a checkpoint larger than RAM
converts, and destinations are written to temporary files and renamed into
place when complete, so a failure never leaves a half-written destination.
Values are copied bit for bit (bfloat16, float16, float8 and NaN payloads
included). Remote URLs (``s3://...``) work for tensorlist and lamp files.

Example:
    >>> import numpy as np, tensorlist, tempfile, os
    >>> from tensorlist.convert import convert
    >>> d = tempfile.mkdtemp()
    >>> tensorlist.save(os.path.join(d, "m.tl"), {"w": np.arange(4, dtype=np.float16)})
    >>> convert(os.path.join(d, "m.tl"), os.path.join(d, "m.safetensors"), progress=False)
    >>> convert(os.path.join(d, "m.safetensors"), os.path.join(d, "back.tl"), progress=False)
    >>> tensorlist.load(os.path.join(d, "back.tl"))["w"]
    array([0., 1., 2., 3.], dtype=float16)
"""
from __future__ import annotations

import json
import math
import mmap
import os
import secrets
import struct
import sys
import zipfile
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import numpy as np

from . import _dtypes
from ._jsonio import dumps, loads_strict
from .errors import FormatError
from .format import check_location

__all__ = ["FORMATS", "convert", "infer_format", "open_source", "diff", "DiffResult"]

FORMATS = ("tensorlist", "lamp", "safetensors", "hf", "npz", "npy", "pt")

#: Largest safetensors header read (the safetensors library uses the same 100 MB cap).
MAX_SAFETENSORS_HEADER = 100_000_000
#: Default largest shard written for a Hugging Face checkpoint (``save_pretrained``'s 5GB).
DEFAULT_SHARD_BYTES = 5_000_000_000
#: npz entry holding what npz cannot say itself (dtype names, metadata, named or positional).
NPZ_SIDECAR = "__tensorlist__"

_ST_DTYPES = {
    "BOOL": "bool", "U8": "uint8", "I8": "int8", "I16": "int16", "U16": "uint16", "I32": "int32",
    "U32": "uint32", "I64": "int64", "U64": "uint64", "F16": "float16", "BF16": "bfloat16",
    "F32": "float32", "F64": "float64", "F8_E5M2": "float8_e5m2", "F8_E4M3": "float8_e4m3fn",
    "C64": "complex64",
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}
# dtypes numpy's .npy header cannot name (ml_dtypes): stored as same-size unsigned ints
_RAW_DTYPES = {"bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
               "float8_e8m0fnu"}
_UINT = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}


# --- format names ----------------------------------------------------------------

def _is_url(path: str) -> bool:
    from .remote import is_url

    return is_url(path)


def infer_format(path, *, for_reading: bool = False) -> str:
    """The format a file name implies (see the module's table); reading also sniffs the bytes.

    >>> infer_format("model.safetensors.index.json"), infer_format("x.npz"), infer_format("w.tl")
    ('hf', 'npz', 'tensorlist')
    """
    p = os.fspath(path).lower()
    if p.endswith(".index.json"):
        return "hf"
    for ext, fmt in ((".safetensors", "safetensors"), (".npz", "npz"), (".npy", "npy"), (".pt", "pt"),
                     (".pth", "pt"), (".bin", "pt"), (".ckpt", "pt"), (".lamp", "lamp")):
        if p.endswith(ext):
            return fmt
    if for_reading and not _is_url(os.fspath(path)):
        sniffed = _sniff(os.fspath(path))
        if sniffed:
            return sniffed
    return "tensorlist"


def _sniff(path: str) -> Optional[str]:
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError:
        return None
    if head.startswith(b"\x93NUMPY"):
        return "npy"
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as z:
                return "pt" if any(n.endswith("data.pkl") for n in z.namelist()) else "npz"
        except zipfile.BadZipFile:
            return None
    if len(head) >= 9 and head[8:9] == b"{":
        n = struct.unpack("<Q", head[:8])[0]
        if 2 <= n <= MAX_SAFETENSORS_HEADER:
            return "safetensors"
    return None


def _check_format(fmt: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


# --- sources: tensors one at a time -------------------------------------------------

class Entry:
    """One tensor of a source, described before any of its bytes are read."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "_get")

    def __init__(self, name: str, dtype: _dtypes.DType, shape: Tuple[int, ...], get):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.nbytes = int(math.prod(self.shape)) * dtype.itemsize
        self._get = get

    def array(self) -> np.ndarray:
        """The tensor, little-endian and C-contiguous (usually a view of a mapped file)."""
        a = self._get()
        if a.dtype.byteorder == ">" or (a.dtype.byteorder == "=" and sys.byteorder == "big" and a.dtype.itemsize > 1):
            a = a.astype(a.dtype.newbyteorder("<"))
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)


class Source:
    """The tensors of a file, in order, with the list-level metadata.

    Attributes:
        path: the source file.
        format: its format name.
        entries: one :class:`Entry` per tensor.
        named: False for a positional list (lamp, ``.npy``): names are ``"0"``, ``"1"``...
        metadata: list-level metadata (any JSON value) or None.
    """

    def __init__(self, path: str, fmt: str, entries: List[Entry], named: bool, metadata: Any, closers=()):
        self.path, self.format, self.entries, self.named, self.metadata = path, fmt, entries, named, metadata
        self._closers = list(closers)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def close(self) -> None:
        for c in reversed(self._closers):
            try:
                c()
            except Exception:
                pass
        self._closers = []

    def __enter__(self) -> "Source":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_source(path, fmt: Optional[str] = None, *, allow_outside: bool = False,
                pointer: Optional[str] = None) -> Source:
    """Opens ``path`` as a :class:`Source` (lazily: tensors are read when asked for).

    Raises:
        FormatError: the file is not a valid file of that format.
        OSError: it cannot be read.
    """
    path = os.fspath(path)
    fmt = _check_format(fmt or infer_format(path, for_reading=True))
    if _is_url(path) and fmt not in ("tensorlist", "lamp"):
        raise ValueError(f"{path}: remote URLs are supported for tensorlist and lamp files, not {fmt}; "
                         "copy the file locally first")
    opener = {"tensorlist": _open_tensorlist, "lamp": _open_tensorlist, "safetensors": _open_safetensors,
              "hf": _open_hf, "npz": _open_npz, "npy": _open_npy, "pt": _open_pt}[fmt]
    if fmt in ("tensorlist", "lamp"):
        return opener(path, fmt, allow_outside, pointer)
    if pointer is not None:
        raise ValueError(f"{path}: a JSON pointer selects a list in a tensorlist document, not in a {fmt} file")
    return opener(path)


def _open_tensorlist(path: str, fmt: str, allow_outside: bool, pointer: Optional[str]) -> Source:
    from .reader import Reader

    r = Reader(path, allow_outside=allow_outside, pointer=pointer)
    d = r.descriptor
    named = d.tensors.names is not None
    entries = [Entry(k, t.dtype, t.shape, (lambda i=i: r[i])) for i, (k, t) in enumerate(zip(r.keys(), d.tensors))]
    return Source(path, fmt, entries, named, d.metadata, [r.close])


class _SafetensorsFile:
    """A parsed, checked safetensors file, memory-mapped."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
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
        data_len = size - self.data_start
        rows = []
        for name, t in header.items():
            if not isinstance(t, dict) or set(t) - {"dtype", "shape", "data_offsets"} or len(t) != 3:
                raise FormatError("must be an object with exactly dtype, shape and data_offsets",
                                  file=path, field=name)
            dt = _ST_DTYPES.get(t["dtype"]) if isinstance(t["dtype"], str) else None
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
        self.rows = rows

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


def _st_metadata_out(metadata: Any) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    if isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()):
        return dict(metadata)
    return {"tensorlist.metadata": dumps(metadata)}


def _open_safetensors(path: str) -> Source:
    st = _SafetensorsFile(path)
    return Source(path, "safetensors", st.entries(), True, _st_metadata_in(st.metadata, path), [st.close])


def _open_hf(path: str) -> Source:
    from .format import read_json_file

    index = read_json_file(path)
    if not isinstance(index, dict) or not isinstance(index.get("weight_map"), dict):
        raise FormatError("is not a Hugging Face index: no 'weight_map' object", file=path)
    base = os.path.dirname(os.path.abspath(path))
    shards: Dict[str, _SafetensorsFile] = {}
    entries: List[Entry] = []
    src = Source(path, "hf", entries, True, None, [])
    try:
        wanted: Dict[str, List[str]] = {}
        for name, shard in index["weight_map"].items():
            if not isinstance(shard, str):
                raise FormatError(f"shard must be a file name, got {shard!r}", file=path, field=f"weight_map/{name}")
            check_location(shard, file=path, field=f"weight_map/{name}")
            wanted.setdefault(shard, []).append(name)
        for shard, names in wanted.items():
            shard_path = os.path.join(base, *shard.split("/"))
            if not os.path.exists(shard_path):
                raise FormatError(f"shard {shard!r} named in weight_map does not exist", file=path,
                                  field=f"weight_map/{names[0]}")
            st = shards[shard] = _SafetensorsFile(shard_path)
            src._closers.append(st.close)
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
    try:
        z = np.load(path, allow_pickle=False)
    except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
        raise FormatError(f"is not a readable .npz file: {e}", file=path) from e
    if not isinstance(z, np.lib.npyio.NpzFile):
        z.close() if hasattr(z, "close") else None
        raise FormatError("is a .npy file, not .npz (use --from npy)", file=path)
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
            header = _npz_header(z, name, path)
            shape, dt = header
            row_name = dtypes.get(name)
            row = _dtypes.from_name(row_name) if row_name in _RAW_DTYPES else _row_of(dt, path, name)
            entries.append(Entry(name, row, shape, (lambda n=name, row=row: _npz_get(z, n, row, path))))
    except BaseException:
        z.close()
        raise
    return Source(path, "npz", entries, side.get("named", True), side.get("metadata"), [z.close])


def _npz_header(z, name: str, path: str):
    """(shape, dtype) of an npz member, from its .npy header alone."""
    try:
        with z.zip.open(name + ".npy") as f:
            version = np.lib.format.read_magic(f)
            read = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
            shape, _, dt = read(f)
    except Exception as e:  # zip and header errors come in many types
        raise FormatError(f"entry {name!r} is not a readable .npy array: {e}", file=path) from e
    return shape, dt


def _npz_get(z, name: str, row: _dtypes.DType, path: str) -> np.ndarray:
    try:
        a = z[name]
    except Exception as e:
        raise FormatError(f"entry {name!r} cannot be read: {e}", file=path) from e
    if row.name in _RAW_DTYPES:
        a = np.ascontiguousarray(a).view(row.numpy)
    return a


def _row_of(dt: np.dtype, path: str, name: str) -> _dtypes.DType:
    try:
        return _dtypes.from_numpy(dt)
    except (TypeError, KeyError) as e:
        raise FormatError(f"dtype {dt} has no tensorlist code", file=path, field=name) from e


def _open_npy(path: str) -> Source:
    try:
        a = np.load(path, mmap_mode="r", allow_pickle=False)
    except (ValueError, OSError, EOFError) as e:
        raise FormatError(f"is not a readable .npy file: {e}", file=path) from e
    if not isinstance(a, np.ndarray):
        raise FormatError("is a .npz archive, not .npy (use --from npz)", file=path)
    row = _row_of(a.dtype, path, "0")
    return Source(path, "npy", [Entry("0", row, a.shape, lambda: a)], False, None)


def _open_pt(path: str) -> Source:
    try:
        import torch
    except ImportError as e:
        raise ImportError("reading torch files needs torch: pip install 'tensorlist[torch]'") from e
    from .torch import to_numpy

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
            entries.append(Entry(name, row, tuple(v.shape), (lambda v=v: to_numpy(v))))
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


# --- destinations ----------------------------------------------------------------

class _Progress:
    def __init__(self, total: int, desc: str, enabled: Optional[bool]):
        self.bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            import shutil

            # a terminal that reports a 0 x 0 size (a fresh pty) would get no bar at all from tqdm
            size = shutil.get_terminal_size((80, 24))
            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            file=sys.stderr, leave=True, ncols=size.columns, nrows=size.lines or 24)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _tmp_beside(path: str) -> str:
    d, b = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{b}.{secrets.token_hex(4)}.tmp")


def _checked_destination(dst: str) -> None:
    if os.path.isdir(dst):
        raise IsADirectoryError(f"{dst} is a directory")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{parent}: no such directory for {dst}")


class _AtomicFile:
    """A temporary file beside ``path``, renamed over it on success, removed on failure."""

    def __init__(self, path: str):
        self.path = path
        self.tmp = _tmp_beside(path)

    def __enter__(self) -> str:
        return self.tmp

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            os.replace(self.tmp, self.path)
        else:
            try:
                os.unlink(self.tmp)
            except OSError:
                pass


def _bytes_of(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")


def _write_tensorlist(src: Source, dst: str, lamp: bool, bar: _Progress, options: dict) -> None:
    from .writer import Writer

    metadata = None if lamp else src.metadata
    if not _is_url(dst):
        _checked_destination(dst)
    with Writer(dst, metadata=metadata, lamp=lamp, **options) as w:
        for e in src.entries:
            a = e.array()
            if src.named and not lamp:
                w.add(e.name, a)
            else:
                w.add(a)
            bar.update(e.nbytes)


def _st_header(entries: Sequence[Entry], metadata: Optional[Dict[str, str]], extra_pad_to: int = 8) -> bytes:
    header: Dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for e in entries:
        if e.dtype.name not in _ST_NAMES:
            raise TypeError(f"tensor {e.name!r}: dtype {e.dtype.name} cannot be stored in safetensors")
        header[e.name] = {"dtype": _ST_NAMES[e.dtype.name], "shape": list(e.shape),
                          "data_offsets": [off, off + e.nbytes]}
        off += e.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % extra_pad_to)
    return struct.pack("<Q", len(text)) + text


def _write_st_file(path: str, entries: Sequence[Entry], metadata, bar: _Progress) -> None:
    with open(path, "wb") as f:
        f.write(_st_header(entries, metadata))
        for e in entries:
            f.write(_bytes_of(e.array()))
            bar.update(e.nbytes)
        f.flush()
        os.fsync(f.fileno())


def _write_safetensors(src: Source, dst: str, bar: _Progress, options: dict) -> None:
    _checked_destination(dst)
    with _AtomicFile(dst) as tmp:
        _write_st_file(tmp, src.entries, _st_metadata_out(src.metadata), bar)


def _write_hf(src: Source, dst: str, bar: _Progress, options: dict) -> None:
    _checked_destination(dst)
    limit = int(options.get("shard_bytes") or DEFAULT_SHARD_BYTES)
    shards: List[List[Entry]] = [[]]
    size = 0
    for e in src.entries:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    base = os.path.basename(dst)
    stem = base[: -len(".safetensors.index.json")] if base.endswith(".safetensors.index.json") else \
        base[: -len(".index.json")] if base.endswith(".index.json") else base
    n = len(shards)
    names = [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
    folder = os.path.dirname(os.path.abspath(dst))
    tmps: List[str] = []
    placed: List[str] = []
    try:
        for name, entries in zip(names, shards):
            tmp = _tmp_beside(os.path.join(folder, name))
            tmps.append(tmp)
            _write_st_file(tmp, entries, {"format": "pt"}, bar)
        for tmp, name in zip(tmps, names):
            os.replace(tmp, os.path.join(folder, name))
            placed.append(name)
        meta: Dict[str, Any] = {"total_size": src.nbytes}
        if src.metadata is not None:
            meta["tensorlist_metadata"] = src.metadata
        index = {"metadata": meta,
                 "weight_map": {e.name: name for name, entries in zip(names, shards) for e in entries}}
        with _AtomicFile(dst) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(index, indent=2, ensure_ascii=False) + "\n")
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        for p in tmps + [os.path.join(folder, n) for n in placed]:
            try:
                os.unlink(p)
            except OSError:
                pass
        raise


def _write_npz(src: Source, dst: str, bar: _Progress, options: dict) -> None:
    _checked_destination(dst)
    side: Dict[str, Any] = {"named": src.named}
    raw = {e.name: e.dtype.name for e in src.entries if e.dtype.name in _RAW_DTYPES}
    if raw:
        side["dtypes"] = raw
    if src.metadata is not None:
        side["metadata"] = src.metadata
    with _AtomicFile(dst) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for e in src.entries:
                if e.name == NPZ_SIDECAR:
                    raise ValueError(f"tensor name {NPZ_SIDECAR!r} is reserved in .npz files")
                a = e.array()
                if e.dtype.name in _RAW_DTYPES:
                    a = a.view(_UINT[e.dtype.itemsize])
                with z.open(e.name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, a, allow_pickle=False)
                bar.update(e.nbytes)
            if side != {"named": True}:
                with z.open(NPZ_SIDECAR + ".npy", "w") as f:
                    np.lib.format.write_array(f, np.array(json.dumps(side)), allow_pickle=False)


def _write_npy(src: Source, dst: str, bar: _Progress, options: dict) -> None:
    _checked_destination(dst)
    if len(src.entries) != 1:
        raise ValueError(f"a .npy file holds exactly one array, {src.path} has {len(src.entries)} tensors "
                         "(convert to .npz instead)")
    e = src.entries[0]
    if e.dtype.name in _RAW_DTYPES:
        raise ValueError(f"tensor {e.name!r}: {e.dtype.name} has no .npy dtype and would not read back "
                         "(convert to .npz, which keeps it)")
    with _AtomicFile(dst) as tmp:
        with open(tmp, "wb") as f:
            np.lib.format.write_array(f, e.array(), allow_pickle=False)
        bar.update(e.nbytes)


def _write_pt(src: Source, dst: str, bar: _Progress, options: dict) -> None:
    import torch

    from .torch import from_numpy

    _checked_destination(dst)
    state: Dict[str, Any] = {}
    for e in src.entries:
        state[e.name] = from_numpy(e.array())  # views of the mapped source: torch.save reads them once
        bar.update(e.nbytes)
    with _AtomicFile(dst) as tmp:
        torch.save(state if src.named else list(state.values()), tmp)


_WRITERS = {"safetensors": _write_safetensors, "hf": _write_hf, "npz": _write_npz, "npy": _write_npy,
            "pt": _write_pt}


def convert(src, dst, *, src_format: Optional[str] = None, dst_format: Optional[str] = None,
            progress: Optional[bool] = None, allow_outside: bool = False, shard_bytes: Optional[int] = None,
            pointer: Optional[str] = None, **writer_options) -> None:
    """Converts ``src`` into ``dst``, tensor by tensor, bit for bit.

    Args:
        src, dst: paths (or, for tensorlist/lamp files, fsspec URLs).
        src_format, dst_format: one of ``FORMATS``; inferred from the names when None.
        progress: show a tqdm progress bar on stderr (None: when stderr is a terminal).
        allow_outside: trust a tensorlist source whose data file lies outside its directory.
        pointer: the list to convert in a tensorlist document embedding several (``/model``).
        shard_bytes: largest shard of a Hugging Face destination (default 5 GB).
        **writer_options: passed to :class:`tensorlist.Writer` for tensorlist destinations
            (``alignment``, ``checksum``, ``durable``...).

    Raises:
        FormatError: the source is not a valid file of its format (nothing is written).
        ValueError, TypeError: the destination format cannot hold the source's tensors.
        OSError: a file cannot be read or written.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    dst_format = _check_format(dst_format or infer_format(dst))
    if _is_url(dst) and dst_format not in ("tensorlist", "lamp"):
        raise ValueError(f"{dst}: remote URLs are supported for tensorlist and lamp files, not {dst_format}")
    if not _is_url(src) and not _is_url(dst) and os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"{src} and {dst} are the same file")
    with open_source(src, src_format, allow_outside=allow_outside, pointer=pointer) as s:
        bar = _Progress(s.nbytes, os.path.basename(dst), progress)
        try:
            if dst_format in ("tensorlist", "lamp"):
                _write_tensorlist(s, dst, dst_format == "lamp", bar, writer_options)
            else:
                if writer_options:
                    raise TypeError(f"unexpected options for {dst_format}: {sorted(writer_options)}")
                _WRITERS[dst_format](s, dst, bar, {"shard_bytes": shard_bytes})
        finally:
            bar.close()


# --- diff ---------------------------------------------------------------------------

class DiffResult:
    """What differs between two tensor files.

    Attributes:
        only_a, only_b: names present on one side only.
        dtype: {name: (dtype a, dtype b)}; shape: {name: (shape a, shape b)}.
        values: {name: max abs difference} of tensors whose bytes differ.
        same: names identical bit for bit.
    """

    def __init__(self):
        self.only_a: List[str] = []
        self.only_b: List[str] = []
        self.dtype: Dict[str, Tuple[str, str]] = {}
        self.shape: Dict[str, Tuple[tuple, tuple]] = {}
        self.values: Dict[str, float] = {}
        self.same: List[str] = []

    @property
    def identical(self) -> bool:
        return not (self.only_a or self.only_b or self.dtype or self.shape or self.values)


def _same_bytes(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 24) -> bool:
    ua, ub = a.reshape(-1).view(np.uint8), b.reshape(-1).view(np.uint8)
    return all(np.array_equal(ua[i:i + chunk], ub[i:i + chunk]) for i in range(0, ua.size, chunk))


def _max_abs_diff(a: np.ndarray, b: np.ndarray, chunk: int = 1 << 22) -> float:
    """Largest |a - b| in float64 (complex: modulus; bool: 1), in chunks to bound memory."""
    fa, fb = a.reshape(-1), b.reshape(-1)
    best = 0.0
    for i in range(0, fa.size, chunk):
        x, y = fa[i:i + chunk], fb[i:i + chunk]
        if x.dtype.kind == "c":
            d = np.abs(x.astype(np.complex128) - y.astype(np.complex128))
        else:
            d = np.abs(x.astype(np.float64) - y.astype(np.float64))
        with np.errstate(invalid="ignore"):
            m = np.max(d) if d.size else 0.0
            if np.isnan(m) or np.isnan(d).any():
                return float("nan")
        best = max(best, float(m))
    return best


def diff(a, b, *, a_format: Optional[str] = None, b_format: Optional[str] = None, atol: float = 0.0) -> DiffResult:
    """Compares two files of any supported formats tensor by tensor.

    Tensors whose bytes are equal are the same; otherwise the largest absolute
    difference is computed (in float64), and tensors within ``atol`` count as the same.
    """
    out = DiffResult()
    with open_source(a, a_format) as sa, open_source(b, b_format) as sb:
        eb = {e.name: e for e in sb.entries}
        ea = {e.name: e for e in sa.entries}
        out.only_a = [n for n in ea if n not in eb]
        out.only_b = [n for n in eb if n not in ea]
        for name, x in ea.items():
            y = eb.get(name)
            if y is None:
                continue
            if x.dtype.name != y.dtype.name:
                out.dtype[name] = (x.dtype.name, y.dtype.name)
            if x.shape != y.shape:
                out.shape[name] = (x.shape, y.shape)
                continue
            ax, ay = x.array(), y.array()
            if x.dtype.name == y.dtype.name and _same_bytes(ax, ay):
                out.same.append(name)
                continue
            m = _max_abs_diff(ax, ay)
            if name in out.dtype or not (m <= atol):
                out.values[name] = m
            else:
                out.same.append(name)
    return out
