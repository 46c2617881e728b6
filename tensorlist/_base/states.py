"""The one validation of every training state a checkpoint restores, before torch, numpy or ``random`` sees it.

A checkpoint's RNG states, optimizer state and scheduler, sampler and scaler
states are a file's content: handed as they are to ``torch.set_rng_state``,
``np.random.set_state``, ``random.setstate``, ``Optimizer.load_state_dict`` or
``LRScheduler.load_state_dict``, a state of the wrong size or JSON type ends
in their own ``RuntimeError``, ``OverflowError``, ``TypeError``, ``KeyError``
or ``AttributeError`` (now, or at the next step). Every entry point that
restores a state (``loops`` resume, ``tensorlist.torch.load_optimizer_state``,
``tensorlist.huggingface.load_state`` and the Trainer's resume,
``tensorlist.lightning``'s checkpoint load) checks it here first, one
function per kind, each raising :class:`~tensorlist.errors.FormatError`
naming the file and the field:

- :func:`check_rng_state`: torch's CPU state (uint8, the generator's exact
  size), CUDA states (uint8, 16 bytes: Philox seed and offset), numpy's legacy
  MT19937 state (624 uint32 words, position, gauss cache), Python ``random``'s
  version-3 state (625 words below 2³², the last a position up to 624);
  :func:`check_generator_state` for one ``torch.Generator``'s state.
- :func:`check_optimizer_dict`: a torch optimizer ``state_dict``'s structure
  (``state`` keyed by parameter ids, ``param_groups`` a list of objects whose
  ``params`` are distinct integers covering every ``state`` key).
- :func:`check_like`: a scheduler's, sampler's or scaler's state against the
  live object's own ``state_dict()`` (the same keys and JSON types; a value
  the live object has as null may be anything); :func:`check_scheduler_keys`
  for a torch LR scheduler's well-known keys where no live object is at hand;
  :func:`check_sampler_state` for a data loader's (sampler epoch and seed,
  stateful loader, generator); :func:`check_lightning_states` for the states
  a Lightning checkpoint dict restores.

Imports numpy and ``errors`` (torch on first use, for the generator's size).
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Optional

import numpy as np

from tensorlist.errors import FormatError, short_repr

__all__ = ["CUDA_RNG_STATE_BYTES", "check_rng_state", "check_generator_state", "check_optimizer_dict",
           "check_like", "check_scheduler_keys", "check_sampler_state", "check_lightning_states"]

#: The bytes of a CUDA generator's state (torch's Philox: a 64-bit seed and a 64-bit offset).
CUDA_RNG_STATE_BYTES = 16
#: numpy's legacy MT19937 state: 624 32-bit words and a position in 0..624.
NUMPY_MT_WORDS = 624
#: Python ``random``'s version-3 state: 624 32-bit words and the position (0..624) as the 625th.
RANDOM_STATE_VERSION, RANDOM_WORDS = 3, 625

_torch_state_bytes: Optional[int] = None


def _fail(reason: str, file, field: str):
    raise FormatError(reason, file=None if file is None else str(file), field=field)


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v) -> bool:
    return _is_int(v) or isinstance(v, (float, np.floating))


def torch_rng_state_bytes() -> int:
    """The size of a torch CPU generator's state on this installation (5056 bytes: MT19937 and normal caches)."""
    global _torch_state_bytes
    if _torch_state_bytes is None:
        import torch

        _torch_state_bytes = int(torch.Generator().get_state().numel())
    return _torch_state_bytes


def _words(value: Any, dtype, length: int, file, field: str, *, what: str) -> np.ndarray:
    """``value`` (an array of exactly ``dtype``, or a JSON list of integers) as a 1-D array of ``length`` words."""
    bits = np.dtype(dtype).itemsize * 8
    if type(value).__module__.startswith("torch") and hasattr(value, "dtype"):  # a torch tensor, kept as it is
        if str(value.dtype) != f"torch.{np.dtype(dtype).name}" or tuple(value.shape) != (length,):
            _fail(f"{what} must be {length} {np.dtype(dtype).name} values, got {value.dtype} "
                  f"{list(value.shape)}", file, field)
        return value
    if isinstance(value, np.ndarray):
        if value.dtype != np.dtype(dtype) or value.shape != (length,):
            _fail(f"{what} must be {length} {np.dtype(dtype).name} values, got {value.dtype} "
                  f"{list(value.shape)}", file, field)
        return np.array(value)
    if isinstance(value, (list, tuple)):
        if len(value) != length:
            _fail(f"{what} must be {length} {np.dtype(dtype).name} values, got {len(value)}", file, field)
        for i, v in enumerate(value):
            if not _is_int(v) or not 0 <= v < 2 ** bits:
                _fail(f"{what}: {short_repr(v)} is not a {bits}-bit unsigned integer", file, f"{field}[{i}]")
        return np.array(value, dtype=dtype)
    _fail(f"{what} must be an array of {length} {np.dtype(dtype).name} values, got {short_repr(value)}",
          file, field)


def check_generator_state(value: Any, *, file=None, field: str = "generator") -> np.ndarray:
    """A torch CPU ``Generator``'s state (uint8, the exact size this torch uses): a torch tensor as it is, else as
    a uint8 array."""
    return _words(value, np.uint8, torch_rng_state_bytes(), file, field, what="a torch generator state")


def check_rng_state(tensors: Any, meta: Any, *, file=None, field: str = "rng",
                    tensors_field: Optional[str] = None) -> tuple:
    """Checks what ``loops.state.rng_state`` returned (read back from a file); returns it ready to restore.

    Args:
        tensors: ``{"torch": uint8[N], "numpy": uint32[624], "cuda.<i>": uint8[16]...}`` (arrays, or JSON lists).
        meta: ``{"numpy": ["MT19937", pos, has_gauss, cached], "random": [3, [625 words], gauss]}``.
        file, field: named by errors (``tensors_field`` names the tensors, default ``field + "Tensors"``).

    Returns:
        ``(tensors, meta)``: the arrays in their exact dtypes, ``meta`` as given.

    Raises:
        FormatError: a missing part, or one of the wrong type, size or range.
    """
    tfield = tensors_field or f"{field}Tensors"
    if not isinstance(tensors, Mapping) or "torch" not in tensors or "numpy" not in tensors:
        _fail("the RNG states must hold 'torch' and 'numpy'", file, tfield)
    if not isinstance(meta, Mapping):
        _fail(f"the RNG state must be an object, got {short_repr(meta)}", file, field)
    out = {"torch": _words(tensors["torch"], np.uint8, torch_rng_state_bytes(), file, f"{tfield}.torch",
                           what="torch's RNG state"),
           "numpy": _words(tensors["numpy"], np.uint32, NUMPY_MT_WORDS, file, f"{tfield}.numpy",
                           what="numpy's RNG state")}
    for key, value in tensors.items():
        if isinstance(key, str) and key.startswith("cuda."):
            out[key] = _words(value, np.uint8, CUDA_RNG_STATE_BYTES, file, f"{tfield}.{key}",
                              what="a CUDA RNG state")
    np_meta = meta.get("numpy")
    if not (isinstance(np_meta, (list, tuple)) and len(np_meta) == 4):
        _fail("numpy's state must be [kind, position, has_gauss, cached_gaussian]", file, f"{field}.numpy")
    kind, pos, has_gauss, cached = np_meta
    if kind != "MT19937":
        _fail(f"numpy's generator must be 'MT19937', got {short_repr(kind)}", file, f"{field}.numpy[0]")
    if not _is_int(pos) or not 0 <= pos <= NUMPY_MT_WORDS:
        _fail(f"numpy's position must be an integer in 0..{NUMPY_MT_WORDS}, got {short_repr(pos)}",
              file, f"{field}.numpy[1]")
    if not _is_int(has_gauss) or has_gauss not in (0, 1):
        _fail(f"numpy's has_gauss must be 0 or 1, got {short_repr(has_gauss)}", file, f"{field}.numpy[2]")
    if not _is_number(cached) or not math.isfinite(cached):
        _fail(f"numpy's cached gaussian must be a finite number, got {short_repr(cached)}", file,
              f"{field}.numpy[3]")
    py = meta.get("random")
    if not (isinstance(py, (list, tuple)) and len(py) == 3):
        _fail("random's state must be [version, words, gauss]", file, f"{field}.random")
    version, internal, gauss = py
    if not _is_int(version) or version != RANDOM_STATE_VERSION:
        _fail(f"random's state version must be {RANDOM_STATE_VERSION}, got {short_repr(version)}", file,
              f"{field}.random[0]")
    words = _words(internal, np.uint32, RANDOM_WORDS, file, f"{field}.random[1]", what="random's state")
    if words[-1] > NUMPY_MT_WORDS:
        _fail(f"random's position must be at most {NUMPY_MT_WORDS}, got {int(words[-1])}", file,
              f"{field}.random[1][{RANDOM_WORDS - 1}]")
    if gauss is not None and (not _is_number(gauss) or not math.isfinite(gauss)):
        _fail(f"random's gauss must be null or a finite number, got {short_repr(gauss)}", file,
              f"{field}.random[2]")
    return out, meta


#: Settings of torch's optimizers that are numbers (a tensor for ``lr`` too) and flags (or null), whatever the class.
_GROUP_NUMBERS = frozenset({"lr", "initial_lr", "weight_decay", "momentum", "dampening", "eps", "alpha", "lr_decay",
                            "initial_accumulator_value", "rho", "lambd", "t0", "max_iter", "history_size"})
_GROUP_FLAGS = frozenset({"nesterov", "amsgrad", "maximize", "foreach", "capturable", "differentiable", "fused",
                          "centered", "decoupled_weight_decay"})


def check_optimizer_dict(sd: Any, *, file=None, field: str = "optimizer") -> Mapping:
    """Checks a torch optimizer ``state_dict``'s structure; returns it.

    ``state``: an object keyed by integer parameter ids, each an object keyed
    by strings; ``param_groups``: a list of objects keyed by strings, each
    with ``params`` a list of integers, distinct across the groups, that
    covers every key of ``state``, and torch's usual settings (``lr``,
    ``weight_decay``, ``momentum``, ``eps``..., flags such as ``amsgrad``) of
    their types. :func:`check_like` compares the rest with a live optimizer.
    """
    if not isinstance(sd, Mapping):
        _fail(f"an optimizer state must be an object, got {short_repr(sd)}", file, field)
    groups = sd.get("param_groups")
    if not isinstance(groups, list):
        _fail(f"must be a list of parameter groups, got {short_repr(groups)}", file, f"{field}.param_groups")
    seen = set()
    for i, g in enumerate(groups):
        at = f"{field}.param_groups[{i}]"
        if not isinstance(g, Mapping) or not all(isinstance(k, str) for k in g):
            _fail(f"a parameter group must be an object keyed by strings, got {short_repr(g)}", file, at)
        for key, value in g.items():
            if key in _GROUP_NUMBERS and not (_is_number(value) or type(value).__module__.startswith("torch")):
                _fail(f"must be a number, got {short_repr(value)}", file, f"{at}.{key}")
            if key in _GROUP_FLAGS and value is not None and not isinstance(value, bool):
                _fail(f"must be a bool, got {short_repr(value)}", file, f"{at}.{key}")
        params = g.get("params")
        if not isinstance(params, list):
            _fail(f"must be a list of parameter ids, got {short_repr(params)}", file, f"{at}.params")
        for j, p in enumerate(params):
            if not _is_int(p):
                _fail(f"a parameter id must be an integer, got {short_repr(p)}", file, f"{at}.params[{j}]")
            if p in seen:
                _fail(f"parameter id {p} is in two places", file, f"{at}.params[{j}]")
            seen.add(p)
    state = sd.get("state")
    if not isinstance(state, Mapping):
        _fail(f"must be an object keyed by parameter id, got {short_repr(state)}", file, f"{field}.state")
    for pid, entry in state.items():
        if not _is_int(pid) or pid not in seen:
            _fail(f"{short_repr(pid)} is not the id of a parameter of any group", file, f"{field}.state")
        if not isinstance(entry, Mapping) or not all(isinstance(k, str) for k in entry):
            _fail(f"must be an object keyed by strings, got {short_repr(entry)}", file, f"{field}.state[{pid}]")
    return sd


def _kind(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, (bool, np.bool_)):
        return "a bool"
    if _is_number(v):
        return "a number"
    if isinstance(v, str):
        return "a string"
    if isinstance(v, (list, tuple)):
        return "an array"
    if isinstance(v, Mapping):
        return "an object"
    return f"a {type(v).__qualname__}"


def check_like(value: Any, template: Any, *, file=None, field: str = "state", exact_keys: bool = True,
               exact_lengths: bool = True) -> Any:
    """Checks that ``value`` (a file's state) has the JSON shape of ``template`` (the live object's); returns it.

    Kinds must agree (null, bool, number, string, array, object), except that
    where ``template`` is null anything goes (a value not set yet) and a bool
    may be null. Objects: the same keys (``exact_keys=False``: only the
    common ones are compared), arrays the same length (``exact_lengths=False``:
    only the common prefix), both walked. Iterative.
    """
    work = [(value, template, field)]
    while work:
        v, t, at = work.pop()
        if t is None:
            continue
        vk, tk = _kind(v), _kind(t)
        if vk != tk and not (vk == "null" and tk == "a bool"):
            _fail(f"must be {tk}, got {short_repr(v)}", file, at)
        if tk == "an object":
            if exact_keys and set(v) != set(t):
                extra, missing = sorted(map(str, set(v) - set(t))), sorted(map(str, set(t) - set(v)))
                _fail(f"does not hold the keys this object saves (unexpected {short_repr(extra)}, missing "
                      f"{short_repr(missing)})", file, at)
            work.extend((v[k], t[k], f"{at}.{k}") for k in v if k in t)
        elif tk == "an array":
            if exact_lengths and len(v) != len(t):
                _fail(f"must hold {len(t)} items, got {len(v)}", file, at)
            work.extend((v[i], t[i], f"{at}[{i}]") for i in range(min(len(v), len(t))))
    return value


#: A torch LR scheduler's keys every scheduler of ``torch.optim.lr_scheduler`` saves, and their kinds.
_SCHEDULER_KEYS = {"last_epoch": "integer", "_step_count": "integer", "base_lrs": "numbers", "_last_lr": "numbers"}


def check_scheduler_keys(sd: Any, *, file=None, field: str = "lr_scheduler") -> Mapping:
    """Checks an LR scheduler's state without the live scheduler: an object keyed by strings, without
    ``optimizer``, whose well-known keys (``last_epoch``, ``_step_count``, ``base_lrs``, ``_last_lr``) have
    their types."""
    if not isinstance(sd, Mapping) or not all(isinstance(k, str) for k in sd):
        _fail(f"a scheduler state must be an object keyed by strings, got {short_repr(sd)}", file, field)
    if "optimizer" in sd:  # never saved: loading it would replace the scheduler's optimizer
        _fail("a scheduler state holds no 'optimizer'", file, f"{field}.optimizer")
    for key, kind in _SCHEDULER_KEYS.items():
        if key not in sd:
            continue
        v = sd[key]
        ok = _is_int(v) if kind == "integer" else \
            isinstance(v, (list, tuple)) and all(_is_number(x) for x in v)
        if not ok:
            _fail(f"must be {'an integer' if kind == 'integer' else 'a list of numbers'}, got {short_repr(v)}",
                  file, f"{field}.{key}")
    return sd


#: The parts of a data loader's state that ``tensorlist.huggingface`` saves (``sampler.json``).
_SEEDABLE = {"epoch": 0, "initial_seed": 0}


def check_sampler_state(state: Any, tensors: Mapping, live: Optional[Mapping] = None, *, file=None,
                        field: str = "metadata.state") -> tuple:
    """Checks a data loader's saved state (``tensorlist.huggingface``'s ``sampler.json``); returns it.

    ``state``: an object with ``seedable_sampler`` (``{"epoch", "initial_seed"}``, integers) and
    ``dataloader`` (a stateful loader's state, compared with the live loader's ``live["dataloader"]`` on
    their common keys), both optional; ``tensors``: ``generator``, a torch generator state, optional.
    """
    if not isinstance(state, Mapping) or not set(state) <= {"seedable_sampler", "dataloader"}:
        _fail(f"a sampler state must be an object of 'seedable_sampler' and 'dataloader', got {short_repr(state)}",
              file, field)
    if "seedable_sampler" in state:
        check_like(state["seedable_sampler"], _SEEDABLE, file=file, field=f"{field}.seedable_sampler")
        for k, v in state["seedable_sampler"].items():
            if not _is_int(v):
                _fail(f"must be an integer, got {short_repr(v)}", file, f"{field}.seedable_sampler.{k}")
    if "dataloader" in state:
        template = (live or {}).get("dataloader")
        check_like(state["dataloader"], {} if template is None else template, file=file, field=f"{field}.dataloader",
                   exact_keys=False, exact_lengths=False)
    out = dict(tensors)
    if "generator" in tensors:
        out["generator"] = check_generator_state(tensors["generator"], file=file, field="tensors.generator")
    return state, out


def check_lightning_states(checkpoint: Any, *, file=None) -> Any:
    """Checks the states Lightning restores from a checkpoint dict; returns it.

    ``epoch`` and ``global_step`` integers; ``optimizer_states`` a list of
    optimizer state dicts (:func:`check_optimizer_dict`); ``lr_schedulers`` a
    list of scheduler states (:func:`check_scheduler_keys`); ``loops`` and
    ``callbacks`` objects. Each optional, as in a weights-only checkpoint.
    """
    if not isinstance(checkpoint, Mapping):
        return checkpoint
    for key in ("epoch", "global_step"):
        if key in checkpoint and not _is_int(checkpoint[key]):
            _fail(f"must be an integer, got {short_repr(checkpoint[key])}", file, key)
    for key in ("loops", "callbacks"):
        if key in checkpoint and not isinstance(checkpoint[key], Mapping):
            _fail(f"must be an object, got {short_repr(checkpoint[key])}", file, key)
    for key, check in (("optimizer_states", check_optimizer_dict), ("lr_schedulers", check_scheduler_keys)):
        if key not in checkpoint:
            continue
        if not isinstance(checkpoint[key], list):
            _fail(f"must be a list, got {short_repr(checkpoint[key])}", file, key)
        for i, sd in enumerate(checkpoint[key]):
            check(sd, file=file, field=f"{key}[{i}]")
    return checkpoint
