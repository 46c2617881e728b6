"""Module and optimizer state files: strict/non-strict loads, exact optimizer round trips, records."""
import logging

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="module and optimizer state files need torch (pip install 'tensorlist[torch]')")

import tensorlist as tl  # noqa: E402
import tensorlist.torch as tt  # noqa: E402
from tensorlist.provenance.record import build_training_record, read_training_record, verify_model_file  # noqa: E402

# one torch thread: the _one_thread fixture of conftest.py


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4), torch.nn.Linear(4, 2))


def _record(model, opt):
    return build_training_record(optimizer=opt, model=model, epochs_asked=1, epochs_done=1, training_loss=[0.5],
                                 train_loader={"batch_size": 4, "shuffle": False, "drop_last": False,
                                               "sampler": None})


def test_module_state_round_trip_zero_copy_and_buffers(tmp_path):
    a, b = _net(), _net()
    for p in b.parameters():
        p.data.add_(1.0)
    a[1].running_mean.fill_(0.25)
    path = tmp_path / "m.json"
    tt.save_module_state(path, a)
    res = tt.load_module_state(path, b)
    assert res.complete and "1.running_mean" in res.loaded and "1.num_batches_tracked" in res.loaded
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    state = tt.load_state(path)
    assert torch.equal(state["0.weight"], a[0].weight.detach())
    assert not state["0.weight"].numpy().flags.owndata  # a view of the mapping, not a copy


def test_load_state_with_mmap_copy_gives_writable_tensors_that_never_change_the_file(tmp_path):
    path = tmp_path / "m.tl"
    tl.save(path, {"w": np.arange(6, dtype=np.float32), "h": np.ones(4, np.float16)})
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for state in (tt.load_state(path, mmap="copy"), tl.load(path, device="cpu", mmap="copy")):
        state["w"].add_(1)  # in place, on the copy-on-write pages
        assert state["w"].tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        assert not state["w"].numpy().flags.owndata  # still a view of the mapping
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    for device in (None, "cpu", "meta"):
        with pytest.raises(ValueError, match="mmap must be True, False or 'copy', not 'yes'"):
            tt.load_state(path, device=device, mmap="yes")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_states_load_bit_exact(tmp_path, dtype):
    m = torch.nn.Linear(5, 3).to(dtype)
    path = tmp_path / "h.json"
    tt.save_module_state(path, m)
    state = tt.load_state(path)
    assert state["weight"].dtype == dtype
    assert torch.equal(state["weight"].view(torch.int16), m.weight.detach().view(torch.int16))
    m2 = torch.nn.Linear(5, 3).to(dtype)
    tt.load_module_state(path, m2)
    assert torch.equal(m2.weight.view(torch.int16), m.weight.detach().view(torch.int16))


def test_load_onto_device_moves_module(tmp_path):
    m = torch.nn.Linear(2, 2)
    tt.save_module_state(tmp_path / "m.json", m)
    m2 = torch.nn.Linear(2, 2)
    tt.load_module_state(tmp_path / "m.json", m2, device="cpu")
    assert torch.equal(m2.weight, m.weight)
    assert tt.load_state(tmp_path / "m.json", device="cpu")["bias"].device.type == "cpu"


def test_strict_load_refuses_and_leaves_module_untouched(tmp_path):
    src = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 2))
    tt.save_module_state(tmp_path / "m.json", src)
    dst = _net()
    before = {k: v.clone() for k, v in dst.state_dict().items()}
    with pytest.raises(KeyError, match="missing in file.*1.running_mean"):
        tt.load_module_state(tmp_path / "m.json", dst)
    for k, v in dst.state_dict().items():
        assert torch.equal(v, before[k])
    wrong = torch.nn.Sequential(torch.nn.Linear(3, 5), torch.nn.Linear(5, 2))
    with pytest.raises(ValueError, match=r"wrong shapes: 0.weight: file \[4, 3\] vs module \[5, 3\]"):
        tt.load_module_state(tmp_path / "m.json", wrong)


def test_non_strict_load_reports_everything_and_warns(tmp_path, caplog):
    src = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Linear(4, 7))
    tt.save_module_state(tmp_path / "m.json", src)
    dst = _net()
    with caplog.at_level(logging.WARNING, logger="tensorlist.torch"):
        res = tt.load_module_state(tmp_path / "m.json", dst, strict=False)
    assert set(res.loaded) == {"0.weight", "0.bias"}
    assert "1.running_var" in res.missing and "2.weight" in res.missing
    assert res.unexpected == ()
    assert res.mismatched == (("1.weight", (7, 4), (4,)), ("1.bias", (7,), (4,)))
    assert not res.complete and "partial load" in caplog.text
    assert torch.equal(dst[0].weight, src[0].weight)


def test_model_file_with_record(tmp_path):
    m = _net()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    tt.save_module_state(tmp_path / "m.json", m, training=_record(m, opt), dataset_params={"name": "toy"})
    rec = verify_model_file(tmp_path / "m.json")
    assert rec.epochs.done == 1
    with pytest.raises(ValueError, match="both"):
        tt.save_module_state(tmp_path / "x.json", m, training=_record(m, opt))


def _train(opt_factory, steps=3):
    m = _net()
    opt = opt_factory(m)
    for i in range(steps):
        opt.zero_grad()
        m(torch.randn(5, 3, generator=torch.Generator().manual_seed(i))).pow(2).mean().backward()
        opt.step()
    return m, opt


OPTS = {
    "adam": lambda m: torch.optim.Adam(m.parameters(), lr=1e-2, amsgrad=True),
    "sgd": lambda m: torch.optim.SGD([{"params": m[0].parameters(), "lr": 0.1},
                                      {"params": m[2].parameters()}], lr=0.01, momentum=0.9, nesterov=True),
    "adamw": lambda m: torch.optim.AdamW(m.parameters(), lr=1e-3, betas=(0.8, 0.99)),
    "rmsprop": lambda m: torch.optim.RMSprop(m.parameters(), lr=1e-3, centered=True),
}


@pytest.mark.parametrize("name", sorted(OPTS))
def test_optimizer_state_round_trips_exactly_and_training_continues_identically(tmp_path, name):
    m, opt = _train(OPTS[name])
    path = tmp_path / "opt.json"
    tt.save_optimizer_state(path, opt)
    m2 = _net()
    m2.load_state_dict(m.state_dict())
    opt2 = OPTS[name](m2)
    tt.load_optimizer_state(path, opt2)
    a, b = opt.state_dict(), opt2.state_dict()
    assert a["param_groups"] == b["param_groups"]
    for pid in a["state"]:
        for k, v in a["state"][pid].items():
            w = b["state"][pid][k]
            assert (torch.equal(v, w) and v.dtype == w.dtype) if isinstance(v, torch.Tensor) else v == w
    for o, mm in ((opt, m), (opt2, m2)):  # the loaded state must be writable: keep training
        o.zero_grad()
        mm(torch.ones(5, 3)).sum().backward()
        o.step()
    for p, q in zip(m.parameters(), m2.parameters()):
        assert torch.equal(p, q)


def test_optimizer_mismatch_is_refused_and_optimizer_unchanged(tmp_path):
    m, opt = _train(OPTS["adam"])
    tt.save_optimizer_state(tmp_path / "o.json", opt)
    m2 = torch.nn.Linear(3, 2)
    opt2 = torch.optim.Adam(m2.parameters())
    with pytest.raises(ValueError, match="group 0 saved with 6 parameters, the optimizer has 2"):
        tt.load_optimizer_state(tmp_path / "o.json", opt2)
    assert opt2.state_dict()["state"] == {}
    m3 = _net()
    sgd = torch.optim.SGD(m3.parameters(), lr=0.1)
    with pytest.raises(ValueError, match="another optimizer class"):
        tt.load_optimizer_state(tmp_path / "o.json", sgd)
    tt.save_module_state(tmp_path / "m.json", m)
    with pytest.raises(ValueError, match="not an optimizer state file"):
        tt.load_optimizer_state(tmp_path / "m.json", opt)


def test_optimizer_state_parts_json_handles_non_finite_and_tuples():
    sd = {"state": {0: {"step": 3, "x": float("inf"), "t": (1, 2)}}, "param_groups": [{"params": [0], "lr": 0.1}]}
    tensors, meta = tt.optimizer_state_parts(sd)
    back = tt.optimizer_state_from_parts(tensors, meta)
    assert back == sd
