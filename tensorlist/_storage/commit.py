"""The one atomic, durable replacement protocol, and the clean-up of what killed saves left.

Every save follows one protocol (docs/FORMAT.md, "Atomic replacement"):

1. the data goes to a temporary file in the target directory, written by the
   C core straight from the caller's buffers, then fsynced and renamed to a
   name no other save uses (``<name>.<random>.data``);
2. the descriptor goes to a temporary file, fsynced, and renamed over the
   target path (the commit point), then the directory is fsynced;
3. the data files the old descriptor referenced (and the new one does not)
   are removed, and what killed saves of the same path left is swept.

Whenever the process dies, the target path names either the old descriptor
(whose data file is still there) or the new one (whose data is complete).
lamp mode writes lamp's fixed name ``<name>.data`` instead, so it has a short
window, between the two renames, in which a crash pairs the old descriptor
with the new data; the docs say so.

Concurrent saves: every save holds a shared ``flock`` on the target's
directory from before it creates its first file until its commit ends; the
sweep runs only under an exclusive lock taken without waiting, that is, when
no other save in the directory is under way. So a sweep never deletes a file
another save has just created, or the data of a descriptor another save is
committing; what it skips, a later save sweeps.

:func:`atomic_file` gives single files (converters' outputs, records) the same
guarantee: a temporary name, fsync, rename, directory fsync.

Imports ``format``, ``_base.jsonio`` and ``lowlevel`` (``fsync``: the one durability rule) only.
"""
from __future__ import annotations

import contextlib
import fcntl
import os
import re
from typing import Iterable, Iterator, List, Optional

from tensorlist._base import lowlevel
from tensorlist._base.jsonio import resolve_pointer
from tensorlist.format import find_tensor_lists, read_json_file

__all__ = ["Commit", "atomic_file", "tmp_beside", "own_locations", "is_own_data", "fsync_dir", "write_all",
           "durable_replace", "new_token", "sweep_unowned", "own_data_files"]

_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_OWN_DATA = re.compile(r"\.[0-9a-f]{8}\.data\Z")


def new_token() -> str:
    """Eight random hex digits naming one save's files (``<base>.<token>.data``, temporary names).

    ``os.urandom``, as ``secrets.token_hex`` uses, without importing ``secrets``
    (its ``hmac`` loads OpenSSL: 5 ms of every ``import tensorlist``).
    """
    return os.urandom(4).hex()


def is_own_data(base: str, location: str) -> bool:
    """Whether ``location`` is a data file name this library gives saves of ``base``.

    ``<base>.<8 hex>.data`` (tensorlist) or ``<base>.data`` (lamp): only those
    are ever deleted on replacement; a ``location`` the user chose never is.
    """
    if "/" in location or not location.startswith(base + "."):
        return False
    rest = location[len(base):]
    return rest == ".data" or _OWN_DATA.match(rest) is not None


def own_data_files(path: str) -> List[str]:
    """The data files beside ``path`` that its committed document names and this library named (removable)."""
    try:
        doc = read_json_file(path, fast=True)
    except (OSError, ValueError):
        return []
    base = os.path.dirname(os.path.abspath(path))
    return [os.path.join(base, name) for name in own_locations(doc, os.path.basename(path))]


def own_locations(doc, base: str) -> List[str]:
    """The locations of ``doc``'s lists that are data files this library named for ``base``."""
    out = []
    for ptr in find_tensor_lists(doc):
        loc = resolve_pointer(doc, ptr)["location"]
        if is_own_data(base, loc) and loc not in out:
            out.append(loc)
    return out


def tmp_beside(path: str, token: Optional[str] = None) -> str:
    """A fresh hidden temporary name in ``path``'s directory (the rename stays on one filesystem)."""
    d, b = os.path.split(os.path.abspath(path))
    return os.path.join(d, f".{b}.{token or new_token()}.tmp")


def write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view[: 1 << 30])
        view = view[n:]


def fsync_dir(path: str) -> None:
    """fsyncs a directory, so that a rename in it survives a power cut."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    except OSError:
        return
    try:
        lowlevel.fsync(fd, path)
    except OSError:
        pass  # some filesystems refuse fsync on directories
    finally:
        os.close(fd)


def _flock(fd: int, mode: int) -> bool:
    """Takes an flock without waiting; False if another holds a conflicting one.

    Filesystems without flock answer OSError: then nobody can be told apart,
    and False keeps the sweep from deleting anything.
    """
    try:
        fcntl.flock(fd, mode | fcntl.LOCK_NB)
        return True
    except OSError:
        return False


def sweep_unowned(directory: str) -> List[str]:
    """Removes the data files in ``directory`` whose descriptor is gone or replaced by a symbolic link.

    ``<name>.<8 hex>.data`` belongs to the document ``<name>``: when ``<name>``
    no longer exists as a regular file (a tool other than tensorlist removed
    it, e.g. Lightning's ``save_last="link"`` replacing ``last.ckpt`` by a
    link), nothing can reference the data any more. Runs under the same
    exclusive directory lock as a save's sweep (skipped while any save in the
    directory is under way), on files no live save holds locked.

    Returns:
        The names removed.
    """
    try:
        dir_fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
    except OSError:
        return []
    removed: List[str] = []
    try:
        if not _flock(dir_fd, fcntl.LOCK_EX):
            return []  # a save is under way: a later sweep removes what this one skips
        for name in os.listdir(directory):
            found = _OWN_DATA.search(name)
            if found is None or name.startswith("."):
                continue
            owner = os.path.join(directory, name[:found.start()])
            if os.path.isfile(owner) and not os.path.islink(owner):
                continue
            path = os.path.join(directory, name)
            try:
                fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
            except OSError:
                continue
            try:
                if _flock(fd, fcntl.LOCK_EX):
                    os.unlink(path)
                    removed.append(name)
            except OSError:
                pass
            finally:
                os.close(fd)
    finally:
        os.close(dir_fd)
    return removed


def durable_replace(tmp: str, path: str, durable: bool = True) -> None:
    """Renames a complete temporary file over ``path``: fsync the file, rename, fsync the directory."""
    if durable:
        fd = os.open(tmp, os.O_RDONLY | _CLOEXEC)
        try:
            lowlevel.fsync(fd, tmp)
        finally:
            os.close(fd)
    os.replace(tmp, path)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


@contextlib.contextmanager
def atomic_file(path, durable: bool = True) -> Iterator[str]:
    """A temporary path beside ``path``: renamed over it when the block succeeds, removed when it fails.

    Write the whole file to the yielded path (with any library); on success it
    is fsynced, renamed into place and the directory fsynced, so ``path``
    holds the old or the new file whatever happens.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "out.bin")
        >>> with atomic_file(p) as tmp:
        ...     _ = open(tmp, "wb").write(b"done")
        >>> open(p, "rb").read()
        b'done'
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path} is a directory")
    tmp = tmp_beside(path)
    try:
        yield tmp
        durable_replace(tmp, path, durable)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


class Commit:
    """Temporary files, renames, fsyncs and clean-up of one atomic save of ``path``."""

    def __init__(self, path, *, lamp: bool, durable: bool):
        self.path = os.path.abspath(os.fspath(path))
        self.dir, self.base = os.path.split(self.path)
        if not self.base:
            raise ValueError(f"{path!r} names a directory, not a file")
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"{self.path} is a directory")
        self.token = new_token()
        self.lamp = lamp
        self.durable = durable
        self.data_name = f"{self.base}.data" if lamp else f"{self.base}.{self.token}.data"
        self.data_path = os.path.join(self.dir, self.data_name)
        self.data_tmp = os.path.join(self.dir, f".{self.data_name}.{self.token}.tmp")
        self.desc_tmp = os.path.join(self.dir, f".{self.base}.{self.token}.tmp")
        self.data_renamed = False
        self.fd: Optional[int] = None
        self._dir_fd: Optional[int] = None

    def _hold_dir(self) -> None:
        """Shared lock on the directory for the whole save: no sweep runs meanwhile."""
        try:
            fd = os.open(self.dir, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _CLOEXEC)
        except OSError:
            return  # the data file's open will say what is wrong with the directory
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)  # waits only while a sweep runs (milliseconds)
        except OSError:
            pass  # no flock here: then no sweep runs either (see _flock)
        self._dir_fd = fd

    def _release_dir(self, _close=os.close) -> None:
        if self._dir_fd is not None:
            _close(self._dir_fd)
            self._dir_fd = None

    def open_data(self) -> int:
        self._hold_dir()
        flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | _CLOEXEC
        self.fd = os.open(self.data_tmp, flags, 0o666)
        _flock(self.fd, fcntl.LOCK_EX)  # held until the commit ends: tells an older sweep this save is alive
        return self.fd

    def finish_data(self) -> None:
        if self.durable:
            lowlevel.fsync(self.fd, self.data_tmp)
        if not self.lamp:  # a fresh unique name: nothing refers to it yet
            os.rename(self.data_tmp, self.data_path)
            self.data_renamed = True

    def commit(self, text: str, keep: Iterable[str] = ()) -> None:
        """Writes the descriptor and renames it over the target (the commit point), then cleans up.

        Args:
            text: the descriptor (or document) to write.
            keep: locations the new document still references besides this
                save's data file (kept even where the old document had them).
        """
        old = self._old_locations()
        fd = os.open(self.desc_tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _CLOEXEC, 0o666)
        try:
            _flock(fd, fcntl.LOCK_EX)
            write_all(fd, text.encode("utf-8"))
            if self.durable:
                lowlevel.fsync(fd, self.desc_tmp)
            if self.lamp:
                os.rename(self.data_tmp, self.data_path)
                self.data_renamed = True
            os.rename(self.desc_tmp, self.path)  # the commit point
        finally:
            os.close(fd)
        if self.durable:
            fsync_dir(self.dir)
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        keep = set(keep) | {self.data_name}
        for loc in old:
            if loc not in keep:
                try:
                    os.unlink(os.path.join(self.dir, loc))
                except OSError:
                    pass
        self._sweep(keep)

    def _sweep(self, keep: set) -> None:
        """Removes what killed saves of this path left: temp files and unreferenced data files.

        Runs only when no other save in the directory is under way (an
        exclusive directory lock, taken without waiting; see the module
        docstring), and then only on files no live process holds locked.
        """
        if self._dir_fd is None or not _flock(self._dir_fd, fcntl.LOCK_EX):
            self._release_dir()
            return  # another save is running: it, or a later one, sweeps
        try:
            try:
                names = os.listdir(self.dir)
            except OSError:
                return
            tmp = re.compile(rf"\.{re.escape(self.base)}(\.[0-9a-f]{{8}})?(\.data)?\.[0-9a-f]{{8}}\.tmp\Z")
            candidates = [n for n in names if n not in keep and (tmp.match(n) or self._swept_data(n))]
            referenced = None
            for name in candidates:
                path = os.path.join(self.dir, name)
                try:
                    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | _CLOEXEC | getattr(os, "O_NOFOLLOW", 0))
                except OSError:
                    continue
                try:
                    if not _flock(fd, fcntl.LOCK_EX):
                        continue  # a live save owns it
                    if self._swept_data(name):
                        if referenced is None:
                            referenced = set(self._old_locations())
                        if name in referenced:
                            continue
                    os.unlink(path)
                except OSError:
                    pass
                finally:
                    os.close(fd)
        finally:
            self._release_dir()

    def _swept_data(self, name: str) -> bool:
        """A data file a killed tensorlist-mode save may have left (``<base>.<8 hex>.data``)."""
        return name != f"{self.base}.data" and is_own_data(self.base, name)

    def _old_locations(self) -> List[str]:
        """Data files of the document being replaced that this library named (safe to delete)."""
        try:
            doc = read_json_file(self.path, fast=True)
        except (OSError, ValueError):
            return []
        return own_locations(doc, self.base)

    def abort(self, _close=os.close, _unlink=os.unlink) -> None:
        """Removes what this save wrote; the previous file stays.

        A Writer left open runs this from its ``__del__``, possibly while the
        interpreter tears down and this module's globals (``os``) are None:
        the calls it makes are bound when the module is made, as
        ``lowlevel.owned`` binds the C core's release.
        """
        if self.fd is not None:
            try:
                _close(self.fd)
            except OSError:
                pass
            self.fd = None
        for p in (self.data_tmp, self.desc_tmp) + ((self.data_path,) if self.data_renamed and not self.lamp else ()):
            try:
                _unlink(p)
            except OSError:
                pass
        self._release_dir(_close)
