"""torch.distributed.checkpoint (DCP) storage on tensorlist files, with no pickle anywhere.

:class:`TensorListWriter` and :class:`TensorListReader` plug into
``dcp.save``, ``dcp.async_save`` and ``dcp.load`` in place of DCP's
``FileSystemWriter``/``FileSystemReader`` (docs/FORMAT.md, "Distributed
checkpoints (DCP)"). Everything else here needs numpy alone: a checkpoint is
read (:func:`read_full`), checked (:func:`validate_checkpoint`) and its layout
handled where torch is not installed. The package splits by concept:

- :mod:`tensorlist.dcp.layout`: file and key names, the records (``TensorMeta``,
  ``StorageEntry``, ``Checkpoint``), values, the metadata's commit, the listing;
- :mod:`tensorlist.dcp.metadata`: the metadata document, its checks and its read;
- :mod:`tensorlist.dcp.tiling`: chunks inside, disjoint, covering (step 3);
- :mod:`tensorlist.dcp.shards`: ``Shards``, ``read_full``, ``validate_checkpoint``;
- ``tensorlist.dcp.torch_storage`` (torch): ``TensorListWriter``/``TensorListReader``,
  loaded when one of them is first asked for. Without torch these two names
  are stand-ins that raise an ImportError naming torch when used, so
  ``from tensorlist.dcp import TensorListReader, TensorListWriter, read_full``
  works in a numpy-only environment.

Imports ``dcp.layout``, ``dcp.metadata``, ``dcp.tiling``, ``dcp.shards`` (and
``dcp.torch_storage``, with torch, on first use of a storage class).

Example:
    >>> import tempfile, numpy as np
    >>> from tensorlist.dcp import read_full, validate_checkpoint
    >>> from tensorlist.convert import convert
    >>> ckpt = tempfile.mkdtemp() + "/ckpt"
    >>> src = tempfile.mkdtemp() + "/m.npz"; np.savez(src, w=np.arange(6.0).reshape(2, 3))
    >>> convert(src, ckpt, dst_format="dcp")
    >>> float(read_full(ckpt)["w"].sum()), sorted(validate_checkpoint(ckpt).tensors)
    (15.0, ['w'])
"""
from __future__ import annotations

import importlib
from typing import Any

from tensorlist.dcp.layout import (DCP_FORMAT_VERSION, DCP_VERSION, ENCODINGS, FORMAT_NAME, METADATA_NAME, SCHEMA, Checkpoint,
                     StorageEntry, TensorMeta, bytes_key, commit_metadata, confine, decode_value, encode_entry,
                     encode_value, holds, is_save_file, join, listing, shard_name, tensor_key)
from tensorlist.dcp.metadata import check_shape, metadata_document, parse_metadata, read_metadata, schema_check
from tensorlist.dcp.shards import Shards, assemble, read_full, validate_checkpoint

__all__ = ["TensorListWriter", "TensorListReader", "read_full", "validate_checkpoint", "read_metadata",
           "parse_metadata", "Checkpoint", "Shards", "TensorMeta", "StorageEntry", "METADATA_NAME", "FORMAT_NAME",
           "DCP_FORMAT_VERSION", "DCP_VERSION", "SCHEMA", "metadata_document", "check_shape", "schema_check",
           "encode_value", "decode_value", "shard_name", "tensor_key", "bytes_key", "join", "is_save_file", "holds",
           "commit_metadata", "listing", "assemble", "ENCODINGS", "encode_entry", "confine"]

#: The names the torch storage layer provides (``tensorlist.dcp.torch_storage``), loaded on first use.
TORCH_NAMES = ("TensorListWriter", "TensorListReader")


def _needs_torch(name: str, error: ImportError) -> type:
    """A stand-in for ``name`` where torch is missing: importing it works, using it raises ImportError."""
    message = (f"tensorlist.dcp.{name} needs torch (pip install 'tensorlist[torch]'): {error}; "
               "read_full and validate_checkpoint work without it")

    class Missing:
        __doc__ = f"Stand-in for {name}: torch is not installed. {message}"

        def __init__(self, *args: Any, **kwargs: Any):
            raise ImportError(message, name="torch")

        def __init_subclass__(cls, **kwargs: Any):
            raise ImportError(message, name="torch")

        @classmethod
        def validate_checkpoint_id(cls, checkpoint_id) -> bool:
            raise ImportError(message, name="torch")

    Missing.__name__ = Missing.__qualname__ = name
    Missing.__module__ = __name__
    return Missing


def __getattr__(name: str) -> Any:
    if name not in TORCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        storage = importlib.import_module(".torch_storage", __name__)
    except ImportError as e:
        if not (e.name or "").split(".")[0] == "torch":
            raise
        value = _needs_torch(name, e)
    else:
        value = getattr(storage, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(TORCH_NAMES))
