"""The saves of one checkpoint IO under way, so that a removal requested while a save is pending wins.

An asynchronous wrapper (Lightning's ``AsyncCheckpointIO``, tensorlist's
``TensorListAsyncCheckpointIO``, a caller's own thread pool) runs a checkpoint
IO's saves on a worker thread; Lightning's runs its removals on the caller's
thread. ``ModelCheckpoint``'s top-k removal of a checkpoint whose save has not
finished then finds nothing, and the save writes a checkpoint that stays.
:class:`PendingSaves` is the one place where a removal and the saves of the
same path are ordered, whichever thread calls which:

- a removal of a path whose save is running marks that save: it removes what
  it wrote when it ends (the removal returns at once);
- a removal of a path that is not on disk while saves run on another thread
  (its save may be queued behind them) holds the caller until that path's save
  begins, which is then skipped, or until the worker has nothing left; the
  caller being held, no save it requests after the removal can be taken for
  one requested before it;
- any other removal is done at once, under the lock a save of that path takes.

A save requested after a removal is never affected. The worker is taken to
have nothing left when no save runs on another thread and none ended there
within :attr:`PendingSaves.handover_s` (a worker starts its next queued save as
soon as one ends): a hand-over slower than that leaves the checkpoint on disk,
as the stock wrapper would, and never drops a save.
"""
from __future__ import annotations

import math
import os
import threading
import time
from typing import Callable, Dict, Optional, Tuple


class _Running:
    """One save under way: the thread running it, and whether a removal of its path came meanwhile."""

    __slots__ = ("thread", "removed")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.removed = False


class PendingSaves:
    """Orders the saves and removals of one checkpoint IO (module docstring: the rules).

    Pickles and copies as a fresh, empty ledger: what is under way belongs to
    the process and the object that started it.
    """

    #: Seconds a worker may take between the end of one save and the start of the next queued one.
    handover_s = 1.0

    def __init__(self) -> None:
        self._reset()

    def _reset(self) -> None:
        self._cond = threading.Condition()
        self._running: Dict[str, _Running] = {}
        self._awaited: Dict[str, bool] = {}  # path -> whether its queued save began (and was skipped)
        self._last_end: Tuple[Optional[int], float] = (None, -math.inf)  # (thread, time.monotonic())

    def __getstate__(self) -> dict:
        return {}

    def __setstate__(self, state: dict) -> None:
        self._reset()

    def save(self, path, write: Callable[[], None], remove: Callable[[str], None]) -> bool:
        """Runs ``write()`` as the save of ``path``, unless a removal of ``path`` waits for it.

        When a removal of ``path`` is requested while ``write`` runs,
        ``remove(path)`` is called once it has returned (or raised), under the
        lock, so that the removal wins. Two saves of one path run one after the
        other.

        Returns:
            False when the save was skipped (a removal requested before it began).
        """
        key = os.path.abspath(os.fspath(path))
        me = threading.get_ident()
        with self._cond:
            while key in self._running:
                self._cond.wait()
            if key in self._awaited:
                self._awaited[key] = True
                self._cond.notify_all()
                return False
            entry = self._running[key] = _Running(me)
            self._cond.notify_all()
        try:
            write()
        finally:
            with self._cond:
                del self._running[key]
                self._last_end = (me, time.monotonic())
                try:
                    if entry.removed:
                        remove(key)
                finally:
                    self._cond.notify_all()
        return True

    def remove(self, path, remove: Callable[[str], None]) -> None:
        """Has ``remove(path)`` win over every save of ``path`` requested before this call (module docstring)."""
        key = os.path.abspath(os.fspath(path))
        me = threading.get_ident()
        with self._cond:
            entry = self._running.get(key)
            if entry is not None:
                entry.removed = True  # the save removes what it wrote when it ends
                return
            if not os.path.lexists(key) and self._worker_busy(me) and self._skip_queued(key, me):
                return  # its save was skipped: nothing was written
            remove(key)

    def _worker_busy(self, me: int) -> bool:
        """Whether a save runs on another thread, or ended there so lately that the next may be starting."""
        if any(r.thread != me for r in self._running.values()):
            return True
        thread, ended = self._last_end
        return thread is not None and thread != me and time.monotonic() - ended < self.handover_s

    def _skip_queued(self, key: str, me: int) -> bool:
        """Holds the caller until the save of ``key`` begins (skipped: True) or the worker is idle (False)."""
        self._awaited[key] = False
        try:
            while not self._awaited[key]:
                if any(r.thread != me for r in self._running.values()):
                    self._cond.wait()
                    continue
                thread, ended = self._last_end
                left = ended + self.handover_s - time.monotonic()
                if thread is None or thread == me or left <= 0:
                    return False
                self._cond.wait(left)
            return True
        finally:
            del self._awaited[key]
