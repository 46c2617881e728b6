"""Object specs: how the record names objects and callables, and turns free-form values into JSON.

A spec is ``{"class", "args", "importable"}`` for an object or
``{"callable", "importable"}`` for a function, class or builtin
(``schemas/training-record.schema.json``, ``$defs/spec``). :func:`to_json` is the
conversion every free-form part of a record goes through (solver parameters,
hyperparameters, group settings, constructor arguments): it never raises on a
value JSON cannot hold, it records what it can and warns (:class:`RecordWarning`).

Objects held by objects are followed ``_MAX_SPEC_DEPTH`` levels before their
``args`` are null. Nesting of any kind (containers and objects alike) is
followed to the package's one limit, ``_base.jsonio.MAX_DEPTH``: a value nested
deeper, a list holding itself included, could not be read back, so it is
refused with a FormatError naming the field (not a RecursionError).

Imports ``dtypes``, ``_base.jsonio``, ``errors``, the record's ``_common`` and ``hash`` (large
arrays are recorded by their ``weights_sha256``); never torch (a torch value is
recognised only when torch is already loaded).
"""
from __future__ import annotations

import enum
import functools
import inspect
import math
import numbers
import os
from collections.abc import Mapping
from typing import Optional

import numpy as np

from tensorlist._base import dtypes
from tensorlist._base.jsonio import MAX_DEPTH
from tensorlist.errors import FormatError
from tensorlist.provenance.record._common import (
    is_torch_tensor,
    join,
    loaded_torch,
    name_of,
    torch_to_numpy,
    warn,
    warn_unimportable,
)
from tensorlist.provenance.record.hash import weights_sha256

__all__ = ["spec", "spec_or_none", "to_json"]

# Constructor arguments never recorded in a spec: the objects the record holds
# elsewhere (optimizer, parameters, model) and runtime state (last_epoch).
_SKIPPED_ARGS = frozenset({"optimizer", "params", "model", "device", "verbose", "last_epoch"})

# Arrays in free-form parameters are written out up to this many elements;
# larger ones as {"dtype", "shape", "weights_sha256"} (with a warning).
_MAX_LISTED_ELEMENTS = 1024
# How deep specs of objects held by objects are followed before args is null.
_MAX_SPEC_DEPTH = 4


def _constructor_args(obj, where: str, depth: int, level: int) -> Optional[dict]:
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
            args[param.name] = to_json(value, join(join(where, "args"), param.name), depth + 1, level + 1)
            break
    return args


def spec(obj, *, where: str = "object", _depth: int = 0, _level: int = 0) -> dict:
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
                "func": spec(obj.func, where=join(where, "func"), _depth=_depth + 1, _level=_level + 1),
                "args": to_json(list(obj.args), join(where, "args"), _depth + 1, _level + 1),
                "keywords": to_json(dict(obj.keywords), join(where, "keywords"), _depth + 1, _level + 1),
            },
            "importable": True,
        }
    if inspect.isroutine(obj) or isinstance(obj, type):
        name, importable = name_of(obj)
        if not importable:
            warn_unimportable(where, name, "the callable")
        return {"callable": name, "importable": importable}
    name, importable = name_of(type(obj))
    if not importable:
        warn_unimportable(where, name, "an object of the class")
    args = None if _depth >= _MAX_SPEC_DEPTH else _constructor_args(obj, where, _depth, _level)
    return {"class": name, "args": args, "importable": importable}


def spec_or_none(value, where: str):
    """None for None, a spec given as a dict as is (copied), else :func:`spec` of ``value``."""
    if value is None:
        return None
    if isinstance(value, Mapping) and ("class" in value or "callable" in value):
        return dict(value)  # already a spec
    return spec(value, where=where)


def _array_to_json(value, where: str, depth: int, level: int):
    arr = torch_to_numpy(value, where) if is_torch_tensor(value) else np.asarray(value)
    if arr.size <= _MAX_LISTED_ELEMENTS:
        if arr.dtype.kind in "biufc":
            return to_json(arr.tolist(), where, depth + 1, level + 1)
        try:  # bfloat16, float8...: through float64, which holds them exactly
            return to_json(arr.astype(np.float64).tolist(), where, depth + 1, level + 1)
        except (TypeError, ValueError):
            pass
    try:
        dtype_name: Optional[str] = dtypes.from_numpy(arr.dtype).name
        digest: Optional[str] = weights_sha256({"": arr})
    except TypeError:
        dtype_name, digest = str(arr.dtype), None
    warn(
        f"training record: {where} is an array of {arr.size} elements; it is recorded as its "
        "dtype, shape and weights_sha256 only"
    )
    return {"dtype": dtype_name, "shape": [int(d) for d in arr.shape], "weights_sha256": digest}


def to_json(value, where: str, depth: int = 0, level: int = 0):
    """``value`` as plain JSON for a free-form part of the record.

    Tuples become lists, numpy and torch scalars numbers, small arrays nested
    lists, non-finite numbers null (with a warning: the record must be strict
    JSON), objects and callables specs. ``depth`` counts objects held by
    objects (see ``_MAX_SPEC_DEPTH``), ``level`` every nesting step.

    Raises:
        FormatError: ``value`` nests deeper than ``MAX_DEPTH`` levels (naming
            the field ``where``).

    Example:
        >>> to_json({"betas": (0.9, 0.999), "steps": np.int64(3)}, "hyperparameters")
        {'betas': [0.9, 0.999], 'steps': 3}
    """
    if level > MAX_DEPTH:  # also ends a container that holds itself
        raise FormatError(f"nests deeper than {MAX_DEPTH} levels, which no strict reader accepts", field=where)
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        return [to_json(value.real, join(where, 0), depth, level + 1),
                to_json(value.imag, join(where, 1), depth, level + 1)]
    if isinstance(value, numbers.Real):
        f = float(value)
        if math.isfinite(f):
            return f
        warn(f"training record: {where} is {f!r}, which JSON cannot hold; it is recorded as null")
        return None
    if isinstance(value, enum.Enum):
        name, _ = name_of(type(value))
        return f"{name}.{value.name}"
    if isinstance(value, os.PathLike):
        return os.fsdecode(value)
    if isinstance(value, bytes):
        return value.decode("utf-8", "backslashreplace")
    if isinstance(value, Mapping):
        return {str(k): to_json(v, join(where, str(k)), depth, level + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v, join(where, i), depth, level + 1) for i, v in enumerate(value)]
    if isinstance(value, (set, frozenset)):
        return [to_json(v, join(where, i), depth, level + 1) for i, v in enumerate(sorted(value, key=repr))]
    if isinstance(value, (np.ndarray, np.generic)) or is_torch_tensor(value):
        if getattr(value, "ndim", 1) == 0:
            return to_json(value.item(), where, depth, level)
        return _array_to_json(value, where, depth, level)
    torch = loaded_torch()
    if torch is not None and isinstance(value, (torch.dtype, torch.device)):
        return str(value)
    if isinstance(value, np.dtype):
        return str(value)
    return spec(value, where=where, _depth=depth, _level=level)
