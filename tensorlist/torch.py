"""Thin torch adapters: module and optimizer state files, and matching a module against a state.

``save_module_state``/``load_module_state`` (strict, or non-strict with a
reported :class:`LoadResult`), ``save_optimizer_state``/``load_optimizer_state``,
and :func:`match_state`, the one comparison of a module's state with another
mapping (used by ``nn.load_model_weights`` and the loops' resume too). The
tensor conversion itself (``to_numpy``, ``from_numpy``, ``torch_dtype``) lives
in ``_bridges.torch`` and is re-exported here. See docs/LOOPS.md.

Imports ``_bridges.torch``, ``_base.jsonio`` and ``errors``; ``reader`` on the first load (``torch`` on the
first load onto an accelerator),
``_base.states``, ``writer`` and ``record`` where first used, so that ``import tensorlist.torch`` costs about
what ``import safetensors.torch`` does (``bench/bench_startup.py``), and a program that only loads
never imports the writer.
"""
from __future__ import annotations

import logging
import os
import warnings
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np
import torch

from tensorlist._base import dtypes as _dtypes
from tensorlist._base.jsonio import dumps, from_tagged, loads_strict, to_tagged
from tensorlist._bridges.torch import from_numpy, from_numpy_all, state_to_numpy, to_numpy, torch_dtype
from tensorlist.errors import ChecksumError, FormatError, short_repr

__all__ = [
    "to_numpy", "from_numpy", "torch_dtype", "state_to_numpy", "module_state", "LoadResult", "match_state",
    "save_module_state", "load_module_state", "load_state", "save_optimizer_state", "load_optimizer_state",
    "optimizer_state_parts", "optimizer_state_from_parts", "check_optimizer_state",
    "load", "load_into_device", "plan_chunks", "Chunk", "Piece", "Ring", "CHUNK_BYTES", "BUFFERS",
]


# --------------------------------------------------------------------------
# module and optimizer state files
#
# A module's state file is a model file (see docs/TRAINING_RECORD.md): the
# state_dict as a named TensorList with the training record and the data
# record in its metadata when they are given. An optimizer's state file holds
# every tensor of ``optimizer.state_dict()`` as a named TensorList
# ("state.<param index>.<key>") and everything else (param_groups, scalar
# step counts, which entries are tensors) as JSON in its metadata, so that
# ``load_optimizer_state`` rebuilds the exact same state_dict.

OPTIMIZER_STATE_FORMAT = "tensorlist.torch-optimizer-state/1"


class LoadResult:
    """What a non-strict load did (BigDL's ``loadWeights(path, matchAll=false)``, made explicit).

    Attributes:
        loaded: names copied into the module.
        missing: the module's names the file does not hold (left unchanged).
        unexpected: the file's names the module does not have (ignored).
        mismatched: ``(name, file shape, module shape)`` for names of the wrong
            shape (left unchanged).

    Immutable, compared and hashed by its fields, as a frozen dataclass would
    be; written out because ``@dataclass`` costs 0.4 to 0.7 ms at import, and
    every torch program that loads a file imports this module.
    """

    __slots__ = ("loaded", "missing", "unexpected", "mismatched")

    loaded: Tuple[str, ...]
    missing: Tuple[str, ...]
    unexpected: Tuple[str, ...]
    mismatched: Tuple[Tuple[str, Tuple[int, ...], Tuple[int, ...]], ...]

    def __init__(self, loaded: Tuple[str, ...], missing: Tuple[str, ...], unexpected: Tuple[str, ...],
                 mismatched: Tuple[Tuple[str, Tuple[int, ...], Tuple[int, ...]], ...]):
        set_ = object.__setattr__
        set_(self, "loaded", loaded)
        set_(self, "missing", missing)
        set_(self, "unexpected", unexpected)
        set_(self, "mismatched", mismatched)

    def __setattr__(self, attr, value):
        raise AttributeError(f"cannot assign to field {attr!r}")

    def __delattr__(self, attr):
        raise AttributeError(f"cannot delete field {attr!r}")

    def _fields(self):
        return self.loaded, self.missing, self.unexpected, self.mismatched

    def __eq__(self, other):
        return self._fields() == other._fields() if other.__class__ is self.__class__ else NotImplemented

    def __hash__(self):
        return hash(self._fields())

    def __repr__(self):
        return (f"LoadResult(loaded={self.loaded!r}, missing={self.missing!r}, unexpected={self.unexpected!r}, "
                f"mismatched={self.mismatched!r})")

    @property
    def complete(self) -> bool:
        """True when every tensor of the module was loaded and nothing was left over."""
        return not (self.missing or self.unexpected or self.mismatched)

    def summary(self) -> str:
        parts = [f"{len(self.loaded)} loaded"]
        if self.missing:
            parts.append(f"missing {list(self.missing)}")
        if self.unexpected:
            parts.append(f"unexpected {list(self.unexpected)}")
        if self.mismatched:
            parts.append("wrong shape " + ", ".join(f"{n}: file {list(a)} vs module {list(b)}"
                                                    for n, a, b in self.mismatched))
        return "; ".join(parts)


def module_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The module's parameters and buffers by name (``state_dict`` order, detached)."""
    return {k: v.detach() for k, v in module.state_dict(keep_vars=True).items() if isinstance(v, torch.Tensor)}


def save_module_state(path, module, *, training: Optional[Mapping] = None,
                      dataset_params: Optional[Mapping] = None, metadata: Optional[Mapping] = None,
                      **save_options) -> None:
    """Saves a module's parameters and buffers as a named TensorList (a model file).

    Args:
        path: the descriptor path (the data file goes beside it).
        module: a ``torch.nn.Module`` or a state_dict.
        training, dataset_params: the training record and the data record
            (see ``tensorlist.provenance.record``); when given, the file is a model file
            that ``read_training_record`` and ``verify_model_file`` accept.
            Give both or neither.
        metadata: other metadata keys (a mapping: in a model file they sit
            beside the records' keys; a list or a string is a TypeError).
        **save_options: passed to ``tensorlist.save`` (``key=`` encrypts the
            file, the records in its metadata included).

    Example:
        >>> import torch, tempfile, os, tensorlist.torch as tt
        >>> path = os.path.join(tempfile.mkdtemp(), "m.json")
        >>> tt.save_module_state(path, torch.nn.Linear(2, 3))
        >>> sorted(tt.load_module_state(path, torch.nn.Linear(2, 3)).loaded)
        ['bias', 'weight']
    """
    if metadata is not None and not isinstance(metadata, Mapping):
        raise TypeError(f"metadata must be a mapping of metadata keys, not a {type(metadata).__name__}")
    state = module_state(module) if isinstance(module, torch.nn.Module) else dict(module)
    arrays = state_to_numpy(state, bits=True)
    if (training is None) != (dataset_params is None):
        raise ValueError("give both training= and dataset_params= (a model file holds both records), or neither")
    if training is not None:
        from tensorlist.provenance.record import save_model_file

        save_model_file(path, arrays, training=training, dataset_params=dataset_params, metadata=metadata,
                        **save_options)
        return
    from tensorlist import writer  # here, not at import: a program that only loads never imports the writer

    writer.save(path, arrays, metadata=dict(metadata) if metadata else None, **save_options)


def load_state(path, *, device=None, pointer: Optional[str] = None, mmap=True,
               verify: bool = False, key=None) -> Dict[str, torch.Tensor]:
    """A TensorList as a dict of torch tensors.

    On CPU (``device`` None or ``"cpu"``) the tensors share the file's memory
    mapping: zero-copy, and read-only by contract (copy before writing in
    place); with ``mmap="copy"`` they share a copy-on-write mapping, writable
    in place without changing the file (a page is copied on its first write);
    with ``mmap=False`` they live in one private, writable read. On
    an accelerator (``"cuda"``...) the file is read once, in chunks, into
    pinned staging buffers and copied to the device on a side stream while
    the next chunk is read (see :func:`load`); ``verify`` then
    checks the CRC32Cs on the staged bytes. ``key`` opens an encrypted
    file (a ``tensorlist.Key`` or its 32 bytes): its tensors are decrypted
    into private memory, whatever ``mmap`` says.
    """
    if device is None or (isinstance(device, str) and device == "cpu"):
        # the CPU path of load(): the mapping, without the staging ring
        from tensorlist import reader

        return from_numpy_all(reader.load(path, pointer=pointer, mmap=mmap, verify=verify, bits=True, key=key))
    return load(path, device, pointer=pointer, mmap=mmap, verify=verify, key=key)


def match_state(expected: Mapping, given: Mapping) -> LoadResult:
    """Compares two name -> tensor mappings by name and shape (nothing is copied).

    Args:
        expected: what the module holds (its ``state_dict``, or any mapping of
            names to objects with ``.shape``).
        given: what a file or another module offers.

    Returns:
        A :class:`LoadResult`: ``loaded`` (same name and shape), ``missing``
        (in ``expected`` only), ``unexpected`` (in ``given`` only) and
        ``mismatched`` as ``(name, given shape, expected shape)``.

    Example:
        >>> r = match_state({"w": torch.zeros(2), "b": torch.zeros(1)}, {"w": torch.ones(3), "x": torch.ones(1)})
        >>> r.missing, r.unexpected, r.mismatched
        (('b',), ('x',), (('w', (3,), (2,)),))
    """
    loaded, missing, mismatched = [], [], []
    for name, t in expected.items():
        if name not in given:
            missing.append(name)
        elif tuple(given[name].shape) != tuple(t.shape):
            mismatched.append((name, tuple(given[name].shape), tuple(t.shape)))
        else:
            loaded.append(name)
    unexpected = [n for n in given if n not in expected]
    return LoadResult(tuple(loaded), tuple(missing), tuple(unexpected), tuple(mismatched))


def _staged(t: torch.Tensor) -> bool:
    """Whether a module tensor is filled through the staging ring (off the CPU) or from the mapping."""
    return t.device.type != "cpu"


def load_module_state(path, module: torch.nn.Module, *, strict: bool = True, device=None,
                      pointer: Optional[str] = None, key=None) -> LoadResult:
    """Loads parameters and buffers from a TensorList into ``module`` (BigDL's ``loadWeights``).

    Strict (the default, BigDL's ``matchAll=true``): every name must match in
    both directions with the same shape, else ``KeyError``/``ValueError`` is
    raised and the module is left untouched. Non-strict: copies what matches
    and returns a :class:`LoadResult` listing what was missing, unexpected or
    of the wrong shape; it logs a warning when the load was partial, so a
    partial load is never silent.

    Values are copied into the module's own tensors (``Tensor.copy_``, on the
    module's device and dtype). For tensors on the CPU the file is read
    through its memory mapping with no intermediate copy; for tensors on an
    accelerator it is read once, in chunks, through pinned staging buffers,
    straight into each parameter of the stored dtype (others get a staged
    copy, then a cast on the device). ``device`` moves the module first. A
    data file truncated by another process while it is read raises
    FormatError and may leave the module partly loaded. ``key`` opens an
    encrypted file (without it, or with another, ``EncryptionError`` naming
    the file, before the module is touched).

    Raises:
        KeyError: strict and names differ (both lists in the message).
        ValueError: strict and shapes differ, or a dtype cannot be cast.
    """
    if device is not None:
        module.to(device)
    file_state = load_state(path, pointer=pointer, key=key)
    own = module.state_dict(keep_vars=True)
    result = match_state(own, file_state)
    if strict and (result.missing or result.unexpected):
        raise KeyError(f"{os.fspath(path)}: state does not match the module "
                       f"(missing in file: {list(result.missing)}, unexpected in file: {list(result.unexpected)}); "
                       "pass strict=False to load what matches")
    if strict and result.mismatched:
        raise ValueError(f"{os.fspath(path)}: wrong shapes: " + ", ".join(
            f"{n}: file {list(a)} vs module {list(b)}" for n, a, b in result.mismatched))
    on_device: Dict[torch.device, List[str]] = {}
    for name in result.loaded:
        if _staged(own[name]):
            on_device.setdefault(own[name].device, []).append(name)
    with torch.no_grad():
        if on_device:
            from tensorlist.reader import Reader

            with Reader(path, pointer=pointer, mmap=False, key=key) as r:
                for dev, names in on_device.items():
                    direct = {n: own[n] for n in names
                              if own[n].dtype == file_state[n].dtype and own[n].is_contiguous()}
                    staged = load_into_device(r, dev, keys=names, into=direct)
                    for n in names:
                        if n not in direct:
                            own[n].copy_(staged[n])
        for name in result.loaded:
            if not _staged(own[name]):
                own[name].copy_(file_state[name])
    if not result.complete:
        logging.getLogger("tensorlist.torch").warning("%s: partial load into %s: %s", os.fspath(path),
                                                      type(module).__name__, result.summary())
    return result


def optimizer_state_parts(state_dict: Mapping) -> Tuple[Dict[str, torch.Tensor], dict]:
    """Splits an optimizer ``state_dict`` into named tensors and JSON metadata.

    Tensors of ``state`` become ``"state.<param id>.<key>"``; scalars and the
    ``param_groups`` go into the JSON, which also lists which keys were
    tensors. :func:`optimizer_state_from_parts` is the inverse.
    """
    tensors: Dict[str, torch.Tensor] = {}
    state_json: List[list] = []
    for pid, entry in state_dict["state"].items():
        plain = {}
        tensor_keys = []
        for key, value in entry.items():
            if isinstance(value, torch.Tensor):
                tensors[f"state.{pid}.{key}"] = value.detach()
                tensor_keys.append(key)
            else:
                plain[key] = to_tagged(value, f"optimizer state state[{pid}].{key}")
        state_json.append([to_tagged(pid, "optimizer state state"), tensor_keys, plain])
    meta = {
        "format": OPTIMIZER_STATE_FORMAT,
        "state": state_json,
        "param_groups": to_tagged(list(state_dict["param_groups"]), "optimizer state param_groups"),
    }
    extra = {k: v for k, v in state_dict.items() if k not in ("state", "param_groups")}
    if extra:
        meta["extra"] = to_tagged(extra, "optimizer state extra")
    return tensors, meta


def optimizer_state_from_parts(tensors: Mapping[str, torch.Tensor], meta: Mapping, *, file=None,
                               field: str = "metadata.optimizer") -> dict:
    """Rebuilds the ``state_dict`` that :func:`optimizer_state_parts` split, once its structure is checked.

    Raises:
        FormatError: ``meta`` is not an optimizer state's, or of the wrong
            structure (``_base.states.check_optimizer_dict``), or a tensor it lists
            is missing; naming ``file`` and the field.
    """
    if not isinstance(meta, Mapping) or meta.get("format") != OPTIMIZER_STATE_FORMAT:
        raise FormatError(f"not an optimizer state (expected metadata format {OPTIMIZER_STATE_FORMAT!r})",
                          file=file, field=f"{field}.format")
    entries = meta.get("state")
    if not isinstance(entries, list):
        raise FormatError(f"must be a list, got {short_repr(entries)}", file=file, field=f"{field}.state")
    state = {}
    for i, item in enumerate(entries):
        at = f"{field}.state[{i}]"
        if not (isinstance(item, list) and len(item) == 3 and isinstance(item[1], list)
                and all(isinstance(k, str) for k in item[1]) and isinstance(item[2], dict)):
            raise FormatError(f"must be [parameter id, [tensor keys], {{values}}], got {short_repr(item)}",
                              file=file, field=at)
        pid, tensor_keys, plain = item
        pid = from_tagged(pid, file=file, where=f"{at}[0]")
        if not isinstance(pid, int) or isinstance(pid, bool) or pid in state:
            raise FormatError(f"a parameter id must be an integer given once, got {short_repr(pid)}",
                              file=file, field=f"{at}[0]")
        entry = {}
        for key in tensor_keys:
            name = f"state.{pid}.{key}"
            if name not in tensors:
                raise FormatError(f"tensor {name!r} is missing", file=file, field=f"{at}[1]")
            entry[key] = tensors[name]
        entry.update(from_tagged(plain, file=file, where=f"{at}[2]"))
        state[pid] = entry
    out = {"state": state, "param_groups": from_tagged(meta.get("param_groups"), file=file,
                                                       where=f"{field}.param_groups")}
    extra = from_tagged(meta.get("extra", {}), file=file, where=f"{field}.extra")
    if not isinstance(extra, dict) or set(extra) & {"state", "param_groups"}:
        raise FormatError(f"must be an object of other keys, got {short_repr(extra)}", file=file,
                          field=f"{field}.extra")
    out.update(extra)
    from tensorlist._base.states import check_optimizer_dict  # the optimizer paths only: loads of module states skip it

    check_optimizer_dict(out, file=file, field=field)
    return out


def save_optimizer_state(path, optimizer, *, training: Optional[Mapping] = None,
                         dataset_params: Optional[Mapping] = None, **save_options) -> None:
    """Saves ``optimizer.state_dict()`` (or a state_dict) as a TensorList with JSON metadata.

    The training record and data record, when given, go into the metadata
    next to the optimizer's JSON part (under ``training``/``dataset_params``).
    ``key=`` (in ``save_options``, as for ``tensorlist.save``) encrypts the
    file, its metadata included.
    """
    sd = optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer
    tensors, meta = optimizer_state_parts(sd)
    metadata = {"optimizer": meta}
    if (training is None) != (dataset_params is None):
        raise ValueError("give both training= and dataset_params=, or neither")
    if training is not None:
        from tensorlist.provenance.record import anchor_paths, validate_dataset_params, validate_training_record

        training = anchor_paths(training, os.path.dirname(os.fsdecode(path)))  # its paths read from the file's place
        validate_training_record(training, field_prefix="training")
        validate_dataset_params(dataset_params, field_prefix="dataset_params")
        metadata["training"] = loads_strict(dumps(training))  # plain JSON values (tuples become lists)
        metadata["dataset_params"] = loads_strict(dumps(dataset_params))
    from tensorlist import writer

    writer.save(path, state_to_numpy(tensors, bits=True), metadata=metadata, **save_options)


def load_optimizer_state(path, optimizer=None, *, device=None, pointer: Optional[str] = None,
                         restore: bool = True, key=None) -> dict:
    """Reads an optimizer state file; loads it into ``optimizer`` when given.

    ``optimizer.load_state_dict`` copies and casts the tensors to its
    parameters' devices; the returned state_dict's tensors are zero-copy
    views of the file on CPU (or copies on ``device``). With ``restore=False``
    the state is checked against ``optimizer`` but not loaded (a caller
    checking several states before restoring any). ``key`` opens an
    encrypted file.

    Raises:
        EncryptionError: an encrypted file opened without its key or with another.
        FormatError: the file is not an optimizer state, or its metadata is
            of the wrong structure or JSON types (naming the file and field).
        ValueError: it does not fit the optimizer (another class, other groups
            or parameter counts); the optimizer is then left unchanged.
    """
    from tensorlist.reader import Reader

    with Reader(path, pointer=pointer, key=key) as r:
        r.require_key()  # an encrypted file's metadata reads as None until its key opens it
        meta = r.metadata
    meta = meta.get("optimizer") if isinstance(meta, Mapping) else None
    if meta is None:
        raise FormatError("not an optimizer state file (no 'optimizer' in its metadata)", file=os.fspath(path),
                          field="metadata.optimizer")
    # private, writable memory (one read, no extra copy): torch's
    # load_state_dict keeps tensors that already have the right dtype and
    # device, and the optimizer then updates them in place, which a read-only
    # mapping would not survive
    tensors = load_state(path, device=device, pointer=pointer, mmap=False, key=key)
    sd = optimizer_state_from_parts(tensors, meta, file=os.fspath(path))
    if optimizer is not None:
        check_optimizer_state(optimizer, sd, where=os.fspath(path))
        if restore:
            optimizer.load_state_dict(sd)
    return sd


def check_optimizer_state(optimizer, sd: Mapping, *, where: str = "optimizer state") -> None:
    """Raises ValueError when ``sd`` cannot belong to ``optimizer`` (groups, sizes, shapes, keys).

    A ``sd`` of the wrong structure, or whose group settings are not of the
    JSON types the optimizer's own are (``_base.states.check_like``: ``lr`` a
    string), is a FormatError naming ``where`` and the field.
    """
    from tensorlist._base.states import check_like, check_optimizer_dict

    check_optimizer_dict(sd, file=where, field="optimizer")
    groups = optimizer.param_groups
    saved = sd["param_groups"]
    for i, (g, s) in enumerate(zip(groups, saved)):
        for key, live in g.items():
            if key != "params" and key in s and not isinstance(live, torch.Tensor):
                check_like(s[key], live, file=where, field=f"optimizer.param_groups[{i}].{key}")
    if len(groups) != len(saved):
        raise ValueError(f"{where}: {len(saved)} parameter groups saved, the optimizer has {len(groups)}")
    params = []
    for i, (g, s) in enumerate(zip(groups, saved)):
        if len(g["params"]) != len(s["params"]):
            raise ValueError(f"{where}: group {i} saved with {len(s['params'])} parameters, "
                             f"the optimizer has {len(g['params'])}")
        missing = set(g) - set(s) - {"params"}
        if missing:
            raise ValueError(f"{where}: group {i} lacks settings {sorted(missing)} of "
                             f"{type(optimizer).__name__}: saved by another optimizer class?")
        params.extend(zip(s["params"], g["params"]))
    for pid, p in params:
        entry = sd["state"].get(pid, {})
        for key, value in entry.items():
            if isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape != p.shape \
                    and key not in ("step",):
                raise ValueError(f"{where}: state {key!r} of parameter {pid} has shape {list(value.shape)}, "
                                 f"the parameter {list(p.shape)}")


# --------------------------------------------------------------------------
# device loads
#
# The device load path: a TensorList read straight into accelerator memory.
#
# The list's region is read once, front to back, in chunks. Each chunk is read
# into one of a few pinned host buffers (``Reader.readinto``: parallel
# ``pread`` for a local file, concurrent ranged reads for a URL) and copied to
# the device on a side stream, in one ``copy_`` per tensor piece, while the next
# chunk is being read into the next buffer. A buffer is refilled only after the
# copies out of it have finished (an event per buffer). Nothing else is staged:
# no whole-file host copy, no pageable ``Tensor.to`` per tensor.
#
# On a device without streams or pinned memory (any non-CUDA device, and the
# CPU, which the tests use to exercise the chunking), the same plan runs with
# ordinary buffers and synchronous copies.
#
# The package facade registers :func:`load` as the ``"device"`` backend, so
# ``tensorlist.load(path, device=...)`` reaches it without the core importing
# torch; the reader and the C core's CRC32C are imported on the first load.

#: Bytes per staging buffer (one chunk of the region).
CHUNK_BYTES = 32 << 20
#: Staging buffers in flight: one being filled while the others are copied out.
BUFFERS = 3
#: A gap between tensors larger than this starts a new chunk instead of being read.
MAX_GAP = 1 << 20


class Piece(NamedTuple):
    """Bytes ``[src, src + length)`` of a chunk go to bytes ``[dst, dst + length)`` of tensor ``index``."""

    index: int
    src: int
    dst: int
    length: int


class Chunk(NamedTuple):
    """Region bytes ``[start, start + length)``, read into one staging buffer, and where they go."""

    start: int
    length: int
    pieces: List[Piece]


def plan_chunks(offsets, lengths, chunk_bytes: int = CHUNK_BYTES, max_gap: int = MAX_GAP) -> List[Chunk]:
    """Cuts the region into chunks of at most ``chunk_bytes`` that cover every tensor's bytes.

    Tensors are taken in offset order; a chunk holds whole neighbours until the
    next would overflow it, a tensor larger than a chunk is split over several,
    and a gap wider than ``max_gap`` (a hand-made layout) is skipped rather
    than read. Empty tensors get no piece.
    """
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes}")
    order = sorted((i for i, n in enumerate(lengths) if n), key=lambda i: offsets[i])
    chunks: List[Chunk] = []
    start = end = None
    pieces: List[Piece] = []

    def flush():
        if pieces:
            chunks.append(Chunk(start, end - start, list(pieces)))
            pieces.clear()

    for i in order:
        off, n, done = offsets[i], lengths[i], 0
        while done < n:
            at, rest = off + done, n - done
            if (start is None or at - end > max_gap or at < end or at + 1 - start > chunk_bytes
                    or (rest <= chunk_bytes and at + rest - start > chunk_bytes)):  # whole in a fresh chunk
                flush()
                start = end = at
            take = min(rest, start + chunk_bytes - at)
            pieces.append(Piece(i, at - start, done, take))
            end = at + take
            done += take
    flush()
    return chunks


def _staging_buffers(count: int, nbytes: int, pinned: bool) -> List[torch.Tensor]:
    return [torch.empty(nbytes, dtype=torch.uint8, pin_memory=pinned) for _ in range(count)]


def _usable(device, path) -> torch.device:
    """``device`` as a torch.device with its index; an error naming the file when torch cannot use it.

    Raises:
        ValueError: ``device`` names no torch device.
        RuntimeError: a CUDA device this torch cannot use.
    """
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as e:
        raise ValueError(f"{path}: {device!r} is not a torch device: {e}") from None
    if device.type != "cuda":
        return device
    if not torch.cuda.is_available():
        why = "this torch build has no CUDA" if torch.version.cuda is None else "no CUDA device or driver is visible"
        raise RuntimeError(f"{path}: cannot load onto {device}: {why}")
    if device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    if device.index >= torch.cuda.device_count():
        raise RuntimeError(f"{path}: cannot load onto {device}: torch sees {torch.cuda.device_count()} CUDA devices")
    return device


def load_into_device(r, device, *, keys=None, into: Optional[Mapping[str, torch.Tensor]] = None,
                     verify: bool = False, chunk_bytes: int = CHUNK_BYTES,
                     buffers: int = BUFFERS) -> Dict[str, torch.Tensor]:
    """Reads tensors of an open Reader (local or remote) into memory on ``device``.

    Args:
        r: a ``tensorlist.Reader`` (open it with ``mmap=False`` for parallel
            ``pread``s into the staging buffers) or a ``RemoteReader``.
        device: the target torch device.
        keys: the tensors to read (default: all), keyed as ``load`` keys them.
        into: existing destinations by key (a module's parameters): each must
            be contiguous, on ``device``, of the stored dtype and shape; it is
            written in place instead of a new tensor being allocated.
        verify: check each tensor's stored CRC32C on the staged bytes; a
            mismatch raises ChecksumError naming the tensor (tensors written
            through ``into`` may then hold the bad bytes).
        chunk_bytes, buffers: the staging ring (pinned on CUDA).

    Returns:
        dict key -> tensor on ``device``, in file order.

    Raises:
        FormatError: the data file was truncated while being read.
        ValueError: an ``into`` tensor does not fit its entry.
    """
    device = _usable(device, r.path)
    table = r.descriptor.tensors
    all_keys = table.keys()
    wanted = range(len(all_keys)) if keys is None else [r.info(k).index for k in keys]
    out: Dict[str, torch.Tensor] = {}
    flat: Dict[int, torch.Tensor] = {}  # index -> the destination's bytes
    for i in wanted:
        key = all_keys[i]
        dtype, shape = torch_dtype(table.dtypes[i].name), tuple(table.shapes[i])
        dst = into.get(key) if into is not None else None
        if dst is None:
            dst = torch.empty(shape, dtype=dtype, device=device)
        elif dst.dtype != dtype or tuple(dst.shape) != shape or dst.device != device or not dst.is_contiguous():
            raise ValueError(f"{r.path}: tensor {key!r} is {dtype} {list(shape)}; its destination is "
                             f"{dst.dtype} {list(dst.shape)} on {dst.device}"
                             f"{'' if dst.is_contiguous() else ', not contiguous'}")
        out[key] = dst
        if table.lengths[i]:
            flat[i] = dst.detach().reshape(-1).view(torch.uint8)
    if not _dtypes.NATIVE_LITTLE or getattr(r, "encrypted", False):
        _copy_arrays(r, {all_keys[i]: flat[i] for i in flat}, out)
        return out
    offsets = table.offsets
    chunks = plan_chunks([offsets[i] if i in flat else 0 for i in range(len(table))],
                         [table.lengths[i] if i in flat else 0 for i in range(len(table))], chunk_bytes)
    crcs = {i: 0 for i in flat if table.crcs is not None and table.crcs[i] is not None} if verify else {}
    _copy_chunks(r, chunks, flat, crcs, device, buffers)
    for i, got in crcs.items():
        if got != table.crcs[i]:
            raise ChecksumError(f"CRC32C of the data is {got:#010x}, the descriptor says {table.crcs[i]:#010x}",
                                file=r.path, tensor_index=i, tensor_name=table.names[i] if table.names else None,
                                field="crc32c")
    return out


def _copy_arrays(r, flat: Dict[str, torch.Tensor], out: Dict[str, torch.Tensor]) -> None:
    """Fills the tensors ``flat`` (key -> the destination's bytes) as the reader gives them, not by region chunks.

    For the lists whose region bytes are not the tensors' bytes: on a
    big-endian host (the stored bytes are little-endian: numpy swaps them),
    and in an encrypted list, whose reader decrypts each tensor once, into
    private memory, one tensor at a time (a chunk of the region would cut a
    tensor, and each read of a part decrypts it whole).
    """
    with torch.no_grad():
        if not getattr(r, "encrypted", False):
            for k, a in r.get_many(list(flat)).items():
                out[k].copy_(from_numpy(a))
        elif _dtypes.NATIVE_LITTLE:
            for k, dst in flat.items():  # the bytes as stored: any dtype, bit carriers or not
                dst.copy_(torch.from_numpy(r[k].reshape(-1).view(np.uint8)))
        else:
            for k in flat:
                out[k].copy_(from_numpy(r[k]))


class Ring:
    """The staging ring: ``count`` host buffers of ``nbytes``, pinned on CUDA and copied out on a side stream.

    Use: ``slot = ring.next()`` (waits until the copies out of that buffer
    have finished), fill ``ring.hosts[slot]`` (numpy, uint8), then
    ``ring.copy(slot, pairs)`` with ``(destination, view of ring.bufs[slot])``
    pairs. On a device without streams or pinned memory (the CPU included)
    the buffers are ordinary memory and the copies synchronous. Leaving the
    ``with`` block waits for every copy: none outlives its buffer or its
    caller. The one ring of every device load (``load_into_device``,
    ``tensorlist.dcp.TensorListReader``).
    """

    def __init__(self, device: torch.device, nbytes: int, count: int):
        self.cuda = device.type == "cuda"
        self.bufs = _staging_buffers(count, nbytes, pinned=self.cuda)
        self.hosts = [b.numpy() for b in self.bufs]
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self._done: List[Optional[torch.cuda.Event]] = [None] * count
        self._k = 0
        if self.cuda:  # the destinations were allocated on the current stream
            self.stream.wait_stream(torch.cuda.current_stream(device))

    def next(self) -> int:
        """The next buffer's index, once the copies out of it have finished."""
        slot = self._k % len(self.bufs)
        self._k += 1
        if self._done[slot] is not None:
            self._done[slot].synchronize()
        return slot

    def copy(self, slot: int, pairs) -> None:
        """``dst.copy_(src)`` for each pair, on the side stream (then an event marks the buffer busy)."""
        with torch.no_grad():
            if self.cuda:
                with torch.cuda.stream(self.stream):
                    for dst, src in pairs:
                        dst.copy_(src, non_blocking=True)
                    self._done[slot] = torch.cuda.Event()
                    self._done[slot].record(self.stream)
            else:
                for dst, src in pairs:
                    dst.copy_(src)

    def __enter__(self) -> "Ring":
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:  # complete when the load returns (or raises)
            self.stream.synchronize()


def _copy_chunks(r, chunks: List[Chunk], flat: Dict[int, torch.Tensor], crcs: Dict[int, int],
                 device: torch.device, buffers: int) -> None:
    """Runs the plan: read chunk k into buffer k % buffers, copy it out on a side stream."""
    if not chunks:
        return
    from tensorlist._base.lowlevel import crc32c  # the C core: on the first load, not at import

    with Ring(device, max(c.length for c in chunks), min(buffers, len(chunks))) as ring:
        for chunk in chunks:
            slot = ring.next()
            host, src = ring.hosts[slot][:chunk.length], ring.bufs[slot]
            r.readinto(host, chunk.start)
            ring.copy(slot, [(flat[p.index][p.dst:p.dst + p.length], src[p.src:p.src + p.length])
                             for p in chunk.pieces])
            for p in chunk.pieces:  # while the copies run: they only read the buffer
                if p.index in crcs:
                    crcs[p.index] = crc32c(host[p.src:p.src + p.length], crcs[p.index])


def load(path, device, *, pointer: Optional[str] = None, mmap=True, verify: bool = False,
         chunk_bytes: int = CHUNK_BYTES, buffers: int = BUFFERS, **reader_options) -> Dict[str, torch.Tensor]:
    """Every tensor of a TensorList as torch tensors on ``device`` (``tensorlist.load(path, device=...)``).

    On the CPU the tensors share the file's memory mapping (zero-copy,
    read-only by contract) as ``tensorlist.torch.load_state`` returns them,
    or, with ``mmap="copy"``, share a copy-on-write mapping (writable; the
    file never changes), or with ``mmap=False`` live in one private, writable
    read. On any other device the list goes through the staging ring of
    :func:`load_into_device` (any ``mmap`` reads the same way there), or, for
    an encrypted list (``key=``), tensor by tensor as the reader decrypts them
    (every chunk's tag checked: ``verify`` adds nothing).
    """
    from tensorlist import reader  # on the first load, not at import

    mmap = reader.read_mode(mmap)
    device = _usable(device, path)
    if device.type == "cpu":
        # bit carriers: torch holds bfloat16/float8 itself, so ml_dtypes is never imported here
        # (tensorlist.torch.load_state makes the same two calls for "cpu", without importing this module)
        arrays = reader.load(path, pointer=pointer, mmap=mmap, verify=verify, bits=True, **reader_options)
        return from_numpy_all(arrays)
    with reader.open(path, pointer=pointer, mmap=False, **reader_options) as r:
        if verify and len(r) and not r.encrypted and (r.descriptor.tensors.crcs is None
                                  or all(c is None for c in r.descriptor.tensors.crcs)):
            warnings.warn(f"{r.path}: verify=True but the file stores no checksums", stacklevel=3)
        return load_into_device(r, device, verify=verify, chunk_bytes=chunk_bytes, buffers=buffers)
