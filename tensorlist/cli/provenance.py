"""The ``lineage`` and ``export`` commands of the command line (``cli`` registers their arguments).

Everything printed goes through ``cli.main``'s escaping streams; a path is
also kept to one line here (its newlines and tabs written as escapes), so that
each link of a chain is one line whatever its file is called.

Imports ``lineage``, ``exports`` and ``_base.terminal``.
"""
from __future__ import annotations

import json
import sys

from tensorlist._base.terminal import escape_controls
from tensorlist.cli.messages import print_error

__all__ = ["LINEAGE_EXAMPLES", "EXPORT_EXAMPLES", "cmd_lineage", "cmd_export"]

LINEAGE_EXAMPLES = (
    "examples:\n  tensorlist lineage runs/ft2/final.tl --root runs\n"
    "  tensorlist lineage final.tl --public-key team.pub --require-signatures\n"
    "  tensorlist lineage final.tl --json\n\n"
    "Each origin is resolved against the directory of the file that recorded it and must lie under\n"
    "--root (default: MODEL's directory). A signature beside a file (FILE.sig, else model.sig in its\n"
    "directory) is checked when --public-key is given.\n"
    "exit status: 0 every link holds, 1 a broken link (named on stderr) or an error"
)
EXPORT_EXAMPLES = (
    "examples:\n  tensorlist export final.tl --cyclonedx final.cdx.json\n"
    "  tensorlist export final.tl --model-card card/README.md\n"
    "  tensorlist export final.tl --model-card README.md --force   (replace README.md)\n\n"
    "The model file is verified first (its records and weights hash); see docs/PROVENANCE_LINEAGE.md.\n"
    "An output that exists is refused unless --force is given (both checked before either is written)."
)


def _line(text) -> str:
    """``text`` as one line: controls escaped, newlines and tabs as ``\\n`` and ``\\t``."""
    return escape_controls(str(text)).replace("\n", "\\n").replace("\t", "\\t")


def _describe(link) -> str:
    parts = [f"{link.index:>3}  {_line(link.file)}", f"weights {link.weights_sha256[:16]}"]
    if link.recorded is not None:
        parts.append(f"recorded as {_line(repr(link.recorded))}")
    if link.record is None:
        parts.append("no training record (the chain's first weights)")
    else:
        w = link.record["weights"]
        parts.append(f"{_line(w['kind'])} after epoch {w['epoch']}")
        if link.origin is None:
            parts.append(f"from {_line(link.record['initial_weights']['from'])}, no origin")
    if link.signature is not None:
        state = "verified" if link.signature_verified else "not checked (no --public-key)"
        parts.append(f"signature {_line(link.signature)} {state}")
    return "  ".join(parts)


def cmd_lineage(args) -> int:
    from tensorlist.provenance.lineage import MAX_LINEAGE_DEPTH, lineage

    depth = MAX_LINEAGE_DEPTH if args.max_depth is None else args.max_depth
    chain = lineage(args.model, root=args.root, allow_outside=args.allow_outside, max_depth=depth,
                    public_key=args.public_key, require_signatures=args.require_signatures)
    if args.json:
        print(json.dumps({
            "links": [{"index": k.index, "file": k.file, "recorded": k.recorded, "weights_sha256": k.weights_sha256,
                       "has_record": k.record is not None, "origin": k.origin, "signature": k.signature,
                       "signature_verified": k.signature_verified} for k in chain.links],
            "broken": None if chain.ok else {"index": chain.broken.index, "file": chain.broken.file,
                                             "reason": chain.broken.reason},
        }, indent=2))
    else:
        for link in chain.links:
            print(_describe(link))
    if not chain.ok:
        b = chain.broken
        print_error("lineage", f"broken link {b.index}: {_line(b.reason)}", file=_line(b.file))
        return 1
    if not args.json:
        print(f"lineage: {len(chain.links)} link{'s' if len(chain.links) != 1 else ''}, every one holds")
    return 0


def cmd_export(args) -> int:
    from tensorlist.provenance.exports import export

    if args.cyclonedx is None and args.model_card is None:
        raise ValueError("ask for at least one output: --cyclonedx OUT.json, --model-card OUT.md or both")
    for path in export(args.model, cyclonedx=args.cyclonedx, model_card_path=args.model_card,
                       overwrite=args.force):
        print(f"wrote {_line(path)}", file=sys.stderr)
    return 0
