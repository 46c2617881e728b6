"""tensorlist: lamp-compatible tensor list files with a zero-copy C core.

A TensorList is a JSON descriptor (dims, dtype code, byte offset and length
of each tensor, and the data file's location) over a raw little-endian data
file. See docs/FORMAT.md for the specification.

    >>> import numpy as np, tensorlist, tempfile, os
    >>> path = os.path.join(tempfile.mkdtemp(), "model.tl")
    >>> tensorlist.save(path, {"w": np.arange(6, dtype=np.float32).reshape(2, 3)})
    >>> tensorlist.load(path)["w"][1]
    array([3., 4., 5.], dtype=float32)
"""
from .errors import ChecksumError, FormatError, TensorListError
from .format import (
    DEFAULT_ALIGNMENT,
    FORMAT_VERSION,
    LIST_ALIGNMENT,
    MAX_DESCRIPTOR_BYTES,
    MAX_TENSORS,
    MIN_TENSOR_ALIGNMENT,
    ListDescriptor,
    TensorInfo,
    find_tensor_lists,
)
from .reader import Reader, load, load_document, open
from .dlpack import to_dlpack
from .schema import load_schema, validate
from .writer import Tensors, Writer, save, save_document, write_data
from . import _backends
from . import remote as _remote  # noqa: F401, E402 - registers the URL backend (see _backends)


def _load_to_device(path, device, **options):
    """``load(path, device=...)``: the staging path of ``tensorlist._staging``, which needs torch."""
    try:
        from ._staging import load as staged_load
    except ImportError as e:
        raise ImportError(f"{path}: loading onto a device needs torch (pip install 'tensorlist[torch]'): "
                          f"{e}") from e
    return staged_load(path, device, **options)


_backends.register("device", _load_to_device)


def _signed_save(path, signing_key):
    """A trainer's save, signed (``signing.signed_save``): above the record layer whose savers call it."""
    from .signing import signed_save
    return signed_save(path, signing_key)


_backends.register("sign", _signed_save)

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
