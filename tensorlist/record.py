"""The training record: how the weights of a model file were trained.

A training loop writes a *training record* into every model file it saves
(final, best validation, each checkpoint), next to the record of its training
data (``dataset_params``). A model file is a tensorlist file whose root
descriptor holds the weights and whose ``metadata`` is::

    {"training": <training record>, "dataset_params": <data record>, ...}

so ``tensorlist.load(path)`` gives the weights, ``tensorlist.validate(path)``
checks the file, and :func:`read_training_record` finds the record.

The record's fields are defined, with their units, by
``schemas/training-record.schema.json``; the user guide is
``docs/TRAINING_RECORD.md``. Epochs are counted from 1 (epoch 0 means "before
training"), and every history list is cut to the epochs done.

:func:`weights_sha256` is an exact, framework-agnostic hash of named tensors
(defined in ``docs/FORMAT.md``, "Weights hash"): numpy arrays, a torch
state_dict (bfloat16 included) and the same weights read back from a file hash
alike.

torch is imported lazily, inside the functions that are given torch objects;
this module imports without it.

Example:
    >>> import numpy as np
    >>> history([0.5, float("nan"), 0.25, 0.0], 3)
    [0.5, None, 0.25]
    >>> w = {"0": np.zeros(2, np.float32)}
    >>> weights_sha256(w) == weights_sha256([np.zeros(2, np.float32)])  # unnamed: "0", "1", ...
    True
"""
from __future__ import annotations

import copy
import datetime as _dt
import enum
import functools
import hashlib
import inspect
import json
import math
import numbers
import os
import platform
import re
import struct
import sys
import warnings
from collections.abc import Mapping
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import numpy as np

from . import _dtypes
from ._jsonio import loads_strict
from .errors import FormatError

__all__ = [
    "FORMAT",
    "WEIGHTS_HASH_TAG",
    "WEIGHTS_KINDS",
    "RecordWarning",
    "TrainingRecord",
    "TrainingRecorder",
    "history",
    "is_training_record",
    "loader_settings",
    "spec",
    "optimizer_record",
    "build_training_record",
    "validate_training_record",
    "validate_dataset_params",
    "read_training_record",
    "read_dataset_params",
    "weights_sha256",
    "dataset_content_hash",
    "model_file_origin",
    "save_model_file",
    "verify_model_file",
]

#: The version marker every record carries in its ``format`` field.
FORMAT = "tensorlist.training-record/1"
_FORMAT_RE = re.compile(r"^tensorlist\.training-record/[0-9]+$")

#: Domain tag that starts every weights_sha256 message (28 bytes), so the
#: digest can never equal the SHA-256 of some other byte string by design.
WEIGHTS_HASH_TAG = b"tensorlist-weights-sha256\x00v1"

#: The kinds of weights a model file can hold (``weights.kind``).
WEIGHTS_KINDS = ("final", "best_validation", "checkpoint")
_SCHEDULER_STEPS = ("epoch", "batch")

#: Keys of a solver's parameters that say where it ran, not how it trained:
#: the seed's record leaves them out (the model is the file's weights).
_WHERE_IT_RAN = ("model", "optimizer", "device", "verbose", "save_folder")

# Constructor arguments never recorded in a spec: the objects the record holds
# elsewhere (optimizer, parameters, model) and runtime state (last_epoch).
_SKIPPED_ARGS = frozenset({"optimizer", "params", "model", "device", "verbose", "last_epoch"})

# Arrays in free-form parameters are written out up to this many elements;
# larger ones as {"dtype", "shape", "weights_sha256"} (with a warning).
_MAX_LISTED_ELEMENTS = 1024
# How deep specs of objects held by objects are followed before args is null.
_MAX_SPEC_DEPTH = 4

_U64 = struct.Struct("<Q")


class RecordWarning(UserWarning):
    """Something could not be recorded in full (e.g. a lambda loss, named only)."""


# --------------------------------------------------------------------------
# schemas


@functools.lru_cache(maxsize=None)
def _schema(name: str) -> dict:
    """The JSON Schema ``name`` shipped in ``tensorlist.schemas``."""
    from .schema import load_schema  # schema imports the reader; keep record importable first

    return load_schema(name)


@functools.lru_cache(maxsize=None)
def _validator(name: str):
    try:
        import jsonschema
    except ImportError as e:  # pragma: no cover - jsonschema is a dependency
        raise ImportError("validating a training record needs the 'jsonschema' package") from e
    return jsonschema.Draft202012Validator(_schema(name))


# --------------------------------------------------------------------------
# strict JSON


def _loads_strict(text, *, file=None) -> Any:
    """The core's strict JSON (no duplicate keys, no NaN/Infinity), with hints for a wrong file."""
    try:
        return loads_strict(text, file=file)
    except FormatError as e:
        if e.reason.startswith("descriptor is not UTF-8"):
            raise FormatError(f"not a JSON file: not UTF-8 text{e.reason[len('descriptor is not UTF-8'):]}; "
                              "a model file is the JSON descriptor, not its data file", file=file) from e
        if e.reason.startswith("invalid JSON: ") and " at line " in e.reason and "duplicate" not in e.reason:
            raise FormatError("not a JSON file: " + e.reason[len("invalid JSON: "):], file=file) from e
        raise


def _read_json_file(path) -> Any:
    with open(path, "rb") as f:
        return _loads_strict(f.read(), file=os.fspath(path))


def _dumps(obj) -> str:
    """Strict JSON: NaN/Infinity raise instead of writing non-JSON tokens."""
    return json.dumps(obj, allow_nan=False, ensure_ascii=False)


def _join(where: str, key) -> str:
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


def _check_strict_json(value, where: str, file=None) -> None:
    """Raises FormatError at the first value that strict JSON cannot hold."""
    if value is None or isinstance(value, (bool, str, int)):
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise FormatError(
                f"{value!r} is not a JSON number (NaN and Infinity are not JSON; write null)",
                file=file, field=where or None,
            )
        return
    if isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise FormatError(f"key {key!r} is not a string", file=file, field=where or None)
            _check_strict_json(item, _join(where, key), file)
        return
    if isinstance(value, (list, tuple)):
        for i, item in enumerate(value):
            _check_strict_json(item, _join(where, i), file)
        return
    raise FormatError(
        f"a {type(value).__module__}.{type(value).__qualname__} is not a JSON value",
        file=file, field=where or None,
    )


# --------------------------------------------------------------------------
# names and specs


def _lookup(module: Optional[str], qualname: Optional[str]):
    """The object ``module.qualname`` among the loaded modules, or None."""
    if not module or not qualname or "<" in qualname:
        return None
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None:
            return None
        obj = getattr(obj, part, None)
    return obj


def _name_of(obj) -> Tuple[str, bool]:
    """``(dotted name, importable)`` of a class or callable.

    Importable means that following the name among the loaded modules gives
    back this very object: false for lambdas, local functions, bound methods.
    """
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", None)
    if qualname is None:
        qualname = type(obj).__qualname__
    if not isinstance(module, str):
        module = None
    if _lookup(module, qualname) is obj:
        return f"{module}.{qualname}", True
    # C functions such as torch.sigmoid have a qualname of their implementing
    # class but are exported under their plain name.
    plain = getattr(obj, "__name__", None)
    if isinstance(plain, str) and plain != qualname and _lookup(module, plain) is obj:
        return f"{module}.{plain}", True
    return (f"{module}.{qualname}" if module else str(qualname)), False


def _warn(message: str) -> None:
    """A RecordWarning pointing at the first caller outside this module."""
    frame, level = sys._getframe(0), 1
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RecordWarning, stacklevel=level)


def _warn_unimportable(where: str, name: str, what: str) -> None:
    _warn(
        f"training record: {where} is {what} {name!r}, which cannot be imported by name "
        "(a lambda, a local or a bound function); it is recorded by name only, with importable: false"
    )


def _constructor_args(obj, where: str, depth: int) -> Optional[dict]:
    """The constructor arguments ``obj`` keeps as attributes, as JSON.

    Follows the class's signature; an argument ``x`` is looked up as the
    attribute ``x``, then ``_x``, then ``xs`` (torch's LambdaLR keeps
    ``lr_lambda`` as ``lr_lambdas``). Arguments the object does not keep are
    left out. None when the signature cannot be read.
    """
    try:
        signature = inspect.signature(type(obj))
    except Exception:  # no readable signature (C types, odd metaclasses): arguments unknown
        return None
    args = {}
    for param in signature.parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD) or param.name in _SKIPPED_ARGS:
            continue
        for attr in (param.name, "_" + param.name, param.name + "s"):
            try:
                value = getattr(obj, attr)
            except Exception:  # any property may raise; an unreadable argument is left out
                continue
            if inspect.ismethod(value) and getattr(value, "__self__", None) is obj:
                continue  # a method of the object, not a stored argument
            args[param.name] = _to_json(value, _join(_join(where, "args"), param.name), depth + 1)
            break
    return args


def spec(obj, *, where: str = "object", _depth: int = 0) -> dict:
    """A JSON spec of an object or callable (the record's ``spec`` form).

    An object gives ``{"class": dotted class name, "args": its constructor
    arguments as JSON, "importable": bool}``; a function, class or builtin gives
    ``{"callable": dotted name, "importable": bool}``. A lambda, local function
    or bound method is named (``"module.f.<locals>.<lambda>"``) with
    ``importable: false`` and a :class:`RecordWarning`; it never raises.

    Args:
        obj: the object or callable.
        where: the record field it is for, used in warnings.

    Returns:
        The spec, a dict of plain JSON values.

    Example:
        >>> import math
        >>> spec(math.sqrt)
        {'callable': 'math.sqrt', 'importable': True}
    """
    if isinstance(obj, functools.partial):
        return {
            "class": "functools.partial",
            "args": {
                "func": spec(obj.func, where=_join(where, "func"), _depth=_depth + 1),
                "args": _to_json(list(obj.args), _join(where, "args"), _depth + 1),
                "keywords": _to_json(dict(obj.keywords), _join(where, "keywords"), _depth + 1),
            },
            "importable": True,
        }
    if inspect.isroutine(obj) or isinstance(obj, type):
        name, importable = _name_of(obj)
        if not importable:
            _warn_unimportable(where, name, "the callable")
        return {"callable": name, "importable": importable}
    name, importable = _name_of(type(obj))
    if not importable:
        _warn_unimportable(where, name, "an object of the class")
    args = None if _depth >= _MAX_SPEC_DEPTH else _constructor_args(obj, where, _depth)
    return {"class": name, "args": args, "importable": importable}


def _torch():
    return sys.modules.get("torch")


def _is_torch_tensor(value) -> bool:
    torch = _torch()  # never import torch just to ask
    return torch is not None and isinstance(value, torch.Tensor)


def _is_torch_module(value) -> bool:
    torch = _torch()
    return torch is not None and isinstance(value, torch.nn.Module)


def _array_to_json(value, where: str, depth: int):
    arr = _torch_as_numpy(value, where) if _is_torch_tensor(value) else np.asarray(value)
    if arr.size <= _MAX_LISTED_ELEMENTS:
        if arr.dtype.kind in "biufc":
            return _to_json(arr.tolist(), where, depth + 1)
        try:  # bfloat16, float8...: through float64, which holds them exactly
            return _to_json(arr.astype(np.float64).tolist(), where, depth + 1)
        except (TypeError, ValueError):
            pass
    try:
        dtype_name: Optional[str] = _dtypes.from_numpy(arr.dtype).name
        digest: Optional[str] = weights_sha256({"": arr})
    except TypeError:
        dtype_name, digest = str(arr.dtype), None
    _warn(
        f"training record: {where} is an array of {arr.size} elements; it is recorded as its "
        "dtype, shape and weights_sha256 only"
    )
    return {"dtype": dtype_name, "shape": [int(d) for d in arr.shape], "weights_sha256": digest}


def _to_json(value, where: str, depth: int = 0):
    """``value`` as plain JSON for a free-form part of the record.

    Tuples become lists, numpy and torch scalars numbers, small arrays nested
    lists, non-finite numbers null (with a warning: the record must be strict
    JSON), objects and callables specs.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        return [_to_json(value.real, _join(where, 0), depth), _to_json(value.imag, _join(where, 1), depth)]
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f):
            return f
        _warn(f"training record: {where} is {f!r}, which JSON cannot hold; it is recorded as null")
        return None
    if isinstance(value, enum.Enum):
        name, _ = _name_of(type(value))
        return f"{name}.{value.name}"
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, Mapping):
        return {str(k): _to_json(v, _join(where, str(k)), depth) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_to_json(v, _join(where, i), depth) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [_to_json(v, _join(where, i), depth) for i, v in enumerate(sorted(value, key=repr))]
    if isinstance(value, (np.ndarray, np.generic)) or _is_torch_tensor(value):
        if getattr(value, "ndim", 1) == 0:
            return _to_json(value.item(), where, depth)
        return _array_to_json(value, where, depth)
    torch = _torch()
    if torch is not None and isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, np.dtype):
        return str(value)
    return spec(value, where=where, _depth=depth)


# --------------------------------------------------------------------------
# the seed's functions


def _history_value(value, where: str):
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{where}: expected a number, got {value!r}")
    if hasattr(value, "tolist") and not isinstance(value, (list, tuple)):
        value = value.tolist()  # numpy or torch scalar/array (bfloat16 included)
    if isinstance(value, (list, tuple)):
        return [_history_value(v, _join(where, i)) for i, v in enumerate(value)]
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        f = float(value)
        return f if math.isfinite(f) else None
    raise TypeError(f"{where}: expected a number, None or a list of them, got {value!r}")


def history(values, done: int) -> List[Optional[Union[float, list]]]:
    """The first ``done`` values as JSON numbers (None for NaN and +/-Inf).

    ``values`` is a per-epoch sequence (list, numpy array or torch tensor) of
    numbers or None; an entry may itself be a list (one learning rate per
    parameter group). Preallocated arrays are cut to the epochs done, so a
    resumed or stopped run leaves no placeholder zeros.

    Args:
        values: the per-epoch values, at least ``done`` of them.
        done: how many epochs are done.

    Returns:
        A list of ``done`` floats or None (or lists of them).

    Raises:
        TypeError: ``done`` is not an integer, or a value is not a number.
        ValueError: ``done`` is negative or larger than ``len(values)``.

    Example:
        >>> history([1.0, float("inf"), [0.1, float("nan")], 9.0], 3)
        [1.0, None, [0.1, None]]
    """
    if isinstance(done, (bool, np.bool_)) or not isinstance(done, numbers.Integral):
        raise TypeError(f"history: done must be an integer, got {done!r}")
    done = int(done)
    if done < 0:
        raise ValueError(f"history: done must be >= 0, got {done}")
    if values is None:
        values = []
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        if getattr(values, "ndim", 1) == 0:
            raise TypeError("history: values must be a sequence, got a 0-d array")
        values = values[:done].tolist()
    values = list(values)
    if len(values) < done:
        raise ValueError(f"history: {done} epochs done but only {len(values)} values given")
    return [_history_value(v, f"history[{i}]") for i, v in enumerate(values[:done])]


def is_training_record(value) -> bool:
    """True for a training record, as a :class:`TrainingRecord` or the dict read from JSON.

    It looks only at the version marker (``format`` is
    ``"tensorlist.training-record/<n>"``, any version ``n``); use
    :func:`validate_training_record` to check the content.

    Example:
        >>> is_training_record({"format": "tensorlist.training-record/1"})
        True
        >>> is_training_record({"training": {}})
        False
    """
    if not isinstance(value, Mapping):
        return False
    marker = value.get("format")
    return isinstance(marker, str) and bool(_FORMAT_RE.match(marker))


def _int_or_none(value) -> Optional[int]:
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


def _check_loader_dict(settings: Mapping, where: str) -> dict:
    keys = ("batch_size", "shuffle", "drop_last", "sampler")
    missing = [k for k in keys if k not in settings]
    extra = [k for k in settings if k not in keys]
    if missing or extra:
        raise ValueError(
            f"{where}: loader settings need exactly the keys {', '.join(keys)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unexpected {extra}" if extra else "")
        )
    out = dict(settings)
    for field, ok in (
        ("batch_size", lambda v: v is None or (_int_or_none(v) is not None and v >= 1)),
        ("shuffle", lambda v: v is None or isinstance(v, bool)),
        ("drop_last", lambda v: isinstance(v, bool)),
        ("sampler", lambda v: v is None or (isinstance(v, str) and v)),
    ):
        if not ok(out[field]):
            raise ValueError(f"{where}.{field}: invalid value {out[field]!r}")
    return out


def loader_settings(loader) -> dict:
    """How a DataLoader feeds its data: batch_size, shuffle, drop_last, sampler.

    A torch DataLoader does not remember ``shuffle``; it is read from the
    sampler: ``RandomSampler`` -> true, ``SequentialSampler`` -> false. Any
    other sampler (or custom batch sampler) is named in ``sampler`` by its
    dotted class name, with ``shuffle`` its own ``shuffle`` attribute when it
    has one (e.g. DistributedSampler), else null. A RandomSampler drawing with
    replacement or a fixed number of samples is named too. A loader built with
    a plain ``BatchSampler`` reports that batch sampler's settings.

    Args:
        loader: a ``torch.utils.data.DataLoader`` (or anything with
            ``batch_size``, ``drop_last`` and ``sampler``), or a dict of the
            four settings (checked and returned).

    Returns:
        ``{"batch_size": int | None, "shuffle": bool | None,
        "drop_last": bool, "sampler": str | None}``.

    Raises:
        TypeError: ``loader`` is neither a loader nor a settings dict.
        ValueError: a settings dict with missing, extra or mistyped keys.
    """
    if isinstance(loader, Mapping):
        return _check_loader_dict(loader, "loader")
    for attr in ("batch_size", "drop_last", "sampler"):
        if not hasattr(loader, attr):
            raise TypeError(
                f"loader_settings: expected a DataLoader or a dict of settings; "
                f"{type(loader).__qualname__} has no attribute {attr!r}"
            )
    from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

    batch_size = _int_or_none(loader.batch_size)
    drop_last = bool(loader.drop_last)
    sampler = loader.sampler
    if loader.batch_size is None:
        batch_sampler = getattr(loader, "batch_sampler", None)
        if type(batch_sampler) is BatchSampler:
            batch_size = _int_or_none(batch_sampler.batch_size)
            drop_last = bool(batch_sampler.drop_last)
            sampler = batch_sampler.sampler
        elif batch_sampler is not None:
            shuffle = getattr(batch_sampler, "shuffle", None)
            return {
                "batch_size": _int_or_none(getattr(batch_sampler, "batch_size", None)),
                "shuffle": shuffle if isinstance(shuffle, bool) else None,
                "drop_last": bool(getattr(batch_sampler, "drop_last", False)),
                "sampler": _name_of(type(batch_sampler))[0],
            }
        else:
            drop_last = False  # no automatic batching: each sample is a batch
    if type(sampler) is SequentialSampler:
        shuffle, named = False, None
    elif type(sampler) is RandomSampler:
        plain = not sampler.replacement and getattr(sampler, "_num_samples", None) is None
        shuffle, named = True, (None if plain else _name_of(type(sampler))[0])
    else:
        attr = getattr(sampler, "shuffle", None)
        shuffle = attr if isinstance(attr, bool) else None
        named = _name_of(type(sampler))[0]
    if batch_size is not None and batch_size < 1:
        batch_size = None
    return {"batch_size": batch_size, "shuffle": shuffle, "drop_last": drop_last, "sampler": named}


# --------------------------------------------------------------------------
# weights_sha256


def _torch_as_numpy(tensor, where: str) -> np.ndarray:
    """A numpy view of a torch tensor's bytes, without ``.numpy()`` on bfloat16.

    Zero-copy for a contiguous CPU tensor; other tensors are copied once
    (to CPU, to contiguous), which cannot be avoided.
    """
    import torch

    if tensor.layout != torch.strided or tensor.is_quantized:
        raise TypeError(f"{where}: a {tensor.layout} / quantized tensor has no plain byte layout to hash")
    name = str(tensor.dtype)
    name = name[len("torch."):] if name.startswith("torch.") else name
    try:
        row = _dtypes.from_name(name)
    except KeyError:
        raise TypeError(f"{where}: torch dtype {tensor.dtype} has no tensorlist dtype") from None
    t = tensor.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.resolve_conj().resolve_neg().contiguous()
    shape = tuple(int(d) for d in t.shape)
    if t.numel() == 0:  # torch refuses dtype views of some empty tensors
        return np.empty(shape, row.numpy.newbyteorder("="))
    raw = t.reshape(-1).view(torch.uint8).numpy()
    return raw.view(row.numpy.newbyteorder("=")).reshape(shape)


def _as_le_array(value, where: str) -> Tuple["_dtypes.DType", np.ndarray]:
    """``(dtype row, C-contiguous little-endian array)`` for one weight.

    No copy for a C-contiguous little-endian array (a memory-mapped file
    included); a big-endian or strided one is copied, never changed in place.
    """
    if isinstance(value, np.ndarray):
        arr = value
    elif _is_torch_tensor(value):
        arr = _torch_as_numpy(value, where)
    elif isinstance(value, np.generic) or hasattr(value, "__array__"):
        arr = np.asarray(value)
    else:
        raise TypeError(f"{where}: expected a numpy array or a torch tensor, got {type(value).__qualname__}")
    try:
        row = _dtypes.from_numpy(arr.dtype)
    except TypeError as e:
        raise TypeError(f"{where}: {e}") from None
    order = arr.dtype.byteorder
    if order == ">" or (order == "=" and sys.byteorder == "big"):
        arr = arr.astype(row.numpy)  # a little-endian copy
    if not arr.flags.c_contiguous:
        arr = np.ascontiguousarray(arr)
    return row, arr


def _named_weights(weights) -> Tuple[int, Iterator[Tuple[str, Any]]]:
    """``(count, iterator of (name, tensor))`` for every accepted input form."""
    if isinstance(weights, (str, os.PathLike)):
        import tensorlist

        weights = tensorlist.load(weights, mmap=True)
    elif _is_torch_module(weights):
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
    return name


def weights_sha256(weights) -> str:
    """A hash of named weights: names, dtypes, shapes and values, in order.

    SHA-256, as 64 lowercase hex digits, over the concatenation of:

    * the 28 bytes ``b"tensorlist-weights-sha256\\x00v1"`` (:data:`WEIGHTS_HASH_TAG`);
    * the number of tensors, as u64 little-endian;
    * for each tensor, in order: the byte length (u64 LE) and bytes of its
      UTF-8 name; the byte length (u64 LE) and ASCII bytes of its canonical
      dtype name (``"float32"``, ``"bfloat16"``, ... as in ``_dtypes``); its
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
        TypeError: an unsupported input, name or dtype.

    Example:
        >>> import numpy as np
        >>> a = weights_sha256({"w": np.arange(3, dtype="<f4")})
        >>> a == weights_sha256({"w": np.arange(3, dtype=">f4")})
        True
        >>> a == weights_sha256({"w": np.arange(3, dtype="<f8")})
        False
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


def _numpy_weights(weights) -> Dict[str, np.ndarray]:
    """The weights as an ordered dict name -> numpy array (torch through byte views)."""
    _, items = _named_weights(weights)
    out: Dict[str, np.ndarray] = {}
    for index, (name, value) in enumerate(items):
        name = _checked_name(name, index)
        if name in out:
            raise ValueError(f"weights: duplicate name {name!r}")
        where = f"weights[{name!r}]"
        if _is_torch_tensor(value):
            out[name] = _torch_as_numpy(value, where)
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


def model_file_origin(path) -> dict:
    """``initial_weights.origin`` for weights loaded from the model file ``path``.

    Returns ``{"file": path as given, "weights_sha256": hash of the file's weights}``
    (the hash is computed from the weights, not trusted from the file's record).
    """
    return {"file": os.fsdecode(path), "weights_sha256": weights_sha256(path)}


# --------------------------------------------------------------------------
# the record object


_SECTIONS = frozenset({"environment", "initial_weights", "train", "validation", "epochs", "weights", "history"})


class _Section:
    """Attribute access to one section of a record (``record.epochs.done``)."""

    __slots__ = ("_data",)

    def __init__(self, data: dict) -> None:
        object.__setattr__(self, "_data", data)

    def __getattr__(self, name):
        try:
            value = self._data[name]
        except KeyError:
            raise AttributeError(name) from None
        return _Section(value) if isinstance(value, dict) and name == "origin" else value

    def __getitem__(self, key):
        return self._data[key]

    def __eq__(self, other):
        return self._data == (other._data if isinstance(other, _Section) else other)

    def __repr__(self) -> str:
        return repr(self._data)


class TrainingRecord(dict):
    """A training record: a plain dict of JSON values that also reads by attribute.

    ``record.epochs.done`` and ``record["epochs"]["done"]`` are the same; the
    specs (``record.solver``, ``record.optimizer``) stay plain dicts. It is
    saved as plain JSON (:meth:`to_json`) and read back with
    :func:`read_training_record`.
    """

    __slots__ = ()

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        try:
            value = self[name]
        except KeyError:
            raise AttributeError(f"training record has no field {name!r}") from None
        return _Section(value) if name in _SECTIONS and isinstance(value, dict) else value

    def to_json(self, *, indent: Optional[int] = None) -> str:
        """The record as strict JSON text (NaN/Infinity raise ValueError)."""
        return json.dumps(self, allow_nan=False, ensure_ascii=False, indent=indent)

    def validate(self) -> None:
        """Same as :func:`validate_training_record` (self)."""
        validate_training_record(self)


# --------------------------------------------------------------------------
# validation


_RANK = {"required": 0, "additionalProperties": 1, "false": 2, "type": 3, "const": 4, "enum": 5}


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _schema_error(error, root, prefix: str, file) -> FormatError:
    """A FormatError naming the field of one jsonschema error."""
    path = prefix
    for part in error.absolute_path:
        path = _join(path, part)
    kind = error.validator
    if kind == "required":
        missing = [k for k in error.validator_value if isinstance(error.instance, Mapping) and k not in error.instance]
        return FormatError("missing required field", file=file, field=_join(path, missing[0]) if missing else path)
    if kind == "additionalProperties":
        allowed = list((error.schema.get("properties") or {}).keys())
        extra = [k for k in error.instance if k not in allowed] if isinstance(error.instance, Mapping) else []
        where = _join(path, extra[0]) if extra else path
        hint = f" (allowed: {', '.join(allowed)})" if allowed else ""
        return FormatError(f"unexpected field{hint}", file=file, field=where)
    if "propertyNames" in error.schema_path:
        return FormatError(
            "not allowed here: a solver's parameters leave out the model, the optimizer and where it "
            "ran (device, verbose, save_folder)",
            file=file, field=_join(path, error.instance),
        )
    if error.schema is False or kind is None:
        # A property whose schema is `false`: the error sits on the parent object.
        parent = root
        for part in error.absolute_path:
            parent = parent[part]
        key = next((k for k, v in parent.items() if v is error.instance), None) if isinstance(parent, Mapping) else None
        if key is None and isinstance(parent, Mapping):
            key = next((k for k, v in parent.items() if v == error.instance), None)
        hint = f" when 'from' is {parent['from']!r}" if isinstance(parent, Mapping) and "from" in parent else ""
        return FormatError(f"not allowed{hint} (see the schema's description of {path or 'the record'})",
                           file=file, field=_join(path, key) if key is not None else path or None)
    value = error.validator_value
    if kind == "type":
        types = [value] if isinstance(value, str) else list(value)
        reason = f"expected {' or '.join(types)}, got {_short(error.instance)}"
    elif kind == "const":
        reason = f"expected {value!r}, got {_short(error.instance)}"
    elif kind == "enum":
        reason = f"expected one of {', '.join(repr(v) for v in value)}; got {_short(error.instance)}"
    elif kind == "pattern":
        what = "64 lowercase hex digits" if "0-9a-f" in value and "64" in value else f"a string matching {value!r}"
        reason = f"expected {what}, got {_short(error.instance)}"
    elif kind in ("minimum", "exclusiveMinimum"):
        reason = f"expected at least {value!r}, got {_short(error.instance)}"
    elif kind == "minLength":
        reason = "must not be empty"
    elif kind == "minItems":
        reason = f"must have at least {value} entries"
    else:
        reason = error.message
    return FormatError(reason, file=file, field=path or None)


def _raise_schema_errors(name: str, value, prefix: str, file) -> None:
    errors = list(_validator(name).iter_errors(value))
    if errors:
        best = min(errors, key=lambda e: (_RANK.get(e.validator, 9), len(e.absolute_path), list(map(str, e.absolute_path))))
        raise _schema_error(best, value, prefix, file)


def _cross_checks(record: Mapping, prefix: str, file) -> None:
    """What JSON Schema cannot say: list lengths and epochs against each other."""
    done = record["epochs"]["done"]
    hist = record["history"]
    for key in ("training_loss", "validation", "learning_rate"):
        if len(hist[key]) != done:
            raise FormatError(
                f"has {len(hist[key])} entries but epochs.done is {done} (one entry per epoch done)",
                file=file, field=_join(_join(prefix, "history"), key),
            )
    weights = record["weights"]
    if weights["epoch"] > done:
        raise FormatError(f"epoch {weights['epoch']} is after the last epoch done ({done})",
                          file=file, field=_join(prefix, "weights.epoch"))
    groups = record["optimizer"]["parameter_groups"]
    n_groups = 1 if groups is None else len(groups)
    for i, lr in enumerate(hist["learning_rate"]):
        where = _join(_join(prefix, "history.learning_rate"), i)
        if n_groups == 1 and isinstance(lr, list):
            raise FormatError("expected a number or null: the optimizer has one parameter group",
                              file=file, field=where)
        if n_groups > 1 and isinstance(lr, list) and len(lr) != n_groups:
            raise FormatError(f"expected {n_groups} learning rates (one per parameter group), got {len(lr)}",
                              file=file, field=where)
        if n_groups > 1 and not isinstance(lr, list) and lr is not None:
            raise FormatError(f"expected a list of {n_groups} learning rates (one per parameter group)",
                              file=file, field=where)
    if record["validation"] is None:
        for i, v in enumerate(hist["validation"]):
            if v is not None:
                raise FormatError("is a number but the record has no validation (validation is null)",
                                  file=file, field=_join(_join(prefix, "history.validation"), i))
        if weights["kind"] == "best_validation":
            raise FormatError("is 'best_validation' but the record has no validation (validation is null)",
                              file=file, field=_join(prefix, "weights.kind"))
    else:
        data = record["validation"]["dataset_params"]
        if data is not None:
            _raise_schema_errors("dataset-params.schema.json", data, _join(prefix, "validation.dataset_params"), file)


def validate_training_record(record, *, file=None, field_prefix: str = "") -> None:
    """Checks a training record against ``schemas/training-record.schema.json``.

    In order: the version marker; strict JSON (no NaN/Infinity, string keys,
    plain JSON types); the schema; then what the schema cannot express (each
    history list has ``epochs.done`` entries, ``weights.epoch <= epochs.done``,
    one learning rate per parameter group, no validation values without a
    validation). Stops at the first failure.

    Args:
        record: the record (a dict or :class:`TrainingRecord`).
        file: the file it came from, named in errors.
        field_prefix: where the record sits (e.g. ``"metadata.training"``),
            prepended to the field named in errors.

    Raises:
        TypeError: ``record`` is not a mapping.
        FormatError: naming the first field at fault (``err.field``).
    """
    if not isinstance(record, Mapping):
        raise TypeError(f"a training record is a JSON object (dict), got {type(record).__qualname__}")
    marker = record.get("format")
    if isinstance(marker, str) and marker != FORMAT and _FORMAT_RE.match(marker):
        raise FormatError(f"unsupported training-record version {marker!r}; this tensorlist reads {FORMAT!r}",
                          file=file, field=_join(field_prefix, "format"))
    _check_strict_json(record, field_prefix, file)
    _raise_schema_errors("training-record.schema.json", record, field_prefix, file)
    _cross_checks(record, field_prefix, file)


def validate_dataset_params(dataset_params, *, file=None, field_prefix: str = "") -> None:
    """Checks a data record against ``schemas/dataset-params.schema.json`` (and strict JSON).

    Raises:
        TypeError: not a mapping.
        FormatError: naming the field at fault.
    """
    if not isinstance(dataset_params, Mapping):
        raise TypeError(f"a data record is a JSON object (dict), got {type(dataset_params).__qualname__}")
    _check_strict_json(dataset_params, field_prefix, file)
    _raise_schema_errors("dataset-params.schema.json", dataset_params, field_prefix, file)


# --------------------------------------------------------------------------
# building a record


def _optimizer_class(optimizer) -> str:
    name, importable = _name_of(type(optimizer))
    if not importable:
        _warn_unimportable("optimizer.class", name, "an object of the class")
    return name


def _finite_or_none(value) -> Optional[float]:
    if _is_torch_tensor(value) or isinstance(value, np.ndarray):
        value = value.item()
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def optimizer_record(optimizer, *, model=None, scheduler=None, scheduler_step: Optional[str] = None) -> dict:
    """The ``optimizer`` section of a record, from a torch optimizer.

    Call it when training starts (a :class:`TrainingRecorder` does): the
    groups' settings are taken as they are now. A group's starting learning
    rate is its ``initial_lr`` (set by torch schedulers when made), else its
    ``lr``. ``parameter_groups`` is null for one group holding all of
    ``model``'s parameters with the optimizer's default hyperparameters.

    Args:
        optimizer: a ``torch.optim.Optimizer``.
        model: the model, to name the parameters (``named_parameters``);
            without it they are named ``"#<index>"``, with a warning.
        scheduler: the learning-rate scheduler, or None.
        scheduler_step: ``"epoch"`` or ``"batch"``; required with a scheduler.

    Raises:
        ValueError: ``scheduler_step`` does not match ``scheduler``.
    """
    if scheduler is None and scheduler_step is not None:
        raise ValueError(f"scheduler_step={scheduler_step!r} given without a scheduler")
    if scheduler is not None and scheduler_step not in _SCHEDULER_STEPS:
        raise ValueError(f"scheduler_step must be 'epoch' or 'batch' with a scheduler, got {scheduler_step!r}")
    hyper = _to_json(dict(optimizer.defaults), "optimizer.hyperparameters")
    names = {}
    model_params: List[int] = []
    if model is not None:
        for name, p in model.named_parameters():
            names.setdefault(id(p), name)
            model_params.append(id(p))
    groups = []
    index = 0
    unnamed = 0
    group_params: List[int] = []
    for g, group in enumerate(optimizer.param_groups):
        params = []
        for p in group["params"]:
            name = names.get(id(p))
            if name is None:
                name = f"#{index}"
                unnamed += 1
            params.append(name)
            group_params.append(id(p))
            index += 1
        settings = {k: v for k, v in group.items() if k not in ("params", "lr", "initial_lr")}
        groups.append({
            "parameters": params,
            "initial_lr": _finite_or_none(group.get("initial_lr", group.get("lr"))),
            "settings": _to_json(settings, f"optimizer.parameter_groups[{g}].settings"),
        })
    defaults_but_lr = {k: v for k, v in hyper.items() if k != "lr"}
    one_plain_group = (
        len(groups) == 1
        and groups[0]["settings"] == defaults_but_lr
        and groups[0]["initial_lr"] == _finite_or_none(hyper.get("lr"))
        and (model is None or group_params == model_params)
    )
    if not one_plain_group and unnamed and model is None:
        _warn(
            "training record: no model given, so the optimizer's parameters are named by position "
            "('#0', '#1', ...); pass model= to name them"
        )
    return {
        "class": _optimizer_class(optimizer),
        "hyperparameters": hyper,
        "parameter_groups": None if one_plain_group else groups,
        "scheduler": None if scheduler is None else spec(scheduler, where="optimizer.scheduler"),
        "scheduler_step": scheduler_step,
    }


def _environment() -> dict:
    torch = _torch()
    try:
        from importlib.metadata import PackageNotFoundError, version

        try:
            tl_version: Optional[str] = version("tensorlist")
        except PackageNotFoundError:
            tl_version = getattr(sys.modules.get("tensorlist"), "__version__", None)
    except ImportError:  # pragma: no cover
        tl_version = None
    return {
        "python": platform.python_version(),
        "numpy": np.__version__,
        "torch": getattr(torch, "__version__", None) if torch is not None else None,
        "tensorlist": tl_version if isinstance(tl_version, str) else None,
        "platform": platform.platform(),
    }


def _spec_or_none(value, where: str):
    if value is None:
        return None
    if isinstance(value, Mapping) and ("class" in value or "callable" in value):
        return dict(value)  # already a spec
    return spec(value, where=where)


def _validation_section(validation, loss_spec) -> Optional[dict]:
    if validation is None:
        return None
    if not isinstance(validation, Mapping):
        raise TypeError(f"validation must be a dict or None, got {type(validation).__qualname__}")
    allowed = {"dataset_params", "loader", "every", "function", "reconstructor"}
    extra = set(validation) - allowed
    if extra:
        raise ValueError(f"validation: unexpected keys {sorted(extra)}; allowed: {sorted(allowed)}")
    loader = validation.get("loader")
    function = validation.get("function")
    data = validation.get("dataset_params")
    return {
        "dataset_params": None if data is None else _to_json(dict(data), "validation.dataset_params"),
        "loader": None if loader is None else loader_settings(loader),
        "every": validation.get("every", 1),
        "function": loss_spec if function is None else _spec_or_none(function, "validation.function"),
        "reconstructor": _spec_or_none(validation.get("reconstructor"), "validation.reconstructor"),
    }


def build_training_record(
    *,
    optimizer,
    train_loader,
    epochs_asked: int,
    epochs_done: int,
    training_loss,
    validation_values=None,
    learning_rates=None,
    weights_kind: str = "final",
    weights_epoch: Optional[int] = None,
    weights_validation: Optional[float] = None,
    model=None,
    loss=None,
    scheduler=None,
    scheduler_step: Optional[str] = None,
    seed: Optional[int] = None,
    initial_weights_sha256: Optional[str] = None,
    initial_weights: Optional[Mapping] = None,
    validation: Optional[Mapping] = None,
    solver=None,
    solver_params: Optional[Mapping] = None,
) -> TrainingRecord:
    """Makes a training record from a torch optimizer, scheduler, loss, loaders and loop settings.

    Args:
        optimizer: a torch optimizer (snapshot now, see :func:`optimizer_record`)
            or the dict :func:`optimizer_record` made when training started
            (then ``scheduler`` must be None: it is inside).
        train_loader: the training DataLoader or its :func:`loader_settings`.
        epochs_asked: epochs the training was asked for.
        epochs_done: epochs completed.
        training_loss: per-epoch training losses (at least ``epochs_done``).
        validation_values: per-epoch validation values (None/NaN: not validated).
        learning_rates: per-epoch learning rate (a list per epoch when there
            are several groups); None: unknown (nulls).
        weights_kind: ``"final"``, ``"best_validation"`` or ``"checkpoint"``.
        weights_epoch: the epoch the weights are from (default: ``epochs_done``).
        weights_validation: their validation value (default: the history's
            value at ``weights_epoch``).
        model: the model, to name the optimizer's parameters.
        loss: the training loss (object or function), recorded as a spec.
        scheduler, scheduler_step: the LR scheduler and when it steps.
        seed: the training seed, or None for an unseeded run.
        initial_weights_sha256: :func:`weights_sha256` of the starting weights.
        initial_weights: ``{"from": "random_state"}``, ``{"from": "file",
            "file": ..., "origin": ...}`` or ``{"from": None, "origin": ...}``
            (default ``{"from": None, "origin": None}``).
        validation: None, or a dict with ``dataset_params``, ``loader``,
            ``every`` (default 1), ``function`` (default: the loss),
            ``reconstructor``.
        solver: the training loop (object, class or function) or its dotted
            name, or None.
        solver_params: the loop's settings, including values it computed;
            ``model``, ``optimizer``, ``device``, ``verbose`` and
            ``save_folder`` are left out.

    Returns:
        The validated :class:`TrainingRecord`.

    Raises:
        FormatError: the pieces do not make a valid record (naming the field).
        TypeError, ValueError: an argument of the wrong type or value.
    """
    for arg, value in (("seed", seed), ("epochs_asked", epochs_asked), ("epochs_done", epochs_done)):
        if (value is not None or arg != "seed") and _int_or_none(value) is None:
            raise TypeError(f"{arg} must be an integer{' or None' if arg == 'seed' else ''}, got {value!r}")
    if isinstance(optimizer, Mapping):
        if scheduler is not None or scheduler_step is not None:
            raise ValueError("scheduler and scheduler_step belong to optimizer_record() when optimizer is a dict")
        opt = copy.deepcopy(dict(optimizer))
    else:
        opt = optimizer_record(optimizer, model=model, scheduler=scheduler, scheduler_step=scheduler_step)
    if weights_kind not in WEIGHTS_KINDS:
        raise ValueError(f"weights_kind must be one of {WEIGHTS_KINDS}, got {weights_kind!r}")
    done = int(epochs_done)
    hist_validation = history(validation_values, done) if validation_values is not None else [None] * done
    hist_lr = history(learning_rates, done) if learning_rates is not None else [None] * done
    epoch = done if weights_epoch is None else int(weights_epoch)
    if weights_validation is None and 1 <= epoch <= done:
        weights_validation = hist_validation[epoch - 1]
    if weights_kind == "best_validation" and _finite_or_none(weights_validation) is None:
        raise ValueError(
            f"weights_kind='best_validation' needs the weights' validation value: pass weights_validation=, "
            f"or validation_values with a finite value at epoch {epoch}"
        )
    loss_spec = _spec_or_none(loss, "solver.loss")
    if isinstance(solver, str) or solver is None:
        solver_class = solver
    else:
        target = solver if (inspect.isroutine(solver) or isinstance(solver, type)) else type(solver)
        solver_class, importable = _name_of(target)
        if not importable:
            _warn_unimportable("solver.class", solver_class, "the training loop")
    params = {k: v for k, v in dict(solver_params or {}).items() if k not in _WHERE_IT_RAN}
    if initial_weights is None:
        initial_weights = {"from": None, "origin": None}
    record = TrainingRecord(
        format=FORMAT,
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(),
        environment=_environment(),
        solver={"class": solver_class, "solver_params": _to_json(params, "solver.solver_params"), "loss": loss_spec},
        optimizer=opt,
        seed=None if seed is None else int(seed),
        initial_weights_sha256=initial_weights_sha256,
        initial_weights=_to_json(dict(initial_weights), "initial_weights"),
        train=loader_settings(train_loader),
        validation=_validation_section(validation, loss_spec),
        epochs={"asked": int(epochs_asked), "done": done},
        weights={"kind": weights_kind, "epoch": epoch, "validation": _finite_or_none(weights_validation), "sha256": None},
        history={
            "training_loss": history(training_loss, done),
            "validation": hist_validation,
            "learning_rate": hist_lr,
        },
    )
    validate_training_record(record)
    return record


class TrainingRecorder:
    """Keeps a training loop's record: a snapshot at the start, one call per epoch, one record per save.

    Made before the first optimizer step, it records the optimizer's starting
    settings and learning rates, the loss, loaders and schedule as specs (so
    any warning about a lambda shows at the start) and the hash of the
    starting weights. Epochs are counted from 1: after the first
    :meth:`epoch_done`, ``epochs_done`` is 1.

    Example (with torch)::

        recorder = TrainingRecorder(model, opt, loss=loss_fn, train_loader=dl, epochs=10,
                                    scheduler=sched, scheduler_step="epoch", seed=0,
                                    initial_weights={"from": "random_state"})
        for epoch in range(10):
            train_loss = ...               # one epoch
            recorder.epoch_done(train_loss, validation=val)   # before sched.step()
            sched.step()
            recorder.save("ckpt.json", model, kind="checkpoint", dataset_params=data)
        recorder.save("final.json", model, dataset_params=data)
    """

    def __init__(
        self,
        model,
        optimizer,
        *,
        loss=None,
        train_loader,
        epochs: int,
        scheduler=None,
        scheduler_step: Optional[str] = None,
        seed: Optional[int] = None,
        initial_weights: Optional[Mapping] = None,
        validation: Optional[Mapping] = None,
        validation_mode: str = "min",
        solver=None,
        solver_params: Optional[Mapping] = None,
    ) -> None:
        if validation_mode not in ("min", "max"):
            raise ValueError(f"validation_mode must be 'min' or 'max', got {validation_mode!r}")
        self._optimizer = optimizer
        self.optimizer = optimizer_record(optimizer, model=model, scheduler=scheduler, scheduler_step=scheduler_step)
        self.initial_weights_sha256 = weights_sha256(model)
        self.loss = _spec_or_none(loss, "solver.loss")
        self.train = loader_settings(train_loader)
        self.validation = validation
        self._validation_section = _validation_section(validation, self.loss)
        self.epochs_asked = int(epochs)
        self.seed = seed
        self.initial_weights = dict(initial_weights) if initial_weights is not None else None
        self.validation_mode = validation_mode
        self.solver = solver
        self.solver_params = dict(solver_params or {})
        self.training_loss: List[Optional[float]] = []
        self.validation_values: List[Optional[float]] = []
        self.learning_rates: List[Any] = []
        self.best_epoch: Optional[int] = None
        self.best_validation: Optional[float] = None

    @property
    def epochs_done(self) -> int:
        """Epochs completed so far."""
        return len(self.training_loss)

    def epoch_done(self, training_loss, validation=None, learning_rate=None) -> int:
        """Records one finished epoch; returns its number (from 1).

        Args:
            training_loss: the epoch's training loss.
            validation: its validation value, or None when not validated.
            learning_rate: the epoch's rate(s); default: read from the
                optimizer now (call this before stepping an epoch scheduler).
        """
        if learning_rate is None:
            rates = [_finite_or_none(g.get("lr")) for g in self._optimizer.param_groups]
            learning_rate = rates[0] if len(rates) == 1 else rates
        self.training_loss.extend(history([training_loss], 1))
        value = history([validation], 1)[0]
        self.validation_values.append(value)
        self.learning_rates.extend(history([learning_rate], 1))
        if value is not None and (
            self.best_validation is None
            or (value < self.best_validation if self.validation_mode == "min" else value > self.best_validation)
        ):
            self.best_epoch, self.best_validation = self.epochs_done, value
        return self.epochs_done

    def resume(self, record: Mapping) -> None:
        """Continues the history of an earlier run's record (e.g. read from its last checkpoint)."""
        record = read_training_record(record)
        self.training_loss = list(record["history"]["training_loss"])
        self.validation_values = list(record["history"]["validation"])
        self.learning_rates = list(record["history"]["learning_rate"])
        self.best_epoch = self.best_validation = None
        for i, value in enumerate(self.validation_values, start=1):
            if value is not None and (
                self.best_validation is None
                or (value < self.best_validation if self.validation_mode == "min" else value > self.best_validation)
            ):
                self.best_epoch, self.best_validation = i, value
        self.initial_weights_sha256 = record["initial_weights_sha256"]
        self.initial_weights = record["initial_weights"]
        self.seed = record["seed"]

    def record(self, kind: str = "final", *, epoch: Optional[int] = None) -> TrainingRecord:
        """The record for weights of ``kind`` (after ``epoch``; default: the best or the last)."""
        value = None
        if kind == "best_validation" and epoch is None:
            if self.best_epoch is None:
                raise ValueError("no validated epoch yet, so there are no best-validation weights")
            epoch, value = self.best_epoch, self.best_validation
        return build_training_record(
            optimizer=self.optimizer,
            train_loader=self.train,
            epochs_asked=self.epochs_asked,
            epochs_done=self.epochs_done,
            training_loss=self.training_loss,
            validation_values=self.validation_values,
            learning_rates=self.learning_rates,
            weights_kind=kind,
            weights_epoch=epoch,
            weights_validation=value,
            loss=self.loss,
            seed=self.seed,
            initial_weights_sha256=self.initial_weights_sha256,
            initial_weights=self.initial_weights,
            validation=self._validation_section,
            solver=self.solver,
            solver_params=self.solver_params,
        )

    def save(self, path, weights, *, dataset_params: Mapping, kind: str = "final",
             epoch: Optional[int] = None, **save_options) -> TrainingRecord:
        """Saves a model file of ``weights`` with this run's record; returns the record saved."""
        return save_model_file(path, weights, training=self.record(kind, epoch=epoch),
                               dataset_params=dataset_params, **save_options)


# --------------------------------------------------------------------------
# reading and writing model files


def _source_value(source) -> Tuple[Any, Optional[str]]:
    if isinstance(source, (str, os.PathLike)):
        path = os.fspath(source)
        return _read_json_file(path), os.fsdecode(path)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _loads_strict(source), None
    return source, None


def read_training_record(source) -> TrainingRecord:
    """The training record in ``source``, validated.

    ``source`` is a record; a mapping holding one under ``training`` (a model
    file's metadata); a model file's descriptor (its ``metadata.training``);
    or the path of a JSON file holding any of these (a model file included).

    Returns:
        A :class:`TrainingRecord` (a deep copy).

    Raises:
        FormatError: the file is not strict JSON, holds no record, or the
            record is invalid (naming the field, e.g. ``metadata.training.epochs.done``).
        TypeError: ``source`` is of an unsupported type.
        OSError: the file cannot be read.
    """
    if isinstance(source, TrainingRecord):
        value, file = source, None
    else:
        value, file = _source_value(source)
    if not isinstance(value, Mapping):
        if file is not None:
            raise FormatError(f"holds a JSON {type(value).__name__}, not an object with a training record", file=file)
        raise TypeError(f"read_training_record: expected a record, a dict or a path, got {type(value).__qualname__}")
    if is_training_record(value):
        record, prefix = value, ""
    elif "training" in value:
        record, prefix = value["training"], "training"
    elif isinstance(value.get("metadata"), Mapping) and "training" in value["metadata"]:
        record, prefix = value["metadata"]["training"], "metadata.training"
    else:
        raise FormatError(
            "no training record: expected a record (with 'format': "
            f"{FORMAT!r}), an object holding one under 'training', or a model file whose metadata does",
            file=file,
        )
    if not isinstance(record, Mapping):
        raise FormatError(f"expected a JSON object, got {_short(record)}", file=file, field=prefix)
    validate_training_record(record, file=file, field_prefix=prefix)
    return TrainingRecord(copy.deepcopy(dict(record)))


def read_dataset_params(source) -> dict:
    """The data record in ``source`` (a model file, its metadata, or a bare record), validated.

    Raises:
        FormatError: not strict JSON, or an invalid record (naming the field).
    """
    value, file = _source_value(source)
    if not isinstance(value, Mapping):
        if file is not None:
            raise FormatError(f"holds a JSON {type(value).__name__}, not an object", file=file)
        raise TypeError(f"read_dataset_params: expected a dict or a path, got {type(value).__qualname__}")
    if "dataset_params" in value:
        data, prefix = value["dataset_params"], "dataset_params"
    elif isinstance(value.get("metadata"), Mapping) and "dataset_params" in value["metadata"]:
        data, prefix = value["metadata"]["dataset_params"], "metadata.dataset_params"
    else:
        data, prefix = value, ""
    if not isinstance(data, Mapping):
        raise FormatError(f"expected a JSON object, got {_short(data)}", file=file, field=prefix or None)
    validate_dataset_params(data, file=file, field_prefix=prefix)
    return copy.deepcopy(dict(data))


def save_model_file(path, weights, *, training: Mapping, dataset_params: Mapping,
                    metadata: Optional[Mapping] = None, **save_options) -> TrainingRecord:
    """Saves a model file: the weights as a tensorlist file with both records in its metadata.

    The descriptor's ``metadata`` is ``{"training": record, "dataset_params":
    data record, **metadata}``. The record's ``weights.sha256`` is set to
    :func:`weights_sha256` of ``weights``. Both records are validated before
    anything is written; the JSON is strict.

    Args:
        path: the descriptor path (the data file is written beside it).
        weights: a mapping name -> array/tensor, a torch state_dict or module,
            or a sequence (named ``"0"``, ``"1"``, ...). torch tensors are
            passed as numpy byte views (bfloat16 included).
        training: the training record (not modified; a copy is saved).
        dataset_params: the training data's record.
        metadata: other metadata keys (not ``training``/``dataset_params``).
        **save_options: passed to ``tensorlist.save`` (``alignment``, ``checksum``...).

    Returns:
        The record as saved (with ``weights.sha256``).

    Raises:
        FormatError: an invalid record (naming the field), or a
            ``weights.sha256`` that does not match the weights.
        ValueError: ``metadata`` has a ``training`` or ``dataset_params`` key.
    """
    arrays = _numpy_weights(weights)
    if not isinstance(training, Mapping):
        raise TypeError(f"training must be a training record (dict), got {type(training).__qualname__}")
    record = TrainingRecord(copy.deepcopy(dict(training)))
    digest = weights_sha256(arrays)
    if isinstance(record.get("weights"), dict):
        given = record["weights"].get("sha256")
        if given is not None and given != digest:
            raise FormatError(f"is {given!r} but the weights being saved hash to {digest!r}",
                              field="training.weights.sha256")
        record["weights"]["sha256"] = digest
    validate_training_record(record, field_prefix="training")
    validate_dataset_params(dataset_params, field_prefix="dataset_params")
    meta = dict(metadata or {})
    for key in ("training", "dataset_params"):
        if key in meta:
            raise ValueError(f"metadata: {key!r} is reserved for the record; pass it as {key}=")
    meta["training"] = record
    meta["dataset_params"] = copy.deepcopy(dict(dataset_params))
    _check_strict_json(meta, "metadata")
    import tensorlist

    tensorlist.save(path, arrays, metadata=json.loads(_dumps(meta)), **save_options)
    return record


def verify_model_file(path) -> TrainingRecord:
    """Checks a model file for an auditor; returns its training record.

    Validates the file (``tensorlist.validate``), its training and data
    records, and that the record's ``weights.sha256`` is the hash of the
    weights the file holds.

    Raises:
        FormatError: the first problem found, naming the field.
    """
    import tensorlist

    tensorlist.validate(path)
    record = read_training_record(path)
    read_dataset_params(path)
    given = record["weights"]["sha256"]
    if given is not None:
        actual = weights_sha256(path)
        if actual != given:
            raise FormatError(
                f"is {given!r} but the file's weights hash to {actual!r}: the weights were changed after saving",
                file=os.fsdecode(path), field="metadata.training.weights.sha256",
            )
    return record
