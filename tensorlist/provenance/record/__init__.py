"""The training record: how the weights of a model file were trained.

A training loop writes a *training record* into every model file it saves
(final, best validation, each checkpoint), next to the record of its training
data (``dataset_params``). A model file is a tensorlist file whose root
descriptor holds the weights and whose ``metadata`` is::

    {"training": <training record>, "dataset_params": <data record>, ...}

so ``tensorlist.load(path)`` gives the weights, ``tensorlist.validate(path)``
checks the file, and :func:`read_training_record` finds the record.

The record's fields are defined, with their units, by
``schemas/training-record.schema.json``; the user guide is
``docs/TRAINING_RECORD.md``. Epochs are counted from 1 (epoch 0 means "before
training"), and every history list is cut to the epochs done.

:func:`weights_sha256` is an exact, framework-agnostic hash of named tensors
(defined in ``docs/FORMAT.md``, "Weights hash"): numpy arrays, a torch
state_dict (bfloat16 included) and the same weights read back from a file hash
alike.

This module is the facade: it re-exports the public names of the package's
modules, one concept each, which import one another in this order only:

- ``_common``: field names, the nesting bound, ``RecordWarning``, names of objects, torch probes;
- ``hash``: :func:`weights_sha256` and the entries made from it;
- ``spec``: object specs and the JSON of free-form values (:func:`spec`);
- ``core``: the version marker, :class:`TrainingRecord`, :func:`history`, validation;
- ``modelfile``: reading records, :func:`save_model_file`, :func:`verify_model_file`;
- ``build``: :func:`loader_settings`, :func:`optimizer_record`, :func:`optimizer_state_record`,
  :func:`build_training_record`, :class:`TrainingRecorder`.

torch is imported lazily, inside the functions that are given torch objects
(torch tensors cross through ``tensorlist._bridges.torch``); the package
imports without it.

Example:
    >>> import numpy as np
    >>> history([0.5, float("nan"), 0.25, 0.0], 3)
    [0.5, None, 0.25]
    >>> w = {"0": np.zeros(2, np.float32)}
    >>> weights_sha256(w) == weights_sha256([np.zeros(2, np.float32)])  # unnamed: "0", "1", ...
    True
"""
from tensorlist.provenance.record._common import RecordWarning
from tensorlist.provenance.record.build import TrainingRecorder, build_training_record, loader_settings, optimizer_record, optimizer_state_record
from tensorlist.provenance.record.core import (
    FORMAT,
    WEIGHTS_KINDS,
    HistoryRow,
    TrainingRecord,
    epoch_number,
    history,
    history_rows,
    history_table,
    is_training_record,
    validate_dataset_params,
    validate_training_record,
)
from tensorlist.provenance.record.hash import (CHECKPOINT_WEIGHTS, WEIGHTS_HASH_TAG, anchor_paths, dataset_content_hash,
                   file_weights_sha256, model_file_origin, resolve_paths, weights_pointer, weights_sha256)
from tensorlist.provenance.record.modelfile import read_dataset_params, read_training_record, save_model_file, verify_model_file
from tensorlist.provenance.record.spec import spec

__all__ = [
    "FORMAT",
    "WEIGHTS_HASH_TAG",
    "CHECKPOINT_WEIGHTS",
    "weights_pointer",
    "file_weights_sha256",
    "WEIGHTS_KINDS",
    "RecordWarning",
    "TrainingRecord",
    "TrainingRecorder",
    "history",
    "epoch_number",
    "HistoryRow",
    "history_rows",
    "history_table",
    "is_training_record",
    "loader_settings",
    "spec",
    "optimizer_record",
    "optimizer_state_record",
    "build_training_record",
    "validate_training_record",
    "validate_dataset_params",
    "read_training_record",
    "read_dataset_params",
    "weights_sha256",
    "dataset_content_hash",
    "model_file_origin",
    "anchor_paths",
    "resolve_paths",
    "save_model_file",
    "verify_model_file",
]
