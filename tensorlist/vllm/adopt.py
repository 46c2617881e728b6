"""At one rank, parameters take the shards' mapped pages instead of copies of them.

vLLM's weight loaders copy each weight into its parameter. At one rank, unquantized, a parameter
of vLLM's own loaders (``LOADERS``, ``FUSED``) that owns its storage is instead made a view of the
copy-on-write mapping (its bytes are the copy's; a write stays private), and its never-touched
memory is freed unfaulted:

* given the whole of a weight (no shard id): it views that weight;
* a fused parameter (``qkv_proj``, ``gate_up_proj``) given its first part, when the parts could
  lie back to back after it in the shard: it views that run tentatively; each later part, in
  order, is only checked to be the bytes already in place (same address, same rows). A part found
  anywhere else undoes it before anything is written: the parts so far are copied into memory of
  the parameter's own, and the loader runs as it would have.

Every other call goes to the loader as it is. Imports vLLM and torch.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Dict, Iterator, List, Optional, Set, Tuple

import numpy as np
import torch

__all__ = ["Adoption", "adopting"]


def _loaders() -> Tuple[tuple, tuple]:
    """vLLM's loaders that copy a whole weight into a whole parameter at one rank; those of fused parameters."""
    from vllm.model_executor.layers.linear import (ColumnParallelLinear, MergedColumnParallelLinear,
                                                   QKVParallelLinear, ReplicatedLinear, RowParallelLinear)
    from vllm.model_executor.layers.vocab_parallel_embedding import VocabParallelEmbedding
    from vllm.model_executor.model_loader.weight_utils import default_weight_loader

    whole = (default_weight_loader, ReplicatedLinear.weight_loader, ColumnParallelLinear.weight_loader,
             ColumnParallelLinear.weight_loader_v2, RowParallelLinear.weight_loader,
             RowParallelLinear.weight_loader_v2, VocabParallelEmbedding.weight_loader)
    fused = (QKVParallelLinear.weight_loader, QKVParallelLinear.weight_loader_v2,
             MergedColumnParallelLinear.weight_loader, MergedColumnParallelLinear.weight_loader_v2)
    return whole, fused


def _param_types() -> tuple:
    from vllm.model_executor.parameter import ModelWeightParameter

    return torch.nn.Parameter, ModelWeightParameter


def _owns(param: torch.Tensor) -> bool:
    """The parameter is the whole of its own storage (so taking another frees it)."""
    return (param.is_contiguous() and param.data_ptr() == param.untyped_storage().data_ptr()
            and param.untyped_storage().nbytes() == param.nbytes)


def _part_index(shard_id, parts: int) -> Optional[int]:
    if isinstance(shard_id, int) and not isinstance(shard_id, bool) and 0 <= shard_id < parts:
        return shard_id
    if parts == 3 and shard_id in ("q", "k", "v"):
        return "qkv".index(shard_id)
    return None


def _span(first: torch.Tensor, shape: torch.Size) -> torch.Tensor:
    """A view of ``shape`` starting at ``first``'s first byte (the caller checked it stays in the mapping)."""
    nbytes = int(np.prod(shape)) * first.element_size()
    raw = first.reshape(-1).view(torch.uint8).numpy()
    run = np.lib.stride_tricks.as_strided(raw, shape=(nbytes,), strides=(1,))
    return torch.from_numpy(run).view(first.dtype).view(shape)


class _Fused:
    """A fused parameter viewing its first part, waiting for the others in order."""

    def __init__(self, view: torch.Tensor, start: int, sizes: List[int], row_bytes: int):
        self.view, self.start, self.sizes, self.row_bytes, self.next = view, start, sizes, row_bytes, 1

    def expects(self, k: int, address: int) -> bool:
        return k == self.next and address == self.start + sum(self.sizes[:k]) * self.row_bytes


class Adoption:
    """One load's adoptions; ``adopted`` lists the tensors taken uncopied.

    ``region()`` gives ``(address, length)`` of the mapped region of the shard being read.
    """

    def __init__(self, region: Callable[[], Tuple[int, int]]):
        self.adopted: List[torch.Tensor] = []
        self.region = region
        self._fused: Dict[int, _Fused] = {}
        self._copied: Set[int] = set()  # parameters a loader already wrote into

    def loader(self, loader, fused: bool):
        def weight_loader(param, loaded, *args, **kwargs):
            if (not kwargs and isinstance(loaded, torch.Tensor) and loaded.dtype == param.dtype
                    and loaded.device == param.device and loaded.is_contiguous()
                    and not getattr(param, "is_sharded_weight", False)):
                if not args and loaded.shape == param.shape and id(param) not in self._fused and _owns(param):
                    param.data = loaded
                    self.adopted.append(loaded)
                    return None
                if fused and len(args) == 1 and self._part(loader, param, loaded, args[0]):
                    return None
            self._undo(param)
            self._copied.add(id(param))
            return loader(param, loaded, *args, **kwargs)

        return weight_loader

    def _part(self, loader, param: torch.Tensor, loaded: torch.Tensor, shard_id) -> bool:
        """Whether part ``shard_id`` of a fused parameter is taken (its first) or found in place (a later one)."""
        sizes = list(getattr(getattr(loader, "__self__", None), "output_sizes", None) or ())
        k = _part_index(shard_id, len(sizes))
        if (k is None or getattr(param, "output_dim", None) != 0 or param.dim() < 1
                or loaded.shape != (sizes[k], *param.shape[1:]) or sum(sizes) != param.shape[0]):
            return False
        pending = self._fused.get(id(param))
        if pending is not None:
            if not pending.expects(k, loaded.data_ptr()):
                return False
            pending.next += 1
            if pending.next == len(sizes):
                del self._fused[id(param)]
            return True
        base, length = self.region()
        start = loaded.data_ptr()
        if k or id(param) in self._copied or not _owns(param) or not (
                base <= start and start + param.nbytes <= base + length):
            return False
        view = _span(loaded, param.shape)
        param.data = view
        self._fused[id(param)] = _Fused(view, start, sizes, param.nbytes // param.shape[0])
        self.adopted.append(view)
        return True

    def _undo(self, param: torch.Tensor) -> None:
        """A fused parameter given a part out of place: the parts in place copied into memory of its own."""
        pending = self._fused.pop(id(param), None)
        if pending is None:
            return
        own = torch.empty(param.shape, dtype=param.dtype)
        rows = sum(pending.sizes[:pending.next])
        own[:rows].copy_(pending.view[:rows])
        param.data = own
        self.adopted = [t for t in self.adopted if t is not pending.view]


@contextlib.contextmanager
def adopting(model: torch.nn.Module, on: bool, region: Callable[[], Tuple[int, int]]) -> Iterator[Adoption]:
    """While loading (``on``), the parameters of vLLM's loaders adopt what they are given (module docstring)."""
    adoption = Adoption(region)
    if not on:
        yield adoption
        return
    whole, fused = _loaders()
    types = _param_types()
    saved = []
    for param in model.parameters():
        wl = getattr(param, "weight_loader", None)
        func = getattr(wl, "__func__", wl)
        if type(param) in types and param.device.type == "cpu" and (wl is None or func in whole or func in fused):
            saved.append((param, wl))
            param.weight_loader = adoption.loader(wl or whole[0], fused=func in fused)
    try:
        yield adoption
    finally:
        for param, wl in saved:
            if wl is None:
                del param.weight_loader
            else:
                param.weight_loader = wl
