"""Signing and verifying a model directory, a tensorlist file or a checkpoint directory.

The signature is an OpenSSF model signing v1.0 bundle (predicateType
``https://model_signing/signature/v1.0``): a Statement whose one subject is the
model (its name, and the SHA-256 of its files' digests in name order) and whose
predicate lists every file's SHA-256 (``resources``) and how they were listed
(``serialization``: ``files``, ``sha256``, no symlinks, the ignored names).
Stock ``model_signing verify key`` accepts it; stock signatures verify here.
"""
from __future__ import annotations

import hashlib
import os
from typing import Dict, List, Sequence

from tensorlist.errors import FormatError, SignatureError
from tensorlist.provenance.signing import bundle as _bundle
from tensorlist.provenance.signing.files import check_name, collect, digests

PREDICATE_TYPE = "https://model_signing/signature/v1.0"


def _inside_names(root: str, paths) -> List[str]:
    """The names, relative to ``root``, of those of ``paths`` that lie inside it (to leave out of the set)."""
    out = []
    real_root = os.path.realpath(root)
    for p in paths:
        if p is None:
            continue
        rel = os.path.relpath(os.path.realpath(os.fspath(p)), real_root)
        if not rel.startswith(os.pardir) and not os.path.isabs(rel):
            out.append(rel.replace(os.sep, "/"))
    return out


def model_name(path) -> str:
    return os.path.basename(os.path.abspath(os.fspath(path)))


def manifest_statement(name: str, files: Dict[str, str], ignored: Sequence[str]) -> dict:
    """model_signing's Statement for ``files`` (``{name: sha256 hex}``)."""
    names = sorted(files)
    root = hashlib.sha256(b"".join(bytes.fromhex(files[n]) for n in names)).hexdigest()
    serialization = {"method": "files", "hash_type": "sha256", "allow_symlinks": False}
    if ignored:
        serialization["ignore_paths"] = sorted(set(ignored))
    return {"_type": _bundle.STATEMENT_TYPE, "subject": [{"name": name, "digest": {"sha256": root}}],
            "predicateType": PREDICATE_TYPE,
            "predicate": {"serialization": serialization,
                          "resources": [{"name": n, "algorithm": "sha256", "digest": files[n]} for n in names]}}


def signed_files(path, *, private_key, signature, provenance=None, certificate_chain=()) -> Dict[str, str]:
    """Hashes the model at ``path`` and writes its signature (and attestation); returns ``{name: sha256}``."""
    key = _bundle.Key(private_key, _bundle.certificate_list(certificate_chain))
    ignored = _inside_names(path, [signature, provenance]) if os.path.isdir(path) else []
    root, names, single = collect(path, ignored)
    files = digests(root, names)
    _bundle.write_bundle(signature, key.sign_statement(manifest_statement(model_name(path), files, ignored)))
    if provenance is not None:
        from tensorlist.provenance.signing.attestation import attestation_statement
        statement = attestation_statement(root, files)
        _bundle.write_bundle(provenance, key.sign_statement(statement))
    return files


def _expected(statement: dict, file) -> tuple:
    if statement["predicateType"] != PREDICATE_TYPE:
        raise SignatureError(f"{file}: predicateType is {statement['predicateType']!r}: not a model signature "
                             f"({PREDICATE_TYPE!r}); an attestation is checked with provenance=")
    pred = statement["predicate"]
    ser = pred.get("serialization")
    if not isinstance(ser, dict) or ser.get("method") != "files" or ser.get("hash_type") != "sha256" \
            or ser.get("allow_symlinks") is not False:
        raise SignatureError(f"{file}: serialization {ser!r} is not supported: expected method 'files', "
                             "hash_type 'sha256', allow_symlinks false")
    ignored = ser.get("ignore_paths", [])
    if not isinstance(ignored, list) or not all(isinstance(p, str) for p in ignored):
        raise SignatureError(f"{file}: serialization.ignore_paths is not a list of names")
    resources = pred.get("resources")
    if not isinstance(resources, list):
        raise SignatureError(f"{file}: predicate.resources is not a list")
    expected: Dict[str, str] = {}
    for i, r in enumerate(resources):
        if not isinstance(r, dict) or r.get("algorithm") != "sha256" or not isinstance(r.get("digest"), str):
            raise SignatureError(f"{file}: predicate.resources[{i}] is not a sha256 resource")
        try:
            name = check_name(r.get("name"))
        except FormatError as e:
            raise SignatureError(f"{file}: predicate.resources[{i}] {e.reason}") from None
        if name in expected:
            raise SignatureError(f"{file}: predicate.resources names {name!r} twice")
        expected[name] = r["digest"]
    for p in ignored:
        if p.startswith("/") or ".." in p.split("/"):
            raise SignatureError(f"{file}: serialization.ignore_paths names {p!r}, outside the model: refused")
    subjects = statement["subject"]
    root = hashlib.sha256(b"".join(bytes.fromhex(expected[n]) if _is_hex(expected[n]) else b"!"
                                   for n in sorted(expected))).hexdigest()
    if len(subjects) != 1 or not isinstance(subjects[0], dict) or \
            not isinstance(subjects[0].get("digest"), dict) or subjects[0]["digest"].get("sha256") != root:
        raise SignatureError(f"{file}: the subject's digest is not the digest of the listed files")
    return expected, ignored


def _is_hex(s: str) -> bool:
    try:
        return len(bytes.fromhex(s)) == 32
    except ValueError:
        return False


class _Precomputed:
    """A ``model_signing`` hashing config that answers with a manifest of digests computed already.

    It stands in for the library's ``hashing.Config`` (the two methods its
    verifier calls), so that the stock check does not hash every file again.
    """

    def __init__(self, manifest):
        self._manifest = manifest

    def hash(self, model_path, *, files_to_hash=None):
        return self._manifest

    def add_ignored_paths(self, *, model_path, paths):
        pass  # the manifest was made with the ignored paths left out


def _stock_check(root: str, signature: str, expected: Dict[str, str], ignored, public_key, certificate_chain):
    """The same signature checked by the ``model_signing`` library itself, over the digests computed here."""
    try:
        from model_signing import manifest as ms_manifest, verifying
        from model_signing._hashing.hashing import Digest  # no public constructor of a manifest item's digest
    except ImportError:  # pragma: no cover - tensorlist[sign] installs it
        return
    args = {"method": "files", "hash_type": "sha256", "allow_symlinks": False}
    kind = ms_manifest.SerializationType.from_args(dict(args, ignore_paths=list(ignored)))
    items = [kind.new_item(n, Digest("sha256", bytes.fromhex(d))) for n, d in expected.items()]
    manifest = ms_manifest.Manifest(os.path.basename(root), items, kind)
    config = verifying.Config().set_hashing_config(_Precomputed(manifest))
    if public_key is not None:
        config.use_elliptic_key_verifier(public_key=public_key)
    else:
        config.use_certificate_verifier(certificate_chain=certificate_chain)
    try:
        config.verify(root, signature)
    except Exception as e:  # the library's ValueError, KeyError, InvalidSignature, OpenSSL errors...
        raise SignatureError(f"{signature}: model_signing refuses the signature: {type(e).__name__}: {e}") from None


def verify_files(path, *, signature, public_key=None, certificate_chain=(), provenance=None) -> Dict[str, str]:
    """Checks ``path`` against ``signature`` (and ``provenance``); returns ``{name: sha256}`` of the signed files.

    Raises:
        SignatureError: naming the signature file and, for a changed, added or
            removed file, the file.
    """
    sig_file = os.fspath(signature)
    chain = _bundle.certificate_list(certificate_chain)
    if public_key is None and not chain:
        raise ValueError("verify: give public_key= or certificate_chain=")
    bundle = _bundle.read_bundle(sig_file)
    key = _bundle.trusted_key(bundle, file=sig_file, public_key=public_key, certificate_chain=chain)
    statement = _bundle.verified_statement(bundle, key, file=sig_file)
    expected, ignored = _expected(statement, sig_file)
    root, names, single = collect(path, ignored)
    if single:  # a file's own set: what the signature lists of its directory (stock's --ignore_unsigned_files)
        extra = sorted(set(names) - set(expected))
        if extra:
            raise SignatureError(f"{os.path.join(root, extra[0])}: not covered by the signature {sig_file}")
        names = sorted(n for n in expected)
    actual = digests(root, [n for n in names if os.path.lexists(os.path.join(root, *n.split("/")))])
    for n in sorted(set(expected) - set(actual)):
        raise SignatureError(f"{os.path.join(root, n)}: signed but missing (signature {sig_file})")
    for n in sorted(set(actual) - set(expected)):
        raise SignatureError(f"{os.path.join(root, n)}: not covered by the signature {sig_file} (an added file)")
    for n in sorted(expected):
        if actual[n] != expected[n]:
            raise SignatureError(f"{os.path.join(root, n)}: changed since it was signed (sha256 {actual[n]}, "
                                 f"signed {expected[n]})")
    if isinstance(public_key, (str, os.PathLike)) or (public_key is None and all(
            isinstance(c, (str, os.PathLike)) for c in chain)):  # the library reads keys from files only
        _stock_check(root, sig_file, actual, ignored, public_key, chain)
    if provenance is not None:
        from tensorlist.provenance.signing.attestation import check_attestation
        check_attestation(os.fspath(provenance), root, actual, public_key=public_key, certificate_chain=chain)
    return actual
