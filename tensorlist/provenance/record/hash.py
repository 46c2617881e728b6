"""``weights_sha256``: an exact, framework-agnostic hash of named tensors, and the record entries made from it.

The message hashed is defined in ``docs/FORMAT.md`` ("Weights hash") and in
:func:`weights_sha256`'s docstring: numpy arrays, a torch state_dict (bfloat16
included) and the same weights read back from a file hash alike, because every
tensor is reduced to (name, canonical dtype name, shape, little-endian C-order
bytes) before hashing.

Imports ``_base.dtypes``, ``reader`` (to map a file given by path) and the record's
``_common``; torch tensors cross through ``_bridges.torch`` (via
``_common.torch_to_numpy``), imported only when one is met.
"""
from __future__ import annotations

import hashlib
import os
import struct
from collections.abc import Mapping
from typing import Any, Dict, Iterator, Optional, Tuple

import numpy as np

from tensorlist._base import backends
from tensorlist._base import dtypes as _dtypes
from tensorlist import reader
from tensorlist.format import Limits, is_tensor_list, read_json_file
from tensorlist.provenance.record._common import is_torch_module, is_torch_tensor, torch_to_numpy

__all__ = ["WEIGHTS_HASH_TAG", "CHECKPOINT_WEIGHTS", "weights_sha256", "numpy_weights", "dataset_content_hash",
           "model_file_origin", "anchor_paths", "resolve_paths", "weights_pointer", "file_weights_sha256"]

#: Where a Lightning checkpoint (``tensorlist.lightning``'s document) holds its weights, as a JSON pointer.
CHECKPOINT_WEIGHTS = "/state_dict"

#: Domain tag that starts every weights_sha256 message (28 bytes), so the
#: digest can never equal the SHA-256 of some other byte string by design.
WEIGHTS_HASH_TAG = b"tensorlist-weights-sha256\x00v1"

_U64 = struct.Struct("<Q")


def _as_le_array(value, where: str) -> Tuple["_dtypes.DType", np.ndarray]:
    """``(dtype row, C-contiguous little-endian array)`` for one weight.

    No copy for a C-contiguous little-endian array (a memory-mapped file
    included); a big-endian or strided one is copied, never changed in place.
    The torch bridge returns native-order arrays, so on a big-endian host a
    torch tensor is copied here too.
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif is_torch_tensor(value):
        arr = torch_to_numpy(value, where)
    elif isinstance(value, np.generic) or hasattr(value, "__array__"):
        arr = np.asarray(value)
    else:
        raise TypeError(f"{where}: expected a numpy array or a torch tensor, got {type(value).__qualname__}")
    try:
        row = _dtypes.from_numpy(arr.dtype)
    except TypeError as e:
        raise TypeError(f"{where}: {e}") from None
    arr = _dtypes.as_little(arr)  # a little-endian copy, if it is not little-endian already
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return row, arr


def _named_weights(weights) -> Tuple[int, Iterator[Tuple[str, Any]]]:
    """``(count, iterator of (name, tensor))`` for every accepted input form."""
    if isinstance(weights, (str, os.PathLike)):
        weights = reader.load(weights, mmap=True, bits=True)  # names and bytes: no ml_dtypes
    elif is_torch_module(weights):
        weights = weights.state_dict()
    if isinstance(weights, Mapping):
        return len(weights), iter(weights.items())
    if hasattr(weights, "keys") and hasattr(weights, "__getitem__") and not isinstance(weights, (list, tuple)):
        names = list(weights.keys())  # mapping-like, e.g. an open tensorlist.Reader
        return len(names), ((n, weights[n]) for n in names)
    if isinstance(weights, (list, tuple)):
        return len(weights), ((str(i), w) for i, w in enumerate(weights))
    raise TypeError(
        "weights: expected a mapping of names to arrays or tensors, a torch state_dict or module, "
        f"a sequence of arrays, or the path of a tensorlist file; got {type(weights).__qualname__}"
    )


def _checked_name(name, index: int) -> str:
    if not isinstance(name, str):
        raise TypeError(f"weights: the name of tensor {index} must be a str, got {name!r}")
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: the same refusal as the format's rule for names
        raise ValueError(f"weights: the name of tensor {index}, {name!r}, is not valid Unicode "
                         "(a lone surrogate) and cannot be hashed as UTF-8") from None
    return name


def weights_sha256(weights) -> str:
    """A hash of named weights: names, dtypes, shapes and values, in order.

    SHA-256, as 64 lowercase hex digits, over the concatenation of:

    * the 28 bytes ``b"tensorlist-weights-sha256\\x00v1"`` (:data:`WEIGHTS_HASH_TAG`);
    * the number of tensors, as u64 little-endian;
    * for each tensor, in order: the byte length (u64 LE) and bytes of its
      UTF-8 name; the byte length (u64 LE) and ASCII bytes of its canonical
      dtype name (``"float32"``, ``"bfloat16"``, ... as in ``_base.dtypes``); its
      number of dimensions (u64 LE) and each dimension (u64 LE); the byte
      length of its data (u64 LE) and its raw little-endian C-order bytes.

    Everything variable-length is length-prefixed, so two different weight
    sets never give the same message. Unnamed (positional) tensors are named
    ``"0"``, ``"1"``, ... . The file layout (padding, alignment, metadata) is
    not hashed, so re-saving the same weights keeps the hash.

    Args:
        weights: a mapping name -> numpy array or torch tensor (a torch
            state_dict), a torch module (its ``state_dict()``), a sequence of
            arrays, or the path of a tensorlist file (memory-mapped and hashed
            in place, never read into RAM as a copy).

    Returns:
        The hex digest.

    Raises:
        TypeError: an unsupported input, name or dtype; a sparse, quantized or
            meta torch tensor (refused by the torch bridge).

    Example:
        >>> import numpy as np
        >>> a = weights_sha256({"w": np.arange(3, dtype="<f4")})
        >>> a == weights_sha256({"w": np.arange(3, dtype=">f4")})
        True
        >>> a == weights_sha256({"w": np.arange(3, dtype="<f8")})
        False
        >>> weights_sha256({"0": np.zeros(2, np.float32)}) == weights_sha256([np.zeros(2, np.float32)])
        True
    """
    count, items = _named_weights(weights)
    h = hashlib.sha256(WEIGHTS_HASH_TAG)
    h.update(_U64.pack(count))
    seen = 0
    for index, (name, value) in enumerate(items):
        name = _checked_name(name, index)
        row, arr = _as_le_array(value, f"weights[{name!r}]")
        encoded = name.encode("utf-8")
        dtype_name = row.name.encode("ascii")
        h.update(b"".join((
            _U64.pack(len(encoded)), encoded,
            _U64.pack(len(dtype_name)), dtype_name,
            _U64.pack(arr.ndim), *(_U64.pack(int(d)) for d in arr.shape),
            _U64.pack(arr.nbytes),
        )))
        # The bytes themselves go straight from the (mapped) buffer to SHA-256.
        h.update(arr.reshape(-1).view(np.uint8).data)
        seen += 1
    if seen != count:  # a mapping changed while it was hashed
        raise RuntimeError(f"weights: expected {count} tensors, got {seen}")
    return h.hexdigest()


def numpy_weights(weights) -> Dict[str, np.ndarray]:
    """The weights as an ordered dict name -> numpy array (torch through the bridge's byte views).

    Takes every form :func:`weights_sha256` takes.

    Raises:
        TypeError: an unsupported input, name or tensor.
        ValueError: a name given twice.
    """
    _, items = _named_weights(weights)
    out: Dict[str, np.ndarray] = {}
    for index, (name, value) in enumerate(items):
        name = _checked_name(name, index)
        if name in out:
            raise ValueError(f"weights: duplicate name {name!r}")
        where = f"weights[{name!r}]"
        if is_torch_tensor(value):
            out[name] = torch_to_numpy(value, where)
        elif isinstance(value, (np.ndarray, np.generic)) or hasattr(value, "__array__"):
            out[name] = np.asarray(value)
        else:
            raise TypeError(f"{where}: expected a numpy array or a torch tensor, got {type(value).__qualname__}")
    return out


def dataset_content_hash(arrays) -> dict:
    """A ``content_hash`` entry for a data record: weights_sha256 over the data arrays.

    Example:
        >>> import numpy as np
        >>> dataset_content_hash({"x": np.zeros(3)})["method"]
        'weights_sha256'
    """
    return {"method": "weights_sha256", "sha256": weights_sha256(arrays)}


def weights_pointer(doc) -> Optional[str]:
    """Where a model file's weights are in its parsed descriptor ``doc``.

    None when ``doc`` is itself the one tensor list (a model file);
    :data:`CHECKPOINT_WEIGHTS` when it is a Lightning checkpoint, a document
    of several lists whose weights (with their record) are at ``/state_dict``.

    Example:
        >>> weights_pointer({"state_dict": {"tensors": [], "lists": None}}) is None  # not a TensorList
        True
    """
    if isinstance(doc, dict) and not is_tensor_list(doc) and is_tensor_list(doc.get(CHECKPOINT_WEIGHTS[1:])):
        return CHECKPOINT_WEIGHTS
    return None


def file_weights_sha256(path) -> str:
    """:func:`weights_sha256` of the weights the file ``path`` holds: a model file's, a Lightning checkpoint's."""
    pointer = weights_pointer(read_json_file(path, Limits()))
    return weights_sha256(path if pointer is None else reader.load(path, pointer=pointer, bits=True))


def model_file_origin(path, *, relative_to=None) -> dict:
    """``initial_weights.origin`` for weights loaded from the model file (or Lightning checkpoint) ``path``.

    Returns ``{"file": ..., "weights_sha256": hash of the file's weights}``
    (the hash is computed from the weights, not trusted from the file's record).
    ``file`` is ``path`` made absolute (a relative ``path`` is read from the
    working directory now, where the caller named it), so it means one file
    wherever the record goes; every writer of a record stores it relative to
    the directory of the file it saves (:func:`anchor_paths`), as
    ``tensorlist.provenance.lineage`` resolves it, so a chain of files moved
    together still resolves. With ``relative_to`` (the directory the new
    files are saved in), ``file`` is the path from there already.

    Example:
        >>> import os, tempfile, numpy as np, tensorlist
        >>> runs = tempfile.mkdtemp(); os.mkdir(os.path.join(runs, "A"))
        >>> tensorlist.save(os.path.join(runs, "A", "model.tl"), {"w": np.zeros(2, np.float32)})
        >>> model_file_origin(os.path.join(runs, "A", "model.tl"))["file"] == os.path.join(runs, "A", "model.tl")
        True
        >>> model_file_origin(os.path.join(runs, "A", "model.tl"), relative_to=os.path.join(runs, "B"))["file"]
        '../A/model.tl'
    """
    path = os.fsdecode(path)
    shown = os.path.abspath(path) if relative_to is None else os.path.relpath(path, os.fsdecode(relative_to))
    return {"file": shown, "weights_sha256": file_weights_sha256(path)}


def _with_paths(record, change):
    """``record`` with ``change`` applied to its paths: ``initial_weights.file`` and ``initial_weights.origin.file``.

    A new record (of the same type) when a path changes, else ``record`` itself;
    anything that is not shaped as a record is left for validation to name.
    """
    initial = record.get("initial_weights") if isinstance(record, Mapping) else None
    if not isinstance(initial, Mapping):
        return record
    changed = dict(initial)
    if isinstance(initial.get("file"), str):
        changed["file"] = change(initial["file"])
    origin = initial.get("origin")
    if isinstance(origin, Mapping) and isinstance(origin.get("file"), str):
        changed["origin"] = dict(origin, file=change(origin["file"]))
    if changed == initial:
        return record
    out = type(record)(record) if isinstance(record, dict) else dict(record)
    out["initial_weights"] = changed
    return out


def anchor_paths(record, directory):
    """``record`` as a file saved in ``directory`` holds it: each absolute path made relative to ``directory``.

    A record's paths (``initial_weights.origin.file``, ``initial_weights.file``)
    are read from the directory of the file holding the record; every writer
    of a record (model files, the loops' checkpoints, Lightning's checkpoints,
    optimizer files) stores it through here. The path is taken from the
    directory's real location (symlinks resolved, the file's own name kept),
    so ``..`` steps lead where the system resolves them; files moved together
    keep resolving. Relative paths (already from ``directory``) and URLs are
    kept; so is a path with no relative form (another drive on Windows).

    Args:
        record: the record (a dict).
        directory: the directory of the file the record goes into (``""``:
            the working directory; a URL: the record is kept as it is).

    Returns:
        A new record when a path changed, else ``record`` itself (never changed in place).

    Example:
        >>> rec = {"initial_weights": {"from": None, "origin": {"file": "/runs/A/model.tl", "weights_sha256": "0"}}}
        >>> anchor_paths(rec, "/runs/B")["initial_weights"]["origin"]["file"]
        '../A/model.tl'
    """
    base = os.fsdecode(directory)
    if backends.is_url(base):  # a remote file: no local path is relative to it
        return record

    def relative(path: str) -> str:
        if not os.path.isabs(path):
            return path
        head, name = os.path.split(path)
        try:
            rel = os.path.relpath(os.path.realpath(head), os.path.realpath(base))
        except ValueError:  # no relative path (another drive), or a NUL that validation names
            return path
        return name if rel == os.curdir else os.path.join(rel, name)

    return _with_paths(record, relative)


def resolve_paths(record, directory):
    """``record`` read from a file in ``directory``, each relative path made absolute (joined to ``directory``).

    The inverse of :func:`anchor_paths`, for a record that goes on (a resumed
    run's recorder): its paths then mean the same files wherever the next
    save is. URLs and absolute paths are kept.

    Example:
        >>> rec = {"initial_weights": {"from": None, "origin": {"file": "../A/model.tl", "weights_sha256": "0"}}}
        >>> resolve_paths(rec, "/runs/B")["initial_weights"]["origin"]["file"]
        '/runs/B/../A/model.tl'
    """
    base = os.path.abspath(os.fsdecode(directory))

    def absolute(path: str) -> str:
        return path if os.path.isabs(path) or backends.is_url(path) else os.path.join(base, path)

    return _with_paths(record, absolute)
