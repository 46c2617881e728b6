"""The training demo runs on CPU in seconds and leaves verifiable model files."""
import json

import pytest

torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")

from tensorlist.loops import read_checkpoint
from tensorlist.loops.demo import moving_patterns, run_demo
from tensorlist.provenance.record import verify_model_file


def test_moving_patterns_directions():
    x, y = moving_patterns(8, seed=3)
    assert x.shape == (8, 5, 1, 8, 8) and set(y.tolist()) <= {0, 1, 2, 3}
    k = 0
    centre = [(x[k, t, 0] > 0.5).nonzero().float().mean(0) for t in range(5)]
    step = centre[1] - centre[0]
    expected = {0: (0, 1), 1: (0, -1), 2: (1, 0), 3: (-1, 0)}[int(y[k])]
    assert tuple(int(v) for v in step.round()) == expected


def test_run_demo(tmp_path):
    lines = []
    out = run_demo(str(tmp_path), warmup_epochs=2, swa_epochs=2, say=lines.append)
    text = "\n".join(lines)
    assert out["seconds"] < 60
    assert set(out["files"]) == {"final", "checkpoint", "best_validation"}
    for kind in ("final", "best_validation"):
        assert verify_model_file(out["files"][kind]).weights.kind == kind
    assert json.loads((tmp_path / "checkpoint.json").read_text())["type"] == "SimpleThenSWALoopState"
    assert read_checkpoint(tmp_path / "checkpoint.json")["swa"]["epoch"] == 2
    assert "learning curve" in text and "final.json" in text and "record:" in text
    assert len(out["learning_curve"]) == 4
