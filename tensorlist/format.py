"""The TensorList descriptor: named constants, parsed types, and the validator.

The rules are those of docs/FORMAT.md, checked in one fixed order that stops
at the first failure: size cap, strict JSON, the type of every field, then the
cross-field checks (dtype known, dims x itemsize = byteLength, alignment,
bounds, overlap: the last ones in C with checked 64-bit arithmetic), names,
location, and finally the data file's size. Every failure is a FormatError
naming the file, the tensor (index and name) and the field.
"""
from __future__ import annotations

import json
import os
import posixpath
from typing import Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

import numpy as np

from tensorlist._base import dtypes as _dtypes
from tensorlist._base import lowlevel
from tensorlist._base.files import confine, inside, open_regular, read_capped, read_regular, sha256_file
from tensorlist._base.jsonio import escape_pointer, loads_strict, resolve_pointer, walk
from tensorlist.crypto.spec import parse_encryption
from tensorlist.errors import FormatError, short_repr

__all__ = [
    "FORMAT_VERSION",
    "LIST_ALIGNMENT",
    "MIN_TENSOR_ALIGNMENT",
    "DEFAULT_ALIGNMENT",
    "MAX_ALIGNMENT",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_TENSORS",
    "MAX_INT",
    "MAX_DIMS",
    "short_repr",
    "shape_nbytes",
    "dims_problem",
    "TensorSpan",
    "Limits",
    "TensorInfo",
    "ListDescriptor",
    "parse_list",
    "is_tensor_list",
    "find_tensor_lists",
    "read_json_file",
    "not_tensorlist",
    "no_list_error",
    "read_json_bytes",
    "read_capped",
    "open_regular",
    "read_regular",
    "sha256_file",
    "confine",
    "select_list",
    "looks_like_list",
    "LIST_KEYS",
    "check_location",
    "check_data_path",
]

#: Version of the tensorlist extensions; written as ``formatVersion``. Files
#: without the key are plain lamp files (version 0 rules).
FORMAT_VERSION = 1
#: The version of an encrypted list (docs/FORMAT.md, "Encrypted lists"); plain lists stay version 1.
ENCRYPTED_VERSION = 2
#: A list's ``byteOffset`` is a multiple of this (lamp asserts it; a page on most systems).
LIST_ALIGNMENT = lowlevel.LIST_ALIGNMENT
#: Every tensor starts at a multiple of 8 bytes from its list's start (lamp's padding).
MIN_TENSOR_ALIGNMENT = lowlevel.MIN_TENSOR_ALIGNMENT
#: tensorlist's own default: 64 bytes, a cache line and enough for AVX-512 loads.
DEFAULT_ALIGNMENT = 64
#: Largest tensor alignment a writer accepts (1 MiB; padding beyond that is waste).
MAX_ALIGNMENT = 1 << 20
#: Descriptors larger than this are refused before parsing (a policy limit the
#: caller can raise): JSON parsing costs far more memory than the text, and a
#: million named tensors fit in about 100 MB.
MAX_DESCRIPTOR_BYTES = 256 << 20
#: Tensor-count limit per list (policy, raisable): bounds the work and memory a
#: hostile descriptor can demand before any data is read.
MAX_TENSORS = 10_000_000
#: Largest offset or length: JSON integers must fit a signed 64-bit value (lamp's Long).
MAX_INT = (1 << 63) - 1
#: Most dims a tensor may have: numpy's limit (NPY_MAXDIMS in numpy 2), so every valid file loads.
MAX_DIMS = 64


class Limits(NamedTuple):
    """Policy limits applied while reading; raise them for unusual files.

    ``max_total_bytes`` caps a list's ``byteLength`` (what ``load(mmap=False)``
    allocates and reads). None, the default, leaves it bounded by the data
    file's size only: overlap is refused, so the tensors' total is at most the
    list's ``byteLength``, which is at most the file's size (rule 13). Set it
    when the file may be sparse or come from someone you do not trust with
    your memory.
    """

    max_descriptor_bytes: int = MAX_DESCRIPTOR_BYTES
    max_tensors: int = MAX_TENSORS
    max_total_bytes: Optional[int] = None

    @classmethod
    def of(cls, max_descriptor_bytes: Optional[int] = None, max_tensors: Optional[int] = None,
           max_total_bytes: Optional[int] = None) -> "Limits":
        """Limits from keyword arguments, None meaning the default."""
        d = cls()
        return cls(d.max_descriptor_bytes if max_descriptor_bytes is None else max_descriptor_bytes,
                   d.max_tensors if max_tensors is None else max_tensors,
                   max_total_bytes)


class TensorInfo(NamedTuple):
    """One tensor of a list, as described (offsets relative to the list's start).

    Attributes:
        index: position in the list.
        name: the tensor's name, or None in a positional (lamp) list.
        dtype: the dtype table row (``dtype.numpy``, ``dtype.code``, ``dtype.name``).
        shape: the dims; ``()`` for a scalar.
        byte_offset: start, relative to the list's ``byteOffset``.
        byte_length: unpadded length in bytes.
        crc32c: CRC32C of the stored bytes, or None when not recorded.
    """

    index: int
    name: Optional[str]
    dtype: _dtypes.DType
    shape: Tuple[int, ...]
    byte_offset: int
    byte_length: int
    crc32c: Optional[int]

    @property
    def key(self) -> str:
        """The key under which ``load`` returns it: the name, or the index as a string."""
        return self.name if self.name is not None else str(self.index)


class TensorTable(Sequence):
    """The tensors of a list as columns; ``TensorInfo`` rows are made on demand.

    A million-tensor list costs a few columns instead of a million objects.
    """

    __slots__ = ("names", "dtypes", "shapes", "offsets", "lengths", "crcs")

    def __init__(self, names, dtypes, shapes, offsets, lengths, crcs):
        self.names: Optional[List[str]] = names  # None for a positional list
        self.dtypes: List[_dtypes.DType] = dtypes
        self.shapes: List[Tuple[int, ...]] = shapes
        self.offsets: List[int] = offsets
        self.lengths: List[int] = lengths
        self.crcs: Optional[List[Optional[int]]] = crcs  # None when no tensor has one

    def __len__(self) -> int:
        return len(self.dtypes)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self.dtypes)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"tensor index {i} out of range for {n} tensors")
        return TensorInfo(i, self.names[i] if self.names is not None else None, self.dtypes[i],
                          self.shapes[i], self.offsets[i], self.lengths[i],
                          self.crcs[i] if self.crcs is not None else None)

    def keys(self) -> List[str]:
        return list(self.names) if self.names is not None else [str(i) for i in range(len(self.dtypes))]

    def __repr__(self) -> str:
        return f"<TensorTable of {len(self)} tensors>"


class ListDescriptor(NamedTuple):
    """A parsed and validated TensorList.

    Attributes:
        location: the data file, relative to ``base_dir``.
        byte_offset: where the list's region starts in the data file.
        byte_length: the region's length (padding included).
        tensors: the tensors, in order.
        metadata: the list-level ``metadata`` value (any JSON), or None.
        version: ``formatVersion``, or None for a plain lamp descriptor.
        file: the JSON document the descriptor came from, or None.
        pointer: the descriptor's JSON pointer inside that document.
        base_dir: the directory ``location`` is resolved against, or None.
        raw: the descriptor's JSON object as parsed.
        encryption: the checked ``encryption`` object of an encrypted list
            (``crypto.spec.Encryption``), or None.
    """

    location: str
    byte_offset: int
    byte_length: int
    tensors: TensorTable
    metadata: Any
    version: Optional[int]
    file: Optional[str]
    pointer: str
    base_dir: Optional[str]
    raw: Dict[str, Any]
    encryption: Any = None  # crypto.spec.Encryption of an encrypted list

    @property
    def data_path(self) -> Optional[str]:
        """Absolute path of the data file, or None when there is no base directory."""
        if posixpath.isabs(self.location):  # only accepted with allow_outside=True
            return self.location
        if self.base_dir is None:
            return None
        return os.path.join(self.base_dir, *self.location.split("/"))

    def keys(self) -> List[str]:
        return self.tensors.keys()


_MISSING = object()  # an absent key, as opposed to a JSON null


def _is_int(v) -> bool:
    return type(v) is int  # bool is an int subclass; JSON true is not a number


def is_tensor_list(obj: Any) -> bool:
    """Whether ``obj`` looks like a TensorList object (has location/byteOffset/byteLength)."""
    return (
        isinstance(obj, dict)
        and isinstance(obj.get("location"), str)
        and _is_int(obj.get("byteOffset"))
        and _is_int(obj.get("byteLength"))
    )


def find_tensor_lists(doc: Any) -> List[str]:
    """JSON pointers of every TensorList embedded in ``doc``, in document order.

    A TensorList's own contents are not searched (its tensors are not lists).
    """
    found: List[str] = []
    stack: List[Tuple[str, Any]] = [("", doc)]
    while stack:
        ptr, node = stack.pop()
        if isinstance(node, dict):
            if is_tensor_list(node):
                found.append(ptr)
                continue
            for k in reversed(list(node)):
                v = node[k]
                if isinstance(v, (dict, list)):
                    stack.append((f"{ptr}/{escape_pointer(k)}", v))
        elif isinstance(node, list):
            for i in range(len(node) - 1, -1, -1):
                v = node[i]
                if isinstance(v, (dict, list)):
                    stack.append((f"{ptr}/{i}", v))
    return found


def read_json_file(path, limits: Limits = Limits(), *, fast: bool = False) -> Any:
    """Reads and strictly parses a JSON document: a regular file, refused above the size cap.

    With ``fast``, the ``tensors`` arrays of TensorLists are left unparsed as
    :class:`TensorSpan` objects for ``parse_list`` to read in C (the rest of the
    document is parsed as usual); only the reading path uses this.

    A file that is not JSON but recognisably another format's (safetensors,
    npz, torch, a checkpoint directory...) is refused saying so
    (:func:`not_tensorlist`).
    """
    path = os.fspath(path)
    try:
        text = read_regular(path, limits.max_descriptor_bytes, what="descriptor")
        return read_json_bytes(text, file=path, limits=limits, fast=fast)
    except FormatError as e:
        other = not_tensorlist(path)
        if other is None:
            raise
        raise other from e


def not_tensorlist(file, doc: Any = None) -> Optional[FormatError]:
    """The error saying what ``file`` is when a tensorlist reader was handed another format's file, else None.

    Asked only once reading has failed (a valid file never pays for it): of the
    file's first bytes, or of ``doc``, a parsed document holding no TensorList
    (a Hugging Face index). The formats and their messages are the converters'
    (``tensorlist.convert.formats.foreign_error``), which sits above this module:
    the package facade registers it as the ``"foreign"`` backend, imported on
    this path only.
    """
    if file is None:
        return None
    from tensorlist._base import backends

    return backends.dispatch("foreign", str(file))(file, doc)


def no_list_error(doc: Any, file) -> FormatError:
    """The error for a document that is no TensorList and embeds none (or says what other format it is)."""
    return not_tensorlist(file, doc) or FormatError("is not a TensorList descriptor and embeds none", file=file)


def read_json_bytes(buf, *, file=None, limits: Limits = Limits(), fast: bool = False) -> Any:
    """Strictly parses a JSON document held in memory, refusing it above the size cap.

    The one capped strict parser: local files, remote objects and records all
    come through here. ``fast`` as for :func:`read_json_file`.
    """
    if len(buf) > limits.max_descriptor_bytes:
        raise FormatError(f"descriptor is {len(buf)} bytes, above the limit of {limits.max_descriptor_bytes} "
                          "(raise it with max_descriptor_bytes=)", file=file)
    if fast and isinstance(buf, (bytes, bytearray)):
        doc = _fast_document(bytes(buf), file)
        if doc is not None:
            return doc
    return loads_strict(buf, file=file)


#: The keys that make an object a TensorList candidate (validated as one, not searched inside).
LIST_KEYS = ("tensors", "location", "byteOffset", "byteLength")


def looks_like_list(doc: Any) -> bool:
    """Whether ``doc`` is itself meant as a TensorList (has any of its keys)."""
    return isinstance(doc, dict) and any(k in doc for k in LIST_KEYS)


def select_list(doc: Any, pointer: Optional[str], file: Optional[str]) -> Tuple[Any, str]:
    """(object, pointer) of the one TensorList to read from a parsed document.

    The document itself when it is a TensorList, the object at ``pointer``
    when one is given; a document that embeds lists but is none needs one.
    """
    if pointer is not None:
        return resolve_pointer(doc, pointer, file=file), pointer
    if looks_like_list(doc):
        return doc, ""
    found = find_tensor_lists(doc)
    if found:
        shown = ", ".join(repr(p) for p in found[:10]) + (" ..." if len(found) > 10 else "")
        raise FormatError(
            f"is not a TensorList descriptor but a document embedding {len(found)} of them at "
            f"{shown}: pass pointer= to choose one", file=file)
    raise no_list_error(doc, file)


def _fast_document(buf: bytes, file) -> Any:
    """The document with TensorLists' tensors arrays as TensorSpans, or None to use the exact path."""
    try:
        buf.decode("utf-8")
    except UnicodeDecodeError:
        return None
    status, spans, _ = lowlevel.json_scan(buf)
    if status != lowlevel.JSON_OK or not spans:
        return None
    spans.sort()
    keep: List[Tuple[int, int]] = []
    for s_, e_ in spans:
        if keep and s_ < keep[-1][1]:
            continue  # inside an outer list's tensors array
        keep.append((s_, e_))
    parts, last, markers = [], 0, {}
    for k, (s_, e_) in enumerate(keep):
        parts.append(buf[last:s_])
        parts.append(b'"\\u0000tl%d"' % k)
        markers[f"\x00tl{k}"] = TensorSpan(buf, s_, e_)
        last = e_
    parts.append(buf[last:])
    skeleton = loads_strict(b"".join(parts), file=file, depth_checked=True)  # the C scan bounds depth
    # Each placeholder must come back exactly where it was put: as the "tensors" value of an
    # object. A string of the same shape anywhere else was in the document itself (JSON escapes
    # can spell "\u0000tl0"): the placeholders are then ambiguous and the exact path decides.
    # Parents are visited before children, so a replaced placeholder is never seen as a string.
    for _, node in walk(skeleton):
        if type(node) is str:
            if node.startswith("\x00tl"):
                return None
        elif type(node) is dict:
            t = node.get("tensors")
            if type(t) is str and t.startswith("\x00tl"):
                span = markers.pop(t, None)
                if span is None:
                    return None
                node["tensors"] = span
    if markers:
        return None
    return skeleton


def check_location(location: str, *, file=None, field="location", allow_outside=False) -> None:
    """Refuses a location that is absolute or climbs out of the document's directory."""
    if location == "" or "\x00" in location or not _utf8(location):
        raise FormatError(f"must be a non-empty relative POSIX path of UTF-8 text without NUL, got {short_repr(location)}",
                          file=file, field=field)
    if allow_outside:
        return
    if location.startswith("/") or "\\" in location or (len(location) > 1 and location[1] == ":"):
        raise FormatError(
            f"absolute or non-POSIX path {location!r} refused (pass allow_outside=True to trust it)",
            file=file, field=field)
    norm = posixpath.normpath(location)
    if norm == ".." or norm.startswith("../") or norm == ".":
        raise FormatError(
            f"{location!r} escapes the descriptor's directory (pass allow_outside=True to trust it)",
            file=file, field=field)


_LAYOUT_REASONS = {
    "align": "is not aligned",
    "length": "is not a multiple of the dtype's item size",
    "overflow": "byteOffset + byteLength overflows 64 bits",
    "bounds": "ends past the list's byteLength",
}


def parse_list(
    obj: Any,
    *,
    file: Optional[str] = None,
    pointer: str = "",
    base_dir: Optional[str] = None,
    allow_outside: bool = False,
    limits: Limits = Limits(),
) -> ListDescriptor:
    """Checks a parsed TensorList object and returns its typed form.

    This is the fast validator used by ``load`` and ``open``; ``validate``
    runs the JSON Schema first and then this.

    Raises:
        FormatError: at the first rule broken (see docs/FORMAT.md).
    """
    ctx = f"{pointer} " if pointer else ""

    def fail(reason, field=None, index=None, name=None):
        fld = f"{pointer}/{field}" if (pointer and field) else field
        raise FormatError(reason, file=file, tensor_index=index, tensor_name=name, field=fld)

    if not isinstance(obj, dict):
        fail(f"{ctx}a TensorList must be a JSON object, got {type(obj).__name__}")
    for key in ("location", "byteOffset", "byteLength"):
        if key not in obj:
            fail("missing required field", key)
    location = obj["location"]
    if not isinstance(location, str):
        fail(f"must be a string, got {location!r}", "location")
    check_location(location, file=file, field=f"{pointer}/location" if pointer else "location",
                   allow_outside=allow_outside)
    list_offset, list_length = obj["byteOffset"], obj["byteLength"]
    for key, v in (("byteOffset", list_offset), ("byteLength", list_length)):
        if not _is_int(v) or v < 0 or v > MAX_INT:
            fail(f"must be an integer in [0, 2**63), got {v!r}", key)
    if list_offset % LIST_ALIGNMENT:
        fail(f"must be a multiple of {LIST_ALIGNMENT}, got {list_offset}", "byteOffset")
    if list_offset + list_length > MAX_INT:
        fail("byteOffset + byteLength overflows 64 bits", "byteLength")
    if limits.max_total_bytes is not None and list_length > limits.max_total_bytes:
        fail(f"list is {list_length} bytes, above the limit of {limits.max_total_bytes} "
             "(raise it with max_total_bytes=)", "byteLength")
    version = obj.get("formatVersion", _MISSING)
    if version is _MISSING:
        version = None
    elif not _is_int(version) or not 1 <= version <= ENCRYPTED_VERSION:
        fail(f"unsupported format version {version!r} (this reader knows 1..{ENCRYPTED_VERSION})",
             "formatVersion")
    tensors = obj.get("tensors", [])
    table = None
    if isinstance(tensors, TensorSpan):
        table = _fast_table(tensors, limits)
        if table is None:  # the fast path declined: the exact reader explains why
            tensors = tensors.materialize(file)
    if table is None:
        if not isinstance(tensors, list):
            fail(f"must be an array, got {type(tensors).__name__}", "tensors")
        if len(tensors) > limits.max_tensors:
            fail(f"{len(tensors)} tensors, above the limit of {limits.max_tensors} (raise it with max_tensors=)",
                 "tensors")
        table = _slow_table(tensors, fail)

    n = len(table)
    if n:
        spans = np.empty(n, dtype=lowlevel.SPAN_DTYPE)
        spans["offset"] = table.offsets
        spans["length"] = table.lengths
        spans["itemsize"] = [d.itemsize for d in table.dtypes] if n < 64 else \
            _ITEMSIZE_BY_CODE[np.fromiter((d.code for d in table.dtypes), np.int64, n)]
        for i in np.flatnonzero(spans["length"] == 0).tolist():
            # An empty tensor's other dims must still make a representable shape (numpy and
            # torch refuse e.g. [0, 2**62] of int16: the non-zero dims overflow 64 bits).
            why = dims_problem(table.shapes[i], table.dtypes[i].itemsize)
            if why is not None:
                fail(why, "dims", i, table[i].name)
        status, bad, other = lowlevel.check_layout(spans, list_length, MIN_TENSOR_ALIGNMENT)
        if status:
            kind = lowlevel.STATUS_NAMES[status]
            t = table[bad]
            if kind == "overlap":
                o = table[other]
                fail(f"bytes [{t.byte_offset}, {t.byte_offset + t.byte_length}) overlap tensor {other}"
                     + (f" ({o.name!r})" if o.name is not None else "")
                     + f" at [{o.byte_offset}, {o.byte_offset + o.byte_length})", "byteOffset", bad, t.name)
            if kind == "align":
                fail(f"{t.byte_offset} is not a multiple of {MIN_TENSOR_ALIGNMENT} and of the item size "
                     f"{t.dtype.itemsize}", "byteOffset", bad, t.name)
            if kind == "bounds":
                fail(f"tensor ends at {t.byte_offset + t.byte_length}, past the list's byteLength "
                     f"{list_length}", "byteLength", bad, t.name)
            fail(_LAYOUT_REASONS.get(kind, kind), "byteOffset", bad, t.name)
    encryption = None
    if "encryption" in obj or version == ENCRYPTED_VERSION:
        if version != ENCRYPTED_VERSION or "encryption" not in obj:
            fail(f"an encrypted list has formatVersion {ENCRYPTED_VERSION} and an encryption object, and only it",
                 "formatVersion")
        if "metadata" in obj:
            fail("an encrypted list keeps its metadata inside encryption/metadata, never in plain text", "metadata")
        encryption = parse_encryption(obj["encryption"], table, list_offset, list_length, fail)

    return ListDescriptor(
        location=location,
        byte_offset=list_offset,
        byte_length=list_length,
        tensors=table,
        metadata=obj.get("metadata"),
        version=version,
        file=file,
        pointer=pointer,
        base_dir=base_dir,
        raw=obj,
        encryption=encryption,
    )


def _utf8(text: str) -> bool:
    """Whether ``text`` can be written as UTF-8 (JSON's "\\ud800" escapes parse to lone surrogates)."""
    try:
        text.encode("utf-8")
        return True
    except UnicodeEncodeError:
        return False


def shape_nbytes(dims, itemsize: int) -> Tuple[Optional[int], bool]:
    """``(dims x itemsize or None past 2**63, whether the non-zero dims x itemsize fit 2**63)``.

    The size arithmetic of rule 8, bounded: the product stops growing at the
    first value past 2**63 - 1, so hostile dims cost one multiplication each.
    An empty tensor (a 0 dim) is 0 bytes, but numpy and torch still refuse to
    build it when its other dims overflow (``[0, 2**62]`` of int16).
    """
    n = itemsize
    zero = False
    for d in dims:
        if d == 0:
            zero = True
        elif n <= MAX_INT:
            n *= d
    return (0 if zero else (n if n <= MAX_INT else None)), n <= MAX_INT


def dims_problem(dims, itemsize: int, dtype_name: str = "") -> Optional[str]:
    """Why ``dims`` cannot be a tensor's shape (rules 3 and 8), or None: the one shape rule.

    Non-negative integers below 2**63, at most ``MAX_DIMS`` of them, and the
    product of the non-zero ones times the item size within 2**63 - 1. Every
    reader of every format (descriptors here, the converters' sources) asks this.
    """
    if type(dims) not in (list, tuple):
        return f"must be an array of non-negative integers, got {short_repr(dims)}"
    if len(dims) > MAX_DIMS:
        return f"{len(dims)} dims, more than the {MAX_DIMS} a tensor may have"
    for d in dims:
        if not _is_int(d) or d < 0 or d > MAX_INT:
            return f"must be an array of non-negative integers, got {short_repr(list(dims))}"
    size, fits = shape_nbytes(dims, itemsize)
    if not fits:
        what = f" ({dtype_name})" if dtype_name else ""
        return (f"dims {short_repr(list(dims))} x {itemsize} bytes{what} overflow 64 bits in their non-zero dims"
                if size == 0 else f"dims {short_repr(list(dims))} x {itemsize} bytes{what} is more than 2**63 bytes")
    return None


def _slow_table(tensors: list, fail) -> TensorTable:
    """Checks every tensor object one by one (the exact path, with precise messages)."""
    from_code = _dtypes.from_code
    names: List[Optional[str]] = []
    dtypes, shapes, offsets, lengths, crcs = [], [], [], [], []
    names_seen: Dict[str, int] = {}
    named = None
    for i, t in enumerate(tensors):
        if type(t) is not dict:
            fail(f"must be a JSON object, got {type(t).__name__}", f"tensors/{i}", i)
        name = t.get("name", _MISSING)
        if name is _MISSING:
            name = None
        elif type(name) is not str:  # null included: the key is optional, not nullable
            fail(f"must be a string, got {short_repr(name)}", "name", i)
        elif not _utf8(name):
            fail(f"{short_repr(name)} is not valid Unicode (a lone surrogate): names must be UTF-8 text", "name", i)
        if named is None:
            named = name is not None
        elif named != (name is not None):
            fail("either every tensor of a list has a name or none has", "name", i, name)
        if name is not None:
            if name in names_seen:
                fail(f"duplicate name (also tensor {names_seen[name]})", "name", i, name)
            names_seen[name] = i
        code = t.get("dataType", _MISSING)
        if code is _MISSING:
            fail("missing required field", "dataType", i, name)
        if not _is_int(code):
            fail(f"must be an integer, got {code!r}", "dataType", i, name)
        dt = from_code(code)
        if dt is None:
            what = _dtypes.UNSUPPORTED_CODES.get(code)
            fail(f"dtype code {code} ({what}) has no numpy representation" if what
                 else f"unknown dtype code {code}", "dataType", i, name)
        off = t.get("byteOffset", _MISSING)
        ln = t.get("byteLength", _MISSING)
        if off is _MISSING:
            fail("missing required field", "byteOffset", i, name)
        if ln is _MISSING:
            fail("missing required field", "byteLength", i, name)
        if not _is_int(off) or off < 0 or off > MAX_INT:
            fail(f"must be an integer in [0, 2**63), got {off!r}", "byteOffset", i, name)
        if not _is_int(ln) or ln < 0 or ln > MAX_INT:
            fail(f"must be an integer in [0, 2**63), got {ln!r}", "byteLength", i, name)
        dims = t.get("dims", [])
        why = dims_problem(dims, dt.itemsize, dt.name) if type(dims) is list else \
            f"must be an array of non-negative integers, got {short_repr(dims)}"
        if why is not None and "overflow" not in why and "more than 2**63" not in why:
            fail(why, "dims", i, name)  # the rank and the values; a size past 2**63 is byteLength's mismatch
        size, _ = shape_nbytes(dims, dt.itemsize)
        if size != ln:
            fail(f"dims {short_repr(dims)} x {dt.itemsize} bytes ({dt.name}) = "
                 f"{size if size is not None else 'more than 2**63'}, but byteLength is {ln}", "byteLength", i, name)
        crc = t.get("crc32c", _MISSING)
        if crc is _MISSING:
            crc = None
        elif not _is_int(crc) or not 0 <= crc <= 0xFFFFFFFF:
            fail(f"must be an unsigned 32-bit integer, got {crc!r}", "crc32c", i, name)
        names.append(name)
        dtypes.append(dt)
        shapes.append(tuple(dims))
        offsets.append(off)
        lengths.append(ln)
        crcs.append(crc)
    return TensorTable(names if named else None, dtypes, shapes, offsets, lengths,
                       crcs if any(c is not None for c in crcs) else None)


# itemsize per dataType code (0 = unsupported), for the C fast path
_ITEMSIZE_BY_CODE = np.zeros(256, dtype=np.int64)
for _d in _dtypes.DTYPES:
    _ITEMSIZE_BY_CODE[_d.code] = _d.itemsize
_DTYPE_BY_CODE = [_dtypes.from_code(c) for c in range(256)]


class TensorSpan:
    """A ``tensors`` array left unparsed in a document read by the fast path."""

    __slots__ = ("buf", "start", "end")

    def __init__(self, buf: bytes, start: int, end: int):
        self.buf, self.start, self.end = buf, start, end

    def table(self, limits: "Limits" = None) -> Optional["TensorTable"]:
        """The tensors as columns read in C, or None when the exact reader must explain something."""
        return _fast_table(self, limits if limits is not None else Limits())

    def materialize(self, file=None) -> Any:
        """The array as Python objects (the exact, slow path)."""
        return loads_strict(self.buf[self.start:self.end], file=file)

    def __repr__(self) -> str:
        return f"<unparsed tensors array, {self.end - self.start} bytes>"


def _fast_table(span: TensorSpan, limits: Limits) -> Optional[TensorTable]:
    """Columns straight from the JSON bytes (C); None when anything needs explaining."""
    cols = lowlevel.parse_tensors(span.buf, span.start, span.end, _ITEMSIZE_BY_CODE, limits.max_tensors)
    if cols is None:
        return None
    n = len(cols["codes"])
    flags = cols["name_flags"]
    named = bool(n) and bool(flags[0] & 1)
    if n and (flags & 1).any() != (flags & 1).all():
        return None  # mixed named and unnamed
    names = None
    if named:
        names = cols["names"].decode("utf-8").split("\x00")[:-1]
        if (flags & 2).any():
            for i in np.flatnonzero(flags & 2).tolist():
                names[i] = json.loads('"' + names[i] + '"')
                if not _utf8(names[i]):
                    return None  # a lone surrogate escaped as \ud800: the exact reader refuses it
        if len(set(names)) != n:
            return None  # duplicate names
    by_code = _DTYPE_BY_CODE
    codes = cols["codes"]
    if n and (codes == codes[0]).all():  # one dtype: the common case
        dtypes = [by_code[int(codes[0])]] * n
    else:
        dtypes = list(map(by_code.__getitem__, codes.tolist()))
    ndims = cols["ndims"]
    if n and int(ndims.max()) > MAX_DIMS:
        return None  # the exact reader names the tensor
    dims = cols["dims"].tolist()
    if n and (ndims == ndims[0]).all():  # every tensor of the same rank: group the dims in C
        k = int(ndims[0])
        shapes: List[Tuple[int, ...]] = list(zip(*[iter(dims)] * k)) if k else [()] * n
    else:
        shapes = []
        pos = 0
        for k in ndims.tolist():
            shapes.append(tuple(dims[pos:pos + k]))
            pos += k
    crcs = cols["crcs"]
    crc_list = None
    present = crcs >= 0
    if present.all() and n:
        crc_list = crcs.tolist()
    elif present.any():
        crc_list = [c if c >= 0 else None for c in crcs.tolist()]
    return TensorTable(names, dtypes, shapes, cols["offsets"].tolist(), cols["lengths"].tolist(), crc_list)


def check_data_path(desc: ListDescriptor, allow_outside: bool = False) -> None:
    """Refuses a data file whose real path (symlinks resolved) leaves the document's directory.

    ``location`` itself is checked lexically (rule 12); this closes the other
    door, a symlink (the data file, or a directory on its path) pointing
    elsewhere. Two directories are accepted: the descriptor's directory and,
    when the descriptor file is itself a symlink, the directory of its target
    (content-addressed caches keep both files as symlinks into one blob
    directory). ``allow_outside=True`` trusts any target. The test is
    ``_base.files.inside``, the one :func:`confine` applies inside a checkpoint
    directory: a descriptor confined there has its data file confined too.
    """
    if allow_outside or desc.base_dir is None:
        return
    path = desc.data_path
    real = os.path.realpath(path)
    roots = [os.path.realpath(desc.base_dir)]
    if desc.file is not None:
        roots.append(os.path.dirname(os.path.realpath(desc.file)))
    if not any(inside(real, r) for r in roots):
        raise FormatError(
            f"data file {path!r} resolves to {real!r}, outside the descriptor's directory "
            "(a symlink; pass allow_outside=True to trust it)",
            file=desc.file, field=f"{desc.pointer}/location" if desc.pointer else "location")


def check_data_size(desc: ListDescriptor, size: int, data_path: str) -> None:
    """Refuses a data file too short for the list's region (truncated or wrong file)."""
    end = desc.byte_offset + desc.byte_length
    if size < end:
        raise FormatError(
            f"data file {data_path!r} is {size} bytes but the list needs [{desc.byte_offset}, {end}) "
            "(truncated or replaced?)",
            file=desc.file,
            field=f"{desc.pointer}/byteLength" if desc.pointer else "byteLength",
        )
