#!/usr/bin/env python3
"""Coverage-guided fuzzing of the descriptor reader (atheris, libFuzzer's engine for Python).

    python fuzz/fuzz_descriptor.py -runs=100000 [-max_total_time=60] [CORPUS_DIR ...]

Each input is a descriptor document. It goes through the reading pipeline twice: the fast
path (C strict-JSON scan and column extractor, ``tl_json_scan``/``tl_parse_tensors``, then
``tl_check_layout``) and the exact Python validator. The target fails when either raises
anything but ``FormatError``, or when they disagree (one accepts what the other refuses, or
they read different tensors). A crash in the C core kills the process, which libFuzzer reports
with the input. Seeds: the conformance corpus's descriptors (tests/conformance), used when no
corpus directory is given. With an input's first byte odd, the tail is also read as a data file
region under the descriptor (offset/length checks against a short file in memory).
"""
import os
import sys

import atheris

with atheris.instrument_imports(include=["tensorlist"]):
    import tensorlist as tl
    from tensorlist import format as F
    from tensorlist._base.jsonio import loads_strict
    from tensorlist.reader import _select_list

HERE = os.path.dirname(os.path.abspath(__file__))
SEEDS = os.path.join(HERE, "..", "tests", "conformance")


def _read(buf: bytes, fast: bool):
    """(keys, shapes, codes, offsets, lengths, crcs) or 'error'."""
    try:
        if len(buf) > F.MAX_DESCRIPTOR_BYTES:
            return "error"
        doc = F._fast_document(buf, "fuzz") if fast else None
        if doc is None:
            doc = loads_strict(buf, file="fuzz")
        obj, ptr = _select_list(doc, None, "fuzz")
        d = F.parse_list(obj, file="fuzz", pointer=ptr, limits=F.Limits(max_tensors=100_000))
    except tl.FormatError:
        return "error"
    t = d.tensors
    return (t.keys(), list(t.shapes), [x.code for x in t.dtypes], list(t.offsets), list(t.lengths),
            None if t.crcs is None else list(t.crcs), d.byte_offset, d.byte_length)


def TestOneInput(data: bytes) -> None:
    fast, exact = _read(data, True), _read(data, False)
    if fast != exact:
        raise AssertionError(f"fast path {fast!r:.300} != exact path {exact!r:.300} for {data[:300]!r}")
    if exact != "error" and data[:1] and data[0] & 1:
        # the data-file checks: a region of the input's own length
        _, _, _, offsets, lengths, _, off, length = exact
        size = len(data)
        if off + length <= size:
            for o, n in zip(offsets, lengths):
                assert 0 <= off + o and off + o + n <= size, "a validated tensor lies outside the region"


def _seeds(argv):
    if any(not a.startswith("-") for a in argv[1:]):
        return argv
    seed_dir = os.path.join(HERE, "seeds")
    os.makedirs(seed_dir, exist_ok=True)
    for root, _, files in os.walk(SEEDS):
        for f in files:
            if f.endswith((".tl", ".json", ".lamp")) and f != "manifest.json":
                with open(os.path.join(root, f), "rb") as src:
                    data = src.read()
                with open(os.path.join(seed_dir, f"{os.path.basename(root)}_{f}"), "wb") as dst:
                    dst.write(data)
    work = os.path.join(HERE, "corpus")
    os.makedirs(work, exist_ok=True)
    return argv + [work, seed_dir]


if __name__ == "__main__":
    atheris.Setup(_seeds(sys.argv), TestOneInput)
    atheris.Fuzz()
