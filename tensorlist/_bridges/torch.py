"""The only torch <-> numpy conversion of the package (a leaf: imports torch, ``dtypes``, ``errors``).

numpy cannot hold torch's bfloat16/float8 tensors directly (``Tensor.numpy()``
refuses them), so they cross as a byte view, shared, never converted: re-typed
with ml_dtypes for a caller who wants numpy values (``to_numpy``), or, on the
package's own save and load paths, as a *bit carrier* (``dtypes.bits_row``:
the same-size unsigned integer, tagged with the dtype), so that a torch
program never imports ml_dtypes (0.5 to 2 s) for types torch holds itself.
Every module that meets
a torch tensor (the writer, the adapters, the record's hash, the converters)
converts through here, so every path resolves and refuses the same tensors:

- conjugate and negative views (``t.conj()``, ``torch._neg_view``) are
  resolved: the values are saved, not the lazy bit;
- sparse (COO, CSR, ...), nested, meta-device and quantized tensors have no
  plain bytes to save and are refused with a TypeError naming the tensor, as
  safetensors does for sparse tensors.
"""
from __future__ import annotations

import warnings
from typing import Dict, Mapping, Optional

import numpy as np
import torch

from tensorlist._base import dtypes

__all__ = ["to_numpy", "from_numpy", "from_numpy_all", "torch_dtype", "state_to_numpy", "is_tensor"]


#: The integer dtype of each item size: a carried type's bits are moved and copied as these.
_SAME_SIZE_INT = {1: torch.uint8, 2: torch.int16}


def is_tensor(value) -> bool:
    return isinstance(value, torch.Tensor)


def torch_dtype(code_or_name) -> torch.dtype:
    """The torch dtype of a tensorlist dtype code or canonical name."""
    row = dtypes.from_code(code_or_name) if isinstance(code_or_name, int) else dtypes.from_name(code_or_name)
    if row is None:
        raise ValueError(f"unknown dtype code {code_or_name!r}")
    return getattr(torch, row.name)


def _refusal(t: torch.Tensor) -> Optional[str]:
    if t.is_nested:
        return "a nested tensor has no single shape to store: store its components (t.unbind()) instead"
    if t.layout != torch.strided:
        return f"a sparse tensor ({t.layout}) has no dense bytes to store: call .to_dense() first"
    if t.is_quantized:
        return (f"a quantized tensor ({t.dtype}) cannot be stored: call .dequantize() first "
                "(or store int_repr() and its scales)")
    if t.device.type == "meta":
        return "a tensor on the meta device has no data to store"
    return None


def to_numpy(t: torch.Tensor, where: str = "tensor", *, bits: bool = False) -> np.ndarray:
    """A numpy array with the tensor's dtype (bfloat16/float8 via ml_dtypes) and values.

    Zero-copy for a contiguous CPU tensor; a GPU tensor is copied to host
    memory (one tensor at a time), a non-contiguous one made contiguous, a
    conjugate or negative view resolved. With ``bits``, a bfloat16/float8
    tensor comes back as its bit carrier (``DType.bits``: uint16/uint8 tagged
    with the dtype, which every writer stores as that dtype) and ml_dtypes is
    not imported.

    Raises:
        TypeError: not a torch tensor (a numpy array or a number in a
            state_dict), a sparse, quantized or meta tensor, or a dtype
            tensorlist has no code for (naming ``where``).
    """
    if not isinstance(t, torch.Tensor):  # else an AttributeError of _refusal's, naming nothing
        raise TypeError(f"{where}: expected a torch.Tensor, got {type(t).__name__}")
    why = _refusal(t)
    if why is not None:
        raise TypeError(f"{where}: {why}")
    t = t.detach()
    name = str(t.dtype).removeprefix("torch.")
    try:
        row = dtypes.from_name(name)
    except KeyError:
        raise TypeError(f"{where}: torch dtype {t.dtype} has no tensorlist dataType code") from None
    if row.carried:  # bfloat16, float8, float4_e2m1fn_x2: numpy has no such type
        shape = tuple(t.shape)
        dt = (row.bits if bits else row.numpy).newbyteorder("=")  # torch's memory is in the host's order
        if t.numel() == 0:  # torch refuses dtype views of some empty tensors
            return np.empty(shape, dt)
        # moved and made contiguous as same-size integers: torch 2.8 has no copy kernel for float4_e2m1fn_x2
        t = t.view(_SAME_SIZE_INT[row.itemsize])
        t = t.cpu() if t.device.type != "cpu" else t
        t = t if t.is_contiguous() else t.contiguous()
        return t.reshape(-1).view(torch.uint8).numpy().view(dt).reshape(shape)
    if t.device.type != "cpu":
        t = t.cpu()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.numpy()


def from_numpy(a: np.ndarray, device: Optional[torch.device] = None) -> torch.Tensor:
    """A tensor sharing ``a``'s memory (CPU), or copied to ``device``.

    ``a`` may be a bit carrier (``DType.bits``): it becomes a tensor of the
    dtype it carries. Read-only arrays (memory-mapped loads) become tensors
    that must not be written to; torch has no read-only tensors, so its warning about it is
    silenced here and the rule is the caller's.
    """
    if a.flags.writeable:
        t = _shared(a)
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # see _shared
            t = _shared(a)
    return t.to(device) if device is not None else t


def from_numpy_all(arrays: Mapping[str, np.ndarray]) -> Dict[str, torch.Tensor]:
    """:func:`from_numpy` of every array of a load (CPU), under one warnings filter rather than one each."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # see _shared
        return {k: _shared(a) for k, a in arrays.items()}


def _shared(a: np.ndarray) -> torch.Tensor:
    """The CPU tensor over ``a``'s memory (a carrier re-typed), or over a native-order copy of a swapped ``a``.

    Callers run it with UserWarning ignored: the one torch gives here is "The given NumPy array is not
    writable" (a read-only mapping), and filtering by that message instead would compile a pattern in
    every process's first load (0.1 ms).
    """
    row = dtypes.from_numpy(a.dtype)
    if not a.dtype.isnative and a.dtype.itemsize > 1:
        a = a.astype(a.dtype.newbyteorder("="))
    if not row.carried:
        return torch.from_numpy(a)
    if a.size and a.flags.c_contiguous:  # a load's views: re-typed in place as the same-size integer (uint16...)
        return torch.from_numpy(a if a.dtype.kind == "u" else a.view(row.bits)).view(getattr(torch, row.name))
    t = torch.from_numpy(np.ascontiguousarray(a).reshape(-1).view(np.uint8))  # fresh contiguous strides
    return t.view(getattr(torch, row.name)).reshape(a.shape)


def state_to_numpy(state: Dict[str, torch.Tensor], *, bits: bool = False) -> Dict[str, np.ndarray]:
    """A state_dict's tensors as numpy arrays (zero-copy on CPU), each refused or converted by name.

    ``bits``: bfloat16/float8 as bit carriers (see :func:`to_numpy`), for saving.
    """
    return {k: to_numpy(v, f"tensor {k!r}", bits=bits) for k, v in state.items()}
