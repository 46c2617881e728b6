"""``tensorlist.Key``: the user's 32-byte key, random, from a file or from a passphrase (Argon2id).

The user's key never reaches a file tensorlist writes: each save draws a fresh
salt and encrypts with a file key derived from both (``crypto.cipher``). A
passphrase key keeps its passphrase, so that a file saved with other Argon2id
costs or another salt can still be opened; those costs are bounded
(``spec.KDF_LIMITS``) before any derivation.
"""
from __future__ import annotations

import os
import secrets
from typing import Any, Dict, Optional, Union

from tensorlist.crypto.spec import KDF_LIMITS, b64, parse_kdf, unb64

__all__ = ["Key", "as_key", "KEY_BYTES"]

KEY_BYTES = 32
#: RFC 9106's second recommended option: 64 MiB, 3 passes, 4 lanes.
DEFAULT_KDF = {"memoryKiB": 1 << 16, "iterations": 3, "lanes": 4}


def _argon2id(passphrase: bytes, kdf: Dict[str, Any]) -> bytes:
    from cryptography.hazmat.primitives.kdf.argon2 import Argon2id
    return Argon2id(salt=unb64(kdf["salt"]), length=KEY_BYTES, iterations=kdf["iterations"], lanes=kdf["lanes"],
                    memory_cost=kdf["memoryKiB"]).derive(passphrase)


class Key:
    """A 32-byte encryption key; ``key=`` of every reader and writer takes one (or 32 raw bytes).

    Example:
        >>> import numpy as np, tensorlist, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "secret.tl")
        >>> key = tensorlist.Key.generate()
        >>> tensorlist.save(path, {"w": np.ones(3, np.float32)}, key=key)
        >>> float(tensorlist.load(path, key=key)["w"].sum())
        3.0
    """

    __slots__ = ("_raw", "_passphrase", "kdf", "_derived")

    def __init__(self, raw: bytes, *, _passphrase: Optional[bytes] = None, _kdf: Optional[Dict[str, Any]] = None):
        raw = bytes(raw) if isinstance(raw, (bytes, bytearray, memoryview)) else raw
        if not isinstance(raw, bytes):
            raise TypeError(f"a key is {KEY_BYTES} bytes or a tensorlist.Key, not {type(raw).__name__}")
        if len(raw) != KEY_BYTES:
            raise ValueError(f"a key is {KEY_BYTES} bytes, got {len(raw)}")
        self._raw = raw
        self._passphrase = _passphrase
        #: The Argon2id description a save stores (None for a raw key).
        self.kdf = _kdf
        self._derived: Dict[str, bytes] = {}

    @classmethod
    def generate(cls) -> "Key":
        """A new random key (``secrets.token_bytes``)."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def from_file(cls, path) -> "Key":
        """The key in a file of exactly 32 raw bytes (``Key.save`` writes one).

        Raises:
            ValueError: the file is not 32 bytes long (naming the file).
            OSError: the file is missing or unreadable.
        """
        path = os.fspath(path)
        with open(path, "rb") as f:
            raw = f.read(KEY_BYTES + 1)
        if len(raw) != KEY_BYTES:
            raise ValueError(f"key file {path!r} holds {len(raw)}{'+' if len(raw) > KEY_BYTES else ''} bytes; "
                             f"a key file is {KEY_BYTES} raw bytes")
        return cls(raw)

    @classmethod
    def from_passphrase(cls, passphrase: Union[str, bytes], *, memory_kib: int = DEFAULT_KDF["memoryKiB"],
                        iterations: int = DEFAULT_KDF["iterations"], lanes: int = DEFAULT_KDF["lanes"]) -> "Key":
        """A key derived from a passphrase with Argon2id and a fresh 16-byte salt.

        Files saved with it store the salt and the costs, so the passphrase
        alone opens them again, whatever costs they were saved with.
        """
        pw = passphrase.encode("utf-8") if isinstance(passphrase, str) else bytes(passphrase)
        if not pw:
            raise ValueError("the passphrase is empty")
        kdf = {"name": "argon2id", "salt": b64(secrets.token_bytes(16)), "memoryKiB": memory_kib,
               "iterations": iterations, "lanes": lanes}
        why = parse_kdf(kdf)
        if why is not None:
            raise ValueError(f"Argon2id costs: {why} (limits {KDF_LIMITS})")
        return cls(_argon2id(pw, kdf), _passphrase=pw, _kdf=kdf)

    def save(self, path) -> None:
        """Writes the 32 raw bytes to a new file readable by its owner only; an existing file is refused."""
        fd = os.open(os.fspath(path), os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(self._raw)

    def material(self, kdf: Optional[Dict[str, Any]]) -> bytes:
        """The 32 bytes that open a file whose ``encryption.kdf`` is ``kdf`` (already checked).

        A passphrase key derives again for another salt or cost; a raw key is used as it is.
        """
        if kdf is None or self._passphrase is None or kdf == self.kdf:
            return self._raw
        tag = repr(sorted(kdf.items()))
        if tag not in self._derived:
            self._derived[tag] = _argon2id(self._passphrase, kdf)
        return self._derived[tag]

    def __repr__(self) -> str:  # never the key itself
        return f"<tensorlist.Key{' from a passphrase' if self._passphrase is not None else ''}>"

    def __reduce__(self):
        raise TypeError("a tensorlist.Key is not pickled: pass the key file's path instead")


def as_key(key: Any) -> Optional[Key]:
    """``key=`` as a :class:`Key`: None stays None; 32 bytes become a Key; anything else is a TypeError."""
    if key is None or isinstance(key, Key):
        return key
    if isinstance(key, (bytes, bytearray, memoryview)):
        return Key(key)
    if isinstance(key, (str, os.PathLike)):
        raise TypeError("key= takes a tensorlist.Key or 32 bytes, not a path: use tensorlist.Key.from_file(path)")
    raise TypeError(f"key= takes a tensorlist.Key or 32 bytes, not {type(key).__name__}")
