"""tensorlist: lamp-compatible tensor list files, read zero-copy through a C core.

A TensorList is a JSON descriptor (each tensor's dims, dtype, offset and
length) over one raw little-endian data file, memory-mapped when loaded:

    >>> import numpy as np, tensorlist, tempfile
    >>> path = tempfile.mkdtemp() + "/model.tl"
    >>> tensorlist.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    >>> tensorlist.load(path)["w"][1]
    array([3., 4., 5.], dtype=float32)

Here: ``save``, ``load``, ``open`` (a ``Reader``), ``validate``,
``to_dlpack``, ``Key`` (``key=`` encrypts and decrypts), the errors
(``FormatError``...) and the format's types and limits. Frameworks: ``tensorlist.torch``, ``.jax``, ``.mlx``, ``.tensorflow``,
``.orbax`` (each imports its own); ``tensorlist.dcp`` (torch.distributed
checkpoints), ``.convert``, ``.loops``, ``.lightning``, ``.huggingface``,
``.provenance`` (training records, signing, lineage); the ``tensorlist``
command. Each name is documented in its module (``help(tensorlist.reader)``).

Documentation: docs/FORMAT.md (the specification), docs/FRAMEWORKS.md,
docs/LOOPS.md, docs/PROVENANCE.md, docs/CLI.md; README.md to start.
"""
# The facade is lazy (PEP 562): importing the package runs only ``errors`` and ``_base.backends``, and
# each public name imports its module on first access (``__getattr__`` below), so that a torch program's
# ``import tensorlist.torch`` pays for the reader, not for the writer, the JSON Schema or the URL backend;
# ``tensorlist.remote`` registers its URL handlers when ``_base.backends.dispatch`` first meets a URL.
from typing import TYPE_CHECKING

from tensorlist._base import backends as _backends
from tensorlist.errors import ChecksumError as ChecksumError, FormatError as FormatError
from tensorlist.errors import EncryptionError as EncryptionError, TensorListError as TensorListError

if TYPE_CHECKING:  # what static checkers see ("X as X": re-exported); at run time __getattr__ imports them
    from tensorlist.crypto import Key as Key
    from tensorlist.dlpack import to_dlpack as to_dlpack
    from tensorlist.format import (DEFAULT_ALIGNMENT as DEFAULT_ALIGNMENT, FORMAT_VERSION as FORMAT_VERSION,
                                   LIST_ALIGNMENT as LIST_ALIGNMENT, MAX_DESCRIPTOR_BYTES as MAX_DESCRIPTOR_BYTES,
                                   MAX_TENSORS as MAX_TENSORS, MIN_TENSOR_ALIGNMENT as MIN_TENSOR_ALIGNMENT,
                                   ListDescriptor as ListDescriptor, TensorInfo as TensorInfo,
                                   find_tensor_lists as find_tensor_lists)
    from tensorlist.reader import Reader as Reader, load as load, load_document as load_document, open as open
    from tensorlist.schema import load_schema as load_schema, validate as validate
    from tensorlist.writer import (Tensors as Tensors, Writer as Writer, save as save, save_document as save_document,
                                   write_data as write_data)

#: public name -> the module that defines it (imported on first access); with the errors, the public names
_HOMES = {
    **dict.fromkeys(("save", "Writer", "Tensors", "write_data", "save_document"), "writer"),
    **dict.fromkeys(("load", "open", "Reader", "load_document"), "reader"),
    **dict.fromkeys(("validate", "load_schema"), "schema"),
    "to_dlpack": "dlpack",
    "Key": "crypto",
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
    return sorted(set(globals()) | set(_HOMES) | _SUBMODULES)


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


def _foreign_error(file, doc=None):
    """What a file handed to a tensorlist reader is instead (``convert.formats``, above ``format``)."""
    from tensorlist.convert.formats import foreign_error
    return foreign_error(file, doc)


_backends.register("device", _load_to_device)
_backends.register("foreign", _foreign_error)
_backends.register("sign", _signed_save)
# the URL backend registers its handlers when imported: on the first URL, not with the package
_backends.provide(f"{__name__}.remote")

__version__ = "0.1.0"

#: What ``from tensorlist import *`` brings: the calls. The other public names (the classes, the errors, the
#: format's constants) are used as ``tensorlist.<name>`` and documented in their modules: pydoc documents
#: every ``__all__`` entry in full, so listing them here would make ``help(tensorlist)`` re-print each class.
__all__ = ["save", "load", "open", "validate", "to_dlpack"]
