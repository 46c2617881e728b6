"""Encrypted lists on the write side: the layout with its tag region, the sealed bytes, the descriptor.

An encrypted list is laid out as a plain one (the same offsets, alignment and
padding), then its tag region follows the last tensor; each tensor's bytes
are sealed in place (``crypto.cipher.Sealer``) and nothing of the plaintext
reaches the file. The descriptor is a plain one with ``formatVersion`` 2, no
checksums, and the ``encryption`` object holding the sealed metadata
(docs/FORMAT.md, "Encrypted lists"). Every writer that takes ``key=`` comes
here: ``save``, ``Writer``, ``write_data`` and ``save_document``, local
(``pwrite``) or remote (an upload that only appends: ``Seal.stream_list``).
:func:`open_fetched` is the remote reader's side: tensors decrypted from
ciphertext already fetched, by the same ``Opener`` as a local read.
"""
from __future__ import annotations

import os
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist._base.jsonio import dumps
from tensorlist._storage.items import Item, descriptor, tensor_entries
from tensorlist._storage.items import layout as place
from tensorlist.crypto.keys import as_key
from tensorlist.crypto.spec import TAG_BYTES, canonical_header, chunk_count
from tensorlist.format import ENCRYPTED_VERSION

__all__ = ["le_bytes", "tags_length", "Seal", "check_key_use", "open_fetched"]


def check_key_use(key, lamp: bool):
    """``key=`` as a Key (None stays None); lamp has no encrypted lists."""
    key = as_key(key)
    if key is not None and lamp:
        raise ValueError("lamp=True writes what lamp reads, and lamp has no encryption: drop key= or lamp=")
    return key


def le_bytes(array: np.ndarray, swap: int) -> np.ndarray:
    """The bytes a tensor stores (little-endian) as a flat uint8 array; a copy only when they must be swapped."""
    raw = array.reshape(-1).view(np.uint8) if array.size else np.empty(0, np.uint8)
    if swap > 1:
        raw = np.ascontiguousarray(raw.reshape(-1, swap)[:, ::-1]).reshape(-1)
    return raw


def tags_length(lengths: Sequence[int], chunk: int) -> int:
    return TAG_BYTES * sum(chunk_count(n, chunk) for n in lengths)


class Seal:
    """One encrypted list being written: a ``Sealer`` and the list's place in its data file."""

    def __init__(self, key, threads: Optional[int] = None):
        from tensorlist.crypto.cipher import Sealer
        self.sealer = Sealer(as_key(key), threads=threads)

    def write_list(self, fd: int, items: Sequence[Item], start: int, alignment: int,
                   path: str) -> Tuple[List[int], int]:
        """Lays out, seals and writes ``items`` at ``start``, then the tag region.

        Returns:
            (the tensors' offsets relative to ``start``, the list's byteLength).
        """
        rel, length = place(items, start, alignment, False)
        self.sealer.write(fd, [(i, le_bytes(it.array, it.swap), start + o)
                               for i, (it, o) in enumerate(zip(items, rel))], path)
        return rel, self.finish(fd, len(items), start, length, path)

    def stream_list(self, pad_to: Callable[[int], None], write: Callable[[Any], None], items: Sequence[Item],
                    start: int, alignment: int) -> Tuple[List[int], int]:
        """``write_list`` to a sink that only appends (an upload): ``pad_to(offset)`` then ``write(bytes)``."""
        rel, length = place(items, start, alignment, False)
        for i, (it, o) in enumerate(zip(items, rel)):
            if it.nbytes:  # an empty tensor has a tag only (its rounded offset may lie past the list)
                pad_to(start + o)
            self.sealer.stream(i, le_bytes(it.array, it.swap), write)
        pad_to(start + length)
        tags = self.tag_region(len(items), length)
        write(tags)
        return rel, length + len(tags)

    def tag_region(self, count: int, end: int) -> bytes:
        """The tag region of ``count`` sealed tensors, placed at ``end`` of the list's region."""
        tags = self.sealer.tag_bytes(count)
        self.tags_at = (end, len(tags))
        return tags

    def finish(self, fd: int, count: int, start: int, end: int, path: str) -> int:
        """Writes the tag region of ``count`` sealed tensors at ``start + end``; returns the byteLength."""
        tags = self.tag_region(count, end)
        view, done = memoryview(tags), 0
        while done < len(tags):
            done += os.pwrite(fd, view[done:], start + end + done)
        return end + len(tags)

    def seal_missing(self, count: int, put: Callable[[memoryview, int], None] = None) -> None:
        """Seals the tensors of ``count`` with no tags yet: the empty ones a Writer never wrote."""
        for i in range(count):
            if i not in self.sealer.tags:
                self.sealer.seal([(i, np.empty(0, np.uint8), 0)], put or (lambda buf, off: None))

    def descriptor(self, entries: List[Dict[str, Any]], location: str, start: int, length: int,
                   metadata: Any) -> Dict[str, Any]:
        """The list's descriptor: ``entries`` (no crc32c), formatVersion 2, the sealed metadata."""
        d = descriptor(entries, location, start, length, None, False)
        d["formatVersion"] = ENCRYPTED_VERSION
        enc = self.sealer.encryption(*self.tags_at)
        named = bool(entries) and "name" in entries[0]
        header = canonical_header(enc, [e["name"] for e in entries] if named else None,
                                  [e["dataType"] for e in entries], [e["dims"] for e in entries],
                                  [e["byteOffset"] for e in entries], [e["byteLength"] for e in entries],
                                  start, length)
        enc["metadata"] = self.sealer.seal_metadata(header, dumps(metadata))
        d["encryption"] = enc
        return d

    def list_descriptor(self, items: Sequence[Item], rel: List[int], location: str, start: int, length: int,
                        metadata: Any) -> Dict[str, Any]:
        return self.descriptor(tensor_entries(items, rel, None, False), location, start, length, metadata)


def open_fetched(opener, table, indices: Sequence[int], fetched: Dict[int, Any],
                 read_tags: Callable[[int, int], bytes]) -> Dict[int, np.ndarray]:
    """Tensors ``indices`` decrypted into private memory from ``fetched[i]``, each one's ciphertext.

    ``read_tags(offset, n)`` returns the list's tag region (fetched once per
    Opener). An empty tensor's tag is checked too.
    """
    from tensorlist._base.lowlevel import alloc
    outs = {i: alloc(table.lengths[i], huge=True) for i in indices}

    def read_into(dst, offset, i):
        rel = offset - table.offsets[i]
        dst[:] = np.frombuffer(fetched[i], np.uint8, len(dst), rel)

    order = list(outs)
    opener.decrypt(table, order, [outs[i] for i in order], read_into, read_tags)
    return outs
