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


class _NeedsTorch:
    """Base of the stand-ins for the storage classes where torch is missing: using one raises ImportError.

    Importing a stand-in works (``from tensorlist.dcp import TensorListWriter`` in a numpy-only
    environment); making one, subclassing one or calling ``validate_checkpoint_id`` (which DCP calls
    on the class) raises an ImportError naming torch, with why ``torch_storage`` did not import.
    """

    #: The public name a stand-in takes the place of (its ``stand_in=`` class keyword).
    _name = ""
    #: Why ``tensorlist.dcp.torch_storage`` did not import (set when the first stand-in is handed out).
    _error: Any = None

    def __init__(self, *args: Any, **kwargs: Any):
        raise self._missing()

    def __init_subclass__(cls, stand_in: str = "", **kwargs: Any):
        if not stand_in:  # a user's subclass of a stand-in: as unusable as the stand-in itself
            raise cls._missing()
        super().__init_subclass__(**kwargs)
        cls._name = cls.__name__ = cls.__qualname__ = stand_in  # the name users import it by

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id) -> bool:
        raise cls._missing()

    @classmethod
    def _missing(cls) -> ImportError:
        return ImportError(f"tensorlist.dcp.{cls._name} needs torch (pip install 'tensorlist[torch]'): "
                           f"{_NeedsTorch._error}; read_full and validate_checkpoint work without it", name="torch")


class _WriterStandIn(_NeedsTorch, stand_in="TensorListWriter"):
    """Stand-in for TensorListWriter: torch is not installed (pip install 'tensorlist[torch]')."""


class _ReaderStandIn(_NeedsTorch, stand_in="TensorListReader"):
    """Stand-in for TensorListReader: torch is not installed (pip install 'tensorlist[torch]')."""


#: The stand-in of each name of :data:`TORCH_NAMES`.
_STAND_INS = {"TensorListWriter": _WriterStandIn, "TensorListReader": _ReaderStandIn}


def __getattr__(name: str) -> Any:
    if name not in TORCH_NAMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        storage = importlib.import_module(".torch_storage", __name__)
    except ImportError as e:
        if not (e.name or "").split(".")[0] == "torch":
            raise
        _NeedsTorch._error = e
        value = _STAND_INS[name]
    else:
        value = getattr(storage, name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(TORCH_NAMES))
