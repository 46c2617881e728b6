"""The torch source: ``.pt``/``.pth``/``.bin``/``.ckpt`` files, read with ``torch.load(weights_only=True)``.

torch (and ``tensorlist._bridges.torch``, the only torch <-> numpy conversion)
is imported when a torch file is read, never when the package is. The file is
hostile input: its zip records are sized before ``torch.load`` expands them,
whatever ``torch.load`` raises is a FormatError, and the loaded object is
walked without recursion, bounded in depth and in size.
"""
from __future__ import annotations

import os
import zipfile
from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from tensorlist._base import dtypes
from tensorlist._base.jsonio import MAX_DEPTH
from tensorlist.errors import FormatError
from tensorlist.format import Limits, open_regular, short_repr
from tensorlist.convert.formats import Entry, Source, check_shape, expansion_cap, row_of

__all__ = ["open_pt"]


def open_pt(path: str, limits: Limits = Limits()) -> Source:
    """A torch file's tensors, loaded with ``weights_only=True`` (and ``mmap=True`` where it can).

    Hostile input: a zip whose records expand past the cap is refused before
    ``torch.load`` expands them; whatever ``torch.load`` raises (bad zip,
    broken sparse invariants, a pickle it refuses) is a FormatError naming the
    file; the loaded object is walked iteratively, at most ``MAX_DEPTH`` deep
    and ``max_tensors`` entries wide, so a 3,000-deep or self-holding object is
    refused, not a RecursionError; each tensor is refused or converted by the
    torch bridge, each number must fit 64 bits, each shape obeys tensorlist's
    dims rules.
    """
    try:
        import torch
    except ImportError as e:
        raise ImportError("reading torch files needs torch: pip install 'tensorlist[torch]'") from e
    from tensorlist._bridges.torch import to_numpy

    # torch.load maps the file by name: check it is a regular file first (a FIFO would block the open)
    with os.fdopen(open_regular(path, what="torch file"), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        _check_pt_records(f, path, expansion_cap(size, limits.max_total_bytes))

    def _load(use_mmap):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=use_mmap)

    try:
        try:
            obj = _load(True)
        except RuntimeError as e:
            if "mmap" not in str(e) and "zip" not in str(e):
                raise
            obj = _load(False)  # the legacy (pre-1.6) format cannot be mapped
    except FileNotFoundError:
        raise
    except Exception as e:  # pickle.UnpicklingError, RuntimeError, RecursionError and friends
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if "weights_only" in str(e) or "Unsupported global" in str(e) or type(e).__name__ == "UnpicklingError":
            raise FormatError("refused: it holds Python objects other than tensors, and loading it would run "
                              f"arbitrary code (torch.load weights_only=True said: {msg})", file=path) from None
        raise FormatError(f"is not a readable torch file: {type(e).__name__}: {msg}", file=path) from None

    def tensor(v, i: int, name: str) -> np.ndarray:
        where = f"tensor {name!r}"
        try:
            return to_numpy(v, where, bits=True)  # bfloat16/float8 as carriers: bytes moved, no ml_dtypes
        except TypeError as e:  # sparse, quantized, meta: the bridge says why, the file is named here
            why = str(e)[len(where) + 2:] if str(e).startswith(where + ": ") else str(e)
            raise FormatError(why, file=path, tensor_index=i, tensor_name=name) from e

    entries: List[Entry] = []
    named = True
    if isinstance(obj, torch.Tensor):
        obj, named = [obj], False
    elif isinstance(obj, (list, tuple)) and all(isinstance(v, torch.Tensor) for v in obj):
        named = False
    for i, (name, v) in enumerate(_flatten(obj, path, limits.max_tensors)):
        if isinstance(v, torch.Tensor):
            if v.is_nested:  # no single shape (torch raises on .shape): nothing the bridge can take
                raise FormatError("a nested tensor has no single shape to store: store its components "
                                  "(unbind()) or to_padded_tensor()", file=path, tensor_index=i, tensor_name=name)
            if v.layout != torch.strided or v.is_quantized or v.is_meta:
                tensor(v, i, name)  # no plain bytes: refused now, in the bridge's words
            try:
                row = dtypes.from_name(str(v.dtype).replace("torch.", ""))
            except KeyError:
                raise FormatError(f"torch dtype {v.dtype} has no tensorlist dataType code", file=path,
                                  tensor_index=i, tensor_name=name, field="dtype") from None
            check_shape(list(v.shape), row, file=path, index=i, name=name)
            entries.append(Entry(name, row, tuple(v.shape), (lambda v=v, i=i, name=name: tensor(v, i, name))))
        else:
            arr = _pt_number(v, path, i, name)
            row = row_of(arr.dtype, path, name, i)
            check_shape(list(arr.shape), row, file=path, index=i, name=name)
            entries.append(Entry(name, row, arr.shape, (lambda arr=arr: arr)))
    return Source(path, "pt", entries, named, None, disk_bytes=size)


def _check_pt_records(f, path: str, cap: Optional[int]) -> None:
    """Refuses a zip-format torch file whose records would expand past ``cap``, before loading it."""
    if cap is None or not zipfile.is_zipfile(f):
        return
    f.seek(0)
    try:
        with zipfile.ZipFile(f) as z:
            total = sum(i.file_size for i in z.infolist())
    except (zipfile.BadZipFile, OSError, ValueError) as e:
        raise FormatError(f"is not a readable torch file: {e}", file=path) from e
    if total > cap:
        raise FormatError(f"its records expand to {total} bytes, above the limit of {cap} (a compressed "
                          "archive or a zip bomb): raise it with max_total_bytes=", file=path)


def _pt_number(v, path: str, i: int, name: str) -> np.ndarray:
    """A number of a torch checkpoint (``"epoch": 3``) as a 0-d array; a FormatError past 64 bits."""
    if type(v) is int and not -(1 << 63) <= v < (1 << 64):
        raise FormatError(f"the integer {short_repr(v)} does not fit 64 bits", file=path, tensor_index=i,
                          tensor_name=name)
    arr = np.asarray(v)
    if arr.dtype.hasobject:
        raise FormatError(f"holds {short_repr(v)}, which is not a number that fits a dtype", file=path,
                          tensor_index=i, tensor_name=name)
    return arr


def _children(v) -> list:
    return list(v.values()) if isinstance(v, dict) else list(v) if isinstance(v, (list, tuple)) else []


def _expanded_size(obj, path: str, max_entries: int) -> None:
    """Refuses an object whose walk would visit more than about ``max_entries`` values, or that holds itself.

    A pickle can hold one list twice in a list, 60 times over (2**60 values in
    a few hundred bytes), or hold itself: the counts are computed once per
    container (depth first, without recursion), so this costs what the file
    holds, and a container reached again on its own path is a cycle. Leaves
    (tensors, numbers, empty containers) are held to ``max_entries``; all
    visits, containers included, to twice that (a state_dict has fewer
    containers than tensors), plus ``MAX_DEPTH``.
    """
    cap = max_entries + 1
    sizes: Dict[int, Tuple[int, int]] = {}  # id -> (leaves, visits), each capped
    on_path = set()
    stack: List[Tuple[Any, bool]] = [(obj, False)]
    while stack:
        v, done = stack.pop()
        kids = _children(v)
        i = id(v)
        if done:
            on_path.discard(i)
            leaves, visits = 0, 1
            for c in kids:
                cl, cv = sizes.get(id(c), (1, 1))
                leaves, visits = min(cap, leaves + cl), min(2 * cap + MAX_DEPTH, visits + cv)
            sizes[i] = (leaves, visits)
            continue
        if i in sizes:
            continue
        if i in on_path:
            raise FormatError("holds itself (a container inside its own contents)", file=path)
        if not kids:
            sizes[i] = (1, 1)
            continue
        on_path.add(i)
        stack.append((v, True))
        stack.extend((c, False) for c in kids if isinstance(c, (dict, list, tuple)) and id(c) not in sizes)
    leaves, visits = sizes.get(id(obj), (1, 1))
    if leaves > max_entries or visits > 2 * max_entries + MAX_DEPTH:
        raise FormatError(f"holds more than {max_entries} values once its shared containers are expanded "
                          "(raise it with max_tensors=)", file=path)


def _flatten(obj, path: str, max_entries: int) -> List[Tuple[str, Any]]:
    """``[(dotted name, tensor or number)]`` of a loaded checkpoint, in order, walked without recursion.

    Nesting past ``MAX_DEPTH``, a cycle, more than ``max_entries`` values (see
    :func:`_expanded_size`), a value that is not a tensor, a number or a
    container, and two values under one name (``{"a.b": x, "a": {"b": y}}``)
    are FormatErrors naming the file and where.
    """
    import torch

    _expanded_size(obj, path, max_entries)
    out: List[Tuple[str, Any]] = []
    seen: Dict[str, int] = {}
    stack: List[Tuple[Any, str, int]] = [(obj, "", 0)]
    while stack:
        v, prefix, depth = stack.pop()
        if isinstance(v, (torch.Tensor, np.ndarray, np.generic)) or type(v) in (int, float, bool):
            name = prefix or "0"
            if name in seen:
                raise FormatError(f"two values are named {name!r} once nested keys are joined with '.'",
                                  file=path, tensor_index=len(out), tensor_name=name)
            try:
                name.encode("utf-8")
            except UnicodeEncodeError:
                raise FormatError(f"the name {short_repr(name)} is not valid Unicode (a lone surrogate)",
                                  file=path, tensor_index=len(out)) from None
            seen[name] = len(out)
            out.append((name, v))
            continue
        if isinstance(v, dict):
            children = [(f"{prefix}.{k}" if prefix else str(k), c) for k, c in v.items()]
        elif isinstance(v, (list, tuple)):
            children = [(f"{prefix}.{k}" if prefix else str(k), c) for k, c in enumerate(v)]
        else:
            raise FormatError(f"holds a {type(v).__name__} at {prefix or '/'!r}, which is not a tensor or a number; "
                              "save the state_dict alone to convert it", file=path)
        if depth + 1 > MAX_DEPTH:
            raise FormatError(f"nests deeper than {MAX_DEPTH} levels at {short_repr(prefix)}", file=path)
        stack.extend((c, name, depth + 1) for name, c in reversed(children))
    return out
