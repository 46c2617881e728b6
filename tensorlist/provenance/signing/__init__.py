"""Signed model files and checkpoints (OpenSSF model signing), and signed attestations of their training.

``sign`` writes a ``model_signing`` v1.0 signature of a model directory, a
tensorlist file or a checkpoint directory (and, with ``provenance=``, an SLSA
provenance v1 attestation of the training records, signed with the same key);
``verify`` checks both. See docs/PROVENANCE.md. Needs ``tensorlist[sign]``
(``cryptography``; ``model-signing`` and ``pyopenssl`` for verification).

Example:
    >>> import os, tempfile, numpy as np, tensorlist
    >>> from cryptography.hazmat.primitives.asymmetric import ec
    >>> d = tempfile.mkdtemp(); tensorlist.save(os.path.join(d, "m.json"), {"w": np.ones(3, np.float32)})
    >>> key = ec.generate_private_key(ec.SECP256R1())
    >>> _ = sign(os.path.join(d, "m.json"), private_key=key, signature=os.path.join(d, "m.sig"))
    >>> len(verify(os.path.join(d, "m.json"), public_key=key.public_key(), signature=os.path.join(d, "m.sig")))
    2
"""
from __future__ import annotations

import contextlib
import os
from typing import Dict, Iterator, List, Optional, Sequence

from tensorlist._storage.commit import fsync_dir

from tensorlist.errors import SignatureError
from tensorlist.provenance.signing.model import signed_files, verify_files
from tensorlist.provenance.signing.attestation import BUILD_TYPE, SLSA_PREDICATE

#: what :func:`sign_saved` appends to a saved path for its signature and its attestation.
SIGNATURE_SUFFIX, PROVENANCE_SUFFIX = ".sig", ".provenance.json"

__all__ = ["sign", "verify", "sign_saved", "signed_save", "unsign", "default_signature", "signature_files",
           "SignatureError", "BUILD_TYPE", "SLSA_PREDICATE"]


def sign(path, *, private_key, signature, provenance=None, certificate_chain: Sequence = ()) -> Dict[str, str]:
    """Signs the model at ``path``; returns ``{file name: sha256}`` of the files signed.

    Args:
        path: a model directory, a checkpoint directory, or a tensorlist file
            (its descriptor; the descriptor and its data files are signed).
        private_key: an EC P-256/384/521 private key: a PEM path or a
            ``cryptography`` key.
        signature: where to write the signature bundle (left out of the signed
            set when inside the directory).
        provenance: where to write the signed SLSA attestation, or None.
        certificate_chain: the signing certificate (first) and its
            intermediates, as PEM paths or ``x509.Certificate`` objects, to
            sign with a certificate instead of a bare key.

    Raises:
        FormatError: a symlink or special file in the directory, a file that is
            not a tensorlist file, a key that cannot be read.
    """
    return signed_files(path, private_key=private_key, signature=signature, provenance=provenance,
                        certificate_chain=certificate_chain)


def verify(path, *, public_key=None, certificate_chain: Sequence = (), signature,
           provenance=None) -> Dict[str, str]:
    """Checks ``path`` against its signature (and attestation); returns ``{file name: sha256}``.

    Args:
        public_key: the signer's public key (PEM path or ``cryptography`` key), or
        certificate_chain: the trusted root (and intermediate) certificates.

    Raises:
        SignatureError: the first failure, naming the signature or the file:
            another key, a changed/added/removed file, an unreadable bundle,
            an expired or self-issued certificate, an attestation of another
            model or of another record.
    """
    return verify_files(path, signature=signature, public_key=public_key, certificate_chain=certificate_chain,
                        provenance=provenance)


def sign_saved(path, signing_key, *, certificate_chain: Sequence = (), provenance: bool = True) -> Optional[str]:
    """The trainers' hook: signs what was just saved at ``path``; returns the signature's path.

    A file (a model file, a checkpoint document) gets ``PATH.sig`` and
    ``PATH.provenance.json`` beside it; a checkpoint directory gets
    ``model.sig`` and ``model.provenance.json`` inside it (left out of the
    signed set, as stock ``model_signing`` leaves its signature out), so the
    signature goes wherever the checkpoint goes (rotation, copies). A no-op
    returning None when ``signing_key`` is None.
    """
    if signing_key is None:
        return None
    base = os.fspath(path).rstrip(os.sep)
    sig, prov = _signature_paths(base)
    sign(base, private_key=signing_key, signature=sig, certificate_chain=certificate_chain,
         provenance=prov if provenance else None)
    return sig


@contextlib.contextmanager
def signed_save(path, signing_key, *, certificate_chain: Sequence = (), provenance: bool = True) -> Iterator[None]:
    """Around a save that writes or replaces ``path``: the trainers' one rule for signing as they save.

    With a key, the signature and attestation of what ``path`` held before are
    removed (:func:`unsign`) before the save starts, and the new ones written
    (:func:`sign_saved`) once the block has returned, that is once the save is
    complete; a save that raises is left unsigned. So a crash at any point
    leaves a signature only beside the content it signs, or none (never the
    previous save's signature beside the new content, nor a signature of
    files a save is still writing). A no-op without a key.

    Example:
        >>> import os, tempfile, numpy as np, tensorlist
        >>> path = os.path.join(tempfile.mkdtemp(), "m.json")
        >>> with signed_save(path, None):
        ...     tensorlist.save(path, {"w": np.ones(2, np.float32)})
        >>> os.path.exists(path + SIGNATURE_SUFFIX)
        False
    """
    if signing_key is None:
        yield
        return
    unsign(path)
    yield
    sign_saved(path, signing_key, certificate_chain=certificate_chain, provenance=provenance)


def unsign(path) -> List[str]:
    """Removes the signature and attestation :func:`sign_saved` wrote for ``path``; returns those removed.

    The removal is made durable (the directory fsynced) before it returns, so
    no power cut can bring the old signature back beside a newer save.
    """
    removed = []
    for p in _signature_paths(os.fspath(path).rstrip(os.sep)):
        if os.path.lexists(p):
            os.unlink(p)
            removed.append(p)
    if removed:
        fsync_dir(os.path.dirname(os.path.abspath(removed[0])))
    return removed


def default_signature(path) -> str:
    """Where :func:`sign_saved` puts the signature of ``path``, and where ``tensorlist verify`` looks by default.

    ``DIR/model.sig`` for a directory, ``FILE.sig`` for a file.
    """
    return _signature_paths(os.fspath(path).rstrip(os.sep))[0]


def _signature_paths(base: str):
    if os.path.isdir(base):
        return os.path.join(base, "model" + SIGNATURE_SUFFIX), os.path.join(base, "model" + PROVENANCE_SUFFIX)
    return base + SIGNATURE_SUFFIX, base + PROVENANCE_SUFFIX


def signature_files(path) -> List[str]:
    """The signature and attestation :func:`sign_saved` wrote beside the file ``path`` that exist."""
    base = os.fspath(path).rstrip(os.sep)
    if os.path.isdir(base):
        return []  # inside it: they go with it
    return [p for p in _signature_paths(base) if os.path.isfile(p)]
