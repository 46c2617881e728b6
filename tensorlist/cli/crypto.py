"""The ``tensorlist encrypt``, ``decrypt`` and ``keygen`` commands, and ``--key-file`` of ``inspect`` and ``validate``.

``encrypt`` and ``decrypt`` rewrite one list tensor by tensor (``Reader`` ->
``Writer``), keeping its names, order, metadata and the offsets of its
tensors (the alignment is the one that lays them out again where they are),
or every weight file of a tensorlist model directory, copying its index and
its other files byte for byte. The key comes from a key file of 32 raw bytes
(``keygen`` writes one) and is never printed nor written anywhere else.
Registered in ``cli.build_parser`` by :func:`add_parsers`.
"""
from __future__ import annotations

import argparse
import os
import shutil
from typing import Any, Dict, Optional

from tensorlist._storage.commit import atomic_file, durable_replace, own_data_files, tmp_beside
from tensorlist._storage.destinations import made_directories, refuse_existing
from tensorlist.errors import EncryptionError, FormatError
from tensorlist.format import MAX_ALIGNMENT
from tensorlist.reader import Reader

__all__ = ["add_parsers", "add_key_file", "key_of", "validate_problem", "verified", "write_encryption",
           "encryption_info", "cmd_encrypt", "cmd_decrypt", "cmd_keygen"]

EXAMPLES = {
    "encrypt": ("examples:\n  tensorlist keygen model.key\n"
                "  tensorlist encrypt model.tl sealed.tl --key-file model.key\n"
                "  tensorlist encrypt model_dir/ sealed_dir/ --key-file model.key   (a tensorlist model directory)\n\n"
                "Names, order, metadata and tensor offsets are kept; the metadata is encrypted, names, dtypes and\n"
                "shapes stay readable (and authenticated). A model directory's index and other files are copied."),
    "decrypt": "examples:\n  tensorlist decrypt sealed.tl model.tl --key-file model.key\n"
               "  tensorlist decrypt sealed_dir/ model_dir/ --key-file model.key",
    "keygen": ("examples:\n  tensorlist keygen model.key\n\n"
               "Writes 32 random bytes, readable by their owner only; an existing file is never replaced."),
}
#: What validate says of an encrypted list verified without its key.
NEEDS_KEY = "the file is encrypted: pass --key-file KEY to verify it (without --verify, its structure is checked)"


def add_key_file(parser: argparse.ArgumentParser, what: str, required: bool = False) -> None:
    parser.add_argument("--key-file", metavar="KEY", required=required,
                        help=f"a key file of 32 raw bytes (tensorlist keygen writes one): {what}")


def key_of(args):
    """The key in ``args.key_file`` (None without one); one clear error naming the key file otherwise."""
    path = getattr(args, "key_file", None)
    if path is None:
        return None
    from tensorlist.crypto import Key
    try:
        return Key.from_file(path)
    except OSError as e:
        raise OSError(e.errno, f"cannot read the key file ({e.strerror or e})", path) from None
    except ValueError as e:  # the wrong length: said with the file first, as every error names its file
        raise ValueError(f"{path}: not a key file: {str(e).replace(f'key file {path!r} holds', 'it holds')}") from None


def validate_problem(e: BaseException, key) -> Optional[str]:
    """validate's line for an encrypted list verified without a key (None: the error says it)."""
    if isinstance(e, EncryptionError) and key is None:
        return NEEDS_KEY
    return None


def verified(lists) -> str:
    """The end of validate's ok line for ``--verify``: what was checked."""
    if any(d.encryption is not None for d in lists):
        return ", every chunk's tag verified"
    return ", checksums verified"


def encryption_info(r: Reader, opened: bool) -> Optional[Dict[str, Any]]:
    """``inspect --json``'s ``encryption``: the scheme, the chunk size, the passphrase's kdf (None: plain)."""
    if not r.encrypted:
        return None
    enc = r.descriptor.encryption
    kdf = None if enc.kdf is None else {k: v for k, v in enc.kdf.items() if k != "salt"}
    return {"scheme": r.descriptor.raw["encryption"].get("scheme"), "chunk_bytes": enc.chunk_bytes, "kdf": kdf,
            "metadata_opened": opened}


def write_encryption(out, r: Reader, opened: bool) -> None:
    """inspect's lines on an encrypted list (nothing for a plain one)."""
    if not r.encrypted:
        return
    enc = r.descriptor.encryption
    kdf = enc.kdf
    how = ("a raw key (no passphrase kdf recorded)" if kdf is None else
           f"a passphrase key ({kdf['name']}: {kdf['memoryKiB']} KiB, {kdf['iterations']} iterations, "
           f"{kdf['lanes']} lanes)")
    out.write(f"  encrypted: {r.descriptor.raw['encryption'].get('scheme')}, chunks of {enc.chunk_bytes} bytes, "
              f"{how}\n")
    if not opened:
        out.write("  metadata: encrypted (pass --key-file KEY to show it)\n")


def _alignment(r: Reader) -> int:
    """The smallest alignment that lays the list's tensors out again at their offsets (else the largest that
    divides them all): the rewritten list has the offsets of the original."""
    d = r.descriptor
    rows = [(t.byte_offset, t.byte_length, t.dtype.itemsize) for t in d.tensors if t.byte_length]
    end = d.encryption.tags_offset if d.encryption is not None else d.byte_length
    a = 8
    while a <= MAX_ALIGNMENT:
        cursor = last = 0
        for off, n, size in rows:
            step = max(a, size)
            if -(-cursor // step) * step != off:
                break
            cursor = last = off + n
        else:
            if -(-last // a) * a == end:
                return a
        a *= 2
    offsets = [off for off, _, _ in rows if off]
    a = MAX_ALIGNMENT
    while a > 8 and any(off % a for off in offsets):
        a //= 2
    return a


def _rewrite(src: str, dst: str, key, encrypt: bool) -> int:
    """Writes the list of ``src`` to ``dst``, encrypted (``encrypt``) or plain; returns its tensor count."""
    from tensorlist.writer import Writer

    with Reader(src, key=None if encrypt else key, bits=True) as r:
        if encrypt and r.encrypted:
            raise FormatError("is encrypted already (decrypt it first to encrypt it with another key)", file=src)
        if not encrypt and not r.encrypted:
            raise FormatError("is not encrypted: there is nothing to decrypt", file=src)
        d = r.descriptor
        with Writer(dst, metadata=d.metadata, alignment=_alignment(r), key=key if encrypt else None) as w:
            for t in d.tensors:
                if t.name is None:
                    w.add(r[t.index])
                else:
                    w.add(t.name, r[t.index])
        return len(d.tensors)


def _tree(src: str, weights) -> list:
    """(relative name, path, is a weight descriptor) of every file of the model directory ``src`` but the
    weights' data files; a symlink or anything but a regular file is refused."""
    skip = set()
    for f in weights:
        with Reader(f) as r:
            skip.add(os.path.realpath(os.path.join(r.descriptor.base_dir, r.descriptor.location)))
    out = []
    for base, dirs, names in os.walk(src):
        dirs.sort()
        for n in sorted(names) + [d for d in dirs if os.path.islink(os.path.join(base, d))]:
            path = os.path.join(base, n)
            if os.path.islink(path) or not os.path.isfile(path):
                raise FormatError("is a symlink or not a regular file: encrypt and decrypt copy regular files "
                                  "only", file=path)
            if os.path.realpath(path) not in skip:
                out.append((os.path.relpath(path, src), path, os.path.realpath(path) in weights))
    return out


def _place(tmp: str, dst: str) -> None:
    """Moves the complete directory ``tmp`` to ``dst``: a rename, or over the namesakes of a ``dst`` that holds
    files (``--force``), the weights' old data files removed with them."""
    if not (os.path.isdir(dst) and os.listdir(dst)):
        os.replace(tmp, dst)
        return
    moved = []
    for base, _, names in os.walk(tmp):
        moved += [os.path.relpath(os.path.join(base, n), tmp) for n in names]
    for rel in sorted(moved, key=lambda r: r.endswith(".json")):  # the descriptors last, a reader never early
        final = os.path.join(dst, rel)
        os.makedirs(os.path.dirname(final), exist_ok=True)
        stale = own_data_files(final) if os.path.isfile(final) and rel.endswith(".json") else []
        durable_replace(os.path.join(tmp, rel), final)
        for old in stale:
            if os.path.relpath(old, dst) not in moved and os.path.exists(old):
                os.unlink(old)
    shutil.rmtree(tmp, ignore_errors=True)


def _rewrite_dir(src: str, dst: str, key, encrypt: bool) -> int:
    from tensorlist.convert.modeldir import model_weights

    root, out = os.path.realpath(src), os.path.realpath(dst)
    if out == root or out.startswith(root + os.sep):
        raise ValueError(f"{dst}: the destination lies inside the source directory {src}")
    w = model_weights(src)  # the index and the shards agree, every shard inside
    files = _tree(src, {os.path.realpath(f) for f in w.files})
    if os.path.lexists(dst) and not os.path.isdir(dst):
        raise NotADirectoryError(f"{dst}: is not a directory (a model directory's destination is one)")
    n = 0
    with made_directories(directories=[os.path.dirname(os.path.abspath(dst))]):
        tmp = tmp_beside(dst)
        os.mkdir(tmp)
        try:
            for rel, path, weight in files:
                target = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(target), exist_ok=True)
                if weight:
                    n += _rewrite(path, target, key, encrypt)
                else:
                    with atomic_file(target) as t:
                        shutil.copyfile(path, t)
            _place(tmp, dst)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return n


def _run(args, encrypt: bool) -> int:
    key = key_of(args)
    src, dst = args.src, args.dst
    is_dir = os.path.isdir(src)
    refuse_existing(*(([], [dst]) if is_dir else ([dst], [])), overwrite=args.force)
    if is_dir:
        n = _rewrite_dir(src, dst, key, encrypt)
    else:
        with made_directories([dst]):
            n = _rewrite(src, dst, key, encrypt)
    print(f"{src}: {'encrypted' if encrypt else 'decrypted'} {n} tensor{'s' if n != 1 else ''} -> {dst}")
    return 0


def cmd_encrypt(args) -> int:
    return _run(args, True)


def cmd_decrypt(args) -> int:
    return _run(args, False)


def cmd_keygen(args) -> int:
    from tensorlist.crypto import Key
    with made_directories([args.path]):
        try:
            Key.generate().save(args.path)
        except FileExistsError:
            raise FileExistsError(f"{args.path}: exists; keygen never replaces a key file (files encrypted with it "
                                  "would be lost): choose another name") from None
    print(f"{args.path}: a new key (32 random bytes, readable by its owner only); keep it safe: without it, "
          "files encrypted with it cannot be read")
    return 0


def add_parsers(sub, add_force) -> None:
    """Registers encrypt, decrypt and keygen (``add_force`` is the command line's one ``--force``)."""
    raw = argparse.RawDescriptionHelpFormatter
    for name, func, what in (("encrypt", cmd_encrypt, "encrypt"), ("decrypt", cmd_decrypt, "decrypt")):
        p = sub.add_parser(name, help=f"{what} a tensorlist file or model directory with a key file",
                           epilog=EXAMPLES[name], formatter_class=raw)
        p.add_argument("src")
        p.add_argument("dst")
        add_key_file(p, f"the key to {what} with", required=True)
        add_force(p, "replace DST (a model directory: the files written replace their namesakes in it)")
        p.set_defaults(func=func)
    k = sub.add_parser("keygen", help="write a new random key file", epilog=EXAMPLES["keygen"], formatter_class=raw)
    k.add_argument("path", metavar="KEYFILE")
    k.set_defaults(func=cmd_keygen)
