"""Sinks: each format's writer, and :func:`convert`, which streams a source into one.

Every destination is written the one way the package replaces a file
(``tensorlist._storage.commit``): under a temporary name beside it, fsynced, renamed
into place, the directory fsynced; a failure removes the temporary file and
leaves the old destination as it was. Before that, :func:`_outputs` names every
file (or directory) a conversion will write, so that the one overwrite rule
(``tensorlist._storage.destinations``) checks them all before the first is
written, and the missing directories above them are made. tensorlist and lamp files go through
:class:`tensorlist.Writer`, which commits data then descriptor; a Hugging Face
checkpoint renames all its shards, then its index last. ``durable=False``
skips the fsyncs (not the renames) whatever the format.
"""
from __future__ import annotations

import json
import os
import struct
import sys
import warnings
import zipfile
from typing import Any, Dict, List, Optional, Sequence, Tuple

import numpy as np

from tensorlist._base.backends import is_remote, localize
from tensorlist._storage.commit import atomic_file, durable_replace, tmp_beside
from tensorlist._storage.destinations import made_directories, refuse_existing
from tensorlist._base.jsonio import dumps
from tensorlist._base.terminal import escape_controls, raw_stream
from tensorlist.format import Limits, short_repr
from tensorlist.writer import Writer
from tensorlist.convert.dcp import DcpSource, write_dcp
from tensorlist.convert.formats import DCP_FORMATS, DEFAULT_SHARD_BYTES, MAX_SAFETENSORS_HEADER, NPZ_SIDECAR, RAW_DTYPES, ST_NAMES, \
    ST_RANK, UINT, Entry, MetadataDroppedWarning, Source, check_format, check_limits, infer_format, st_shape
from tensorlist.convert.modeldir import MODEL_FORMATS, convert_model_dir
from tensorlist.convert.sources import SafetensorsFile, open_source

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

            # a terminal that reports a 0 x 0 size (a fresh pty) would get no bar at all from tqdm;
            # Python < 3.11 returns that 0 x 0 as is rather than the fallback
            size = shutil.get_terminal_size((80, 24))
            # the bar's own carriage returns go to the terminal as they are; the description (a file's name)
            # is escaped as the CLI escapes all it prints
            self.bar = tqdm(total=total, desc=escape_controls(desc), unit="B", unit_scale=True, unit_divisor=1024,
                            file=raw_stream(sys.stderr), leave=True, ncols=size.columns or 80,
                            nrows=size.lines or 24)

    def update(self, n: int) -> None:
        if self.bar is not None:
            self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _checked_destination(dst: str) -> None:
    if os.path.isdir(dst):
        raise IsADirectoryError(f"{dst}: is a directory")


def _bytes_of(a: np.ndarray) -> memoryview:
    return memoryview(a.reshape(-1).view(np.uint8)) if a.size else memoryview(b"")


def _write_tensorlist(src: Source, dst: str, lamp: bool, bar: Progress, durable: bool, options: dict) -> None:
    metadata = None if lamp else src.metadata  # lamp files hold none: convert() warned
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

def _st_metadata_out(metadata: Any) -> Dict[str, str]:
    """The ``__metadata__`` of a safetensors destination: ``"format": "pt"`` first, as Hugging Face writes it.

    ``huggingface_hub.load_torch_model`` and transformers refuse a file whose
    metadata lacks a ``format`` of ``pt`` (or ``mlx``), so one is always
    written (unless the metadata has a ``format`` of its own); string metadata
    follows as it is, any other JSON under ``tensorlist.metadata``.
    """
    if metadata is None:
        return {"format": "pt"}
    if isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values()):
        # kept in its own order (a file read and written back keeps its header's bytes)
        return dict(metadata) if "format" in metadata else {"format": "pt", **metadata}
    return {"format": "pt", "tensorlist.metadata": dumps(metadata)}


def _st_order(entries: Sequence[Entry]) -> List[Entry]:
    """The entries in the order safetensors' writer lays them out: by dtype, widest first, then by name.

    Back to back in that order, after a header padded to a multiple of 8, each
    tensor starts at a multiple of its item size in the file, so readers can map
    it zero-copy; and the bytes are the ones ``safetensors.torch.save_file``
    writes for the same tensors and metadata.
    """
    for e in entries:
        if e.name == "__metadata__":
            raise ValueError("tensor name '__metadata__' is reserved in safetensors files (the metadata key)")
        if e.dtype.name not in ST_NAMES:
            raise TypeError(f"tensor {e.name!r}: safetensors has no {e.dtype.name} dtype "
                            "(its complex type is C64 only); convert to .tl, .npz or .pt instead")
    return sorted(entries, key=lambda e: (-ST_RANK[ST_NAMES[e.dtype.name]], e.name.encode("utf-8", "surrogatepass")))


def _st_header(entries: Sequence[Entry], metadata: Optional[Dict[str, str]],
               order: Optional[Sequence[Entry]] = None) -> bytes:
    """The 8-byte length and the header of ``entries`` (laid out in :func:`_st_order`), padded to 8 with spaces.

    The header lists the tensors in ``order`` (the source's; by default the
    layout's), which the reader gives back: a list converted to safetensors and
    back keeps its order, and with it its ``weights_sha256``. A source already
    in layout order (what the safetensors library writes) gives its bytes.
    """
    rows: Dict[str, Any] = {}
    off = 0
    for e in entries:
        st = ST_NAMES[e.dtype.name]
        try:
            shape = st_shape(st, e.shape)
        except ValueError as why:
            raise ValueError(f"tensor {e.name!r}: {why}") from None
        rows[e.name] = {"dtype": st, "shape": shape,
                        "data_offsets": [off, off + e.nbytes]}
        off += e.nbytes
    header: Dict[str, Any] = {"__metadata__": metadata} if metadata else {}
    header.update((e.name, rows[e.name]) for e in (entries if order is None else order))
    try:
        text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(f"a tensor name or metadata string is not valid Unicode ({e.reason}): safetensors "
                         "headers are UTF-8") from None
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_SAFETENSORS_HEADER:
        raise ValueError(f"the safetensors header would be {len(text)} bytes, above safetensors' limit of "
                         f"{MAX_SAFETENSORS_HEADER} (too many tensors or too much metadata for one file)")
    return struct.pack("<Q", len(text)) + text


def _write_st_file(path: str, entries: Sequence[Entry], metadata, bar: Progress, keep_order: bool = True) -> None:
    """Writes a safetensors file at ``path`` (a temporary name: the caller fsyncs and renames it).

    ``keep_order``: the header lists ``entries`` in their order; otherwise in the
    layout's, as for a Hugging Face shard, whose index keeps the order.
    """
    layout = _st_order(entries)
    header = _st_header(layout, metadata, order=entries if keep_order else None)
    with open(path, "wb") as f:
        f.write(header)
        for e in layout:
            f.write(_bytes_of(e.array()))
            bar.update(e.nbytes)


def _write_safetensors(src: Source, dst: str, bar: Progress, durable: bool, options: dict) -> None:
    _checked_destination(dst)
    metadata = _st_metadata_out(src.metadata)
    _st_header(_st_order(src.entries), metadata)  # every refusal before the destination is touched
    with atomic_file(dst, durable=durable) as tmp:
        _write_st_file(tmp, src.entries, metadata, bar)


def _shard_names(dst: str, n: int) -> List[str]:
    base = os.path.basename(dst)
    stem = base[: -len(".safetensors.index.json")] if base.endswith(".safetensors.index.json") else \
        base[: -len(".index.json")] if base.endswith(".index.json") else base
    return [f"{stem}-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]


def _hf_shards(entries: Sequence[Entry], limit: int) -> List[List[Entry]]:
    """Greedy shards, in order: a shard is closed when the next tensor would take it past ``limit``.

    On a state_dict this is ``huggingface_hub.split_torch_state_dict_into_shards``
    (except that a tensor larger than ``limit``, which gets a shard of its own
    either way, is not moved before the shard being filled). On the order of an
    index's ``weight_map`` (shard by shard, which is how a Hugging Face
    checkpoint reads) it gives back the shards the index had, big tensors
    included: an index read and written with its ``max_shard_size`` keeps its
    ``weight_map`` and its shards' bytes.
    """
    shards: List[List[Entry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > limit:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards


def _hf_files(src: Source, dst: str, shard_bytes: Optional[int]) -> List[str]:
    """The shards (in order), then the index, that a Hugging Face destination ``dst`` is written as."""
    shards = _hf_shards(src.entries, int(shard_bytes or DEFAULT_SHARD_BYTES))
    folder = os.path.dirname(os.path.abspath(dst))
    return [os.path.join(folder, name) for name in _shard_names(dst, len(shards))] + [os.path.abspath(dst)]


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
    shards = _hf_shards(src.entries, int(options.get("shard_bytes") or DEFAULT_SHARD_BYTES))
    for entries in shards:
        _st_header(_st_order(entries), {"format": "pt"})  # every refusal before anything is written
    names = _shard_names(dst, len(shards))
    finals = _hf_files(src, dst, options.get("shard_bytes"))
    tmps: List[str] = []
    placed: List[str] = []
    try:
        for final, entries in zip(finals, shards):
            tmps.append(tmp_beside(final))
            _write_st_file(tmps[-1], entries, {"format": "pt"}, bar, keep_order=False)
        meta = _hf_metadata_out(src.metadata, src.nbytes)
        index = {"metadata": meta,
                 "weight_map": {e.name: name for name, entries in zip(names, shards) for e in entries}}
        tmps.append(tmp_beside(dst))
        with open(tmps[-1], "w", encoding="ascii") as f:
            f.write(json.dumps(index, indent=2))  # as huggingface_hub's save_torch_state_dict writes it
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


def _hf_metadata_out(metadata: Any, total: int) -> Dict[str, Any]:
    """An index's ``metadata``: ``total_size`` first, then the source's keys beside it, as Hugging Face writes them.

    ``save_torch_state_dict(metadata={"run": "x"})`` writes ``{"total_size": N,
    "run": "x"}`` (and the tied weights it dropped as ``name: kept name``);
    metadata read from such an index comes back there key for key. Metadata
    that is not an object, or that would clash with ``total_size``, goes under
    ``tensorlist_metadata`` instead.
    """
    meta: Dict[str, Any] = {"total_size": total}
    if metadata is None:
        return meta
    if isinstance(metadata, dict) and "tensorlist_metadata" not in metadata and \
            isinstance(metadata.get("total_size", total), int):
        meta.update(metadata)  # a total_size kept there is the one the index it came from said
        return meta
    meta["tensorlist_metadata"] = metadata
    return meta


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

    from tensorlist._bridges.torch import from_numpy

    _checked_destination(dst)
    state: Dict[str, Any] = {}
    for e in src.entries:
        state[e.name] = from_numpy(e.array())  # views of the mapped source: torch.save reads them once
        bar.update(e.nbytes)
    with atomic_file(dst, durable=durable) as tmp:
        torch.save(state if src.named else list(state.values()), tmp)


_WRITERS = {"safetensors": _write_safetensors, "hf": _write_hf, "npz": _write_npz, "npy": _write_npy,
            "pt": _write_pt, "dcp": write_dcp}


def _outputs(fmt: str, src: Source, dst: str, shard_bytes: Optional[int]) -> Tuple[List[str], List[str]]:
    """(the files, the directories) that writing ``src`` to ``dst`` as ``fmt`` creates or replaces.

    A tensorlist file's data file gets a fresh name (``<dst>.<8 hex>.data``): only
    the descriptor can be in the way. lamp's data file has lamp's fixed name.
    """
    if fmt == "dcp":
        return [], [dst]
    if fmt == "lamp":
        return [dst, dst + ".data"], []
    if fmt == "hf":
        return _hf_files(src, dst, shard_bytes), []
    return [dst], []


def _destination_format(dst: str, src: str, src_format: Optional[str]) -> str:
    """The destination's format from its name; a checkpoint directory for a checkpoint's name without an extension."""
    fmt = infer_format(dst)
    base = os.path.basename(dst.rstrip("/"))
    if fmt == "tensorlist" and "." not in base and (src_format or infer_format(src, for_reading=True)) in DCP_FORMATS:
        return "dcp"
    return fmt


def convert(src, dst, *, src_format: Optional[str] = None, dst_format: Optional[str] = None,
            progress: Optional[bool] = None, allow_outside: bool = False, shard_bytes: Optional[int] = None,
            pointer: Optional[str] = None, durable: bool = True, max_tensors: Optional[int] = None,
            max_total_bytes: Optional[int] = None, overwrite: bool = True, **writer_options) -> None:
    """Converts ``src`` into ``dst``, tensor by tensor, bit for bit.

    Args:
        src, dst: paths (or, for tensorlist/lamp files and checkpoints of both layouts, fsspec URLs); checkpoint
            directories for ``dcp`` (source and destination) and ``torch-dcp`` (source only); model
            directories for ``hf-model`` and ``tensorlist-model``, each converted into the other
            (``modeldir.convert_model_dir``).
        src_format, dst_format: one of ``FORMATS``; inferred from the names when None (a directory,
            a name ending with ``/``, or the name without an extension of a checkpoint's copy: ``dcp``).
        progress: show a tqdm progress bar on stderr (None: when stderr is a terminal).
        allow_outside: trust a tensorlist data file or Hugging Face shard outside its directory.
        pointer: the list to convert in a tensorlist document embedding several (``/model``).
        shard_bytes: largest shard of a Hugging Face destination (default 5 GB).
        durable: fsync the destination and its directory before returning, whatever the format
            (False keeps the atomic rename but may lose the file to a power cut).
        max_tensors: most tensors the source may hold (the readers' ``MAX_TENSORS`` by default).
        max_total_bytes: most bytes the source's tensors may expand to. By default
            ``MAX_EXPANSION`` (16) times the source's size on disk, at least
            ``MIN_EXPANSION_BYTES`` (64 MiB): a compressed npz member, a zip bomb
            or a torch file of aliased views cannot fill the disk. Checked from
            the headers, before anything is written.
        overwrite: replace a destination that exists. False refuses it (every file of the
            destination checked before any is written: a Hugging Face index and each shard, a
            lamp file's data file, a checkpoint directory that is not empty), as the command
            line does without ``--force``.
        **writer_options: passed to :class:`tensorlist.Writer` for tensorlist destinations
            (``alignment``, ``checksum``...).

    The missing directories above the destination (and a checkpoint directory
    itself) are made, parents included; a conversion that fails removes them again.

    Warns:
        MetadataDroppedWarning: the source has metadata and the destination (lamp, npy, pt)
            cannot hold it.

    Raises:
        DestinationExistsError: ``overwrite=False`` and a destination exists (nothing is written).
        FormatError: the source is not a valid file of its format, or over a limit (nothing is
            written).
        ValueError, TypeError: the destination format cannot hold the source's tensors.
        OSError: a file cannot be read or written.
    """
    src, dst = localize(os.fspath(src)), localize(os.fspath(dst))
    if not is_remote(src) and (src_format or infer_format(src, for_reading=True)) in MODEL_FORMATS:
        if writer_options or shard_bytes is not None or pointer is not None:
            raise TypeError("a model directory's conversion keeps its source's shards and files: it takes no "
                            "shard_bytes, pointer or writer options")
        return convert_model_dir(src, dst, convert=convert, parser=SafetensorsFile, src_format=src_format,
                                 dst_format=dst_format, overwrite=overwrite,
                                 durable=durable, progress=progress, allow_outside=allow_outside,
                                 max_tensors=max_tensors, max_total_bytes=max_total_bytes)
    dst_format = check_format(dst_format or _destination_format(dst, src, src_format))
    if dst_format in MODEL_FORMATS:
        raise ValueError(f"{dst_format} is written from a model directory only (the source is {src})")
    if dst_format == "torch-dcp":
        raise ValueError("torch-dcp (DCP's FileSystemWriter layout, a pickle) is read, never written: convert to "
                         "dcp, tensorlist's layout of the same checkpoint")
    if is_remote(dst) and dst_format not in ("tensorlist", "lamp", "dcp"):
        raise ValueError(f"{dst}: remote URLs are supported for tensorlist and lamp files, not {dst_format} (and "
                         "for dcp checkpoint directories)")
    if not is_remote(src) and not is_remote(dst) and os.path.exists(dst) and os.path.samefile(src, dst):
        raise ValueError(f"{src} and {dst} are the same file")
    limits = Limits.of(max_tensors=max_tensors, max_total_bytes=max_total_bytes)
    with open_source(src, src_format, allow_outside=allow_outside, pointer=pointer, max_tensors=max_tensors,
                     max_total_bytes=max_total_bytes) as s:
        check_limits(s, limits)
        if writer_options and dst_format not in ("tensorlist", "lamp"):
            raise TypeError(f"unexpected options for {dst_format}: {sorted(writer_options)}")
        files, directories = _outputs(dst_format, s, dst, shard_bytes)
        refuse_existing(files, directories, overwrite=overwrite)  # before any warning: a refusal says one thing
        if isinstance(s, DcpSource) and dst_format != "dcp" and s.pickled():
            warnings.warn(f"{src}: its values {', '.join(map(repr, s.pickled()))} are pickles (torch_save) and are "
                          f"not written to {dst}: only a dcp checkpoint keeps them (as bytes, never unpickled)",
                          MetadataDroppedWarning, stacklevel=2)
        if s.metadata is not None and dst_format in ("lamp", "npy", "pt"):
            warnings.warn(f"{src}: its metadata ({short_repr(s.metadata, 60)}) is not written to {dst}: "
                          f"{dst_format} files cannot hold it", MetadataDroppedWarning, stacklevel=2)
        bar = Progress(s.nbytes, os.path.basename(dst), progress)
        try:
            with made_directories(files, directories):
                if dst_format in ("tensorlist", "lamp"):
                    _write_tensorlist(s, dst, dst_format == "lamp", bar, durable, writer_options)
                else:
                    _WRITERS[dst_format](s, dst, bar, durable, {"shard_bytes": shard_bytes})
        except (ValueError, TypeError) as e:
            named = _naming(e, dst)
            if named is e:
                raise
            raise named from e
        finally:
            bar.close()


def _naming(e: Exception, dst: str) -> Exception:
    """``e`` itself, or, for what a destination format cannot hold (a plain ValueError or TypeError from a
    writer, which knows the tensor but not the file), the same error naming ``dst`` first."""
    if type(e) not in (ValueError, TypeError) or str(e).startswith(dst):
        return e  # a FormatError names its own file
    return type(e)(f"{dst}: {e}")
