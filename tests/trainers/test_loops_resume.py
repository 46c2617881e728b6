"""Exact resume: N epochs in one go == k epochs, SIGKILL mid-epoch, resume for the rest (bit-identical)."""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")

import tensorlist as tl
from tensorlist.loops import read_checkpoint
from tensorlist.provenance.record import verify_model_file
from _paths import SUPPORT  # noqa: E402

SCRIPT = os.path.join(SUPPORT, "_loop_script.py")


def _run(out, mode, n, kill_at=None, resume=False):
    args = [sys.executable, SCRIPT, str(out), mode, str(n), "-" if kill_at is None else str(kill_at)]
    if resume:
        args.append("--resume")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=240)


def _flat(doc, prefix=""):
    """Every array in a loaded checkpoint, by JSON path."""
    out = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k in ("training", "modelMetadata", "dataset_params"):
                continue
            out.update(_flat(v, f"{prefix}/{k}"))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(_flat(v, f"{prefix}/{i}"))
    elif isinstance(doc, np.ndarray):
        out[prefix] = doc
    else:
        out[prefix] = doc
    return out


@pytest.mark.parametrize("mode,n,kill_at", [("simple", 5, 14), ("simple_then_swa", 6, 26), ("swa", 4, 9)])
def test_resume_after_sigkill_is_bit_identical(tmp_path, mode, n, kill_at):
    once, killed = tmp_path / "once", tmp_path / "killed"
    r = _run(once, mode, n)
    assert r.returncode == 0, r.stderr
    r = _run(killed, mode, n, kill_at=kill_at)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not (killed / "final.json").exists()
    partial = read_checkpoint(killed / "checkpoint.json")  # the last complete checkpoint loads
    assert partial["type"] == json.loads((once / "checkpoint.json").read_text())["type"]
    r = _run(killed, mode, n, resume=True)
    assert r.returncode == 0, r.stderr
    a, b = _flat(read_checkpoint(once / "checkpoint.json")), _flat(read_checkpoint(killed / "checkpoint.json"))
    assert a.keys() == b.keys()
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], k
    fa, fb = tl.load(once / "final.json"), tl.load(killed / "final.json")
    assert all(np.array_equal(fa[k], fb[k]) for k in fa) and fa.keys() == fb.keys()
    ra, rb = verify_model_file(once / "final.json"), verify_model_file(killed / "final.json")
    assert ra.history == rb.history and ra.epochs.done == n
    assert ra.weights.sha256 == rb.weights.sha256
