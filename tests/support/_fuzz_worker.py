"""Reads cases from stdin and reads each through every public reader; one result line per case.

Used by tests/hostile/test_fuzz.py (and fuzz/) in a child process, so that a crash (SIGSEGV, SIGBUS,
an abort from a sanitizer) or a hang shows up as a failed case, not a dead test run.
Input lines: JSON {"file": path, "pointer": str or null}. Output lines: "ok", "error" (every
reader gave a valid result or FormatError) or "BAD <reader> <exception>".
"""
import json
import sys
import traceback

import numpy as np

import tensorlist as tl


def _touch(tensors):
    for a in tensors.values():
        a.tobytes()  # reads every mapped byte: a mapping past the file's end would fault here


def run(file, pointer):
    kw = {} if pointer is None else {"pointer": pointer}
    readers = [
        ("load", lambda: _touch(tl.load(file, **kw))),
        ("load_nommap", lambda: _touch(tl.load(file, mmap=False, **kw))),
        ("open_verify", lambda: _open_verify(file, kw)),
        ("validate", lambda: tl.validate(file, verify=True, **kw)),
        ("load_document", lambda: tl.load_document(file)),
    ]
    outcome = []
    for name, call in readers:
        try:
            call()
            outcome.append("ok")
        except tl.FormatError:
            outcome.append("error")
        except Exception as e:  # noqa: BLE001 - that is the finding
            return f"BAD {name} {type(e).__name__}: {e} | {traceback.format_exc(limit=3)!r}"
    return "ok" if outcome[0] == "ok" else "error"


def _open_verify(file, kw):
    with tl.open(file, **kw) as r:
        for k in r.keys():
            np.asarray(r[k]).tobytes()
        r.verify()


def main():
    for line in sys.stdin:
        case = json.loads(line)
        print(run(case["file"], case["pointer"]), flush=True)


if __name__ == "__main__":
    main()
