"""Accelerate's automatic checkpoint naming, as ``Accelerator.save_state``/``load_state`` apply it.

With ``ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)``
each save goes to ``<project_dir>/checkpoints/checkpoint_<iteration>`` (the
directory the caller passes is ignored, as accelerate does), a directory that
exists already is refused with accelerate's ``ValueError``, ``total_limit``
keeps that many checkpoints (the oldest by number go), and
``project_configuration.iteration`` moves on by one after each save; a load
with no directory takes the newest checkpoint. Without automatic naming the
directory is the caller's, and is required.

Where this differs from accelerate, it keeps what was saved: the checks come
before anything is removed, the oldest checkpoints are removed only once the
new save is complete (accelerate removes them first), a save that fails
removes only the directory it made (so the same iteration can be saved
again) and leaves ``iteration`` as it was, only ``checkpoint_<N>`` entries
count as checkpoints (accelerate counts, and may delete, anything in
``checkpoints/``), a symlink among them is unlinked, never its target
emptied, and the newest checkpoint a load takes is the newest *complete*
one (a save killed midway is passed over, as ``last_checkpoint`` does for
the Trainer).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
from typing import Callable, Iterator, List, Tuple

#: The folder under ``project_dir`` and the name of each checkpoint in it (accelerate's).
CHECKPOINTS = "checkpoints"
_NUMBERED = re.compile(r"checkpoint_([0-9]{1,18})\Z")

_log = logging.getLogger("tensorlist.huggingface")


def automatic(accelerator) -> bool:
    """Whether the accelerator's project configuration names checkpoints itself."""
    return bool(getattr(accelerator.project_configuration, "automatic_checkpoint_naming", False))


def _base(accelerator) -> str:
    project_dir = accelerator.project_dir
    if project_dir is None:
        raise ValueError("automatic_checkpoint_naming needs a project_dir: "
                         "ProjectConfiguration(project_dir=..., automatic_checkpoint_naming=True)")
    return os.path.join(os.fspath(project_dir), CHECKPOINTS)


def numbered(base: str) -> List[Tuple[int, str]]:
    """``(N, path)`` of every ``checkpoint_<N>`` in ``base``, oldest (smallest N) first; [] when ``base`` is absent."""
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        m = _NUMBERED.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(base, name)))
    return sorted(found)


def _remove(path: str) -> None:
    if os.path.islink(path) or not os.path.isdir(path):
        os.unlink(path)
    else:
        shutil.rmtree(path)


@contextlib.contextmanager
def saving(accelerator, output_dir) -> Iterator[str]:
    """The directory a save writes into, around the save: on success ``iteration`` + 1 and ``total_limit`` applied.

    Raises (before anything is written or removed):
        ValueError: no ``output_dir`` without automatic naming; automatic
            naming without a ``project_dir``; ``checkpoint_<iteration>``
            exists already (accelerate's words).
    """
    config = accelerator.project_configuration
    made = False
    stale: List[str] = []
    if not automatic(accelerator):
        if output_dir is None:
            raise ValueError("No output_dir provided and automatic checkpoint naming is disabled.")
        target = os.fspath(output_dir)
    else:
        base = _base(accelerator)
        target = os.path.join(base, f"checkpoint_{config.iteration}")
        if os.path.lexists(target):
            raise ValueError(f"Checkpoint directory {target} ({config.iteration}) already exists. Please manually "
                             "override `project_configuration.iteration` with what iteration to start with.")
        found = numbered(base)
        if config.total_limit is not None and accelerator.is_main_process:
            stale = [path for _, path in found[:max(0, len(found) + 1 - config.total_limit)]]
        accelerator.wait_for_everyone()  # every process has checked before the directory is made
        made = True
    try:
        yield target
    except BaseException:
        if made and accelerator.is_main_process and os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target, ignore_errors=True)
        raise
    config.iteration += 1
    if stale:
        _log.warning("Deleting %d checkpoints to keep total_limit=%d: %s", len(stale), config.total_limit, stale)
        for path in stale:
            _remove(path)
    accelerator.wait_for_everyone()


def load_dir(accelerator, input_dir, *, complete: Callable[[str], bool]) -> str:
    """The directory a load reads: ``input_dir``, or the newest complete ``checkpoint_<N>`` under automatic naming.

    Raises:
        FileNotFoundError: ``input_dir`` is not a directory; automatic naming
            with no ``checkpoint_<N>`` saved.
        ValueError: no ``input_dir`` and automatic naming is off (accelerate's words).
    """
    if input_dir is not None:
        path = os.path.expanduser(os.fspath(input_dir))
        if not os.path.isdir(path):
            raise FileNotFoundError(f"{path}: no such checkpoint directory")
        return path
    if not automatic(accelerator):
        raise ValueError("No input_dir provided and automatic checkpoint naming is disabled.")
    base = _base(accelerator)
    found = [path for _, path in numbered(base) if os.path.isdir(path)]
    if not found:
        raise FileNotFoundError(f"{base}: no checkpoint_<N> directory to load")
    for path in reversed(found):
        if complete(path):
            return path
    return found[-1]  # none complete: the newest, which the load then refuses naming what is missing

