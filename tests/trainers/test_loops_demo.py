"""The training demo runs on CPU in seconds and leaves verifiable model files."""
import json
import re
import subprocess
import sys

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


def _table(lines, start):
    """The history table that starts at ``lines[start]`` (its header): the header and each epoch's line."""
    assert lines[start] == "epoch   training loss    validation  learning rate", lines[start:]
    end = start + 1
    while end < len(lines) and re.match(r"^\s*\d+  ", lines[end]):
        end += 1
    return lines[start:end]


def _cli(*args):
    p = subprocess.run([sys.executable, "-m", "tensorlist", *map(str, args)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return p.stdout.splitlines()


@pytest.mark.slow  # the real `tensorlist demo` and `tensorlist record`, each in a child
def test_demo_table_is_what_tensorlist_record_prints_of_the_same_file(tmp_path):
    demo = _cli("demo", "--dir", tmp_path)
    (at,) = [i for i, line in enumerate(demo) if line.startswith("learning curve of ")]
    final = re.match(r"learning curve of (\S+) \(epochs 1-4 warm-up, validation smoothed by 0.7; 5-8 SWA\)",
                     demo[at]).group(1)
    shown = _table(demo, at + 1)
    record = _cli("record", final)
    (header,) = [i for i, line in enumerate(record) if line.startswith("epoch ")]
    assert shown == _table(record, header)  # row for row, header included
    # and both are the file's record, read here from its JSON: epoch i + 1 is entry i
    with open(final, encoding="utf-8") as f:
        training = json.load(f)["metadata"]["training"]
    hist = training["history"]
    assert training["epochs"]["done"] == len(shown) - 1 == 8

    def cell(v):
        return "-" if v is None else f"{v:.6g}"

    for i, line in enumerate(shown[1:]):
        assert line.split(None, 3) == [str(i + 1), cell(hist["training_loss"][i]), cell(hist["validation"][i]),
                                       cell(hist["learning_rate"][i])]
    # the validation column holds what the loop judged each epoch by: the warm-up's smoothed loss
    # (the checkpoint's lamp curve, 0-based, newest first: [epoch, train, smoothed, raw]), then SWA's own
    curve = sorted(read_checkpoint(tmp_path / "training" / "checkpoint.json")["simple"]["learningCurve"])
    assert [e for e, *_ in curve] == [0, 1, 2, 3]
    assert hist["validation"][:4] == [smoothed for _, _, smoothed, _ in curve]
    assert any(smoothed != raw for _, _, smoothed, raw in curve)  # the smoothing shows in this run
    # the file summaries above the table number epochs alike
    assert "weights kind final after epoch 8" in "\n".join(demo)
