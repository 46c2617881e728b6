"""The page cache, for the benchmarks: evicting files, dropping it whole, reading how much is resident.

Framework-free (numpy and the standard library), so that every bench script can import it whichever
frameworks are installed. Linux: ``posix_fadvise``, ``mincore`` and ``/proc/sys/vm/drop_caches``.
"""
import ctypes
import ctypes.util
import mmap
import os
from typing import Iterable

import numpy as np

PAGE = mmap.PAGESIZE


def drop_caches() -> None:
    """Empties the whole clean page cache (root only): ``sync`` then ``1 > /proc/sys/vm/drop_caches``."""
    os.sync()
    with open("/proc/sys/vm/drop_caches", "w") as f:
        f.write("1\n")


def evict(paths: Iterable[str], drop_all: bool = False) -> None:
    """Takes the files' pages out of the page cache (synced first: dirty pages are not dropped).

    ``drop_all`` drops the whole page cache instead (:func:`drop_caches`).
    """
    if drop_all:
        drop_caches()
        return
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def evict_dir(folder: str) -> None:
    """:func:`evict` of every plain file directly inside ``folder``."""
    evict(p for p in (os.path.join(folder, n) for n in os.listdir(folder)) if os.path.isfile(p))


def warm(paths: Iterable[str]) -> None:
    """Reads the files once, so that their pages are in the page cache."""
    for p in paths:
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def resident_bytes(path: str) -> int:
    """Bytes of ``path``'s pages now in the page cache (``mincore`` over a fresh mapping of it)."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    pages = (size + PAGE - 1) // PAGE
    vec = (ctypes.c_ubyte * pages)()
    with open(path, "rb") as f, mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ) as m:
        buf = np.frombuffer(m, np.uint8)
        if libc.mincore(ctypes.c_void_p(buf.ctypes.data), ctypes.c_size_t(size), vec) != 0:
            raise OSError(ctypes.get_errno(), "mincore")
        del buf
    return min(size, sum(v & 1 for v in vec) * PAGE)


def resident_fraction(path: str) -> float:
    """The fraction of ``path``'s bytes in the page cache (1.0 for an empty file)."""
    size = os.path.getsize(path)
    return resident_bytes(path) / size if size else 1.0
