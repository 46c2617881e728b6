"""Terminal-safe output: the one escaping of text a file controls before the command line prints it.

A tensor's name, a class name, a tree kind or a key path comes from a file;
printed raw, an ESC starts a terminal control sequence (colours, cursor moves,
an OSC that sets the window title or writes the clipboard), BEL rings, and a
bidi override (U+202E) shows text in another order than it is. The CLI routes
everything it prints, stdout and stderr, messages of exceptions included,
through :class:`EscapingStream`, which writes every such character as a
Python escape (``\\x1b``, ``\\u202e``): the text still names the same thing
and cannot drive the terminal.

Imports nothing of tensorlist.
"""
from __future__ import annotations

import re
import unicodedata
from typing import Any, TextIO

__all__ = ["escape_controls", "EscapingStream", "raw_stream", "display_width", "column", "pad"]

#: Candidates: anything but tab, newline and printable ASCII (each then judged by its Unicode category).
_CANDIDATE = re.compile(r"[^\t\n\x20-\x7e]")

#: Control (C0 but tab and newline, DEL, C1), format (bidi overrides and isolates, zero-width characters, BOM),
#: line and paragraph separators, lone surrogates, private-use and unassigned code points.
_ESCAPED_CATEGORIES = frozenset({"Cc", "Cf", "Zl", "Zp", "Cs", "Co", "Cn"})


def _escape(match: "re.Match[str]") -> str:
    c = match.group()
    if unicodedata.category(c) not in _ESCAPED_CATEGORIES:
        return c
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x100 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def escape_controls(text: str) -> str:
    """``text`` with every character that could drive a terminal written as a Python escape.

    Tab and newline stay; printable text of any script stays.

    Example:
        >>> escape_controls("w\\x1b[31m\\u202eeb\\n")
        'w\\\\x1b[31m\\\\u202eeb\\n'
    """
    return _CANDIDATE.sub(_escape, text)


def display_width(text: str) -> int:
    """Terminal columns ``text`` takes: wide and full-width characters two, combining marks none."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(c) else 2 if unicodedata.east_asian_width(c) in "WF" else 1
               for c in text)


def column(names) -> "tuple[list, int]":
    """A table's first column: each name escaped (as it will print) and the width they all pad to."""
    shown = [escape_controls(n) for n in names]
    return shown, max([4] + [display_width(n) for n in shown])


def pad(text: str, width: int) -> str:
    """``text`` (already escaped) padded with spaces to ``width`` terminal columns."""
    return text + " " * max(0, width - display_width(text))


class EscapingStream:
    """A text stream that writes through :func:`escape_controls`; everything else is the wrapped stream's."""

    def __init__(self, stream: TextIO) -> None:
        self.unescaped = stream

    def write(self, text: str) -> int:
        return self.unescaped.write(escape_controls(text))

    def writelines(self, lines) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, isatty, encoding...
        return getattr(self.unescaped, name)


def raw_stream(stream: Any) -> Any:
    """The stream under an :class:`EscapingStream` (for a progress bar's own ``\\r``), else ``stream``."""
    return stream.unescaped if isinstance(stream, EscapingStream) else stream
