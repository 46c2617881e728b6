"""The files both Hugging Face integrations write and read (``tensorlist.huggingface``), without pickles.

Small states (a scheduler's, a sampler's, a scaler's, the RNG states) as
tensorlist files whose metadata holds the state as tagged JSON
(:func:`save_state_file`, :func:`read_state_file`, :func:`save_rng`,
:func:`load_rng`; ``key=`` encrypts, and opens, each); the refusal of a directory holding a stock checkpoint's
pickles (:func:`refuse_pickles`); the export of a model file for
``from_pretrained`` (:func:`export_pretrained`); the file names of a
``checkpoint-N`` and the newest complete one (:func:`last_checkpoint`).
``tensorlist.huggingface`` re-exports the public ones.

Imports torch (through ``torch``, the adapters), ``loops.state``, ``_base.states``,
``reader``, ``writer``, ``format``, ``_storage.commit``, ``_base.jsonio`` and ``errors``;
safetensors lazily.
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, Optional

from tensorlist import reader, writer
from tensorlist._storage.commit import atomic_file
from tensorlist._base.jsonio import dumps, from_tagged, to_tagged
from tensorlist._base.states import check_like, check_rng_state
from tensorlist.errors import FormatError
from tensorlist.format import Limits, confine, read_json_file, read_regular
from tensorlist.loops.state import rng_state, set_rng_state
from tensorlist.torch import load_state as load_tensors

#: Version marker of the small state files (scheduler, sampler, scaler, RNG, custom objects).
STATE_FORMAT = "tensorlist.hf-state/1"

#: File names the stock savers write with pickle (torch.save): a directory holding one is refused.
PICKLE_NAME = re.compile(r"\.(bin|pkl|pt|pth)\Z")

#: The Trainer's descriptor names inside ``checkpoint-N/``.
MODEL_FILE, OPTIMIZER_FILE, SCHEDULER_FILE, SCALER_FILE = "model.json", "optimizer.json", "scheduler.json", "scaler.json"
TRAINING_ARGS_FILE = "training_args.json"

#: How a stock Trainer checkpoint is converted (named by the refusal of its pickles).
TRAINER_HOW = ("convert it once, only if you trust it: `TensorListTrainer(...).convert_stock_checkpoint(dir, "
               "new_dir)` (reads the pickles with torch.load(weights_only=True), as the stock Trainer does), then "
               "resume from new_dir")


def refuse_pickles(directory, *, how: str = TRAINER_HOW) -> None:
    """Raises FormatError when ``directory`` holds a pickle file of a stock checkpoint (never opened).

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp(); open(os.path.join(d, "optimizer.pt"), "wb").close()
        >>> refuse_pickles(d, how="convert it")
        Traceback (most recent call last):
        ...
        tensorlist.errors.FormatError: ...: holds pickle files ['optimizer.pt'] (a stock checkpoint); ...
    """
    directory = os.fspath(directory)
    found = sorted(n for n in os.listdir(directory) if PICKLE_NAME.search(n))
    if found:
        raise FormatError(f"holds pickle files {found} (a stock checkpoint); tensorlist never unpickles: {how}",
                          file=directory)


_TRAINER_CHECKPOINT = re.compile(r"checkpoint-([0-9]{1,18})\Z")


def last_checkpoint(output_dir) -> Optional[str]:
    """The newest complete ``checkpoint-N`` in ``output_dir`` (what ``resume_from_checkpoint=True`` takes).

    Complete: its ``trainer_state.json``, which the Trainer writes last,
    parses, and its ``model.json`` exists; a checkpoint whose save was cut
    short is passed over (the stock ``get_last_checkpoint`` takes it).
    """
    output_dir = os.fspath(output_dir)
    found = []
    for name in os.listdir(output_dir):
        m = _TRAINER_CHECKPOINT.match(name)
        if m and os.path.isdir(os.path.join(output_dir, name)):
            found.append((int(m.group(1)), name))
    for _, name in sorted(found, reverse=True):
        path = os.path.join(output_dir, name)
        try:
            read_json_file(confine(path, "trainer_state.json"), Limits())
        except (OSError, FormatError):
            continue
        if os.path.isfile(os.path.join(path, MODEL_FILE)):
            return path
    return None


def save_state_file(path, kind: str, state: Any, *, tensors: Optional[Mapping] = None, key=None,
                    **metadata) -> None:
    """Saves a state of plain values (a scheduler's, a sampler's, a scaler's) as a tensorlist file.

    The state goes into the metadata as tagged JSON (tuples, non-finite
    floats and non-str keys kept); a tensor in it is refused (TypeError,
    naming where): pass the tensors a state needs (a generator's state) as
    ``tensors``, a name -> tensor mapping saved as the file's TensorList.
    ``key`` encrypts the file, the state with it (the reads need the key).

    Example:
        >>> import tempfile, os
        >>> p = os.path.join(tempfile.mkdtemp(), "scheduler.json")
        >>> save_state_file(p, "scheduler", {"last_epoch": 3, "base_lrs": [0.1]})
        >>> read_state_file(p, "scheduler")
        {'last_epoch': 3, 'base_lrs': [0.1]}
    """
    meta = {"format": STATE_FORMAT, "kind": kind, "state": to_tagged(state, kind), **metadata}
    writer.save(path, dict(tensors or {}), metadata=meta, key=key)


def _state_metadata(path, kind: str, key=None) -> Mapping:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no {kind} state (was the checkpoint saved with the same objects?)")
    with reader.Reader(path, key=key) as r:
        r.require_key()  # an encrypted file's metadata reads as None until its key opens it
        meta = r.metadata
    if not isinstance(meta, Mapping) or meta.get("format") != STATE_FORMAT:
        raise FormatError(f"not a {STATE_FORMAT!r} file", file=path, field="metadata.format")
    if meta.get("kind") != kind:
        raise FormatError(f"holds a {meta.get('kind')!r} state, expected {kind!r}", file=path, field="metadata.kind")
    if "state" not in meta:
        raise FormatError("no state", file=path, field="metadata.state")
    return meta


def read_state_file(path, kind: str, *, with_tensors: bool = False, like: Any = None, key=None) -> Any:
    """The state :func:`save_state_file` wrote (FormatError naming the file when it is another kind).

    With ``with_tensors``: ``(state, tensors)``, the tensors as torch tensors
    in private memory. With ``like`` (the live object's ``state_dict()``):
    a state of other keys or JSON types is a FormatError naming the field.
    """
    state = from_tagged(_state_metadata(path, kind, key)["state"], file=os.fspath(path), where="metadata.state")
    if like is not None:
        check_like(state, like, file=os.fspath(path), field="metadata.state")
    if not with_tensors:
        return state
    return state, load_tensors(path, mmap=False, key=key)


def save_rng(path, *, key=None, **extra) -> None:
    tensors, meta = rng_state()
    writer.save(path, tensors, metadata={"format": STATE_FORMAT, "kind": "rng", "state": meta, **extra}, key=key)


def load_rng(path, *, restore: bool = True, key=None) -> tuple:
    """(the file's metadata, the checked states); the generators take them unless ``restore`` is False."""
    meta = _state_metadata(path, "rng", key)
    states = check_rng_state(reader.load(os.fspath(path), key=key), meta["state"], file=os.fspath(path),
                             field="metadata.state", tensors_field="tensors")
    if restore:
        set_rng_state(*states)
    return meta, states


def plain(obj):
    """The torch object an accelerate wrapper (AcceleratedOptimizer, AcceleratedScheduler) holds."""
    for attr in ("optimizer", "scheduler"):
        inner = getattr(obj, attr, None)
        if inner is not None and type(obj).__module__.startswith("accelerate"):
            return inner
    return obj


def export_pretrained(checkpoint, output_dir, *, model_file: str = MODEL_FILE, key=None) -> str:
    """Writes ``model.safetensors`` and ``config.json`` for ``from_pretrained`` from a tensorlist model file.

    Args:
        checkpoint: a directory holding ``model.json`` (and ``config.json``,
            copied with ``generation_config.json`` when present), or the model
            file itself.
        output_dir: where to write (made if needed); may be the checkpoint.
        model_file: the descriptor's name inside a directory.
        key: the key of an encrypted model file. ``model.safetensors`` is
            plaintext: this decrypts the weights (and the record) into it.

    Returns:
        The path of the ``model.safetensors`` written. Its metadata holds
        ``format: pt`` and the training record as JSON text under
        ``tensorlist.training`` when the file has one.
    """
    from safetensors.torch import save_file

    checkpoint = os.fspath(checkpoint)
    source = confine(checkpoint, model_file) if os.path.isdir(checkpoint) else checkpoint
    os.makedirs(output_dir, exist_ok=True)
    # clones: safetensors refuses tensors sharing storage, and every tensor of a mapped file does
    weights = {k: v.clone() for k, v in load_tensors(source, key=key).items()}
    meta = {"format": "pt"}
    with reader.Reader(source, key=key) as r:
        training = r.metadata.get("training") if isinstance(r.metadata, Mapping) else None
    if training is not None:
        meta["tensorlist.training"] = dumps(training)
    out = os.path.join(output_dir, "model.safetensors")
    with atomic_file(out) as tmp:
        save_file(weights, tmp, metadata=meta)
    here = os.path.dirname(source)
    for name in ("config.json", "generation_config.json"):
        src, dst = confine(here, name), os.path.join(output_dir, name)
        if os.path.lexists(src) and os.path.abspath(src) != os.path.abspath(dst):
            text = read_regular(src, Limits().max_descriptor_bytes, what=name)
            with atomic_file(dst) as tmp, open(tmp, "wb") as f:
                f.write(text)
    return out
