"""The torch entry points of tests/encryption/test_tamper.py: state files, a loop checkpoint, a DCP shard.

``register(subject, Target, tensors)`` adds them through the tamper test's
own registry; the tamper test calls it only where torch imports. Each
``make`` writes tensors "a", "b", "c" encrypted the way the entry point's
users do; each ``read`` reads every tensor back with the key.
"""
import os
import warnings

import torch

from tensorlist.dcp import TensorListWriter, read_full
from tensorlist.loops import read_checkpoint
from tensorlist.loops.checkpoint import write_checkpoint
from tensorlist.torch import load_module_state, load_state, save_module_state
from tensorlist.writer import Tensors


def _torch_state(tensors, seed):
    return {k: torch.from_numpy(v.copy()) for k, v in tensors(seed).items()}


class _Module(torch.nn.Module):
    """A module whose state is the tamper test's tensors (their shapes and dtypes)."""

    def __init__(self, state):
        super().__init__()
        for k, v in state.items():
            self.register_buffer(k, torch.zeros_like(v))


def register(subject, Target, tensors):
    def state_file(d, key, seed):
        path = os.path.join(d, "state.json")
        save_module_state(path, _torch_state(tensors, seed), metadata={"owner": "lab"}, key=key)
        return Target(path)

    def module_read(t, key):
        return load_module_state(t.path, _Module(_torch_state(tensors, 0)), key=key)

    def loop_checkpoint(d, key, seed):
        path = os.path.join(d, "checkpoint.json")
        write_checkpoint(path, {"type": "SimpleLoopState", "model": Tensors(tensors(seed), metadata={"owner": "lab"}),
                                "optimizer": Tensors({}, metadata={"format": "none"}), "epoch": 1}, key=key)
        return Target(path, "/model")

    def dcp_shard(d, key, seed):
        path = os.path.join(d, "ckpt.dcp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import torch.distributed.checkpoint as dcp
            dcp.save(_torch_state(tensors, seed), storage_writer=TensorListWriter(path, encryption_key=key))
        return Target(next(os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".tl")))

    subject("torch-load_state", state_file, lambda t, k: load_state(t.path, key=k, mmap=False))
    subject("torch-load_module_state", state_file, module_read)
    subject("loop-checkpoint", loop_checkpoint, lambda t, k: read_checkpoint(t.path, key=k))
    subject("dcp-read_full", dcp_shard, lambda t, k: read_full(os.path.dirname(t.path), key=k))
