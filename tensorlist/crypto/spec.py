"""The ``encryption`` object of an encrypted list: its rules and its canonical header (stdlib only).

An encrypted list (docs/FORMAT.md, "Encrypted lists") keeps its tensor table
readable, so ``inspect`` works without the key, and stores each tensor's bytes
encrypted in place with AES-256-GCM in chunks of ``chunkBytes``; the chunks'
16-byte tags sit in one region after the tensors, in file order. The
``encryption`` object names the scheme, the chunk size, the file's random
salt, a key check, the tag region, the key derivation of a passphrase key and
the metadata, encrypted with the canonical header (:func:`canonical_header`)
as associated data, so that every readable field is authenticated.

:func:`parse_encryption` is the one check of that object, run by
``format.parse_list`` before any byte is read. It needs no cryptography
package; ``crypto.cipher`` does the arithmetic.
"""
from __future__ import annotations

import base64
import binascii
import json
from typing import Any, Callable, Dict, List, NamedTuple, Optional

__all__ = ["SCHEME", "TAG_BYTES", "DEFAULT_CHUNK", "MIN_CHUNK", "MAX_CHUNK", "SALT_BYTES", "KEY_CHECK_BYTES",
           "MAX_TENSORS", "KDF_LIMITS", "Encryption", "chunk_count", "parse_encryption", "parse_kdf",
           "canonical_header", "b64", "unb64"]

#: The one scheme: AES-256-GCM over chunks, file keys by HKDF-SHA256.
SCHEME = "aes-256-gcm"
TAG_BYTES = 16
DEFAULT_CHUNK = 1 << 20
MIN_CHUNK = 1 << 12
MAX_CHUNK = 1 << 26
SALT_BYTES = 32
KEY_CHECK_BYTES = 16
#: A chunk nonce is the tensor's index (4 bytes) and the chunk's (8); index 2**32 - 1 is the header's.
MAX_TENSORS = (1 << 32) - 1
#: Argon2id costs a file may ask for: a hostile file must not make a load take minutes or gigabytes.
KDF_LIMITS = {"memoryKiB": (8, 1 << 21), "iterations": (1, 64), "lanes": (1, 64)}
_KDF_SALT = (16, 64)


class Encryption(NamedTuple):
    """A checked ``encryption`` object (binary fields decoded)."""

    chunk_bytes: int
    salt: bytes
    key_check: bytes
    kdf: Optional[Dict[str, Any]]
    metadata: bytes
    tags_offset: int
    tags_length: int
    header: bytes  # the canonical header, the metadata's associated data


def chunk_count(nbytes: int, chunk: int) -> int:
    """Chunks of a tensor of ``nbytes``: an empty tensor still has one (its tag authenticates it)."""
    return max(1, -(-nbytes // chunk))


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def unb64(text: Any) -> Optional[bytes]:
    """Strict standard base64 (padding required), or None."""
    if not isinstance(text, str):
        return None
    try:
        return base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        return None


def _int_in(v: Any, lo: int, hi: int) -> bool:
    return type(v) is int and lo <= v <= hi


def parse_kdf(kdf: Any) -> Optional[str]:
    """Why ``kdf`` is not an acceptable Argon2id description, or None."""
    if not isinstance(kdf, dict) or kdf.get("name") != "argon2id":
        return 'must be {"name": "argon2id", "salt", "memoryKiB", "iterations", "lanes"}'
    salt = unb64(kdf.get("salt"))
    if salt is None or not _KDF_SALT[0] <= len(salt) <= _KDF_SALT[1]:
        return f"salt must be {_KDF_SALT[0]} to {_KDF_SALT[1]} bytes of base64"
    for field, (lo, hi) in KDF_LIMITS.items():
        if not _int_in(kdf.get(field), lo, hi):
            return f"{field} must be an integer in [{lo}, {hi}], got {kdf.get(field)!r}"
    if kdf["memoryKiB"] < 8 * kdf["lanes"]:
        return "memoryKiB must be at least 8 x lanes"
    if set(kdf) - {"name", "salt", "memoryKiB", "iterations", "lanes"}:
        return f"unknown fields {sorted(set(kdf) - {'name', 'salt', 'memoryKiB', 'iterations', 'lanes'})}"
    return None


def canonical_header(enc: Dict[str, Any], names: Optional[List[str]], codes: List[int], shapes, offsets: List[int],
                     lengths: List[int], list_offset: int, list_length: int) -> bytes:
    """The bytes the metadata's AEAD authenticates: every readable field of the list but ``location``.

    JSON with keys sorted, no spaces, ASCII only (``json.dumps(sort_keys=True,
    separators=(",", ":"))``) of ``{"byteLength", "byteOffset", "encryption":
    the object without "metadata", "tensors": [[name or null, dataType, dims,
    byteOffset, byteLength], ...]}``.
    """
    rows = [[names[i] if names is not None else None, codes[i], list(shapes[i]), offsets[i], lengths[i]]
            for i in range(len(codes))]
    head = {"byteLength": list_length, "byteOffset": list_offset,
            "encryption": {k: v for k, v in enc.items() if k != "metadata"}, "tensors": rows}
    return json.dumps(head, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode("ascii")


def parse_encryption(enc: Any, table, list_offset: int, list_length: int, fail: Callable) -> Encryption:
    """Checks an ``encryption`` object against its list's table (already checked); returns it decoded.

    ``fail(reason, field)`` raises the caller's FormatError. Nothing here
    reads the data file: the tag region must lie inside the list's region,
    whose size the reader checks against the file.
    """
    if not isinstance(enc, dict):
        fail(f"must be an object, got {type(enc).__name__}", "encryption")
    if enc.get("scheme") != SCHEME:
        fail(f"unknown scheme {enc.get('scheme')!r} (this reader knows {SCHEME!r})", "encryption/scheme")
    chunk = enc.get("chunkBytes")
    if not _int_in(chunk, MIN_CHUNK, MAX_CHUNK) or chunk & (chunk - 1):
        fail(f"must be a power of two in [{MIN_CHUNK}, {MAX_CHUNK}], got {chunk!r}", "encryption/chunkBytes")
    salt, check, meta = unb64(enc.get("salt")), unb64(enc.get("keyCheck")), unb64(enc.get("metadata"))
    if salt is None or len(salt) != SALT_BYTES:
        fail(f"must be {SALT_BYTES} bytes of base64", "encryption/salt")
    if check is None or len(check) != KEY_CHECK_BYTES:
        fail(f"must be {KEY_CHECK_BYTES} bytes of base64", "encryption/keyCheck")
    if meta is None or len(meta) < TAG_BYTES:
        fail("must be the encrypted metadata, in base64", "encryption/metadata")
    kdf = enc.get("kdf")
    if kdf is not None:
        why = parse_kdf(kdf)
        if why is not None:
            fail(why, "encryption/kdf")
    tags = enc.get("tags")
    if not isinstance(tags, dict) or not all(_int_in(tags.get(k), 0, (1 << 63) - 1)
                                             for k in ("byteOffset", "byteLength")):
        fail("must be {\"byteOffset\": integer, \"byteLength\": integer}", "encryption/tags")
    unknown = set(enc) - {"scheme", "chunkBytes", "salt", "keyCheck", "metadata", "kdf", "tags"}
    if unknown:
        fail(f"unknown fields {sorted(unknown)}: this reader cannot tell what they protect", "encryption")
    n = len(table)
    if n >= MAX_TENSORS:
        fail(f"{n} tensors: an encrypted list holds fewer than {MAX_TENSORS}", "tensors")
    if table.crcs is not None:
        fail("an encrypted list stores no CRC32C of its plaintext", "crc32c")
    lengths, offsets = table.lengths, table.offsets
    want = TAG_BYTES * sum(max(1, -(-ln // chunk)) for ln in lengths)
    t_off, t_len = tags["byteOffset"], tags["byteLength"]
    if t_len != want:
        fail(f"{t_len} bytes, but the tensors' {want // TAG_BYTES} chunks need {want}", "encryption/tags/byteLength")
    end = max((o + ln for o, ln in zip(offsets, lengths) if ln), default=0)
    if t_off < end or t_off + t_len > list_length:
        fail(f"bytes [{t_off}, {t_off + t_len}) must lie after the tensors (which end at {end}) and inside the "
             f"list's byteLength {list_length}", "encryption/tags/byteOffset")
    codes = [d.code for d in table.dtypes]
    header = canonical_header(enc, table.names, codes, table.shapes, offsets, lengths, list_offset, list_length)
    return Encryption(chunk, salt, check, kdf, meta, t_off, t_len, header)
