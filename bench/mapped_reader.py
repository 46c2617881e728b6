"""bench_dcp.py's ``MappedReader``: the DCP load of a tensorlist checkpoint as it was before byte ranges.

A module of its own because its base, ``tensorlist.dcp.TensorListReader``, needs torch, which
bench_dcp.py imports only in the phases that run ranks (its parent process stays torch-free).
"""
import torch  # noqa: F401 - the base class needs it; the first import says so where it is missing
from torch.futures import Future

from tensorlist.dcp import TensorListReader


class MappedReader(TensorListReader):
    """The load this layout had before byte ranges: each chunk mapped whole, then narrowed."""

    def read_data(self, plan, planner):
        self._read_whole(plan, planner)
        fut = Future()
        fut.set_result(None)
        return fut
