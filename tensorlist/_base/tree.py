"""The structure of a pytree as JSON: encode, check, decode, render (stdlib only: no numpy, no framework).

A tree is saved as its leaves (a named TensorList) and a *spec*: one JSON
object per node, so that every node comes back as what it was::

    {"kind": "dict", "keys": ["params", 0], "children": [<node>, <node>]}
    {"kind": "ordereddict", "keys": [...], "children": [...]}
    {"kind": "list", "children": [...]}        {"kind": "tuple", "children": [...]}
    {"kind": "namedtuple", "type": "pkg.mod:Point", "fields": ["x", "y"], "children": [...]}
    {"kind": "none"}                            {"kind": "leaf", "name": "params/dense/kernel"}
    {"kind": "scalar", "type": "int", "value": 3}   (a Python bool, int or float: no tensor)
    {"kind": "key", "name": "rng", "impl": "threefry2x32"}   (a typed PRNG key array: its key data)
    {"kind": "pytree", "type": "flax.training.train_state:TrainState", "keys": ["step", ...], "children": [...]}

plus the kinds an adapter registers (:func:`register`: ``flax.FrozenDict``,
``nnx.State``). A key is a str or an int, kept apart (a list index, the dict
key ``0`` and the dict key ``"0"`` are three different specs, though they
print alike). A ``scalar`` keeps a Python ``bool``/``int``/``float`` leaf
(exactly those types: a numpy scalar is an array leaf) as a JSON value with
its type, so that it comes back as the same type: an int within int64's range,
a float finite or one of the strings :data:`NON_FINITE` (strict JSON has no
NaN or Infinity). A ``key`` is a leaf whose tensor holds the key data of a
typed PRNG key array of one of :data:`PRNG_KEY_IMPLS`. A ``pytree`` is a
container the codec does not know but the caller's ``other`` flattens (jax's
registered pytree nodes: ``flax.struct`` dataclasses), kept as its type's name
(for messages; never resolved) with its keys and children: the codec rebuilds
it as a dict, a loader with a target of that type rebuilds the type. Leaves are named by their key path joined by ``/``
(``params/dense/kernel``; a root leaf is :data:`ROOT_NAME`); two paths that
print alike get a ``~1``, ``~2``... suffix in the order met, so names are
unique, and only the spec, never the names, rebuilds the tree.

Depth: each tree level costs two JSON levels (a node and its children
array), and no strict reader takes JSON deeper than ``_base.jsonio.MAX_DEPTH``, so
a tree deeper than :data:`MAX_TREE_DEPTH` is refused when saved and when
read; every walk here is iterative, never recursive.

:func:`check` validates a spec against the names of the tensors it is stored
with, in one pass and before anything is built: every node of a known kind,
keys of the right types and unique, every tensor referenced exactly once, a
namedtuple's fields those of the class. Every field is type-checked before it
is used (a list where a name belongs is refused, not hashed). Each failure is
a FormatError naming the file, the JSON pointer of the node, and its path in
the tree. Every reader of a spec goes through it: ``tensorlist.jax.load``,
``schema.validate``, the Orbax handler and the command line.

A namedtuple's ``type`` is resolved by ``_base.loaded.loaded_object`` only: a file
never causes an import (docs/SECURITY.md, "No import caused by a file").
"""
from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple

from tensorlist._base.jsonio import MAX_DEPTH
from tensorlist._base.loaded import class_mro, loaded_object, static_attr
from tensorlist.errors import FormatError, short_repr

__all__ = ["JAX_TREE_FORMAT", "ADAPTER_KINDS", "MAX_TREE_DEPTH", "ROOT_NAME", "NodeType", "register", "unregister", "encode", "check",
           "build", "decode", "render", "node_of", "make_header", "tree_header", "Plan", "MAX_REBUILT_FIELDS",
           "PRNG_KEY_IMPLS", "NON_FINITE", "SCALAR_TYPES"]

#: The ``format`` of the metadata a tree file carries:
#: ``{"format": JAX_TREE_FORMAT, "tree": <spec>, "metadata": <user metadata>}``.
JAX_TREE_FORMAT = "tensorlist.jax-tree/1"

#: Deepest tree (nodes below the root) a spec may describe: two JSON levels per
#: tree level, and a margin for the levels above the spec (descriptor, header).
MAX_TREE_DEPTH = (MAX_DEPTH - 8) // 2

#: The tensor name of a tree that is a single leaf.
ROOT_NAME = "root"

#: The suffix that makes a name unique when two key paths print alike.
DEDUPE_SEPARATOR = "~"

#: The node kinds tensorlist's own adapters register (``tensorlist.jax``: kind -> whether keyed), known to
#: :func:`check` even where the adapter is not imported (``tensorlist validate`` imports no framework).
ADAPTER_KINDS = {"flax.FrozenDict": True, "nnx.State": True}

#: The PRNG key implementations a ``key`` node may name (jax's built-in ones), each with the trailing shape
#: of its uint32 key data: ``jax.random.key_data`` of a key array of shape S has the shape S + this.
PRNG_KEY_IMPLS = {"threefry2x32": (2,), "rbg": (4,), "unsafe_rbg": (4,)}

#: How a ``scalar`` node of type ``float`` writes the values strict JSON has no number for.
NON_FINITE = {"nan": float("nan"), "inf": float("inf"), "-inf": float("-inf")}

#: A ``scalar`` node's ``type`` -> the Python type it comes back as.
SCALAR_TYPES = {"bool": bool, "int": int, "float": float}

#: The range of a ``scalar`` int (int64's: any JSON reader of the descriptor, the C core's too, holds it).
_INT_RANGE = (-2 ** 63, 2 ** 63 - 1)

_SEQUENCE_KINDS = ("list", "tuple")
_KEYED_KINDS = ("dict", "ordereddict")
_FIELDS = {
    "dict": {"kind", "keys", "children"}, "ordereddict": {"kind", "keys", "children"},
    "list": {"kind", "children"}, "tuple": {"kind", "children"},
    "namedtuple": {"kind", "type", "fields", "children"}, "none": {"kind"}, "leaf": {"kind", "name"},
    "scalar": {"kind", "type", "value"}, "key": {"kind", "name", "impl"},
    "pytree": {"kind", "type", "keys", "children"},
}


@dataclass(frozen=True)
class NodeType:
    """A container type an adapter teaches the codec (``flax.core.FrozenDict``, say).

    Attributes:
        kind: the spec's ``kind`` (``"flax.FrozenDict"``).
        module, qualname: where the type lives; an object is matched only if
            its module is already imported (the codec imports nothing; an
            ``unflatten`` imports what it needs, and a file never names a module).
        keyed: whether the node has ``keys`` (a mapping) or only ``children``.
        flatten: ``obj -> (keys or None, children)``.
        unflatten: ``(keys or None, children) -> obj``.
    """

    kind: str
    module: str
    qualname: str
    keyed: bool
    flatten: Callable[[Any], Tuple[Optional[List[Any]], List[Any]]]
    unflatten: Callable[[Optional[List[Any]], List[Any]], Any]

    def type(self):
        """The registered class, or None while its module is not imported (it never is by the codec)."""
        return loaded_object(self.module, self.qualname)


_REGISTRY: Dict[str, NodeType] = {}


def register(node_type: NodeType) -> None:
    """Teaches the codec a container type (idempotent; a kind is registered once).

    Raises:
        ValueError: ``kind`` is a built-in kind, or registered with another type.
    """
    if node_type.kind in _FIELDS:
        raise ValueError(f"{node_type.kind!r} is a built-in node kind")
    old = _REGISTRY.get(node_type.kind)
    if old is not None and (old.module, old.qualname) != (node_type.module, node_type.qualname):
        raise ValueError(f"node kind {node_type.kind!r} is already registered for {old.module}.{old.qualname}")
    _REGISTRY[node_type.kind] = node_type


def unregister(kind: str) -> None:
    """Forgets a registered kind (a no-op for one never registered)."""
    _REGISTRY.pop(kind, None)


def _path_text(tokens: Sequence[Any]) -> str:
    return "/".join(str(t) for t in tokens) if tokens else "(root)"


def _is_key(k: Any) -> bool:
    return isinstance(k, str) or (isinstance(k, int) and not isinstance(k, bool))


# --------------------------------------------------------------------------
# encode


def _registered() -> List[Tuple[NodeType, type]]:
    """The registered kinds whose types exist now (their modules imported)."""
    return [(nt, t) for nt, t in ((nt, nt.type()) for nt in _REGISTRY.values()) if t is not None]


def node_of(obj: Any, path: str = "", registered: Optional[List[Tuple[NodeType, type]]] = None,
            other: Optional[Callable[[Any], Optional[Tuple[str, List[Any], List[Any]]]]] = None):
    """``(kind, keys, children, extra)`` of a node ``obj``, None for a leaf (``path`` for messages).

    ``keys`` is None for a sequence kind; a namedtuple's ``extra`` holds its
    ``type`` and ``fields``, a scalar's its ``type`` and ``value``, a pytree's
    its ``type``. ``registered``: ``_registered()``, if the caller asks about
    many objects at once. ``other``: ``obj -> (type name, keys, children)`` of
    a container the codec does not know, or None for a leaf (jax's registered
    pytree nodes, from ``tensorlist.jax``).

    Raises:
        TypeError: a subclass of dict, list or tuple; an int outside int64's range.
    """
    if obj is None:
        return "none", None, [], {}
    t = type(obj)
    if t is bool or t is int or t is float:  # exactly these: numpy's float64 subclasses float, and is an array
        return "scalar", None, [], {"type": t.__name__, "value": _scalar_value(obj, path)}
    if t is dict or t is collections.OrderedDict:
        return ("dict" if t is dict else "ordereddict"), list(obj.keys()), list(obj.values()), {}
    if t is list or t is tuple:
        return t.__name__, None, list(obj), {}
    for nt, cls in _registered() if registered is None else registered:
        if isinstance(obj, cls):
            keys, children = nt.flatten(obj)
            return nt.kind, (list(keys) if nt.keyed else None), list(children), {}
    if isinstance(obj, tuple) and hasattr(t, "_fields"):
        return "namedtuple", None, list(obj), {"type": f"{t.__module__}:{t.__qualname__}",
                                                "fields": list(t._fields)}
    if isinstance(obj, (dict, list, tuple)):
        raise TypeError(f"tree at {path or '(root)'}: a {t.__module__}.{t.__qualname__} (a subclass of "
                        f"{[b.__name__ for b in (dict, list, tuple) if isinstance(obj, b)][0]}) would come back "
                        "as another type: convert it to a plain dict, list or tuple first")
    found = other(obj) if other is not None else None
    if found is not None:
        type_name, keys, children = found
        return "pytree", list(keys), list(children), {"type": type_name}
    return None


def _scalar_value(x: Any, path: str) -> Any:
    """The JSON value of a Python bool, int or float (non-finite floats as their :data:`NON_FINITE` name)."""
    if type(x) is int and not _INT_RANGE[0] <= x <= _INT_RANGE[1]:
        raise TypeError(f"tree at {path or '(root)'}: the int {short_repr(x)} is outside int64's range, which "
                        "a tree file stores: store it as a string in metadata=")
    if type(x) is float and x != x:
        return "nan"
    if type(x) is float and x in (float("inf"), float("-inf")):
        return "inf" if x > 0 else "-inf"
    return x


def encode(tree: Any, *, other: Optional[Callable[[Any], Optional[Tuple[str, List[Any], List[Any]]]]] = None,
           key_impl: Optional[Callable[[Any], Optional[str]]] = None) -> Tuple[Dict[str, Any], List[Tuple[str, Any]]]:
    """The spec of ``tree`` and its leaves ``(name, value)`` in the order they are stored.

    A leaf is anything that is not a node the codec knows (dict, OrderedDict,
    list, tuple, namedtuple, None, a Python bool/int/float, a registered type,
    what ``other`` flattens: see :func:`node_of`); the caller decides which
    leaves it can store. ``key_impl``: ``leaf -> impl name`` of a typed PRNG
    key array (stored as a ``key`` node), None for any other leaf.

    Raises:
        TypeError: a key that is neither str nor int, a subclass of dict, list
            or tuple that would come back as another type, an int outside
            int64's range, a PRNG key of an impl not in PRNG_KEY_IMPLS (each
            naming the path in the tree).
        ValueError: a tree deeper than MAX_TREE_DEPTH (or a cycle).

    Example:
        >>> spec, leaves = encode({"w": "W", "b": ["B", None], "step": 3})
        >>> [name for name, _ in leaves]
        ['w', 'b/0']
        >>> spec["keys"], spec["children"][1], spec["children"][2]
        (['w', 'b', 'step'], {'kind': 'list', 'children': [{'kind': 'leaf', 'name': 'b/0'}, {'kind': 'none'}]}, {'kind': 'scalar', 'type': 'int', 'value': 3})
    """
    leaves: List[Tuple[str, Any]] = []
    used: Dict[str, int] = {}
    root: Dict[str, Any] = {}
    registered = _registered()
    stack = [(tree, "", root, 0)]  # (object, its key path joined by "/", its spec node, depth)
    while stack:
        obj, path, node, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise ValueError(f"tree at {short_repr(path, 60)}: deeper than {MAX_TREE_DEPTH} levels (or a cycle), "
                             "which no strict JSON reader would read back")
        c = node_of(obj, path, registered, other)
        if c is None:
            impl = key_impl(obj) if key_impl is not None else None
            if impl is not None and impl not in PRNG_KEY_IMPLS:
                raise TypeError(f"tree at {path or '(root)'}: a PRNG key of impl {impl!r}: tensorlist stores keys "
                                f"of the impls {sorted(PRNG_KEY_IMPLS)}")
            node["kind"] = "leaf" if impl is None else "key"
            node["name"] = name = _unique(path if depth else ROOT_NAME, used)
            if impl is not None:
                node["impl"] = impl
            leaves.append((name, obj))
            continue
        kind, keys, children, extra = c
        node["kind"] = kind
        node.update(extra)
        if kind in ("none", "scalar"):
            continue
        if keys is not None:
            for k in keys:
                if not _is_key(k):
                    raise TypeError(f"tree at {path or '(root)'}: key {short_repr(k)} is a {type(k).__name__}; "
                                    "only str and int keys are stored")
            node["keys"] = keys
        tokens = keys if keys is not None else extra.get("fields", range(len(children)))
        slots = node["children"] = [{} for _ in children]
        prefix = path + "/" if depth else ""
        for i in range(len(children) - 1, -1, -1):
            stack.append((children[i], f"{prefix}{tokens[i]}", slots[i], depth + 1))
    return root, leaves


def _unique(name: str, used: Dict[str, int]) -> str:
    if name not in used:
        used[name] = 0
        return name
    n = used[name]
    while True:
        n += 1
        candidate = f"{name}{DEDUPE_SEPARATOR}{n}"
        if candidate not in used:
            used[name] = n
            used[candidate] = 0
            return candidate


# --------------------------------------------------------------------------
# check and build


@dataclass(frozen=True)
class Plan:
    """A checked spec: ``leaves`` (tensor names in the order the tree meets them) and the build steps.

    ``steps`` are the spec's nodes in preorder (a node, then its children in
    order), so a walk of the spec in that order meets step ``i`` as its
    ``i``-th node (``build``'s ``replace`` counts so). ``key_impls``: the
    ``key`` leaves' tensor names -> their impl.
    """

    leaves: Tuple[str, ...]
    steps: Tuple[Tuple[str, Any, int], ...]  # preorder (kind, payload, arity)
    key_impls: Mapping[str, str]


def check(spec: Any, names: Iterable[str], *, file: Optional[str] = None, field: str = "") -> Plan:
    """Validates ``spec`` against the stored tensors' ``names``; nothing is built.

    Args:
        spec: the parsed JSON spec.
        names: the names of the tensors stored with it.
        file: the file, for messages.
        field: the JSON pointer of ``spec`` in the file's document (e.g.
            ``/metadata/tree``); each error's field extends it.

    Raises:
        FormatError: an unknown node kind or field, keys or fields of the
            wrong type or count, a tree deeper than MAX_TREE_DEPTH, a leaf
            naming a tensor that is not stored or is already used, a tensor
            no leaf names, a namedtuple whose fields are not its class's.

    Example:
        >>> check({"kind": "list", "children": [{"kind": "leaf", "name": "0"}]}, ["0"]).leaves
        ('0',)
    """
    stored = list(names)
    remaining = {n: i for i, n in enumerate(stored)}
    leaves: List[str] = []
    steps: List[Tuple[str, Any, int]] = []
    key_impls: Dict[str, str] = {}
    stack = [(spec, (None, field, None), 0)]  # (node, where: (parent's where, index, key) or the root's, depth)
    while stack:
        node, where, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            raise _error(file, where, f"the tree is deeper than {MAX_TREE_DEPTH} levels")
        if not isinstance(node, dict):
            raise _error(file, where, f"a node must be an object, not {short_repr(node)}")
        kind = node.get("kind")
        allowed = _FIELDS.get(kind) if isinstance(kind, str) else None
        if allowed is None:
            allowed = _node_fields(kind, file, where)
        if node.keys() != allowed:
            missing, extra = sorted(allowed - set(node)), sorted(set(node) - allowed)
            raise _error(file, where, f"a {kind!r} node has exactly the fields {sorted(allowed)}"
                         + (f"; missing {missing}" if missing else "") + (f"; unexpected {extra}" if extra else ""))
        if kind == "leaf" or kind == "key":
            name = node["name"]
            if not isinstance(name, str) or name not in remaining:
                raise _leaf_error(name, leaves, stored, file, where)
            if kind == "key":
                impl = node["impl"]
                if not isinstance(impl, str) or impl not in PRNG_KEY_IMPLS:
                    raise _error(file, where, f"a key's 'impl' is one of {sorted(PRNG_KEY_IMPLS)}, not "
                                 f"{short_repr(impl)}", "/impl", name, remaining[name])
                key_impls[name] = impl
            del remaining[name]
            leaves.append(name)
            steps.append(("leaf", name, 0))
            continue
        if kind == "none":
            steps.append(("none", None, 0))
            continue
        if kind == "scalar":
            steps.append(("scalar", _check_scalar(node, file, where), 0))
            continue
        children = node["children"]
        if not isinstance(children, list):
            raise _error(file, where, f"'children' must be an array, not {short_repr(children)}", "/children")
        tokens: Sequence[Any] = range(len(children))
        payload: Any = None
        if "keys" in allowed or kind == "namedtuple":  # (pytree has keys)
            tokens = payload = _check_keys(node, kind, len(children), file, where)
            if kind == "namedtuple":
                payload = (_namedtuple_class(node["type"], tokens, file, where), tokens)
            elif kind == "pytree":
                _type_name(node["type"], file, where)
        steps.append((kind, payload, len(children)))
        for i in range(len(children) - 1, -1, -1):
            stack.append((children[i], (where, i, tokens[i]), depth + 1))

    if remaining:
        extra_name = min(remaining, key=remaining.get)
        raise FormatError(f"tensor {extra_name!r} is stored but no leaf of the tree names it "
                          f"({len(remaining)} such tensor{'s' if len(remaining) != 1 else ''})", file=file,
                          field=field or "/", tensor_index=remaining[extra_name], tensor_name=extra_name)
    return Plan(tuple(leaves), tuple(steps), key_impls)


def _error(file, where, reason: str, at: str = "", tensor: Optional[str] = None,
           index: Optional[int] = None) -> FormatError:
    """The FormatError about the node at ``where`` (its pointer and tree path rebuilt only now)."""
    hops, keys = [], []
    while where[0] is not None:
        where, i, key = where
        hops.append(f"/children/{i}")
        keys.append(key)
    ptr = where[1] + "".join(reversed(hops)) + at
    return FormatError(f"tree at {_path_text(keys[::-1])}: {reason}", file=file, field=ptr or "/",
                       tensor_name=tensor, tensor_index=index)


def _node_fields(kind: Any, file, where) -> set:
    """The fields of a registered kind's node; a FormatError for a kind nobody registered."""
    if not isinstance(kind, str):
        raise _error(file, where, f"'kind' must be a string, not {short_repr(kind)}", "/kind")
    nt = _REGISTRY.get(kind)
    if nt is None and kind in ADAPTER_KINDS:  # checked without its adapter (validate): its fields are known
        return {"kind", "keys", "children"} if ADAPTER_KINDS[kind] else {"kind", "children"}
    if nt is None:
        known = sorted(set(_FIELDS) | set(_REGISTRY) | set(ADAPTER_KINDS))
        raise _error(file, where, f"unknown node kind {short_repr(kind)} (known: {known}; a kind from an "
                     "adapter is known once the adapter is imported)", "/kind")
    return {"kind", "keys", "children"} if nt.keyed else {"kind", "children"}


def _leaf_error(name: Any, leaves: List[str], stored: List[str], file, where) -> FormatError:
    if not isinstance(name, str):
        return _error(file, where, f"a leaf's 'name' must be a string, not {short_repr(name)}", "/name")
    if name in leaves:
        return _error(file, where, f"tensor {name!r} is already a leaf of the tree (each tensor is referenced "
                      "exactly once)", "/name", name, stored.index(name))
    return _error(file, where, f"the leaf names tensor {name!r}, which the file does not store", "/name")


def _check_scalar(node: Dict[str, Any], file, where) -> Any:
    """A scalar node's Python value: its ``type`` one of SCALAR_TYPES, its ``value`` a JSON value of that type."""
    t, v = node["type"], node["value"]
    if not isinstance(t, str) or t not in SCALAR_TYPES:
        raise _error(file, where, f"a scalar's 'type' is one of {sorted(SCALAR_TYPES)}, not {short_repr(t)}", "/type")
    if t == "bool":
        ok = isinstance(v, bool)
    elif t == "int":
        ok = type(v) is int and _INT_RANGE[0] <= v <= _INT_RANGE[1]
    else:
        ok = ((type(v) is float and v - v == 0) or (type(v) is int and _INT_RANGE[0] <= v <= _INT_RANGE[1])
              or (isinstance(v, str) and v in NON_FINITE))
    if not ok:
        what = {"bool": "true or false", "int": "an integer within int64's range",
                "float": f"a finite number or one of {sorted(NON_FINITE)}"}[t]
        raise _error(file, where, f"a scalar of type {t!r} has as 'value' {what}, not {short_repr(v)}", "/value")
    return NON_FINITE[v] if isinstance(v, str) else SCALAR_TYPES[t](v)


def _type_name(type_name: Any, file, where) -> Tuple[str, str]:
    """``(module, qualname)`` of a node's ``type``, which must read ``module:qualname``."""
    if not isinstance(type_name, str) or type_name.count(":") != 1:
        raise _error(file, where, f"a node's 'type' must be 'module:qualname', not {short_repr(type_name)}",
                     "/type")
    module, qualname = type_name.split(":")
    return module, qualname


def _check_keys(node: Dict[str, Any], kind: str, count: int, file, where) -> List[Any]:
    """A keyed node's keys (a namedtuple's fields): one per child, of the right types, no two alike."""
    label = "fields" if kind == "namedtuple" else "keys"
    keys = node[label]
    if not isinstance(keys, list) or len(keys) != count:
        raise _error(file, where, f"{label!r} must be an array as long as 'children' ({count}), not "
                     f"{short_repr(keys)}", "/" + label)
    seen = set()
    for i, k in enumerate(keys):
        if not (isinstance(k, str) if kind == "namedtuple" else _is_key(k)):
            what = "a field is a string" if kind == "namedtuple" else "a key is a string or an integer"
            raise _error(file, where, f"{label[:-1]} {i} is {short_repr(k)}: {what}", f"/{label}/{i}")
        if (type(k), k) in seen:
            raise _error(file, where, f"{label[:-1]} {short_repr(k)} appears twice", f"/{label}/{i}")
        seen.add((type(k), k))
    return keys


#: The most fields of a namedtuple the codec makes itself (its class not imported): making one costs
#: superlinear time in its fields (about 1.5 s for 10**5, 10 s for 3 * 10**5), and a small file can ask for
#: many fields (``{"kind": "none"}`` children need no tensor).
MAX_REBUILT_FIELDS = 4096

#: How many such classes are kept for reuse (hostile files naming a new type each must not grow it forever).
_DYNAMIC_CACHE = 256

_DYNAMIC: Dict[Tuple[str, Tuple[str, ...]], type] = {}


def _namedtuple_class(type_name: Any, fields: List[str], file, where) -> type:
    """The namedtuple class ``type_name`` ("module:qualname") if its module is imported, else one made alike.

    The name is resolved only among what the program has imported
    (``_base.loaded.loaded_object``): the file's module is never imported, nor is a
    lazy attribute (``numpy:f2py.X``); a class not found so comes back as
    ``collections.namedtuple`` of the same name and fields.
    """
    module, qualname = _type_name(type_name, file, where)
    cls = loaded_object(module, qualname)  # never an import, never a lazy __getattr__ (_loaded)
    if cls is not None:
        known = static_attr(cls, "_fields") if tuple in class_mro(cls) else None
        if not isinstance(known, tuple):
            raise _error(file, where, f"{short_repr(type_name)} is not a namedtuple class", "/type")
        if list(known) != fields:
            raise _error(file, where, f"namedtuple {short_repr(type_name)} has the fields {short_repr(list(known))}, "
                         f"the file {short_repr(fields)}", "/fields")
        return cls
    if len(fields) > MAX_REBUILT_FIELDS:
        raise _error(file, where, f"namedtuple {short_repr(type_name)} has {len(fields)} fields, and its class is "
                     f"not imported: tensorlist rebuilds one of at most {MAX_REBUILT_FIELDS}", "/fields")
    key = (type_name, tuple(fields))
    if key not in _DYNAMIC:
        if len(_DYNAMIC) >= _DYNAMIC_CACHE:
            _DYNAMIC.clear()
        simple = qualname.rsplit(".", 1)[-1] or "namedtuple"
        try:
            _DYNAMIC[key] = collections.namedtuple(simple, fields)
        except ValueError as e:
            raise _error(file, where, f"namedtuple {short_repr(type_name)} cannot be rebuilt: {e}",
                         "/fields") from None
    return _DYNAMIC[key]


def build(plan: Plan, leaves: Mapping[str, Any],
          replace: Optional[Mapping[int, Callable[[List[Any]], Any]]] = None) -> Any:
    """The tree of a checked plan with ``leaves[name]`` at each leaf (iterative).

    ``replace``: step index -> ``children -> value``, which makes that node
    instead (a leaf's ``children`` is empty, and its tensor is not looked up):
    a loader's restore target rebuilding a pytree's type, or leaving a subtree out.
    """
    values: List[Any] = []
    replace = replace or {}
    for i in range(len(plan.steps) - 1, -1, -1):
        kind, payload, arity = plan.steps[i]
        children = [values.pop() for _ in range(arity)]
        if i in replace:
            values.append(replace[i](children))
        elif kind == "leaf":
            values.append(leaves[payload])
        elif kind == "none":
            values.append(None)
        elif kind == "scalar":
            values.append(payload)
        elif kind == "list":
            values.append(children)
        elif kind == "tuple":
            values.append(tuple(children))
        elif kind == "dict" or kind == "pytree":
            values.append(dict(zip(payload, children)))
        elif kind == "ordereddict":
            values.append(collections.OrderedDict(zip(payload, children)))
        elif kind == "namedtuple":
            values.append(payload[0]._make(children))
        else:
            values.append(_REGISTRY[kind].unflatten(payload, children))
    [tree] = values
    return tree


def decode(spec: Any, arrays: Mapping[str, Any], *, file: Optional[str] = None, field: str = "") -> Any:
    """The tree ``spec`` describes, with ``arrays[name]`` at each leaf; checked first (see :func:`check`).

    Example:
        >>> spec, _ = encode({"a": ("A", None), 0: ["B"]})
        >>> decode(spec, {"a/0": "x", "0/0": "y"})
        {'a': ('x', None), 0: ['y']}
    """
    return build(check(spec, arrays.keys(), file=file, field=field), arrays)


# --------------------------------------------------------------------------
# header and render


def make_header(spec: Dict[str, Any], metadata: Any = None) -> Dict[str, Any]:
    """The metadata document of a tree file: format, spec and the user's metadata."""
    return {"format": JAX_TREE_FORMAT, "tree": spec, "metadata": metadata}


def tree_header(metadata: Any, *, file: Optional[str] = None, field: str = "/metadata") -> Optional[Dict[str, Any]]:
    """The tree header in a file's metadata, or None if the metadata is not a tree file's.

    Raises:
        FormatError: the metadata claims the tree format but lacks its fields.
    """
    if not (isinstance(metadata, dict) and metadata.get("format") == JAX_TREE_FORMAT):
        return None
    if set(metadata) != {"format", "tree", "metadata"}:
        raise FormatError(f"a {JAX_TREE_FORMAT} header has exactly the fields ['format', 'metadata', 'tree'], "
                          f"not {sorted(metadata)}", file=file, field=field)
    return metadata


def render(spec: Any, info: Optional[Mapping[str, str]] = None) -> List[str]:
    """Text lines drawing the tree (for ``tensorlist inspect``); malformed nodes are shown, not refused.

    Args:
        spec: a spec (checked or not).
        info: optional text per tensor name (dtype and shape), shown beside its leaf.

    Example:
        >>> spec, _ = encode({"params": {"w": "W"}, "opt": None, "step": 3})
        >>> print("\\n".join(render(spec, {"params/w": "float32 (2, 3)"})))
        dict
        ├── 'params': dict
        │   └── 'w': params/w  float32 (2, 3)
        ├── 'opt': None
        └── 'step': int 3
    """
    info = info or {}
    lines: List[str] = []
    stack: List[Tuple[Any, str, str, str, int]] = [(spec, "", "", "", 0)]
    while stack:
        node, label, lead, child_lead, depth = stack.pop()
        if depth > MAX_TREE_DEPTH:
            lines.append(f"{lead}{label}...")
            continue
        kind = node.get("kind") if isinstance(node, dict) else None
        if kind == "leaf":
            name = node.get("name")
            text = f"{name}  {info[name]}" if isinstance(name, str) and name in info else str(name)
        elif kind == "none":
            text = "None"
        elif kind == "scalar":
            text = f"{node.get('type')} {short_repr(node.get('value'), 40)}"
        elif kind == "key":
            name = node.get("name")
            text = f"key<{node.get('impl')}> {name}" + (f"  {info[name]}" if isinstance(name, str) and name in info
                                                        else "")
        elif kind in ("namedtuple", "pytree"):
            text = f"{kind} {node.get('type')}"
        elif isinstance(kind, str):
            text = kind
        else:
            text = f"? {short_repr(node, 60)}"
        lines.append(f"{lead}{label}{text}")
        children = node.get("children") if isinstance(node, dict) else None
        if not isinstance(children, list) or kind in ("leaf", "none", "scalar", "key"):
            continue
        keys = node.get("fields" if kind == "namedtuple" else "keys")
        keys = keys if isinstance(keys, list) and len(keys) == len(children) else None
        for i in reversed(range(len(children))):
            last = i == len(children) - 1
            tok = repr(keys[i]) if keys is not None and kind != "namedtuple" else (
                str(keys[i]) if keys is not None else f"[{i}]")
            stack.append((children[i], f"{tok}: ", child_lead + ("└── " if last else "├── "),
                          child_lead + ("    " if last else "│   "), depth + 1))
    return lines

