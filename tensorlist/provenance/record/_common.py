"""What the record's modules share: field names, the nesting bound, warnings, names of objects, torch probes.

Private to ``tensorlist.provenance.record`` (the sub-modules share helpers only through
here or through public names). Imports ``_base.jsonio`` (its ``MAX_DEPTH``, the
package's one nesting limit) and ``errors``, plus ``_bridges.torch`` inside
:func:`torch_to_numpy`, which runs only when a torch tensor is actually met:
importing the record never imports torch.

Fields are named in the record's own dotted form (``history.learning_rate[2]``),
which the user guide and the error messages use, not as JSON pointers.
"""
from __future__ import annotations

import numbers
import os
import sys
import warnings
from collections.abc import Mapping
from typing import Any, List, Optional, Tuple

# The package's one nesting limit (the C scanner's): the record's walks over
# user values (specs, history entries, copies) stop there, as check_json does.
from tensorlist._base.jsonio import MAX_DEPTH
from tensorlist._base.loaded import loaded_object
from tensorlist.errors import FormatError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class RecordWarning(UserWarning):
    """Something could not be recorded in full (e.g. a lambda loss, named only)."""


RecordWarning.__module__ = "tensorlist.provenance.record"  # its public home (the facade)


def join(where: str, key) -> str:
    """The dotted field name of ``key`` inside ``where`` (``a.b``, ``a[0]``)."""
    if isinstance(key, int):
        return f"{where}[{key}]"
    return f"{where}.{key}" if where else str(key)


def short(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters for an error message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def int_or_none(value) -> Optional[int]:
    """``value`` as an int when it is an integer (not a bool), else None."""
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    return None


_SCALARS = frozenset({float, int, str, bool, type(None)})


def copy_json(value: Any) -> Any:
    """A copy of a JSON value: every dict, list and tuple is new, other values are shared.

    Replaces ``copy.deepcopy`` for records: iterative, so it never meets
    Python's recursion limit (deepcopy spends ~3 frames a level). Mappings
    become plain dicts; tuples stay tuples.

    Raises:
        FormatError: ``value`` nests deeper than ``MAX_DEPTH`` (a container
            holding itself included); callers check values first
            (``core.check_strict_json``), so this is a safety net.
    """
    root: List[Any] = [None]
    stack: List[Tuple[Any, Any, Any, int]] = [(root, 0, value, 1)]
    tuples: List[Tuple[Any, Any]] = []
    while stack:
        parent, key, v, depth = stack.pop()
        if isinstance(v, (Mapping, list, tuple)) and depth > MAX_DEPTH:
            raise FormatError(f"nests deeper than {MAX_DEPTH} levels, which no strict reader accepts")
        if isinstance(v, Mapping):
            out: Any = dict.fromkeys(v.keys())
            stack.extend((out, k, x, depth + 1) for k, x in v.items())
        elif isinstance(v, (list, tuple)):
            if isinstance(v, tuple):
                tuples.append((parent, key))
            if set(map(type, v)) <= _SCALARS:  # a history list: copied at C speed
                out = list(v)
            else:
                out = [None] * len(v)
                stack.extend((out, i, x, depth + 1) for i, x in enumerate(v))
        else:
            out = v
        parent[key] = out
    for parent, key in reversed(tuples):  # innermost first: an outer tuple takes finished inner ones
        parent[key] = tuple(parent[key])
    return root[0]


# --------------------------------------------------------------------------
# torch, never imported just to ask


def loaded_torch():
    """The torch module when the program has imported it, else None."""
    return sys.modules.get("torch")


def is_torch_tensor(value) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.Tensor)


def is_torch_module(value) -> bool:
    torch = loaded_torch()
    return torch is not None and isinstance(value, torch.nn.Module)


def torch_to_numpy(tensor, where: str):
    """The tensor as a native-order numpy array, through the package's one torch bridge.

    bfloat16/float8 come as bit carriers (hashed and saved as their type), so
    a torch program's record never imports ml_dtypes.

    Raises:
        TypeError: a sparse, quantized or meta tensor, or a dtype tensorlist
            has no code for (naming ``where``).
    """
    from tensorlist._bridges.torch import to_numpy

    return to_numpy(tensor, where, bits=True)


# --------------------------------------------------------------------------
# names and warnings


def _lookup(module: Optional[str], qualname: Optional[str]):
    """The object ``module.qualname`` among the loaded modules, or None (``_base.loaded``: nothing imported)."""
    if not qualname or "<" in qualname:
        return None
    return loaded_object(module, qualname)


def name_of(obj) -> Tuple[str, bool]:
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


def warn(message: str) -> None:
    """A RecordWarning pointing at the first caller outside the record package."""
    frame, level = sys._getframe(0), 1
    while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == _PACKAGE_DIR:
        frame, level = frame.f_back, level + 1
    warnings.warn(message, RecordWarning, stacklevel=level)


def warn_unimportable(where: str, name: str, what: str) -> None:
    warn(
        f"training record: {where} is {what} {name!r}, which cannot be imported by name "
        "(a lambda, a local or a bound function); it is recorded by name only, with importable: false"
    )
