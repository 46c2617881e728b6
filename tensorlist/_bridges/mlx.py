"""The only MLX <-> numpy conversion of the package (a leaf: imports mlx, numpy and ``dtypes``).

What MLX 0.32 does with numpy arrays, measured, and what follows here:

- ``mx.array(a)`` always copies (MLX owns its buffers): loading is one copy
  per tensor, made from the read-only mapping (no page is read twice).
- ``mx.array(a)`` of a float64 array silently makes a **float32** array, and of
  a complex128 array a complex64 one: float64 is asked for by name
  (``dtype=mx.float64``, which MLX holds on the CPU), and complex128, which MLX
  has no type for, is refused rather than rounded.
- float8 arrays make ``mx.array`` raise ``RuntimeError: std::bad_cast``, naming
  nothing. MLX holds float8_e4m3fn as its ``uint8`` bytes (``mx.load`` of a
  safetensors ``F8_E4M3`` tensor gives them, ``mx.from_fp8`` decodes them):
  such a tensor loads the same way (``AS_BYTES``); the other float8 rows are
  refused here first, naming the tensor.
- shapes are 32-bit: a dimension past ``MAX_DIM`` (even of an empty array)
  makes ``mx.array`` raise a bare ``OverflowError``: refused first, naming
  the file and the tensor.
- bfloat16 crosses as its ``uint16`` bits (``.view(mx.bfloat16)``), which needs
  neither MLX's nor numpy's knowledge of the other's bfloat16: saves and loads
  move bit carriers (``DType.bits``), so ml_dtypes is never imported for them.
- ``np.array(x, copy=False)`` of an evaluated ``mx.array`` shares MLX's buffer
  (the buffer protocol): saving converts without a copy (a strided array is
  made contiguous by the writer, once).
"""
from __future__ import annotations

from typing import Dict, Mapping, Optional

import mlx.core as mx
import numpy as np

from tensorlist._base import dtypes

__all__ = ["is_array", "refusal", "to_numpy", "from_numpy", "mlx_dtype", "state_to_numpy", "HELD", "AS_BYTES", "MAX_DIM"]

#: tensorlist dtype name -> MLX dtype, for every row of the table MLX can hold.
HELD: Dict[str, "mx.Dtype"] = {
    **{name: getattr(mx, name)
       for name in ("uint8", "int8", "int16", "int32", "int64", "uint16", "uint32", "uint64", "float16", "float32",
                    "float64", "bfloat16", "complex64")},
    "bool": mx.bool_,
}
_BY_MLX = {v: k for k, v in HELD.items()}

#: tensorlist dtype name -> the MLX dtype holding its bytes, by MLX's own convention (``mx.from_fp8``
#: decodes float8_e4m3fn from uint8). Saving such an array stores uint8: MLX cannot say what it held.
AS_BYTES: Dict[str, "mx.Dtype"] = {"float8_e4m3fn": mx.uint8}

#: The largest dimension an MLX shape holds: MLX's shapes are 32-bit (``mx.array`` raises a bare
#: OverflowError past it, even for an empty array).
MAX_DIM = 2 ** 31 - 1


def is_array(value) -> bool:
    return isinstance(value, mx.array)


def refusal(name: str) -> Optional[str]:
    """Why MLX cannot hold tensorlist dtype ``name``, or None when it can."""
    if name in HELD or name in AS_BYTES:
        return None
    if name == "complex128":
        return "MLX has no complex128 type (mx.array would silently round it to complex64)"
    if name.startswith("float8"):
        return f"MLX has no {name} type (mx.array raises std::bad_cast on it; only float8_e4m3fn has MLX's uint8 convention)"
    return f"MLX has no {name} type"


def mlx_dtype(name: str) -> "mx.Dtype":
    """The MLX dtype holding a tensorlist dtype (``AS_BYTES``: its bytes); TypeError when MLX has none."""
    why = refusal(name)
    if why is not None:
        raise TypeError(f"dtype {name}: {why}")
    return AS_BYTES.get(name) or HELD[name]


def to_numpy(x: "mx.array", where: str = "array", *, bits: bool = False) -> np.ndarray:
    """A numpy array sharing the (evaluated) MLX array's buffer; bfloat16 through ml_dtypes.

    Evaluates ``x`` if it is still lazy; zero-copy otherwise. With ``bits``, a
    bfloat16 array comes back as its bit carrier (``DType.bits``), without ml_dtypes.

    Raises:
        TypeError: ``x`` has a dtype the table lacks (naming ``where``).
    """
    name = _BY_MLX.get(x.dtype)
    if name is None:
        raise TypeError(f"{where}: MLX dtype {x.dtype} has no tensorlist dataType code")
    if name == "bfloat16":
        row = dtypes.from_name(name)
        return np.array(x.view(mx.uint16), copy=False).view((row.bits if bits else row.numpy).newbyteorder("="))
    return np.array(x, copy=False)


def from_numpy(a: np.ndarray, where: str = "tensor") -> "mx.array":
    """A new MLX array holding ``a``'s values (a copy: MLX owns its buffers).

    Raises:
        TypeError: MLX cannot hold ``a``'s dtype (complex128, float8 but
            float8_e4m3fn, which comes as its uint8 bytes), naming ``where``.
    """
    row = dtypes.from_numpy(a.dtype)
    why = refusal(row.name)
    if why is not None:
        raise TypeError(f"{where}: {why}")
    if row.name in AS_BYTES:
        return mx.array(a.view(np.uint8))
    if row.name == "bfloat16":  # its bits, in the host's order
        order = a.dtype.byteorder if a.dtype.byteorder in "<>" else "="
        bits = a.view(np.dtype(np.uint16).newbyteorder(order))
        return mx.array(bits.astype(np.uint16, copy=False)).view(mx.bfloat16)
    if not a.dtype.isnative and a.dtype.itemsize > 1:
        a = a.astype(a.dtype.newbyteorder("="))
    return mx.array(a, dtype=HELD[row.name])


def state_to_numpy(arrays: Mapping[str, "mx.array"]) -> Dict[str, np.ndarray]:
    """A dict of MLX arrays as numpy arrays (zero-copy; bfloat16 as bit carriers), for saving."""
    out = {}
    for k, v in arrays.items():
        where = f"tensor {k!r}"
        if not is_array(v):
            raise TypeError(f"{where}: expected an mlx.core.array, got {type(v).__name__}")
        out[k] = to_numpy(v, where, bits=True)
    return out
