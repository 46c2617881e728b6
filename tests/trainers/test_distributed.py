"""Data-parallel training with two real CPU processes (gloo over loopback TCP)."""
import json
import os
import sys

import pytest
torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")

import tensorlist as tl
import tensorlist.loops as loops
from tensorlist.provenance.record import verify_model_file

from _paths import SUPPORT  # noqa: E402

SCRIPT = os.path.join(SUPPORT, "_ddp_script.py")
import _ddp_script  # noqa: E402
import _ranks  # noqa: E402

def _two_ranks(out, epochs, *extra):
    env = dict(os.environ, OMP_NUM_THREADS="1")
    with _ranks.Launch(2) as job:
        for r in range(2):
            job.spawn([sys.executable, SCRIPT, str(r), "2", str(job.port), str(out), str(epochs), *extra], env)
        for r, code in enumerate(job.wait(180)):
            assert code == 0, f"rank {r} ended with {code}:\n{job.output(r)[-4000:]}"


def test_two_process_ddp_matches_one_process_and_resumes_on_one_and_on_two(tmp_path):
    _two_ranks(tmp_path / "ddp", 3)
    files = sorted(os.listdir(tmp_path / "ddp"))
    assert files.count("checkpoint.json") == 1 and "final.json" in files
    assert not [f for f in files if f.endswith(".tmp")]
    doc = json.loads((tmp_path / "ddp" / "checkpoint.json").read_text())
    assert doc["type"] == "SimpleLoopState" and doc["epoch"] == 3
    assert [t["name"] for t in doc["model"]["tensors"]][0] == "0.weight"  # the module's names, not "module.*"
    # the same training on one process over the full batch gives the same weights (mean of equal halves)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = _ddp_script.data()
    res = loops.epochs(model, opt, [(x, y)], loss_fn=torch.nn.functional.mse_loss, max_epochs=3,
                       validation=[(x, y)], progress=False)
    ddp_final = tl.load(tmp_path / "ddp" / "final.json")
    for k, v in model.state_dict().items():
        assert torch.allclose(torch.from_numpy(ddp_final[k].copy()), v, atol=1e-5), k
    ddp_curve = [c for c in reversed(doc["learningCurve"])]
    for a, b in zip(ddp_curve, res.learning_curve):
        assert a[1] == pytest.approx(b[1], rel=1e-5) and a[3] == pytest.approx(b[3], rel=1e-5)
    # resume the distributed run's checkpoint on one process
    torch.manual_seed(1)
    m2 = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    res2 = loops.epochs(m2, opt2, [(x, y)], loss_fn=torch.nn.functional.mse_loss, max_epochs=4, validation=[(x, y)],
                        out_dir=tmp_path / "ddp", resume=True, progress=False)
    assert [c[0] for c in res2.learning_curve] == [0, 1, 2, 3]
    assert verify_model_file(tmp_path / "ddp" / "final.json").epochs.done == 4
    # and that one-process checkpoint resumes on two processes again
    _two_ranks(tmp_path / "ddp", 5, "--resume")
    doc = json.loads((tmp_path / "ddp" / "checkpoint.json").read_text())
    assert doc["epoch"] == 5 and [e[0] for e in doc["learningCurve"]] == [4, 3, 2, 1, 0]
    assert verify_model_file(tmp_path / "ddp" / "final.json").epochs.done == 5
