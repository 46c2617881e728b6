"""JAX pytrees as tensorlist files: ``save(path, tree)`` and ``load(path, sharding=..., device=...)``.

A tree file is a named TensorList: one tensor per leaf, named by its key path
(``params/dense/kernel``), and in the descriptor's metadata the tree's
structure (``_base.tree``'s spec) with the caller's metadata::

    {"format": "tensorlist.jax-tree/1", "tree": <spec>, "metadata": <metadata>}

so every node comes back as what it was: dicts (str and int keys, in their
order), OrderedDicts, lists, tuples, ``None``, namedtuples, Flax's
``FrozenDict``; an NNX ``State`` is stored through its pure dict
(``nnx.to_pure_dict``) and comes back as that pure dict (see
:func:`load_nnx`). What Orbax's trees hold besides arrays is kept too: a
Python ``bool``/``int``/``float`` leaf (``{"step": 3}``) is a value in the
spec and comes back as the same type; a typed PRNG key array
(``jax.random.key``) is stored as its key data with its impl and comes back
typed; any other node registered with jax (a ``flax.struct`` dataclass such
as ``TrainState``) is stored by its key paths and comes back as a dict, or as
the target's type when ``load`` is given a target tree holding one (its
static fields, ``apply_fn`` and ``tx``, are the target's: they are not saved).

A restore target (``load(sharding=tree)``) may hold, per leaf, a Sharding, a
Device, a ``jax.ShapeDtypeStruct`` or a live array (its shape, dtype and
sharding), None (the default device) or :data:`SKIP` (not read);
``cast=True`` converts a leaf to its target's dtype. ``tensorlist.orbax``
restores through these with Orbax's semantics (an item's None is SKIP, casts on).

Loading onto a CPU device copies nothing: each leaf is ``jax.device_put`` of
the 64-byte aligned read-only mapped view, which jax aliases (bfloat16 and
float8 too); another device gets one copy, straight from the mapping. 64-bit
leaves need ``jax_enable_x64`` (or ``downcast=True``, which converts them to
32 bits knowingly): jax would otherwise truncate them silently.

A tree holding arrays sharded over several processes is saved with
``sharded=True`` as a checkpoint directory (``jax_shards``, tensorlist's DCP
layout); ``load`` of a directory reads it back onto any target sharding.

A ``flax.FrozenDict`` node comes back as a ``FrozenDict`` when the program
has imported flax, else as a dict: a file never causes an import.

Imports ``_bridges.jax`` (the one jax <-> numpy conversion), ``_base.tree``, ``_base.loaded``, ``_base.dtypes``,
``reader``, ``writer`` and ``jax_shards`` (checkpoint directories).
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Dict, List, Optional, Tuple

import jax
import numpy as np

from tensorlist.dcp import jax_shards
from tensorlist._base import tree as _tree
from tensorlist import reader
from tensorlist import writer
from tensorlist._base.dtypes import check_held
from tensorlist._bridges.jax import check_dtype, is_array, key_data, key_impl, put, refusal, to_numpy, wrap_key
from tensorlist._base.loaded import loaded_object
from tensorlist.errors import FormatError, short_repr
from tensorlist.format import DEFAULT_ALIGNMENT

__all__ = ["save", "load", "load_nnx", "SKIP", "JAX_TREE_FORMAT", "TREE_FIELD"]

#: The ``format`` of a tree file's metadata (see the module docstring).
JAX_TREE_FORMAT = _tree.JAX_TREE_FORMAT

#: Where the spec sits in a tree file's descriptor (a JSON pointer, for messages).
TREE_FIELD = "/metadata/tree"


class _Skip:
    """The type of :data:`SKIP`."""

    def __repr__(self) -> str:
        return "tensorlist.jax.SKIP"


#: A target (in ``load``'s ``sharding`` tree) that leaves a leaf or subtree out: it comes back as None and
#: its tensors are not read (Orbax's ``None`` in a restore item, which ``tensorlist.orbax`` maps to this).
SKIP = _Skip()


def _key_token(entry: Any) -> Any:
    """The key of one jax key-path entry: ``GetAttrKey.name``, ``DictKey.key``, ``SequenceKey.idx``..."""
    for attr in ("name", "key", "idx"):
        if hasattr(entry, attr):
            return getattr(entry, attr)
    return str(entry)


def _pytree_node(obj: Any) -> Optional[Tuple[str, List[Any], List[Any]]]:
    """``(type name, keys, children)`` of a node registered with jax that the codec does not know, else None.

    One level of ``jax.tree_util.tree_flatten_with_path``: a ``flax.struct``
    dataclass's keys are its pytree fields' names (its static fields, such as
    a TrainState's ``apply_fn`` and ``tx``, are not children: they are not saved).
    """
    if jax.tree_util.all_leaves([obj]):
        return None
    entries, _ = jax.tree_util.tree_flatten_with_path(obj, is_leaf=lambda x: x is not obj)
    t = type(obj)
    return f"{t.__module__}:{t.__qualname__}", [_key_token(p[0]) for p, _ in entries], [c for _, c in entries]


def _rebuild(target: Any, file_keys: List[Any], children: List[Any]) -> Any:
    """``target``'s type (a registered pytree node) with ``children`` (in the file's key order) as its children."""
    entries, treedef = jax.tree_util.tree_flatten_with_path(target, is_leaf=lambda x: x is not target)
    by_key = {(type(k), k): c for k, c in zip(file_keys, children)}
    return jax.tree_util.tree_unflatten(treedef, [by_key[(type(k), k)] for k in
                                                  (_key_token(p[0]) for p, _ in entries)])


def _skipped(children: List[Any]) -> None:
    return None


def _unflatten_frozen_dict(keys, children):
    """A ``FrozenDict`` when the program has imported flax, else a dict: a file never causes an import."""
    frozen = loaded_object("flax.core.frozen_dict", "FrozenDict")
    return frozen(zip(keys, children)) if frozen is not None else dict(zip(keys, children))


def _pure_dict(state) -> Tuple[List[Any], List[Any]]:
    from flax import nnx  # imported already: the program holds a State

    pure = nnx.to_pure_dict(state)
    return list(pure.keys()), list(pure.values())


# The flax types are matched only once flax is imported by the program (a tree
# holding one implies it is); flax is never imported because of a file.
_tree.register(_tree.NodeType(
    kind="flax.FrozenDict", module="flax.core.frozen_dict", qualname="FrozenDict", keyed=True,
    flatten=lambda d: (list(d.keys()), list(d.values())), unflatten=_unflatten_frozen_dict))
_tree.register(_tree.NodeType(
    kind="nnx.State", module="flax.nnx.statelib", qualname="State", keyed=True,
    flatten=_pure_dict, unflatten=lambda keys, children: dict(zip(keys, children))))


def save(path, tree: Any, *, metadata: Any = None, sharded: bool = False, alignment: int = DEFAULT_ALIGNMENT,
         checksum: bool = True, durable: bool = True, key=None) -> None:
    """Saves a pytree of arrays: one tensor per leaf, the structure in the metadata.

    Atomic and durable as :func:`tensorlist.save`. Leaves on a CPU device are
    written straight from their buffers (no host copy); others are copied to
    the host one at a time.

    Args:
        path: the descriptor file (``sharded=False``) or the checkpoint
            directory (``sharded=True``).
        tree: dicts (str or int keys), OrderedDicts, lists, tuples,
            namedtuples, ``None``, ``flax.core.FrozenDict``, ``nnx.State``,
            other nodes registered with jax (``flax.struct`` dataclasses),
            with jax or numpy arrays, typed PRNG key arrays and Python
            bool/int/float values as leaves.
        metadata: any JSON value, returned by ``tensorlist.open(path).metadata["metadata"]``.
        sharded: write a checkpoint directory, each process its addressable
            shards (replica 0 only): needed for arrays sharded across processes.
        alignment, checksum, durable: as :func:`tensorlist.save` (keep the
            64-byte default or a multiple: jax aliases 64-byte aligned buffers).
        key: encrypt the file (as :func:`tensorlist.save`; ``load`` takes
            ``key=`` too); a ``sharded=True`` directory is not encrypted yet.

    Raises:
        TypeError: a leaf that is not an array (a string), a dtype tensorlist
            does not store, a key neither str nor int, a container that would
            come back as another type, an int outside int64's range, a PRNG
            key of an impl not in ``_base.tree.PRNG_KEY_IMPLS``; each naming its path.
        ValueError: an array sharded across processes without ``sharded=True``;
            a tree deeper than ``_base.tree.MAX_TREE_DEPTH``.

    Example:
        >>> import jax.numpy as jnp, tempfile, os, tensorlist.jax as tlj
        >>> path = os.path.join(tempfile.mkdtemp(), "params.tl")
        >>> tlj.save(path, {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}, "step": None})
        >>> tlj.load(path)["dense"]["kernel"].shape
        (2, 3)
    """
    spec, leaves = _tree.encode(tree, other=_pytree_node, key_impl=key_impl)
    leaves = [(name, key_data(v) if key_impl(v) is not None else v) for name, v in leaves]
    header = _tree.make_header(spec, metadata)
    if sharded and key is not None:
        raise ValueError(f"{path}: sharded=True checkpoints cannot be encrypted yet: save a single file with key=")
    if sharded:
        arrays = {name: v if is_array(v) else put(to_numpy(v, name), None, name) for name, v in leaves}
        jax_shards.save_dir(path, arrays, header, alignment=alignment, checksum=checksum, durable=durable)
        return
    for name, v in leaves:
        if is_array(v) and not v.is_fully_addressable:
            raise ValueError(f"tensor {name!r} is sharded across processes: a single file cannot hold it; "
                             "save the tree with tensorlist.jax.save(path, tree, sharded=True)")
    arrays = {name: to_numpy(v, name) for name, v in leaves}
    writer.save(path, arrays, metadata=header, alignment=alignment, checksum=checksum, durable=durable, key=key)


def load(path, *, sharding: Any = None, device: Any = None, mmap: bool = True, verify: bool = False,
         downcast: bool = False, cast: bool = False, **kwargs) -> Any:
    """Loads a tree saved by :func:`save` (a file, or a ``sharded=True`` directory).

    Args:
        path: the descriptor file or checkpoint directory.
        sharding: None, one ``jax.sharding.Sharding`` for every leaf, or a
            target tree matching the saved one whose leaves are Shardings, jax
            Devices, ``jax.ShapeDtypeStruct``s or ``jax.Array``s (their
            ``.sharding`` is used, their shape and dtype checked against the
            file: ``jax.eval_shape`` or the live tree gives such a target),
            numpy arrays (shape and dtype; the default device),
            None (the default placement) or :data:`SKIP` (not read: None
            comes back); a None, a Sharding or SKIP in place of a subtree
            applies to every leaf below it (a prefix, as in jax). A
            registered pytree node in the target (a ``flax.struct``
            dataclass such as ``TrainState``) where the file holds a keyed
            node is rebuilt as that type, its static fields the target's.
            Python scalars and None nodes of the file take any target.
        device: any jax device (a ``jax.Device``): every leaf there. Not with
            ``sharding``.
        mmap: map the file (default: zero-copy onto CPU devices) or read it
            into private memory first.
        verify: check the stored CRC32Cs first (of the leaves read).
        downcast: with ``jax_enable_x64`` off, convert 64-bit leaves to 32
            bits (a copy that truncates) instead of refusing them.
        cast: a target leaf of another dtype (same shape) converts the stored
            values to it (numpy's ``astype``, each device's block: a copy), as
            Orbax restores; False (default): a dtype mismatch is an error.
        **kwargs: the reader's limits (``max_tensors``...; files only).

    Returns:
        The tree, every array leaf a ``jax.Array`` (a PRNG key leaf a typed
        key array of its saved impl), every Python scalar of its saved type;
        a ``pytree`` node (a ``flax.struct`` dataclass) a dict unless the
        target gives its type.

    Raises:
        FormatError: not a tree file, or a spec that does not match the
            tensors (a missing or extra leaf, an unknown node kind, a too deep
            tree, keys of the wrong type), or a target leaf disagreeing with
            the file (shape; dtype without ``cast``), or a key leaf whose
            tensor is not its impl's key data: naming the file and the path
            in the tree; nothing is put on a device before the whole spec and
            every target are checked.
        UnsupportedDTypeError: a leaf of a dtype jax lacks (float4_e2m1fn_x2),
            naming the file, the tensor and the dtype; nothing is put on a device then.
        TypeError: a leaf jax cannot hold (64-bit without x64 and without
            ``downcast``), naming it; ``device`` that is not a ``jax.Device``.
        ValueError: both ``sharding`` and ``device``; reader limits given for
            a directory; a ``sharding`` tree that does not match the saved tree
            (a node or leaf of another kind, other keys or length, a leaf target
            of another type), naming the file and the path in the tree.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile, os, tensorlist.jax as tlj
        >>> path = os.path.join(tempfile.mkdtemp(), "t.tl")
        >>> tlj.save(path, (jnp.ones(2), None, [jnp.arange(3)], 7))
        >>> tree = tlj.load(path, device=jax.devices()[0])
        >>> type(tree).__name__, tree[1], tree[2][0].tolist(), tree[3]
        ('tuple', None, [0, 1, 2], 7)
        >>> target = (jax.ShapeDtypeStruct((2,), jnp.bfloat16), None, tlj.SKIP, 0)
        >>> back = tlj.load(path, sharding=target, cast=True)
        >>> back[0].dtype, back[2]
        (dtype(bfloat16), None)
    """
    if sharding is not None and device is not None:
        raise ValueError("give sharding= or device=, not both")
    if device is not None and not isinstance(device, jax.Device):
        raise TypeError(f"device must be a jax.Device (jax.devices()[i]), not {type(device).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        if kwargs:
            raise ValueError(f"{path}: a checkpoint directory takes sharding=, device=, mmap=, verify=, "
                             f"downcast= and cast= only, not {sorted(kwargs)}")
        return _load_dir(path, sharding, device, mmap, verify, downcast, cast)
    with reader.Reader(path, mmap=mmap, **kwargs) as r:
        r.require_key()
        header = _tree.tree_header(r.descriptor.metadata, file=r.path)
        if header is None:
            raise FormatError(f"not a tensorlist.jax tree file (its metadata has no format {JAX_TREE_FORMAT!r}): "
                              "read it with tensorlist.load", file=r.path, field="/metadata")
        plan = _tree.check(header["tree"], r.keys(), file=r.path, field=TREE_FIELD)
        rows = {n: r.info(n) for n in plan.leaves}
        stored = {n: (tuple(row.shape), row.dtype.numpy) for n, row in rows.items()}
        targets, replace = _targets(header["tree"], plan, sharding, device, stored, downcast, cast, r.path, rows)
        if verify:
            r.verify(list(targets))
        arrays = {n: _put_leaf(lambda t, d, n=n: put(r[n], t, n, downcast=downcast, dtype=d), n,
                               targets[n], plan.key_impls.get(n)) for n in targets}
    return _tree.build(plan, arrays, replace)


def _load_dir(path: str, sharding, device, mmap: bool, verify: bool, downcast: bool, cast: bool) -> Any:
    with jax_shards.open_dir(path, mmap=mmap, verify=verify) as ck:
        header = _tree.tree_header(ck.header, file=ck.metadata_file, field="/tree")
        if header is None:
            raise FormatError("not a tensorlist.jax checkpoint (its metadata has no tree): read it with "
                              "tensorlist.dcp.read_full", file=ck.metadata_file, field="/tree")
        plan = _tree.check(header["tree"], ck.names(), file=ck.metadata_file, field="/tree/tree")
        stored = {n: (tuple(ck.shape(n)), ck.dtype(n)) for n in plan.leaves}
        targets, replace = _targets(header["tree"], plan, sharding, device, stored, downcast, cast, path)
        arrays = {n: _put_leaf(lambda t, d, n=n: ck.load(n, t, downcast=downcast, dtype=d), n, targets[n],
                               plan.key_impls.get(n)) for n in targets}
    return _tree.build(plan, arrays, replace)


def _put_leaf(load_one: Callable[[Any, Any], jax.Array], name: str, target: Tuple[Any, Any],
              impl: Optional[str]) -> jax.Array:
    """One leaf on its target: ``load_one(placement, dtype)``, wrapped as PRNG keys for a key leaf.

    A key leaf's target describes the key array (its placement is the keys')
    or its key data (``"data"``: the data is placed, then wrapped).
    """
    placement, dtype = target
    if impl is None:
        return load_one(placement, dtype)
    if dtype == "data":
        return wrap_key(load_one(placement, None), impl, None, name)
    return wrap_key(load_one(None, None), impl, placement, name)


def _targets(spec, plan: _tree.Plan, sharding, device, stored: Dict[str, Tuple[Tuple[int, ...], np.dtype]],
             downcast: bool, cast: bool, file: str,
             rows: Optional[Dict[str, Any]] = None) -> Tuple[Dict[str, Tuple[Any, Any]], Dict[int, Callable]]:
    """Each leaf to read -> ``(placement, dtype to cast to or None)``, and ``build``'s ``replace``.

    Walks the spec in preorder (as ``_base.tree.check`` numbers its steps) beside
    the target tree, checking the one against the other, then checks every
    leaf's stored dtype (or the dtype it is cast to) and every key leaf's data.
    ``rows``: a file's descriptor rows by leaf, so that a dtype jax lacks is
    refused as every adapter refuses one (``_base.dtypes.check_held``: the
    file, the tensor and the dtype); a directory's leaves have no row.
    """
    replace: Dict[int, Callable] = {}
    if sharding is None or isinstance(sharding, jax.sharding.Sharding):
        out = {n: (device if sharding is None else sharding, None) for n in stored}
    else:
        out = {}
        stack = [(spec, sharding, ())]
        index = -1
        while stack:
            node, target, path = stack.pop()
            index += 1
            where = "/".join(map(str, path)) or "(root)"
            kind = node["kind"]
            children = node.get("children", [])
            tokens = node.get("keys") or node.get("fields") or list(range(len(children)))
            sub = [target] * len(children)  # a prefix (None, a Sharding, SKIP): the whole subtree
            if target is SKIP:
                replace[index] = _skipped
            elif kind in ("none", "scalar"):
                pass  # nothing to place: any target is taken (the Python scalar itself, a ShapeDtypeStruct...)
            elif kind in ("leaf", "key"):
                out[node["name"]] = _leaf_target(node["name"], target, stored[node["name"]], node.get("impl"),
                                                 downcast, cast, file, where)
            elif not (target is None or isinstance(target, jax.sharding.Sharding)):
                sub = _sub_targets(node, target, index, replace, file, where)
            stack.extend((c, t, path + (k,)) for k, c, t in reversed(list(zip(tokens, children, sub))))
    if rows is not None:  # the leaves read only: a SKIPped one may be of any dtype
        check_held(file, {n: rows[n] for n in out}, refusal)
    for n, (placement, dtype) in out.items():
        if isinstance(getattr(placement, "mesh", None), _ABSTRACT_MESH):
            raise ValueError(f"{file}: the target of leaf {n!r} is a sharding over an abstract mesh (no devices; "
                             "jax.eval_shape of a closure may give one): give a sharding over a jax.sharding.Mesh")
        impl = plan.key_impls.get(n)
        if impl is not None:
            _check_key_data(n, stored[n], impl, file)
        else:
            check_dtype(stored[n][1] if dtype is None else dtype, n, downcast=downcast)
    return out, replace


#: jax's device-less mesh type (a sharding over it places nothing), where this jax has one.
_ABSTRACT_MESH = getattr(jax.sharding, "AbstractMesh", ())


def _sub_targets(node, target, index: int, replace: Dict[int, Callable], file: str, where: str) -> List[Any]:
    """The targets of a container node's children, in the file's order (a pytree target rebuilds its type)."""
    kind = node["kind"]
    try:
        found = _tree.node_of(target, where, other=_pytree_node)
    except TypeError:  # a container the codec does not store (a dict subclass): not the file's node
        found = None
    if found is None and not node["children"]:
        return []  # an empty container (optax.MaskedNode, {}) takes a leaf's target: there is nothing to place
    if found is None or found[0] in ("none", "scalar"):
        raise _mismatch(file, where, f"the file holds a {kind} here, the sharding tree a {type(target).__name__}")
    target_kind, keys, children, _ = found
    if "keys" not in node:
        if keys is not None or len(children) != len(node["children"]):
            raise _mismatch(file, where, f"the file holds a {kind} of {len(node['children'])}, the sharding "
                            f"tree a {type(target).__name__} of {len(children)}")
        return children
    if keys is None or sorted(map(repr, keys)) != sorted(map(repr, node["keys"])):
        raise _mismatch(file, where, f"keys {short_repr(keys)} do not match the file's {short_repr(node['keys'])}")
    if target_kind == "pytree":
        replace[index] = functools.partial(_rebuild, target, node["keys"])
    by_key = {(type(k), k): c for k, c in zip(keys, children)}
    return [by_key[(type(k), k)] for k in node["keys"]]


def _leaf_target(name: str, target, stored: Tuple[Tuple[int, ...], np.dtype], impl: Optional[str],
                 downcast: bool, cast: bool, file: str, where: str) -> Tuple[Any, Any]:
    """``(placement, dtype to cast to, or None)`` of one leaf (a key leaf: ``"data"`` or None, see _put_leaf)."""
    if target is None or isinstance(target, (jax.sharding.Sharding, jax.Device)):
        return target, None
    if not isinstance(target, (jax.ShapeDtypeStruct, jax.Array, np.ndarray, np.generic)):
        raise _mismatch(file, where, f"the file holds a leaf here; a leaf's target is a Sharding, a Device, a "
                        f"ShapeDtypeStruct, an array or None, not a {type(target).__name__}")
    shape, dtype = stored
    asked = tuple(target.shape)
    placement = getattr(target, "sharding", None)  # a numpy array has none: the default device
    if impl is not None:  # the key array itself, or its key data (Orbax's to_shape_dtype_struct of a key)
        if key_impl(target) == impl and asked + _tree.PRNG_KEY_IMPLS[impl] == shape:
            return placement, None
        if key_impl(target) is None and asked == shape and np.dtype(target.dtype) == np.uint32:
            return placement, "data"
        raise FormatError(f"tree at {where}: the file stores a {impl} PRNG key array of shape "
                          f"{shape[:len(shape) - len(_tree.PRNG_KEY_IMPLS[impl])]}, the target asks for "
                          f"{target.dtype} {asked}", file=file, tensor_name=name)
    want = check_dtype(dtype, name, downcast=downcast or cast)
    got = key_impl(target)
    if asked != shape or got is not None or (np.dtype(target.dtype) != want and not cast):
        raise FormatError(f"tree at {where}: the file stores {want} {shape}, the target {type(target).__name__} "
                          f"asks for {target.dtype} {asked}"
                          + (" (load with cast=True to convert)" if asked == shape and got is None else ""),
                          file=file, tensor_name=name)
    if not cast:
        return placement, None  # the stored dtype (or its downcast, which put makes)
    to = check_dtype(target.dtype, name, downcast=True)  # as jax holds it: int64 is int32 with x64 off
    return placement, (None if to == dtype else to)


def _check_key_data(name: str, stored: Tuple[Tuple[int, ...], np.dtype], impl: str, file: str) -> None:
    """A key leaf's tensor must be uint32 key data of its impl's trailing shape."""
    shape, dtype = stored
    tail = _tree.PRNG_KEY_IMPLS[impl]
    if np.dtype(dtype) != np.uint32 or tuple(shape[len(shape) - len(tail):]) != tail:
        raise FormatError(f"tensor {name!r}: a {impl} PRNG key leaf holds uint32 key data of shape (..., "
                          f"{', '.join(map(str, tail))}), not {np.dtype(dtype)} {shape}", file=file,
                          tensor_name=name)


def _mismatch(file: str, where: str, reason: str) -> ValueError:
    """The ValueError of a ``sharding`` tree that does not match the saved tree (the caller's, not the file's)."""
    return ValueError(f"{file}: sharding tree at {where}: {reason}")


def load_nnx(path, model, **kwargs) -> Any:
    """Loads a tree saved from ``nnx.state(model)`` into ``model`` (in place); returns the model.

    The file holds the state's pure dict (``nnx.to_pure_dict``); this puts it
    back through ``nnx.replace_by_pure_dict`` and ``nnx.update``, Flax 0.12's
    documented way.

    Args:
        path: a file saved with ``save(path, nnx.state(model))``.
        model: an ``nnx.Module`` of the same structure.
        **kwargs: as :func:`load` (``sharding``, ``device``, ...).

    Example:
        >>> import tempfile, os, tensorlist.jax as tlj
        >>> from flax import nnx
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tl")
        >>> tlj.save(path, nnx.state(nnx.Linear(2, 3, rngs=nnx.Rngs(0))))
        >>> model = tlj.load_nnx(path, nnx.Linear(2, 3, rngs=nnx.Rngs(1)))
        >>> bool((model.kernel[...] == nnx.Linear(2, 3, rngs=nnx.Rngs(0)).kernel[...]).all())
        True
    """
    from flax import nnx

    state = nnx.state(model)
    nnx.replace_by_pure_dict(state, load(path, **kwargs))
    nnx.update(model, state)
    return model
