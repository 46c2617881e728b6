"""The torch-free half of :mod:`tensorlist.dcp`, under its former name (kept for importers).

Every name comes from the package :mod:`tensorlist.dcp` (``layout``,
``metadata``, ``tiling``, ``shards``); importing this module never imports torch.

Example:
    >>> from tensorlist.dcp_read import METADATA_NAME
    >>> METADATA_NAME
    '.metadata.json'
"""
from .dcp.layout import (DCP_FORMAT_VERSION, DCP_VERSION, ENCODINGS, FORMAT_NAME, METADATA_NAME, SCHEMA, Checkpoint,
                         StorageEntry, TensorMeta, bytes_key, commit_metadata, confine, decode_value, encode_entry,
                         encode_value, holds, is_save_file, join, listing, shard_name, tensor_key)
from .dcp.metadata import check_shape, metadata_document, parse_metadata, read_metadata, schema_check
from .dcp.shards import Shards, assemble, read_full, validate_checkpoint

__all__ = ["METADATA_NAME", "FORMAT_NAME", "DCP_FORMAT_VERSION", "SCHEMA", "TensorMeta", "StorageEntry",
           "Checkpoint", "Shards", "metadata_document", "parse_metadata", "read_metadata", "validate_checkpoint",
           "read_full", "check_shape", "schema_check", "encode_value", "decode_value", "shard_name", "tensor_key",
           "bytes_key", "join", "is_save_file", "holds", "commit_metadata", "listing", "assemble", "DCP_VERSION",
           "ENCODINGS", "encode_entry", "confine"]
