"""Model directories: a Hugging Face model directory whose weights are tensorlist files, and the conversions both ways.

The layout (docs/FORMAT.md, "Model directories"): every file but the weights
is the Hugging Face directory's own, byte for byte (``config.json``, tokenizer
files, sub-directories); ``model.safetensors`` is ``model.json`` (a tensorlist
descriptor, its data file beside it); a sharded checkpoint's
``model-0000i-of-0000N.safetensors`` are ``model-0000i-of-0000N.json`` and its
``model.safetensors.index.json`` is ``model.index.json``, the same
``metadata`` and a ``weight_map`` naming the ``.json`` shards. The directory
``TensorListTrainer.save_model`` writes is one.

:func:`model_weights` reads a model directory's weights (every shard
confined to it, the index checked against the shards), :func:`weight_files`
and :func:`tensor_shards` a tensorlist one's;
:func:`convert_model_dir` converts either kind into the other, each weight file
through ``sinks.convert`` (so the metadata mapping is the single files' one), in
a temporary sibling directory renamed into place when complete. Pickled
weights (``pytorch_model*.bin``, ``*.pt``, ``*.pth``, ``*.ckpt``) are refused,
never opened.

Imports ``format``, ``reader``, ``_storage`` and ``errors`` only (``formats``
asks it what a directory is; ``sinks`` and the command line hand in the
converter and the safetensors parser). No torch, no transformers.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import stat
from typing import Dict, List, NamedTuple, Optional, Tuple

from tensorlist._storage.commit import atomic_file, durable_replace, fsync_dir, own_data_files, tmp_beside
from tensorlist._storage.destinations import made_directories, refuse_existing
from tensorlist.errors import FormatError
from tensorlist.format import Limits, check_location, confine, open_regular, read_json_file, short_repr

__all__ = ["TL_WEIGHTS", "TL_INDEX", "ST_WEIGHTS", "ST_INDEX", "CONFIG", "HF_MODEL", "TL_MODEL", "MODEL_FORMATS",
           "is_hf_model_dir", "is_tl_model_dir", "model_format", "ModelWeights", "model_weights", "weight_files",
           "tensor_shards",
           "convert_model_dir"]

#: A tensorlist model directory's weights: one descriptor, or an index naming ``.json`` shards.
TL_WEIGHTS, TL_INDEX = "model.json", "model.index.json"
#: A Hugging Face model directory's weights: one safetensors file, or an index naming shards.
ST_WEIGHTS, ST_INDEX = "model.safetensors", "model.safetensors.index.json"
CONFIG = "config.json"
#: The two format names (``convert.FORMATS``).
HF_MODEL, TL_MODEL = "hf-model", "tensorlist-model"
MODEL_FORMATS = (HF_MODEL, TL_MODEL)
#: Each kind's (single weights file, index, shard suffix, file format).
_KINDS = {HF_MODEL: (ST_WEIGHTS, ST_INDEX, ".safetensors", "safetensors"),
          TL_MODEL: (TL_WEIGHTS, TL_INDEX, ".json", "tensorlist")}
_OTHER = {HF_MODEL: TL_MODEL, TL_MODEL: HF_MODEL}
#: Pickled weights (torch.save): refused, never opened.
_PICKLED = re.compile(r"(\Apytorch_model.*\.bin|\.pt|\.pth|\.ckpt)\Z")
_HOW_PICKLED = ("pickled weights (torch.save); tensorlist never unpickles a model directory's files: if you trust "
                "it, convert it first with `tensorlist convert FILE model.safetensors` (torch.load(weights_only=True)) "
                "and remove it")


def is_tl_model_dir(path) -> bool:
    """Whether ``path`` is a directory holding ``model.json`` or ``model.index.json``."""
    path = os.fspath(path)
    return os.path.isdir(path) and any(os.path.lexists(os.path.join(path, n)) for n in (TL_WEIGHTS, TL_INDEX))


def is_hf_model_dir(path) -> bool:
    """Whether ``path`` is a directory holding ``model.safetensors``, its sharded index or ``config.json``, and no
    tensorlist weights (a directory of both kinds is a tensorlist one)."""
    path = os.fspath(path)
    return os.path.isdir(path) and not is_tl_model_dir(path) and \
        any(os.path.lexists(os.path.join(path, n)) for n in (ST_WEIGHTS, ST_INDEX, CONFIG))


def model_format(path) -> Optional[str]:
    """``"tensorlist-model"``, ``"hf-model"`` or None: what kind of model directory ``path`` is."""
    return TL_MODEL if is_tl_model_dir(path) else HF_MODEL if is_hf_model_dir(path) else None


class _Weights(NamedTuple):
    """A model directory's weights: the files in shard order, the index, each file's tensors, what they occupy."""

    files: List[str]  # the weight files' names, relative to the directory, in shard order
    index: Optional[dict]  # the index document, or None for one file
    names: Dict[str, List[str]]  # file name -> its tensors' names, in its order
    used: List[str]  # every file the weights occupy (index, shards, tensorlist data files), relative


def _inside(directory: str, name: str, allow_outside: bool, *, file: str, field: Optional[str]) -> str:
    """The path of ``name`` in ``directory``, confined to it (the one rule, ``format.confine``) unless trusted."""
    if allow_outside:
        return os.path.join(directory, name)
    try:
        return confine(directory, name, what="file", where="model directory")
    except FormatError as e:
        raise FormatError(f"{e.reason} (pass allow_outside=True to trust it)", file=file, field=field) from None


def _file_names(path: str, fmt: str, allow_outside: bool, parser, *, file: str, field: Optional[str]) -> Tuple[list, list]:
    """(the tensors' names, the other files it occupies) of one weight file, its header or descriptor read.

    ``parser`` is ``sources.SafetensorsFile``, handed in by ``sinks`` (the
    converters import this module, not the other way round).
    """
    if fmt == "safetensors":
        st = parser(path, what="weights file", file=file, field=field)
        try:
            return [row[2] for row in st.rows], []
        finally:
            st.close()
    from tensorlist.reader import Reader  # here: reading an index needs no reader

    if not os.path.isfile(path):
        raise FormatError(f"weights file {os.path.basename(path)!r} is not a regular file", file=file, field=field)
    with Reader(path, allow_outside=allow_outside) as r:
        return list(r.keys()), [r.descriptor.data_path]


def _read_index(directory: str, fmt: str, allow_outside: bool) -> Tuple[dict, Dict[str, List[str]]]:
    """The index document and its shards (name -> the tensors the ``weight_map`` puts there), every field checked."""
    _, index_name, suffix, _ = _KINDS[fmt]
    index = _inside(directory, index_name, allow_outside, file=os.path.join(directory, index_name), field=None)
    doc = read_json_file(index, Limits())
    if not isinstance(doc, dict) or not isinstance(doc.get("weight_map"), dict):
        raise FormatError("must be an object with a 'weight_map' object (tensor -> shard file)", file=index,
                          field="weight_map")
    if doc.get("metadata") is not None and not isinstance(doc["metadata"], dict):
        raise FormatError(f"must be an object, got {short_repr(doc['metadata'])}", file=index, field="metadata")
    shards: Dict[str, List[str]] = {}
    for name, shard in doc["weight_map"].items():
        field = f"weight_map/{name}"
        if not isinstance(shard, str):
            raise FormatError(f"must be a shard's file name, got {short_repr(shard)}", file=index, field=field)
        check_location(shard, file=index, field=field, allow_outside=allow_outside)
        if not shard.endswith(suffix) or os.path.basename(shard) == index_name:
            raise FormatError(f"shard {shard!r} is not a {suffix} file", file=index, field=field)
        shards.setdefault(os.path.normpath(shard), []).append(name)
    if not shards:
        raise FormatError("names no tensor", file=index, field="weight_map")
    return doc, shards


def _weights(directory: str, fmt: str, allow_outside: bool = False, parser=None) -> _Weights:
    """The weights of the model directory ``directory`` of kind ``fmt``, each file checked against the index."""
    single, index_name, _, file_fmt = _KINDS[fmt]
    has_single, has_index = (os.path.lexists(os.path.join(directory, n)) for n in (single, index_name))
    if has_single and has_index:
        raise FormatError(f"holds both {single} and {index_name}: which are the weights is ambiguous (remove one)",
                          file=directory)
    if not (has_single or has_index):
        pickled = sorted(n for n in os.listdir(directory) if _PICKLED.search(n))
        if pickled:  # the weights are there, as pickles: say so, and how to convert them
            raise FormatError(_HOW_PICKLED, file=os.path.join(directory, pickled[0]))
        raise FormatError(f"holds no weights: neither {single} nor {index_name}", file=directory)
    if has_single:
        path = _inside(directory, single, allow_outside, file=os.path.join(directory, single), field=None)
        names, data = _file_names(path, file_fmt, allow_outside, parser, file=path, field=None)
        return _Weights([single], None, {single: names}, [single] + _relative(directory, data))
    doc, shards = _read_index(directory, fmt, allow_outside)
    index = os.path.join(directory, index_name)
    names: Dict[str, List[str]] = {}
    used = [index_name]
    where: Dict[str, str] = {}
    for shard in sorted(shards):
        field = f"weight_map/{shards[shard][0]}"
        path = _inside(directory, shard, allow_outside, file=index, field=field)
        if not os.path.lexists(path):
            raise FormatError(f"shard {shard!r} does not exist", file=index, field=field)
        held, data = _file_names(path, file_fmt, allow_outside, parser, file=index, field=field)
        for t in held:
            if t in where:
                raise FormatError(f"is in shards {where[t]!r} and {shard!r}", file=index, tensor_name=t,
                                  field=f"weight_map/{t}")
            where[t] = shard
        names[shard] = held
        used += [shard] + _relative(directory, data)
    for t, shard in doc["weight_map"].items():
        if where.get(t) != os.path.normpath(shard):
            why = f"is in shard {where[t]!r}" if t in where else "is in no shard weight_map names"
            raise FormatError(f"{why}, not in {shard!r} as weight_map says", file=index, tensor_name=t,
                              field=f"weight_map/{t}")
    extra = [t for t in where if t not in doc["weight_map"]]
    if extra:
        raise FormatError(f"is in shard {where[extra[0]]!r} but not in weight_map", file=index, tensor_name=extra[0],
                          field="weight_map")
    return _Weights(sorted(shards), doc, names, used)


def _relative(directory: str, paths) -> List[str]:
    """The paths among ``paths`` lying inside ``directory``, relative to it (a trusted outside file is not copied)."""
    root = os.path.abspath(directory)
    out = []
    for p in paths:
        rel = os.path.relpath(os.path.abspath(p), root)
        if not rel.startswith(os.pardir + os.sep) and rel != os.pardir:
            out.append(rel)
    return out


class ModelWeights(NamedTuple):
    """A model directory's weights, checked (:func:`model_weights`)."""

    format: str  # "tensorlist-model" or "hf-model"
    files: List[str]  # the weight files' paths, in shard order
    index: Optional[str]  # the index's path, or None for one weights file
    metadata: Optional[dict]  # the index's metadata (None for one weights file)
    shards: Dict[str, str]  # each tensor -> the path of the weight file holding it, in shard order


def model_weights(directory, *, fmt: Optional[str] = TL_MODEL, allow_outside: bool = False,
                  parser=None) -> ModelWeights:
    """The weights of a model directory: its weight files, its index, where each tensor is.

    ``model.json`` alone, or the shards ``model.index.json`` names (sorted by
    name: ``model-00001-of-00003.json`` first). Each is confined to the
    directory (``format.confine``) and checked against the index: a shard that
    is missing or outside, a tensor in two shards or in another than the index
    says is a FormatError naming the file, the tensor and the field.

    ``fmt`` is ``"tensorlist-model"`` (the default), ``"hf-model"``
    (``model.safetensors`` or its index, each header read by ``parser``:
    ``sources.SafetensorsFile``) or None for the kind ``directory`` is.
    """
    directory = os.fspath(directory)
    fmt = fmt or model_format(directory) or TL_MODEL
    if fmt not in MODEL_FORMATS:
        raise ValueError(f"unknown model directory format {fmt!r}: expected one of {', '.join(MODEL_FORMATS)}")
    if fmt == HF_MODEL and parser is None:
        raise TypeError("a Hugging Face model directory's weights are read with parser=sources.SafetensorsFile")
    w = _weights(directory, fmt, allow_outside, parser)
    index = None if w.index is None else os.path.join(directory, _KINDS[fmt][1])
    return ModelWeights(fmt, [os.path.join(directory, f) for f in w.files], index,
                        None if w.index is None else w.index.get("metadata"),
                        {t: os.path.join(directory, f) for f in w.files for t in w.names[f]})


def weight_files(directory, *, allow_outside: bool = False) -> List[str]:
    """The descriptor paths of a tensorlist model directory's weights, in shard order (:func:`model_weights`)."""
    return model_weights(directory, allow_outside=allow_outside).files


def tensor_shards(directory, *, allow_outside: bool = False) -> Dict[str, str]:
    """Each tensor of a tensorlist model directory -> the descriptor path holding it (:func:`model_weights`)."""
    return model_weights(directory, allow_outside=allow_outside).shards


def _renamed(name: str, fmt: str) -> str:
    """The name a weight file of kind ``fmt`` has in the other kind of directory."""
    single, _, suffix, _ = _KINDS[fmt]
    other_single, _, other_suffix, _ = _KINDS[_OTHER[fmt]]
    return other_single if name == single else name[: -len(suffix)] + other_suffix


def _walk(directory: str, allow_outside: bool, weights: set) -> Tuple[List[str], List[Tuple[str, str]]]:
    """(the sub-directories, the (relative name, path) of every other file) under ``directory``, each checked.

    Symlinks are followed where they stay inside (``format.confine``); a
    directory reached twice (a loop) is refused, so is anything but a regular
    file or a directory, and pickled weights. The ``weights`` (relative names)
    were checked by :func:`_weights` and are passed over.
    """
    dirs: List[str] = []
    files: List[Tuple[str, str]] = []
    seen = {os.path.realpath(directory)}
    stack = [""]
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(directory, rel) if rel else directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            name = os.path.join(rel, e.name) if rel else e.name
            if name in weights:
                continue
            path = _inside(directory, name, allow_outside, file=e.path, field=None)
            if _PICKLED.search(e.name):
                raise FormatError(_HOW_PICKLED, file=path)
            try:
                mode = os.stat(path).st_mode
            except OSError:
                raise FormatError("is a dangling symlink", file=path) from None
            if stat.S_ISDIR(mode):
                real = os.path.realpath(path)
                if real in seen:
                    raise FormatError("leads to a directory reached already (a symlink loop)", file=path)
                seen.add(real)
                dirs.append(name)
                stack.append(name)
            elif stat.S_ISREG(mode):
                files.append((name, path))
            else:
                raise FormatError("is not a regular file or a directory", file=path)
    return sorted(dirs), sorted(files)


class _Plan(NamedTuple):
    """A conversion, every check done: weight files (source path, output name), the index, the copies."""

    weights: List[Tuple[str, str]]
    index: Optional[Tuple[str, dict]]
    dirs: List[str]
    copies: List[Tuple[str, str]]


def _plan(src: str, fmt: str, allow_outside: bool, parser) -> _Plan:
    """What converting the model directory ``src`` of kind ``fmt`` writes; refusals all come here, first."""
    w = _weights(src, fmt, allow_outside, parser)
    dirs, files = _walk(src, allow_outside, set(w.used))
    weights = [(os.path.join(src, f), _renamed(f, fmt)) for f in w.files]
    index = None
    if w.index is not None:
        doc = dict(w.index)
        doc["weight_map"] = {t: _renamed(os.path.normpath(s), fmt) for t, s in w.index["weight_map"].items()}
        index = (_KINDS[_OTHER[fmt]][1], doc)
    written = {out for _, out in weights} | ({index[0]} if index else set())
    copies = []
    for rel, path in files:
        if rel.endswith(".safetensors"):
            raise FormatError("a safetensors file that is not among the model's weights: convert it on its own "
                              "(`tensorlist convert`) or remove it", file=path)
        if rel in written:
            raise FormatError(f"is in the way of the converted weights (the conversion writes {rel!r})", file=path)
        copies.append((path, rel))
    return _Plan(weights, index, dirs, copies)


def _copy(path: str, out: str, durable: bool) -> None:
    """``path``'s bytes to ``out`` (through ``atomic_file``, the one way a file is written)."""
    with os.fdopen(open_regular(path, what="file"), "rb") as f, atomic_file(out, durable=durable) as tmp:
        with open(tmp, "wb") as g:
            shutil.copyfileobj(f, g, 1 << 20)


def _write(plan: _Plan, fmt: str, out: str, convert, options: dict) -> None:
    """Writes everything the plan says into the (new, empty) directory ``out``: copies, weights, the index last."""
    durable = options["durable"]
    for d in plan.dirs:
        os.makedirs(os.path.join(out, d), exist_ok=True)
    for path, rel in plan.copies:
        _copy(path, os.path.join(out, rel), durable)
    src_fmt, dst_fmt = _KINDS[fmt][3], _KINDS[_OTHER[fmt]][3]
    for path, rel in plan.weights:
        target = os.path.join(out, rel)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        convert(path, target, src_format=src_fmt, dst_format=dst_fmt, **options)
    if plan.index is not None:
        with atomic_file(os.path.join(out, plan.index[0]), durable=durable) as tmp:
            with open(tmp, "w", encoding="utf-8") as f:
                f.write(json.dumps(plan.index[1], indent=2, ensure_ascii=False) + "\n")


def _merge(tmp: str, dst: str, plan: _Plan, durable: bool) -> None:
    """Moves the files of ``tmp`` into the directory ``dst`` that holds others (``overwrite``): namesakes replaced.

    The weights' descriptors go after everything else and the index last, so
    a reader never meets a name before what it names; the data files of a
    tensorlist descriptor replaced here, which this library named, go with it
    (``commit.own_data_files``); every other file of ``dst`` stays.
    """
    last = [rel for _, rel in plan.weights] + ([plan.index[0]] if plan.index else [])
    first = []
    for base, _, names in os.walk(tmp):
        for n in names:
            rel = os.path.relpath(os.path.join(base, n), tmp)
            if rel not in last:
                first.append(rel)
    for rel in first + last:
        final = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        stale = own_data_files(final) if os.path.isfile(final) and rel.endswith(".json") else []
        durable_replace(os.path.join(tmp, rel), final, durable)
        for old in stale:
            if os.path.relpath(old, dst) not in first:
                try:
                    os.unlink(old)
                except OSError:
                    pass


def _place(tmp: str, dst: str, plan: _Plan, durable: bool) -> None:
    """Puts the complete directory ``tmp`` at ``dst``: one rename where ``dst`` is missing or empty, else a merge."""
    if os.path.isdir(dst) and not os.path.islink(dst) and os.listdir(dst):
        _merge(tmp, dst, plan, durable)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    if durable:
        for base, _, _ in os.walk(tmp):
            fsync_dir(base)
    os.replace(tmp, dst)  # over an empty directory too (POSIX rename)
    if durable:
        fsync_dir(os.path.dirname(os.path.abspath(dst)))


def convert_model_dir(src, dst, *, convert, parser, src_format: Optional[str] = None,
                      dst_format: Optional[str] = None, overwrite: bool = True, durable: bool = True, progress: Optional[bool] = None,
                      allow_outside: bool = False, max_tensors: Optional[int] = None,
                      max_total_bytes: Optional[int] = None) -> None:
    """Converts the model directory ``src`` into ``dst`` of the other kind (``sinks.convert`` calls it).

    ``convert`` converts one weight file (``sinks.convert``); ``parser`` reads a
    safetensors header (``sources.SafetensorsFile``).

    Every check is made before anything is written. The output is built in a
    temporary sibling of ``dst`` and renamed into place when complete, so a
    conversion that fails leaves nothing behind. ``dst`` must not exist or be
    empty unless ``overwrite``: then the files the conversion writes replace
    their namesakes in it and every other file stays.

    Raises:
        FormatError: ``src`` is not a model directory of its kind (naming the file, the tensor and the field).
        DestinationExistsError: ``dst`` holds files and ``overwrite`` is False.
        ValueError: a format that is not a model directory's, or ``dst`` inside ``src``.
    """
    src, dst = os.fspath(src), os.fspath(dst)
    fmt = src_format or model_format(src)
    if fmt is None:
        why = "does not exist" if not os.path.lexists(src) else "is not a directory" if not os.path.isdir(src) else \
            f"holds no model weights ({ST_WEIGHTS}, {ST_INDEX}, {TL_WEIGHTS} or {TL_INDEX})"
        raise FormatError(why, file=src)
    if fmt not in MODEL_FORMATS or (dst_format or _OTHER[fmt]) != _OTHER[fmt]:
        raise ValueError(f"a model directory converts to the other kind only ({HF_MODEL} <-> {TL_MODEL}), "
                         f"not {fmt} to {dst_format}")
    root, out = os.path.realpath(src), os.path.realpath(dst)
    if out == root or out.startswith(root + os.sep):
        raise ValueError(f"{dst}: the destination lies inside the source directory {src}")
    plan = _plan(src, fmt, allow_outside, parser)
    refuse_existing(directories=[dst], overwrite=overwrite)
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise NotADirectoryError(f"{dst}: is not a directory (a model directory's destination is one)")
    options = dict(durable=durable, progress=progress, allow_outside=allow_outside, max_tensors=max_tensors,
                   max_total_bytes=max_total_bytes)
    with made_directories([dst]):
        tmp = tmp_beside(dst)
        os.mkdir(tmp)
        try:
            _write(plan, fmt, tmp, convert, options)
            _place(tmp, dst, plan, durable)
        except (ValueError, TypeError) as e:  # what the destination cannot hold: named where it was to go
            shutil.rmtree(tmp, ignore_errors=True)
            if type(e) not in (ValueError, TypeError) or tmp not in str(e):
                raise
            raise type(e)(str(e).replace(tmp, os.path.abspath(dst).rstrip(os.sep))) from e
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
