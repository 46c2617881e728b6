"""Sigstore bundles with a DSSE envelope over an in-toto Statement, as ``model_signing`` 1.x writes them.

Writing: the Statement is signed in-process with ``cryptography`` (ECDSA over
DSSE's pre-authentication encoding, the hash sized to the curve, as
``model_signing``'s key and certificate signers do), so a sign costs hashing
plus a few milliseconds rather than ``model_signing``'s 0.5 s of imports.
``tests/provenance/test_signing.py`` checks every kind of bundle written here with the
stock ``model_signing`` CLI and library.

Reading is hostile-input work, in this order: size cap, strict JSON with the
nesting limit, the bundle's shape (media type, exactly one signature,
base64), the trusted key (the given public key's hint, or the certificate
chain: valid now, the leaf not self-issued, chained to the given roots by
pyOpenSSL as ``model_signing`` does), the signature over the payload, then
the Statement's shape. Every failure is a :class:`SignatureError` naming the
bundle file.
"""
from __future__ import annotations

import base64
import binascii
import datetime
import hashlib
import json
import os
from typing import Any, List, Sequence

from tensorlist._storage.commit import atomic_file
from tensorlist._base.jsonio import loads_strict
from tensorlist.errors import FormatError, SignatureError
from tensorlist.format import read_regular

BUNDLE_MEDIA_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"

#: a bundle's size cap: a manifest line is ~150 bytes, so 64 MiB holds ~400k files.
MAX_BUNDLE_BYTES = 64 << 20


def pae(payload: bytes) -> bytes:
    """DSSE v1's pre-authentication encoding of an in-toto payload (what the signature covers)."""
    return b"DSSEv1 %d %s %d " % (len(PAYLOAD_TYPE), PAYLOAD_TYPE.encode(), len(payload)) + payload


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


class Key:
    """A private EC key (P-256/384/521) and, for certificate signing, its certificate chain."""

    def __init__(self, private_key, certificate_chain: Sequence = ()):
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        if isinstance(private_key, (str, bytes, os.PathLike)):
            text = read_regular(private_key, 1 << 20, what="private key")
            try:
                private_key = serialization.load_pem_private_key(text, None)
            except (ValueError, TypeError) as e:
                raise FormatError(f"is not an unencrypted PEM private key: {e}", file=os.fspath(private_key)) from e
        if not isinstance(private_key, ec.EllipticCurvePrivateKey) or private_key.curve.key_size not in (256, 384, 521):
            raise TypeError("private_key: expected an EC P-256, P-384 or P-521 key (a PEM path or a cryptography key)")
        self.private = private_key
        self.certificates = []
        for c in certificate_chain:
            from cryptography import x509
            if isinstance(c, x509.Certificate):
                self.certificates.append(c)
            else:
                try:
                    self.certificates.extend(x509.load_pem_x509_certificates(read_regular(c, 1 << 20,
                                                                                          what="certificate")))
                except ValueError as e:
                    raise FormatError(f"is not a PEM certificate: {e}", file=os.fspath(c)) from e
        if self.certificates and self.certificates[0].public_key() != private_key.public_key():
            raise ValueError("certificate_chain: the first certificate is not the private key's")

    def _hash(self):
        from cryptography.hazmat.primitives import hashes
        return {256: hashes.SHA256, 384: hashes.SHA384, 521: hashes.SHA512}[self.private.curve.key_size]()

    def material(self) -> dict:
        from cryptography.hazmat.primitives import serialization
        if self.certificates:
            chain = [{"rawBytes": _b64(c.public_bytes(serialization.Encoding.DER))} for c in self.certificates]
            return {"x509CertificateChain": {"certificates": chain}, "tlogEntries": []}
        return {"publicKey": {"hint": key_hint(self.private.public_key())}, "tlogEntries": []}

    def sign_statement(self, statement: dict) -> dict:
        """The bundle (a dict) of ``statement`` signed with this key."""
        from cryptography.hazmat.primitives.asymmetric import ec
        payload = json.dumps(statement, indent=2, sort_keys=True).encode("utf-8")
        sig = self.private.sign(pae(payload), ec.ECDSA(self._hash()))
        return {"mediaType": BUNDLE_MEDIA_TYPE, "verificationMaterial": self.material(),
                "dsseEnvelope": {"payload": _b64(payload), "payloadType": PAYLOAD_TYPE,
                                 "signatures": [{"sig": _b64(sig), "keyid": ""}]}}


def key_hint(public_key) -> str:
    """model_signing's key identifier: the SHA-256 of the public key's PEM SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization
    pem = public_key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(pem).hexdigest()


def write_bundle(path, bundle: dict) -> None:
    """Writes a bundle atomically (the old one stays until the new one is complete)."""
    text = json.dumps(bundle, separators=(",", ":"))
    with atomic_file(os.fspath(path)) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)


def _field(obj: Any, key: str, kind: type, file, where: str):
    """``obj[key]``, refused unless it is a ``kind`` (a bundle's fields are checked before use)."""
    value = obj.get(key) if isinstance(obj, dict) else None
    if not isinstance(value, kind):
        got = "missing" if value is None else f"a JSON {type(value).__name__}"
        raise SignatureError(f"{file}: {where}{key} is {got}, expected a JSON {kind.__name__}")
    return value


def _unb64(text: str, file, what: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as e:
        raise SignatureError(f"{file}: {what} is not base64: {e}") from None


def read_bundle(path) -> dict:
    """A bundle file strictly parsed and its shape checked (nothing verified yet)."""
    file = os.fspath(path)
    try:
        raw = read_regular(file, MAX_BUNDLE_BYTES, what="signature bundle")
        bundle = loads_strict(raw.decode("utf-8"), file=file)
    except FormatError as e:
        raise SignatureError(f"{file}: not a readable signature bundle: {e.reason}") from None
    except UnicodeDecodeError:
        raise SignatureError(f"{file}: not a readable signature bundle: not UTF-8") from None
    if not isinstance(bundle, dict):
        raise SignatureError(f"{file}: not a signature bundle: a JSON {type(bundle).__name__}")
    if bundle.get("mediaType") != BUNDLE_MEDIA_TYPE:
        raise SignatureError(f"{file}: mediaType is {bundle.get('mediaType')!r}, expected {BUNDLE_MEDIA_TYPE!r}")
    _field(bundle, "verificationMaterial", dict, file, "")
    env = _field(bundle, "dsseEnvelope", dict, file, "")
    if env.get("payloadType") != PAYLOAD_TYPE:
        raise SignatureError(f"{file}: dsseEnvelope.payloadType is {env.get('payloadType')!r}, "
                             f"expected {PAYLOAD_TYPE!r}")
    sigs = _field(env, "signatures", list, file, "dsseEnvelope.")
    if len(sigs) != 1:
        raise SignatureError(f"{file}: dsseEnvelope holds {len(sigs)} signatures, expected exactly one")
    _field(sigs[0], "sig", str, file, "dsseEnvelope.signatures[0].")
    _field(env, "payload", str, file, "dsseEnvelope.")
    return bundle


def trusted_key(bundle: dict, *, file, public_key=None, certificate_chain: Sequence = (), now=None):
    """The public key that must have signed ``bundle``: the given one (its hint checked), or the chain's leaf.

    A certificate chain is checked at ``now`` (default: the current time),
    not at the leaf's issue time as ``model_signing`` 1.1 does, so an expired
    certificate fails; a self-issued leaf (issuer = subject) is refused, since
    it vouches only for itself.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization
    material = bundle["verificationMaterial"]
    if public_key is not None:
        if not hasattr(public_key, "public_bytes"):
            try:
                public_key = serialization.load_pem_public_key(read_regular(public_key, 1 << 20, what="public key"))
            except ValueError as e:
                raise FormatError(f"is not a PEM public key: {e}", file=os.fspath(public_key)) from e
        hint = material.get("publicKey", {}).get("hint") if isinstance(material.get("publicKey"), dict) else None
        if hint is None:
            if "x509CertificateChain" in material:
                raise SignatureError(f"{file}: signed with a certificate, not a bare key: verify with the "
                                     "certificate chain's roots")
            raise SignatureError(f"{file}: names no public key (no key hint, an older model_signing format): "
                                 "re-sign it")
        if hint != key_hint(public_key):
            raise SignatureError(f"{file}: signed by another key (its key hint {hint!r} is not the public key's)")
        return public_key
    if not certificate_chain:
        raise ValueError("verify: give public_key= or certificate_chain=")
    chain = _field(_field(material, "x509CertificateChain", dict, file, "verificationMaterial."),
                   "certificates", list, file, "verificationMaterial.x509CertificateChain.")
    if not chain or len(chain) > 16:
        raise SignatureError(f"{file}: the bundle's certificate chain holds {len(chain)} certificates (1 to 16)")
    try:
        certs = [x509.load_der_x509_certificate(_unb64(_field(c, "rawBytes", str, file, "certificate."), file,
                                                       "a certificate")) for c in chain]
        roots = []
        for c in certificate_chain:
            roots.extend([c] if isinstance(c, x509.Certificate) else
                         x509.load_pem_x509_certificates(read_regular(c, 1 << 20, what="certificate")))
    except ValueError as e:
        raise SignatureError(f"{file}: unreadable certificate: {e}") from None
    when = now or datetime.datetime.now(datetime.timezone.utc)
    for c in certs:
        if not c.not_valid_before_utc <= when <= c.not_valid_after_utc:
            raise SignatureError(f"{file}: certificate {c.subject.rfc4514_string()!r} is not valid now (valid "
                                 f"{c.not_valid_before_utc:%Y-%m-%d} to {c.not_valid_after_utc:%Y-%m-%d})")
    leaf = certs[0]
    if leaf.issuer == leaf.subject:
        raise SignatureError(f"{file}: the signing certificate {leaf.subject.rfc4514_string()!r} is self-issued: "
                             "it vouches only for itself; sign with a key, or with a certificate from your CA")
    _chain_to_roots(leaf, certs[1:], roots, when, file)
    return leaf.public_key()


def _chain_to_roots(leaf, intermediates, roots, when, file) -> None:
    from OpenSSL import crypto  # model_signing's own chain check (pyOpenSSL, in tensorlist[sign])
    store = crypto.X509Store()
    for r in roots:
        store.add_cert(crypto.X509.from_cryptography(r))
    store.set_time(when.replace(tzinfo=None))
    ctx = crypto.X509StoreContext(store, crypto.X509.from_cryptography(leaf),
                                  [crypto.X509.from_cryptography(c) for c in intermediates])
    try:
        ctx.verify_certificate()
    except crypto.X509StoreContextError as e:
        raise SignatureError(f"{file}: the signing certificate does not chain to the given roots: {e}") from None


def verified_statement(bundle: dict, key, *, file) -> dict:
    """The Statement in ``bundle`` once its signature by ``key`` checks; its shape checked."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.asymmetric import ec
    env = bundle["dsseEnvelope"]
    payload = _unb64(env["payload"], file, "the payload")
    sig = _unb64(env["signatures"][0]["sig"], file, "the signature")
    algo = {256: hashes.SHA256, 384: hashes.SHA384, 521: hashes.SHA512}.get(getattr(key, "curve", None) and
                                                                            key.curve.key_size)
    if algo is None:
        raise SignatureError(f"{file}: the key is not an EC P-256, P-384 or P-521 key")
    try:
        key.verify(sig, pae(payload), ec.ECDSA(algo()))
    except InvalidSignature:
        raise SignatureError(f"{file}: the signature does not verify with this key: the bundle was changed or "
                             "signed by another key") from None
    try:
        statement = loads_strict(payload.decode("utf-8"), file=file)
    except (FormatError, UnicodeDecodeError) as e:
        raise SignatureError(f"{file}: the signed payload is not strict JSON: {e}") from None
    if not isinstance(statement, dict) or statement.get("_type") != STATEMENT_TYPE:
        raise SignatureError(f"{file}: the signed payload is not an in-toto Statement v1")
    _field(statement, "subject", list, file, "statement.")
    _field(statement, "predicateType", str, file, "statement.")
    _field(statement, "predicate", dict, file, "statement.")
    return statement


def open_verified(path, *, public_key=None, certificate_chain: Sequence = ()) -> dict:
    """Reads the bundle at ``path``, checks who signed it and returns its Statement."""
    file = os.fspath(path)
    bundle = read_bundle(file)
    key = trusted_key(bundle, file=file, public_key=public_key, certificate_chain=certificate_chain)
    return verified_statement(bundle, key, file=file)


def certificate_list(paths) -> List:
    """``certificate_chain=`` normalised to a list (a single path accepted)."""
    if paths is None:
        return []
    if isinstance(paths, (str, bytes, os.PathLike)):
        return [paths]
    return list(paths)

