"""The only jax <-> numpy conversion of the package (a leaf: imports jax, numpy, ``_base.dtypes``).

Every module that meets a ``jax.Array`` (``tensorlist.jax``, the sharded
checkpoints of ``dcp.jax_shards``) converts through here, so that every path
applies the same dtype rules and refuses the same arrays:

- a dtype jax cannot hold is refused with a TypeError naming the tensor;
- a 64-bit value (int64, uint64, float64, complex128) while
  ``jax_enable_x64`` is off is refused: ``jax.device_put`` would silently
  truncate it to 32 bits. ``put(..., downcast=True)`` is the explicit opt-in
  that converts (a copy that truncates: int64 -> int32, float64 -> float32);
- a jax.Array that is not fully addressable (sharded over several processes)
  has no whole value in this process: ``to_numpy`` refuses it and names the
  sharded save.

Zero-copy: ``jax.device_put`` of a host numpy view onto a CPU device aliases
the view's memory when its data pointer is 64-byte aligned (tensorlist's
default alignment; measured on jax 0.10: 4-32 byte alignments copy), and
copies otherwise; bfloat16 and float8 views alias too (they reach jax as
ml_dtypes arrays). The read-only mapped pages are then shared, never written:
jax arrays are immutable.
"""
from __future__ import annotations

import functools
from typing import Any, Optional, Tuple

import jax
import numpy as np

from tensorlist._base import dtypes as _dtypes
from tensorlist.errors import UnsupportedDTypeError

__all__ = ["to_numpy", "put", "check_dtype", "refusal", "is_array", "key_impl", "key_data", "wrap_key", "abstract_key",
           "XLA_ALIGNMENT"]

#: Alignment (bytes) at which ``jax.device_put`` of a host view aliases it on a
#: CPU device instead of copying (XLA's minimum buffer alignment).
XLA_ALIGNMENT = 64

_PY_SCALARS = (bool, int, float, complex)


def is_array(value: Any) -> bool:
    """Whether ``value`` is a ``jax.Array`` (committed or not, sharded or not)."""
    return isinstance(value, jax.Array)


def key_impl(value: Any) -> Optional[str]:
    """The impl name (``"threefry2x32"``, ``"rbg"``...) of a typed PRNG key array or its abstract value, else None.

    Example:
        >>> key_impl(jax.random.key(0, impl="rbg")), key_impl(jax.numpy.zeros(2))
        ('rbg', None)
    """
    dtype = getattr(value, "dtype", None)
    if dtype is None or not isinstance(value, (jax.Array, jax.ShapeDtypeStruct)):
        return None
    try:
        if not jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
            return None
    except TypeError:  # a dtype jax does not know (a numpy array's object dtype...)
        return None
    return str(dtype._impl.name)  # jax.random.key_impl takes arrays only, not ShapeDtypeStructs


def abstract_key(data_shape: Tuple[int, ...], impl: str) -> jax.ShapeDtypeStruct:
    """The ShapeDtypeStruct of the PRNG key array of ``impl`` over key data of ``data_shape`` (no array made)."""
    return jax.eval_shape(functools.partial(jax.random.wrap_key_data, impl=impl),
                          jax.ShapeDtypeStruct(data_shape, np.uint32))


def key_data(keys: jax.Array) -> jax.Array:
    """The uint32 key data of a typed PRNG key array (``jax.random.key_data``: its shape plus the impl's)."""
    return jax.random.key_data(keys)


def wrap_key(data: Any, impl: str, target: Optional[Any], name: str) -> jax.Array:
    """A typed PRNG key array of ``impl`` over ``data`` (uint32 key data, host or jax), placed on ``target``.

    ``target``: None (where ``data`` is, or jax's default device for host
    data), a ``jax.Device`` or a ``jax.sharding.Sharding`` of the key array's
    shape. Keys are small; they are made on one device and then moved.

    Raises:
        TypeError: ``data`` is not the key data of ``impl`` (dtype or trailing shape), naming the tensor.
    """
    try:
        keys = jax.random.wrap_key_data(data, impl=impl)
    except (TypeError, ValueError) as e:
        raise TypeError(f"tensor {name!r}: its {np.dtype(data.dtype)} {tuple(data.shape)} values are not the key "
                        f"data of a {impl} PRNG key ({e})") from None
    return keys if target is None else jax.device_put(keys, target)


def refusal(name: str) -> Optional[str]:
    """Why jax cannot hold tensorlist dtype ``name``, or None when it can (for ``_base.dtypes.check_held``).

    The rows whose numpy type is a bit carrier (FP4 pairs packed two to a
    byte, float4_e2m1fn_x2): jax's float4 holds one value a byte, and would
    take the bytes as unsigned integers (:func:`check_dtype`'s first rule).
    64-bit rows are held: whether ``jax_enable_x64`` is on is decided per load.
    """
    if _dtypes.bits_row(_dtypes.from_name(name).numpy) is not None:
        return f"jax has no {name} type"
    return None


def check_dtype(dtype, name: str, *, downcast: bool = False) -> np.dtype:
    """The dtype a jax array of ``dtype`` gets; refuses what jax cannot hold exactly.

    Args:
        dtype: a numpy dtype (ml_dtypes' included), as a file stores it.
        name: the tensor's name, quoted in every message.
        downcast: with ``jax_enable_x64`` off, accept a 64-bit dtype and return
            the 32-bit dtype jax would truncate it to (the caller converts).

    Returns:
        The native-order numpy dtype of the jax array to make.

    Raises:
        TypeError: jax has no such dtype, or a 64-bit dtype while
            ``jax_enable_x64`` is off and ``downcast`` is False.

    Example:
        >>> import numpy as np
        >>> check_dtype(np.dtype("<f4"), "w")
        dtype('float32')
    """
    dt = np.dtype(dtype)
    carried = _dtypes.bits_row(dt)
    if carried is not None:  # packed float4 pairs (or raw bits): jax would take them as unsigned integers
        raise TypeError(f"tensor {name!r}: jax cannot hold dtype {carried.name}")
    native = dt.newbyteorder("=") if dt.itemsize > 1 else dt
    try:
        canonical = np.dtype(jax.dtypes.canonicalize_dtype(native))
    except (TypeError, ValueError) as e:
        raise TypeError(f"tensor {name!r}: jax cannot hold dtype {dt} ({e})") from None
    if native.kind in "OUSMm" or (native.kind == "V" and native.type.__module__ != "ml_dtypes"):
        raise TypeError(f"tensor {name!r}: jax cannot hold dtype {dt}")
    if canonical != native:
        if not downcast:
            raise TypeError(
                f"tensor {name!r}: dtype {native} needs jax_enable_x64 (it is off, and jax would silently "
                f"truncate it to {canonical}): call jax.config.update('jax_enable_x64', True) first, or "
                f"load with downcast=True to convert it to {canonical} knowingly")
        return canonical
    return native


def to_numpy(x: Any, name: str) -> np.ndarray:
    """A host numpy array of ``x`` (a jax.Array or anything array-like), for saving.

    A jax array on a CPU device comes back as a read-only view of its buffer
    (no copy); one on an accelerator, or replicated/sharded over several local
    devices, is copied to host memory once. bfloat16 and float8 arrays come
    back as ml_dtypes arrays (the bytes unchanged).

    Args:
        x: a ``jax.Array``, a numpy array, or an array-like with a dtype.
        name: the tensor's name (its path in the tree), quoted in messages.

    Raises:
        ValueError: ``x`` is a jax.Array that is not fully addressable (its
            shards live in several processes): save it with ``sharded=True``.
        TypeError: ``x`` is a Python scalar or has no array dtype tensorlist
            stores (object, strings, int4, ...).

    Example:
        >>> import jax.numpy as jnp
        >>> to_numpy(jnp.arange(3, dtype=jnp.bfloat16), "w").dtype
        dtype(bfloat16)
    """
    if isinstance(x, jax.Array):
        if not x.is_fully_addressable:
            raise ValueError(
                f"tensor {name!r}: this jax.Array is sharded across processes (not fully addressable): "
                "no process holds its whole value; save it with tensorlist.jax.save(path, tree, sharded=True)")
        a = np.asarray(x)
    elif isinstance(x, np.generic):  # before the Python scalars: np.float64 subclasses float
        a = np.asarray(x)
    elif isinstance(x, _PY_SCALARS):
        raise TypeError(
            f"tensor {name!r}: a Python {type(x).__name__} ({x!r}) is not an array, and its dtype would be a "
            "guess: store it as an array (jnp.asarray(x, dtype)); tensorlist.jax.save keeps it in the tree")
    elif isinstance(x, np.ndarray):
        a = x
    elif hasattr(x, "__array__") or hasattr(x, "__array_interface__") or isinstance(x, np.generic):
        a = np.asarray(x)
    else:
        raise TypeError(f"tensor {name!r}: a {type(x).__module__}.{type(x).__qualname__} is not an array")
    try:
        _dtypes.from_numpy(a.dtype)
    except (KeyError, TypeError, ValueError, UnsupportedDTypeError):
        raise TypeError(f"tensor {name!r}: dtype {a.dtype} has no tensorlist dataType code") from None
    return a


def put(view: np.ndarray, target: Optional[Any], name: str, *, downcast: bool = False,
        dtype: Optional[Any] = None) -> jax.Array:
    """A jax.Array of ``view``'s values on ``target``; zero-copy onto a CPU device where jax allows it.

    Args:
        view: a host numpy array (a read-only mapped view, typically).
        target: None (jax's default device), a ``jax.Device``, or a
            ``jax.sharding.Sharding`` (each addressable device gets its slice,
            through ``jax.make_array_from_callback`` over views of ``view``).
        name: the tensor's name, quoted in messages.
        downcast: convert a 64-bit dtype to 32 bits when ``jax_enable_x64`` is
            off (a copy that truncates) instead of refusing it.
        dtype: convert to this dtype (numpy's ``astype``, block by block: a
            copy) instead of keeping the stored one; it must be a dtype jax
            holds (see :func:`check_dtype`), the stored one need not be.

    Safety:
        Aliased pages stay mapped as long as the jax array lives (jax keeps
        ``view``, whose base owns the mapping); they are read-only, and jax
        never writes an input buffer.

    Raises:
        TypeError: see :func:`check_dtype`; ``target`` of another type.

    Example:
        >>> import numpy as np
        >>> put(np.arange(4, dtype=np.float32), None, "w").shape
        (4,)
    """
    dt = check_dtype(view.dtype if dtype is None else dtype, name, downcast=downcast)
    sharded = isinstance(target, jax.sharding.Sharding) and len(target.device_set) > 1
    if view.dtype != dt and not sharded:  # a foreign byte order, the opted-in 64 -> 32 bit conversion, a cast
        view = view.astype(dt)
    if target is None or isinstance(target, jax.Device):
        return jax.device_put(view, target)
    if isinstance(target, jax.sharding.Sharding):
        if not sharded:
            return jax.device_put(view, target)
        if view.dtype != dt:  # each device's block converted alone: no whole-array copy
            return jax.make_array_from_callback(view.shape, target, lambda index: view[index].astype(dt))
        return jax.make_array_from_callback(view.shape, target, lambda index: view[index])
    raise TypeError(f"tensor {name!r}: target must be None, a jax.Device or a jax.sharding.Sharding, "
                    f"not {type(target).__name__}")
