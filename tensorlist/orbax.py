"""Orbax adapter: save and restore pytrees as tensorlist files through Orbax's own API.

Orbax (``orbax-checkpoint``) lets a third party plug in a whole item format
through a ``CheckpointHandler`` and the argument classes registered with it
(``ocp.args.register_with_handler``). This module registers one:

* :class:`TensorListCheckpointHandler` writes an item as one tensorlist file
  (``tree.tl`` in the item's directory) through :func:`tensorlist.jax.save`,
  or, when a leaf is a ``jax.Array`` that this process cannot see whole (or
  with ``TensorListSave(sharded=True)``), as a sharded checkpoint directory
  (``tree/``, every process writing its shards, restored onto any mesh);
* :class:`TensorListSave` and :class:`TensorListRestore` are its arguments, so
  ``ocp.Checkpointer(TensorListCheckpointHandler())`` and
  ``ocp.CheckpointManager(..., item_handlers=TensorListCheckpointHandler())``
  (or a dict of item handlers with ``ocp.args.Composite``) work unchanged;
  restore hands its target (an abstract tree of ``jax.ShapeDtypeStruct`` with
  shardings, a single ``Sharding``, or a device) to :func:`tensorlist.jax.load`,
  which reads only what each local device needs.

Orbax's v1 API (``orbax.checkpoint.experimental.v1``) resolves handlers per
checkpointable through a registry: :class:`TensorListHandler` is such a
handler (``registry.add(TensorListHandler, checkpointable_name="params")``).
A v1 *layout* (the whole checkpoint's format, as ``SafetensorsLayout`` is) cannot
be added from outside: see docs/FRAMEWORKS.md, "Orbax".

Orbax still owns the step directory: its temporary name, the atomic rename,
its ``_CHECKPOINT_METADATA`` file and the retention policy. Inside the item
directory, every file is tensorlist's, and ``tensorlist inspect`` reads it.

Imports orbax, jax and ``tensorlist.jax`` (nothing else imports this module).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, List, Optional

import jax
import numpy as np
import orbax.checkpoint as ocp

from tensorlist._bridges import jax as _jax_bridge
from tensorlist.dcp import jax_shards
from tensorlist._base import tree as _tree
from tensorlist import reader
from tensorlist import jax as tl_jax
from tensorlist.errors import FormatError
from tensorlist.format import DEFAULT_ALIGNMENT, confine

__all__ = [
    "TREE_FILE", "SHARDED_DIR", "TensorListCheckpointHandler", "TensorListSave", "TensorListRestore",
    "TensorListHandler",
]

# The names inside an item's directory (Orbax gives each item a directory of its own): one
# tensorlist file when every leaf is whole in this process, else a sharded checkpoint directory.
TREE_FILE = "tree.tl"
SHARDED_DIR = "tree"

#: Where the tree header sits in a sharded item's metadata (a JSON pointer, for messages).
SHARDED_TREE_FIELD = "/tree"


def _is_sharded_across_processes(tree: Any) -> bool:
    """True when some leaf is a ``jax.Array`` this process does not hold whole (a multi-process save)."""
    return any(isinstance(x, jax.Array) and not x.is_fully_addressable for x in jax.tree_util.tree_leaves(tree))


def _writes_shards(tree: Any, sharded: Optional[bool]) -> bool:
    """Whether a save writes the sharded ``tree/`` directory: ``sharded``, or when None, a leaf spans processes."""
    return _is_sharded_across_processes(tree) if sharded is None else bool(sharded)


def _save(directory, tree: Any, metadata: Any, *, alignment: int, checksum: bool, durable: bool,
          primary_host: Optional[int], sharded: Optional[bool] = None) -> None:
    """Writes ``tree`` into the item directory: one file from the primary host, or every process's shards.

    ``sharded``: None chooses (the directory when a leaf spans processes), True
    writes the directory, False one file (refused for a leaf spanning processes).
    """
    directory = os.fspath(directory)
    if sharded is False and _is_sharded_across_processes(tree):
        raise ValueError(f"{directory}: TensorListSave(sharded=False), but a leaf is a jax.Array sharded across "
                         "processes, which one file cannot hold; leave sharded=None (or True)")
    if _writes_shards(tree, sharded):
        # every process writes its own shards; tensorlist.jax commits the descriptor last, on process 0
        tl_jax.save(os.path.join(directory, SHARDED_DIR), tree, metadata=metadata, sharded=True,
                    alignment=alignment, checksum=checksum, durable=durable)
    elif ocp.multihost.is_primary_host(primary_host):
        # every process holds the same values; one writes them, as Orbax's own handlers do
        tl_jax.save(os.path.join(directory, TREE_FILE), tree, metadata=metadata, alignment=alignment,
                    checksum=checksum, durable=durable)


def _host_copy(leaf: Any) -> Any:
    """A host copy of an array leaf (what an async save writes later); anything else as it is.

    A PRNG key array has no numpy form: its key data is copied, and wrapped again (keys are small).
    """
    impl = _jax_bridge.key_impl(leaf)
    if impl is not None:
        return _jax_bridge.wrap_key(np.array(_jax_bridge.key_data(leaf), copy=True), impl, None, "")
    if isinstance(leaf, jax.Array) or isinstance(leaf, np.ndarray):
        return np.array(leaf, copy=True)
    return leaf


def _orbax_target(item: Any) -> Any:
    """Orbax's restore ``item`` as ``tensorlist.jax.load``'s target tree: a None in it means "do not restore"."""
    if item is None or isinstance(item, jax.sharding.Sharding):
        return item
    return jax.tree_util.tree_map(lambda x: tl_jax.SKIP if x is None else x, item, is_leaf=lambda x: x is None)


def _restore(directory, target: Any, device: Any, verify: bool) -> Any:
    """Loads the item directory's tree onto ``target`` (an Orbax item, a Sharding or None) or ``device``.

    Orbax's semantics for the item: a None in it leaves that leaf or subtree
    out (it comes back None); a leaf of another dtype casts (``cast=True``).
    """
    directory = os.fspath(directory)
    for name in (TREE_FILE, SHARDED_DIR):
        path = confine(directory, name, what="item file", where="Orbax item directory")
        if os.path.lexists(path):
            return tl_jax.load(path, sharding=_orbax_target(target), device=device, verify=verify, cast=True)
    raise FileNotFoundError(f"{directory}: no tensorlist item here (neither {TREE_FILE} nor {SHARDED_DIR}/); "
                            "was it saved with TensorListCheckpointHandler?")


def _abstract(directory) -> Optional[Any]:
    """The saved tree with a ``jax.ShapeDtypeStruct`` at each leaf (no tensor data read), or None.

    The single file's descriptor, or a sharded ``tree/`` item's metadata (and
    its shards' descriptors, which opening the checkpoint checks). None: no item
    here, or one whose metadata holds no tree.
    """
    directory = os.fspath(directory)
    path = confine(directory, TREE_FILE, what="item file", where="Orbax item directory")
    if os.path.lexists(path) and not os.path.isdir(path):
        with reader.Reader(path) as r:
            header = _tree.tree_header(r.descriptor.metadata, file=r.path)
            if header is None:
                return None
            shapes = {n: (tuple(r.info(n).shape), r.info(n).dtype.numpy) for n in r.keys()}
            return _abstract_tree(header["tree"], shapes, r.path, tl_jax.TREE_FIELD)
    path = confine(directory, SHARDED_DIR, what="item file", where="Orbax item directory")
    if os.path.lexists(path) and not os.path.isdir(path):
        raise FormatError(f"is not a directory: a sharded item's {SHARDED_DIR}/ holds its shards", file=path)
    if os.path.isdir(path):
        with jax_shards.open_dir(path) as ck:
            header = _tree.tree_header(ck.header, file=ck.metadata_file, field=SHARDED_TREE_FIELD)
            if header is None:
                return None
            shapes = {n: (tuple(ck.shape(n)), ck.dtype(n)) for n in ck.names()}
            return _abstract_tree(header["tree"], shapes, ck.metadata_file, SHARDED_TREE_FIELD + "/tree")
    return None


def _abstract_tree(spec: Any, shapes: dict, file: str, field: str) -> Any:
    """The tree of ``spec`` with a ShapeDtypeStruct per leaf (a PRNG key leaf's: the key array's, not its data's)."""
    plan = _tree.check(spec, shapes.keys(), file=file, field=field)
    leaves = {}
    for n, (shape, dtype) in shapes.items():
        impl = plan.key_impls.get(n)
        leaves[n] = (jax.ShapeDtypeStruct(shape, dtype) if impl is None else
                     _jax_bridge.abstract_key(shape, impl))
    return _tree.build(plan, leaves)


class TensorListCheckpointHandler(ocp.AsyncCheckpointHandler):
    """An Orbax ``CheckpointHandler`` that stores a pytree as a tensorlist file.

    ``save`` (``ocp.Checkpointer``) writes before it returns. ``async_save``
    (``ocp.AsyncCheckpointer``, ``CheckpointManager``'s default) copies the
    leaves to host memory in the caller's thread, so that the arrays may be
    donated or changed as soon as it returns, and writes in Orbax's background
    commit; a sharded save (a tree sharded across processes, or
    ``TensorListSave(sharded=True)``) is written in the caller's thread (every
    process takes part).

    Args:
        alignment: byte alignment of every tensor (the default, 64, is what
            XLA needs to alias a mapped CPU array instead of copying it).
        checksum: store each tensor's CRC32C (checked by ``verify=True``).
        durable: fsync the files before the save returns (Orbax then renames
            the step directory into place).
        primary_host: the process that writes a tree whose leaves every process
            holds whole (Orbax's ``MultiprocessingOptions.primary_host``;
            ``None``: every process writes, for one process per directory).

    Example:
        >>> import jax.numpy as jnp, orbax.checkpoint as ocp, tempfile, os
        >>> from tensorlist.orbax import TensorListCheckpointHandler, TensorListSave, TensorListRestore
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> tree = {"dense": {"kernel": jnp.ones((2, 3), jnp.bfloat16), "bias": jnp.zeros(3)}}
        >>> with ocp.Checkpointer(TensorListCheckpointHandler()) as ckptr:
        ...     ckptr.save(path, args=TensorListSave(tree))
        ...     back = ckptr.restore(path, args=TensorListRestore())
        >>> back["dense"]["kernel"].dtype, back["dense"]["bias"].shape
        (dtype(bfloat16), (3,))
    """

    def __init__(self, *, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True, durable: bool = True,
                 primary_host: Optional[int] = 0):
        self._alignment = alignment
        self._checksum = checksum
        self._durable = durable
        self._primary_host = primary_host

    def save(self, directory: Any, *args: Any, **kwargs: Any) -> None:
        """Writes ``args.item`` (a :class:`TensorListSave`) into ``directory``.

        Raises:
            TypeError: ``args`` is not a :class:`TensorListSave`, or a leaf
                cannot be stored (named by its path in the tree).
        """
        save_args = _the_args(args, kwargs, TensorListSave, "save")
        _save(directory, save_args.item, save_args.metadata, alignment=self._alignment,
              checksum=self._checksum, durable=self._durable, primary_host=self._primary_host,
              sharded=save_args.sharded)

    async def async_save(self, directory: Any, *args: Any, **kwargs: Any) -> List[Any]:
        """Copies ``args.item`` to host memory now; the returned commit future writes it.

        Raises:
            TypeError: ``args`` is not a :class:`TensorListSave`.
        """
        save_args = _the_args(args, kwargs, TensorListSave, "async_save")
        options = {"alignment": self._alignment, "checksum": self._checksum, "durable": self._durable,
                   "primary_host": self._primary_host, "sharded": save_args.sharded}
        if _writes_shards(save_args.item, save_args.sharded):
            # collective (device collectives must not run in a background thread, interleaved with the
            # caller's): in the caller's thread, once Orbax has created the directory (it may do so in the
            # background, in the primary process only)
            _await_directory()
            _save(directory, save_args.item, save_args.metadata, **options)
            return []
        if not ocp.multihost.is_primary_host(self._primary_host):
            return []  # the primary host writes the file
        host = jax.tree_util.tree_map(_host_copy, save_args.item)

        async def write() -> None:
            _save(directory, host, save_args.metadata, **options)
        return [ocp.future.CommitFutureAwaitingContractedSignals(write(), name="tensorlist_save")]

    def restore(self, directory: Any, *args: Any, **kwargs: Any) -> Any:
        """Loads the tree saved in ``directory``, as :class:`TensorListRestore` asks.

        Raises:
            FileNotFoundError: ``directory`` holds no tensorlist item.
            tensorlist.FormatError: the file or its tree does not hold together
                (naming the file and the path in the tree).
            ValueError: a target tree that does not match the saved one
                (naming the file and the path in the tree).
        """
        restore_args = _the_args(args, kwargs, TensorListRestore, "restore", optional=True)
        if restore_args is None:
            restore_args = TensorListRestore()
        return _restore(directory, restore_args.target(), restore_args.device, restore_args.verify)

    def metadata(self, directory: Any) -> Optional[Any]:
        """Orbax's item metadata: the saved tree with a ``jax.ShapeDtypeStruct`` (shape, dtype) at each leaf.

        Reads the descriptor only (for a sharded ``tree/`` item: its metadata
        and its shards' descriptors). Add shardings to it for a restore target
        (``TensorListRestore(item=...)``).

        Raises:
            tensorlist.FormatError: the file or its tree does not hold together
                (naming the file, the JSON pointer and the path in the tree).
        """
        return _abstract(directory)


def _await_directory() -> None:
    """Blocks until the directories Orbax is creating for this save exist (its signals contract; else at once)."""
    async def nothing() -> None:
        return None
    ocp.future.CommitFutureAwaitingContractedSignals(nothing(), name="tensorlist_await_directory").result()


def _the_args(args: tuple, kwargs: dict, cls: type, what: str, optional: bool = False) -> Any:
    """The one ``CheckpointArgs`` Orbax passes (as ``args=``, the way its handlers take it)."""
    value = kwargs.pop("args", None)
    if value is None and args:
        value, args = args[0], args[1:]
    if args or kwargs:
        raise TypeError(f"TensorListCheckpointHandler.{what} takes only args={cls.__name__}(...); "
                        f"got also {len(args)} positional and {sorted(kwargs)!r}")
    if value is None and optional:
        return None
    if not isinstance(value, cls):
        raise TypeError(f"TensorListCheckpointHandler.{what} needs args={cls.__name__}(...), "
                        f"got {type(value).__name__}")
    return value


@ocp.args.register_with_handler(TensorListCheckpointHandler, for_save=True)
@dataclasses.dataclass
class TensorListSave(ocp.args.CheckpointArgs):
    """What :class:`TensorListCheckpointHandler` saves.

    Attributes:
        item: the pytree (dicts, lists, tuples, namedtuples, ``None`` leaves,
            Flax ``FrozenDict``, ``flax.struct`` dataclasses such as
            ``TrainState``; leaves ``jax.Array``, numpy arrays, PRNG key
            arrays, Python bool/int/float), as :func:`tensorlist.jax.save` takes it.
        metadata: any JSON value, stored with the tree.
        sharded: None (default): one file ``tree.tl`` when this process holds
            every leaf whole, else the sharded directory ``tree/``, every
            process writing its own shards; True: always the directory (each
            device's shard a chunk, restored onto any mesh); False: always one
            file (refused for a leaf sharded across processes).
    """

    item: Any
    metadata: Any = None
    sharded: Optional[bool] = None


@ocp.args.register_with_handler(TensorListCheckpointHandler, for_restore=True)
@dataclasses.dataclass
class TensorListRestore(ocp.args.CheckpointArgs):
    """How :class:`TensorListCheckpointHandler` restores.

    Attributes:
        item: the target, as ``StandardRestore(item)`` takes it: a tree
            matching the saved one of ``jax.ShapeDtypeStruct``s (with
            shardings), live ``jax.Array``s, numpy arrays or ``Sharding``s,
            Python scalars where the file holds scalars, and registered pytree
            nodes (a ``TrainState``: restored as that type). Each leaf is
            placed (and resharded) as its target says, reading only the slices
            the local devices need; a target of another dtype casts, as
            Orbax's; another shape is an error naming the path. A ``None``
            leaves that leaf or subtree out (it comes back None, unread), as in
            Orbax. Leaves without a sharding go to jax's default device (the
            file records no sharding).
        sharding: one ``jax.sharding.Sharding`` for every leaf (instead of
            ``item``).
        device: one ``jax.Device`` for every leaf; default: jax's default device.
        verify: check every tensor's CRC32C while loading.
    """

    item: Any = None
    sharding: Any = None
    device: Any = None
    verify: bool = False

    def target(self) -> Any:
        """``item`` or ``sharding`` (at most one of them), as :func:`tensorlist.jax.load`'s ``sharding=``."""
        if self.item is not None and self.sharding is not None:
            raise ValueError("TensorListRestore takes item= (an abstract tree) or sharding= (one Sharding for "
                             "every leaf), not both")
        return self.item if self.item is not None else self.sharding


class TensorListHandler:
    """A v1 ``CheckpointableHandler`` (``orbax.checkpoint.experimental.v1``): one checkpointable as tensorlist.

    Register it for a checkpointable's name in a local registry (or globally
    with ``ocp.handlers.register_handler``); the abstract checkpointable on
    load is the same target :class:`TensorListRestore` takes.

    Example:
        >>> import jax.numpy as jnp, tempfile, os
        >>> import orbax.checkpoint.experimental.v1 as ocp
        >>> from tensorlist.orbax import TensorListHandler
        >>> registry = ocp.handlers.local_registry()
        >>> _ = registry.add(TensorListHandler, checkpointable_name="params")
        >>> ctx = ocp.Context()
        >>> ctx.checkpointables.registry = registry
        >>> path = os.path.join(tempfile.mkdtemp(), "ckpt")
        >>> with ctx:
        ...     ocp.save_checkpointables(path, {"params": {"w": jnp.arange(3.0)}})
        ...     back = ocp.load_checkpointables(path)
        >>> back["params"]["w"].tolist()
        [0.0, 1.0, 2.0]
    """

    def __init__(self, *, alignment: int = DEFAULT_ALIGNMENT, checksum: bool = True, durable: bool = True,
                 primary_host: Optional[int] = 0):
        self._options = {"alignment": alignment, "checksum": checksum, "durable": durable,
                         "primary_host": primary_host}

    async def save(self, directory: Any, checkpointable: Any) -> Any:
        """Copies nothing in the foreground; the returned awaitable writes once ``directory`` exists.

        Safety: with ``save_checkpointables_async``, the arrays must stay alive
        (not donated to a jitted step) until the save completes.
        """
        async def background() -> None:
            path = await directory.await_creation()
            _save(path, checkpointable, None, **self._options)
        return background()

    async def load(self, directory: Any, abstract_checkpointable: Any = None) -> Any:
        """Returns an awaitable of the tree, placed as ``abstract_checkpointable`` says (or by default)."""
        async def background() -> Any:
            return _restore(directory, abstract_checkpointable, None, False)
        return background()

    async def metadata(self, directory: Any) -> Any:
        """The saved tree with a ``jax.ShapeDtypeStruct`` at each leaf (the descriptor only is read)."""
        return _abstract(directory)

    def is_handleable(self, checkpointable: Any) -> bool:
        """Any pytree whose leaves are arrays (``jax.Array`` and its PRNG keys, numpy), Python scalars or ``None``."""
        leaves = jax.tree_util.tree_leaves(checkpointable)
        return bool(leaves) and all((hasattr(x, "shape") and hasattr(x, "dtype")) or type(x) in _SCALARS
                                    for x in leaves)

    def is_abstract_handleable(self, abstract_checkpointable: Any) -> Optional[bool]:
        """A tree of ``jax.ShapeDtypeStruct`` / ``Sharding`` / array / Python scalar leaves (``None`` always)."""
        leaves = jax.tree_util.tree_leaves(abstract_checkpointable)
        return all(isinstance(x, (jax.ShapeDtypeStruct, jax.sharding.Sharding, jax.Array)) or type(x) in _SCALARS
                   for x in leaves)


#: The Python scalars a tree stores as values (``_base.tree``'s ``scalar`` node).
_SCALARS = (bool, int, float)
