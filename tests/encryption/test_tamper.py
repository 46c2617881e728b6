"""Every tamper class of docs/SECURITY.md, against every entry point that reads an encrypted list.

One parametrized test: a *subject* writes an encrypted file the way its entry
point's users do (a plain list, a document, a torch state file, a checkpoint,
a DCP shard) and reads it back with the key; each *tamper* then changes one
thing of that list on disk, and the read must raise tensorlist's own error
naming the file (and, for data, the tensor), returning no array.

The subjects live in ``SUBJECTS``; an adapter adds its own with
:func:`subject`. A tamper acts on ``Target``: the descriptor file, the
list's pointer in it, and the key.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional

import numpy as np
import pytest

import tensorlist as tl
from tensorlist.crypto.spec import DEFAULT_CHUNK, TAG_BYTES, b64, unb64
from _cli_crypto_support import cli_read

pytest.importorskip("cryptography")

KEY = tl.Key(bytes(range(32)))
#: Two tensors of three chunks each (same shape, so their bytes can be swapped), and a small one.
SHAPE = (3 * DEFAULT_CHUNK // 4 - 1000,)


def tensors(seed: int = 0) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"a": rng.standard_normal(SHAPE).astype(np.float32), "b": rng.standard_normal(SHAPE).astype(np.float32),
            "c": np.arange(7, dtype=np.int16)}


@dataclass
class Target:
    """One encrypted list on disk: its descriptor file and pointer."""

    path: str
    pointer: str = ""

    def document(self):
        with open(self.path, encoding="utf-8") as f:
            return json.load(f)

    def descriptor(self) -> dict:
        node = self.document()
        for part in [p for p in self.pointer.split("/")[1:]]:
            node = node[int(part)] if isinstance(node, list) else node[part.replace("~1", "/").replace("~0", "~")]
        return node

    def edit(self, change: Callable[[dict], None]) -> None:
        doc = self.document()
        node = doc
        for part in [p for p in self.pointer.split("/")[1:]]:
            node = node[int(part)] if isinstance(node, list) else node[part.replace("~1", "/").replace("~0", "~")]
        change(node)
        with open(self.path, "w", encoding="utf-8") as f:
            json.dump(doc, f)

    def data_path(self) -> str:
        return os.path.join(os.path.dirname(self.path), self.descriptor()["location"])

    def tensor(self, name: str) -> dict:
        # a DCP shard names a chunk "<fqn>@<offsets>"
        return next(t for t in self.descriptor()["tensors"] if t.get("name", "").split("@")[0] == name)

    def patch(self, offset: int, data: bytes) -> None:
        """Writes ``data`` at ``offset`` of the list's region."""
        with open(self.data_path(), "r+b") as f:
            f.seek(self.descriptor()["byteOffset"] + offset)
            f.write(data)

    def read(self, offset: int, n: int) -> bytes:
        with open(self.data_path(), "rb") as f:
            f.seek(self.descriptor()["byteOffset"] + offset)
            return f.read(n)


@dataclass
class Subject:
    """An entry point: ``make(dir, key, seed) -> Target`` writes, ``read(target, key)`` reads every tensor."""

    name: str
    make: Callable[[str, tl.Key, int], Target]
    read: Callable[[Target, tl.Key], object]
    file_of_error: Callable[[Target], str] = lambda t: t.path


SUBJECTS: List[Subject] = []


def subject(name: str, make, read, file_of_error=None) -> None:
    SUBJECTS.append(Subject(name, make, read, file_of_error or (lambda t: t.path)))


def _save(d, key, seed):
    path = os.path.join(d, "model.tl")
    tl.save(path, tensors(seed), metadata={"owner": "lab", "step": 3}, key=key)
    return Target(path)


def _document(d, key, seed):
    path = os.path.join(d, "ckpt.json")
    tl.save_document(path, {"epoch": 1, "model": tl.Tensors(tensors(seed), metadata={"owner": "lab"})}, key=key)
    return Target(path, "/model")


def _writer(d, key, seed):
    path = os.path.join(d, "streamed.tl")
    with tl.Writer(path, metadata={"owner": "lab"}, key=key) as w:
        for k, v in tensors(seed).items():
            w.add(k, v)
    return Target(path)


subject("load-mapped", _save, lambda t, k: tl.load(t.path, key=k))
subject("load-pread", _save, lambda t, k: tl.load(t.path, key=k, mmap=False))
subject("open-getitem", _save, lambda t, k: [tl.open(t.path, key=k)[n] for n in ("a", "b", "c")])
subject("validate-verify", _save, lambda t, k: tl.validate(t.path, verify=True, key=k))
subject("writer-load", _writer, lambda t, k: tl.load(t.path, key=k))
subject("load_document", _document, lambda t, k: tl.load_document(t.path, key=k))
subject("load-pointer", _document, lambda t, k: tl.load(t.path, pointer=t.pointer, key=k))


def _remote_read(t: Target, key):
    """The fsspec reader (file:// through fsspec's local filesystem): ranged reads, then the Opener."""
    from tensorlist.remote import RemoteReader
    return RemoteReader("file://" + t.path, key=key).to_dict()


subject("remote-reader", _save, _remote_read)
try:
    import torch  # noqa: F401
except ImportError:  # the torch subjects are not collected without torch
    pass
else:
    import _torch_crypto_subjects
    _torch_crypto_subjects.register(subject, Target, tensors)  # state files, a loop checkpoint, a DCP shard
subject("cli-verify-decrypt", _save, cli_read)  # tensorlist validate --verify --key-file, tensorlist decrypt


def _flip_bit(t: Target, d: str) -> Optional[str]:
    off = t.tensor("b")["byteOffset"] + DEFAULT_CHUNK + 5
    t.patch(off, bytes([t.read(off, 1)[0] ^ 0x10]))
    return "b"


def _swap_chunks(t: Target, d: str) -> Optional[str]:
    base = t.tensor("a")["byteOffset"]
    one, two = t.read(base, DEFAULT_CHUNK), t.read(base + DEFAULT_CHUNK, DEFAULT_CHUNK)
    t.patch(base, two)
    t.patch(base + DEFAULT_CHUNK, one)
    return "a"


def _swap_tensors(t: Target, d: str) -> Optional[str]:
    a, b = t.tensor("a"), t.tensor("b")
    da, db = t.read(a["byteOffset"], a["byteLength"]), t.read(b["byteOffset"], b["byteLength"])
    t.patch(a["byteOffset"], db)
    t.patch(b["byteOffset"], da)
    return "a"


def _swap_tags(t: Target, d: str) -> Optional[str]:
    tags = t.descriptor()["encryption"]["tags"]
    first = t.read(tags["byteOffset"], TAG_BYTES)
    second = t.read(tags["byteOffset"] + TAG_BYTES, TAG_BYTES)
    t.patch(tags["byteOffset"], second)
    t.patch(tags["byteOffset"] + TAG_BYTES, first)
    return "a"


def _cut(t: Target, d: str) -> Optional[str]:
    size = os.path.getsize(t.data_path())
    with open(t.data_path(), "r+b") as f:
        f.truncate(size - DEFAULT_CHUNK)
    return None


def _other(d: str, make) -> Target:
    os.makedirs(os.path.join(d, "other"), exist_ok=True)
    return make(os.path.join(d, "other"), KEY, 1)  # same key, same shapes, other values


def _other_file(t: Target, d: str, make) -> Optional[str]:
    other = _other(d, make)  # same key, same shapes, other values
    a, b = t.tensor("a"), Target(other.path, other.pointer).tensor("a")
    t.patch(a["byteOffset"], Target(other.path, other.pointer).read(b["byteOffset"], b["byteLength"]))
    return "a"


def _other_file_whole(t: Target, d: str, make) -> Optional[str]:
    other = _other(d, make)
    shutil.copyfile(other.data_path(), t.data_path())
    return "a"


def _edit_metadata(t: Target, d: str) -> Optional[str]:
    def change(node):
        sealed = bytearray(unb64(node["encryption"]["metadata"]))
        sealed[3] ^= 1
        node["encryption"]["metadata"] = b64(bytes(sealed))
    t.edit(change)
    return None


def _rename(t: Target, d: str) -> Optional[str]:
    def change(node):
        node["tensors"][0]["name"], node["tensors"][1]["name"] = node["tensors"][1]["name"], node["tensors"][0]["name"]
    t.edit(change)
    return None


def _reshape(t: Target, d: str) -> Optional[str]:
    def change(node):
        node["tensors"][0]["dims"] = [SHAPE[0] // 2, 2] if SHAPE[0] % 2 == 0 else [1, SHAPE[0]]
    t.edit(change)
    return None


def _drop_last_chunk(t: Target, d: str) -> Optional[str]:
    """Claims tensor "a" ends one chunk early: its new last chunk was sealed as not last."""
    def change(node):
        a = node["tensors"][0]
        a["byteLength"] = 2 * DEFAULT_CHUNK
        a["dims"] = [2 * DEFAULT_CHUNK // 4]
        node["encryption"]["tags"]["byteLength"] -= TAG_BYTES
    t.edit(change)
    return None


def _made_plain(t: Target, d: str) -> Optional[str]:
    """The list passed off as a plain one: no encryption object, version 1, the metadata in the clear."""
    def change(node):
        node.pop("encryption")
        node["formatVersion"] = 1
        node["metadata"] = {"owner": "attacker"}
    t.edit(change)
    return None


TAMPERS = {
    "made-plain": _made_plain,
    "flipped-bit": _flip_bit,
    "swapped-chunks": _swap_chunks,
    "swapped-tensors": _swap_tensors,
    "swapped-tags": _swap_tags,
    "cut-file": _cut,
    "other-files-tensor": _other_file,
    "other-files-data": _other_file_whole,
    "edited-metadata": _edit_metadata,
    "renamed-tensor": _rename,
    "reshaped-tensor": _reshape,
    "dropped-last-chunk": _drop_last_chunk,
}


@pytest.mark.parametrize("tamper", sorted(TAMPERS))
@pytest.mark.parametrize("sub", SUBJECTS, ids=lambda s: s.name)
def test_a_tampered_file_is_refused_naming_it(tmp_path, sub, tamper):
    target = sub.make(str(tmp_path), KEY, 0)
    sub.read(target, KEY)  # the untouched file reads
    change = TAMPERS[tamper]
    if tamper.startswith("other-files"):
        tensor = change(target, str(tmp_path), sub.make)
    else:
        tensor = change(target, str(tmp_path))
    with pytest.raises(tl.FormatError) as info:
        sub.read(target, KEY)
    message = str(info.value)
    assert sub.file_of_error(target) in message or os.path.basename(sub.file_of_error(target)) in message, message
    if tensor is not None and isinstance(info.value, tl.EncryptionError) and info.value.tensor_name is not None:
        assert info.value.tensor_name.split("@")[0] in ("a", "b", "c")


@pytest.mark.parametrize("sub", SUBJECTS, ids=lambda s: s.name)
def test_without_the_key_or_with_another_nothing_is_returned(tmp_path, sub):
    target = sub.make(str(tmp_path), KEY, 0)
    with pytest.raises(tl.EncryptionError, match="another key") as info:
        sub.read(target, tl.Key.generate())
    assert sub.file_of_error(target) in str(info.value) or os.path.basename(sub.file_of_error(target)) in str(info.value)
    with pytest.raises(tl.EncryptionError, match="key") as info:
        sub.read(target, None)
    assert sub.file_of_error(target) in str(info.value) or os.path.basename(sub.file_of_error(target)) in str(info.value)
