"""Model files: reading their records, saving weights with records, and verifying them.

A model file is a tensorlist file whose root descriptor holds the weights and
whose ``metadata`` is ``{"training": <training record>, "dataset_params":
<data record>, ...}``. Files given by path are read with the package's one
capped strict JSON reader (``format.read_json_file``: regular files only, at
most ``Limits().max_descriptor_bytes``), with friendlier hints when the file
is not JSON at all (e.g. the data file given instead of the descriptor).

Imports ``format``, ``writer`` (``save``), ``schema`` (``validate``),
``errors`` and the record's ``core``, ``hash`` and ``_common``.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Optional, Tuple

from tensorlist.errors import FormatError
from tensorlist import reader
from tensorlist.format import Limits, read_json_bytes, read_json_file
from tensorlist.schema import validate
from tensorlist.writer import save
from tensorlist.provenance.record._common import copy_json, short
from tensorlist.provenance.record.core import FORMAT, TrainingRecord, check_strict_json, is_training_record, validate_dataset_params, validate_training_record
from tensorlist.provenance.record.hash import anchor_paths, numpy_weights, weights_sha256

__all__ = ["read_training_record", "read_dataset_params", "save_model_file", "verify_model_file"]

_UTF8_REASON = "descriptor is not UTF-8"
_JSON_REASON = "invalid JSON: "


def _with_hints(read, *, file=None) -> Any:
    """``read()``'s document, its FormatErrors reworded when the file is not JSON at all."""
    try:
        return read()
    except FormatError as e:
        if e.reason.startswith(_UTF8_REASON):
            raise FormatError(f"not a JSON file: not UTF-8 text{e.reason[len(_UTF8_REASON):]}; "
                              "a model file is the JSON descriptor, not its data file", file=file) from e
        if e.reason.startswith(_JSON_REASON) and " at line " in e.reason and "duplicate" not in e.reason:
            raise FormatError("not a JSON file: " + e.reason[len(_JSON_REASON):], file=file) from e
        raise


def _source_value(source, key=None) -> Tuple[Any, Optional[str], bool]:
    """(the document, its file, whether it was parsed here: no one else holds it, so it needs no copy).

    An encrypted model file's metadata is sealed: ``key`` opens it (the one
    place a record is read from a file), else ``EncryptionError`` naming the file.
    """
    if isinstance(source, (str, os.PathLike)):
        path = os.fsdecode(source)
        doc = _with_hints(lambda: read_json_file(path, Limits()), file=path)
        if isinstance(doc, Mapping) and "encryption" in doc:
            with reader.Reader(path, key=key) as r:
                r.require_key()
                doc = dict(doc, metadata=r.metadata)
        return doc, path, True
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _with_hints(lambda: read_json_bytes(bytes(source), limits=Limits())), None, True
    return source, None, False


def read_training_record(source, *, key=None) -> TrainingRecord:
    """The training record in ``source``, validated.

    ``source`` is a record; a mapping holding one under ``training`` (a model
    file's metadata); a model file's descriptor (its ``metadata.training``);
    JSON text as bytes; or the path of a JSON file holding any of these (a
    model file included), read capped at ``Limits().max_descriptor_bytes``.
    ``key`` opens an encrypted model file (its metadata is sealed).

    Returns:
        A :class:`TrainingRecord` (a deep copy).

    Raises:
        FormatError: the file is not strict JSON, not a regular file, too
            large, holds no record, or the record is invalid (naming the
            field, e.g. ``metadata.training.epochs.done``).
        TypeError: ``source`` is of an unsupported type.
        OSError: the file cannot be read.
    """
    if isinstance(source, TrainingRecord):
        value, file, parsed = source, None, False
    else:
        value, file, parsed = _source_value(source, key)
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
        raise FormatError(f"expected a JSON object, got {short(record)}", file=file, field=prefix)
    validate_training_record(record, file=file, field_prefix=prefix)
    return TrainingRecord(record if parsed else copy_json(record))


def read_dataset_params(source, *, key=None) -> dict:
    """The data record in ``source`` (a model file, its metadata, or a bare record), validated.

    ``key`` opens an encrypted model file.

    Raises:
        FormatError: not strict JSON, or an invalid record (naming the field).
    """
    value, file, parsed = _source_value(source, key)
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
        raise FormatError(f"expected a JSON object, got {short(data)}", file=file, field=prefix or None)
    validate_dataset_params(data, file=file, field_prefix=prefix)
    return data if parsed else copy_json(data)


def save_model_file(path, weights, *, training: Mapping, dataset_params: Mapping,
                    metadata: Optional[Mapping] = None, **save_options) -> TrainingRecord:
    """Saves a model file: the weights as a tensorlist file with both records in its metadata.

    The descriptor's ``metadata`` is ``{"training": record, "dataset_params":
    data record, **metadata}``. The record's ``weights.sha256`` is set to
    :func:`~tensorlist.provenance.record.weights_sha256` of ``weights``, and its absolute
    paths (the origin's) are stored relative to the file's directory
    (:func:`~tensorlist.provenance.record.anchor_paths`). Both records are
    validated before anything is written; the JSON is strict.

    Args:
        path: the descriptor path (the data file is written beside it).
        weights: a mapping name -> array/tensor, a torch state_dict or module,
            or a sequence (named ``"0"``, ``"1"``, ...). torch tensors are
            passed as numpy byte views (bfloat16 included).
        training: the training record (not modified; a copy is saved).
        dataset_params: the training data's record.
        metadata: other metadata keys (not ``training``/``dataset_params``).
        **save_options: passed to ``tensorlist.save`` (``alignment``, ``checksum``...);
            ``key=`` encrypts the file: the weights and the metadata, both
            records included, are then sealed with it.

    Returns:
        The record as saved (with ``weights.sha256``).

    Raises:
        FormatError: an invalid record (naming the field), or a
            ``weights.sha256`` that does not match the weights.
        ValueError: ``metadata`` has a ``training`` or ``dataset_params`` key.
    """
    arrays = numpy_weights(weights)
    if not isinstance(training, Mapping):
        raise TypeError(f"training must be a training record (dict), got {type(training).__qualname__}")
    training = anchor_paths(training, os.path.dirname(os.fsdecode(path)))  # its paths are read from there
    record = TrainingRecord(training)  # copied whole once valid; only weights changes before
    digest = weights_sha256(arrays)
    if isinstance(record.get("weights"), dict):
        given = record["weights"].get("sha256")
        if given is not None and given != digest:
            raise FormatError(f"is {given!r} but the weights being saved hash to {digest!r}",
                              field="training.weights.sha256")
        record["weights"] = dict(record["weights"], sha256=digest)
    validate_training_record(record, field_prefix="training")
    validate_dataset_params(dataset_params, field_prefix="dataset_params")
    meta = dict(metadata or {})
    for key in ("training", "dataset_params"):
        if key in meta:
            raise ValueError(f"metadata: {key!r} is reserved for the record; pass it as {key}=")
    record = TrainingRecord(copy_json(record))
    meta["training"] = record
    meta["dataset_params"] = copy_json(dataset_params)
    # checked where it will sit, one level inside the descriptor, so that the
    # nesting limit is the one a reader applies to the file
    check_strict_json({"metadata": meta})
    save(path, arrays, metadata=meta, **save_options)
    return record


def verify_model_file(path, *, pointer: Optional[str] = None, key=None) -> TrainingRecord:
    """Checks a model file for an auditor; returns its training record.

    Validates the file (``tensorlist.validate``), its training and data
    records, and that the record's ``weights.sha256`` is the hash of the
    weights the file holds: its one tensor list, or in a document of several
    (a Lightning checkpoint: ``pointer="/state_dict"``) the list at ``pointer``.
    ``key`` opens an encrypted model file (every chunk's tag is checked too).

    Raises:
        FormatError: the first problem found, naming the field.
        EncryptionError: an encrypted file without its key or with another.
    """
    validate(path, key=key)
    record = read_training_record(path, key=key)
    read_dataset_params(path, key=key)
    given = record["weights"]["sha256"]
    if given is not None:
        plain = pointer is None and key is None
        actual = weights_sha256(path if plain else reader.load(path, pointer=pointer, bits=True, key=key))
        if actual != given:
            raise FormatError(
                f"is {given!r} but the file's weights hash to {actual!r}: the weights were changed after saving",
                file=os.fsdecode(path), field="metadata.training.weights.sha256",
            )
    return record
