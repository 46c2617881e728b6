"""The adapters and loops on a CUDA device (skipped, with the reason, where there is none)."""
import os

import pytest
torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")

import tensorlist.loops as loops
import tensorlist.torch as tt
from tensorlist.loops import read_checkpoint
from tensorlist.provenance.record import verify_model_file

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
F = torch.nn.functional


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_load_onto_cuda_bit_exact(tmp_path, dtype):
    m = torch.nn.Linear(7, 5).to(dtype)
    tt.save_module_state(tmp_path / "m.json", m)
    state = tt.load_state(tmp_path / "m.json", device="cuda")
    assert state["weight"].device.type == "cuda" and state["weight"].dtype == dtype
    assert torch.equal(state["weight"].cpu().view(torch.uint8), m.weight.detach().view(torch.uint8))
    g = torch.nn.Linear(7, 5).to(dtype).cuda()
    assert tt.load_module_state(tmp_path / "m.json", g).complete
    assert torch.equal(g.weight.cpu(), m.weight.detach())
    tt.save_module_state(tmp_path / "g.json", g)  # saving from the device
    assert torch.equal(tt.load_state(tmp_path / "g.json")["bias"], m.bias.detach())


def test_optimizer_state_on_cuda_continues_identically(tmp_path):
    torch.manual_seed(0)
    m = torch.nn.Linear(4, 3).cuda()
    opt = torch.optim.Adam(m.parameters(), lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        m(torch.ones(2, 4, device="cuda")).sum().backward()
        opt.step()
    tt.save_optimizer_state(tmp_path / "o.json", opt)
    m2 = torch.nn.Linear(4, 3).cuda()
    m2.load_state_dict(m.state_dict())
    opt2 = torch.optim.Adam(m2.parameters(), lr=1e-2)
    tt.load_optimizer_state(tmp_path / "o.json", opt2)
    assert opt2.state_dict()["state"][0]["exp_avg"].device.type == "cuda"
    for o, mm in ((opt, m), (opt2, m2)):
        o.zero_grad()
        mm(torch.ones(2, 4, device="cuda")).sum().backward()
        o.step()
    assert torch.equal(m.weight, m2.weight)


def _run(out, n, resume=False, kill_after=None):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 32), torch.nn.BatchNorm1d(32), torch.nn.ReLU(),
                                torch.nn.Dropout(0.3), torch.nn.Linear(32, 2))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 6, generator=g)
    y = (x[:, 0] > 0).long()
    train = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=32, shuffle=True)

    class Stop(Exception):
        pass

    def stop(state):
        if kill_after is not None and state.epoch == kill_after:
            raise Stop
    try:
        return loops.with_swa(model, opt, train, loss_fn=F.cross_entropy, warmup_epochs=n // 2, swa_epochs=n - n // 2,
                              validation=[(x, y)], swa_schedule=loops.ConstantSWA(0.5), out_dir=out, resume=resume,
                              device="cuda", progress=False, seed=0,
                              handlers={loops.Events.CHECKPOINT_SAVED: stop})
    except Stop:
        return None


def test_loops_on_cuda_resume_exactly(tmp_path):
    torch.use_deterministic_algorithms(True)
    try:
        once = _run(tmp_path / "once", 4)
        assert next(once.model.parameters()).device.type == "cuda"
        assert _run(tmp_path / "split", 4, kill_after=1) is None
        _run(tmp_path / "split", 4, resume=True)
    finally:
        torch.use_deterministic_algorithms(False)
    a, b = read_checkpoint(tmp_path / "once" / "checkpoint.json"), read_checkpoint(tmp_path / "split" / "checkpoint.json")
    assert a["swa"]["learningCurve"] == b["swa"]["learningCurve"]
    for k in a["swa"]["model"]:
        assert (a["swa"]["model"][k] == b["swa"]["model"][k]).all(), k
    for k in a["swa"]["optimizer"]:
        assert (a["swa"]["optimizer"][k] == b["swa"]["optimizer"][k]).all(), k
    assert verify_model_file(tmp_path / "once" / "final.json").epochs.done == 4
