"""Mutation fuzzing of real descriptors and data files: every outcome is a result or FormatError.

Seeds are the valid files of the conformance corpus. Hypothesis mutates the descriptor (byte
flips, truncation, splicing, huge or odd numbers, deep nesting, duplicate keys, overlapping and
out-of-range tensors, renamed locations) and the data files (flips, truncation, growth), and a
child process (tests/support/_fuzz_worker.py) reads each result through load (mmap on and off), open +
verify, validate and load_document. A crash or hang of the child fails the test with the case.
"""
import json
import os
import re
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _paths import SUPPORT, TESTS

pytestmark = pytest.mark.slow  # every case runs in a worker process

HERE = Path(SUPPORT)
CORPUS = Path(TESTS) / "conformance"
MANIFEST = json.loads((CORPUS / "manifest.json").read_text(encoding="utf-8"))
# CI runs a fixed, derandomized sample; TENSORLIST_FUZZ_EXAMPLES=N TENSORLIST_FUZZ_RANDOM=1 explores.
EXAMPLES = int(os.environ.get("TENSORLIST_FUZZ_EXAMPLES", "150"))
TIMEOUT = 60.0


def _seeds():
    seeds, seen = [], set()
    for c in MANIFEST["cases"]:
        if c["expect"] != "ok" or (c["file"], c["pointer"]) in seen:
            continue
        seen.add((c["file"], c["pointer"]))
        path = CORPUS / c["file"]
        text = path.read_bytes()
        doc = json.loads(text)
        datas = {}
        for node in [doc] + ([v for v in doc.values() if isinstance(v, dict)] if c["pointer"] else []):
            if isinstance(node, dict) and isinstance(node.get("location"), str):
                p = path.parent / node["location"]
                if p.is_file():
                    datas[node["location"]] = p.read_bytes()
        if c["pointer"] == "/optimizer/state/0":
            loc = doc["optimizer"]["state"][0]["location"]
            datas[loc] = (path.parent / loc).read_bytes()
        seeds.append((c["id"], text, datas, c["pointer"]))
    return seeds


SEEDS = _seeds()
NUMBERS = [b"-1", b"0", b"1", b"7", b"4096", b"9223372036854775807", b"9223372036854775808",
           b"18446744073709551616", b"-9223372036854775808", b"1e999", b"-1e999", b"1e-999", b"1.5",
           b"1.0", b"1E2", b"-0", b"00", b"0x10", b"NaN", b"Infinity", b"true", b"null", b'"7"', b"[]",
           b"{}", b"123456789012345678901234567890", b"4294967296", b"4294967295"]
NUM_RE = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
KEY_RE = re.compile(rb'"(\w+)":')


@st.composite
def mutations(draw):
    cid, text, datas, pointer = draw(st.sampled_from(SEEDS))
    text = bytearray(text)
    datas = {k: bytearray(v) for k, v in datas.items()}
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "splice", "number", "nest", "dupkey", "overlap",
                                   "dims", "location", "data_flip", "data_truncate", "data_grow", "insert"]))
        if op == "flip" and text:
            i = draw(st.integers(0, len(text) - 1))
            text[i] ^= draw(st.integers(1, 255))
        elif op == "truncate" and text:
            del text[draw(st.integers(0, len(text) - 1)):]
        elif op == "splice":
            other = draw(st.sampled_from(SEEDS))[1]
            a = draw(st.integers(0, len(other)))
            b = draw(st.integers(a, len(other)))
            i = draw(st.integers(0, len(text)))
            j = draw(st.integers(i, min(len(text), i + 64)))
            text[i:j] = other[a:b]
        elif op == "number":
            nums = list(NUM_RE.finditer(text))
            if nums:
                m = nums[draw(st.integers(0, len(nums) - 1))]
                text[m.start():m.end()] = draw(st.sampled_from(NUMBERS))
        elif op == "nest":
            nums = list(NUM_RE.finditer(text))
            if nums:
                m = nums[draw(st.integers(0, len(nums) - 1))]
                depth = draw(st.sampled_from([1, 10, 999, 1000, 1001, 5000, 100000]))
                opener = draw(st.sampled_from([b"[", b'{"a":']))
                closer = b"]" if opener == b"[" else b"}"
                text[m.start():m.end()] = opener * depth + m.group() + closer * depth
        elif op == "dupkey":
            keys = list(KEY_RE.finditer(text))
            if keys:
                m = keys[draw(st.integers(0, len(keys) - 1))]
                end = text.find(b",", m.end())
                end = len(text) if end < 0 else end
                text[end:end] = b"," + bytes(text[m.start():end])
        elif op in ("overlap", "dims", "location", "insert"):
            try:
                doc = json.loads(bytes(text))
                lists = [doc] if pointer is None else [n for n in _walk(doc) if isinstance(n, dict) and "location" in n]
                text2 = json.dumps(doc)
            except (ValueError, RecursionError):
                continue
            del text2
            lists = [x for x in lists if isinstance(x, dict)]
            if not lists:
                continue
            lst = draw(st.sampled_from(lists))
            ts = lst.get("tensors")
            if op == "location":
                lst["location"] = draw(st.sampled_from(
                    ["../x", "/dev/zero", "/proc/self/mem", ".", "d.tl", "d.tl/x", "a" * 5000, "sub/",
                     "nope", "./" + str(lst.get("location")), "\\x", "C:x"]))
            elif not isinstance(ts, list) or not ts or not all(isinstance(t, dict) for t in ts):
                continue
            elif op == "overlap":
                i, j = draw(st.integers(0, len(ts) - 1)), draw(st.integers(0, len(ts) - 1))
                ts[i]["byteOffset"] = ts[j].get("byteOffset")
                if draw(st.booleans()):
                    ts[i]["byteLength"] = ts[j].get("byteLength")
                    ts[i]["dims"] = ts[j].get("dims")
                    ts[i]["dataType"] = ts[j].get("dataType")
            elif op == "dims":
                t = draw(st.sampled_from(ts))
                t["dims"] = draw(st.lists(st.sampled_from([0, 1, 2, 3, 1 << 31, 1 << 32, (1 << 62), (1 << 63) - 1]),
                                          max_size=5))
                if draw(st.booleans()):
                    t["byteLength"] = draw(st.sampled_from([0, 8, 1 << 32, (1 << 63) - 1]))
            elif op == "insert":
                k = draw(st.integers(0, 2000))
                lst["tensors"] = ts + [dict(ts[-1], name=f"n{x}") if "name" in ts[-1] else dict(ts[-1])
                                       for x in range(k)]
                lst["byteLength"] = draw(st.sampled_from([lst.get("byteLength"), 1 << 40, (1 << 63) - 4096]))
            text = bytearray(json.dumps(doc).encode())
        elif op.startswith("data") and datas:
            name = draw(st.sampled_from(sorted(datas)))
            d = datas[name]
            if op == "data_flip" and d:
                d[draw(st.integers(0, len(d) - 1))] ^= draw(st.integers(1, 255))
            elif op == "data_truncate":
                del d[draw(st.integers(0, len(d))):]
            elif op == "data_grow":
                d += bytes(draw(st.integers(1, 9000)))
    return cid, bytes(text), {k: bytes(v) for k, v in datas.items()}, pointer


def _walk(node):
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _walk(v)
    elif isinstance(node, list):
        for v in node:
            yield from _walk(v)


class Worker:
    def __init__(self, env=None, argv=None):
        self.env = env
        self.argv = argv or [sys.executable, str(HERE / "_fuzz_worker.py")]
        self.proc = None

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self.env)

    def ask(self, file, pointer) -> str:
        if self.proc is None or self.proc.poll() is not None:
            self.start()
        self.proc.stdin.write((json.dumps({"file": str(file), "pointer": pointer}) + "\n").encode())
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], TIMEOUT)
        if not ready:
            self.proc.kill()
            self.proc.wait()
            self.proc = None
            return f"HANG (no answer in {TIMEOUT} s)"
        line = self.proc.stdout.readline().decode().strip()
        if not line:
            rc = self.proc.wait()
            err = self.proc.stderr.read().decode(errors="replace")[-3000:]
            self.proc = None
            return f"CRASH (exit {rc}) {err}"
        return line

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=30)


@pytest.fixture(scope="module")
def worker():
    w = Worker()
    yield w
    w.close()


def _write_case(root: Path, case):
    cid, text, datas, pointer = case
    if root.exists():
        shutil.rmtree(root)
    root.mkdir(parents=True)
    file = root / "d.tl"
    file.write_bytes(text)
    for loc, data in datas.items():
        p = root / loc
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return file, pointer


def test_seeds_load_in_the_worker(tmp_path, worker):
    for i, case in enumerate(SEEDS):
        file, pointer = _write_case(tmp_path / f"s{i}", case)
        assert worker.ask(file, pointer) == "ok", case[0]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=not os.environ.get("TENSORLIST_FUZZ_RANDOM"),
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                                 HealthCheck.data_too_large, HealthCheck.large_base_example])
@given(case=mutations())
def test_mutated_files_give_a_result_or_format_error(tmp_path, worker, case):
    file, pointer = _write_case(tmp_path / "case", case)
    got = worker.ask(file, pointer)
    assert got in ("ok", "error"), f"seed {case[0]}, pointer {pointer}, descriptor {case[1][:400]!r}: {got}"


def test_a_crashing_child_is_reported_not_fatal(tmp_path):
    # The harness itself: a child that dies on a case is a failure with a message, not a dead run.
    w = Worker(argv=[sys.executable, "-c", "import os, signal, sys; sys.stdin.readline(); "
                     "os.kill(os.getpid(), signal.SIGSEGV)"])
    got = w.ask(tmp_path / "none.tl", None)
    assert got.startswith("CRASH (exit -"), got  # -11, or -6 where a sanitizer turns it into abort
