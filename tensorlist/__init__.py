"""tensorlist: lamp-compatible tensor list files with a zero-copy C core.

A TensorList is a JSON descriptor (dims, dtype code, byte offset and length
of each tensor, and the data file's location) over a raw little-endian data
file. See docs/FORMAT.md for the specification.

    >>> import numpy as np, tensorlist, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "model.tl")
    >>> tensorlist.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    >>> tensorlist.load(path)["w"][1]
    array([3., 4., 5.], dtype=float32)

The facade is lazy (PEP 562): ``import tensorlist`` runs only ``errors`` and
``_backends``; each public name imports its module on first access, so a
torch program's ``import tensorlist.torch`` pays for the reader, not for the
writer, the JSON Schema or the URL backend. ``tensorlist.remote`` registers
its URL handlers when ``_backends.dispatch`` first meets a URL.
"""
from typing import TYPE_CHECKING

from tensorlist._base import backends as _backends
from tensorlist.errors import ChecksumError, FormatError, TensorListError

if TYPE_CHECKING:  # what static checkers see; at run time __getattr__ below imports these on first access
    from tensorlist.dlpack import to_dlpack
    from tensorlist.format import (DEFAULT_ALIGNMENT, FORMAT_VERSION, LIST_ALIGNMENT, MAX_DESCRIPTOR_BYTES, MAX_TENSORS,
                         MIN_TENSOR_ALIGNMENT, ListDescriptor, TensorInfo, find_tensor_lists)
    from tensorlist.reader import Reader, load, load_document, open
    from tensorlist.schema import load_schema, validate
    from tensorlist.writer import Tensors, Writer, save, save_document, write_data

#: public name -> the module that defines it (imported on first access)
_HOMES = {
    **dict.fromkeys(("save", "Writer", "Tensors", "write_data", "save_document"), "writer"),
    **dict.fromkeys(("load", "open", "Reader", "load_document"), "reader"),
    **dict.fromkeys(("validate", "load_schema"), "schema"),
    "to_dlpack": "dlpack",
    **dict.fromkeys(("find_tensor_lists", "ListDescriptor", "TensorInfo", "FORMAT_VERSION", "LIST_ALIGNMENT",
                     "MIN_TENSOR_ALIGNMENT", "DEFAULT_ALIGNMENT", "MAX_DESCRIPTOR_BYTES", "MAX_TENSORS"), "format"),
}
#: the submodules an eager facade used to import, still reachable as ``tensorlist.<name>`` after ``import tensorlist``
_SUBMODULES = frozenset(("format", "reader", "writer", "schema", "remote", "dlpack"))


def __getattr__(name):
    """A public name's value, or one of ``_SUBMODULES``, imported on first access and then cached here."""
    import importlib

    if name in _HOMES:
        value = getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f"{__name__}.{name}")
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__) | _SUBMODULES)


def _load_to_device(path, device, **options):
    """``load(path, device=...)``: the staging path of ``tensorlist.torch``, which needs torch."""
    try:
        from tensorlist.torch import load as staged_load
    except ImportError as e:
        raise ImportError(f"{path}: loading onto a device needs torch (pip install 'tensorlist[torch]'): "
                          f"{e}") from e
    return staged_load(path, device, **options)


def _signed_save(path, signing_key):
    """A trainer's save, signed (``signing.signed_save``): above the record layer whose savers call it."""
    from tensorlist.provenance.signing import signed_save
    return signed_save(path, signing_key)


_backends.register("device", _load_to_device)
_backends.register("sign", _signed_save)
# the URL backend registers its handlers when imported: on the first URL, not with the package
_backends.provide(f"{__name__}.remote")

__version__ = "0.1.0"

__all__ = [
    "save",
    "load",
    "open",
    "validate",
    "Reader",
    "Writer",
    "Tensors",
    "write_data",
    "save_document",
    "load_document",
    "to_dlpack",
    "find_tensor_lists",
    "load_schema",
    "ListDescriptor",
    "TensorInfo",
    "TensorListError",
    "FormatError",
    "ChecksumError",
    "FORMAT_VERSION",
    "LIST_ALIGNMENT",
    "MIN_TENSOR_ALIGNMENT",
    "DEFAULT_ALIGNMENT",
    "MAX_DESCRIPTOR_BYTES",
    "MAX_TENSORS",
]
