"""The one resolution of a dotted name to a Python object: among what the program has already imported.

A file may name a class (a namedtuple's ``type``, ``"module:qualname"``).
Resolving it must never import a module nor run any code the name chooses:
no ``import``, no module ``__getattr__`` (PEP 562; numpy's imports
``numpy.f2py`` on first access), no metaclass ``__getattr__``, no property. So
the module is taken from ``sys.modules`` only, and each further name from a
namespace dict only: a module's ``__dict__``, or the ``__dict__`` of each class
in a class's MRO, each read through the built-in descriptor, never through the
object's own attribute lookup. Whatever is not found so is "not loaded" (None),
and the caller falls back or refuses; it never imports to find out.

Stdlib only; imports nothing of the package.
"""
from __future__ import annotations

import sys
from types import ModuleType
from typing import Any, Optional

__all__ = ["loaded_object", "static_attr", "class_mro"]

_MODULE_DICT = ModuleType.__dict__["__dict__"]
_TYPE_DICT = type.__dict__["__dict__"]
_TYPE_MRO = type.__dict__["__mro__"]


def class_mro(obj: Any) -> tuple:
    """The MRO of a class (read through ``type``'s own descriptor), ``()`` for anything else."""
    return _TYPE_MRO.__get__(obj) if issubclass(type(obj), type) else ()


def static_attr(obj: Any, name: str) -> Optional[Any]:
    """``obj.name`` as found in a module's or a class's own namespace dicts, else None; runs no lookup hook.

    Example:
        >>> import collections
        >>> static_attr(collections, "OrderedDict") is collections.OrderedDict
        True
        >>> static_attr(collections.OrderedDict, "no_such") is None
        True
    """
    kind = type(obj)
    if issubclass(kind, ModuleType):
        spaces = (_MODULE_DICT.__get__(obj),)
    elif issubclass(kind, type):
        spaces = tuple(_TYPE_DICT.__get__(c) for c in class_mro(obj))
    else:
        return None
    for space in spaces:
        if name in space:
            return space[name]
    return None


def loaded_object(module: Any, qualname: Any) -> Optional[Any]:
    """The object ``qualname`` (dotted) of ``module`` if the program has imported it, else None.

    Any value is taken (a file's): anything but two non-empty strings is None.
    Nothing is imported and no attribute hook runs (see the module docstring).

    Example:
        >>> import collections
        >>> loaded_object("collections", "OrderedDict") is collections.OrderedDict
        True
        >>> loaded_object("a_module_nobody_imported", "X") is None
        True
    """
    if not (isinstance(module, str) and isinstance(qualname, str) and module and qualname):
        return None
    obj = sys.modules.get(module)
    for part in qualname.split("."):
        if obj is None or not part:
            return None
        obj = static_attr(obj, part)
    return obj
