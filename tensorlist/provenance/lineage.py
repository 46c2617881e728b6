"""Lineage: a fine-tuned model file's chain of origins, every link checked.

A model file's training record names the model file its starting weights were
loaded from: ``initial_weights.origin = {"file": ..., "weights_sha256": ...}``
(:func:`tensorlist.provenance.record.model_file_origin`). :func:`lineage` follows these
origins from file to file and checks each link:

1. the model given is a valid model file whose weights hash to its record's
   ``weights.sha256`` (:func:`~tensorlist.provenance.record.verify_model_file`); a
   Lightning checkpoint written by ``tensorlist.lightning`` (a document whose
   weights and their record are at ``/state_dict``) is a model file here,
   its weights those of ``/state_dict`` (``record.weights_pointer``);
2. each origin is resolved against the directory of the file that recorded it
   (an absolute path as it is; every writer stores origins so:
   ``record.anchor_paths``), and must lie under ``root`` (default: the
   model's directory) once symlinks are resolved (``format.inside``, the
   package's one confinement test) unless ``allow_outside=True``;
3. the origin's weights are hashed again (``weights_sha256``) and must equal
   the hash its child recorded; an origin that holds a record is verified as
   the model was (1);
4. a signature found beside a file (``<file>.sig``, else ``model.sig`` in its
   directory, covering the directory) is checked with
   ``tensorlist.provenance.signing.verify`` when a public key is given;
5. the chain ends at a file whose record names no origin, or at an origin
   holding no training record (weights from elsewhere); a file met twice (a
   cycle) or a chain longer than ``max_depth`` links is broken.

Nothing is fetched: an origin given as a URL is a broken link. The first
broken link ends the walk; :class:`Lineage` holds the links checked until then
and the :class:`BrokenLink`.

Imports ``format``, ``reader``, ``backends``, ``errors`` and ``record``; ``signing``
lazily, only when a signature is to be checked.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import List, Optional, Tuple

from tensorlist._base import backends
from tensorlist.errors import FormatError, TensorListError
from tensorlist.format import Limits, inside, read_json_file
from tensorlist.provenance.record import TrainingRecord, verify_model_file, weights_pointer, weights_sha256
from tensorlist.reader import load

__all__ = ["MAX_LINEAGE_DEPTH", "SIGNATURE_SUFFIX", "DIRECTORY_SIGNATURE", "Link", "BrokenLink", "Lineage",
           "LineageError", "lineage", "signature_beside"]

#: Links :func:`lineage` follows at most (the model given is link 0): each costs one hash of a model's
#: weights, and no real fine-tuning chain comes near it, so a longer one is refused as hostile or looping.
MAX_LINEAGE_DEPTH = 64
#: A single model file's signature: the descriptor's path plus this suffix (``final.tl.sig``).
SIGNATURE_SUFFIX = ".sig"
#: A model directory's signature, inside it: covers every file of the directory.
DIRECTORY_SIGNATURE = "model.sig"


@dataclass(frozen=True)
class Link:
    """One model file of a chain.

    Attributes:
        index: its place in the chain: 0 is the model given, 1 its origin, ...
        file: the path opened (an origin resolved against its child's directory).
        recorded: the origin's ``file`` as its child recorded it (None for link 0).
        weights_sha256: the hash of the weights the file holds, computed here.
        record: the file's training record, or None when it holds none (the chain's end).
        signature: the signature found beside the file, or None.
        signature_verified: True when that signature was verified; None when not checked.
    """

    index: int
    file: str
    recorded: Optional[str]
    weights_sha256: str
    record: Optional[TrainingRecord]
    signature: Optional[str] = None
    signature_verified: Optional[bool] = None

    @property
    def origin(self) -> Optional[dict]:
        """The origin this file's record names (``{"file", "weights_sha256"}``), or None."""
        if self.record is None:
            return None
        origin = self.record["initial_weights"].get("origin")
        return dict(origin) if origin is not None else None


@dataclass(frozen=True)
class BrokenLink:
    """The first link that did not hold: its place, the file, and why."""

    index: int
    file: str
    reason: str

    def __str__(self) -> str:
        return f"link {self.index} ({self.file}): {self.reason}"


class LineageError(FormatError):
    """A chain of origins with a broken link (``file`` names it, ``reason`` says why)."""


@dataclass(frozen=True)
class Lineage:
    """The chain from a model file to its first recorded origin.

    Attributes:
        links: the links checked, from the model given to the last origin reached.
        broken: the first broken link, or None when every link held.
    """

    links: Tuple[Link, ...]
    broken: Optional[BrokenLink]

    @property
    def ok(self) -> bool:
        return self.broken is None

    def check(self) -> "Lineage":
        """Returns ``self`` when every link held.

        Raises:
            LineageError: naming the first broken link's file and what broke.
        """
        if self.broken is not None:
            raise LineageError(f"link {self.broken.index}: {self.broken.reason}", file=self.broken.file)
        return self


def signature_beside(path) -> Optional[Tuple[str, str]]:
    """``(what it signs, signature)`` found beside the model file ``path``, or None.

    ``<path>.sig`` signs the file (its descriptor and data file); without one,
    ``model.sig`` in its directory signs the whole directory.
    """
    path = os.fspath(path)
    own = path + SIGNATURE_SUFFIX
    if os.path.lexists(own):
        return path, own
    directory = os.path.dirname(path) or os.curdir
    shared = os.path.join(directory, DIRECTORY_SIGNATURE)
    if os.path.lexists(shared):
        return directory, shared
    return None


def _check_file(path: str) -> Tuple[str, Optional[TrainingRecord]]:
    """(weights hash, record or None) of a model file or Lightning checkpoint, verified; FormatError/OSError if not."""
    doc = read_json_file(path, Limits())
    pointer = weights_pointer(doc)  # None: a model file; "/state_dict": a Lightning checkpoint
    holder = doc if pointer is not None else doc.get("metadata") if isinstance(doc, dict) else None
    weights = path if pointer is None else load(path, pointer=pointer, bits=True)
    if not (isinstance(holder, dict) and "training" in holder):
        return weights_sha256(weights), None
    record = verify_model_file(path, pointer=pointer)  # validate, both records, the weights hash against the record
    digest = record["weights"]["sha256"]
    return (digest if digest is not None else weights_sha256(weights)), record


def _origin_path(child: str, recorded: str) -> str:
    return os.path.join(os.path.dirname(child), recorded)


def _opened(file: str) -> str:
    """Where ``file`` is opened: its directory as the system resolves it (a ``..`` after a symlinked
    directory leads where the kernel says), its own name kept (the reader finds its data file beside it)."""
    return os.path.join(os.path.realpath(os.path.dirname(file) or os.curdir), os.path.basename(file))


def lineage(path, *, root=None, allow_outside: bool = False, max_depth: int = MAX_LINEAGE_DEPTH,
            public_key=None, require_signatures: bool = False) -> Lineage:
    """Follows ``initial_weights.origin`` from the model file ``path`` back to its first origin.

    Every link is checked as the module docstring says; the walk stops at the
    first broken one, which :attr:`Lineage.broken` names (call
    :meth:`Lineage.check` to raise it).

    Args:
        path: a model file (a tensorlist descriptor holding a training record).
        root: the directory every origin must lie under (default: ``path``'s directory).
        allow_outside: follow origins anywhere on this machine.
        max_depth: the most origins followed (default :data:`MAX_LINEAGE_DEPTH`).
        public_key: a public key (PEM path) to verify each signature found with;
            None: signatures are found and named but not checked.
        require_signatures: a file without a signature is a broken link.

    Returns:
        A :class:`Lineage`.

    Raises:
        TypeError, ValueError: a bad argument.
        ImportError: a key was given but ``tensorlist.provenance.signing`` cannot be imported.

    Example (docs/PROVENANCE_LINEAGE.md shows the output)::

        chain = lineage("runs/ft2/final.tl", root="runs").check()
        [link.file for link in chain.links]   # the model, its origin, the origin's origin
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"lineage: expected the path of a model file, got {type(path).__qualname__}")
    if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < 0:
        raise ValueError(f"max_depth must be an integer >= 0, got {max_depth!r}")
    path = os.fsdecode(path)
    if backends.is_url(path):
        raise ValueError(f"lineage works on local files; {path!r} is a URL (download the chain first)")
    root_dir = os.path.realpath(os.fsdecode(root) if root is not None else (os.path.dirname(path) or os.curdir))
    links: List[Link] = []
    seen = {}
    file, recorded, expected = path, None, None
    while True:
        index = len(links)

        def broken(reason: str) -> Lineage:
            return Lineage(tuple(links), BrokenLink(index, file, reason))

        if "\x00" in file:  # no system call takes it (ValueError): a name no file can have
            return broken(f"names no possible file: {recorded if index else file!r} holds a NUL character")
        real = os.path.realpath(file)
        if index > 0 and not allow_outside and not inside(real, root_dir):
            return broken(f"origin {recorded!r} resolves to {real!r}, outside the allowed root {root_dir!r} "
                          "(give a wider root, or allow_outside / --allow-outside to follow it)")
        opened = _opened(file)
        try:
            st = os.stat(opened)
        except FileNotFoundError:
            return broken("missing: no such file" + ("" if index == 0 else f" (recorded as {recorded!r})"))
        except OSError as e:
            return broken(f"cannot be read: {e.strerror or e}")
        key = (st.st_dev, st.st_ino)
        if key in seen:
            return broken(f"a cycle: this file is link {seen[key]} again")
        seen[key] = index
        try:
            digest, record = _check_file(opened)
        except FileNotFoundError as e:
            return broken(f"missing: {e.filename if e.filename else e}")
        except (TensorListError, ValueError, TypeError, OSError) as e:
            return broken(getattr(e, "reason", None) if isinstance(e, FormatError) and e.file == file else str(e))
        if index == 0 and record is None:
            return broken("holds no training record, so it names no origin")
        if expected is not None and digest != expected:
            return broken(f"changed origin: its weights hash to {digest} but its child recorded {expected} "
                          f"(as {recorded!r})")
        signature, verified = None, None
        found = signature_beside(file)
        if found is not None:
            signed, signature = found
            if public_key is not None:
                problem = _verify_signature(signed, signature, public_key)
                if problem is not None:
                    return broken(f"signature {signature!r} does not verify: {problem}")
                verified = True
        elif require_signatures:
            return broken(f"unsigned: no {os.path.basename(file) + SIGNATURE_SUFFIX!r} nor "
                          f"{DIRECTORY_SIGNATURE!r} beside it")
        link = Link(index, file, recorded, digest, record, signature, verified)
        links.append(link)
        origin = link.origin
        if origin is None:
            return Lineage(tuple(links), None)
        if index + 1 > max_depth:
            file = origin["file"]
            index += 1
            return broken(f"the chain goes more than {max_depth} origins deep (max_depth): refused")
        recorded, expected = origin["file"], origin["weights_sha256"]
        if backends.is_url(recorded):
            file = recorded
            index += 1
            return broken("a URL origin is not followed: lineage checks local files only, offline")
        file = _origin_path(file, recorded)


def _verify_signature(signed: str, signature: str, public_key) -> Optional[str]:
    """None when ``signature`` over ``signed`` verifies with ``public_key``, else why not."""
    try:
        from tensorlist.provenance import signing
    except ImportError as e:
        raise ImportError(f"checking signatures needs tensorlist.provenance.signing and its extra: "
                          f"pip install 'tensorlist[sign]' ({e})") from e
    try:
        result = signing.verify(signed, public_key=public_key, signature=signature)
    except Exception as e:  # whatever the verifier raises, the link is not verified
        return str(e) or type(e).__name__
    if result is False:
        return "verification failed"
    return None
