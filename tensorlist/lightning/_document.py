"""Lightning's checkpoint dict as a tensorlist document and back; with a key, its JSON sealed too.

:func:`encode_checkpoint` and :func:`decode_checkpoint` are the layout
``tensorlist.lightning``'s module docstring describes. An encrypted list seals
its tensors and metadata, not the document's JSON around them (hyper-parameters,
loop states, the training record under ``"training"``): :func:`seal_document`
moves every JSON value of a document into one encrypted list (``SEALED_KEY``:
the JSON's UTF-8 bytes as one uint8 tensor) and leaves in plain JSON only the
lists themselves, at their places (``/state_dict`` stays a model file), with
the keys leading to them; :func:`open_sealed` puts the two back together.

Imports torch, numpy, ``writer``, ``_base.jsonio``, ``_bridges.torch``, ``errors``
and ``lightning.record``.
"""
from __future__ import annotations

import pickle
from typing import Any, Callable, Mapping, Optional

import numpy as np
import torch

from tensorlist import writer
from tensorlist._base.jsonio import dumps, from_tagged, loads_strict, to_tagged
from tensorlist._bridges.torch import from_numpy
from tensorlist.errors import EncryptionError, FormatError, short_repr
from tensorlist.lightning.record import RECORD_KEYS

__all__ = ["encode_checkpoint", "decode_checkpoint", "seal_document", "open_sealed", "SEALED_KEY",
           "TENSOR_TAG", "NDARRAY_TAG", "BYTES_TAG", "PICKLE_TAG"]

#: The tags of this module's values (one-key objects; ``to_tagged`` escapes a caller's dict of that shape).
TENSOR_TAG, NDARRAY_TAG, BYTES_TAG, PICKLE_TAG = "__tensor__", "__ndarray__", "__bytes__", "__pickle__"
_TAGS = (TENSOR_TAG, NDARRAY_TAG, BYTES_TAG, PICKLE_TAG)

def _one(value) -> writer.Tensors:
    return writer.Tensors({"0": value})


def _all_tensors(d: Mapping) -> bool:
    return bool(d) and all(isinstance(k, str) for k in d) and not (len(d) == 1 and next(iter(d)) in _TAGS) \
        and all(isinstance(v, torch.Tensor) for v in d.values())


def encode_checkpoint(checkpoint: Mapping, *, allow_pickle: bool = False,
                      encode: Optional[Callable[[Any], Any]] = None, where: str = "checkpoint") -> dict:
    """Lightning's checkpoint dict as a document for ``save_document`` (module docstring: the layout).

    Args:
        checkpoint: the dict (not modified).
        allow_pickle: store a value JSON cannot hold as a pickle.
        encode: turns a value JSON cannot hold into one it can (tried before pickle).
        where: how messages name the dict.

    Raises:
        TypeError: a value JSON cannot hold, naming its key (``checkpoint.hyper_parameters.path``).
    """
    def leaf(v, at):
        if isinstance(v, torch.Tensor):
            return {TENSOR_TAG: _one(v.detach())}
        if isinstance(v, np.ndarray):
            return {NDARRAY_TAG: _one(v)}
        if isinstance(v, (bytes, bytearray, memoryview)):
            return {BYTES_TAG: _one(np.frombuffer(bytes(v), np.uint8))}
        if isinstance(v, writer.Tensors):
            return v
        if encode is not None:
            return to_tagged(encode(v), at, leaf)
        if allow_pickle:
            return {PICKLE_TAG: _one(np.frombuffer(pickle.dumps(v), np.uint8))}
        raise TypeError(f"{at}: a {type(v).__qualname__} cannot be stored as JSON (a tensorlist checkpoint holds "
                        f"tensors, bytes and JSON values); pass TensorListCheckpointIO(encode=...) to turn it into "
                        f"JSON, or allow_pickle=True to store it as a pickle")

    def lists(v):  # dicts of tensors become TensorLists before the walk
        if isinstance(v, Mapping) and not isinstance(v, writer.Tensors):
            if _all_tensors(v):
                return writer.Tensors({k: t.detach() for k, t in v.items()})
            return {k: lists(x) for k, x in v.items()}
        if isinstance(v, list):
            return [lists(x) for x in v]
        if isinstance(v, tuple):
            return tuple(lists(x) for x in v)
        return v

    doc = to_tagged(lists(dict(checkpoint)), where, leaf)
    if isinstance(doc, dict) and isinstance(doc.get("state_dict"), writer.Tensors) \
            and all(k in doc for k in RECORD_KEYS):
        doc["state_dict"].metadata = {k: doc[k] for k in RECORD_KEYS}
    return doc


def _device(map_location):
    if map_location is None or callable(map_location):
        return map_location
    if isinstance(map_location, Mapping):
        return map_location.get("cpu")
    return torch.device(map_location)


def decode_checkpoint(doc: Any, *, map_location=None, allow_pickle: bool = False, file: Optional[str] = None) -> Any:
    """The inverse of :func:`encode_checkpoint` on a ``load_document`` result (its lists as dicts of arrays).

    Raises:
        FormatError: a tag whose content is not what this module writes, or
            a pickle when ``allow_pickle`` is False (naming the file and key).
    """
    target = _device(map_location)

    def tensor(a: np.ndarray):
        t = from_numpy(a)
        if callable(target):
            return target(t, "cpu")
        return t if target is None else t.to(target)

    def one(v, tag, at):
        if not (isinstance(v, dict) and list(v) == ["0"] and isinstance(v["0"], np.ndarray)):
            raise FormatError(f"a {tag} value must be a TensorList of one tensor", file=file, field=at)
        a = v["0"]
        if tag != TENSOR_TAG and tag != NDARRAY_TAG and (a.dtype != np.uint8 or a.ndim != 1):
            raise FormatError(f"a {tag} value must be one uint8 vector, got {a.dtype} {list(a.shape)}",
                              file=file, field=at)
        if tag == TENSOR_TAG:
            return tensor(a)
        if tag == NDARRAY_TAG:
            return np.array(a)
        if tag == BYTES_TAG:
            return a.tobytes()
        if not allow_pickle:
            raise FormatError("holds a pickle, which is not loaded: pass TensorListCheckpointIO(allow_pickle=True) "
                              "for a checkpoint you trust", file=file, field=at)
        return pickle.loads(a.tobytes())  # noqa: S301 (opted in, documented)

    def walk(v, at):  # before from_tagged, which escapes a caller's one-key "__name__" dicts
        if isinstance(v, np.ndarray):
            return tensor(v)
        if isinstance(v, dict):
            if len(v) == 1 and next(iter(v)) in _TAGS:
                tag = next(iter(v))
                return one(v[tag], tag, at)
            return {k: walk(x, f"{at}/{k}") for k, x in v.items()}
        if isinstance(v, list):
            return [walk(x, f"{at}/{i}") for i, x in enumerate(v)]
        return v

    walked = walk(doc, "")
    try:
        return from_tagged(walked, file=file)
    except (TypeError, ValueError) as e:  # a tag a writer of this module never makes
        raise FormatError(f"holds a tagged JSON value that does not read back ({short_repr(str(e))})",
                          file=file) from e


#: The top-level key of a sealed document's encrypted JSON (a TensorList of one uint8 tensor, ``"json"``).
SEALED_KEY = "tensorlist.sealed"
#: Where a list sat in the sealed JSON (a one-key object: ``to_tagged`` escapes a caller's of that shape).
_LIST_MARK = "__list__"
_NOTHING = object()


def seal_document(doc: dict) -> dict:
    """The document to save with a key: its lists where they were, every other value in one encrypted list.

    Raises:
        ValueError: the document has a top-level ``SEALED_KEY`` already.
    """
    if SEALED_KEY in doc:
        raise ValueError(f"a checkpoint key {SEALED_KEY!r} is reserved for an encrypted checkpoint's JSON")

    def skeleton(v):  # only the lists and the containers leading to them
        if isinstance(v, writer.Tensors):
            return v
        if isinstance(v, dict):
            kept = {k: s for k, s in ((k, skeleton(x)) for k, x in v.items()) if s is not _NOTHING}
            return kept if kept else _NOTHING
        if isinstance(v, list):
            items = [skeleton(x) for x in v]
            return [None if s is _NOTHING else s for s in items] if any(s is not _NOTHING for s in items) else _NOTHING
        return _NOTHING

    def marked(v):  # the JSON, each list replaced by a mark
        if isinstance(v, writer.Tensors):
            return {_LIST_MARK: None}
        if isinstance(v, dict):
            return {k: marked(x) for k, x in v.items()}
        if isinstance(v, list):
            return [marked(x) for x in v]
        return v

    outer = skeleton(doc)
    outer = {} if outer is _NOTHING else outer
    text = dumps(marked(doc)).encode("utf-8")
    outer[SEALED_KEY] = writer.Tensors({"json": np.frombuffer(text, np.uint8)})
    return outer


def open_sealed(loaded: Any, key, file: str) -> Any:
    """A ``load_document`` result as it was before :func:`seal_document` (a plain one as it is).

    Raises:
        EncryptionError: an encrypted checkpoint and no key (naming the file).
        FormatError: the sealed JSON and the lists do not fit together (naming the file).
    """
    if not (isinstance(loaded, dict) and SEALED_KEY in loaded):
        return loaded
    if key is None:
        raise EncryptionError("is an encrypted checkpoint: pass encryption_key= (a tensorlist.Key or its 32 bytes)",
                              file=file)
    sealed = loaded.pop(SEALED_KEY)
    if not (isinstance(sealed, dict) and isinstance(sealed.get("json"), np.ndarray)):
        raise FormatError("its sealed JSON is not one uint8 tensor 'json'", file=file, field=SEALED_KEY)
    doc = loads_strict(sealed["json"].tobytes().decode("utf-8"))

    def merge(s, o, at):
        if isinstance(s, dict) and list(s) == [_LIST_MARK]:
            if not isinstance(o, dict):
                raise FormatError("its sealed JSON names a list the document does not hold", file=file, field=at)
            return o
        if isinstance(s, dict):
            return {k: merge(x, o.get(k) if isinstance(o, dict) else None, f"{at}/{k}") for k, x in s.items()}
        if isinstance(s, list):
            return [merge(x, o[i] if isinstance(o, list) and i < len(o) else None, f"{at}/{i}")
                    for i, x in enumerate(s)]
        return s

    return merge(doc, loaded, "")
