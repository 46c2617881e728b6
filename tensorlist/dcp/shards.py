"""A DCP checkpoint's shards, opened and checked (step 5), and their readers: ``read_full``, ``validate_checkpoint``.

Step 5: each shard file is a valid TensorList (every rule of FORMAT.md 2.3: a
truncated data file is refused) and holds the named tensor with the chunk's
dtype and shape (uint8 ``[byteLength]`` for bytes).

Encrypted shards (``TensorListWriter(encryption_key=)``) are read with
``key=``: each chunk is then decrypted whole through its shard's reader,
never located for a raw byte-range read (:meth:`Shards.locate` refuses).

Imports ``dcp.layout``, ``dcp.metadata``, ``dcp.tiling``, ``reader``, ``format``, ``dtypes``, ``errors``
and numpy; never torch.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional, Tuple

import numpy as np

from tensorlist._base import dtypes
from tensorlist.errors import EncryptionError, FormatError
from tensorlist.format import Limits
from tensorlist.reader import Reader, read_mode
from tensorlist.dcp.layout import StorageEntry, TensorMeta, confine, decode_value, join
from tensorlist.dcp.metadata import read_metadata
from tensorlist.dcp.tiling import numel


class Shards:
    """The shard files of a checkpoint, each opened once when first needed and checked (step 5).

    Args:
        path: the checkpoint directory (a local path or a URL).
        mmap: map the data files (zero-copy, read-only views); ``"copy"``
            maps them copy-on-write (writable views, the files never change);
            False reads with pread (safer where files may be truncated under
            the reader). Anything else is a ValueError.
        verify: check each tensor's CRC32C when it is first read.
        limits: policy limits for the shard descriptors.
        key: the key of encrypted shards (a ``tensorlist.Key`` or 32 bytes);
            a shard it does not open raises ``EncryptionError`` naming it.

    Example:
        >>> ckpt = read_metadata(ckpt_dir)  # doctest: +SKIP
        >>> with Shards(ckpt.path) as shards:  # doctest: +SKIP
        ...     arrays = [shards.array(e) for e in ckpt.storage.values() if e.offset is not None]
    """

    def __init__(self, path, *, mmap=True, verify: bool = False, limits: Limits = Limits(), key=None):
        self.path = os.fspath(path)
        self.key = key
        self.mmap = read_mode(mmap)
        self.verify = verify
        self.limits = limits
        self._readers: Dict[str, Any] = {}

    def reader(self, name: str):
        """The open reader of shard ``name`` (opened and checked on first use)."""
        r = self._readers.get(name)
        if r is None:
            path = confine(self.path, name, "shard file")
            try:
                r = Reader(path, mmap=self.mmap, max_descriptor_bytes=self.limits.max_descriptor_bytes,
                           max_tensors=self.limits.max_tensors, max_total_bytes=self.limits.max_total_bytes,
                           key=self.key)
            except FileNotFoundError as e:
                missing = getattr(e, "filename", None) or path
                raise FormatError(f"shard file {name!r} of the checkpoint is missing ({missing})",
                                  file=path) from e
            self._readers[name] = r
        return r

    def _checked(self, entry: StorageEntry, verify: Optional[bool] = None):
        r = self.reader(entry.file)
        where = "the bytes value" if entry.offset is None else f"the chunk at offsets {list(entry.offset)}"
        if entry.tensor not in r:
            raise FormatError(f"{entry.fqn!r}: {where} should be tensor {entry.tensor!r}, which the shard lacks",
                              file=r.path)
        info = r.info(entry.tensor)
        if info.dtype.name != entry.dtype or tuple(info.shape) != tuple(entry.shape):
            raise FormatError(f"{entry.fqn!r}: the metadata says {where} is {entry.dtype}{list(entry.shape)}, the "
                              f"shard holds {info.dtype.name}{list(info.shape)}", file=r.path,
                              tensor_index=info.index, tensor_name=entry.tensor)
        if self.verify if verify is None else verify:
            r.verify([entry.tensor])
        return r

    def check(self, entry: StorageEntry) -> None:
        """Opens the entry's shard and checks its tensor's dtype and shape (and CRC with ``verify``)."""
        self._checked(entry)

    def check_all(self, ckpt, *, verify: bool = False) -> None:
        """Opens every shard of ``ckpt`` (a :class:`Checkpoint`) and checks every entry: before a byte is allocated.

        Each shard's descriptor is read and checked (its data file long enough
        for what it holds), and each entry's tensor is there with its dtype and
        shape, so a metadata that promises more than the shards hold is a
        FormatError naming the shard, never a MemoryError. ``verify`` also
        checks each entry's CRC32C here (reading every byte).
        """
        for name in ckpt.files:
            self.reader(name)
        for entry in ckpt.storage.values():
            self._checked(entry, verify)

    def locate(self, entry: StorageEntry) -> Tuple[str, int, str]:
        """Where a stored chunk's bytes lie: ``(data file, byte offset in it, shard descriptor)``, checked first.

        For the raw byte-range reads of ``dcp.ranges``, which bypass the reader: an encrypted shard's bytes
        there are ciphertext, so it is refused (``EncryptionError`` naming the shard) and read whole with
        its key through :meth:`array` instead.
        """
        r = self._checked(entry, False)
        if r.encrypted:
            r.require_key()
            raise EncryptionError("the shard is encrypted: its chunks are read whole through the keyed reader, "
                                  "never as raw byte ranges", file=r.path, tensor_name=entry.tensor)
        d = r.descriptor
        return d.data_path, d.byte_offset + r.info(entry.tensor).byte_offset, r.path

    def array(self, entry: StorageEntry) -> np.ndarray:
        """The stored chunk (a read-only view of the mapped file with ``mmap``), checked against the metadata."""
        return self._checked(entry)[entry.tensor]

    def raw(self, entry: StorageEntry) -> bytes:
        """The stored bytes of a bytes value."""
        return self.array(entry).tobytes()

    def value(self, entry: StorageEntry) -> Any:
        """A bytes value decoded (:func:`decode_value`)."""
        return decode_value(self.raw(entry), entry, join(self.path, entry.file))

    def close(self) -> None:
        """Closes every opened shard; arrays already returned stay valid."""
        for r in self._readers.values():
            r.close()
        self._readers.clear()

    def __enter__(self) -> "Shards":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def validate_checkpoint(path, *, verify: bool = False, schema: bool = True, limits: Limits = Limits(),
                        key=None) -> Checkpoint:
    """Checks a whole checkpoint: the metadata, then every shard file and every stored chunk.

    Args:
        path: the checkpoint directory (a local path or a URL).
        verify: also check every tensor's CRC32C (reads every byte).
        schema: also validate the metadata with jsonschema against the shipped schema.
        limits: policy limits for the metadata and the shard descriptors.
        key: opens encrypted shards (their bytes entries are decoded, so it is needed).

    Returns:
        the checked :class:`Checkpoint`.

    Raises:
        FileNotFoundError: no committed checkpoint in ``path``.
        FormatError: the first rule broken (module docstring), naming the file
            and the fqn: a missing or truncated shard, a chunk that does not
            match its stored tensor, overlapping chunks, a gap...
    """
    ckpt = read_metadata(path, limits=limits, schema=schema)
    with Shards(ckpt.path, mmap=False, limits=limits, key=key) as shards:
        shards.check_all(ckpt, verify=verify)
        for fqn in ckpt.bytes_keys:  # each value decodes (a malformed tagged value is refused here too)
            shards.value(ckpt.storage[(fqn, None)])
    return ckpt


def read_full(path, *, verify: bool = False, mmap=True, limits: Limits = Limits(), key=None) -> Dict[str, Any]:
    """Every tensor of a checkpoint assembled whole from its chunks, with numpy alone.

    Args:
        path: the checkpoint directory (a local path or a URL).
        verify: check the CRC32C of every chunk read.
        mmap: read the shards through memory maps (the default; ``"copy"`` is
            accepted, the result being new arrays anyway) or with pread.
        limits: policy limits for the metadata and the shard descriptors.
        key: opens encrypted shards (each chunk decrypted into private memory).

    Returns:
        fqn -> value, in the saved state dict's order (flattened keys, as DCP
        stores them): a new numpy array per tensor (bfloat16/float8 through
        ml_dtypes), the decoded value per JSON bytes entry, and the raw bytes
        of a ``torch_save`` entry (a pickle: never unpickled here).

    Raises:
        FileNotFoundError: no committed checkpoint in ``path``.
        FormatError: as :func:`validate_checkpoint`.

    Example:
        >>> import numpy as np
        >>> read_full(ckpt_dir)["model.weight"].shape  # doctest: +SKIP
        (1024, 512)
    """
    mmap = read_mode(mmap)
    ckpt = read_metadata(path, limits=limits)
    out: Dict[str, Any] = {}
    with Shards(ckpt.path, mmap=mmap, verify=verify, limits=limits, key=key) as shards:
        shards.check_all(ckpt)  # every shard there and holding its chunks before a tensor is allocated
        for fqn, t in ckpt.entries.items():
            if t is None:
                out[fqn] = shards.value(ckpt.storage[(fqn, None)])
            else:
                out[fqn] = assemble(t, lambda off, fqn=fqn: shards.array(ckpt.storage[(fqn, off)]), copy=True)
    return out


def assemble(t: TensorMeta, chunk, *, copy: bool = False) -> np.ndarray:
    """The whole tensor ``t`` from its chunks, ``chunk(offsets)`` giving each (checked metadata: they tile it).

    A tensor saved as one chunk comes back as that chunk itself (a view of a
    mapped shard, say) unless ``copy``; empty chunks are not asked for.
    """
    if len(t.chunks) == 1 and tuple(t.chunks[0][1]) == tuple(t.size):
        part = chunk(t.chunks[0][0])
        return np.array(part) if copy else part
    full = np.empty(t.size, dtype=dtypes.from_name(t.dtype).numpy)
    for off, sz in t.chunks:
        if numel(sz):
            full[tuple(slice(o, o + s) for o, s in zip(off, sz))] = chunk(off)
    return full
