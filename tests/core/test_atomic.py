"""Atomic, durable replacement: kill -9 mid-save, failed saves, readers of the old file, clean-up.

FORMAT.md 5.3: whenever the writing process dies, the path loads either the complete old content or
the complete new content; a failed save leaves the old file and no temporary files behind.
"""
import gc
import os
import random
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import tensorlist as tl
from tensorlist._storage import commit as _commit

# Two distinguishable contents, built the same way in this process and in the children.
CONTENT_SRC = textwrap.dedent("""
    import numpy as np

    def content(which, n):
        if which == "A":
            a = np.arange(n, dtype=np.uint32)
            a *= np.uint32(2654435761)
            return {"a": a, "small": np.arange(10, dtype=np.float64)}, {"which": "A", "n": n}
        b0 = np.arange(n // 2, dtype=np.uint32) ^ np.uint32(0x5A5A5A5A)
        b1 = np.arange(n // 2, dtype=np.float32)
        return {"b0": b0, "b1": b1, "b2": np.int64(-3)}, {"which": "B", "n": n}
""")
_ns: dict = {}
exec(CONTENT_SRC, _ns)
content = _ns["content"]

CHILD_SRC = CONTENT_SRC + textwrap.dedent("""
    import sys
    import tensorlist as tl

    path, first, n, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    contents = {w: content(w, n) for w in "AB"}
    order = [first, "B" if first == "A" else "A"]
    print("ready", flush=True)
    for i in range(rounds):
        tensors, meta = contents[order[i % 2]]
        tl.save(path, tensors, metadata=meta)
        print("saved", order[i % 2], flush=True)
""")


def _child(tmp_path: Path, path: Path, first: str, n: int, rounds: int) -> subprocess.Popen:
    script = tmp_path / "child.py"
    if not script.exists():
        script.write_text(CHILD_SRC)
    return subprocess.Popen([sys.executable, str(script), str(path), first, str(n), str(rounds)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_ready(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    assert ready, "child did not start"
    line = proc.stdout.readline()
    assert line == "ready\n", line + proc.stderr.read()


def _which(path: Path, n: int) -> str:
    """Loads ``path`` with checksums verified and returns which content it holds, exactly."""
    out = tl.load(path, verify=True)
    meta = tl.open(path).metadata
    expected, expected_meta = content(meta["which"], n)
    assert meta == expected_meta
    assert list(out) == list(expected)
    for k, v in expected.items():
        v = np.asarray(v)
        assert out[k].dtype == v.dtype and out[k].shape == v.shape
        assert np.array_equal(out[k], v), k
    return meta["which"]


def _saved_lines(proc: subprocess.Popen, count: int, timeout: float = 60.0) -> None:
    """Waits until the child has reported ``count`` more completed saves."""
    for _ in range(count):
        ready, _, _ = select.select([proc.stdout], [], [], timeout)
        assert ready, "child did not finish a save"
        line = proc.stdout.readline()
        assert line.startswith("saved "), line + proc.stderr.read()


@pytest.mark.slow  # children killed mid-save, about 20 s
def test_kill_9_during_save_leaves_old_or_new(tmp_path):
    """Each round kills a saving child at a point that does not depend on this machine's speed.

    Rounds alternate between killing during the child's first save (the old content must remain)
    and killing after the child reported a completed save (the new content, or the next one if
    that save also committed), each either at once or after a random part of a save's duration.
    Kills at once after ``ready`` cannot land after the commit (32 MiB and an fsync are still
    ahead), kills at once after ``saved`` cannot land after the next commit, so both outcomes are
    seen whatever the timing; the random delays put the other kills anywhere in a save.
    """
    n = 8 << 20  # 32 MiB per content
    path = tmp_path / "state.tl"
    tensors, meta = content("A", n)
    start = time.perf_counter()
    tl.save(path, tensors, metadata=meta)
    save_seconds = time.perf_counter() - start
    rng = random.Random(20240229)
    changed, left_temporaries = [], []
    for i in range(30):
        current = _which(path, n)
        proc = _child(tmp_path, path, "B" if current == "A" else "A", n, 1000)
        try:
            _wait_ready(proc)
            _saved_lines(proc, i % 2)
            time.sleep(0 if i % 3 == 0 else rng.uniform(0, 1.5) * save_seconds)
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL
        changed.append(_which(path, n) != current)
        left_temporaries.append(any(f.endswith(".tmp") for f in os.listdir(tmp_path)))
        proc.stdout.close()
        proc.stderr.close()
    # kills landed before a commit (the old content stayed) and after one (the file changed) ...
    assert set(changed) == {False, True}, changed
    # ... and in the middle of writing: a killed save leaves its temporary files behind
    assert any(left_temporaries), left_temporaries
    # whatever the kills left behind, the next successful save cleans up after itself
    tensors, meta = content("B", n)
    tl.save(path, tensors, metadata=meta)
    assert _which(path, n) == "B"
    assert [f for f in os.listdir(tmp_path) if f.endswith(".tmp")] == []


@pytest.mark.slow  # two writer processes
def test_two_concurrent_writers_end_with_one_complete_file(tmp_path):
    n = 1 << 16
    path = tmp_path / "shared.tl"
    procs = [_child(tmp_path, path, first, n, 15) for first in "AB"]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        assert out.count("saved") == 15
    assert _which(path, n) in {"A", "B"}
    leftovers = [f for f in os.listdir(tmp_path) if f.endswith(".tmp")]
    assert leftovers == []


# --- failures leave the old file -------------------------------------------------------------


NO_CODE = "(cannot be stored|has no tensorlist dataType code)"


def _listing(directory: Path):
    return sorted((f, (directory / f).stat().st_mtime_ns, (directory / f).stat().st_size)
                  for f in os.listdir(directory))


@pytest.fixture
def old_file(tmp_path):
    path = tmp_path / "m.tl"
    tl.save(path, {"w": np.arange(6, dtype=np.float32)}, metadata={"v": "old"})
    return path


def _assert_old(path: Path):
    assert tl.load(path, verify=True)["w"].tolist() == [0, 1, 2, 3, 4, 5]
    assert tl.open(path).metadata == {"v": "old"}


def test_exception_in_writer_block_leaves_old_file_and_no_temp_files(old_file):
    before = _listing(old_file.parent)
    with pytest.raises(RuntimeError, match="boom"):
        with tl.Writer(old_file, metadata={"v": "new"}) as w:
            w.add("w", np.zeros(1 << 20, np.float32))
            r = w.reserve("r", (1000,), np.float64)
            r[:] = 1
            raise RuntimeError("boom")
    assert _listing(old_file.parent) == before
    _assert_old(old_file)
    with pytest.raises(ValueError, match="aborted"):
        w.add("x", np.zeros(1))


def test_bad_value_in_writer_block_aborts(old_file):
    before = _listing(old_file.parent)
    with pytest.raises(TypeError, match=r"tensor 'bad'.*" + NO_CODE):
        with tl.Writer(old_file) as w:
            w.add("ok", np.ones(10))
            w.add("bad", np.array([object()]))
    assert _listing(old_file.parent) == before
    _assert_old(old_file)


def test_writer_dropped_without_close_leaves_nothing(old_file):
    before = _listing(old_file.parent)
    w = tl.Writer(old_file)
    w.add("w", np.ones(3))
    assert len(os.listdir(old_file.parent)) > len(before)  # its temporary data file
    w.abort()
    assert _listing(old_file.parent) == before
    w2 = tl.Writer(old_file)
    w2.add("w", np.ones(3))
    del w2  # garbage-collected while open: aborted, never committed
    assert _listing(old_file.parent) == before
    _assert_old(old_file)


@pytest.mark.parametrize(
    "tensors, error, match",
    [
        ({"w": np.ones(3), "bad": np.array([object(), 1])}, TypeError, r"tensor 'bad'.*" + NO_CODE),
        ({"w": np.array(["abc"])}, TypeError, r"tensor 'w'.*" + NO_CODE),
        ({"w": np.zeros(2, dtype=[("a", "<i4"), ("b", "<f4")])}, TypeError, r"tensor 'w'.*" + NO_CODE),
        ({1: np.ones(3)}, TypeError, "tensor names must be str"),
        ("not tensors", TypeError, "must be a mapping name -> array or a sequence"),
        ([np.ones(3), np.array([None])], TypeError, "tensor 1.*" + NO_CODE),
    ],
    ids=["object", "unicode", "structured", "int-name", "string", "positional-object"],
)
def test_failing_save_raises_before_touching_the_old_file(old_file, tensors, error, match):
    before = _listing(old_file.parent)
    with pytest.raises(error, match=match):
        tl.save(old_file, tensors)
    assert _listing(old_file.parent) == before
    _assert_old(old_file)


def test_save_over_a_directory_is_refused(tmp_path):
    (tmp_path / "d").mkdir()
    with pytest.raises(IsADirectoryError, match="is a directory"):
        tl.save(tmp_path / "d", [np.ones(1)])
    assert os.listdir(tmp_path) == ["d"] and os.listdir(tmp_path / "d") == []


@pytest.mark.slow  # a child with a file-size limit
@pytest.mark.parametrize("limit_mib,tensor_mib,threads", [(1, [4], 1), (16, [12, 12], 4)],
                         ids=["one-thread", "checksum-helpers"])
def test_write_error_mid_save_leaves_old_file_and_no_temp_files(old_file, limit_mib, tensor_mib, threads):
    """A write that fails half-way (here: a file-size limit, as on a full disk) cleans up.

    With 24 MiB and four threads, helper threads checksum the tensors while the writer fails: the
    error still comes back, and nothing is left behind.
    """
    before = _listing(old_file.parent)
    script = textwrap.dedent(f"""
        import errno, resource, signal
        import numpy as np, tensorlist as tl
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit_mib} << 20, {limit_mib} << 20))
        try:
            tl.save({str(old_file)!r}, {{f"t{{i}}": np.ones(m << 20, np.uint8) for i, m in enumerate({tensor_mib})}},
                    threads={threads})
        except OSError as e:
            print("OSError", errno.errorcode[e.errno])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "OSError EFBIG", out.stdout + out.stderr
    assert _listing(old_file.parent) == before
    _assert_old(old_file)


# --- readers and clean-up -------------------------------------------------------------------


def test_readers_keep_their_old_data_after_a_replace(tmp_path):
    path = tmp_path / "r.tl"
    old = np.arange(100_000, dtype=np.int64)
    tl.save(path, {"x": old, "y": old[:10].copy()})
    old_data = tmp_path / tl.open(path).descriptor.location
    mapped = tl.open(path)
    view = mapped["x"]
    pread = tl.open(path, mmap=False)
    loaded = tl.load(path)
    tl.save(path, {"x": -old, "y": np.zeros(10, np.int64)})
    assert not old_data.exists()  # the replaced data file is gone from the directory...
    assert np.array_equal(view, old) and np.array_equal(loaded["x"], old)  # ...but still mapped
    assert np.array_equal(mapped["y"], old[:10])  # an open reader still reads the old file
    assert np.array_equal(pread["x"], old) and np.array_equal(pread.to_dict()["y"], old[:10])
    mapped.close()
    pread.close()
    assert np.array_equal(view, old)
    assert np.array_equal(tl.load(path)["x"], -old)


def test_replacing_deletes_the_previous_data_file(tmp_path):
    path = tmp_path / "m.tl"
    for i in range(10):
        tl.save(path, {"w": np.full(1000, i, np.int32)}, metadata={"i": i})
        files = sorted(os.listdir(tmp_path))
        assert len(files) == 2 and files[0] == "m.tl", files
    assert files[1] == tl.open(path).descriptor.location
    assert tl.load(path)["w"][0] == 9
    for i in range(10):
        with tl.Writer(path) as w:
            w.add("w", np.full(10, i))
        assert len(os.listdir(tmp_path)) == 2
    doc = tmp_path / "doc.json"
    for i in range(10):
        tl.save_document(doc, {"a": tl.Tensors([np.full(3, i)]), "b": [tl.Tensors({"z": np.ones(i)})]})
    assert len([f for f in os.listdir(tmp_path) if f.startswith("doc.json")]) == 2
    assert tl.load(doc, pointer="/a")["0"].tolist() == [9, 9, 9]


def test_replacing_never_deletes_a_data_file_it_did_not_name(tmp_path):
    (tmp_path / "precious.data").write_bytes(np.arange(4, dtype="<f4").tobytes())
    (tmp_path / "m.tl.data.bak").write_bytes(b"x")
    path = tmp_path / "m.tl"
    path.write_text('{"tensors":[{"dims":[4],"dataType":6,"byteOffset":0,"byteLength":16}],'
                    '"location":"precious.data","byteOffset":0,"byteLength":16}')
    tl.save(path, [np.ones(2)])
    assert (tmp_path / "precious.data").read_bytes() == np.arange(4, dtype="<f4").tobytes()
    path.write_text('{"location":"m.tl.data.bak","byteOffset":0,"byteLength":0}')
    tl.save(path, [np.ones(2)])
    assert (tmp_path / "m.tl.data.bak").exists()
    assert tl.load(path)["0"].tolist() == [1, 1]


def test_an_abandoned_writer_is_discarded_even_once_teardown_cleared_the_modules(tmp_path, monkeypatch):
    """A Writer left open is aborted by its __del__, which may run at interpreter exit."""
    w = tl.Writer(tmp_path / "w.tl")
    w.add("a", np.ones(3))
    w.reserve("r", (4,), np.float32)
    assert list(tmp_path.iterdir())  # its temporary data file
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    monkeypatch.setattr(_commit, "os", None)  # what teardown does to module globals
    del w
    gc.collect()
    monkeypatch.undo()
    assert unraisable == []
    assert list(tmp_path.iterdir()) == []


def test_sweep_unowned_removes_only_the_data_of_documents_that_are_gone(tmp_path):
    """Data whose document another tool removed or replaced by a link goes; everything else stays."""
    for name in ("kept.tl", "gone.tl", "linked.tl"):
        tl.save(tmp_path / name, {"w": np.arange(3)})
    data = {n: next(f for f in os.listdir(tmp_path) if f.startswith(n + ".")) for n in ("kept.tl", "gone.tl",
                                                                                      "linked.tl")}
    os.remove(tmp_path / "gone.tl")
    os.remove(tmp_path / "linked.tl")
    os.symlink("kept.tl", tmp_path / "linked.tl")
    (tmp_path / "mine.data").write_bytes(b"a user's own file")  # not a name tensorlist gives
    (tmp_path / "orphan.00000000.dat").write_bytes(b"x")
    assert sorted(_commit.sweep_unowned(str(tmp_path))) == sorted([data["gone.tl"], data["linked.tl"]])
    assert sorted(os.listdir(tmp_path)) == sorted(["kept.tl", data["kept.tl"], "linked.tl", "mine.data",
                                                   "orphan.00000000.dat"])
    np.testing.assert_array_equal(tl.load(tmp_path / "linked.tl")["w"], np.arange(3))


def test_sweep_unowned_waits_for_no_save_and_spares_a_live_one(tmp_path):
    """While a save holds the directory (shared lock), the sweep removes nothing; a data file locked by its save stays."""
    import fcntl
    tl.save(tmp_path / "a.tl", {"w": np.arange(3)})
    os.remove(tmp_path / "a.tl")
    fd = os.open(tmp_path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        assert _commit.sweep_unowned(str(tmp_path)) == []
    finally:
        os.close(fd)
    (name,) = os.listdir(tmp_path)
    held = os.open(tmp_path / name, os.O_RDONLY)
    try:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert _commit.sweep_unowned(str(tmp_path)) == []
    finally:
        os.close(held)
    assert _commit.sweep_unowned(str(tmp_path)) == [name] and os.listdir(tmp_path) == []
