"""Sources: each format's reader, giving a :class:`~tensorlist.convert.formats.Source` of lazy entries.

Every local file is opened through :func:`tensorlist.format.open_regular` (a
FIFO or device is refused by name instead of blocking), JSON is read through
the capped :func:`tensorlist.format.read_json_file`, Hugging Face shards are
confined to the index's directory as data files are to their descriptor's
(:func:`tensorlist.format.check_data_path`). torch files are read by
``torchfile``, checkpoint directories by ``dcp``.
"""
from __future__ import annotations

import mmap
import os
import struct
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tensorlist._base import dtypes as _dtypes
from tensorlist._base.backends import is_remote, localize
from tensorlist._base.jsonio import MAX_DEPTH, check_json, loads_strict
from tensorlist.errors import FormatError
from tensorlist.format import MAX_DESCRIPTOR_BYTES, Limits, ListDescriptor, check_data_path, check_location, open_regular, \
    read_json_file, short_repr
from tensorlist.reader import Reader
from tensorlist.convert.formats import MAX_SAFETENSORS_HEADER, NPZ_SIDECAR, RAW_DTYPES, ST_DTYPES, ST_NOT_HERE, ST_PACKED, ST_RANK, UINT, \
    Entry, Source, check_format, check_limits, check_shape, infer_format, packed_shape, row_of
from tensorlist.convert.dcp import open_dcp, open_torch_dcp
from tensorlist.convert.torchfile import open_pt

__all__ = ["open_source", "SafetensorsFile", "ST_MAX_DEPTH"]

#: Deepest nesting a safetensors header may have: serde_json's recursion limit, which safetensors'
#: parse inherits (127 levels of arrays and objects, the header object included; measured on 0.8).
ST_MAX_DEPTH = 127


def open_source(path, fmt: Optional[str] = None, *, allow_outside: bool = False, pointer: Optional[str] = None,
                max_tensors: Optional[int] = None, max_total_bytes: Optional[int] = None) -> Source:
    """Opens ``path`` as a :class:`Source` (lazily: tensors are read when asked for).

    Every source is hostile input: each is checked as its own format's reader
    checks it (safetensors as strictly as safetensors), its shapes obey
    tensorlist's dims rules, and any problem is a FormatError naming the file
    and the tensor, never a stray numpy, torch or recursion error.

    Args:
        path: a path (or, for tensorlist/lamp files and checkpoints of both layouts, an fsspec URL); a
            checkpoint directory for ``dcp`` and ``torch-dcp``.
        fmt: one of ``FORMATS``; inferred from the name (and the bytes) when None.
        allow_outside: trust a data file (tensorlist) or shard (Hugging Face) outside the
            directory of the file naming it.
        pointer: the list to read in a tensorlist document embedding several (``/model``).
        max_tensors: most tensors a source may hold (``tensorlist.format.MAX_TENSORS`` by default).
        max_total_bytes: most bytes its tensors may expand to. By default a torch
            file's records are refused past ``MAX_EXPANSION`` x its size before
            ``torch.load`` reads them; :func:`convert` and :func:`diff` apply the
            same cap to every source (``formats.check_limits``).

    Raises:
        FormatError: the file is not a valid file of that format (or not a regular file), or it
            is over a limit.
        OSError: it cannot be read.
    """
    path = localize(os.fspath(path))
    fmt = check_format(fmt or infer_format(path, for_reading=True))
    limits = Limits.of(max_tensors=max_tensors, max_total_bytes=max_total_bytes)
    if is_remote(path) and fmt not in ("tensorlist", "lamp", "dcp", "torch-dcp"):
        raise ValueError(f"{path}: remote URLs are supported for tensorlist and lamp files, not {fmt} (and for "
                         "checkpoint directories, dcp and torch-dcp); copy it locally first")
    if fmt in ("tensorlist", "lamp"):
        src = _open_tensorlist(path, fmt, allow_outside, pointer, limits)
    elif pointer is not None:
        raise ValueError(f"{path}: a JSON pointer selects a list in a tensorlist document, not in a {fmt} file")
    elif fmt in ("hf-model", "tensorlist-model"):
        raise ValueError(f"{path}: a model directory ({fmt}) is converted whole (`tensorlist convert DIR OUT_DIR`); "
                         "open its weight files one by one")
    elif fmt == "dcp":
        src = open_dcp(path, limits)
    elif fmt == "torch-dcp":
        src = open_torch_dcp(path, limits)
    elif fmt == "hf":
        src = _open_hf(path, allow_outside)
    elif fmt == "pt":
        src = open_pt(path, limits)
    else:
        src = {"safetensors": _open_safetensors, "npz": _open_npz, "npy": _open_npy}[fmt](path)
    try:
        check_limits(src, limits._replace(max_total_bytes=None), expansion=False)
    except BaseException:
        src.close()
        raise
    return src


def _open_tensorlist(path: str, fmt: str, allow_outside: bool, pointer: Optional[str], limits: Limits) -> Source:
    r = Reader(path, allow_outside=allow_outside, pointer=pointer, max_tensors=limits.max_tensors,
               max_total_bytes=limits.max_total_bytes, bits=True)
    d = r.descriptor
    named = d.tensors.names is not None
    entries = [Entry(k, t.dtype, t.shape, (lambda i=i: r[i])) for i, (k, t) in enumerate(zip(r.keys(), d.tensors))]
    return Source(path, fmt, entries, named, d.metadata, [r.close])


# --- safetensors and Hugging Face shards ---------------------------------------------

class SafetensorsFile:
    """A parsed safetensors file, checked as safetensors itself checks it, memory-mapped.

    The rules are those of safetensors' ``read_metadata``/``validate`` (tensor.rs),
    in its order, each broken one a FormatError naming the file and the tensor:
    the 8-byte header length, at most 100 MB of header, inside the file; a UTF-8
    JSON object (duplicate keys refused, where safetensors lets the last win);
    ``__metadata__`` null or an object of strings; each tensor an object with a
    known ``dtype``, a ``shape`` obeying tensorlist's dims rules and
    ``data_offsets`` of two integers; the tensors, by offset, tiling the data
    exactly from byte 0 (no gap, overlap or hole: "InvalidOffset"), each
    ``shape`` x item size long; and the file ending where the last tensor ends
    (no bytes after it, none missing: "MetadataIncompleteBuffer"). Keys of a
    tensor other than those three are ignored, as safetensors ignores them.

    ``what``, ``file`` and ``field`` name it in the error raised when it is not
    a regular file (a shard is named by its index file and ``weight_map`` entry).
    """

    def __init__(self, path: str, *, what: str = "safetensors file", file=None, field: Optional[str] = None):
        self.path = path
        self.mm = None
        with os.fdopen(open_regular(path, what=what, file=file, field=field), "rb") as f:
            self.size = size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise FormatError(f"is {size} bytes, too short for a safetensors file (8-byte header length)",
                                  file=path)
            n = struct.unpack("<Q", f.read(8))[0]
            if n > MAX_SAFETENSORS_HEADER:
                raise FormatError(f"header length {n} is above safetensors' limit of {MAX_SAFETENSORS_HEADER} "
                                  "bytes (not a safetensors file?)", file=path)
            if 8 + n > size:
                raise FormatError(f"header length {n} does not fit the file's {size} bytes "
                                  "(truncated or not a safetensors file)", file=path)
            raw = f.read(n)
            self.data_start = 8 + n
            header = self._header(raw)
            self.metadata = self._metadata(header)
            self.rows = self._rows(header)
            if size > self.data_start:
                self.mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def _header(self, raw: bytes) -> Dict[str, Any]:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise FormatError(f"header is not UTF-8 ({e.reason} at byte {8 + e.start})", file=self.path) from None
        try:
            header = loads_strict(text, file=self.path)
        except FormatError as e:
            raise FormatError(f"header is not valid JSON: {e.reason}", file=self.path) from None
        try:  # serde_json's parse refuses deeper nesting and lone surrogates, even in keys it ignores
            check_json(header, file=self.path, depth=MAX_DEPTH - ST_MAX_DEPTH + 1)
        except FormatError as e:
            why = e.reason if "nests deeper" not in e.reason else \
                f"nests deeper than {ST_MAX_DEPTH} levels (serde_json's limit, which safetensors applies)"
            raise FormatError(f"header is not valid JSON for safetensors: {why}", file=self.path,
                              field=e.field) from None
        if not isinstance(header, dict):
            raise FormatError(f"header is a JSON {type(header).__name__}, not an object", file=self.path)
        return header

    def _metadata(self, header: Dict[str, Any]) -> Optional[Dict[str, str]]:
        meta = header.pop("__metadata__", None)
        if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
            raise FormatError("must be an object of strings (safetensors metadata is string -> string)",
                              file=self.path, field="__metadata__")
        return meta

    def _rows(self, header: Dict[str, Any]) -> list:
        path = self.path
        rows = []
        for i, (name, t) in enumerate(header.items()):
            def fail(reason, field, i=i, name=name):
                raise FormatError(reason, file=path, tensor_index=i, tensor_name=name, field=field)

            if not isinstance(t, dict):
                fail(f"must be an object with dtype, shape and data_offsets, got {short_repr(t)}", None)
            for key in ("dtype", "shape", "data_offsets"):
                if key not in t:
                    fail("missing required field", key)
            st = t["dtype"]
            if not isinstance(st, str) or st not in ST_RANK:
                fail(f"unknown safetensors dtype {short_repr(st)}", "dtype")
            if st not in ST_DTYPES:
                fail(f"safetensors dtype {st} ({ST_NOT_HERE[st]}) has no tensorlist dataType: it has no torch "
                     "ScalarType code, and tensorlist stores whole-byte elements", "dtype")
            row = _dtypes.from_name(ST_DTYPES[st])
            shape = t["shape"]
            if st in ST_PACKED and isinstance(shape, list):  # values counted, packed several to an element here
                shape = packed_shape(st, shape)
            if shape is None and st in ST_PACKED:
                fail(f"shape {short_repr(t['shape'])} of {st} must end with a dim divisible by {ST_PACKED[st]} "
                     f"(values are stored {ST_PACKED[st]} to a byte, as {row.name})", "shape")
            nbytes = check_shape(shape, row, file=path, index=i, name=name)
            offs = t["data_offsets"]
            if not (isinstance(offs, list) and len(offs) == 2 and all(type(o) is int and o >= 0 for o in offs)):
                fail(f"must be two non-negative integers [begin, end], got {short_repr(offs)}", "data_offsets")
            rows.append((offs[0], offs[1], i, name, row, tuple(shape), nbytes))
        # safetensors' validate(): by offset, each tensor starts where the previous one ended
        rows.sort(key=lambda r: (r[0], r[1]))
        end = 0
        for b, e, i, name, row, shape, nbytes in rows:
            if b != end or e < b:
                why = (f"ends before it begins ({e} < {b})" if e < b else
                       f"starts at {b}, but the previous tensor ends at {end}: " + (
                           f"bytes [{end}, {b}) belong to no tensor (a gap; safetensors refuses holes)"
                           if b > end else "the two overlap"))
                raise FormatError(f"data_offsets [{b}, {e}] {why}", file=path, tensor_index=i, tensor_name=name,
                                  field="data_offsets")
            if e - b != nbytes:
                raise FormatError(f"data_offsets [{b}, {e}] hold {e - b} bytes, but shape {list(shape)} of "
                                  f"{row.name} is {nbytes} bytes", file=path, tensor_index=i, tensor_name=name,
                                  field="data_offsets")
            end = e
        data_len = self.size - self.data_start
        if end != data_len:
            if end < data_len:
                raise FormatError(f"{data_len - end} bytes after the last tensor (the tensors end at byte {end} of "
                                  f"{data_len} data bytes; safetensors refuses trailing data)", file=path)
            raise FormatError(f"the tensors need {end} data bytes, the file holds {data_len} (truncated?)",
                              file=path)
        rows.sort(key=lambda r: r[2])  # back in the header's order: the order the list was written in
        return [(b, e, name, row, shape) for b, e, _, name, row, shape, _ in rows]

    def array(self, begin: int, end: int, row: _dtypes.DType, shape) -> np.ndarray:
        if end == begin:
            return np.empty(shape, row.bits)
        return np.frombuffer(self.mm, np.uint8, end - begin, self.data_start + begin).view(row.bits).reshape(shape)

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
    """A safetensors ``__metadata__`` as tensorlist metadata.

    A leading ``"format": "pt"`` is the container's marker (what this package's
    safetensors writer puts first, and what Hugging Face writers add) and is
    not metadata: it is dropped here and written back first, so a file keeps
    its bytes both ways (a ``format`` elsewhere, or another value, is kept in
    place). A ``tensorlist.metadata`` entry is the JSON this package stored;
    anything else is kept as it is, string to string.
    """
    if not meta:
        return None
    meta = dict(meta)
    if next(iter(meta)) == "format" and meta["format"] == "pt":
        del meta["format"]
    if "tensorlist.metadata" in meta and set(meta) - {"format"} == {"tensorlist.metadata"}:
        try:
            return loads_strict(meta["tensorlist.metadata"], file=path)
        except FormatError as e:
            raise FormatError(f"tensorlist.metadata is not valid JSON: {e.reason}", file=path,
                              field="__metadata__") from e
    return meta or None


def _open_safetensors(path: str) -> Source:
    st = SafetensorsFile(path)
    return Source(path, "safetensors", st.entries(), True, _st_metadata_in(st.metadata, path), [st.close],
                  disk_bytes=st.size)


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
    disk = os.path.getsize(path)
    try:
        wanted: Dict[str, List[str]] = {}
        found: Dict[str, Entry] = {}
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
            disk += st.size
            have = {e.name: e for e in st.entries()}
            missing = [n for n in names if n not in have]
            if missing:
                raise FormatError(f"tensor {missing[0]!r} listed in weight_map is missing from shard {shard!r}",
                                  file=path, field=f"weight_map/{missing[0]}")
            found.update((n, have[n]) for n in names)
        # in the index's order: the state_dict's, shard by shard, as huggingface_hub writes it
        entries.extend(found[name] for name in index["weight_map"])
        src.metadata = _hf_metadata_in(index.get("metadata"), src.nbytes)
        src.disk_bytes = disk
    except BaseException:
        src.close()
        raise
    return src


def _hf_metadata_in(meta: Any, total: int) -> Any:
    """An index's ``metadata`` as tensorlist metadata: as it is, less ``total_size`` when it is the tensors' size.

    ``save_torch_state_dict(metadata=...)`` and transformers put their keys
    beside ``total_size`` (the tied weights it dropped, ``total_parameters``...);
    they come back there on the way out (``sinks``), which recomputes
    ``total_size``. A ``tensorlist_metadata`` entry is what an older version of
    this package nested there.
    """
    if isinstance(meta, dict) and set(meta) - {"total_size"} == {"tensorlist_metadata"}:
        return meta["tensorlist_metadata"]
    if isinstance(meta, dict):
        rest = {k: v for k, v in meta.items() if not (k == "total_size" and v == total)}
        return rest or None
    return meta


# --- numpy: .npz and .npy ---------------------------------------------------------

def _npz_sidecar(z, path: str) -> dict:
    """The ``__tensorlist__`` entry, checked as a descriptor is: hostile input until proven otherwise.

    A 0-d unicode array (no bigger than a descriptor may be) holding strict
    JSON (no duplicate keys, NaN or nesting past ``MAX_DEPTH``): an object whose
    ``named`` is a boolean, whose ``dtypes`` maps tensors of the archive to the
    tensorlist dtypes stored as same-size unsigned integers, and whose
    ``metadata`` is any JSON value. Other keys are ignored.
    """
    if NPZ_SIDECAR not in z.files:
        return {}

    def fail(reason, field=NPZ_SIDECAR):
        raise FormatError(reason, file=path, field=field)

    shape, dt = _npz_header(z, NPZ_SIDECAR, path)
    if shape != () or dt.kind != "U":
        fail(f"must be a 0-d string array of JSON, got a {dt} array of shape {shape}")
    if dt.itemsize > MAX_DESCRIPTOR_BYTES:
        fail(f"is {dt.itemsize} bytes, above the limit of {MAX_DESCRIPTOR_BYTES} for JSON")
    try:
        text = str(z[NPZ_SIDECAR][()])
    except Exception as e:  # zip and array errors come in many types
        fail(f"cannot be read: {e}")
    try:
        info = loads_strict(text, file=path)
    except FormatError as e:
        fail(f"is not tensorlist's JSON: {e.reason}")
    if not isinstance(info, dict):
        fail(f"must be a JSON object, got {type(info).__name__}")
    if "named" in info and type(info["named"]) is not bool:
        fail(f"must be true or false, got {short_repr(info['named'])}", f"{NPZ_SIDECAR}/named")
    dtypes = info.get("dtypes", {})
    if not isinstance(dtypes, dict):
        fail(f"must be an object tensor name -> dtype name, got {short_repr(dtypes)}", f"{NPZ_SIDECAR}/dtypes")
    for name, dtype in dtypes.items():
        try:
            known = _dtypes.from_name(dtype).name in RAW_DTYPES  # the one lookup of a file's dtype name
        except KeyError:
            known = False
        if not known:
            fail(f"{short_repr(dtype)} is not a dtype stored through {NPZ_SIDECAR} (one of {sorted(RAW_DTYPES)})",
                 f"{NPZ_SIDECAR}/dtypes/{name}")
        if name == NPZ_SIDECAR or name not in z.files:
            fail(f"names tensor {name!r}, which the archive does not hold", f"{NPZ_SIDECAR}/dtypes/{name}")
    return info


def _open_npz(path: str) -> Source:
    f = os.fdopen(open_regular(path, what=".npz file"), "rb")
    try:
        if f.read(6) == b"\x93NUMPY":
            raise FormatError("is a .npy file, not .npz (use --from npy)", file=path)
        f.seek(0)
        size = os.fstat(f.fileno()).st_size
        try:
            z = np.load(f, allow_pickle=False)
        except (ValueError, OSError, zipfile.BadZipFile, EOFError) as e:
            raise FormatError(f"is not a readable .npz file: {e}", file=path) from e
        if not hasattr(z, "files"):  # a bare pickle or array: np.load said what it is
            raise FormatError("is not a .npz archive", file=path)
    except BaseException:
        f.close()
        raise
    try:
        side = _npz_sidecar(z, path)
        dtypes = side.get("dtypes", {})
        entries = []
        for i, name in enumerate(n for n in z.files if n != NPZ_SIDECAR):
            shape, dt = _npz_header(z, name, path)
            raw = dtypes.get(name)
            if raw is not None:
                row = _dtypes.from_name(raw)
                if dt.kind != "u" or dt.itemsize != row.itemsize:  # either byte order (numpy writes native)
                    raise FormatError(f"{NPZ_SIDECAR} says it holds {raw}, stored as {UINT[row.itemsize].name}, but "
                                      f"its dtype is {dt.name}", file=path, tensor_index=i, tensor_name=name, field="dtype")
            else:
                row = row_of(dt, path, name, i)
            check_shape(list(shape), row, file=path, index=i, name=name)
            entries.append(Entry(name, row, shape, (lambda n=name, row=row: _npz_get(z, n, row, path))))
    except BaseException:
        z.close()
        f.close()
        raise
    return Source(path, "npz", entries, side.get("named", True), side.get("metadata"), [f.close, z.close],
                  disk_bytes=size)


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
    if row.name in RAW_DTYPES:  # its bits as unsigned integers: little-endian, then the carrier
        a = _dtypes.as_little(np.ascontiguousarray(a)).view(row.bits)
    return a


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
        row = row_of(dt, path, "0", 0)
        need = check_shape(list(shape), row, file=path, index=0, name="0")
        offset, size = f.tell(), os.fstat(f.fileno()).st_size
        if offset + need > size:
            raise FormatError(f"has {size - offset} data bytes, but its header's shape {shape} needs {need} "
                              "(truncated?)", file=path)
        order = "F" if fortran else "C"
        if need:
            a = np.memmap(f, dt, mode="r", offset=offset, shape=shape, order=order)
        else:  # mmap cannot map zero bytes
            a = np.empty(shape, dt, order=order)
    return Source(path, "npy", [Entry("0", row, shape, lambda: a)], False, None, disk_bytes=size)
