"""AES-256-GCM over chunks: file keys, sealing a list's tensors and metadata, opening them again.

Each save draws a 32-byte salt; HKDF-SHA256 of the user's key and that salt
gives the file key (so a nonce never repeats under one key) and a key check
(so a wrong key is told apart from altered bytes). Chunk ``j`` of tensor ``i``
is sealed with the nonce ``i`` (4 bytes, big-endian) ``|| j`` (8 bytes) and the
associated byte 0, or 1 for a tensor's last chunk; the metadata with the nonce
``2**32 - 1 || 0`` and the associated data ``0x02 || canonical header``.
Chunks are sealed and opened in parallel (the ``cryptography`` package
releases the GIL), each worker through its own chunk-sized scratch buffer.
"""
from __future__ import annotations

import hmac
import os
import struct
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist.crypto.keys import Key
from tensorlist.crypto.spec import (DEFAULT_CHUNK, KEY_CHECK_BYTES, SALT_BYTES, SCHEME, TAG_BYTES, Encryption, b64,
                                    chunk_count)
from tensorlist._base.jsonio import loads_strict
from tensorlist.errors import EncryptionError

__all__ = ["Sealer", "Opener", "nonce", "default_threads"]

FILE_KEY_INFO = b"tensorlist aes-256-gcm file key v1"
KEY_CHECK_INFO = b"tensorlist key check v1"
HEADER_INDEX = 0xFFFFFFFF
_AAD = (b"\x00", b"\x01")  # a chunk, a tensor's last chunk
HEADER_AAD = b"\x02"

_pool: Optional[ThreadPoolExecutor] = None
_pool_size = 0


def default_threads() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def _run(jobs: Sequence[Any], work: Callable[[Sequence[Any], np.ndarray], None], threads: Optional[int],
         scratch: int) -> None:
    """Runs ``work(group, scratch)`` over ``threads`` contiguous groups of ``jobs``; re-raises the first error."""
    global _pool, _pool_size
    n = max(1, min(threads or default_threads(), len(jobs)))
    if n == 1:
        work(jobs, np.empty(scratch, np.uint8))
        return
    if _pool is None or _pool_size < n:  # one shared pool, grown when a call asks for more threads
        _pool_size = max(n, default_threads())
        _pool = ThreadPoolExecutor(max_workers=_pool_size, thread_name_prefix="tensorlist-aead")
    step = -(-len(jobs) // n)
    futures = [_pool.submit(work, jobs[k:k + step], np.empty(scratch, np.uint8)) for k in range(0, len(jobs), step)]
    errors = [f.exception() for f in futures]
    for e in errors:
        if e is not None:
            raise e


def _pwrite_run(fd: int, views: List[memoryview], offset: int) -> None:
    """Writes ``views`` back to back from ``offset``: one ``pwritev`` (the kernel takes few large writes
    fastest), then ``pwrite`` for whatever a short write left."""
    done = os.pwritev(fd, views, offset) if hasattr(os, "pwritev") else 0
    for v in views:
        n = len(v)
        skip = min(done, n)
        done -= skip
        while skip < n:
            skip += os.pwrite(fd, v[skip:], offset + skip)
        offset += n


def _runs(placed: List[Tuple[memoryview, int]]) -> List[Tuple[List[memoryview], int]]:
    """``placed`` (views and their offsets, in file order) as runs that are contiguous in the file."""
    runs: List[Tuple[List[memoryview], int]] = []
    end = -1
    for view, off in placed:
        if off == end and len(runs[-1][0]) < 512:
            runs[-1][0].append(view)
        else:
            runs.append(([view], off))
        end = off + len(view)
    return runs


def nonce(index: int, chunk: int) -> bytes:
    return struct.pack(">IQ", index, chunk)


def _derive(material: bytes, salt: bytes) -> Tuple[bytes, bytes]:
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF
    file_key = HKDF(hashes.SHA256(), 32, salt, FILE_KEY_INFO).derive(material)
    check = HKDF(hashes.SHA256(), KEY_CHECK_BYTES, salt, KEY_CHECK_INFO).derive(material)
    return file_key, check


def _aead(file_key: bytes):
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM
    return AESGCM(file_key)


class Sealer:
    """Seals one list: its tensors chunk by chunk (to a file with ``pwrite``, or to an upload), then its metadata.

    Args:
        key: the user's key.
        chunk_bytes: the chunk size (``spec.DEFAULT_CHUNK``).
        threads: worker threads (default: usable cores, at most 8).
    """

    def __init__(self, key: Key, chunk_bytes: int = DEFAULT_CHUNK, threads: Optional[int] = None):
        self.salt = os.urandom(SALT_BYTES)
        self.kdf = key.kdf
        file_key, self.key_check = _derive(key.material(key.kdf), self.salt)
        self._aead = _aead(file_key)
        self.chunk = chunk_bytes
        self.threads = threads
        self.tags: Dict[int, bytes] = {}  # a tensor's tags, once all its chunks are sealed
        self._pending: Dict[Tuple[int, int], bytes] = {}
        self._counts: Dict[int, int] = {}

    def _jobs(self, tensors: Sequence[Tuple[int, np.ndarray, int]],
              chunks: Optional[Tuple[int, int]] = None) -> List[Tuple[int, int, np.ndarray, int, bool]]:
        """``(index, j, plaintext, offset, last)`` of each chunk to seal, in the order given."""
        C, jobs = self.chunk, []
        for index, data, offset in tensors:
            k = chunk_count(len(data), C)
            self._counts[index] = k
            j0, j1 = chunks if chunks is not None else (0, k)
            jobs.extend((index, j, data[j * C:(j + 1) * C], offset + j * C, j == k - 1) for j in range(j0, j1))
        return jobs

    def _seal_jobs(self, jobs: Sequence[Any], put: Callable[[memoryview, int], None],
                   threads: Optional[int] = None) -> None:
        """Seals ``jobs`` in parallel, each worker through its scratch; ``put(ciphertext, offset)`` as in ``seal``."""
        aead, out = self._aead, self._pending
        into = hasattr(aead, "encrypt_into")

        def work(group, scratch):
            buf = memoryview(scratch)
            for index, j, chunk, off, last in group:
                m = len(chunk)
                if into:
                    aead.encrypt_into(nonce(index, j), chunk, _AAD[last], buf[:m + TAG_BYTES])
                else:  # cryptography < 47
                    buf[:m + TAG_BYTES] = aead.encrypt(nonce(index, j), chunk, _AAD[last])
                if m:
                    put(buf[:m], off)
                out[index, j] = bytes(buf[m:m + TAG_BYTES])

        _run(jobs, work, threads or self.threads, self.chunk + TAG_BYTES)

    def _keep_tags(self, indices: Sequence[int]) -> None:
        """Moves the tags of each tensor of ``indices`` whose chunks are all sealed into ``tags``."""
        out = self._pending
        for index in indices:
            k = self._counts[index]
            if all((index, j) in out for j in range(k)):
                self.tags[index] = b"".join(out.pop((index, j)) for j in range(k))

    def seal(self, tensors: Sequence[Tuple[int, np.ndarray, int]], put: Callable[[memoryview, int], None],
             chunks: Optional[Tuple[int, int]] = None) -> None:
        """Seals ``[(index, uint8 bytes, offset of byte 0)]`` in parallel; keeps each tensor's tags.

        The one chunk scheme of every writer: ``put(ciphertext, offset)`` receives
        each chunk's ciphertext (a scratch view, valid during the call) and
        where it goes, from worker threads; the sink alone differs (``write``:
        ``pwrite`` to a file; ``stream``: an ordered upload). ``chunks=(j0, j1)``
        seals only those chunks of a single tensor; its tags are kept once
        every chunk is sealed.
        """
        self._seal_jobs(self._jobs(tensors, chunks), put)
        self._keep_tags([index for index, _, _ in tensors])

    def write(self, fd: int, tensors: Sequence[Tuple[int, np.ndarray, int]], path: str,
              window: int = 16 << 20) -> None:
        """Seals and writes ``[(index, uint8 bytes, absolute file offset)]``, in file order.

        Workers (all threads but one) seal ``window`` bytes at a time into one
        of three window buffers while a writer thread writes the windows sealed before, in
        order, each run of adjacent chunks with one ``pwritev``: buffered
        writes to one file take turns in the kernel, and few large writes
        front to back are the fastest it takes.
        """
        import queue

        C = self.chunk
        jobs = sorted(self._jobs(tensors), key=lambda job: job[3])
        per = max(1, window // C)
        sealers = max(1, (self.threads or default_threads()) - 1)  # the writer has a core of its own
        buffers = [np.empty(per * C, np.uint8) for _ in range(min(3, -(-len(jobs) // per)))]
        ready: "queue.Queue[Optional[List[Tuple[memoryview, int]]]]" = queue.Queue(maxsize=1)
        failed: List[OSError] = []

        def writer():
            for placed in iter(ready.get, None):
                try:
                    for views, off in _runs(placed) if not failed else ():
                        _pwrite_run(fd, views, off)
                except OSError as e:
                    failed.append(OSError(e.errno, f"{e.strerror} (writing {path!r})"))

        thread = threading.Thread(target=writer, name="tensorlist-aead-writer", daemon=True)
        thread.start()
        try:
            for w, k in enumerate(range(0, len(jobs), per)):
                if failed:
                    break
                window_jobs, into = jobs[k:k + per], memoryview(buffers[w % len(buffers)])
                slots = {job[3]: n * C for n, job in enumerate(window_jobs) if len(job[2])}

                def put(buf, off, into=into, slots=slots):
                    into[slots[off]:slots[off] + len(buf)] = buf

                self._seal_jobs(window_jobs, put, sealers)
                # the queue holds one window: a buffer is refilled only after the writer has taken
                # the window after it, so never while it is being written
                ready.put([(into[slots[job[3]]:slots[job[3]] + len(job[2])], job[3])
                           for job in window_jobs if len(job[2])])
        finally:
            ready.put(None)
            thread.join()
        if failed:
            raise failed[0]
        self._keep_tags([index for index, _, _ in tensors])

    def stream(self, index: int, data: np.ndarray, write: Callable[[np.ndarray], None],
               window: int = 16 << 20) -> None:
        """Seals one tensor in file order, handing ``write`` its ciphertext ``window`` bytes at a time.

        For a sink that only appends (an upload): chunks are sealed in
        parallel a window at a time, so memory stays at one window.
        """
        C = self.chunk
        k = chunk_count(len(data), C)
        step = max(1, window // C)
        for j0 in range(0, k, step):
            j1 = min(k, j0 + step)
            lo = j0 * C
            buf = np.empty(min(len(data), j1 * C) - lo, np.uint8)

            def put(chunk, off, buf=buf, lo=lo):
                buf[off - lo:off - lo + len(chunk)] = np.frombuffer(chunk, np.uint8)

            self.seal([(index, data, 0)], put, (j0, j1))
            if len(buf):
                write(buf)

    def tag_bytes(self, count: int) -> bytes:
        """The tag region of a list of ``count`` tensors, in file order."""
        return b"".join(self.tags[i] for i in range(count))

    def encryption(self, tags_offset: int, tags_length: int) -> Dict[str, Any]:
        """The ``encryption`` object without its ``metadata``."""
        enc: Dict[str, Any] = {"scheme": SCHEME, "chunkBytes": self.chunk, "salt": b64(self.salt),
                               "keyCheck": b64(self.key_check)}
        if self.kdf is not None:
            enc["kdf"] = dict(self.kdf)
        enc["tags"] = {"byteOffset": tags_offset, "byteLength": tags_length}
        return enc

    def seal_metadata(self, header: bytes, metadata_json: str) -> str:
        """The encrypted metadata (JSON text), authenticating the canonical ``header`` with it."""
        return b64(self._aead.encrypt(nonce(HEADER_INDEX, 0), metadata_json.encode("utf-8"), HEADER_AAD + header))


class Opener:
    """Opens one encrypted list: checks the key and the header at once, decrypts tensors on demand.

    Raises:
        EncryptionError: the wrong key, or a descriptor altered since it was sealed.
    """

    def __init__(self, enc: Encryption, key: Key, file: Optional[str], pointer: str = ""):
        self.enc = enc
        self.file = file
        self._field = f"{pointer}/encryption" if pointer else "encryption"
        file_key, check = _derive(key.material(enc.kdf), enc.salt)
        if not hmac.compare_digest(check, enc.key_check):
            raise EncryptionError("the key does not open this file (it was encrypted with another key)", file=file)
        self._aead = _aead(file_key)
        from cryptography.exceptions import InvalidTag
        self._invalid = InvalidTag
        try:
            text = self._aead.decrypt(nonce(HEADER_INDEX, 0), enc.metadata, HEADER_AAD + enc.header)
        except InvalidTag:
            raise EncryptionError("the descriptor was altered after it was sealed (names, dims, dtypes, offsets or "
                                  "metadata fail authentication)", file=file, field=self._field) from None
        self.metadata = loads_strict(text, file=file)
        self._tags: Optional[bytes] = None

    def decrypt(self, table, indices: Sequence[int], outs: Sequence[np.ndarray],
                read_into: Callable[[np.ndarray, int, int], None], read_tags: Callable[[int, int], bytes],
                threads: Optional[int] = None) -> None:
        """Decrypts tensors ``indices`` into the uint8 arrays ``outs`` (each its tensor's length).

        ``read_into(dst, offset, index)`` fills ``dst`` with the ciphertext at
        ``offset`` (relative to the list's region); ``read_tags(offset, n)``
        returns ``n`` bytes of the tag region.
        """
        C, enc = self.enc.chunk_bytes, self.enc
        if self._tags is None:
            self._tags = read_tags(enc.tags_offset, enc.tags_length)
        first = [0]
        for ln in table.lengths:
            first.append(first[-1] + chunk_count(ln, C))
        jobs = []
        for i, out in zip(indices, outs):
            k = chunk_count(table.lengths[i], C)
            jobs.extend((i, j, k, out[j * C:(j + 1) * C], table.offsets[i] + j * C, first[i] + j) for j in range(k))
        aead, tags, invalid = self._aead, self._tags, self._invalid
        into = hasattr(aead, "decrypt_into")

        def work(group, scratch):
            buf = memoryview(scratch)
            for i, j, k, out, off, t in group:
                m = len(out)
                if m:
                    read_into(scratch[:m], off, i)
                buf[m:m + TAG_BYTES] = tags[t * TAG_BYTES:(t + 1) * TAG_BYTES]
                try:
                    if into:
                        aead.decrypt_into(nonce(i, j), buf[:m + TAG_BYTES], _AAD[j == k - 1], memoryview(out))
                    else:  # cryptography < 47
                        out[:] = np.frombuffer(aead.decrypt(nonce(i, j), bytes(buf[:m + TAG_BYTES]), _AAD[j == k - 1]),
                                               np.uint8)
                except invalid:
                    raise EncryptionError(
                        f"chunk {j} of {k} fails authentication: its bytes were altered, moved, cut or taken from "
                        "another file", file=self.file, tensor_index=i,
                        tensor_name=table.names[i] if table.names is not None else None) from None

        _run(jobs, work, threads, C + TAG_BYTES)
