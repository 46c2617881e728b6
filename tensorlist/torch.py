"""Thin torch adapters: module and optimizer state files, and matching a module against a state.

``save_module_state``/``load_module_state`` (strict, or non-strict with a
reported :class:`LoadResult`), ``save_optimizer_state``/``load_optimizer_state``,
and :func:`match_state`, the one comparison of a module's state with another
mapping (used by ``nn.load_model_weights`` and the loops' resume too). The
tensor conversion itself (``to_numpy``, ``from_numpy``, ``torch_dtype``) lives
in ``_torch_bridge`` and is re-exported here. See docs/LOOPS.md.

Imports ``_torch_bridge``, ``_jsonio`` and ``errors``; ``reader`` on the first load (``_staging`` on the
first load onto an accelerator),
``_states``, ``writer`` and ``record`` where first used, so that ``import tensorlist.torch`` costs about
what ``import safetensors.torch`` does (``bench/bench_startup.py``), and a program that only loads
never imports the writer.
"""
from __future__ import annotations

import logging
import os
from typing import Dict, List, Mapping, Optional, Tuple

import torch

from ._jsonio import dumps, from_tagged, loads_strict, to_tagged
from ._torch_bridge import from_numpy, from_numpy_all, state_to_numpy, to_numpy, torch_dtype
from .errors import FormatError, short_repr

__all__ = [
    "to_numpy", "from_numpy", "torch_dtype", "state_to_numpy", "module_state", "LoadResult", "match_state",
    "save_module_state", "load_module_state", "load_state", "save_optimizer_state", "load_optimizer_state",
    "optimizer_state_parts", "optimizer_state_from_parts", "check_optimizer_state",
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
            (see ``tensorlist.record``); when given, the file is a model file
            that ``read_training_record`` and ``verify_model_file`` accept.
            Give both or neither.
        metadata: other metadata keys.
        **save_options: passed to ``tensorlist.save``.

    Example:
        >>> import torch, tempfile, os, tensorlist.torch as tt
        >>> path = os.path.join(tempfile.mkdtemp(), "m.json")
        >>> tt.save_module_state(path, torch.nn.Linear(2, 3))
        >>> sorted(tt.load_module_state(path, torch.nn.Linear(2, 3)).loaded)
        ['bias', 'weight']
    """
    state = module_state(module) if isinstance(module, torch.nn.Module) else dict(module)
    arrays = state_to_numpy(state, bits=True)
    if (training is None) != (dataset_params is None):
        raise ValueError("give both training= and dataset_params= (a model file holds both records), or neither")
    if training is not None:
        from .record import save_model_file

        save_model_file(path, arrays, training=training, dataset_params=dataset_params, metadata=metadata,
                        **save_options)
        return
    from . import writer  # here, not at import: a program that only loads never imports the writer

    writer.save(path, arrays, metadata=dict(metadata) if metadata else None, **save_options)


def load_state(path, *, device=None, pointer: Optional[str] = None, mmap=True,
               verify: bool = False) -> Dict[str, torch.Tensor]:
    """A TensorList as a dict of torch tensors.

    On CPU (``device`` None or ``"cpu"``) the tensors share the file's memory
    mapping: zero-copy, and read-only by contract (copy before writing in
    place); with ``mmap="copy"`` they share a copy-on-write mapping, writable
    in place without changing the file (a page is copied on its first write);
    with ``mmap=False`` they live in one private, writable read. On
    an accelerator (``"cuda"``...) the file is read once, in chunks, into
    pinned staging buffers and copied to the device on a side stream while
    the next chunk is read (see ``tensorlist._staging``); ``verify`` then
    checks the CRC32Cs on the staged bytes.
    """
    if device is None or (isinstance(device, str) and device == "cpu"):
        # _staging.load's CPU path, without importing the staging ring (0.3 ms of a torch program's first load)
        from .reader import load

        return from_numpy_all(load(path, pointer=pointer, mmap=mmap, verify=verify, bits=True))
    from ._staging import load as staged_load  # the reader, the C core and the staging ring: on the first load

    return staged_load(path, device, pointer=pointer, mmap=mmap, verify=verify)


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
                      pointer: Optional[str] = None) -> LoadResult:
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
    FormatError and may leave the module partly loaded.

    Raises:
        KeyError: strict and names differ (both lists in the message).
        ValueError: strict and shapes differ, or a dtype cannot be cast.
    """
    if device is not None:
        module.to(device)
    file_state = load_state(path, pointer=pointer)
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
            from ._staging import load_into_device
            from .reader import Reader

            with Reader(path, pointer=pointer, mmap=False) as r:
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
            structure (``_states.check_optimizer_dict``), or a tensor it lists
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
    from ._states import check_optimizer_dict  # the optimizer paths only: loads of module states skip it

    check_optimizer_dict(out, file=file, field=field)
    return out


def save_optimizer_state(path, optimizer, *, training: Optional[Mapping] = None,
                         dataset_params: Optional[Mapping] = None, **save_options) -> None:
    """Saves ``optimizer.state_dict()`` (or a state_dict) as a TensorList with JSON metadata.

    The training record and data record, when given, go into the metadata
    next to the optimizer's JSON part (under ``training``/``dataset_params``).
    """
    sd = optimizer.state_dict() if hasattr(optimizer, "state_dict") else optimizer
    tensors, meta = optimizer_state_parts(sd)
    metadata = {"optimizer": meta}
    if (training is None) != (dataset_params is None):
        raise ValueError("give both training= and dataset_params=, or neither")
    if training is not None:
        from .record import validate_dataset_params, validate_training_record

        validate_training_record(training, field_prefix="training")
        validate_dataset_params(dataset_params, field_prefix="dataset_params")
        metadata["training"] = loads_strict(dumps(training))  # plain JSON values (tuples become lists)
        metadata["dataset_params"] = loads_strict(dumps(dataset_params))
    from . import writer

    writer.save(path, state_to_numpy(tensors, bits=True), metadata=metadata, **save_options)


def load_optimizer_state(path, optimizer=None, *, device=None, pointer: Optional[str] = None,
                         restore: bool = True) -> dict:
    """Reads an optimizer state file; loads it into ``optimizer`` when given.

    ``optimizer.load_state_dict`` copies and casts the tensors to its
    parameters' devices; the returned state_dict's tensors are zero-copy
    views of the file on CPU (or copies on ``device``). With ``restore=False``
    the state is checked against ``optimizer`` but not loaded (a caller
    checking several states before restoring any).

    Raises:
        FormatError: the file is not an optimizer state, or its metadata is
            of the wrong structure or JSON types (naming the file and field).
        ValueError: it does not fit the optimizer (another class, other groups
            or parameter counts); the optimizer is then left unchanged.
    """
    from .reader import Reader

    with Reader(path, pointer=pointer) as r:
        meta = r.metadata
    meta = meta.get("optimizer") if isinstance(meta, Mapping) else None
    if meta is None:
        raise FormatError("not an optimizer state file (no 'optimizer' in its metadata)", file=os.fspath(path),
                          field="metadata.optimizer")
    # private, writable memory (one read, no extra copy): torch's
    # load_state_dict keeps tensors that already have the right dtype and
    # device, and the optimizer then updates them in place, which a read-only
    # mapping would not survive
    tensors = load_state(path, device=device, pointer=pointer, mmap=False)
    sd = optimizer_state_from_parts(tensors, meta, file=os.fspath(path))
    if optimizer is not None:
        check_optimizer_state(optimizer, sd, where=os.fspath(path))
        if restore:
            optimizer.load_state_dict(sd)
    return sd


def check_optimizer_state(optimizer, sd: Mapping, *, where: str = "optimizer state") -> None:
    """Raises ValueError when ``sd`` cannot belong to ``optimizer`` (groups, sizes, shapes, keys).

    A ``sd`` of the wrong structure, or whose group settings are not of the
    JSON types the optimizer's own are (``_states.check_like``: ``lr`` a
    string), is a FormatError naming ``where`` and the field.
    """
    from ._states import check_like, check_optimizer_dict

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
