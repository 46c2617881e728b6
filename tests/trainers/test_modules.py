"""BigDL-style utilities and ConvLSTMPeephole (shapes, gradients, a hand-computed step)."""
import pytest

torch = pytest.importorskip("torch", reason="tensorlist.loops.nn needs torch (pip install 'tensorlist[torch]')")
import torch.nn.functional as F  # noqa: E402

import tensorlist as tl  # noqa: E402
from tensorlist.loops import nn as tnn
from tensorlist.provenance.record import build_training_record, verify_model_file  # noqa: E402

# one torch thread: the _one_thread fixture of conftest.py


def _net(seed=0, out=3):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.BatchNorm1d(6), torch.nn.ReLU(), torch.nn.Linear(6, out))


def test_load_model_weights_by_layer_name():
    a, b = _net(0), _net(1)
    a[1].running_mean.fill_(0.5)
    res = tnn.load_model_weights(b, a)
    assert res.complete and "1.running_mean" in res.loaded
    for (k, v), w in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(v, w), k
    c = _net(2, out=5)
    before = c[0].weight.clone()
    with pytest.raises(ValueError, match=r"wrong shape 3.weight: file \[3, 6\] vs module \[5, 6\]"):
        tnn.load_model_weights(c, a)
    assert torch.equal(c[0].weight, before)
    res = tnn.load_model_weights(c, a, match_all=False)
    assert torch.equal(c[0].weight, a[0].weight) and [m[0] for m in res.mismatched] == ["3.weight", "3.bias"]
    extra = torch.nn.Sequential(torch.nn.Linear(4, 6))
    res = tnn.load_model_weights(extra, a, match_all=True)  # dst layers all found: extra src layers reported
    assert res.unexpected and "3.weight" in res.unexpected


def test_parameters_table_and_extra_parameters():
    m = _net()
    t = tnn.parameters_table(m)
    assert sorted(t) == ["0", "1", "3"] and t["0"]["weight"] is m[0].weight
    extra = tnn.get_extra_parameters(m)
    assert len(extra) == 2 and extra[0] is m[1].running_mean
    tnn.set_extra_parameters(m, [torch.ones(6), torch.full((6,), 2.0)])
    assert torch.equal(m[1].running_var, torch.full((6,), 2.0))
    with pytest.raises(ValueError, match="has 2 extra parameters, got 1"):
        tnn.set_extra_parameters(m, [torch.ones(6)])
    with pytest.raises(ValueError, match=r"extra parameter 1 has shape \[6\], got \[5\]"):
        tnn.set_extra_parameters(m, [torch.ones(6), torch.ones(5)])


def test_freeze_unfreeze_by_names_and_globs():
    m = _net()
    tnn.freeze(m, ["0"])
    assert not m[0].weight.requires_grad and m[3].weight.requires_grad
    tnn.freeze(m, "*.bias")
    assert not m[3].bias.requires_grad and m[3].weight.requires_grad
    tnn.unfreeze(m, "[03]")
    assert all(p.requires_grad for p in list(m[0].parameters()) + list(m[3].parameters()))
    tnn.freeze(m)
    assert not any(p.requires_grad for p in m.parameters())
    tnn.unfreeze(m)
    assert all(p.requires_grad for p in m.parameters())
    with pytest.raises(KeyError, match="no layer or parameter matches"):
        tnn.freeze(m, "decoder")


def test_predict_and_evaluate_in_batches():
    m = _net()
    x = torch.randn(10, 4)
    y = torch.randint(0, 3, (10,))
    m.train()
    out = tnn.predict(m, x, batch_size=3)
    assert out.shape == (10, 3) and m.training
    m.eval()
    with torch.no_grad():
        ref = m(x)
    assert torch.allclose(out, ref, atol=1e-6)
    assert torch.equal(tnn.predict_class(m, (x, y), batch_size=4), ref.argmax(1))
    r = tnn.evaluate(m, (x, y), [tnn.Loss(F.cross_entropy), tnn.Top1Accuracy()], batch_size=3)
    assert r["Loss"].count == 10 and r["Loss"].value == pytest.approx(float(F.cross_entropy(ref, y)), rel=1e-5)
    assert r["Top1Accuracy"].value == pytest.approx(float((ref.argmax(1) == y).float().mean()))
    ds = torch.utils.data.TensorDataset(x, y)
    assert tnn.evaluate(m, ds, batch_size=4)["Top1Accuracy"] == r["Top1Accuracy"]


def test_save_module_and_load_weights(tmp_path):
    m = _net()
    path = tmp_path / "m.json"
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    rec = build_training_record(optimizer=opt, model=m, epochs_asked=1, epochs_done=0, training_loss=[],
                                train_loader={"batch_size": 1, "shuffle": False, "drop_last": False, "sampler": None})
    tnn.save_module(m, path, training=rec, dataset_params={"name": "x"})
    verify_model_file(path)
    assert tl.open(path).metadata["module"] == "torch.nn.modules.container.Sequential"
    with pytest.raises(FileExistsError, match="overwrite=True"):
        tnn.save_module(m, path)
    tnn.save_weights(m, path, overwrite=True)
    m2 = _net(3)
    assert tnn.load_weights(m2, path).complete
    assert torch.equal(m2[3].weight, m[3].weight)
    with pytest.raises(KeyError, match="missing in file"):
        tnn.load_weights(torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Linear(6, 3), torch.nn.Linear(3, 3)),
                         path)


def test_save_module_to_a_url():
    m = _net()
    tnn.save_module(m, "memory://tests/modules/net.json", overwrite=True)
    assert set(tl.load("memory://tests/modules/net.json")) == set(m.state_dict())


@pytest.mark.filterwarnings("ignore:Using padding='same' with even kernel lengths")
@pytest.mark.parametrize("cls,spatial", [(tnn.ConvLSTMPeephole, (7, 6)), (tnn.ConvLSTMPeephole3D, (3, 4, 5))])
def test_conv_lstm_shapes(cls, spatial):
    m = cls(2, 5, kernel_i=3, kernel_c=3, stride=-1)
    x = torch.randn(2, 4, 2, *spatial)
    out = m(x)
    assert out.shape == (2, 4, 5, *spatial)  # stride -1: SAME, spatial shape kept
    h, c = m.last_state
    assert torch.equal(out[:, -1], h) and c.shape == h.shape
    assert isinstance(m.cell, tnn.ConvLSTMPeepholeCell)
    even = cls(2, 3, kernel_i=2, kernel_c=4)
    assert even(x).shape == (2, 4, 3, *spatial)
    strided = cls(2, 3, kernel_i=3, kernel_c=3, stride=2, padding=1)
    assert strided(x).shape[3:] == tuple((s + 1) // 2 for s in spatial)
    with pytest.raises(ValueError, match="dimensions"):
        m(torch.randn(2, 2, *spatial))


def test_conv_lstm_gradients():
    torch.manual_seed(0)
    m = tnn.ConvLSTMPeephole(1, 2, kernel_i=3, kernel_c=3).double()
    x = torch.randn(1, 2, 1, 4, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda inp: m(inp), (x,), eps=1e-6, atol=1e-5)
    m(x).sum().backward()
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in m.parameters())


def test_conv_lstm_step_by_hand():
    torch.manual_seed(0)
    cell = tnn.ConvLSTMPeepholeCell(2, 3, kernel_i=3, kernel_c=1).double()
    x = torch.randn(1, 2, 4, 4, dtype=torch.float64)
    h = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    c = torch.randn(1, 3, 4, 4, dtype=torch.float64)
    wx, bx, wh = cell.conv_x.weight, cell.conv_x.bias, cell.conv_h.weight
    sig = torch.sigmoid
    with torch.no_grad():
        out, (h2, c2) = cell(x, (h, c))

        def gate(k):
            sl = slice(3 * k, 3 * k + 3)
            return F.conv2d(x, wx[sl], bx[sl], padding=1) + F.conv2d(h, wh[sl])

        i = sig(gate(0) + cell.w_ci * c)
        f = sig(gate(1) + cell.w_cf * c)
        c_ref = f * c + i * torch.tanh(gate(2))
        o = sig(gate(3) + cell.w_co * c_ref)
        h_ref = o * torch.tanh(c_ref)
    assert torch.allclose(c2, c_ref, atol=1e-12) and torch.allclose(h2, h_ref, atol=1e-12)
    assert out is h2
    # one element by plain arithmetic: a 1x1 hidden kernel at a corner pixel (zero padding)
    with torch.no_grad():
        gi = sum(wx[0, ch, a, b] * x[0, ch, a - 1, b - 1] for ch in range(2) for a in range(1, 3) for b in range(1, 3))
        gi = gi + bx[0] + sum(wh[0, ch, 0, 0] * h[0, ch, 0, 0] for ch in range(3))
        assert float(i[0, 0, 0, 0]) == pytest.approx(float(sig(gi + cell.w_ci[0, 0, 0] * c[0, 0, 0, 0])), abs=1e-12)
    no_peep = tnn.ConvLSTMPeepholeCell(2, 3, 3, 3, with_peephole=False)
    assert not any("w_c" in n for n, _ in no_peep.named_parameters())
