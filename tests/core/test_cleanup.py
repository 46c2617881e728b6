"""What killed saves leave behind is removed by the next save, never what a live save is using."""
import fcntl
import os

import numpy as np

import tensorlist as tl


def _names(d):
    return sorted(os.listdir(d))


def test_next_save_removes_stale_temp_and_orphan_data_files(tmp_path):
    path = tmp_path / "m.tl"
    tl.save(path, {"a": np.arange(3)})
    # what SIGKILLed saves leave: temp files and a data file no descriptor references
    stale = [".m.tl.0123abcd.data.89abcdef.tmp", ".m.tl.0123abcd.tmp", ".m.tl.data.0123abcd.tmp",
             "m.tl.deadbeef.data"]
    for n in stale:
        (tmp_path / n).write_bytes(b"x" * 100)
    unrelated = ["m.tl.notes", ".m.tlx.0123abcd.tmp", "other.tl.deadbeef.data", "m.tl.DEADBEEF.data"]
    for n in unrelated:
        (tmp_path / n).write_bytes(b"keep")
    tl.save(path, {"a": np.arange(4)})
    left = _names(tmp_path)
    assert not set(stale) & set(left)
    assert set(unrelated) <= set(left)
    with tl.open(path) as r:
        assert r["a"].tolist() == [0, 1, 2, 3]
        assert left == sorted(unrelated + ["m.tl", r.descriptor.location])


def test_files_of_a_live_save_are_kept(tmp_path):
    path = tmp_path / "m.tl"
    live = tmp_path / ".m.tl.0123abcd.data.89abcdef.tmp"
    live.write_bytes(b"in progress")
    fd = os.open(live, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a concurrent writer holds it
        tl.save(path, {"a": np.arange(3)})
        assert live.exists()
    finally:
        os.close(fd)
    tl.save(path, {"a": np.arange(3)})
    assert not live.exists()


def test_referenced_data_file_is_never_swept(tmp_path):
    path = tmp_path / "m.tl"
    for i in range(5):
        tl.save(path, {"a": np.full(3, i)})
        assert tl.load(path, verify=True)["a"].tolist() == [i] * 3
    assert len([n for n in _names(tmp_path) if n.endswith(".data")]) == 1
