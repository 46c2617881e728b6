"""Files crossing CPUs (.ci/foreign.sh): one fixed set of tensors, the same bytes from every host.

    python3 foreign_files.py write DIR   # the set as DIR/<case>.tl files, and DIR/digests.txt
    python3 foreign_files.py read DIR    # another host's DIR: every file in every read mode, values and CRCs

``digests.txt`` holds one line per file: the SHA-256 of its data file and of its descriptor (the
data file's random name replaced), so ``cmp`` of two hosts' digests compares the bytes on disk.
The set: every numpy dtype of the table as native, little- and big-endian input, 0-d, empty and
non-contiguous arrays, through ``save``, a streaming ``Writer`` and an in-place ``reserve``;
bfloat16 and float8 where ml_dtypes is installed. A host without ml_dtypes (s390x: no wheel)
writes the same set without them and, reading a file that has them, must get tensorlist's own
error naming ml_dtypes; ``digests.txt`` lists the ml_dtypes files apart so the rest compares.
"""
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import numpy as np

import tensorlist as tl
from tensorlist.errors import TensorListError

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None

NUMPY = ["uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64", "complex64", "complex128",
         "bool", "uint16", "uint32", "uint64"]
ML = ["bfloat16", "float8_e5m2", "float8_e4m3fn"]


def values(name):
    """Fixed values of a dtype, spanning its bytes (negative, fractional, large where it has them)."""
    base = np.array([0, 1, -2.5, 3.25, 100, -7, 2 ** 20 + 1, 0.125] * 3)[:21].reshape(3, 7)
    if name == "bool":
        return (base > 0)
    if name in ML:
        base = np.clip(base, -200, 200)  # inside float8_e4m3fn's range (no infinity there)
    dt = np.dtype(getattr(ml_dtypes, name) if name in ML else name)
    if dt.kind in "iu":  # through int64, which wraps the same on every CPU (a float cast out of range need not)
        return (base * 3).astype(np.int64).astype(dt)
    with np.errstate(over="ignore"):  # float16 holds 2**20 + 1 as infinity
        return (base + 1j * base[::-1]).astype(dt) if dt.kind == "c" else base.astype(dt)


def cases():
    """name -> {tensor name: array} for save, in every byte order a caller may hand in."""
    names = NUMPY + (ML if ml_dtypes is not None else [])
    out = {}
    for n in names:
        v = values(n)
        arrays = {"native": v, "scalar": v.reshape(-1)[3].reshape(()), "empty": v[:0], "strided": v[:, ::2]}
        if v.dtype.itemsize > 1 and n not in ML:
            arrays["little"] = v.astype(v.dtype.newbyteorder("<"))
            arrays["big"] = v.astype(v.dtype.newbyteorder(">"))
        out[n] = arrays
    return out


def write(d: Path):
    d.mkdir(parents=True, exist_ok=True)
    for n, arrays in cases().items():
        tl.save(d / f"{n}.tl", arrays)
    with tl.Writer(d / "stream.tl") as w:  # streaming adds, then an in-place reserve
        for n in NUMPY:
            w.add(n, values(n))
        r = w.reserve("reserved", (3, 7), np.float64)
        r[...] = values("float64")
    lines = []
    for p in sorted(d.glob("*.tl")):
        text = p.read_text()
        loc = json.loads(text)["location"]
        data = (d / loc).read_bytes()
        text = text.replace(loc, "DATA")
        tag = "ml_dtypes " if p.stem in ML else ""
        lines.append(f"{tag}{p.name} {hashlib.sha256(data).hexdigest()} {hashlib.sha256(text.encode()).hexdigest()}")
    (d / "digests.txt").write_text("\n".join(lines) + "\n")
    print(f"foreign_files: wrote {len(lines)} files ({sys.byteorder}-endian host)")


def read(d: Path):
    want = cases()
    checked = refused = 0
    for p in sorted(d.glob("*.tl")):
        n = p.stem
        expect = {n: values(n) for n in NUMPY}
        expect["reserved"] = values("float64")
        if n != "stream":
            if n in ML and ml_dtypes is None:
                try:
                    tl.load(p)
                except TensorListError as e:
                    assert "ml_dtypes" in str(e) and n in str(e), e
                    refused += 1
                    continue
                raise AssertionError(f"{p}: {n} loaded without ml_dtypes")
            expect = want[n]
        for mode in (True, "copy", False):
            got = tl.load(p, mmap=mode, verify=True)
            assert list(got) == list(expect), (p, list(got))
            for k, v in expect.items():
                g = got[k]
                assert g.shape == v.shape and g.dtype.newbyteorder("=") == v.dtype.newbyteorder("="), (p, k, g.dtype)
                assert np.array_equal(g.astype(v.dtype.newbyteorder("=")), v)
            checked += 1
    assert checked, f"nothing to read in {d}"
    for name in ("bfloat16", "stream"):  # the CLI as a user runs it: a bfloat16 file inspects without ml_dtypes
        if (d / f"{name}.tl").exists():
            r = subprocess.run([sys.executable, "-m", "tensorlist", "inspect", str(d / f"{name}.tl")],
                               capture_output=True, text=True, timeout=300)
            assert r.returncode == 0 and ("bfloat16" if name == "bfloat16" else "complex128") in r.stdout, r
    print(f"foreign_files: read {checked} file-modes from {d.name}, {refused} refused for lack of ml_dtypes "
          f"({sys.byteorder}-endian host)")


if __name__ == "__main__":
    {"write": write, "read": read}[sys.argv[1]](Path(sys.argv[2]))
