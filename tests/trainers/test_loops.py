"""lamp's loop semantics (lamp.md §5.2-5.3), the fixed quirks, checkpoint format and errors."""
import json
import logging
import os
import re

import numpy as np
import pytest
torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")

import tensorlist as tl
import tensorlist.loops as loops
from tensorlist.provenance.record import history_rows, read_training_record, verify_model_file

F = torch.nn.functional

def _data(n=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g)
    return x, x @ torch.tensor([[1.0], [-2.0], [0.5]])


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(3, 1)


def _sgd(m, lr=0.05):
    return torch.optim.SGD(m.parameters(), lr=lr)


def test_empty_batches_are_skipped_and_loss_is_weighted_by_batch_size():
    x, y = _data(10)
    m = _model()
    seen = []

    def step(model, batch):
        seen.append(len(batch[0]))
        return F.mse_loss(model(batch[0]), batch[1], reduction="mean"), len(batch[0])

    batches = [(x[:3], y[:3]), None, (x[:0], y[:0]), (x[3:10], y[3:10])]
    opt = torch.optim.SGD(m.parameters(), lr=0.0)
    res = loops.epochs(m, opt, batches, step=step, max_epochs=1, progress=False)
    assert seen == [3, 7]
    with torch.no_grad():
        expected = (F.mse_loss(m(x[:3]), y[:3]) * 3 + F.mse_loss(m(x[3:]), y[3:]) * 7) / 10
    assert res.learning_curve[0][1] == pytest.approx(float(expected))
    assert res.state.iteration == 2 and res.state.epoch == 1


def test_callbacks_fire_once_with_smoothed_loss_and_validation_frequency():
    x, y = _data()
    calls = []
    res = loops.epochs(_model(), _sgd(_model()), [(x, y)], loss_fn=F.mse_loss, max_epochs=5,
                       validation=[(x, y)], validation_frequency=2,
                       validation_loss_exponential_smoothing_factor=0.5,
                       training_callback=lambda e, loss, m: calls.append(("t", e)),
                       validation_callback=lambda e, loss, m: calls.append(("v", e, loss)), progress=False)
    assert [c[:2] for c in calls] == [("t", 0), ("v", 0), ("t", 1), ("t", 2), ("v", 2), ("t", 3), ("t", 4), ("v", 4)]
    curve = res.learning_curve
    assert [c[0] for c in curve] == [0, 1, 2, 3, 4]
    assert curve[1][2] is None and curve[1][3] is None
    # lamp's smoothing: smoothed = raw*a + last*(1-a); last is None after an unvalidated epoch
    assert curve[0][2] == curve[0][3]
    assert curve[2][2] == pytest.approx(curve[2][3])  # epoch 1 had no validation: last = None -> raw
    v = [c for c in calls if c[0] == "v"]
    assert v[1][2] == curve[2][2]


def test_smoothing_uses_previous_smoothed_value():
    x, y = _data()
    res = loops.epochs(_model(), _sgd(_model()), [(x, y)], loss_fn=F.mse_loss, max_epochs=3, validation=[(x, y)],
                       validation_loss_exponential_smoothing_factor=0.25, progress=False)
    c = res.learning_curve
    assert c[1][2] == pytest.approx(c[1][3] * 0.25 + c[0][2] * 0.75)
    assert c[2][2] == pytest.approx(c[2][3] * 0.25 + c[1][2] * 0.75)


def test_min_validation_model_is_returned_only_for_chosen_epochs():
    x, y = _data()
    m = _model()
    # a rising validation loss: train on the negated target
    res = loops.epochs(m, _sgd(m, 0.1), [(x, -y)], loss_fn=F.mse_loss, max_epochs=4, validation=[(x, y)],
                       return_min_validation_loss_model=[1, 2], progress=False)
    assert res.epoch in (1, 2) and res.state.min_validation_epoch == res.epoch
    m2 = _model()
    opt2 = _sgd(m2, 0.1)
    snap = {}
    loops.epochs(m2, opt2, [(x, -y)], loss_fn=F.mse_loss, max_epochs=4, validation=[(x, y)], progress=False,
                 training_callback=lambda e, loss, mm: snap.setdefault(e, {k: v.clone() for k, v in
                                                                         mm.state_dict().items()}))
    assert torch.equal(m.weight, snap[res.epoch]["weight"])
    m3 = _model()
    res3 = loops.epochs(m3, _sgd(m3, 0.1), [(x, -y)], loss_fn=F.mse_loss, max_epochs=4, validation=[(x, y)],
                        progress=False)
    assert res3.epoch == 3  # no snapshot epochs: the last model


def test_schedule_factor_scales_lr_and_zero_stops_early():
    x, y = _data()
    m = _model()
    opt = _sgd(m, 0.1)
    lrs = []
    res = loops.epochs(m, opt, [(x, -y)], loss_fn=F.mse_loss, max_epochs=50, validation=[(x, y)],
                       learning_rate_schedule=loops.ReduceLROnPlateau(patience=0, reduce_factor=0.5, stop_factor=0.1),
                       training_callback=lambda e, loss, mm: lrs.append(opt.param_groups[0]["lr"]), progress=False)
    assert res.state.epoch < 10, "reduce-on-plateau stops the loop (factor 0)"
    assert lrs[0] == 0.1 and lrs[-1] < 0.1 and lrs[-1] > 0.01
    m2 = _model()
    opt2 = _sgd(m2, 0.2)
    lrs2 = []
    loops.epochs(m2, opt2, [(x, y)], loss_fn=F.mse_loss, max_epochs=5, learning_rate_schedule=loops.Decrement(2, 0.5),
                 training_callback=lambda e, loss, mm: lrs2.append(opt2.param_groups[0]["lr"]), progress=False)
    assert lrs2 == [0.2, 0.2, 0.1, 0.1, 0.05]


def test_gradient_accumulation_sums_gradients_and_steps_a_short_last_group():
    x, y = _data(12)
    batches = [(x[i:i + 2], y[i:i + 2]) for i in range(0, 10, 2)]  # 5 batches, N=2: steps after 2, 4, 5
    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    steps = []
    orig = opt.step
    opt.step = lambda *a, **k: (steps.append(1), orig(*a, **k))[1]
    loops.epochs(m, opt, batches, loss_fn=F.mse_loss, max_epochs=1, accumulate_gradient_over_n_batches=2,
                 progress=False)
    assert len(steps) == 3
    ref = _model()
    with torch.no_grad():
        for group in ([0, 1], [2, 3], [4]):
            ref.zero_grad()
            with torch.enable_grad():
                sum(F.mse_loss(ref(batches[i][0]), batches[i][1]) for i in group).backward()
            for p in ref.parameters():
                p -= 0.01 * p.grad
    assert torch.allclose(m.weight, ref.weight, atol=1e-6)


def test_minibatches_drop_last_drops_only_a_short_batch_and_reshuffle_per_epoch():
    x = torch.arange(8.0)
    assert [len(b[0]) for b in loops.Minibatches(x, x, 4, drop_last=True)] == [4, 4]
    assert [len(b[0]) for b in loops.Minibatches(torch.arange(9.0), torch.arange(9.0), 4, drop_last=True)] == [4, 4]
    mb = loops.Minibatches(x, x, 8, seed=3)
    a = next(iter(mb))[0].clone()
    mb.set_epoch(1)
    b = next(iter(mb))[0]
    assert not torch.equal(a, b) and torch.equal(a.sort().values, b.sort().values)


def test_events_and_handlers_in_order():
    x, y = _data()
    seen = []
    handlers = {ev: (lambda s, ev=ev: seen.append((ev.name, s.epoch))) for ev in loops.Events}
    handlers[loops.Events.EPOCH_COMPLETED] = [handlers[loops.Events.EPOCH_COMPLETED],
                                             lambda s: setattr(s, "should_stop", s.epoch == 2)]
    loops.epochs(_model(), _sgd(_model()), [(x, y)], loss_fn=F.mse_loss, max_epochs=5, handlers=handlers,
                 validation=[(x, y)], progress=False)
    names = [n for n, _ in seen]
    assert names[0] == "STARTED" and names[-1] == "COMPLETED"
    assert names[1:6] == ["EPOCH_STARTED", "ITERATION_COMPLETED", "VALIDATION_COMPLETED", "EPOCH_COMPLETED",
                          "EPOCH_STARTED"]
    assert max(e for n, e in seen if n == "EPOCH_COMPLETED") == 2  # should_stop ends the loop


def test_checkpoint_document_has_lamps_shape(tmp_path):
    x, y = _data()
    m = _model()
    opt = torch.optim.Adam(m.parameters(), lr=0.01)
    res = loops.epochs(m, opt, [(x, y)], loss_fn=F.mse_loss, max_epochs=3, validation=[(x, y)], out_dir=tmp_path,
                       return_min_validation_loss_model=True, progress=False, dataset_params={"name": "lin"})
    text = (tmp_path / "checkpoint.json").read_text()
    doc = json.loads(text)
    assert text.startswith('{"type": "SimpleLoopState"') or text.startswith('{"type":"SimpleLoopState"')
    assert list(doc)[:8] == ["type", "model", "optimizer", "epoch", "lastValidationLoss", "minValidationLoss",
                             "minValidationLossModel", "learningCurve"]
    assert doc["epoch"] == 3
    assert [e[0] for e in doc["learningCurve"]] == [2, 1, 0]  # newest first, as lamp
    assert [t["name"] for t in doc["model"]["tensors"]] == ["weight", "bias"]
    assert doc["minValidationLossModel"][0] == res.state.min_validation_epoch
    assert tl.load(tmp_path / "checkpoint.json", pointer="/model")["weight"].shape == (1, 3)
    # the checkpoint, its model list and the model files all carry both records
    assert read_training_record(tmp_path / "checkpoint.json").weights.kind == "checkpoint"
    assert doc["model"]["metadata"]["dataset_params"] == {"name": "lin"}
    final = verify_model_file(tmp_path / "final.json")
    best = verify_model_file(tmp_path / "best_validation.json")
    assert final.epochs.done == 3 and best.weights.kind == "best_validation"
    assert best.weights.epoch == res.state.min_validation_epoch + 1
    assert res.files == {"checkpoint": str(tmp_path / "checkpoint.json"), "final": str(tmp_path / "final.json"),
                         "best_validation": str(tmp_path / "best_validation.json")}
    tl.validate(tmp_path / "checkpoint.json")


def test_swa_checkpoint_shapes_and_bn_refresh(tmp_path):
    x, y = _data(64)
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(3, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    res = loops.with_swa(m, opt, loops.Minibatches(x, y, 16), loss_fn=F.mse_loss, warmup_epochs=2, swa_epochs=4,
                         swa_schedule=loops.CyclicSWA(0.1, 1.0, 2), validation=[(x, y)], out_dir=tmp_path,
                         progress=False)
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert list(doc)[:3] == ["type", "simple", "swa"] and doc["type"] == "SimpleThenSWALoopState"
    assert "type" not in doc["simple"] and doc["simple"]["model"].get("tensors", []) == []
    assert doc["swa"]["numberOfAveragedModels"] == 2 and doc["swa"]["epoch"] == 4
    assert [e[0] for e in doc["swa"]["learningCurve"]] == [3, 2, 1, 0]
    assert len(doc["swa"]["learningCurve"][0]) == 3
    assert [c[0] for c in res.learning_curve] == [0, 1, 2, 3, 4, 5]
    assert res.learning_curve[3][2] == res.learning_curve[3][3]
    # BN statistics were refreshed on the averaged weights: they match a fresh pass
    with torch.no_grad():
        h = m[0](x)
    assert torch.allclose(m[1].running_mean, h.mean(0), atol=1e-5)
    assert verify_model_file(tmp_path / "final.json").epochs.done == 6


def test_resume_refuses_another_model_and_overwrites_nothing(tmp_path):
    x, y = _data()
    m = _model()
    loops.epochs(m, _sgd(m), [(x, y)], loss_fn=F.mse_loss, max_epochs=2, out_dir=tmp_path, progress=False)
    before = (tmp_path / "checkpoint.json").read_bytes()
    other = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="another model"):
        loops.epochs(other, _sgd(other), [(x, y)], loss_fn=F.mse_loss, max_epochs=3, out_dir=tmp_path, resume=True,
                     progress=False)
    m2 = _model()
    adam = torch.optim.Adam(m2.parameters())
    with pytest.raises(ValueError, match="another optimizer class"):
        loops.epochs(m2, adam, [(x, y)], loss_fn=F.mse_loss, max_epochs=3, out_dir=tmp_path, resume=True,
                     progress=False)
    with pytest.raises(ValueError, match="cannot resume with_swa"):
        loops.with_swa(m2, _sgd(m2), [(x, y)], loss_fn=F.mse_loss, warmup_epochs=1, swa_epochs=1,
                       out_dir=tmp_path, resume=True, progress=False)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        loops.epochs(m2, _sgd(m2), [(x, y)], loss_fn=F.mse_loss, max_epochs=3, resume=tmp_path / "nope.json",
                     progress=False)
    assert (tmp_path / "checkpoint.json").read_bytes() == before


def test_resume_in_process_continues_the_curve(tmp_path):
    x, y = _data()
    m = _model()
    loops.epochs(m, _sgd(m), [(x, y)], loss_fn=F.mse_loss, max_epochs=2, out_dir=tmp_path, validation=[(x, y)],
                 progress=False)
    m2 = _model(5)
    res = loops.epochs(m2, _sgd(m2), [(x, y)], loss_fn=F.mse_loss, max_epochs=4, out_dir=tmp_path,
                       validation=[(x, y)], resume=True, progress=False)
    assert [c[0] for c in res.learning_curve] == [0, 1, 2, 3]
    assert read_training_record(tmp_path / "final.json").epochs.done == 4


def test_batch_factory_gets_the_context_and_logging(caplog):
    x, y = _data()
    ctxs = []

    def factory(ctx):
        ctxs.append(ctx)
        return [(x, y)]

    with caplog.at_level(logging.INFO, logger="tensorlist.loops"):
        loops.epochs(_model(), _sgd(_model()), factory, loss_fn=F.mse_loss, max_epochs=2, validation=[(x, y)],
                     progress=False)
    assert ctxs[0] == loops.TrainingLoopContext(0, None, None)
    assert ctxs[1].epoch == 1 and ctxs[1].last_validation_loss is not None
    logged = [r.getMessage() for r in caplog.records if "training loss" in r.getMessage()]
    assert [m.split(":")[0] for m in logged] == ["epoch 1", "epoch 2"]  # as the training record counts


def _logged_epochs(caplog):
    """The epoch labels of the loops' per-epoch log lines, in order."""
    return [r.getMessage().split(":")[0] for r in caplog.records if ": training loss" in r.getMessage()]


def test_log_lines_and_progress_bars_number_epochs_as_the_record(tmp_path, caplog, capsys):
    """Every epoch the loops print is the record's epoch: from 1, on through SWA and across a resume."""
    x, y = _data()
    m = _model()
    with caplog.at_level(logging.INFO, logger="tensorlist.loops"):
        loops.with_swa(m, _sgd(m), [(x, y)], loss_fn=F.mse_loss, warmup_epochs=2, swa_epochs=2,
                       validation=[(x, y)], out_dir=tmp_path, progress=True)
    rows = history_rows(read_training_record(tmp_path / "final.json"))
    assert [r.epoch for r in rows] == [1, 2, 3, 4]
    assert _logged_epochs(caplog) == ["epoch 1", "epoch 2", "SWA epoch 3", "SWA epoch 4"]
    bars = capsys.readouterr().err
    assert sorted({int(n) for n in re.findall(r"(?:simple|swa) epoch (\d+)", bars)}) == [1, 2, 3, 4]
    caplog.clear()
    m2 = _model(1)
    with caplog.at_level(logging.INFO, logger="tensorlist.loops"):
        loops.epochs(m2, _sgd(m2), [(x, y)], loss_fn=F.mse_loss, max_epochs=2, out_dir=tmp_path / "r",
                     progress=False)
        loops.epochs(m2, _sgd(m2), [(x, y)], loss_fn=F.mse_loss, max_epochs=3, out_dir=tmp_path / "r",
                     resume=True, progress=False)
    assert _logged_epochs(caplog) == ["epoch 1", "epoch 2", "epoch 3"]
    assert [r.epoch for r in history_rows(read_training_record(tmp_path / "r" / "final.json"))] == [1, 2, 3]


def test_progress_bars_when_asked(capsys):
    x, y = _data()
    loops.epochs(_model(), _sgd(_model()), [(x, y)], loss_fn=F.mse_loss, max_epochs=2, progress=True)
    assert "epochs" in capsys.readouterr().err
    loops.epochs(_model(), _sgd(_model()), [(x, y)], loss_fn=F.mse_loss, max_epochs=2)  # not a terminal: off
    assert capsys.readouterr().err == ""


def test_a_nan_loss_is_checkpointed_as_null(tmp_path):
    x, y = _data()
    y = y.clone()
    y[0] = float("nan")
    m = _model()
    loops.epochs(m, _sgd(m), [(x, y)], loss_fn=F.mse_loss, max_epochs=1, validation=[(x, y)], out_dir=tmp_path,
                 progress=False)
    doc = json.loads((tmp_path / "checkpoint.json").read_text())
    assert doc["learningCurve"] == [[0, None, None, None]] and "lastValidationLoss" not in doc
    assert read_training_record(tmp_path / "final.json").history.training_loss == [None]


def test_reduce_lr_on_plateau_state_has_lamps_json_shape():
    s = loops.ReduceLROnPlateau(patience=1, reduce_factor=0.5)
    st = s.init()
    assert st == {"activeFactor": 1.0}  # min/minLoc left out while unset, as lamp writes it
    st, f = s.factor(st, 0, None)
    assert (st, f) == ({"activeFactor": 1.0}, 1.0)  # lamp fails here; the factor is kept
    st, f = s.factor(st, 1, 0.41)
    assert st == {"activeFactor": 1.0, "min": 0.41, "minLoc": 1}
    for e in (2, 3):
        st, f = s.factor(st, e, 0.5)
    assert st == {"activeFactor": 0.5, "min": 0.41, "minLoc": 3} and f == 0.5
    assert [loops.CyclicSWA(0.0, 1.0, 3).factor(None, e, None)[2] for e in range(6)] == [False, False, True] * 2
    assert loops.ConstantSWA(0.3).factor(None, 5, None) == (None, 0.3, True)
