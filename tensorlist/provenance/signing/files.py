"""The set of files a signature covers, and their SHA-256 digests.

What is signed, for each kind of PATH (names are POSIX paths relative to the root):

- a directory (a model directory, a DCP-layout, Lightning or Hugging Face
  checkpoint): every regular file below it, sorted, except model_signing's
  default git paths (``.git``, ``.gitattributes``, ``.github``, ``.gitignore``)
  and the ignored names (the signature and attestation themselves when written
  inside it). A symlink, FIFO, socket or device anywhere in it is refused,
  naming it, as stock ``model_signing`` refuses symlinks: a link's target is
  outside what the digest pins.
- a tensorlist file (a descriptor): the descriptor and every data file its lists
  name (confined to its directory by ``format.check_data_path``), relative to the
  descriptor's directory. Stock ``model_signing verify`` checks such a signature
  on that directory with ``--ignore_unsigned_files``.

Files are hashed by ``_base.files.sha256_file`` on a few threads: hashlib and
``os.read`` release the GIL, so files hash in parallel where cores are free.
"""
from __future__ import annotations

import os
import posixpath
import stat
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, Iterable, List, Optional, Tuple

from tensorlist.errors import FormatError
from tensorlist.format import check_data_path, find_tensor_lists, parse_list, read_json_file, sha256_file
from tensorlist._base.jsonio import resolve_pointer

#: model_signing's own default ignores (``hashing.Config``), kept so both tools list the same files.
GIT_PATHS = (".git", ".gitattributes", ".github", ".gitignore")

#: hashing threads: enough to overlap reads and hashing of a few files, few enough for a shared host.
HASH_THREADS = min(4, os.cpu_count() or 1)


def is_ignored(name: str, ignored: Iterable[str]) -> bool:
    """Whether the relative name ``name`` is one of ``ignored`` or lies under one (model_signing's rule)."""
    return any(name == p or name.startswith(p.rstrip("/") + "/") for p in ignored)


def check_name(name, *, file=None) -> str:
    """A manifest's file name, refused unless a plain relative POSIX path inside the root."""
    if not isinstance(name, str) or not name or "\x00" in name or "\\" in name:
        raise FormatError(f"names a file {name!r}: expected a relative path", file=file)
    parts = name.split("/")
    if name.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise FormatError(f"names a file {name!r} outside the signed directory: refused", file=file)
    return name


def _walk(root: str, ignored: Iterable[str]) -> List[str]:
    names: List[str] = []
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            entries = list(it)
        for entry in entries:
            name = posixpath.join(rel, entry.name) if rel else entry.name
            if is_ignored(name, ignored):
                continue
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISDIR(mode):
                stack.append(name)
            elif stat.S_ISREG(mode):
                names.append(name)
            else:
                kind = "a symbolic link" if stat.S_ISLNK(mode) else "not a regular file"
                raise FormatError(f"{name!r} is {kind}: a signed directory holds regular files and directories "
                                  "only", file=os.path.join(root, name))
    return sorted(names)


def _tensorlist_file(path: str) -> List[str]:
    doc = read_json_file(path)
    base = os.path.dirname(os.path.abspath(path))
    names = [os.path.basename(path)]
    for ptr in find_tensor_lists(doc):
        desc = parse_list(resolve_pointer(doc, ptr, file=path), file=path, pointer=ptr, base_dir=base)
        check_data_path(desc)
        data = desc.data_path
        if data is not None:
            name = os.path.relpath(data, base).replace(os.sep, "/")
            if name not in names:
                names.append(check_name(name, file=path))
    if len(names) == 1 and not find_tensor_lists(doc):
        raise FormatError("is not a tensorlist file (no tensor list in it) nor a directory: "
                          "sign its directory instead", file=path)
    return names


def collect(path, ignored: Iterable[str] = ()) -> Tuple[str, List[str], bool]:
    """The root directory, the sorted names signed under it, and whether ``path`` was a single file.

    Raises:
        FormatError: a symlink or special file in a directory; a file that is
            not a tensorlist descriptor; a data file outside its directory.
        OSError: ``path`` cannot be read (FileNotFoundError included).
    """
    path = os.fspath(path)
    st = os.lstat(path)
    ignored = tuple(GIT_PATHS) + tuple(ignored)
    if stat.S_ISLNK(st.st_mode):
        raise FormatError("is a symbolic link: sign what it points to", file=path)
    if stat.S_ISDIR(st.st_mode):
        return path, _walk(path, ignored), False
    if not stat.S_ISREG(st.st_mode):
        raise FormatError("is not a regular file nor a directory", file=path)
    names = _tensorlist_file(path)
    return os.path.dirname(path) or ".", sorted(names), True


def digests(root: str, names: List[str], threads: Optional[int] = None) -> Dict[str, str]:
    """``{name: hex sha256}`` of each file, hashed on a few threads (symlinks on the way refused)."""
    def one(name: str) -> str:
        parts = name.split("/")
        for i in range(1, len(parts) + 1):  # no link on the way: the name means the same file for everyone
            full = os.path.join(root, *parts[:i])
            if os.path.islink(full):
                raise FormatError("is a symbolic link: refused in a signed set", file=full)
        return sha256_file(full, sys.maxsize, what="signed file")

    workers = max(1, min(threads or HASH_THREADS, len(names)))
    if workers == 1:
        return {n: one(n) for n in names}
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(zip(names, pool.map(one, names)))
