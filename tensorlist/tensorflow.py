"""TensorFlow adapter: save and load dicts of ``tf.Tensor`` / ``tf.Variable`` as TensorLists.

Loading is zero-copy: the file is mapped copy-on-write (``tensorlist.load(...,
mmap="copy")``) and each tensor is handed to TensorFlow by DLPack over the
mapped bytes (bfloat16 as its bits, re-typed by ``tf.bitcast``, still in
place); nothing is read until used, and nothing ever reaches the file. The
float8 types are copied (``tf.bitcast`` refuses them; ``tf.constant`` takes
ml_dtypes arrays); ``float8_e8m0fnu``, which TensorFlow lacks, is refused before
any tensor is made, naming the file, the tensor and the dtype. Saving reads
each CPU tensor's buffer in place (DLPack; float8 through ``.numpy()``, a
copy). The conversions live in ``_bridges.tf``; see docs/FRAMEWORKS.md.

Imports ``_bridges.tf``, ``_base.dtypes``, ``reader`` and ``writer``.
"""
from __future__ import annotations

from typing import Any, Dict, Mapping, Optional, Union

from tensorlist import reader, writer
from tensorlist._base.dtypes import check_held
from tensorlist._bridges.tf import address, from_numpy, refusal, state_to_numpy, tf_dtype, to_numpy
from tensorlist.format import DEFAULT_ALIGNMENT

__all__ = ["save", "load", "to_numpy", "from_numpy", "tf_dtype", "address"]


def save(path, tensors: Mapping[str, Any], *, metadata: Any = None, alignment: int = DEFAULT_ALIGNMENT,
         checksum: bool = True, durable: bool = True, threads: Optional[int] = None, key=None) -> None:
    """Writes a dict of ``tf.Tensor``/``tf.Variable`` as a TensorList (atomic and durable, as ``tensorlist.save``).

    CPU tensors are written from their own buffers (zero-copy, bfloat16
    included); float8 tensors and tensors on another device are copied to
    host memory first, one at a time.

    Args:
        path: where the descriptor goes (the data file goes beside it).
        tensors: a mapping name -> ``tf.Tensor`` or ``tf.Variable``.
        metadata: any JSON value, stored as the list's ``metadata``.
        alignment, checksum, durable, threads, key: as ``tensorlist.save`` (``load`` takes ``key=`` too).

    Raises:
        TypeError: a value is not a dense tensor (``tf.SparseTensor``,
            ``tf.RaggedTensor``...) or has a dtype the table lacks
            (``tf.string``, ``tf.int4``...), naming the tensor.

    Example:
        >>> import tensorflow as tf, tempfile, os, tensorlist.tensorflow as ttf
        >>> path = os.path.join(tempfile.mkdtemp(), "m.tl")
        >>> ttf.save(path, {"w": tf.Variable(tf.ones((2, 3), tf.bfloat16)), "step": tf.constant(7)})
        >>> loaded = ttf.load(path)
        >>> loaded["w"].dtype.name, int(loaded["step"])
        ('bfloat16', 7)
    """
    writer.save(path, state_to_numpy(tensors), metadata=metadata, alignment=alignment, checksum=checksum,
                durable=durable, threads=threads, key=key)


def load(path, *, mmap: Union[bool, str] = True, verify: bool = False, pointer: Optional[str] = None,
         **kwargs) -> Dict[str, Any]:
    """Loads a TensorList as a dict of ``tf.Tensor`` (zero-copy, float8 excepted).

    ``tf.Variable(t)`` of a loaded tensor makes a variable from it (TensorFlow
    shares the buffer until the variable is first assigned, then copies):
    ``{k: tf.Variable(t, name=k) for k, t in load(path).items()}``, or
    ``var.assign(t)`` into existing variables.

    Args:
        path: the JSON document holding the descriptor.
        mmap: True or ``"copy"`` (default): the tensors alias a copy-on-write
            mapping of the file: no byte is read until used, the file never
            changes. False: the file is read once into private memory, which
            the tensors then alias (no second copy).
        verify: check the stored CRC32Cs first (``ChecksumError`` on mismatch).
        pointer: RFC 6901 pointer to a TensorList embedded in a bigger document.
        **kwargs: ``allow_outside`` and the limits, as ``tensorlist.load``.

    Returns:
        dict name -> ``tf.Tensor`` (on the CPU), in file order. The tensors
        keep their memory alive: the mapping lasts while any of them does.

    Raises:
        UnsupportedDTypeError: a tensor's dtype is one TensorFlow cannot hold
            (float8_e8m0fnu), naming the file, the tensor and the dtype;
            nothing is converted then.
        FormatError: the descriptor or data file breaks the format.
        ValueError: ``mmap`` is not True, False or ``"copy"`` (the reader's check).
    """
    # True maps copy-on-write too: TensorFlow takes only writable memory by DLPack, and never writes to it
    arrays = reader.load(path, mmap="copy" if mmap is True else mmap, verify=verify, pointer=pointer, **kwargs)
    check_held(path, arrays, refusal)
    return {k: from_numpy(a, f"tensor {k!r}") for k, a in arrays.items()}
