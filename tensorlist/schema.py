"""JSON Schemas shipped with the package, and ``validate``.

The schema files live in the installed package ``tensorlist.schemas`` (the
repository's top-level ``schemas/`` directory).
"""
from __future__ import annotations

import functools
import json
import os
from importlib import resources
from typing import Any, Dict, List, Optional

from tensorlist._base import backends
from tensorlist._base import tree as _tree
from tensorlist._storage.datafile import open_consistently
from tensorlist._base.jsonio import loads_strict, resolve_pointer
from tensorlist.errors import FormatError
from tensorlist.format import (Limits, ListDescriptor, TensorSpan, find_tensor_lists, looks_like_list, no_list_error,
                     parse_list, read_json_file, short_repr)

__all__ = ["load_schema", "schema_validator", "validate"]

TENSORLIST_SCHEMA = "tensorlist.schema.json"


@functools.lru_cache(maxsize=None)
def _schema_text(name: str) -> str:
    return (resources.files("tensorlist.schemas") / name).read_text(encoding="utf-8")


def load_schema(name: str = TENSORLIST_SCHEMA) -> Dict[str, Any]:
    """A shipped JSON Schema, parsed (a fresh copy each call)."""
    return json.loads(_schema_text(name))


@functools.lru_cache(maxsize=None)
def schema_validator(name: str = TENSORLIST_SCHEMA):
    """A cached ``jsonschema.Draft202012Validator`` for a shipped schema."""
    import jsonschema

    schema = load_schema(name)
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _schema_check(obj: Any, file: Optional[str], pointer: str) -> None:
    errors = sorted(schema_validator().iter_errors(obj), key=lambda e: (list(e.absolute_path), e.message))
    if not errors:
        return
    e = errors[0]
    path = list(e.absolute_path)
    if e.validator == "required" and isinstance(e.instance, dict):
        # the error sits on the object; the field at fault is the missing key
        path += [k for k in e.validator_value if k not in e.instance][:1]
    index = name = None
    if len(path) >= 2 and path[0] == "tensors" and isinstance(path[1], int):
        index = path[1]
        t = obj["tensors"][index]
        name = t.get("name") if isinstance(t, dict) and isinstance(t.get("name"), str) else None
        field = "/".join(str(p) for p in path[2:]) or None
    else:
        field = "/".join(str(p) for p in path) or None
    if field is not None and pointer:
        field = f"{pointer}/{field}"
    # jsonschema's messages start with the whole instance: hostile input makes them huge
    msg = e.message if len(e.message) <= 200 else \
        f"{short_repr(e.instance)} fails {e.validator} {short_repr(e.validator_value, 40)}"
    raise FormatError(f"schema: {msg}", file=file, tensor_index=index, tensor_name=name, field=field)


def _check_tree(desc: ListDescriptor, file: Optional[str]) -> ListDescriptor:
    """A tree file's rule (``tensorlist.jax``): its metadata's tree names every tensor exactly once.

    For a descriptor whose metadata has the format ``tensorlist.jax-tree/1``:
    the header's fields, and ``_base.tree.check`` of its spec against the tensor
    names (kinds, keys, every tensor one leaf). Any other metadata is not checked.
    """
    header = _tree.tree_header(desc.metadata, file=file, field=f"{desc.pointer}/metadata")
    if header is not None:
        _tree.check(header["tree"], desc.keys(), file=file, field=f"{desc.pointer}/metadata/tree")
    return desc


def validate(obj, *, pointer: Optional[str] = None, base_dir=None, check_data: bool = True,
             verify: bool = False, allow_outside: bool = False,
             max_descriptor_bytes: Optional[int] = None, max_tensors: Optional[int] = None,
             max_total_bytes: Optional[int] = None, source: Optional[str] = None, key=None,
             **backend_options) -> List[ListDescriptor]:
    """Validates TensorList descriptors: the JSON Schema, then every semantic rule.

    A tree file's descriptor (metadata of format ``tensorlist.jax-tree/1``, as
    ``tensorlist.jax.save`` writes it) also has its tree checked against its
    tensors: every leaf names a stored tensor, every tensor is one leaf, every
    node of a known kind with keys of the right types (``_base.tree.check``).

    Args:
        obj: a path or URL of a JSON document, a JSON string, or a parsed dict.
        pointer: RFC 6901 pointer to one TensorList in a bigger document. Without
            it, the document itself must be a TensorList, or every TensorList
            embedded in it is validated.
        base_dir: directory ``location`` is resolved against (default: the
            document's directory; for a string or dict, none, so the data file
            is not checked unless this is given).
        check_data: check that the data file exists and is large enough.
        verify: also check the stored CRC32C checksums against the data (of
            an encrypted list: every chunk's tag, which needs ``key``).
        key: the key of encrypted lists: checked against each (with
            ``check_data`` or ``verify``), so a wrong key fails here.
        allow_outside: accept a ``location`` that is absolute or leaves the
            directory, or a data file that is a symlink to elsewhere.
        max_descriptor_bytes, max_tensors, max_total_bytes: policy limits
            (see ``format.Limits``).
        source: the file name errors name, for a dict or a string (default: none).
        **backend_options: for a URL, passed to its backend (``storage_options``).

    Returns:
        The validated descriptors, one per TensorList (each knows its pointer).

    Raises:
        FormatError: naming the file, the tensor (index and name) and the field.
    """
    limits = Limits.of(max_descriptor_bytes, max_tensors, max_total_bytes)
    if backends.is_remote(obj):
        return backends.dispatch("validate", obj)(
            obj, pointer=pointer, check_data=check_data, verify=verify, allow_outside=allow_outside,
            max_descriptor_bytes=max_descriptor_bytes, max_tensors=max_tensors, max_total_bytes=max_total_bytes,
            **({"key": key} if key is not None else {}), **backend_options)
    if backend_options:
        raise TypeError(f"unexpected arguments {sorted(backend_options)}")
    file = source
    if isinstance(obj, (dict, list)):
        read = lambda: obj  # noqa: E731
    elif isinstance(obj, str) and obj.lstrip()[:1] in ("{", "["):
        doc = loads_strict(obj)
        read = lambda: doc  # noqa: E731
    elif isinstance(obj, (str, os.PathLike)):
        file = backends.localize(os.fspath(obj))
        read = lambda: read_json_file(file, limits, fast=True)  # noqa: E731
        if base_dir is None:
            base_dir = os.path.dirname(os.path.abspath(file))
    else:
        raise TypeError(f"validate() takes a path, a JSON string or a dict, not {type(obj).__name__}")
    base = os.fspath(base_dir) if base_dir is not None else None

    def descriptors() -> List[ListDescriptor]:
        doc = read()
        if pointer is not None:
            targets = [pointer]
        elif looks_like_list(doc):
            targets = [""]
        else:
            targets = find_tensor_lists(doc)
            if not targets:
                raise no_list_error(doc, file)
        out = []
        for ptr in targets:
            node = resolve_pointer(doc, ptr, file=file)
            tensors = node.get("tensors") if isinstance(node, dict) else None
            if isinstance(tensors, TensorSpan):
                if tensors.table(limits) is not None:
                    # the C column reader accepted every tensor, and it enforces all that the
                    # schema says of one (types, ranges, dtype codes: test_malformed's parity
                    # tables): check the rest of the list, not a million tensor objects again
                    _schema_check({**node, "tensors": []}, file, ptr)
                    out.append(_check_tree(parse_list(node, file=file, pointer=ptr, base_dir=base,
                                                      allow_outside=allow_outside, limits=limits), file))
                    continue
                node["tensors"] = tensors.materialize(file)  # the exact path explains what is wrong
            _schema_check(node, file, ptr)
            out.append(_check_tree(parse_list(node, file=file, pointer=ptr, base_dir=base,
                                              allow_outside=allow_outside, limits=limits), file))
        return out

    if base is None or not (check_data or verify):
        return descriptors()
    # the same consistent open as a Reader's: a file being replaced is re-read, not reported missing
    descs, datas, shared = open_consistently(descriptors, True, allow_outside, file=file)
    try:
        for d in datas:
            d.unlock(key)
        if verify:
            for d in datas:
                d.verify(d.desc.tensors)
    finally:
        for f in shared.values():
            f.close()
    return descs
