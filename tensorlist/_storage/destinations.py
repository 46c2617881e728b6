"""The one rule for what a write may replace, and the directories a write makes.

Every command line command that writes files goes through here before its first
byte is written, and so do the Python functions behind them
(``tensorlist.convert.convert``, ``tensorlist.provenance.exports.export``):

- :func:`refuse_existing`: unless ``overwrite``, a destination that exists is
  refused with :class:`~tensorlist.errors.DestinationExistsError` naming it: a
  file (a symlink too, even a dangling one: writing would replace it), or a
  directory destination that is not empty (an empty one holds nothing to lose).
  Every destination of a write is checked before any is written, so a command
  with several outputs writes all of them or none.
- :func:`made_directories`: the missing directories above each destination (and
  a directory destination itself) are made, parents included, as ``mkdir -p``
  would; a write that fails removes again those it made (when still empty), so a
  refused conversion leaves no empty folder behind.

Remote URLs are asked through fsspec (``exists``, and ``ls`` for a directory);
they need no directories made (an object store has none).

Imports ``_base.backends`` and ``errors`` only.
"""
from __future__ import annotations

import contextlib
import os
from typing import Iterable, Iterator, List

from tensorlist._base.backends import filesystem, is_remote, localize
from tensorlist.errors import DestinationExistsError

__all__ = ["refuse_existing", "made_directories", "in_the_way"]


def in_the_way(path, *, directory: bool = False) -> str:
    """What at ``path`` a write would replace: ``""`` when nothing, else the reason a refusal gives.

    ``directory``: ``path`` is a directory destination, in the way only when it
    is not empty (or is something other than a directory).
    """
    name = localize(os.fspath(path))
    if is_remote(name):
        fs, p = filesystem(name)
        if directory and fs.isdir(p):
            return "exists and is not empty" if fs.ls(p) else ""
        return "exists" if fs.exists(p) else ""
    if directory and os.path.isdir(name) and not os.path.islink(name):
        with os.scandir(name) as entries:
            return "exists and is not empty" if next(entries, None) is not None else ""
    return "exists" if os.path.lexists(name) else ""


def refuse_existing(files: Iterable = (), directories: Iterable = (), *, overwrite: bool) -> None:
    """Raises DestinationExistsError naming the first destination in the way, unless ``overwrite``.

    Args:
        files: the files a write will create or replace.
        directories: the directories it will fill (in the way when not empty).
        overwrite: replace whatever is there (nothing is checked).
    """
    if overwrite:
        return
    for path, directory in [(f, False) for f in files] + [(d, True) for d in directories]:
        reason = in_the_way(path, directory=directory)
        if reason:
            raise DestinationExistsError(os.fspath(path), reason)


def _missing(path: str) -> List[str]:
    """The directories of ``path`` (itself included) that do not exist, outermost first."""
    out = []
    path = os.path.abspath(path)
    while path and not os.path.lexists(path):
        out.append(path)
        parent = os.path.dirname(path)
        if parent == path:
            break
        path = parent
    return out[::-1]


@contextlib.contextmanager
def made_directories(files: Iterable = (), directories: Iterable = ()) -> Iterator[List[str]]:
    """Makes the missing parents of ``files`` and the missing ``directories`` (parents included) for a block.

    Yields the directories made, outermost first. If the block raises, each of
    them that is still empty is removed, innermost first, and the error goes on.
    """
    wanted = [os.path.dirname(os.path.abspath(localize(os.fspath(f)))) for f in files
              if not is_remote(localize(os.fspath(f)))]
    wanted += [localize(os.fspath(d)) for d in directories if not is_remote(localize(os.fspath(d)))]
    made: List[str] = []
    try:
        for d in wanted:
            for m in _missing(d):
                try:
                    os.mkdir(m)  # one at a time: each one made is known, to be removed on failure
                except FileExistsError:  # made meanwhile by another process: its own, kept
                    continue
                made.append(m)
        yield made
    except BaseException:
        for m in reversed(made):
            try:
                os.rmdir(m)  # only an empty one: a file another process put there is kept
            except OSError:
                pass
        raise
