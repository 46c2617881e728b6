"""PyTorch Lightning: checkpoints as tensorlist documents, sharded checkpoints through ``tensorlist.dcp``, records.

Three pieces, each for ``lightning.pytorch.Trainer``:

- :class:`TensorListCheckpointIO` (``Trainer(plugins=[TensorListCheckpointIO()])``,
  composable with ``AsyncCheckpointIO``) writes Lightning's checkpoint dict as
  one tensorlist document, atomically (``tensorlist.save_document``: a crash
  mid-save leaves the previous checkpoint). The document's layout:

  - a dict whose values are all tensors (``state_dict``, each parameter's
    optimizer state) is a TensorList in place; ``state_dict``'s list carries
    ``{"training", "dataset_params"}`` in its metadata when the checkpoint has
    a record, so ``tensorlist.load(path, pointer="/state_dict")`` is a model file;
  - any other tensor is ``{"__tensor__": <TensorList of one tensor>}``, a
    numpy array ``{"__ndarray__": ...}``, raw ``bytes`` ``{"__bytes__": ...}``
    (uint8, no pickle);
  - everything else is tagged JSON (``_base.jsonio.to_tagged``: tuples, non-finite
    floats and non-str keys come back as they were);
  - a value JSON cannot hold (a ``Path``, a ``torch.dtype``, an object) is
    refused naming its key, unless the plugin was made with ``encode=`` (a
    function turning it into JSON, one way: ``encode=str``) or
    ``allow_pickle=True`` (``{"__pickle__": ...}``, loaded only by a plugin
    that also allows pickle).

  Each checkpoint of Lightning's holds a training record (``"training"``,
  ``"dataset_params"``): the one it carries, else one made from the dict
  itself (``lightning.record.with_record``), so provenance needs no callback.
  A stock Lightning ``.ckpt`` (a torch pickle) given to ``load_checkpoint`` is
  refused, never unpickled; :func:`convert_checkpoint` converts one you trust.
  A removal wins over a pending save of its path (``_pending.PendingSaves``):
  under ``AsyncCheckpointIO``, ``ModelCheckpoint``'s top-k removal of a
  checkpoint still being written, or queued, leaves nothing behind.
- :class:`TensorListModelParallelStrategy` (and :class:`TensorListFSDPStrategy`)
  send the sharded save through ``TensorListWriter``/``TensorListReader``
  and write rank 0's non-tensor state as a JSON document (the same layout)
  in place of the pickled ``meta.pt``: ``meta.<token>.json``, named by the
  save's DCP entry ``tensorlist_meta`` (so a killed save never pairs shards
  with another save's state), and its copy ``meta.json`` for readers.
- :class:`TrainingRecordCallback` fills a fuller training record (optimizer,
  parameter groups, schedule, seed from ``PL_GLOBAL_SEED``, initial weights'
  hash, epochs, per-epoch losses) and puts it into every checkpoint:
  ``tensorlist record epoch=1-step=8.ckpt`` reads it.

Imports lightning, torch, ``tensorlist.dcp`` (TensorListWriter/Reader),
``tensorlist.provenance.record``, ``tensorlist.provenance.signing``, ``lightning.record``, ``reader``, ``writer``, ``format``,
``_base.jsonio``, ``_bridges.torch``, ``errors`` and ``_pending``; nothing imports it.

Example:
    >>> import os, tempfile, torch
    >>> io = TensorListCheckpointIO()
    >>> path = os.path.join(tempfile.mkdtemp(), "epoch=0.ckpt")
    >>> io.save_checkpoint({"epoch": 0, "state_dict": {"w": torch.ones(2)}, "betas": (0.9, 0.99)}, path)
    >>> ckpt = io.load_checkpoint(path)
    >>> ckpt["betas"], ckpt["state_dict"]["w"].tolist()
    ((0.9, 0.99), [1.0, 1.0])
"""
from __future__ import annotations

import os
import re
import shutil
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional

import numpy as np
import torch
from lightning.fabric.plugins import CheckpointIO
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.plugins.io import AsyncCheckpointIO
from lightning.pytorch.strategies import FSDPStrategy, ModelParallelStrategy

from tensorlist import reader, writer
from tensorlist._base.states import check_lightning_states
from tensorlist.dcp import TensorListReader, TensorListWriter
from tensorlist.crypto import Key, as_key
from tensorlist.errors import FormatError, short_repr
from tensorlist._storage.commit import new_token, own_data_files, sweep_unowned
from tensorlist.format import confine, open_regular
from tensorlist.provenance.record import (TrainingRecorder, anchor_paths, read_training_record, validate_dataset_params,
                                          weights_sha256)
from tensorlist.provenance.signing import signature_files, signed_save
from tensorlist.lightning._document import (BYTES_TAG, NDARRAY_TAG, PICKLE_TAG, TENSOR_TAG,  # noqa: F401
                                            decode_checkpoint, encode_checkpoint, open_sealed, seal_document)
from tensorlist.lightning._pending import PendingSaves
from tensorlist.lightning.record import SOLVER, global_seed, loss_value, whole_module, with_record

__all__ = [
    "TensorListCheckpointIO", "TensorListModelParallelStrategy", "TensorListFSDPStrategy",
    "TrainingRecordCallback", "convert_checkpoint", "load_from_checkpoint", "TensorListAsyncCheckpointIO", "encode_checkpoint", "decode_checkpoint", "META_NAME", "META_KEY",
]

#: The JSON document a sharded checkpoint directory holds in place of Lightning's pickled ``meta.pt``.
META_NAME = "meta.json"
#: One save's meta document (``token``: ``_storage.commit.new_token``), named by the DCP entry :data:`META_KEY`.
META_PATTERN = "meta.{token}.json"
_META_RE = re.compile(r"meta\.[0-9a-f]{8}\.json")
#: The DCP state-dict entry of a sharded save naming its meta document.
META_KEY = "tensorlist_meta"
#: Lightning's pickled metadata file, refused on load.
PICKLED_META_NAME = "meta.pt"
#: How a torch file starts: a zip archive (torch >= 1.6) or a pickle (protocol 2+).
_TORCH_MAGICS = (b"PK\x03\x04", b"\x80")
_SNIFF_BYTES = 64

_CONVERT_HINT = ("convert it once, from a file you trust, with tensorlist.lightning.convert_checkpoint(src, dst) "
                 "(torch.load(weights_only=True), then written as a tensorlist checkpoint that resumes), or "
                 "`tensorlist convert SRC model.tl` for its tensors only")


def _refuse_pickle(path: str) -> None:
    """A torch file (zip or pickle) is refused, never unpickled."""
    with os.fdopen(open_regular(path, what="checkpoint"), "rb") as f:
        head = f.read(_SNIFF_BYTES)
    if head.startswith(_TORCH_MAGICS):
        raise FormatError("is a stock Lightning checkpoint (a torch pickle), which tensorlist does not unpickle: "
                          + _CONVERT_HINT, file=path)


def _save_document(path, checkpoint, allow_pickle, encode, key=None, where="checkpoint") -> None:
    """Writes a checkpoint (with ``key``, encrypted: ``_document.seal_document``); one of Lightning's gets its
    record made from it when it holds none."""
    doc = encode_checkpoint(with_record(checkpoint), allow_pickle=allow_pickle, encode=encode, where=where)
    if isinstance(doc.get("training"), dict):  # in place: /state_dict's metadata holds the same record
        doc["training"].update(anchor_paths(doc["training"], os.path.dirname(os.fspath(path))))
    if isinstance(doc.get("state_dict"), writer.Tensors) and isinstance(doc.get("training"), dict):
        record = doc["training"]
        if isinstance(record.get("weights"), dict) and record["weights"].get("sha256") is None:
            record["weights"] = dict(record["weights"], sha256=weights_sha256(doc["state_dict"].tensors))
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    writer.save_document(path, doc if key is None else seal_document(doc), key=key)


def _load_document(path, map_location, allow_pickle, key=None) -> dict:
    path = os.fspath(path)
    if not os.path.exists(path):
        raise FileNotFoundError(f"Checkpoint file not found: {path}")
    _refuse_pickle(path)
    doc = reader.load_document(path, mmap=False, key=key)  # private memory: training updates tensors in place
    doc = open_sealed(doc, key, path)
    if not isinstance(doc, dict):
        raise FormatError("is not a Lightning checkpoint (not a JSON object)", file=path)
    return check_lightning_states(decode_checkpoint(doc, map_location=map_location, allow_pickle=allow_pickle,
                                                    file=path), file=path)


def _unlink(path: str) -> None:
    """Unlinks ``path``; gone already is fine (the save's sweep of unowned data files may take it first)."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class TensorListCheckpointIO(CheckpointIO):
    """A Lightning ``CheckpointIO`` writing checkpoints as tensorlist documents (no pickle).

    Args:
        allow_pickle: store values JSON cannot hold as pickles, and load them
            (only for checkpoints you trust). Off by default: such a value is
            refused when saving, naming its key.
        encode: a function turning a value JSON cannot hold into JSON (one
            way: it comes back as that JSON), e.g. ``encode=str`` for paths.
        signing_key: an EC private key signing each checkpoint (docs/PROVENANCE.md).
        encryption_key: a ``tensorlist.Key`` (or 32 bytes) encrypting each
            checkpoint, its JSON included (``_document.seal_document``); the
            loads need it (``EncryptionError`` naming the file otherwise).

    Example:
        >>> import os, tempfile, pathlib, torch
        >>> path = os.path.join(tempfile.mkdtemp(), "c.ckpt")
        >>> TensorListCheckpointIO().save_checkpoint({"dir": pathlib.Path("runs")}, path)
        Traceback (most recent call last):
        TypeError: checkpoint.dir: a PosixPath cannot be stored as JSON ...
        >>> TensorListCheckpointIO(encode=str).save_checkpoint({"dir": pathlib.Path("runs")}, path)
        >>> TensorListCheckpointIO().load_checkpoint(path)
        {'dir': 'runs'}
    """

    def __init__(self, *, allow_pickle: bool = False, encode: Optional[Callable[[Any], Any]] = None,
                 signing_key=None, encryption_key=None) -> None:
        super().__init__()
        self.allow_pickle = allow_pickle
        self.encode = encode
        self.encryption_key = as_key(encryption_key)
        self.signing_key = signing_key  # each checkpoint signed: PATH.sig, PATH.provenance.json (PROVENANCE.md)
        self._pending = PendingSaves()  # the saves under way, which a removal of their path must win over

    def save_checkpoint(self, checkpoint: Dict[str, Any], path, storage_options: Optional[Any] = None) -> None:
        """Writes ``checkpoint`` to ``path`` atomically (the descriptor at ``path``, its data file beside it).

        Raises:
            TypeError: ``storage_options`` given, or a value JSON cannot hold (naming its key).
        """
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = os.fspath(path)

        def write() -> None:
            with signed_save(path, self.signing_key):
                _save_document(path, checkpoint, self.allow_pickle, self.encode, self.encryption_key)

        self._pending.save(path, write, self._remove_files)  # a removal requested meanwhile wins
        self._dirs = getattr(self, "_dirs", set()) | {os.path.dirname(os.path.abspath(path))}
        self.teardown()

    def teardown(self) -> None:
        """Removes the data files of checkpoints Lightning deleted itself (``save_last="link"``'s ``os.remove``)."""
        for d in getattr(self, "_dirs", ()):
            sweep_unowned(d)

    def load_checkpoint(self, path, map_location: Optional[Any] = None,
                        weights_only: Optional[bool] = None) -> Dict[str, Any]:
        """The checkpoint dict written by :meth:`save_checkpoint`, its tensors on ``map_location``.

        ``weights_only`` is accepted for Lightning's signature: nothing here
        unpickles unless the plugin was made with ``allow_pickle=True``.

        Raises:
            FileNotFoundError: no checkpoint at ``path``.
            FormatError: a stock (pickle) checkpoint, or a truncated or lying
                one (naming the file).
        """
        return _load_document(path, map_location, self.allow_pickle, self.encryption_key)

    def remove_checkpoint(self, path) -> None:
        """Removes the checkpoint: its descriptor first (at once, by one unlink), then its data file.

        A symbolic link (``ModelCheckpoint(save_last="link")``'s ``last.ckpt``)
        is removed alone: the checkpoint it points to keeps its files. A
        sharded checkpoint's directory loses its meta documents first (it no
        longer loads), then the rest.

        The removal wins over a save of ``path`` still pending on another
        thread (``AsyncCheckpointIO(TensorListCheckpointIO())``'s worker):
        a running save removes what it wrote when it ends, and a queued one
        is skipped (``tensorlist.lightning._pending``: the rules).
        """
        self._pending.remove(os.fspath(path), self._remove_files)

    def _remove_files(self, path: str) -> None:
        """The removal itself (:meth:`remove_checkpoint`); a file another remover took first is not an error."""
        if os.path.islink(path):
            _unlink(path)
            return
        for name in signature_files(path):  # its signature goes with it
            _unlink(name)
        if os.path.isdir(path):  # a sharded checkpoint: its meta documents first
            for name in sorted(os.listdir(path)):
                if name == META_NAME or _META_RE.fullmatch(name):
                    self._remove_files(os.path.join(path, name))
            shutil.rmtree(path)
            return
        if not os.path.lexists(path):
            return
        data = own_data_files(path)
        _unlink(path)
        for name in data:
            if os.path.isfile(name):
                _unlink(name)


class TensorListAsyncCheckpointIO(AsyncCheckpointIO):
    """``AsyncCheckpointIO`` whose removals wait for the saves queued before them, whatever the wrapped IO.

    Lightning's ``AsyncCheckpointIO`` saves on a worker thread but removes on
    the caller's: ``ModelCheckpoint``'s top-k removal of a checkpoint whose save
    is still queued finds nothing, and the save then writes a checkpoint that
    stays. :class:`TensorListCheckpointIO` orders its own saves and removals
    (so ``AsyncCheckpointIO(TensorListCheckpointIO())`` is right as it is);
    this wrapper gives the same order to any ``CheckpointIO`` (Lightning's
    ``TorchCheckpointIO`` included) by queueing a removal behind the saves
    (same thread, in order), its error raised like a save's.
    """

    def remove_checkpoint(self, *args: Any, **kwargs: Any) -> None:
        self._ensure_setup()

        def remove() -> None:
            try:
                super(TensorListAsyncCheckpointIO, self).remove_checkpoint(*args, **kwargs)
            except BaseException as ex:  # as AsyncCheckpointIO keeps a save's, raised at the next call
                self._error = ex

        self._executor.submit(remove)  # type: ignore[union-attr]
        if self._error:
            raise self._error


# --------------------------------------------------------------------------
# sharded checkpoints


def _sharded_state(checkpoint: Dict[str, Any], model_key: str) -> Dict[str, Any]:
    state = {model_key: checkpoint.pop("state_dict")}
    state.update({f"optimizer_{i}": s for i, s in enumerate(checkpoint.pop("optimizer_states", []))})
    return state


class _TensorListSharded(ABC):
    """The sharded save and load both strategies share (mixed in before the Lightning strategy).

    Takes the strategy's own arguments, plus ``allow_pickle`` and ``encode``
    (as :class:`TensorListCheckpointIO`'s) and ``signing_key``: each sharded
    checkpoint directory is signed by rank 0 once its save is complete,
    ``model.sig`` and ``model.provenance.json`` inside it
    (``tensorlist.provenance.signing.signed_save``; a full-state save is the checkpoint
    IO's to sign), and ``encryption_key``: the shards (``tensorlist.dcp``'s
    ``encryption_key``) and the meta documents are encrypted with it.
    """

    _model_key = "state_dict"

    def __init__(self, *args, allow_pickle: bool = False, encode=None, signing_key=None, encryption_key=None,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.allow_pickle, self.encode, self.signing_key = allow_pickle, encode, signing_key
        self.encryption_key = as_key(encryption_key)

    def _dcp(self, cls, path):
        """A ``TensorListWriter``/``TensorListReader`` of ``path``, with this strategy's key."""
        return cls(path) if self.encryption_key is None else cls(path, encryption_key=self.encryption_key)

    @abstractmethod
    def _is_sharded_save(self) -> bool:
        """Whether this save is sharded (DCP through TensorListWriter) rather than one full file."""

    def save_checkpoint(self, checkpoint: Dict[str, Any], filepath, storage_options: Optional[Any] = None) -> None:
        if not self._is_sharded_save():
            return super().save_checkpoint(checkpoint, filepath, storage_options)  # type: ignore[misc]
        if storage_options is not None:
            raise TypeError(f"{type(self).__name__} takes no storage_options")
        path = Path(self.broadcast(filepath))  # type: ignore[attr-defined]
        rank0 = self.global_rank == 0  # type: ignore[attr-defined]
        with signed_save(path, self.signing_key if rank0 else None):  # signed once complete, by rank 0
            self._save_sharded(checkpoint, path, rank0)
        self.barrier()  # type: ignore[attr-defined]

    def _save_sharded(self, checkpoint: Dict[str, Any], path: Path, rank0: bool) -> None:
        if path.is_file():
            path.unlink()
        path.mkdir(parents=True, exist_ok=True)
        import torch.distributed.checkpoint as dcp

        # this save's meta document is written before DCP commits the save that names it, and the older
        # ones are removed only after: a save killed at any point leaves a consistent checkpoint (the old
        # one when it overwrote a directory in place), and meta.json, a copy for readers, is the newest
        name = META_PATTERN.format(token=self.broadcast(new_token()))  # type: ignore[attr-defined]
        # the record comes from the whole dict (its weights' hash stays null: no rank holds them all; the
        # shards carry their CRC32Cs), then the tensors go to DCP and what is left is the meta
        checkpoint = with_record(checkpoint)
        state = _sharded_state(checkpoint, self._model_key)
        state[META_KEY] = name
        if rank0:
            _save_document(os.fspath(path / name), checkpoint, self.allow_pickle, self.encode, self.encryption_key)
        dcp_writer = self._dcp(TensorListWriter, path)
        dcp.save(state, storage_writer=dcp_writer)
        if rank0:
            _save_document(os.fspath(path / META_NAME), checkpoint, self.allow_pickle, self.encode, self.encryption_key)
            io = TensorListCheckpointIO()
            for old in os.listdir(path):
                if old != name and _META_RE.fullmatch(old):
                    io.remove_checkpoint(path / old)
            if self.signing_key is not None:
                dcp_writer.wait()  # the replaced save's shards gone: the signature lists this save's alone

    def _load_meta(self, path: Path) -> Dict[str, Any]:
        """The meta document the committed DCP save names (``META_KEY``)."""
        if (path / PICKLED_META_NAME).exists() and not (path / META_NAME).exists():
            raise FormatError(f"is a stock Lightning sharded checkpoint ({PICKLED_META_NAME} is a pickle, not read); "
                              "convert it with tensorlist.lightning.convert_checkpoint(src, dst) from a trusted copy",
                              file=os.fspath(path))
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        try:  # DCP would say "metadata is None"; the reader's own error names the file
            self._dcp(TensorListReader, path).read_metadata()
        except FileNotFoundError as e:
            raise FormatError(f"holds no committed save (one killed before its commit?): {e}",
                              file=os.fspath(path)) from e
        entry = {META_KEY: ""}
        try:
            dcp.load(entry, storage_reader=self._dcp(TensorListReader, path))
        except CheckpointException as e:  # a BaseException: every rank's failures, gathered
            failures = getattr(e, "failures", {})
            first = next(iter(failures.values()), e) if isinstance(failures, dict) else e
            if isinstance(first, tuple) and first:  # DCP's (exception, traceback) pair
                first = first[0]
            if isinstance(first, FormatError):
                raise first from e  # a shard or the metadata broke a rule: naming its file
            raise FormatError(f"is not a tensorlist Lightning checkpoint: no {META_KEY!r} entry naming its meta "
                              f"document ({short_repr(str(first))})", file=os.fspath(path)) from e
        name = entry[META_KEY]
        if not isinstance(name, str) or not _META_RE.fullmatch(name):
            raise FormatError(f"entry {META_KEY!r} must name a meta document {META_PATTERN!r}, got {short_repr(name)}",
                              file=os.fspath(path))
        return _load_document(confine(path, name, what="meta document"), None, self.allow_pickle, self.encryption_key)


class TensorListModelParallelStrategy(_TensorListSharded, ModelParallelStrategy):
    """``ModelParallelStrategy`` whose distributed checkpoints go through ``TensorListWriter``/``TensorListReader``.

    The checkpoint directory holds DCP's shards in ``tensorlist.dcp``'s layout
    and ``meta.json`` (rank 0's non-tensor state, as :class:`TensorListCheckpointIO`
    writes it) in place of ``meta.pt``. Takes ``ModelParallelStrategy``'s
    arguments, plus ``allow_pickle`` and ``encode`` (as the checkpoint IO's).
    """

    def _is_sharded_save(self) -> bool:
        return bool(self._save_distributed_checkpoint)

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))
        if not path.is_dir():
            return super().load_checkpoint(checkpoint_path, weights_only)
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                             get_optimizer_state_dict, set_optimizer_state_dict)

        meta = self._load_meta(path)
        module = self.model
        module_state = {self._model_key: get_model_state_dict(module)}
        dcp.load(module_state, storage_reader=self._dcp(TensorListReader, path))
        module.load_state_dict(module_state[self._model_key], strict=self.lightning_module.strict_loading)
        for i, optim in enumerate(self.optimizers):
            key = f"optimizer_{i}"
            optim_state = {key: get_optimizer_state_dict(module, optim)}
            dcp.load(optim_state, storage_reader=self._dcp(TensorListReader, path))
            set_optimizer_state_dict(module, optim, optim_state_dict=optim_state[key],
                                     options=StateDictOptions(cpu_offload=True))
        return meta


class TensorListFSDPStrategy(_TensorListSharded, FSDPStrategy):
    """``FSDPStrategy`` (``state_dict_type="sharded"``) whose checkpoints go through ``tensorlist.dcp``.

    As :class:`TensorListModelParallelStrategy`: DCP's shards in
    ``tensorlist.dcp``'s layout and ``meta.json`` in place of ``meta.pt``.
    FSDP1 refuses CPU in torch 2.13 ("FSDP needs a non-CPU accelerator
    device"), so this class is exercised only where there is an accelerator;
    its save is the one ModelParallel's tests cover, its load mirrors
    Lightning's own ``FSDPStrategy.load_checkpoint`` with the reader swapped.
    """

    _model_key = "model"

    def _is_sharded_save(self) -> bool:
        return self._state_dict_type == "sharded"

    def load_checkpoint(self, checkpoint_path, weights_only: Optional[bool] = None) -> Dict[str, Any]:
        path = Path(self.broadcast(checkpoint_path))
        if not path.is_dir():
            return super().load_checkpoint(checkpoint_path, weights_only)
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import StateDictType

        meta = self._load_meta(path)
        with FSDP.state_dict_type(self.model, StateDictType.SHARDED_STATE_DICT):
            module_state = {self._model_key: self.model.state_dict()}
            dcp.load(module_state, storage_reader=self._dcp(TensorListReader, path))
            self.model.load_state_dict(module_state[self._model_key], strict=self.lightning_module.strict_loading)
            for i, optim in enumerate(self.optimizers):
                key = f"optimizer_{i}"
                optim_state = load_sharded_optimizer_state_dict(model_state_dict=module_state[self._model_key],
                                                                optimizer_key=key,
                                                                storage_reader=self._dcp(TensorListReader, path))
                optim.load_state_dict(FSDP.optim_state_dict_to_load(optim_state_dict=optim_state[key],
                                                                    model=self.model, optim=optim))
        return meta


# --------------------------------------------------------------------------
# conversion


def convert_checkpoint(src, dst, *, allow_pickle: bool = False, encode: Optional[Callable[[Any], Any]] = None,
                       encryption_key=None) -> None:
    """Converts a stock Lightning ``.ckpt`` you trust into a tensorlist checkpoint that resumes.

    The source is read with ``torch.load(weights_only=True)`` (torch's
    restricted unpickler: tensors, containers and numbers); a checkpoint
    that needs more (saved hyper-parameters as objects) is refused by torch.

    Raises:
        TypeError: a value JSON cannot hold (see :class:`TensorListCheckpointIO`).
    """
    checkpoint = torch.load(os.fspath(src), map_location="cpu", weights_only=True)
    TensorListCheckpointIO(allow_pickle=allow_pickle, encode=encode,
                           encryption_key=encryption_key).save_checkpoint(checkpoint, dst)


def load_from_checkpoint(cls, path, *, map_location=None, strict: Optional[bool] = None, allow_pickle: bool = False,
                         encryption_key=None, **kwargs):
    """``cls.load_from_checkpoint(path)`` for a tensorlist checkpoint (Lightning's own reads with ``torch.load``).

    ``cls`` (a ``LightningModule`` or ``LightningDataModule`` subclass) is made
    from the checkpoint's saved hyper-parameters (``save_hyperparameters``),
    ``kwargs`` overriding them, and a module gets the checkpoint's weights
    (``strict`` as Lightning's), on ``map_location``; ``encryption_key`` opens an encrypted one.

    Raises:
        FormatError: a stock (pickle) checkpoint or a broken one, naming the file.
    """
    from lightning.pytorch import LightningDataModule
    from lightning.pytorch.core.saving import _load_state

    checkpoint = _load_document(path, map_location, allow_pickle, as_key(encryption_key))
    checkpoint.setdefault(cls.CHECKPOINT_HYPER_PARAMS_KEY, {})
    checkpoint[cls.CHECKPOINT_HYPER_PARAMS_KEY].update(kwargs)
    if issubclass(cls, LightningDataModule):
        return _load_state(cls, checkpoint, **kwargs)
    return _load_state(cls, checkpoint, strict=strict, **kwargs)


# --------------------------------------------------------------------------
# the training record


def _checkpoint_writers(trainer) -> List[Any]:
    """What writes ``trainer``'s checkpoints as tensorlist files: its sharded strategy, its checkpoint IO."""
    strategy = trainer.strategy
    found: List[Any] = [strategy] if isinstance(strategy, _TensorListSharded) else []
    io = strategy.checkpoint_io
    while not isinstance(io, TensorListCheckpointIO) and getattr(io, "checkpoint_io", None) is not None:
        io = io.checkpoint_io  # unwrapped from AsyncCheckpointIO
    if isinstance(io, TensorListCheckpointIO):
        found.append(io)
    return found


def _same_key(a, b) -> bool:
    """Whether two signing keys, or two ``tensorlist.Key``s, are the same key."""
    if isinstance(a, Key) and isinstance(b, Key):
        return a.material(None) == b.material(None)
    return a is b or a == b


class TrainingRecordCallback(Callback):
    """Fills the training record from what the Trainer knows and puts it into every checkpoint.

    At the start of training (before the first step) it takes the hash of
    the starting weights, the first optimizer's settings and parameter groups,
    its scheduler and interval, the seed ``lightning.seed_everything`` left
    in ``PL_GLOBAL_SEED``, and the training loader's settings; each epoch's
    training loss is the mean of the ``training_step`` losses. Every
    checkpoint then holds ``"training"`` (kind ``"checkpoint"``, its weights'
    hash set by the checkpoint IO) and ``"dataset_params"``; a resumed run
    continues the record saved in the checkpoint (this callback's state).

    Args:
        dataset_params: the training data's record (default ``{"name": None}``).
        validation_key: a logged metric (e.g. ``"val_loss"``) to record as each
            epoch's validation value, when the Trainer validates.
        validation_dataset_params: the validation data's record.
        signing_key: an EC private key (PEM path or ``cryptography`` key)
            signing each checkpoint saved while the callback is active. The
            key is lent, for the run, to what writes the checkpoints (the
            :class:`TensorListCheckpointIO`, a tensorlist sharded strategy),
            which signs once each save is complete: a checkpoint is signed
            once, whichever of them holds the key. The same key given to both
            signs once; two different keys are refused (ValueError) at setup.
        encryption_key: a ``tensorlist.Key`` (or 32 bytes) encrypting each
            checkpoint saved while the callback is active, lent as
            ``signing_key`` is (the writers' ``encryption_key``); resuming
            from one needs the key too.

    Raises:
        ValueError: at setup, a key and no tensorlist checkpoint writer in
            the Trainer (a stock pickle checkpoint is neither signed nor
            encrypted here), or another key already held by the writer.
    """

    def __init__(self, *, dataset_params: Optional[Mapping] = None, validation_key: Optional[str] = None,
                 validation_dataset_params: Optional[Mapping] = None, signing_key=None,
                 encryption_key=None) -> None:
        self.dataset_params = dict(dataset_params) if dataset_params is not None else {"name": None}
        validate_dataset_params(self.dataset_params, field_prefix="dataset_params")
        self.validation_dataset_params = None if validation_dataset_params is None else dict(validation_dataset_params)
        if self.validation_dataset_params is not None:
            validate_dataset_params(self.validation_dataset_params, field_prefix="validation.dataset_params")
        self.validation_key = validation_key
        self.recorder: Optional[TrainingRecorder] = None
        self._restored: Optional[Mapping] = None
        self._losses: List[float] = []
        self._rate: Any = None
        self._closed: Optional[int] = None  # the last epoch recorded (trainer.current_epoch)
        self.signing_key = signing_key
        self.encryption_key = as_key(encryption_key)
        self._lent: List[Any] = []  # (writer, attribute) holding a key for this run (given back at teardown)

    @property
    def state_key(self) -> str:
        return "TrainingRecordCallback"

    def setup(self, trainer, pl_module, stage: str) -> None:
        keys = [(a, getattr(self, a)) for a in ("signing_key", "encryption_key") if getattr(self, a) is not None]
        if not keys or stage != "fit":
            return
        writers = _checkpoint_writers(trainer)
        if not writers:
            raise ValueError(f"TrainingRecordCallback({keys[0][0]}=...) is for the checkpoints tensorlist writes: "
                             "give the Trainer plugins=[TensorListCheckpointIO()] (or a tensorlist sharded "
                             f"strategy); its checkpoint IO is {type(trainer.strategy.checkpoint_io).__name__}")
        for attr, key in keys:
            for w in writers:
                theirs = getattr(w, attr)
                if theirs is not None and not _same_key(theirs, key):
                    raise ValueError(f"TrainingRecordCallback and {type(w).__name__} were given different "
                                     f"{attr.replace('_', ' ')}s: give one of them the key")
        self._lent = [(w, attr) for attr, _ in keys for w in writers if getattr(w, attr) is None]
        for w, attr in self._lent:
            setattr(w, attr, getattr(self, attr))

    def teardown(self, trainer, pl_module, stage: str) -> None:
        for w, attr in self._lent:
            setattr(w, attr, None)
        self._lent = []

    def on_train_start(self, trainer, pl_module) -> None:
        optimizer = trainer.optimizers[0]
        scheduler = step = None
        if trainer.lr_scheduler_configs:
            config = trainer.lr_scheduler_configs[0]
            scheduler, step = config.scheduler, ("batch" if config.interval == "step" else "epoch")
        self.recorder = TrainingRecorder(
            whole_module(pl_module), optimizer, train_loader=trainer.train_dataloader, epochs=int(trainer.max_epochs or 0),
            scheduler=scheduler, scheduler_step=step, seed=global_seed(),
            initial_weights={"from": "random_state"}, validation=self._validation(trainer),
            solver=SOLVER,
            solver_params={"max_epochs": trainer.max_epochs, "max_steps": trainer.max_steps,
                           "accumulate_grad_batches": trainer.accumulate_grad_batches,
                           "strategy": type(trainer.strategy).__name__, "world_size": trainer.world_size,
                           "lightning_module": f"{type(pl_module).__module__}.{type(pl_module).__qualname__}"})
        if self._restored is not None:
            self.recorder.resume(self._restored)

    def _validation(self, trainer) -> Optional[dict]:
        """The record's validation section, when a metric is recorded and the Trainer validates."""
        loaders = trainer.val_dataloaders
        if self.validation_key is None or loaders is None or trainer.limit_val_batches == 0:
            return None
        if isinstance(loaders, (list, tuple)):
            loaders = loaders[0] if len(loaders) == 1 else None
        every = trainer.check_val_every_n_epoch
        return {"dataset_params": self.validation_dataset_params,
                "function": type(trainer.lightning_module).validation_step,  # the metric's computation
                "loader": loaders if hasattr(loaders, "sampler") else None, "every": every if every else 1}

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        # the epoch's rates, read before an epoch scheduler steps (Lightning steps it before on_train_epoch_end)
        rates = [float(g["lr"]) for g in trainer.optimizers[0].param_groups]
        self._rate = rates[0] if len(rates) == 1 else rates

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        value = loss_value(outputs)
        if value is not None:
            self._losses.append(value)

    def _close_epoch(self, trainer) -> None:
        if self.recorder is None or self._closed == trainer.current_epoch:
            return
        self._closed = trainer.current_epoch
        loss = float(np.mean(self._losses)) if self._losses else None
        self._losses = []
        value = None
        if self.validation_key is not None and self.validation_key in trainer.callback_metrics:
            value = float(trainer.callback_metrics[self.validation_key])
        self.recorder.epoch_done(loss, validation=value, learning_rate=self._rate)

    def on_validation_end(self, trainer, pl_module) -> None:
        # the validation after an epoch's last batch: ModelCheckpoint saves next (it runs last), so the
        # epoch is closed here, with its validation value, for that checkpoint's record
        if not trainer.sanity_checking and trainer.training and trainer.fit_loop.epoch_loop.batch_progress.is_last_batch:
            self._close_epoch(trainer)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self._close_epoch(trainer)

    def on_save_checkpoint(self, trainer, pl_module, checkpoint: Dict[str, Any]) -> None:
        if self.recorder is not None:
            checkpoint["training"] = self.recorder.record("checkpoint")
            checkpoint["dataset_params"] = dict(self.dataset_params)

    def state_dict(self) -> Dict[str, Any]:
        return {} if self.recorder is None else {"record": self.recorder.record("checkpoint")}

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        if state_dict.get("record") is not None:
            self._restored = read_training_record(dict(state_dict["record"]))
