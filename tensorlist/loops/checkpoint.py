"""Checkpoint I/O: the loops' checkpoint document (lamp's StateIO shape), written atomically, read once.

A checkpoint is one JSON document written atomically with
``tensorlist.writer.save_document`` (all its TensorLists share one data file;
a kill at any moment leaves the previous or the new checkpoint):

- ``{"type": "SimpleLoopState", "model", "optimizer", "epoch",
  "lastValidationLoss"?, "minValidationLoss"?, "minValidationLossModel"?:
  [epoch, TensorList], "learningCurve"?: [[epoch, train, smoothed|null,
  raw|null], ...] newest first, ...}``
- ``{"type": "SWALoopState", "model", "optimizer", "epoch", ...,
  "numberOfAveragedModels", "averagedModels"?, "learningCurve"?: [[epoch,
  train, valid|null], ...]}``
- ``{"type": "SimpleThenSWALoopState", "simple": {...}, "swa": {...}?}``

with lamp's keys in lamp's order (``type`` first, absent options and empty
curves left out) and these extensions, which lamp skips when reading:
tensor names in every TensorList; the optimizer's non-tensor state in the
optimizer list's ``metadata``; ``"tensorlist"`` (loop extras: schedule
states, the torch LR scheduler's state, base learning rates, RNG states of
torch, numpy and ``random``); and ``"training"``/``"dataset_params"`` (the
training record and data record; the model list's metadata holds them too,
so ``load(path, pointer="/model")`` is a model file). Epochs are counted as
``loops.state`` says.

Building: :func:`phase_document` (one phase from a :class:`State`),
:func:`extension` (the ``"tensorlist"`` object), :func:`loop_document` (the
whole document). Reading: :func:`read_checkpoint` reads the file once,
through the capped, strict, regular-file-checked ``format.read_json_file``,
and each data file once into private memory; :func:`phase_parts` and
:func:`state_from_phase` take the result apart again.

A **sharded** checkpoint (``checkpoint_format="sharded"``) is a
torch.distributed.checkpoint directory in ``tensorlist.dcp``'s layout whose
state dict holds ``model`` (the module's state), ``optim`` (the optimizer's,
keyed by parameter names, as DCP's ``get_optimizer_state_dict`` gives it),
``min_model`` and ``averaged`` when the run has them, ``loop`` (this
document without its tensors, as JSON text, written by rank 0; its tensor
lists are references ``{"dcp": key}``) and ``rng.<rank>`` (each rank's
generator states, JSON text). The loop state is one JSON text rather than a
nested dict because DCP would store each leaf of a dict as its own entry and
drop empty dicts. This module reads it without torch:
:func:`read_sharded_loop_state` (the JSON only, for resuming) and
:func:`read_checkpoint` on the directory (everything, for inspection).

**Encrypted** checkpoints (``key=``, the loops' ``encryption_key``): every
TensorList of a document is encrypted (its tensors and its metadata: the
model list's records, the optimizer's JSON), and the document's top-level
copy of the records is left out (the model list's sealed copy is the one
read back); the rest of the document (epochs, learning curve, schedule
states) stays readable. A sharded checkpoint's shards are encrypted, the
loop state with them; its ``.metadata.json`` stays plain (``tensorlist.dcp``).

Imports ``format``, ``_storage.datafile``, ``_base.jsonio``, ``writer``, ``dcp`` and ``loops.state``.
"""
from __future__ import annotations

import math
import os
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from tensorlist._storage.datafile import open_consistently
from tensorlist._base.jsonio import array_index, dumps, from_tagged, loads_strict, resolve_pointer, set_at_pointer, to_tagged
from tensorlist.dcp import METADATA_NAME, Checkpoint, Shards, read_full, read_metadata
from tensorlist.format import Limits, find_tensor_lists, parse_list, read_json_file
from tensorlist.writer import Tensors, save_document
from tensorlist.loops.state import State, rng_state

__all__ = [
    "LOOP_STATE_FORMAT", "CHECKPOINT_TYPES", "phase_document", "empty_simple", "extension", "loop_document",
    "write_checkpoint", "read_checkpoint", "phase_parts", "state_from_phase", "SHARDED_KEYS", "dcp_ref",
    "rng_key", "is_sharded_checkpoint", "sharded_checkpoint_exists", "loop_state_text", "rng_text",
    "read_sharded_loop_state",
]

#: Version marker of the loops' extension object (``"tensorlist"`` key of a checkpoint).
LOOP_STATE_FORMAT = "tensorlist.loop-state/1"

#: The checkpoint ``type`` each loop writes and resumes from (lamp's StateIO names).
CHECKPOINT_TYPES = {"epochs": "SimpleLoopState", "swa_epochs": "SWALoopState",
                    "with_swa": "SimpleThenSWALoopState"}

#: A sharded checkpoint's top-level state-dict keys, by what they hold (``rng.<rank>`` besides).
SHARDED_KEYS = {"model": "model", "optimizer": "optim", "min_model": "min_model", "averaged": "averaged",
                "loop": "loop"}


def dcp_ref(what: str) -> dict:
    """The reference a sharded checkpoint's loop state holds in place of a tensor list (``what``: a
    key of :data:`SHARDED_KEYS`)."""
    return {"dcp": SHARDED_KEYS[what]}


def rng_key(rank: int) -> str:
    """The state-dict key of a rank's generator states in a sharded checkpoint."""
    return f"rng.{int(rank)}"


# --------------------------------------------------------------------------
# writing


def _num(value):
    """A loss as JSON: NaN and infinities (not JSON) become null, as in the training record."""
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _opt(doc: dict, key: str, value) -> None:
    value = _num(value)
    if value is not None:
        doc[key] = value


def _is_ref(value) -> bool:
    return isinstance(value, Mapping) and set(value) == {"dcp"}


def _tensor_list(arrays: Mapping, metadata: Optional[dict] = None):
    """A TensorList of ``arrays``, or a sharded checkpoint's :func:`dcp_ref` passed on as it is."""
    return dict(arrays) if _is_ref(arrays) else Tensors(dict(arrays), metadata=metadata)


def phase_document(kind: str, *, model: Mapping, model_meta: Optional[dict], optimizer: Mapping,
                   optimizer_meta: Optional[dict], state: State, min_model: Optional[Mapping] = None,
                   averaged: Optional[Mapping] = None) -> dict:
    """One SimpleLoopState (``kind="simple"``) / SWALoopState (``"swa"``) object without ``type``.

    lamp's keys in lamp's order; ``epoch`` is ``state.epoch`` (the number of
    epochs completed), the learning curve is written newest first. The
    tensors (``model``, ``optimizer``, ``min_model``, ``averaged``) are
    mappings of arrays, or :func:`dcp_ref` references in a sharded
    checkpoint's loop state.
    """
    doc: Dict[str, Any] = {
        "model": _tensor_list(model, model_meta),
        "optimizer": _tensor_list(optimizer, optimizer_meta),
        "epoch": int(state.epoch),
    }
    _opt(doc, "lastValidationLoss", state.last_validation_loss)
    _opt(doc, "minValidationLoss", state.min_validation_loss)
    if kind == "simple":
        if min_model is not None:
            doc["minValidationLossModel"] = [int(state.min_validation_epoch), _tensor_list(min_model)]
        curve = [[e, _num(t), _num(s), _num(r)] for e, t, s, r in reversed(state.learning_curve)]
    else:
        doc["numberOfAveragedModels"] = int(state.number_of_averaged_models)
        if averaged is not None:
            doc["averagedModels"] = _tensor_list(averaged)
        curve = [[e, _num(t), _num(v)] for e, t, v in reversed(state.learning_curve)]
    if curve:
        doc["learningCurve"] = curve
    return doc


def empty_simple(state: State, *, sharded: bool = False) -> dict:
    """The ``simple`` part of a SimpleThenSWALoopState during the SWA phase (lamp: empty lists).

    ``sharded``: for a sharded checkpoint's loop state, where an empty list is
    an empty JSON object.
    """
    doc = phase_document("simple", model={}, model_meta=None, optimizer={}, optimizer_meta=None, state=state)
    if sharded:
        doc.update(model={}, optimizer={})
    return doc


def extension(*, phase: str, state: State, base_lrs: List[float], lr_scheduler_state,
              simple_schedule_state=None, swa_schedule_state=None, world_size: Optional[int] = None) -> dict:
    """The ``"tensorlist"`` object: what an exact resume needs beyond lamp's keys (RNG states taken now).

    With ``world_size`` (a sharded checkpoint's loop state) the RNG states are
    left out (each rank stores its own, :func:`rng_key`) and ``checkpointFormat``
    and ``worldSize`` say so.
    """
    ext: Dict[str, Any] = {"format": LOOP_STATE_FORMAT}
    if world_size is not None:
        ext.update(checkpointFormat="sharded", worldSize=int(world_size))
    ext.update({
        "phase": phase,
        "iteration": state.iteration,
        "baseLearningRates": list(base_lrs),
        "scheduleState": to_tagged(simple_schedule_state, "schedule state"),
        "swaScheduleState": to_tagged(swa_schedule_state, "swa schedule state"),
        "lrScheduler": None if lr_scheduler_state is None else to_tagged(lr_scheduler_state, "lr scheduler"),
    })
    if world_size is None:
        tensors, meta = rng_state()
        ext.update(rng=meta, rngTensors=Tensors(tensors))
    return ext


def loop_document(loop_type: str, *, simple: Optional[dict], swa: Optional[dict], ext: dict,
                  record: Mapping) -> dict:
    """The whole checkpoint of type ``loop_type`` from its phase objects (the inverse of :func:`phase_parts`).

    Args:
        loop_type: a value of :data:`CHECKPOINT_TYPES`.
        simple, swa: the phase objects (:func:`phase_document`); the one a
            type does not hold is ignored, and a SimpleThenSWALoopState
            leaves ``swa`` out while it is None (the warm-up).
        ext: the :func:`extension` object.
        record: ``{"training", "dataset_params"}``, the records also held by
            the model list's metadata.
    """
    doc: Dict[str, Any] = {"type": loop_type}
    if loop_type == "SimpleLoopState":
        doc.update(simple)
    elif loop_type == "SWALoopState":
        doc.update(swa)
    else:
        doc["simple"] = simple
        if swa is not None:
            doc["swa"] = swa
    doc["tensorlist"] = ext
    doc["training"] = record["training"]
    doc["dataset_params"] = record["dataset_params"]
    return doc


def write_checkpoint(path, document: Mapping, *, key=None) -> None:
    """Writes ``document`` to ``path`` atomically (``save_document``: one data file for all its lists).

    With ``key`` every list is encrypted and the top-level ``training``/``dataset_params`` are left out: the
    model list's metadata, sealed, holds the same records.
    """
    if key is not None:
        document = {k: v for k, v in document.items() if k not in ("training", "dataset_params")}
    save_document(path, document, key=key)


def loop_state_text(document: Mapping) -> str:
    """A sharded checkpoint's ``loop`` entry: the loop document (tensors as :func:`dcp_ref`) as JSON text."""
    return dumps(document)


def rng_text(state: Mapping) -> str:
    """A rank's ``rng.<rank>`` entry: ``loops.state.rng_state_json()`` as JSON text."""
    return dumps(state)


# --------------------------------------------------------------------------
# reading


def _check_type(doc: Any, path: str) -> None:
    if not isinstance(doc, dict) or doc.get("type") not in CHECKPOINT_TYPES.values():
        raise ValueError(f"{path}: not a loop checkpoint (no SimpleLoopState/SWALoopState/"
                         f"SimpleThenSWALoopState 'type')")


def phase_parts(doc: Mapping) -> Tuple[Optional[Mapping], Optional[Mapping]]:
    """The (simple, swa) phase objects of a checkpoint; None for a phase it does not hold (yet)."""
    if doc["type"] == "SimpleLoopState":
        return doc, None
    if doc["type"] == "SWALoopState":
        return None, doc
    return doc["simple"], doc.get("swa")


def _keep_list_metadata(doc: Mapping) -> None:
    """Copies each phase's model and optimizer list metadata next to the lists, before they become arrays."""
    for phase in phase_parts(doc):
        if isinstance(phase, dict) and isinstance(phase.get("optimizer"), dict):
            phase["optimizerMetadata"] = phase["optimizer"].get("metadata")
            phase["modelMetadata"] = phase["model"].get("metadata")


def read_checkpoint(path, *, key=None) -> dict:
    """Reads a loop checkpoint: the document with every TensorList replaced by its arrays.

    The file is read once (strictly, under the descriptor size cap, refusing
    anything but a regular file) and each data file once; a checkpoint that is
    being replaced meanwhile is read again, as ``load_document`` does. The
    arrays are in private, writable memory (the optimizer updates its state in
    place). Each phase's optimizer and model list metadata are kept under
    ``"optimizerMetadata"`` and ``"modelMetadata"`` next to its lists.

    A directory is read as a sharded checkpoint, for inspection: the loop
    state with each tensor reference replaced by the arrays it names, whole
    (assembled from every rank's shards with numpy, ``dcp.read_full``):
    ``model`` and ``minValidationLossModel``/``averagedModels`` by parameter
    name, ``optimizer`` by DCP's flattened names (``state.<param name>.<key>``,
    ``param_groups.<i>.<key>``, values included), and the ranks' generator
    states as ``tensorlist.rngByRank``.

    ``key`` opens an encrypted checkpoint: each list is unlocked with it
    (its metadata decrypted in place in the document) before it is read.

    Raises:
        FileNotFoundError: no such checkpoint.
        EncryptionError: an encrypted checkpoint without its key or with another (naming the file).
        FormatError: the file is not a valid tensorlist document (or the
            directory not a valid DCP checkpoint of ``tensorlist.dcp``).
        ValueError: the document is not a loop checkpoint.
    """
    path = os.fspath(path)
    if is_sharded_checkpoint(path):
        return _read_sharded(path, key)
    base = os.path.dirname(os.path.abspath(path))
    limits = Limits()
    read: Dict[str, Any] = {}

    def descriptors():
        doc = read["doc"] = read_json_file(path, limits)
        _check_type(doc, path)  # before any data file is opened
        return [parse_list(resolve_pointer(doc, ptr), file=path, pointer=ptr, base_dir=base, limits=limits)
                for ptr in find_tensor_lists(doc)]

    try:
        descs, datas, shared = open_consistently(descriptors, False, file=path)
    except FileNotFoundError as e:  # only the document itself: open_consistently handles its data files
        raise FileNotFoundError(f"checkpoint {path!r} does not exist") from e
    doc = read["doc"]
    try:
        for desc, data in zip(descs, datas):  # as reader.load_document: a wrong key before any tensor is read
            meta = data.unlock(key)
            if data.opener is not None:
                resolve_pointer(doc, desc.pointer)["metadata"] = meta
        _keep_list_metadata(doc)
        for desc, data in zip(descs, datas):
            doc = set_at_pointer(doc, desc.pointer, data.read_all())
    finally:
        for f in shared.values():
            f.close()
    _untag_extension(doc, path)
    return doc


def is_sharded_checkpoint(path) -> bool:
    """Whether ``path`` names a sharded checkpoint (a directory) rather than a checkpoint document."""
    return os.path.isdir(path)


def sharded_checkpoint_exists(path) -> bool:
    """Whether the directory ``path`` holds a committed sharded checkpoint (its DCP metadata file)."""
    return os.path.isfile(os.path.join(path, METADATA_NAME))


def _text_entry(ckpt: Checkpoint, shards: Shards, key: str) -> Any:
    entry = ckpt.storage.get((key, None))
    if entry is None:
        return None
    text = shards.value(entry)
    file = os.path.join(ckpt.path, entry.file)
    if not isinstance(text, str):
        raise ValueError(f"{file}: the sharded checkpoint's {key!r} entry is not JSON text")
    return loads_strict(text, file=f"{file} ({key})")


def _untag_extension(doc: Mapping, file: str) -> None:
    ext = doc.get("tensorlist")
    if isinstance(ext, dict):
        for key in ("lrScheduler", "scheduleState", "swaScheduleState"):
            if ext.get(key) is not None:
                ext[key] = from_tagged(ext[key], file=file, where=f"tensorlist.{key}")


def read_sharded_loop_state(path, *, ranks: Optional[Sequence[int]] = None, key=None) -> Tuple[dict, Checkpoint]:
    """The loop state of the sharded checkpoint in directory ``path``, without its tensors, and its DCP metadata.

    Reads the metadata (checked as ``tensorlist.dcp`` checks it), the
    ``loop`` entry and the ``rng.<rank>`` entries of ``ranks`` (default:
    every rank that saved one); the tensors stay in their shards (``{"dcp":
    key}`` references in the document). The generator states come back as
    ``doc["tensorlist"]["rngByRank"]``: ``{rank: state}``, for the ranks asked
    that have one. ``key`` opens encrypted shards.

    Raises:
        FileNotFoundError: no committed checkpoint in ``path``.
        FormatError: the metadata, a shard or a JSON entry breaks a rule.
        ValueError: not a loop checkpoint.
    """
    path = os.fspath(path)
    ckpt = read_metadata(path)
    loop_key = SHARDED_KEYS["loop"]
    if (loop_key, None) not in ckpt.storage:
        raise ValueError(f"{path}: a DCP checkpoint without a {loop_key!r} entry is not a loop checkpoint")
    with Shards(path, mmap=False, key=key) as shards:
        doc = _text_entry(ckpt, shards, loop_key)
        _check_type(doc, path)
        saved = sorted(i for i in (array_index(k[4:]) for k in ckpt.bytes_keys if k.startswith("rng."))
                       if i is not None)
        wanted = saved if ranks is None else sorted(set(ranks) & set(saved))
        rng = {r: _text_entry(ckpt, shards, rng_key(r)) for r in wanted}
    _untag_extension(doc, path)
    if isinstance(doc.get("tensorlist"), dict):
        doc["tensorlist"]["rngByRank"] = rng
    return doc, ckpt


def _read_sharded(path: str, key=None) -> dict:
    """A sharded checkpoint read whole: its loop state with each reference replaced by the arrays it names."""
    doc, _ = read_sharded_loop_state(path, key=key)
    values = read_full(path, key=key)
    parts: Dict[str, Dict[str, Any]] = {}
    for key in SHARDED_KEYS.values():
        prefix = key + "."
        parts[key] = {k[len(prefix):]: v for k, v in values.items() if k.startswith(prefix)}

    def fill(obj):
        if _is_ref(obj):
            return parts.get(obj["dcp"], {})
        if isinstance(obj, dict):
            return {k: fill(v) for k, v in obj.items()}
        if isinstance(obj, list):
            return [fill(v) for v in obj]
        return obj

    ext = doc.pop("tensorlist", None)
    doc = fill(doc)
    if ext is not None:
        doc["tensorlist"] = ext
    return doc


def state_from_phase(doc: Mapping, kind: str) -> State:
    """A :class:`State` from a loaded phase object (its tensors are not touched)."""
    s = State(phase=kind, epoch=int(doc["epoch"]))
    s.last_validation_loss = doc.get("lastValidationLoss")
    s.min_validation_loss = doc.get("minValidationLoss")
    curve = [tuple(e) for e in reversed(doc.get("learningCurve", []))]
    s.learning_curve = curve
    if kind == "simple":
        mvm = doc.get("minValidationLossModel")
        s.min_validation_epoch = int(mvm[0]) if mvm is not None else None
        if curve:
            s.training_loss, s.validation_loss, s.raw_validation_loss = curve[-1][1], curve[-1][2], curve[-1][3]
    else:
        s.number_of_averaged_models = int(doc.get("numberOfAveragedModels", 0))
        if curve:
            s.training_loss, s.validation_loss = curve[-1][1], curve[-1][2]
            s.raw_validation_loss = s.validation_loss
    return s
