"""Crash consistency of every save path under SIGKILL, at forced and at random moments.

Forced kill points: a child process imports tensorlist once and forks one grandchild per kill
point; the grandchild wraps ``os.open``, ``_base.lowlevel.fsync``, ``os.rename`` and ``os.unlink`` so that it
SIGKILLs itself just before or just after their N-th call during a save (the data file's create,
fsync and rename, the descriptor's create, fsync and rename (the commit point), the directory
fsync, the deletion of the old data file, the sweep). Each save path (``save``, the streaming
``Writer`` with ``add`` and ``reserve``, ``save_document``) is cut at every such call. After each
kill the path must load, checksums verified, as exactly the old or exactly the new content, and
the next save must leave only the descriptor and its one data file.

Random kill points: the same save paths, repeated with large tensors in a child that the test
kills at random moments (data half-written, between renames).
"""
import json
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # children killed mid-save

CONTENT = textwrap.dedent("""
    import numpy as np
    import tensorlist as tl

    def content(which, n):
        rng = np.random.default_rng({"A": 1, "B": 2, "C": 3}[which])
        return {"w": rng.integers(0, 1 << 30, n, dtype=np.int64),
                "b": rng.standard_normal(max(1, n // 3)).astype(np.float32),
                "s": np.int16({"A": 1, "B": 2, "C": 3}[which])}

    def save(kind, path, which, n):
        t = content(which, n)
        if kind == "save":
            tl.save(path, t, metadata={"which": which})
        elif kind == "writer":
            with tl.Writer(path, metadata={"which": which}) as w:
                w.add("w", t["w"])
                r = w.reserve("b", t["b"].shape, t["b"].dtype)
                r[:] = t["b"]
                w.add("s", t["s"])
        elif kind == "document":
            tl.save_document(path, {"which": which, "model": tl.Tensors({"w": t["w"], "b": t["b"]}),
                                    "opt": tl.Tensors([t["s"]], metadata={"which": which})})
        else:
            raise ValueError(kind)

    def which(kind, path, n):
        \"\"\"'A', 'B' or 'C' when path holds exactly that content (CRCs verified), else raises.\"\"\"
        if kind == "document":
            doc = tl.load_document(path)
            w = doc["which"]
            got = dict(doc["model"], s=doc["opt"]["0"][()])
            tl.load(path, pointer="/model", verify=True)
            tl.load(path, pointer="/opt", verify=True)
        else:
            got = tl.load(path, verify=True)
            w = tl.open(path).metadata["which"]
        want = content(w, n)
        assert list(got) == list(want) or kind == "document", list(got)
        for k, v in want.items():
            v = np.asarray(v)
            assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
            assert np.array_equal(got[k], v), k
        return w
""")

SERVER = CONTENT + textwrap.dedent("""
    import json, os, shutil, signal, sys

    from tensorlist._base import lowlevel as _lowlevel

    # fsync is the package's one fsync (tl_fsync: F_FULLFSYNC on macOS), the rest are os calls
    HOOKED = {"open": os, "fsync": _lowlevel, "rename": os, "unlink": os}
    root, kinds, n = sys.argv[1], sys.argv[2].split(","), int(sys.argv[3])

    def hook(target):
        \"\"\"Counts calls of the hooked functions; target=(name, k, when) kills at that call.\"\"\"
        counts = dict.fromkeys(HOOKED, 0)
        for name, owner in HOOKED.items():
            real = getattr(owner, name)
            def wrapper(*a, _name=name, _real=real, **kw):
                counts[_name] += 1
                if target and target[0] == _name and target[1] == counts[_name] and target[2] == "before":
                    os.kill(os.getpid(), signal.SIGKILL)
                try:
                    return _real(*a, **kw)
                finally:  # after the call, whether it succeeded or raised
                    if target and target[0] == _name and target[1] == counts[_name] and target[2] == "after":
                        os.kill(os.getpid(), signal.SIGKILL)
            setattr(owner, name, wrapper)
        return counts

    def in_child(fn):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(r)
            try:
                out = fn()
                os.write(w, json.dumps(out).encode())
            finally:
                os._exit(0)
        os.close(w)
        data = b""
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            data += chunk
        os.close(r)
        _, status = os.waitpid(pid, 0)
        return json.loads(data) if data else None, status

    def fresh(kind):
        d = os.path.join(root, kind)
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
        path = os.path.join(d, "ckpt.json" if kind == "document" else "m.tl")
        save(kind, path, "A", n)
        return d, path

    for kind in kinds:
        d, path = fresh(kind)
        def dry():
            counts = hook(None)
            save(kind, path, "B", n)
            return counts
        counts, _ = in_child(dry)
        print(json.dumps({"kind": kind, "counts": counts}), flush=True)
        for name in HOOKED:
            for k in range(1, counts[name] + 1):
                for when in ("before", "after"):
                    d, path = fresh(kind)
                    def cut():
                        hook((name, k, when))
                        save(kind, path, "B", n)
                        return "finished"
                    out, status = in_child(cut)
                    killed = os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
                    try:
                        got = which(kind, path, n)
                        save(kind, path, "C", n)  # the next save cleans what the killed one left
                        left = sorted(os.listdir(d))
                        ok = which(kind, path, n) == "C" and len(left) == 2
                        res = {"got": got, "clean": ok, "left": left}
                    except Exception as e:
                        res = {"got": "BAD " + type(e).__name__ + ": " + str(e)[:300]}
                    res.update(kind=kind, point=f"{when} {name} #{k}", killed=killed)
                    print(json.dumps(res), flush=True)
    print(json.dumps({"done": True}), flush=True)
""")


def _run_server(tmp_path: Path, kinds, n):
    script = tmp_path / "server.py"
    script.write_text(SERVER)
    proc = subprocess.run([sys.executable, str(script), str(tmp_path / "work"), ",".join(kinds), str(n)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = [json.loads(x) for x in proc.stdout.splitlines()]
    assert lines[-1] == {"done": True}
    return lines[:-1]


@pytest.mark.parametrize("kind", ["save", "writer", "document"])
def test_kill_at_every_step_of_the_commit_protocol(tmp_path, kind):
    results = _run_server(tmp_path, [kind], 5000)
    counts = results[0]["counts"]
    assert counts["rename"] == 2 and counts["fsync"] >= 3, counts  # data, descriptor; + the directory
    points = results[1:]
    assert len(points) == 2 * sum(counts.values())
    bad = [r for r in points if r["got"] not in ("A", "B") or not r["clean"] or not r["killed"]]
    assert not bad, [(r["point"], r["got"], r["killed"], r.get("left")) for r in bad]
    got = {r["point"]: r["got"] for r in points}
    # before the descriptor's rename (the 2nd) the old content is there, after it the new one
    assert got["before rename #2"] == "A" and got["after rename #2"] == "B"
    assert got["after rename #1"] == "A"  # new data complete and renamed, not yet referenced
    assert {r["got"] for r in points} == {"A", "B"}
    print(f"{kind}: {len(points)} kill points")


RANDOM_CHILD = CONTENT + textwrap.dedent("""
    import sys
    kind, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print("ready", flush=True)
    i = 0
    while True:
        save(kind, path, "AB"[i % 2], n)
        i += 1
""")


@pytest.mark.parametrize("kind", ["writer", "document"])
def test_sigkill_at_random_moments_leaves_old_or_new(tmp_path, kind):
    ns: dict = {}
    exec(CONTENT, ns)
    n = 2 << 20  # 16 MiB of int64 plus the rest: kills land mid-write too
    path = tmp_path / ("ckpt.json" if kind == "document" else "m.tl")
    start = time.perf_counter()
    ns["save"](kind, str(path), "A", n)
    seconds = time.perf_counter() - start
    script = tmp_path / "child.py"
    script.write_text(RANDOM_CHILD)
    rng = random.Random(6)
    seen = []
    for _ in range(12):
        proc = subprocess.Popen([sys.executable, str(script), kind, str(path), str(n)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            ready, _, _ = select.select([proc.stdout], [], [], 60)
            assert ready and proc.stdout.readline() == "ready\n", proc.stderr.read()
            time.sleep(rng.uniform(0, 3) * seconds)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        seen.append(ns["which"](kind, str(path), n))
    assert set(seen) <= {"A", "B"}
    ns["save"](kind, str(path), "C", n)
    assert ns["which"](kind, str(path), n) == "C"
    assert len(os.listdir(tmp_path)) == 3  # the child script, the document and its data file
