"""MLX adapter: save and load dicts of ``mlx.core.array`` as TensorLists.

Saving is zero-copy up to the writer (numpy reads MLX's buffers in place;
a strided array is made contiguous once); loading copies each tensor once,
because ``mx.array`` always copies: it copies from the read-only mapping, so
no page is read twice. bfloat16 goes both ways. Dtypes MLX cannot hold
(complex128, FP4, the float8 types but float8_e4m3fn, which loads as MLX's uint8
bytes for ``mx.from_fp8``) are refused before any array is made, naming
the file, the tensor and the dtype (MLX itself would round complex128 to
complex64, and raise a bare ``std::bad_cast`` on float8). The conversions live
in ``_bridges.mlx``; see docs/FRAMEWORKS.md.

Imports ``_bridges.mlx``, ``_base.dtypes``, ``reader`` and ``writer``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional

from tensorlist import reader, writer
from tensorlist._base.dtypes import check_held
from tensorlist._bridges.mlx import MAX_DIM, from_numpy, mlx_dtype, refusal, state_to_numpy, to_numpy
from tensorlist.format import DEFAULT_ALIGNMENT

__all__ = ["save", "load", "to_numpy", "from_numpy", "mlx_dtype"]


def save(path, tensors: Mapping[str, Any], *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT,
         checksum: bool = True, durable: bool = True, threads: Optional[int] = None, key=None) -> None:
    """Writes a dict of MLX arrays as a TensorList (atomic and durable, as ``tensorlist.save``).

    Lazy arrays are evaluated; each array's buffer is then written in place
    (zero-copy; a non-contiguous array is copied once).

    Args:
        path: where the descriptor goes (the data file goes beside it).
        tensors: a mapping name -> ``mlx.core.array``.
        metadata: any JSON value, stored as the list's ``metadata``.
        alignment, checksum, durable, threads, key: as ``tensorlist.save`` (``load`` takes ``key=`` too).

    Raises:
        TypeError: a value is not an ``mlx.core.array`` (naming the tensor).

    Example:
        >>> import mlx.core as mx, tempfile, os, tensorlist.mlx as tm
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tl")
        >>> tm.save(path, {"w": mx.ones((2, 3), dtype=mx.bfloat16)}, metadata={"step": 1})
        >>> tm.load(path)["w"].dtype
        mlx.core.bfloat16
    """
    writer.save(path, state_to_numpy(tensors), metadata=metadata, alignment=alignment, checksum=checksum,
                durable=durable, threads=threads, key=key)


def load(path, *, mmap: bool = True, verify: bool = False, pointer: Optional[str] = None,
         **kwargs) -> Dict[str, Any]:
    """Loads a TensorList as a dict of MLX arrays (one copy per tensor: MLX owns its buffers).

    Args:
        path: the JSON document holding the descriptor.
        mmap: True (default): each array is copied from the read-only mapping.
            False: the file is read once into memory first, then copied (two
            copies; only worth it on file systems that map badly).
        verify: check the stored CRC32Cs first (``ChecksumError`` on mismatch).
        pointer: RFC 6901 pointer to a TensorList embedded in a bigger document.
        **kwargs: ``allow_outside`` and the limits, as ``tensorlist.load``.

    Returns:
        dict name -> ``mlx.core.array``, in file order.

    Raises:
        UnsupportedDTypeError: a tensor's dtype is one MLX cannot hold
            (complex128, float8), naming the file, the tensor and the dtype;
            nothing is converted then.
        FormatError: the descriptor or data file breaks the format, or a
            tensor has a dimension past ``2**31 - 1`` (MLX's shapes are 32-bit;
            an empty tensor may have one), naming the file, the tensor and ``dims``.
    """
    arrays = reader.load(path, mmap=mmap, verify=verify, pointer=pointer, bits=True, **kwargs)  # no ml_dtypes
    check_held(path, arrays, refusal, MAX_DIM, "MLX")
    return {k: from_numpy(a, f"tensor {k!r}") for k, a in arrays.items()}

