"""JAX pytrees as tensorlist files: ``save(path, tree)`` and ``load(path, sharding=..., device=...)``.

A tree file is a named TensorList: one tensor per leaf, named by its key path
(``params/dense/kernel``), and in the descriptor's metadata the tree's
structure (``_tree``'s spec) with the caller's metadata::

    {"format": "tensorlist.jax-tree/1", "tree": <spec>, "metadata": <metadata>}

so every node comes back as what it was: dicts (str and int keys, in their
order), OrderedDicts, lists, tuples, ``None``, namedtuples, Flax's
``FrozenDict``; an NNX ``State`` is stored through its pure dict
(``nnx.to_pure_dict``) and comes back as that pure dict (see
:func:`load_nnx`). A Python scalar leaf (``{"step": 3}``) is refused, naming
its path: its dtype would be a guess; store ``jnp.asarray(3, jnp.int32)`` or
put it in ``metadata=``.

Loading onto a CPU device copies nothing: each leaf is ``jax.device_put`` of
the 64-byte aligned read-only mapped view, which jax aliases (bfloat16 and
float8 too); another device gets one copy, straight from the mapping. 64-bit
leaves need ``jax_enable_x64`` (or ``downcast=True``, which converts them to
32 bits knowingly): jax would otherwise truncate them silently.

A tree holding arrays sharded over several processes is saved with
``sharded=True`` as a checkpoint directory (``_jax_shards``, tensorlist's DCP
layout); ``load`` of a directory reads it back onto any target sharding.

A ``flax.FrozenDict`` node comes back as a ``FrozenDict`` when the program
has imported flax, else as a dict: a file never causes an import.

Imports ``_jax_bridge`` (the one jax <-> numpy conversion), ``_tree``, ``_loaded``,
``reader``, ``writer`` and ``_jax_shards`` (checkpoint directories).
"""
from __future__ import annotations

import os
from typing import Any, Dict, List, Tuple

import jax
import numpy as np

from . import _jax_shards, _tree, reader, writer
from ._jax_bridge import check_dtype, is_array, put, to_numpy
from ._loaded import loaded_object
from .errors import FormatError, short_repr
from .format import DEFAULT_ALIGNMENT

__all__ = ["save", "load", "load_nnx", "JAX_TREE_FORMAT", "TREE_FIELD"]

#: The ``format`` of a tree file's metadata (see the module docstring).
JAX_TREE_FORMAT = _tree.JAX_TREE_FORMAT

#: Where the spec sits in a tree file's descriptor (a JSON pointer, for messages).
TREE_FIELD = "/metadata/tree"


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
         checksum: bool = True, durable: bool = True) -> None:
    """Saves a pytree of arrays: one tensor per leaf, the structure in the metadata.

    Atomic and durable as :func:`tensorlist.save`. Leaves on a CPU device are
    written straight from their buffers (no host copy); others are copied to
    the host one at a time.

    Args:
        path: the descriptor file (``sharded=False``) or the checkpoint
            directory (``sharded=True``).
        tree: dicts (str or int keys), OrderedDicts, lists, tuples,
            namedtuples, ``None``, ``flax.core.FrozenDict``, ``nnx.State``,
            with jax or numpy arrays as leaves.
        metadata: any JSON value, returned by ``tensorlist.open(path).metadata["metadata"]``.
        sharded: write a checkpoint directory, each process its addressable
            shards (replica 0 only): needed for arrays sharded across processes.
        alignment, checksum, durable: as :func:`tensorlist.save` (keep the
            64-byte default or a multiple: jax aliases 64-byte aligned buffers).

    Raises:
        TypeError: a leaf that is not an array (a Python scalar, a string), a
            dtype tensorlist does not store, a key neither str nor int, a
            container that would come back as another type; each naming its path.
        ValueError: an array sharded across processes without ``sharded=True``;
            a tree deeper than ``_tree.MAX_TREE_DEPTH``.

    Example:
        >>> import jax.numpy as jnp, tempfile, os, tensorlist.jax as tlj
        >>> path = os.path.join(tempfile.mkdtemp(), "params.tl")
        >>> tlj.save(path, {"dense": {"kernel": jnp.ones((2, 3)), "bias": jnp.zeros(3)}, "step": None})
        >>> tlj.load(path)["dense"]["kernel"].shape
        (2, 3)
    """
    spec, leaves = _tree.encode(tree)
    header = _tree.make_header(spec, metadata)
    if sharded:
        arrays = {name: v if is_array(v) else put(to_numpy(v, name), None, name) for name, v in leaves}
        _jax_shards.save_dir(path, arrays, header, alignment=alignment, checksum=checksum, durable=durable)
        return
    for name, v in leaves:
        if is_array(v) and not v.is_fully_addressable:
            raise ValueError(f"tensor {name!r} is sharded across processes: a single file cannot hold it; "
                             "save the tree with tensorlist.jax.save(path, tree, sharded=True)")
    arrays = {name: to_numpy(v, name) for name, v in leaves}
    writer.save(path, arrays, metadata=header, alignment=alignment, checksum=checksum, durable=durable)


def load(path, *, sharding: Any = None, device: Any = None, mmap: bool = True, verify: bool = False,
         downcast: bool = False, **kwargs) -> Any:
    """Loads a tree saved by :func:`save` (a file, or a ``sharded=True`` directory).

    Args:
        path: the descriptor file or checkpoint directory.
        sharding: None, one ``jax.sharding.Sharding`` for every leaf, or a tree
            matching the saved one whose leaves are Shardings, jax Devices,
            ``jax.ShapeDtypeStruct`` (its ``.sharding`` is used, its shape and
            dtype checked against the file) or None (the default placement);
            a None or a Sharding in place of a subtree applies to every leaf
            below it (a prefix, as in jax).
        device: any jax device (a ``jax.Device``): every leaf there. Not with
            ``sharding``.
        mmap: map the file (default: zero-copy onto CPU devices) or read it
            into private memory first.
        verify: check the stored CRC32Cs first.
        downcast: with ``jax_enable_x64`` off, convert 64-bit leaves to 32
            bits (a copy that truncates) instead of refusing them.
        **kwargs: the reader's limits (``max_tensors``...; files only).

    Returns:
        The tree, every leaf a ``jax.Array``.

    Raises:
        FormatError: not a tree file, or a spec that does not match the
            tensors (a missing or extra leaf, an unknown node kind, a too deep
            tree, keys of the wrong type), or a ShapeDtypeStruct disagreeing
            with the file: naming the file and the path in the tree; nothing
            is put on a device before the whole spec and every target are checked.
        TypeError: a leaf jax cannot hold (64-bit without x64 and without
            ``downcast``), naming it; ``device`` that is not a ``jax.Device``.
        ValueError: both ``sharding`` and ``device``; reader limits given for
            a directory; a ``sharding`` tree that does not match the saved tree
            (a node or leaf of another kind, other keys or length, a leaf target
            of another type), naming the file and the path in the tree.

    Example:
        >>> import jax, jax.numpy as jnp, tempfile, os, tensorlist.jax as tlj
        >>> path = os.path.join(tempfile.mkdtemp(), "t.tl")
        >>> tlj.save(path, (jnp.ones(2), None, [jnp.arange(3)]))
        >>> tree = tlj.load(path, device=jax.devices()[0])
        >>> type(tree).__name__, tree[1], tree[2][0].tolist()
        ('tuple', None, [0, 1, 2])
    """
    if sharding is not None and device is not None:
        raise ValueError("give sharding= or device=, not both")
    if device is not None and not isinstance(device, jax.Device):
        raise TypeError(f"device must be a jax.Device (jax.devices()[i]), not {type(device).__name__}")
    path = os.fspath(path)
    if os.path.isdir(path):
        if kwargs:
            raise ValueError(f"{path}: a checkpoint directory takes sharding=, device=, mmap=, verify= and "
                             f"downcast= only, not {sorted(kwargs)}")
        return _load_dir(path, sharding, device, mmap, verify, downcast)
    with reader.Reader(path, mmap=mmap, **kwargs) as r:
        header = _tree.tree_header(r.descriptor.metadata, file=r.path)
        if header is None:
            raise FormatError(f"not a tensorlist.jax tree file (its metadata has no format {JAX_TREE_FORMAT!r}): "
                              "read it with tensorlist.load", file=r.path, field="/metadata")
        plan = _tree.check(header["tree"], r.keys(), file=r.path, field=TREE_FIELD)
        infos = {n: r.info(n) for n in plan.leaves}
        for n, t in infos.items():
            check_dtype(t.dtype.numpy, n, downcast=downcast)
        targets = _targets(header["tree"], sharding, device,
                           {n: (tuple(t.shape), t.dtype.numpy) for n, t in infos.items()}, downcast, r.path)
        if verify:
            r.verify(list(plan.leaves))
        arrays = {n: put(r[n], targets[n], n, downcast=downcast) for n in plan.leaves}
    return _tree.build(plan, arrays)


def _load_dir(path: str, sharding, device, mmap: bool, verify: bool, downcast: bool) -> Any:
    with _jax_shards.open_dir(path, mmap=mmap, verify=verify) as ck:
        header = _tree.tree_header(ck.header, file=ck.metadata_file, field="/tree")
        if header is None:
            raise FormatError("not a tensorlist.jax checkpoint (its metadata has no tree): read it with "
                              "tensorlist.dcp_read.read_full", file=ck.metadata_file, field="/tree")
        plan = _tree.check(header["tree"], ck.names(), file=ck.metadata_file, field="/tree/tree")
        for n in plan.leaves:
            check_dtype(ck.dtype(n), n, downcast=downcast)
        targets = _targets(header["tree"], sharding, device, {n: (tuple(ck.shape(n)), ck.dtype(n))
                                                              for n in plan.leaves}, downcast, path)
        arrays = {n: ck.load(n, targets[n], downcast=downcast) for n in plan.leaves}
    return _tree.build(plan, arrays)


def _targets(spec, sharding, device, stored: Dict[str, Tuple[Tuple[int, ...], np.dtype]], downcast: bool,
             file: str) -> Dict[str, Any]:
    """Where each leaf goes: None (default), a Device or a Sharding; checks a target tree against the spec."""
    if sharding is None:
        return {n: device for n in stored}
    if isinstance(sharding, jax.sharding.Sharding):
        return {n: sharding for n in stored}
    out: Dict[str, Any] = {}
    stack = [(spec, sharding, ())]
    while stack:
        node, target, path = stack.pop()
        where = "/".join(map(str, path)) or "(root)"
        kind = node["kind"]
        if kind == "none":
            continue
        if kind == "leaf":
            out[node["name"]] = _leaf_target(node["name"], target, stored[node["name"]], downcast, file, where)
            continue
        tokens = node.get("keys") or node.get("fields") or list(range(len(node["children"])))
        if target is None or isinstance(target, jax.sharding.Sharding):  # a prefix: the whole subtree
            stack.extend((c, target, path + (t,)) for t, c in zip(tokens, node["children"]))
            continue
        try:
            found = _tree.node_of(target, where)
        except TypeError:  # a container the codec does not store (a dict subclass): not the file's node
            found = None
        if found is None or found[0] == "none":
            raise _mismatch(file, where, f"the file holds a {kind} here, the sharding tree a {type(target).__name__}")
        _, keys, children, _ = found
        if "keys" in node:
            if keys is None or sorted(map(repr, keys)) != sorted(map(repr, node["keys"])):
                raise _mismatch(file, where, f"keys {short_repr(keys)} do not match the file's "
                                f"{short_repr(node['keys'])}")
            by_key = {(type(k), k): c for k, c in zip(keys, children)}
            sub = [by_key[(type(k), k)] for k in node["keys"]]
        else:
            if keys is not None or len(children) != len(node["children"]):
                raise _mismatch(file, where, f"the file holds a {kind} of {len(node['children'])}, the sharding "
                                f"tree a {type(target).__name__} of {len(children)}")
            sub = children
        stack.extend((c, t, path + (k,)) for k, c, t in zip(tokens, node["children"], sub))
    return out


def _leaf_target(name: str, target, stored: Tuple[Tuple[int, ...], np.dtype], downcast: bool, file: str,
                 where: str):
    if target is None or isinstance(target, (jax.sharding.Sharding, jax.Device)):
        return target
    if isinstance(target, jax.ShapeDtypeStruct):
        shape, dtype = stored
        want = check_dtype(dtype, name, downcast=downcast)
        if tuple(target.shape) != shape or np.dtype(target.dtype) != want:
            raise FormatError(f"tree at {where}: the file stores {want} {shape}, the target ShapeDtypeStruct "
                              f"asks for {np.dtype(target.dtype)} {tuple(target.shape)}", file=file,
                              tensor_name=name)
        return target.sharding
    raise _mismatch(file, where, f"the file holds a leaf here; a leaf's target is a Sharding, a Device, a "
                    f"ShapeDtypeStruct or None, not a {type(target).__name__}")


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
