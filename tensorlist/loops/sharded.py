"""Sharded checkpoints: the loops' checkpoint saved and loaded through torch.distributed.checkpoint (DCP).

With ``checkpoint_format="sharded"`` a loop writes its checkpoint with
``dcp.save`` and :class:`tensorlist.dcp.TensorListWriter` instead of one
document from rank 0. Every rank calls :meth:`ShardedCheckpoint.save`:

- the module's and the optimizer's state come from DCP's
  ``get_model_state_dict``/``get_optimizer_state_dict``, so DTensor (FSDP2)
  shards are written by the ranks that hold them, and replicated state
  (plain DDP) is written once, spread over the ranks by DCP's planner;
- the min-validation snapshot and the SWA average go in the same save;
- rank 0 adds the loop state (``loops.checkpoint``'s document without its
  tensors, JSON text), each rank its generator states (``rng.<rank>``).

The save commits when the coordinator writes the metadata file, last (see
``tensorlist.dcp``): a rank killed before that leaves the previous checkpoint
in the directory whole. The layout is ``loops.checkpoint``'s module docstring.

Loading (:meth:`ShardedCheckpoint.check`, then :meth:`~ShardedCheckpoint.load`
and :meth:`~ShardedCheckpoint.load_averaged`) reshards to the process count
and the model's layout now: a checkpoint saved on 2 processes resumes on 1 or
3. Each rank takes the generator states saved under its rank; a rank that has
none (the run grew) takes rank 0's, as every rank of a fresh run starts from
the same ``seed``.

Imports torch (``torch.distributed.checkpoint``), ``dcp``, ``dcp``,
``torch`` (the adapters) and ``loops.checkpoint``, ``loops.state``.
"""
from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Dict, List, Mapping, Optional

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                     set_model_state_dict, set_optimizer_state_dict)

from tensorlist.dcp import TensorListReader, TensorListWriter
from tensorlist.dcp import Checkpoint, Shards
from tensorlist.torch import module_state
from tensorlist.loops.checkpoint import SHARDED_KEYS, loop_state_text, rng_key, rng_text
from tensorlist.loops.state import rng_state_json, set_rng_state_json

__all__ = ["ShardedCheckpoint", "process_rank", "world_size", "restore_rng"]


def process_rank() -> int:
    """This process's rank in the default process group (0 without one)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def world_size() -> int:
    """The default process group's size (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def restore_rng(rng_by_rank: Mapping[int, Any]) -> None:
    """Sets this rank's generators from a sharded checkpoint's states: its own, else rank 0's."""
    state = rng_by_rank.get(process_rank())
    if state is None:
        state = rng_by_rank.get(0)
    if state is None:
        raise ValueError("the sharded checkpoint holds no generator states (no 'rng.0' entry)")
    set_rng_state_json(state)


def _no_dist() -> bool:
    """DCP's ``no_dist``: a process without a process group saves and loads alone."""
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _alone_is_meant():
    """Silences DCP's warning, at every save and load without a process group, that it assumes one process:
    a run without one is one process by design here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield


def _shape(v) -> tuple:
    return tuple(v.shape)  # a DTensor's shape is the global one, as DCP records it


def _param_names(module: torch.nn.Module) -> Dict[int, str]:
    return {id(p): name for name, p in module.named_parameters(remove_duplicate=False)}


class ShardedCheckpoint:
    """One run's sharded checkpoint directory: its writer, and the checks and loads of a resume.

    Args:
        path: the checkpoint directory.
    """

    def __init__(self, path, *, encryption_key=None):
        self.path = os.fspath(path)
        self.encryption_key = encryption_key  # every shard encrypted with it, and read with it
        self._writer: Optional[TensorListWriter] = None

    # --- saving ------------------------------------------------------------------
    def save(self, *, module: torch.nn.Module, optimizer, loop_state: Optional[Mapping],
             min_model: Optional[Mapping[str, torch.Tensor]] = None,
             averaged: Optional[torch.nn.Module] = None) -> None:
        """Saves the checkpoint (collective: every rank calls it; the checkpoint is committed when it returns).

        Args:
            module: the unwrapped module (an FSDP2 module as it is).
            optimizer: its optimizer.
            loop_state: the loop document (tensors as ``dcp_ref``), given on
                rank 0 (ignored elsewhere).
            min_model: the min-validation snapshot, if the run has one.
            averaged: the SWA average's module, when it holds averaged weights.
        """
        k = SHARDED_KEYS
        sd: Dict[str, Any] = {k["model"]: get_model_state_dict(module),
                              k["optimizer"]: get_optimizer_state_dict(module, optimizer),
                              rng_key(process_rank()): rng_text(rng_state_json())}
        if process_rank() == 0:
            sd[k["loop"]] = loop_state_text(loop_state)
        if min_model is not None:
            sd[k["min_model"]] = dict(min_model)
        if averaged is not None:
            sd[k["averaged"]] = module_state(averaged)
        if self._writer is None:
            self._writer = TensorListWriter(self.path, encryption_key=self.encryption_key)
        with _alone_is_meant():
            dcp.save(sd, storage_writer=self._writer, no_dist=_no_dist())

    def wait(self) -> None:
        """Waits until the files of the checkpoints the last save replaced are deleted."""
        if self._writer is not None:
            self._writer.wait()

    # --- checking, before anything is loaded -----------------------------------------
    def check(self, ckpt: Checkpoint, module: torch.nn.Module, optimizer, *, min_model: bool,
              averaged: bool) -> None:
        """Refuses, touching nothing, a checkpoint whose tensors are not ``module``'s and ``optimizer``'s.

        Compares the saved names and global shapes with the module's (both
        ways), and the optimizer's groups (their parameters by name, their
        settings) and state shapes with the optimizer's, as the document
        checkpoint's resume does.

        Raises:
            ValueError: naming what differs.
        """
        own = {name: _shape(v) for name, v in module.state_dict().items() if isinstance(v, torch.Tensor)}
        parts = [("model", "")]
        if min_model:
            parts.append(("min_model", " (minValidationLossModel)"))
        if averaged:
            parts.append(("averaged", " (averagedModels)"))
        for what, label in parts:
            self._check_model(ckpt, SHARDED_KEYS[what] + ".", own, label)
        self._check_optimizer(ckpt, module, optimizer)

    def _check_model(self, ckpt: Checkpoint, prefix: str, own: Mapping[str, tuple], label: str) -> None:
        saved = {fqn[len(prefix):]: (None if t is None else tuple(t.size))
                 for fqn, t in ckpt.entries.items() if fqn.startswith(prefix)}
        missing = [n for n in own if n not in saved]
        unexpected = [n for n in saved if n not in own and saved[n] is not None]
        wrong = [f"{n}: checkpoint {list(saved[n])} vs model {list(own[n])}" for n in own
                 if saved.get(n) is not None and saved[n] != own[n]]
        if missing or unexpected or wrong:
            raise ValueError(f"{self.path}{label}: the checkpoint holds another model (missing {missing}, "
                             f"unexpected {unexpected}, wrong shapes {wrong})")

    def _check_optimizer(self, ckpt: Checkpoint, module: torch.nn.Module, optimizer) -> None:
        prefix = SHARDED_KEYS["optimizer"] + "."
        where = f"{self.path} (optimizer)"
        names = _param_names(module)
        groups = optimizer.param_groups
        saved_groups: List[Dict[str, Any]] = []
        with Shards(self.path, mmap=False, key=self.encryption_key) as shards:
            i = 0
            while (f"{prefix}param_groups.{i}.params", None) in ckpt.storage:
                g_prefix = f"{prefix}param_groups.{i}."
                keys = {fqn[len(g_prefix):] for fqn in ckpt.entries if fqn.startswith(g_prefix)}
                saved_groups.append({"keys": keys, "params": shards.value(ckpt.storage[(g_prefix + "params", None)])})
                i += 1
        if len(saved_groups) != len(groups):
            raise ValueError(f"{where}: {len(saved_groups)} parameter groups saved, the optimizer has {len(groups)}")
        params = {}
        for i, (g, s) in enumerate(zip(groups, saved_groups)):
            own = [names.get(id(p), "?") for p in g["params"]]
            if list(s["params"]) != own:
                raise ValueError(f"{where}: group {i} saved with parameters {list(s['params'])}, the optimizer has "
                                 f"{own}")
            missing = set(g) - s["keys"] - {"params"}
            if missing:
                raise ValueError(f"{where}: group {i} lacks settings {sorted(missing)} of "
                                 f"{type(optimizer).__name__}: saved by another optimizer class?")
            params.update({n: p for n, p in zip(own, g["params"])})
        s_prefix = f"{prefix}state."
        for fqn, t in ckpt.entries.items():
            # optim.state.<parameter name>.<key>: the keys (exp_avg, step...) have no dots, the names may
            name, _, key = fqn[len(s_prefix):].rpartition(".")
            if not fqn.startswith(s_prefix) or name not in params or t is None or key == "step" or not t.size:
                continue
            if tuple(t.size) != _shape(params[name]):
                raise ValueError(f"{where}: state {key!r} of parameter {name!r} has shape {list(t.size)}, "
                                 f"the parameter {list(_shape(params[name]))}")

    # --- loading (collective) -------------------------------------------------------------
    def load(self, module: torch.nn.Module, optimizer, *, min_model: bool) -> Optional[Dict[str, torch.Tensor]]:
        """Loads the module's and the optimizer's state in place; returns the min-validation snapshot if asked.

        Collective: every rank calls it. DCP reshards each tensor to this
        run's layout (plain tensors, or the module's DTensor placements).
        """
        k = SHARDED_KEYS
        sd: Dict[str, Any] = {k["model"]: get_model_state_dict(module),
                              k["optimizer"]: get_optimizer_state_dict(module, optimizer)}
        if min_model:
            sd[k["min_model"]] = {n: v.clone() for n, v in module_state(module).items()}
        with _alone_is_meant():
            dcp.load(sd, storage_reader=self._reader(), no_dist=_no_dist())
        set_model_state_dict(module, sd[k["model"]])
        set_optimizer_state_dict(module, optimizer, sd[k["optimizer"]])
        return sd.get(k["min_model"])

    def _reader(self) -> TensorListReader:
        return TensorListReader(self.path, encryption_key=self.encryption_key)

    def load_averaged(self, averaged: torch.nn.Module) -> None:
        """Loads the SWA average's weights into ``averaged`` (collective)."""
        sd = {SHARDED_KEYS["averaged"]: {n: v.clone() for n, v in module_state(averaged).items()}}
        with _alone_is_meant():
            dcp.load(sd, storage_reader=self._reader(), no_dist=_no_dist())
        averaged.load_state_dict(sd[SHARDED_KEYS["averaged"]])
