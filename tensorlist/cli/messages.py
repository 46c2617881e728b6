"""The command line's one error format: ``tensorlist <command>: error: <FILE>: <problem>``.

Every error any command prints goes through :func:`print_error` (``main``'s
handler for what a command raises, ``validate`` for each file it refuses,
``lineage`` for a broken link), so that scripts and people read one format:
one line on stderr, the command, then the file at fault where there is one.
:func:`problem` turns an exception into its ``FILE: problem`` text: the file a
FormatError or DestinationExistsError names, the file name an OSError carries.
"""
from __future__ import annotations

import os
import sys
from typing import Optional

from tensorlist.errors import DestinationExistsError

__all__ = ["FORCE_HINT", "problem", "error_line", "print_error"]

#: How a user replaces a destination that exists, said by every refusal of the command line.
FORCE_HINT = "pass --force to replace it"


def problem(e: BaseException) -> str:
    """``e`` as ``FILE: problem`` (the file first, where ``e`` names one), on no particular number of lines."""
    if isinstance(e, DestinationExistsError):
        return f"{e.file}: {e.reason}; {FORCE_HINT}"
    if isinstance(e, KeyError) and e.args:
        return str(e.args[0])
    if isinstance(e, OSError) and e.filename is not None and e.strerror:
        # "[Errno 2] No such file or directory: 'x.tl'" said as "x.tl: No such file or directory"
        names = [os.fsdecode(n) for n in (e.filename, e.filename2) if n is not None]
        return f"{' -> '.join(names)}: {e.strerror}"
    text = str(e)
    if not text.strip():
        return type(e).__name__
    return text


def error_line(command: str, text: str, file: Optional[str] = None) -> str:
    """The one line of an error: ``tensorlist COMMAND: error: FILE: TEXT``.

    ``file`` is put first unless ``text`` already starts with it (a problem
    with a file inside ``file``, a checkpoint's metadata, starts with that one).
    Newlines and runs of white space become one space: one problem, one line.
    """
    text = " ".join(str(text).split())
    if file is not None:
        shown = " ".join(str(file).split())  # as the text names it: on one line too
        if not text.startswith(shown):
            text = f"{shown}: {text}"
    return f"tensorlist {command}: error: {text}"


def print_error(command: str, text: str, file: Optional[str] = None) -> None:
    """Prints :func:`error_line` on stderr."""
    print(error_line(command, text, file), file=sys.stderr)
