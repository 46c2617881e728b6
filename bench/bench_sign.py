"""Signing a model directory: ``tensorlist sign`` against hashing its files with hashlib, and the stock API.

Writes a model directory of ``--size-mib`` MiB (default 1024, in ``--files``
files of random bytes), warms the page cache, then times fresh interpreters,
interleaved round by round so that the machine's load falls on each alike;
each time is taken inside the child, from before its imports to the end, so
interpreter start-up (the same for all) is left out:

* baseline: ``hashlib.sha256`` of every file, one after the other, in one process;
* ``tensorlist.provenance.signing.sign`` (what ``tensorlist sign`` runs), imports included
  (target: at most 1.5x the baseline);
* the stock ``model_signing.signing.Config().use_elliptic_key_signer(...).sign``, imports included.

It prints the median of ``--runs`` rounds and each median's ratio to the
baseline; ``--check`` exits 1 when the target is missed. The signature made by
tensorlist is verified with the stock library at the end (a fast wrong
signature is an error, not a result).

    python bench/bench_sign.py --runs 3 --check
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

from fresh import installed_env  # noqa: E402  (this script's folder is on sys.path)

TARGET = 1.5

BASELINE = """
import time; t = time.perf_counter()
import hashlib, os, sys
d = sys.argv[1]
for name in sorted(os.listdir(d)):
    h = hashlib.sha256()
    with open(os.path.join(d, name), "rb") as f:
        while True:
            b = f.read(1 << 20)
            if not b:
                break
            h.update(b)
print(time.perf_counter() - t)
"""

TENSORLIST = """
import time; t = time.perf_counter()
import sys
from tensorlist.provenance.signing import sign
sign(sys.argv[1], private_key=sys.argv[2], signature=sys.argv[3])
print(time.perf_counter() - t)
"""

STOCK = """
import time; t = time.perf_counter()
import sys
from model_signing import signing
signing.Config().use_elliptic_key_signer(private_key=sys.argv[2]).sign(sys.argv[1], sys.argv[3])
print(time.perf_counter() - t)
"""


def _child(code: str, *args: str) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=installed_env(), check=True)
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-mib", type=int, default=1024)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--no-stock", action="store_true", help="skip the stock model_signing row")
    ap.add_argument("--check", action="store_true", help=f"exit 1 when tensorlist takes over {TARGET}x the baseline")
    args = ap.parse_args()
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    with tempfile.TemporaryDirectory() as tmp:
        model = os.path.join(tmp, "model")
        os.mkdir(model)
        per = (args.size_mib << 20) // args.files
        for i in range(args.files):
            with open(os.path.join(model, f"shard-{i:05d}.data"), "wb") as f:
                for _ in range(per >> 20):
                    f.write(os.urandom(1 << 20))
        key = ec.generate_private_key(ec.SECP256R1())
        priv, pub = os.path.join(tmp, "k.priv"), os.path.join(tmp, "k.pub")
        with open(priv, "wb") as f:
            f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
        with open(pub, "wb") as f:
            f.write(key.public_key().public_bytes(serialization.Encoding.PEM,
                                                  serialization.PublicFormat.SubjectPublicKeyInfo))
        sig = os.path.join(tmp, "tl.sig")
        rows = {"hashlib.sha256, one process": (BASELINE, model),
                "tensorlist sign": (TENSORLIST, model, priv, sig)}
        if not args.no_stock:
            rows["model_signing (stock API)"] = (STOCK, model, priv, os.path.join(tmp, "stock.sig"))
        _child(BASELINE, model)  # page cache warm
        times = {name: [] for name in rows}
        for _ in range(args.runs):
            for name, (code, *a) in rows.items():
                times[name].append(_child(code, *a))
        from model_signing import verifying
        verifying.Config().use_elliptic_key_verifier(public_key=pub).verify(model, sig)
    base = statistics.median(times["hashlib.sha256, one process"])
    print(f"{args.size_mib} MiB in {args.files} files, median of {args.runs} (fastest in brackets):")
    ok = True
    for name, ts in times.items():
        ratio = statistics.median(ts) / base
        extra = ""
        if name == "tensorlist sign":
            ok = ratio <= TARGET
            extra = f"  target <= {TARGET}x: {'met' if ok else 'MISSED'}"
        print(f"  {name:30s} {statistics.median(ts):7.3f} s ({min(ts):.3f})  {ratio:5.2f}x{extra}")
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
