"""Opening a file the package did not write: the one type check, the bounded reads, the one confinement rule.

Every file a reader opens may be a FIFO (an ``open`` blocks until a writer
comes), a device (``/dev/zero`` never ends), a sparse file of any apparent size,
or a symlink leading anywhere. So every open of such a file goes through
:func:`open_regular` (type checked on the open fd), every whole-file read or
hash through :func:`read_regular` / :func:`sha256_file` (refused above a limit
before a byte is read, hashed in fixed-size blocks), and every file inside a
checkpoint directory through :func:`confine` (its real path must stay inside
the directory's). ``format`` re-exports these; nothing here knows the format.
"""
from __future__ import annotations

import errno
import hashlib
import os
import stat
from typing import Optional

from tensorlist.errors import FormatError

__all__ = ["open_regular", "read_capped", "read_regular", "sha256_file", "inside", "confine", "HASH_BLOCK"]

#: Bytes hashed per read by :func:`sha256_file`: memory stays at one block whatever the file's size.
HASH_BLOCK = 1 << 20

_FILE_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
               stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def open_regular(path, *, what: str = "descriptor", file=None, field: Optional[str] = None) -> int:
    """Opens ``path`` read-only and returns the fd, refusing anything but a regular file.

    The one file-type check of the package: a FIFO would block a plain open
    forever, a device (``/dev/zero``) never ends, a socket cannot be read, so
    the open is non-blocking and the type is checked on the open file
    (``fstat``, no race with a rename) before a byte is read; the fd is then
    made blocking again.

    Raises:
        FormatError: not a regular file (naming ``file`` and ``field``).
        OSError: it cannot be opened (FileNotFoundError included).
    """
    path = os.fspath(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as e:
        if e.errno != errno.ENXIO:  # ENXIO: a unix socket (or a FIFO's peer is gone): not a file to read
            raise
        shown = f"{what} {path!r}" if file is not None and os.fspath(file) != path else what
        raise FormatError(f"{shown} is not a regular file: it is a socket or device without a reader",
                          file=file if file is not None else path, field=field) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = _FILE_KINDS.get(stat.S_IFMT(st.st_mode), "a special file")
            shown = f"{what} {path!r}" if file is not None and os.fspath(file) != path else what
            raise FormatError(f"{shown} is not a regular file: it is {kind}", file=file if file is not None else path,
                              field=field)
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_capped(fd: int, limit: int, *, file, what: str = "descriptor") -> bytes:
    """Reads an open regular file whole, refusing it above ``limit`` bytes (before reading it)."""
    size = os.fstat(fd).st_size
    if size > limit:
        raise FormatError(f"{what} is {size} bytes, above the limit of {limit} (raise it with max_descriptor_bytes=)",
                          file=file)
    with os.fdopen(os.dup(fd), "rb") as f:
        # size + 1 (not the cap): read() sets aside the whole request up front
        text = f.read(size + 1)
        if len(text) > size:  # the file grew while we read
            text += f.read(limit + 1 - len(text))
    if len(text) > limit:
        raise FormatError(f"{what} is above the limit of {limit} bytes", file=file)
    return text


def read_regular(path, limit: int, *, what: str = "file", file=None, field: Optional[str] = None) -> bytes:
    """The bytes of the regular file ``path``, refused above ``limit`` bytes before any is read.

    Raises:
        FormatError: not a regular file, or above ``limit`` (naming ``file``, default ``path``).
        OSError: it cannot be opened.
    """
    fd = open_regular(path, what=what, file=file, field=field)
    try:
        return read_capped(fd, limit, file=file if file is not None else os.fspath(path), what=what)
    finally:
        os.close(fd)


def sha256_file(path, limit: int, *, what: str = "file", file=None) -> str:
    """The hex SHA-256 of the regular file ``path``, hashed a block at a time, refused above ``limit`` bytes.

    The size is checked on the open fd before the first byte is hashed (a
    sparse file of any apparent size costs nothing), and again while hashing
    (a file growing under the reader).

    Raises:
        FormatError: not a regular file, or above ``limit`` (naming ``file``, default ``path``).
        OSError: it cannot be opened.
    """
    shown = file if file is not None else os.fspath(path)
    fd = open_regular(path, what=what, file=file)
    try:
        size = os.fstat(fd).st_size
        if size > limit:
            raise FormatError(f"{what} is {size} bytes, above the limit of {limit} for a file hashed whole",
                              file=shown)
        h, seen = hashlib.sha256(), 0
        while True:
            block = os.read(fd, HASH_BLOCK)
            if not block:
                return h.hexdigest()
            seen += len(block)
            if seen > limit:
                raise FormatError(f"{what} grew above the limit of {limit} bytes while it was hashed", file=shown)
            h.update(block)
    finally:
        os.close(fd)


def inside(path: str, root: str) -> bool:
    """Whether the real path ``path`` is ``root`` or lies under it (both already resolved)."""
    root = root.rstrip(os.sep) or os.sep
    return path == root or path.startswith(root if root == os.sep else root + os.sep)


def confine(directory, name: str, *, what: str = "file", where: str = "checkpoint directory") -> str:
    """``os.path.join(directory, name)``, refused when its real path leaves ``directory``'s real path.

    The one confinement rule for every file opened inside a checkpoint
    directory (DCP shards and metadata, Orbax items, Lightning's meta
    documents, Hugging Face checkpoints): symlinks are resolved, on the file
    and on every directory on its way, and ``..`` components after them, as
    the system would open it; a link that stays inside is followed.
    ``format.check_data_path`` applies the same test to a data file.

    Raises:
        FormatError: the file resolves outside (naming the file and where it leads).
    """
    directory = os.fspath(directory)
    target = os.path.join(directory, name)
    root, real = os.path.realpath(directory), os.path.realpath(target)
    if not inside(real, root):
        raise FormatError(f"{what} {name!r} resolves to {real!r}, outside the {where} {root!r} (a symlink): "
                          "refused, every file it holds must lie inside it", file=target)
    return target
