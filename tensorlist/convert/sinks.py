"""Sinks: each format's writer, and :func:`convert`, which streams a source into one.

Every destination is written the one way the package replaces a file
(``tensorlist._commit``): under a temporary name beside it, fsynced, renamed
into place, the directory fsynced; a failure removes the temporary file and
leaves the old destination as it was. tensorlist and lamp files go through
:class:`tensorlist.Writer`, which commits data then descriptor; a Hugging Face
checkpoint renames all its shards, then its index last. ``durable=False``
skips the fsyncs (not the renames) whatever the format.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import zipfile
from typing import Any, Dict, List, Optional, Sequence

import numpy as np

from .._backends import is_remote, localize
from .._commit import atomic_file, durable_replace, tmp_beside
from .._jsonio import dumps
from ..writer import Writer
from .formats import DEFAULT_SHARD_BYTES, NPZ_SIDECAR, RAW_DTYPES, ST_NAMES, UINT, Entry, Source, check_format, \
    infer_format
from .sources import open_source

__all__ = ["convert", "Progress"]


class Progress:
    """A tqdm bar over the bytes converted, on stderr (or nothing, without tqdm or a terminal)."""

    def __init__(self, total: int, desc: str, enabled: Optional[bool]):
        self.bar = None
        if enabled is None:
            enabled = sys.stderr.isatty()
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            import shutil

            # a terminal that reports a 0 x 0 size (a fresh pty) would get no bar at all from tqdm
            size = shutil.get_terminal_size((80, 24))
            self.bar = tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                            file=sys.stderr, leave=True, ncols=size.columns, nrows=size.lines or 24)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _checked_destination(dst: str) -> None:
    if os.path.isdir(dst):
        raise IsADirectoryError(f"{dst} is a directory")
    parent = os.path.dirname(os.path.abspath(dst))
    if not os.path.isdir(parent):
        raise FileNotFoundError(f"{parent}: no such directory for {dst}")


def _bytes_of(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")


def _write_tensorlist(src: Source, dst: str, lamp: bool, bar: Progress, durable: bool, options: dict) -> None:
    metadata = None if lamp else src.metadata
    if not is_remote(dst):
        _checked_destination(dst)
    with Writer(dst, metadata=metadata, lamp=lamp, durable=durable, **options) as w:
        for e in src.entries:
            a = e.array()
            if src.named and not lamp:
                w.add(e.name, a)
            else:
                w.add(a)
            bar.update(e.nbytes)


# --- safetensors and Hugging Face shards ---------------------------------------------

def _st_metadata_out(metadata: Any) -> Optional[Dict[str, str]]:
    if metadata is None:
        return None
    if isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()):
        return dict(metadata)
    return {"tensorlist.metadata": dumps(metadata)}


def _st_header(entries: Sequence[Entry], metadata: Optional[Dict[str, str]], extra_pad_to: int = 8) -> bytes:
    header: Dict[str, Any] = {}
    if metadata:
        header["__metadata__"] = metadata
    off = 0
    for e in entries:
        if e.dtype.name not in ST_NAMES:
            raise TypeError(f"tensor {e.name!r}: dtype {e.dtype.name} cannot be stored in safetensors")
        header[e.name] = {"dtype": ST_NAMES[e.dtype.name], "shape": list(e.shape),
                          "data_offsets": [off, off + e.nbytes]}
        off += e.nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    text += b" " * (-len(text) % extra_pad_to)
    return struct.pack("<Q", len(text)) + text


def _write_st_file(path: str, entries: Sequence[Entry], metadata, bar: Progress) -> None:
    """Writes a safetensors file at ``path`` (a temporary name: the caller fsyncs and renames it)."""
    with open(path, "wb") as f:
        f.write(_st_header(entries, metadata))
        for e in entries:
            f.write(_bytes_of(e.array()))
            bar.update(e.nbytes)


def _write_safetensors(src: Source, dst: str, bar: Progress, durable: bool, options: dict) -> None:
    _checked_destination(dst)
    with atomic_file(dst, durable=durable) as tmp:
        _write_st_file(tmp, src.entries, _st_metadata_out(src.metadata), bar)


def _shard_names(dst: str, n: int) -> List[str]:
    base = os.path.basename(dst)
    stem = base[: -len(".safetensors.index.json")] if base.endswith(".safetensors.index.json") else \
        base[: -len(".index.json")] if base.endswith(".index.json") else base
    return [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _write_hf(src: Source, dst: str, bar: Progress, durable: bool, options: dict) -> None:
    """Shards, then the index, each under a temporary name; then all shards renamed, the index last.

    Everything is written before the first rename, so a failure while writing
    leaves the old checkpoint whole; the renames themselves put the index last,
    so a reader never meets an index naming a shard that is not yet in place.
    (Shard names depend on the shard count only, as transformers names them: a
    checkpoint with as many shards in the same directory has its shards
    replaced one by one during those renames.)
    """
    _checked_destination(dst)
    limit = int(options.get("shard_bytes") or DEFAULT_SHARD_BYTES)
    shards: List[List[Entry]] = [[]]
    size = 0
    for e in src.entries:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    names = _shard_names(dst, len(shards))
    folder = os.path.dirname(os.path.abspath(dst))
    finals = [os.path.join(folder, name) for name in names] + [os.path.abspath(dst)]
    tmps: List[str] = []
    placed: List[str] = []
    try:
        for final, entries in zip(finals, shards):
            tmps.append(tmp_beside(final))
            _write_st_file(tmps[-1], entries, {"format": "pt"}, bar)
        meta: Dict[str, Any] = {"total_size": src.nbytes}
        if src.metadata is not None:
            meta["tensorlist_metadata"] = src.metadata
        index = {"metadata": meta,
                 "weight_map": {e.name: name for name, entries in zip(names, shards) for e in entries}}
        tmps.append(tmp_beside(dst))
        with open(tmps[-1], "w", encoding="utf-8") as f:
            f.write(json.dumps(index, indent=2, ensure_ascii=False) + "\n")
        for tmp, final in zip(tmps, finals):
            durable_replace(tmp, final, durable)
            placed.append(final)
    except BaseException:
        for p in tmps + placed[:len(names)]:
            try:
                os.unlink(p)
            except OSError:
                pass
        raise


# --- numpy and torch ---------------------------------------------------------------

def _write_npz(src: Source, dst: str, bar: Progress, durable: bool, options: dict) -> None:
    _checked_destination(dst)
    side: Dict[str, Any] = {"named": src.named}
    raw = {e.name: e.dtype.name for e in src.entries if e.dtype.name in RAW_DTYPES}
    if raw:
        side["dtypes"] = raw
    if src.metadata is not None:
        side["metadata"] = src.metadata
    with atomic_file(dst, durable=durable) as tmp:
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED, allowZip64=True) as z:
            for e in src.entries:
                if e.name == NPZ_SIDECAR:
                    raise ValueError(f"tensor name {NPZ_SIDECAR!r} is reserved in .npz files")
                a = e.array()
                if e.dtype.name in RAW_DTYPES:
                    a = a.view(UINT[e.dtype.itemsize])
                with z.open(e.name + ".npy", "w", force_zip64=True) as f:
                    np.lib.format.write_array(f, a, allow_pickle=False)
                bar.update(e.nbytes)
            if side != {"named": True}:
                with z.open(NPZ_SIDECAR + ".npy", "w") as f:
                    np.lib.format.write_array(f, np.array(json.dumps(side)), allow_pickle=False)


def _write_npy(src: Source, dst: str, bar: Progress, durable: bool, options: dict) -> None:
    _checked_destination(dst)
    if len(src.entries) != 1:
        raise ValueError(f"a .npy file holds exactly one array, {src.path} has {len(src.entries)} tensors "
                         "(convert to .npz instead)")
    e = src.entries[0]
    if e.dtype.name in RAW_DTYPES:
        raise ValueError(f"tensor {e.name!r}: {e.dtype.name} has no .npy dtype and would not read back "
                         "(convert to .npz, which keeps it)")
    with atomic_file(dst, durable=durable) as tmp:
        with open(tmp, "wb") as f:
            np.lib.format.write_array(f, e.array(), allow_pickle=False)
        bar.update(e.nbytes)


def _write_pt(src: Source, dst: str, bar: Progress, durable: bool, options: dict) -> None:
    import torch

    from .._torch_bridge import from_numpy

    _checked_destination(dst)
    state: Dict[str, Any] = {}
    for e in src.entries:
        state[e.name] = from_numpy(e.array())  # views of the mapped source: torch.save reads them once
        bar.update(e.nbytes)
    with atomic_file(dst, durable=durable) as tmp:
        torch.save(state if src.named else list(state.values()), tmp)


_WRITERS = {"safetensors": _write_safetensors, "hf": _write_hf, "npz": _write_npz, "npy": _write_npy,
            "pt": _write_pt}


def convert(src, dst, *, src_format: Optional[str] = None, dst_format: Optional[str] = None,
            progress: Optional[bool] = None, allow_outside: bool = False, shard_bytes: Optional[int] = None,
            pointer: Optional[str] = None, durable: bool = True, **writer_options) -> None:
    """Converts ``src`` into ``dst``, tensor by tensor, bit for bit.

    Args:
        src, dst: paths (or, for tensorlist/lamp files, fsspec URLs).
        src_format, dst_format: one of ``FORMATS``; inferred from the names when None.
        progress: show a tqdm progress bar on stderr (None: when stderr is a terminal).
        allow_outside: trust a tensorlist data file or Hugging Face shard outside its directory.
        pointer: the list to convert in a tensorlist document embedding several (``/model``).
        shard_bytes: largest shard of a Hugging Face destination (default 5 GB).
        durable: fsync the destination and its directory before returning, whatever the format
            (False keeps the atomic rename but may lose the file to a power cut).
        **writer_options: passed to :class:`tensorlist.Writer` for tensorlist destinations
            (``alignment``, ``checksum``...).

    Raises:
        FormatError: the source is not a valid file of its format (nothing is written).
        ValueError, TypeError: the destination format cannot hold the source's tensors.
        OSError: a file cannot be read or written.
    """
    src, dst = localize(os.fspath(src)), localize(os.fspath(dst))
    dst_format = check_format(dst_format or infer_format(dst))
    if is_remote(dst) and dst_format not in ("tensorlist", "lamp"):
        raise ValueError(f"{dst}: remote URLs are supported for tensorlist and lamp files, not {dst_format}")
    if not is_remote(src) and not is_remote(dst) and os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"{src} and {dst} are the same file")
    with open_source(src, src_format, allow_outside=allow_outside, pointer=pointer) as s:
        bar = Progress(s.nbytes, os.path.basename(dst), progress)
        try:
            if dst_format in ("tensorlist", "lamp"):
                _write_tensorlist(s, dst, dst_format == "lamp", bar, durable, writer_options)
            else:
                if writer_options:
                    raise TypeError(f"unexpected options for {dst_format}: {sorted(writer_options)}")
                _WRITERS[dst_format](s, dst, bar, durable, {"shard_bytes": shard_bytes})
        finally:
            bar.close()
