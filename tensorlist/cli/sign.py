"""The ``tensorlist sign`` and ``tensorlist verify`` commands (registered in ``cli.build_parser``)."""
from __future__ import annotations

from tensorlist._storage.destinations import made_directories, refuse_existing


def cmd_sign(args) -> int:
    """Signs PATH; a signature or attestation that exists is refused without ``--force`` (both checked first)."""
    from tensorlist.provenance.signing import default_signature, sign
    chain = args.certificate_chain or ()
    args.signature = args.signature or default_signature(args.path)
    outputs = [args.signature] + ([args.provenance] if args.provenance else [])
    refuse_existing(outputs, overwrite=args.force)
    with made_directories(outputs):
        files = sign(args.path, private_key=args.key, signature=args.signature, provenance=args.provenance,
                     certificate_chain=chain)
    print(f"{args.path}: signed {len(files)} file{'s' if len(files) != 1 else ''} -> {args.signature}"
          + (f" (attestation: {args.provenance})" if args.provenance else ""))
    return 0


def cmd_verify(args) -> int:
    from tensorlist.provenance.signing import default_signature, verify
    args.signature = args.signature or default_signature(args.path)
    if (args.public_key is None) == (not args.certificate_chain):
        raise ValueError("give --public-key or --certificate-chain (exactly one)")
    files = verify(args.path, public_key=args.public_key, certificate_chain=args.certificate_chain or (),
                   signature=args.signature, provenance=args.provenance)
    print(f"{args.path}: verified {len(files)} file{'s' if len(files) != 1 else ''} against {args.signature}"
          + (f" and the attestation {args.provenance}" if args.provenance else ""))
    return 0
