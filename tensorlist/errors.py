"""The one exception tree of tensorlist.

Every problem with a file's content is a :class:`FormatError` (also a
``ValueError``), whose message names the file, the tensor (index and name) and
the field, and carries them as attributes for programs. A dtype of the table
that this installation cannot represent (its ml_dtypes is too old) is an
:class:`UnsupportedDTypeError` (also a ``TypeError``) when a caller asks for it;
the readers turn it into a FormatError naming the file and the tensor.
"""
from __future__ import annotations

import errno
import os
from typing import Optional

__all__ = ["TensorListError", "FormatError", "ChecksumError", "UnsupportedDTypeError", "SignatureError", "EncryptionError",
           "DestinationExistsError", "short_repr"]


class TensorListError(Exception):
    """Base class of every error tensorlist raises on purpose."""


class FormatError(TensorListError, ValueError):
    """A descriptor or data file breaks the format (see docs/FORMAT.md).

    Attributes:
        file: the descriptor (or data) file involved, or None for in-memory input.
        tensor_index: index of the offending tensor in its list, or None.
        tensor_name: the offending tensor's name, or None.
        field: the JSON field (or JSON pointer) at fault, or None.
        reason: the bare explanation, without the location prefix.
    """

    def __init__(
        self,
        reason: str,
        *,
        file: Optional[str] = None,
        tensor_index: Optional[int] = None,
        tensor_name: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        self.reason = reason
        self.file = file
        self.tensor_index = tensor_index
        self.tensor_name = tensor_name
        self.field = field
        super().__init__(self._compose())

    def _compose(self) -> str:
        where = []
        if self.file is not None:
            where.append(str(self.file))
        if self.tensor_index is not None:
            if self.tensor_name is not None:
                where.append(f"tensor {self.tensor_index} ({self.tensor_name!r})")
            else:
                where.append(f"tensor {self.tensor_index}")
        if self.field is not None:
            where.append(f"field {self.field!r}")
        prefix = ": ".join(where)
        return f"{prefix}: {self.reason}" if prefix else self.reason

    def __reduce__(self):  # keep the keyword attributes through pickling
        return (
            _rebuild_format_error,
            (type(self), self.reason, self.file, self.tensor_index, self.tensor_name, self.field),
        )


def _rebuild_format_error(cls, reason, file, tensor_index, tensor_name, field):
    return cls(reason, file=file, tensor_index=tensor_index, tensor_name=tensor_name, field=field)


class ChecksumError(FormatError):
    """A tensor's bytes do not match the CRC32C stored in its descriptor."""


class EncryptionError(FormatError):
    """An encrypted list cannot be read: no key, the wrong key, or bytes that fail authentication."""


class SignatureError(TensorListError, ValueError):
    """A signature or attestation that does not verify or cannot be read (``tensorlist.provenance.signing``), naming the file."""


class DestinationExistsError(TensorListError, FileExistsError):
    """A write would replace a file or directory that the caller did not ask to replace.

    Raised before anything is written (``tensorlist._storage.destinations``):
    a command with several outputs checks them all first.

    Attributes:
        file: the destination that exists.
        reason: what is in the way (``"exists"``; a directory: ``"exists and is not empty"``).
        hint: how to replace it anyway (the command line says ``pass --force``).
    """

    def __init__(self, file, reason: str = "exists", hint: str = "pass overwrite=True to replace it") -> None:
        self.file, self.reason, self.hint = os.fspath(file), reason, hint
        super().__init__(errno.EEXIST, f"{reason}; {hint}", self.file)

    def __str__(self) -> str:
        return f"{self.file}: {self.reason}; {self.hint}"

    def __reduce__(self):  # keep the keyword attributes through pickling
        return type(self), (self.file, self.reason, self.hint)


class UnsupportedDTypeError(TensorListError, TypeError):
    """A dtype of the table that the installed ml_dtypes lacks (too old, or not installed).

    Attributes:
        dtype: the dtype's canonical name (``"float8_e8m0fnu"``).
    """

    def __init__(self, message: str, *, dtype: str) -> None:
        self.dtype = dtype
        super().__init__(message)

    def __reduce__(self):  # keep the keyword attribute through pickling
        return _rebuild_unsupported, (type(self), str(self), self.dtype)


def _rebuild_unsupported(cls, message, dtype):
    return cls(message, dtype=dtype)


def short_repr(value, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters, for messages about hostile input."""
    text = _bounded_repr(value) if not isinstance(value, list) or len(value) <= 16 else \
        "[" + ", ".join(_bounded_repr(v) for v in value[:8]) + f", ... ({len(value)} items)]"
    return text if len(text) <= limit else text[:limit] + "..."


#: Integers longer than this many bits are named by their size in messages (their text can run to thousands
#: of digits, and past 4300 digits ``repr`` raises ValueError).
_MAX_SHOWN_INT_BITS = 256


def _bounded_repr(value) -> str:
    """``repr``, except that an int too long to show (also inside a list or tuple) is written ``<int of N bits>``."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > _MAX_SHOWN_INT_BITS:
        return f"<int of {value.bit_length()} bits>"
    if type(value) in (list, tuple) and any(isinstance(v, int) and not isinstance(v, bool)
                                            and v.bit_length() > _MAX_SHOWN_INT_BITS for v in value):
        inner = ", ".join(_bounded_repr(v) for v in value)
        return f"[{inner}]" if type(value) is list else f"({inner}{',' if len(value) == 1 else ''})"
    return repr(value)
