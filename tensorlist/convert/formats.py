"""What the converters share: format names and their inference, the dtype tables, ``Entry`` and ``Source``.

A :class:`Source` (built by ``sources``) is the tensors of a file as lazy
:class:`Entry` objects; a sink (``sinks``) writes them one at a time. Every
source's shapes obey tensorlist's own rules (:func:`check_shape`) and every
conversion the readers' limits (:func:`check_limits`: ``max_tensors``, and a
cap on what a source may expand to). Imports ``_base.backends``, ``_base.dtypes``,
``format``, ``errors`` and, when a directory's layout is asked, ``dcp`` (the name of a
checkpoint's metadata, ``holds``) and ``modeldir`` only; fsspec to ask whether a URL is a checkpoint directory,
zipfile to sniff a zip (``.pt`` or ``.npz`` under another name).
"""
from __future__ import annotations

import math
import os
import struct
from typing import Any, Callable, List, Optional, Tuple

import numpy as np

from tensorlist._base import dtypes as _dtypes
from tensorlist._base.backends import filesystem, is_remote, localize
from tensorlist.errors import FormatError
from tensorlist.format import Limits, dims_problem, looks_like_list, open_regular, shape_nbytes

__all__ = ["FORMATS", "MAX_SAFETENSORS_HEADER", "DEFAULT_SHARD_BYTES", "NPZ_SIDECAR", "ST_DTYPES", "ST_NAMES",
           "ST_RANK", "ST_NOT_HERE", "ST_PACKED", "st_shape", "packed_shape", "RAW_DTYPES", "UINT", "MAX_EXPANSION", "MIN_EXPANSION_BYTES",
           "check_format", "check_shape", "row_of", "check_limits", "expansion_cap", "infer_format", "Entry", "Source",
           "MetadataDroppedWarning", "DCP_FORMATS", "TORCH_DCP_METADATA", "is_directory", "foreign_error",
           "TORCH_LEGACY_MAGIC", "GGUF_MAGIC"]

FORMATS = ("tensorlist", "lamp", "safetensors", "hf", "npz", "npy", "pt", "dcp", "torch-dcp", "hf-model",
           "tensorlist-model")
#: Checkpoint directories: ``dcp``, tensorlist's layout of torch.distributed.checkpoint (read and written);
#: ``torch-dcp``, the layout of DCP's own FileSystemWriter (read only: its metadata is a pickle).
DCP_FORMATS = ("dcp", "torch-dcp")
#: The metadata of a checkpoint that DCP's FileSystemWriter saved (a pickle, read only under restrictions).
TORCH_DCP_METADATA = ".metadata"

#: Largest safetensors header read or written (safetensors' own MAX_HEADER_SIZE, 100 MB decimal).
MAX_SAFETENSORS_HEADER = 100_000_000
#: Default largest shard written for a Hugging Face checkpoint (``save_pretrained``'s 5GB).
DEFAULT_SHARD_BYTES = 5_000_000_000
#: npz entry holding what npz cannot say itself (dtype names, metadata, named or positional).
NPZ_SIDECAR = "__tensorlist__"

#: safetensors' dtype enum (``Dtype`` in safetensors/src/tensor.rs, 0.8), in its declared order: its
#: writer sorts tensors by this order, descending, then by name, so that back-to-back tensors stay
#: aligned to their item size. Each maps to a tensorlist dtype name, or None where tensorlist has none.
_ST_ENUM = (("BOOL", "bool"), ("F4", "float4_e2m1fn_x2"), ("F6_E2M3", None), ("F6_E3M2", None), ("U8", "uint8"),
            ("I8", "int8"), ("F8_E5M2", "float8_e5m2"), ("F8_E4M3", "float8_e4m3fn"),
            ("F8_E8M0", "float8_e8m0fnu"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"),
            ("F8_E5M2FNUZ", "float8_e5m2fnuz"), ("I16", "int16"), ("U16", "uint16"), ("F16", "float16"),
            ("BF16", "bfloat16"), ("I32", "int32"), ("U32", "uint32"), ("F32", "float32"),
            ("C64", "complex64"), ("F64", "float64"), ("I64", "int64"), ("U64", "uint64"))
#: safetensors dtype names -> tensorlist dtype names (every dtype both have), and back.
ST_DTYPES = {st: name for st, name in _ST_ENUM if name is not None}
ST_NAMES = {v: k for k, v in ST_DTYPES.items()}
#: position of each safetensors dtype in its enum (the writer's sort key)
ST_RANK = {st: i for i, (st, _) in enumerate(_ST_ENUM)}
#: safetensors dtypes tensorlist cannot hold, and why: 6-bit floats have no torch ScalarType code (the
#: dataType), and four of them span three bytes, so no whole-byte element holds a whole number of them.
ST_NOT_HERE = {"F6_E2M3": "a 6-bit float", "F6_E3M2": "a 6-bit float"}
#: safetensors dtypes whose header shape counts values, several to a stored byte: values per element.
#: F4's shape is the logical one ([4, 16]); tensorlist's (torch's float4_e2m1fn_x2) counts bytes ([4, 8]).
ST_PACKED = {"F4": 2}
#: dtypes numpy's .npy header cannot name (ml_dtypes): stored as same-size unsigned ints
RAW_DTYPES = frozenset({"bfloat16", "float8_e5m2", "float8_e4m3fn", "float8_e5m2fnuz", "float8_e4m3fnuz",
                        "float8_e8m0fnu", "float4_e2m1fn_x2"})
UINT = {1: np.dtype("u1"), 2: np.dtype("<u2"), 4: np.dtype("<u4"), 8: np.dtype("<u8")}

#: What a source may expand to, unless the caller raises it (``max_total_bytes=``): this many times
#: its files' size, or MIN_EXPANSION_BYTES, whichever is larger. Formats that store bytes raw never
#: come near it (their tensors tile the file); a compressed npz member or torch record can (deflate
#: reaches about 1000x on zeros: a zip bomb), and so can a torch file whose tensors are many views
#: of one storage.
MAX_EXPANSION = 16
MIN_EXPANSION_BYTES = 64 << 20


def st_shape(st: str, shape) -> list:
    """The shape a safetensors header gives a tensor stored with ``shape`` (F4: the last dim in values)."""
    per = ST_PACKED.get(st)
    if per is None:
        return list(shape)
    if not shape:
        raise ValueError(f"a 0-d {st} tensor has no safetensors shape (its values are counted along the last "
                         "dim): reshape it to (1,)")
    return [*shape[:-1], shape[-1] * per]


def packed_shape(st: str, shape: list) -> Optional[list]:
    """The stored shape of a safetensors header's logical ``shape``, or None when it cannot be packed."""
    per = ST_PACKED.get(st)
    if per is None:
        return shape
    if not shape or type(shape[-1]) is not int or shape[-1] % per:
        return None
    return [*shape[:-1], shape[-1] // per]


class MetadataDroppedWarning(UserWarning):
    """The destination format cannot hold the source's metadata, which is not written."""


def row_of(dt: np.dtype, path: str, name: str, index: Optional[int] = None) -> _dtypes.DType:
    """The dtype table row of a numpy dtype read from a source, or a FormatError naming the tensor."""
    try:
        return _dtypes.from_numpy(dt)
    except (TypeError, KeyError) as e:
        raise FormatError(f"dtype {dt} has no tensorlist dataType code", file=path, tensor_index=index,
                          tensor_name=name, field="dtype") from e


def check_shape(shape, row: _dtypes.DType, *, file, index: Optional[int] = None, name: Optional[str] = None,
                field: str = "shape") -> int:
    """The tensor's byte size, or a FormatError when its shape breaks tensorlist's rules.

    The rules are FORMAT.md's for ``dims`` (rule 3, and rule 8 with its empty-tensor clause), applied
    to every source format so that whatever converts also loads: non-negative integers, at most
    ``MAX_DIMS`` of them, their product times the item size within 2**63 - 1, and for an empty tensor
    the product of its non-zero dims times the item size too (numpy cannot build ``(0, 2**62)`` of
    int16: "array is too big").
    """
    why = dims_problem(list(shape) if isinstance(shape, tuple) else shape, row.itemsize, row.name)
    if why is not None:
        raise FormatError(why, file=file, tensor_index=index, tensor_name=name, field=field)
    return shape_nbytes(shape, row.itemsize)[0]


def check_format(fmt: str) -> str:
    """``fmt`` itself, or a ValueError naming the formats there are."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}: expected one of {', '.join(FORMATS)}")
    return fmt


def infer_format(path, *, for_reading: bool = False) -> str:
    """The format a file name implies (see the package's table); reading also sniffs the bytes.

    A checkpoint directory (:func:`is_directory`: a name ending with ``/``, an
    existing local directory, or a URL prefix holding objects, with or without
    its trailing ``/``) is a checkpoint: ``torch-dcp`` when it holds DCP's own
    ``.metadata`` and no ``.metadata.json``, else ``dcp``.

    >>> infer_format("model.safetensors.index.json"), infer_format("x.npz"), infer_format("w.tl")
    ('hf', 'npz', 'tensorlist')
    >>> infer_format("s3://bucket/run/ckpt/")
    'dcp'
    """
    name = os.fspath(path)
    if is_directory(name):
        return _checkpoint_format(name) if for_reading else "dcp"
    p = name.lower()
    if p.endswith(".index.json"):
        return "hf"
    for ext, fmt in ((".safetensors", "safetensors"), (".npz", "npz"), (".npy", "npy"), (".pt", "pt"),
                     (".pth", "pt"), (".bin", "pt"), (".ckpt", "pt"), (".lamp", "lamp")):
        if p.endswith(ext):
            return fmt
    if for_reading and not is_remote(os.fspath(path)):
        sniffed = _sniff(localize(os.fspath(path)))
        if sniffed in FORMATS:
            return sniffed
    return "tensorlist"


def is_directory(path) -> bool:
    """Whether ``path`` names a directory, the one rule for "is this a checkpoint directory" by its name.

    A name ending with ``/`` always does (a destination to be created). Without
    it: an existing local directory (``file://`` URLs too), or a remote URL
    under which objects lie (``memory://ck``, ``s3://bucket/ck``: an object
    store has no directories, only keys sharing the prefix ``ck/``; fsspec's
    ``isdir`` asks for one of them). A URL that cannot be asked (no fsspec, no
    such bucket, no credentials) is not a directory here: the reader that
    opens it then says what is wrong, in its own words.

    >>> is_directory("s3://bucket/run/ckpt/"), is_directory("no/such/dir")
    (True, False)
    """
    name = os.fspath(path)
    if name.endswith("/"):
        return True
    if not is_remote(name):
        return os.path.isdir(localize(name))
    try:
        fs, p = filesystem(name)
        return bool(fs.isdir(p))
    except Exception:  # ImportError, or anything a storage backend raises: the reader reports it
        return False


def _checkpoint_format(path: str) -> str:
    """A directory's format: a checkpoint by its metadata, else a model directory (``modeldir``), else ``dcp``."""
    from tensorlist.dcp import METADATA_NAME, holds  # here: a file's name never needs the checkpoint reader

    try:
        if not holds(path, METADATA_NAME):
            if holds(path, TORCH_DCP_METADATA):
                return "torch-dcp"
            if not is_remote(path):
                from tensorlist.convert.modeldir import model_format

                return model_format(localize(path)) or "dcp"
    except Exception:  # a URL that cannot be asked: the dcp reader says why, naming the metadata it needs
        pass
    return "dcp"


#: The first bytes of a file ``torch.save`` wrote in its legacy (pre-1.6, not zip) format: pickle protocol 2
#: of torch's magic number 0x1950a86a20f9469cfc6c (torch/serialization.py, ``MAGIC_NUMBER``).
TORCH_LEGACY_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19"
#: The first bytes of a GGUF file (llama.cpp's format; tensorlist recognises it, and reads it not).
GGUF_MAGIC = b"GGUF"


def _sniff(path: str) -> Optional[str]:
    """The format a local file's first bytes say it is (``FORMATS``, or ``"gguf"``), or None.

    The one recognizer of other formats' bytes: :func:`infer_format` reads a
    file named without a known extension by it, and :func:`foreign_error` says
    what a file handed to a tensorlist reader is instead.
    """
    try:
        # a FIFO or device is not sniffed (and never blocks here): the opener refuses it by name
        fd = open_regular(path, what="file")
    except (OSError, FormatError):
        return None
    with os.fdopen(fd, "rb") as f:
        head = f.read(16)
        if head.startswith(b"\x93NUMPY"):
            return "npy"
        if head.startswith(TORCH_LEGACY_MAGIC):
            return "pt"
        if head.startswith(GGUF_MAGIC):
            return "gguf"
        if head.startswith(b"PK"):
            import zipfile  # here: sniffing a .tl or .json file never needs it

            f.seek(0)
            try:
                with zipfile.ZipFile(f) as z:
                    return "pt" if any(n.endswith("data.pkl") for n in z.namelist()) else "npz"
            except zipfile.BadZipFile:
                return None
    if len(head) >= 9 and head[8:].lstrip(b" \t\r\n")[:1] == b"{":  # safetensors accepts leading spaces
        n = struct.unpack("<Q", head[:8])[0]
        if 2 <= n <= MAX_SAFETENSORS_HEADER:
            return "safetensors"
    return None


#: What a file of each format recognised in place of a tensorlist file is called in the message saying so.
_FOREIGN_NAMES = {"safetensors": "a safetensors file", "hf": "the index of a Hugging Face sharded checkpoint",
                  "npz": "a NumPy .npz archive", "npy": "a NumPy .npy array", "pt": "a torch file (torch.save)",
                  "dcp": "a checkpoint directory (tensorlist's DCP layout)",
                  "torch-dcp": "a checkpoint directory (DCP's FileSystemWriter layout)",
                  "gguf": "a GGUF file (llama.cpp's format)"}


def _is_hf_index(doc: Any) -> bool:
    return isinstance(doc, dict) and isinstance(doc.get("weight_map"), dict) and not looks_like_list(doc)


def _recognize(path: str) -> Optional[str]:
    """The format of the local file or directory ``path`` when it is recognisably not a tensorlist file."""
    if is_remote(path):
        return None  # a URL is not fetched again on an error path
    local = localize(path)
    if os.path.isdir(local):
        from tensorlist.dcp import METADATA_NAME  # here: a file's name never needs the checkpoint reader

        if os.path.isfile(os.path.join(local, METADATA_NAME)) or \
                os.path.isfile(os.path.join(local, TORCH_DCP_METADATA)):
            return _checkpoint_format(local)
        return None
    return _sniff(local)


def _tensorlist_name(path: str) -> str:
    """The tensorlist file a converted ``path`` would naturally be: its name with ``.tl`` for its extensions."""
    base = path.rstrip("/") or path
    for ext in (".safetensors.index.json", ".index.json", ".safetensors", ".npz", ".npy", ".pt", ".pth", ".bin",
                ".ckpt", ".gguf"):
        if base.lower().endswith(ext):
            return base[: -len(ext)] + ".tl"
    return base + ".tl"


def foreign_error(path, doc: Any = None) -> Optional[FormatError]:
    """A FormatError saying what ``path`` is, when a tensorlist reader was handed another format's file; else None.

    The one place the package tells a user who passed a safetensors, npz, npy,
    torch or GGUF file, a Hugging Face index or a checkpoint directory where a
    tensorlist file was expected what that file is, and which command reads it.
    The readers call it when a file fails to parse (``format.read_json_file``),
    with ``doc`` when a JSON document holds no TensorList: a valid file never
    pays for it.
    """
    import shlex

    name = os.fspath(path)
    fmt = "hf" if _is_hf_index(doc) else _recognize(name) if doc is None else None
    if fmt is None:
        return None
    shown, target = shlex.quote(name), shlex.quote(_tensorlist_name(name))
    if fmt == "gguf":
        how = "tensorlist does not read GGUF (llama.cpp's gguf package does)"
    elif fmt in DCP_FORMATS:
        how = (f"`tensorlist validate {shown}` checks it, `tensorlist inspect {shown}` lists it, "
               f"`tensorlist convert {shown} {target}` flattens it into one")
    else:
        how = f"`tensorlist convert {shown} {target}` converts it, `tensorlist inspect {shown}` lists its tensors"
    return FormatError(f"{_FOREIGN_NAMES[fmt]}, not a tensorlist file: {how}", file=name)


class Entry:
    """One tensor of a source, described before any of its bytes are read."""

    __slots__ = ("name", "dtype", "shape", "nbytes", "_get")

    def __init__(self, name: str, dtype: _dtypes.DType, shape: Tuple[int, ...], get: Callable[[], np.ndarray]):
        self.name, self.dtype, self.shape = name, dtype, tuple(shape)
        self.nbytes = int(math.prod(self.shape)) * dtype.itemsize
        self._get = get

    def array(self) -> np.ndarray:
        """The tensor's bytes, little-endian and C-contiguous (usually a view of a mapped file).

        bfloat16/float8 come as bit carriers (``DType.bits``, which every writer stores as their dtype): a
        conversion moves bytes, so it needs no ml_dtypes (none for s390x) and never rounds a value.
        """
        a = _dtypes.as_little(self._get())
        if self.dtype.carried:  # a source that made ml_dtypes values (checkpoint directories do): the same bytes
            a = a.view(self.dtype.bits)
        return a if a.flags.c_contiguous else np.ascontiguousarray(a).reshape(a.shape)

    def values(self) -> np.ndarray:
        """:meth:`array` with its dtype's values (bfloat16/float8 through ml_dtypes), for arithmetic."""
        a = self.array()
        return a.view(self.dtype.numpy) if self.dtype.carried else a


class Source:
    """The tensors of a file, in order, with the list-level metadata.

    Attributes:
        path: the source file.
        format: its format name.
        entries: one :class:`Entry` per tensor.
        named: False for a positional list (lamp, ``.npy``): names are ``"0"``, ``"1"``...
        metadata: list-level metadata (any JSON value) or None.
        disk_bytes: the size of the files read (what the expansion cap is relative to), or None
            when unknown (a remote file).
    """

    def __init__(self, path: str, fmt: str, entries: List[Entry], named: bool, metadata: Any, closers=(),
                 disk_bytes: Optional[int] = None):
        self.path, self.format, self.entries, self.named, self.metadata = path, fmt, entries, named, metadata
        self.disk_bytes = disk_bytes
        self._closers = list(closers)

    @property
    def nbytes(self) -> int:
        return sum(e.nbytes for e in self.entries)

    def on_close(self, closer: Callable[[], Any]) -> None:
        """Has :meth:`close` call ``closer`` (closers run last added first)."""
        self._closers.append(closer)

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


def expansion_cap(disk_bytes: Optional[int], max_total_bytes: Optional[int]) -> Optional[int]:
    """The most bytes a source of ``disk_bytes`` may expand to (None: no cap)."""
    if max_total_bytes is not None:
        return max_total_bytes
    if disk_bytes is None:
        return None
    return max(MAX_EXPANSION * disk_bytes, MIN_EXPANSION_BYTES)


def check_limits(src: Source, limits: Limits, *, expansion: bool = True) -> None:
    """Refuses a source with more tensors than ``limits.max_tensors``, or (``expansion``) expanding past the cap.

    Run before anything is written or read in bulk: the entries' sizes come from headers alone.
    """
    n = len(src.entries)
    if n > limits.max_tensors:
        raise FormatError(f"{n} tensors, above the limit of {limits.max_tensors} (raise it with max_tensors=)",
                          file=src.path)
    cap = expansion_cap(src.disk_bytes, limits.max_total_bytes) if expansion else None
    total = src.nbytes
    if cap is not None and total > cap:
        how = "the limit" if limits.max_total_bytes is not None else \
            f"the limit of {MAX_EXPANSION} x its {src.disk_bytes} bytes on disk"
        raise FormatError(f"its tensors expand to {total} bytes, above {how} ({cap} bytes; a compressed or "
                          "aliased source, or a zip bomb): raise it with max_total_bytes=", file=src.path)
