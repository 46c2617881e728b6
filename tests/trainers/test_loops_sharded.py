"""Sharded checkpoints of the loops (checkpoint_format="sharded", torch.distributed.checkpoint on tensorlist files).

The process tests run one plan of gloo launches on loopback (tests/support/_sharded_script.py forks the ranks):
uninterrupted runs, runs whose processes are SIGKILLed mid-epoch or mid-save, and their resumes on the
same and on another number of processes. Resumed runs are compared bit for bit with the uninterrupted
ones: weights, optimizer state, learning curve, loop state, generator states, model files and records.
The in-process tests (one process, no process group) cover the three loops' resume, inspection and the
refusals quickly.
"""
import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these tests need torch (pip install 'tensorlist[torch]')")
pytest.importorskip("torch.distributed.checkpoint", reason="sharded checkpoints need torch.distributed")

import tensorlist as tl  # noqa: E402
import tensorlist.loops as loops  # noqa: E402
from tensorlist.dcp import METADATA_NAME, read_metadata, validate_checkpoint  # noqa: E402
from tensorlist.provenance.record import verify_model_file  # noqa: E402

import _loop_script  # noqa: E402
from _paths import SUPPORT  # noqa: E402

HERE = SUPPORT
SCRIPT = os.path.join(HERE, "_sharded_script.py")

F = torch.nn.functional
EPOCHS = {"simple": 4, "swa": 4, "simple_then_swa": 6}
KILL_AT = {"simple": 14, "swa": 9, "simple_then_swa": 26}  # training batches (6 an epoch): mid-epoch


# --- the plan: every launch of the process tests, run once --------------------------------------

def _run(out, mode, data="split", **kw):
    return dict(out=str(out), mode=mode, epochs=EPOCHS[mode], data=data, **kw)


def _plan(root):
    steps = []

    def launch(name, world, *runs):
        steps.append({"name": name, "world": world, "runs": list(runs)})

    def copy(src, dst):
        steps.append({"copy": [str(root / src), str(root / dst)]})

    r = lambda name, mode, **kw: _run(root / name, mode, **kw)  # noqa: E731
    # uninterrupted: 2 ranks on their halves of the data; 2 and 1 processes each on all of it; FSDP2
    launch("once2", 2, *[r(f"once2-{m}", m) for m in EPOCHS], r("once2-full-simple", "simple", data="full"),
           r("once2-full-simple_then_swa", "simple_then_swa", data="full"), r("once2-fsdp", "simple", fsdp=True))
    launch("once1", 1, r("once1-full-simple", "simple", data="full"),
           r("once1-full-simple_then_swa", "simple_then_swa", data="full"))
    # SIGKILL of both ranks mid-epoch, resumed on 2 (the simple run also on 1, from a copy)
    for m in EPOCHS:
        launch(f"kill-{m}", 2, r(f"killed-{m}", m, kill_at=KILL_AT[m]))
        if m == "simple":
            copy("killed-simple", "killed-simple-as-left")
            copy("killed-simple", "killed-simple-on1")
        launch(f"resume-{m}", 2, r(f"killed-{m}", m, resume=True))
    launch("resume-simple-on1", 1, r("killed-simple-on1", "simple", resume=True))
    # rank 1 killed inside the 4th save (the first of the SWA phase), before the commit
    launch("kill-in-save", 2, r("save-killed", "simple_then_swa", kill_in_save=4))
    copy("save-killed", "save-killed-as-left")
    launch("resume-after-save-kill", 2, r("save-killed", "simple_then_swa", resume=True))
    # another number of processes, every rank on all the data: 2 -> 1 and 1 -> 2
    launch("kill-full-on2", 2, r("full-2to1", "simple", data="full", kill_at=KILL_AT["simple"]))
    launch("resume-full-on1", 1, r("full-2to1", "simple", data="full", resume=True))
    launch("kill-full-on1", 1, r("full-1to2", "simple_then_swa", data="full", kill_at=KILL_AT["simple_then_swa"]))
    launch("resume-full-on2", 2, r("full-1to2", "simple_then_swa", data="full", resume=True))
    # FSDP2: killed on 2, resumed on 2, and (a copy) on 1 process with the same model unsharded
    launch("kill-fsdp", 2, r("fsdp", "simple", fsdp=True, kill_at=KILL_AT["simple"]))
    copy("fsdp", "fsdp-on1")
    launch("resume-fsdp", 2, r("fsdp", "simple", fsdp=True, resume=True))
    launch("resume-fsdp-on1", 1, r("fsdp-on1", "simple", no_bn=True, resume=True))
    launch("fsdp-swa", 2, r("fsdp-swa", "swa", fsdp=True))  # refused before the first epoch
    return {"steps": steps}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Runs the plan (one interpreter, forked ranks); returns (root, {launch name: ranks' exit statuses})."""
    root = tmp_path_factory.mktemp("sharded")
    (root / "plan.json").write_text(json.dumps(_plan(root)))
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, SCRIPT, str(root / "plan.json"), str(root / "result.json")],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    results = json.loads((root / "result.json").read_text())
    return root, results


def _ok(results, name, world):
    res = results[name]
    assert res["status"] == [0] * world, f"{name}: {res['status']}\n" + "\n".join(res["logs"].values())


def _killed(results, name, world):
    res = results[name]
    assert res["status"] == [-signal.SIGKILL] * world, f"{name}: {res['status']}\n" + "\n".join(res["logs"].values())


def _flat(doc, prefix="", skip=("training", "dataset_params")):
    """Every value of a read checkpoint by path (arrays and JSON leaves), the records left out."""
    out = {}
    if isinstance(doc, dict):
        for k, v in doc.items():
            if k not in skip:
                out.update(_flat(v, f"{prefix}/{k}", skip))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out.update(_flat(v, f"{prefix}/{i}", skip))
    else:
        out[prefix] = doc
    return out


def _assert_same_checkpoint(a_dir, b_dir, skip=("training", "dataset_params")):
    a, b = _flat(loops.read_checkpoint(a_dir), skip=skip), _flat(loops.read_checkpoint(b_dir), skip=skip)
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:10]
    for k in a:
        if isinstance(a[k], np.ndarray):
            assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
        else:
            assert a[k] == b[k], (k, a[k], b[k])


def _assert_same_files(a_dir, b_dir):
    for name in ("final.json", "best_validation.json"):
        if not (a_dir / name).exists():
            assert not (b_dir / name).exists()
            continue
        fa, fb = tl.load(a_dir / name), tl.load(b_dir / name)
        assert fa.keys() == fb.keys() and all(np.array_equal(fa[k], fb[k]) for k in fa), name
        ra, rb = verify_model_file(a_dir / name), verify_model_file(b_dir / name)
        assert ra.history == rb.history and ra.weights.sha256 == rb.weights.sha256, name


def _only_the_committed_save(path):
    ckpt = read_metadata(path)
    names = os.listdir(path)
    assert names and all(n == METADATA_NAME or ckpt.save_id in n for n in names), names


# --- same number of processes ------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("mode", list(EPOCHS))
def test_killed_mid_epoch_on_two_ranks_resumes_bit_identical(runs, mode):
    root, results = runs
    _ok(results, "once2", 2)
    _killed(results, f"kill-{mode}", 2)
    _ok(results, f"resume-{mode}", 2)
    once, killed = root / f"once2-{mode}", root / f"killed-{mode}"
    doc = loops.read_checkpoint(once / "checkpoint.dcp")
    assert doc["tensorlist"]["worldSize"] == 2 and sorted(doc["tensorlist"]["rngByRank"]) == [0, 1]
    assert sorted({f.split(".")[0] for f in os.listdir(once / "checkpoint.dcp") if f.endswith(".tl")}) == ["0", "1"]
    _assert_same_checkpoint(once / "checkpoint.dcp", killed / "checkpoint.dcp")  # RNG states of both ranks too
    _assert_same_files(once, killed)
    assert verify_model_file(killed / "final.json").epochs.done == EPOCHS[mode]
    _only_the_committed_save(killed / "checkpoint.dcp")


@pytest.mark.slow
def test_the_checkpoint_a_mid_epoch_kill_leaves_is_the_last_epochs(runs):
    root, results = runs
    _killed(results, "kill-simple", 2)
    path = root / "killed-simple-as-left" / "checkpoint.dcp"  # copied right after the kill
    validate_checkpoint(path, verify=True)
    doc = loops.read_checkpoint(path)
    assert doc["type"] == "SimpleLoopState" and doc["epoch"] == KILL_AT["simple"] // 6
    assert [e[0] for e in doc["learningCurve"]] == [1, 0]
    assert not (root / "killed-simple-as-left" / "final.json").exists()


@pytest.mark.slow
def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint_and_the_resume_is_bit_identical(runs):
    root, results = runs
    status = results["kill-in-save"]["status"]
    assert status[1] == -signal.SIGKILL and status[0] != 0, status  # rank 0 never committed: stopped
    left = root / "save-killed-as-left" / "checkpoint.dcp"
    ckpt = validate_checkpoint(left, verify=True)  # the warm-up's last checkpoint, whole
    uncommitted = [n for n in os.listdir(left) if n != METADATA_NAME and ckpt.save_id not in n]
    assert any(n.startswith("1.") for n in uncommitted), "the killed rank wrote no shard: the test tested nothing"
    doc = loops.read_checkpoint(left)
    assert doc["type"] == "SimpleThenSWALoopState" and "swa" not in doc and doc["simple"]["epoch"] == 3
    _ok(results, "resume-after-save-kill", 2)
    _assert_same_checkpoint(root / "once2-simple_then_swa" / "checkpoint.dcp", root / "save-killed" / "checkpoint.dcp")
    _assert_same_files(root / "once2-simple_then_swa", root / "save-killed")
    _only_the_committed_save(root / "save-killed" / "checkpoint.dcp")  # the next commit swept the killed save


# --- another number of processes ------------------------------------------------------------------------

@pytest.mark.slow
def test_every_rank_on_all_the_data_makes_one_and_two_processes_train_alike(runs):
    root, results = runs
    _ok(results, "once1", 1)
    for mode in ("simple", "simple_then_swa"):  # the premise of the exact cross-size resumes below
        _assert_same_checkpoint(root / f"once1-full-{mode}" / "checkpoint.dcp",
                                root / f"once2-full-{mode}" / "checkpoint.dcp",
                                skip=("training", "dataset_params", "rngByRank", "worldSize"))
        _assert_same_files(root / f"once1-full-{mode}", root / f"once2-full-{mode}")


@pytest.mark.slow
def test_saved_on_two_resumes_on_one_bit_identical_when_every_rank_sees_all_the_data(runs):
    root, results = runs
    _killed(results, "kill-full-on2", 2)
    _ok(results, "resume-full-on1", 1)
    once, resumed = root / "once2-full-simple" / "checkpoint.dcp", root / "full-2to1" / "checkpoint.dcp"
    _assert_same_checkpoint(once, resumed, skip=("training", "dataset_params", "rngByRank", "worldSize"))
    a, b = loops.read_checkpoint(once)["tensorlist"], loops.read_checkpoint(resumed)["tensorlist"]
    assert b["worldSize"] == 1 and sorted(b["rngByRank"]) == [0]
    assert a["rngByRank"][0] == b["rngByRank"][0]  # rank 0 went on from its own saved state
    _assert_same_files(root / "once2-full-simple", root / "full-2to1")


@pytest.mark.slow
def test_saved_on_one_resumes_on_two_bit_identical_when_every_rank_sees_all_the_data(runs):
    root, results = runs
    _killed(results, "kill-full-on1", 1)
    _ok(results, "resume-full-on2", 2)
    # rank 1 had no saved generator state: it started from rank 0's, as every rank of a fresh run starts
    # from the same seed, so even the generator states equal the 2-process run's
    _assert_same_checkpoint(root / "once2-full-simple_then_swa" / "checkpoint.dcp",
                            root / "full-1to2" / "checkpoint.dcp")
    _assert_same_files(root / "once2-full-simple_then_swa", root / "full-1to2")


@pytest.mark.slow
def test_split_data_saved_on_two_continues_on_one(runs):
    """Each rank on its half: one process differs in rounding (one mean, not a mean of means) and batch norm
    statistics, so the resumed run is checked for what it kept and that it continued, not bit for bit."""
    root, results = runs
    _ok(results, "resume-simple-on1", 1)
    once = loops.read_checkpoint(root / "once2-simple" / "checkpoint.dcp")
    doc = loops.read_checkpoint(root / "killed-simple-on1" / "checkpoint.dcp")
    assert doc["epoch"] == EPOCHS["simple"] and doc["tensorlist"]["worldSize"] == 1
    assert [e[0] for e in doc["learningCurve"]] == [3, 2, 1, 0]
    assert doc["learningCurve"][-2:] == once["learningCurve"][-2:]  # the two epochs run on 2 ranks, as saved
    assert all(np.isfinite(e[1]) for e in doc["learningCurve"])
    rec = verify_model_file(root / "killed-simple-on1" / "final.json")
    assert rec.epochs.done == EPOCHS["simple"]
    assert rec.history["training_loss"][:2] == verify_model_file(root / "once2-simple" / "final.json").history[
        "training_loss"][:2]


# --- FSDP2 -------------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_fsdp2_model_killed_on_two_resumes_bit_identical_and_on_one_unsharded(runs):
    root, results = runs
    _killed(results, "kill-fsdp", 2)
    _ok(results, "resume-fsdp", 2)
    once, killed = root / "once2-fsdp", root / "fsdp"
    _assert_same_checkpoint(once / "checkpoint.dcp", killed / "checkpoint.dcp")
    _assert_same_files(once, killed)
    # each rank wrote its own shards of each parameter (dim 0 split over the 2 ranks)
    ckpt = read_metadata(once / "checkpoint.dcp")
    assert len(ckpt.tensors["model.0.weight"].chunks) == 2
    assert {e.file.split(".")[0] for e in ckpt.storage.values() if e.fqn == "model.0.weight"} == {"0", "1"}
    # the same checkpoint resumes in one process on the unsharded model (DCP reshards) and continues
    _ok(results, "resume-fsdp-on1", 1)
    doc = loops.read_checkpoint(root / "fsdp-on1" / "checkpoint.dcp")
    assert doc["epoch"] == EPOCHS["simple"] and [e[0] for e in doc["learningCurve"]] == [3, 2, 1, 0]
    assert doc["learningCurve"][-2:] == loops.read_checkpoint(once / "checkpoint.dcp")["learningCurve"][-2:]
    assert verify_model_file(root / "fsdp-on1" / "final.json").epochs.done == EPOCHS["simple"]


@pytest.mark.slow
def test_the_swa_loops_refuse_an_fsdp2_model_before_training(runs):
    root, results = runs
    res = results["fsdp-swa"]
    # each rank raises; the launcher stops a rank still running once the other has failed
    assert 1 in res["status"] and set(res["status"]) <= {1, -signal.SIGKILL}, res
    assert res["logs"] and all("swa_epochs() cannot average a model whose state is sharded" in log
                               for log in res["logs"].values())
    assert not os.path.exists(root / "fsdp-swa" / "checkpoint.dcp")


# --- one process, no process group --------------------------------------------------------------------------

def _loop(out, mode, n, *, resume=False, stop_after=None, checkpoint_format="sharded", **kw):
    model, opt, train, validation = _loop_script.toy()
    handlers = {}
    if stop_after is not None:
        done = [0]

        def stop(state):  # after stop_after epochs of both phases together
            done[0] += 1
            state.should_stop = done[0] >= stop_after
        handlers[loops.Events.EPOCH_COMPLETED] = stop
    return _loop_script.run(mode, model, opt, train, n, loss_fn=F.cross_entropy, validation=validation, out_dir=out,
                            resume=resume, progress=False, dataset_params={"name": "toy"}, seed=1,
                            checkpoint_format=checkpoint_format, handlers=handlers, **kw)


@pytest.mark.parametrize("mode,n,stop", [("simple", 4, 2), ("swa", 4, 1), ("simple_then_swa", 4, 3)])
def test_one_process_sharded_resume_is_bit_identical(tmp_path, mode, n, stop):
    a = _loop(tmp_path / "a", mode, n)
    _loop(tmp_path / "b", mode, n, stop_after=stop)
    b = _loop(tmp_path / "b", mode, n, resume=True)
    assert a.learning_curve == b.learning_curve
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    _assert_same_checkpoint(tmp_path / "a" / "checkpoint.dcp", tmp_path / "b" / "checkpoint.dcp")
    _assert_same_files(tmp_path / "a", tmp_path / "b")
    assert b.files["checkpoint"] == str(tmp_path / "b" / "checkpoint.dcp")


def test_read_checkpoint_reads_a_sharded_checkpoint_for_inspection(tmp_path):
    res = _loop(tmp_path, "simple", 2)
    doc = loops.read_checkpoint(tmp_path / "checkpoint.dcp")
    assert doc["type"] == "SimpleLoopState" and doc["epoch"] == 2 and len(doc["learningCurve"]) == 2
    ext = doc["tensorlist"]
    assert ext["format"] == loops.LOOP_STATE_FORMAT and ext["checkpointFormat"] == "sharded"
    assert ext["worldSize"] == 1 and list(ext["rngByRank"]) == [0] and ext["lrScheduler"]["last_epoch"] == 2
    final = tl.load(tmp_path / "final.json")  # the min-validation weights went into the model at the end
    epoch, best = doc["minValidationLossModel"]
    assert epoch == res.epoch and all(np.array_equal(best[k], final[k]) for k in final)
    assert sorted(doc["model"]) == sorted(res.model.state_dict())
    assert doc["optimizer"]["param_groups.0.lr"] == pytest.approx(0.01)
    assert doc["optimizer"]["state.0.weight.exp_avg"].shape == (16, 6)
    assert doc["training"]["weights"]["kind"] == "checkpoint" and doc["training"]["weights"]["sha256"] is None
    assert doc["dataset_params"] == {"name": "toy"}
    verify_model_file(tmp_path / "final.json")
    verify_model_file(tmp_path / "best_validation.json")
    # the same numbers through the torch-free reader of tensorlist.dcp
    from tensorlist.dcp import read_full
    flat = read_full(tmp_path / "checkpoint.dcp")
    assert np.array_equal(flat["model.0.weight"], doc["model"]["0.weight"])
    assert json.loads(flat["loop"])["epoch"] == 2


def test_resume_true_starts_afresh_from_a_directory_without_a_committed_checkpoint(tmp_path):
    (tmp_path / "checkpoint.dcp").mkdir()
    (tmp_path / "checkpoint.dcp" / "0.0badc0de.tl").write_text("left by a killed save")
    res = _loop(tmp_path, "simple", 1, resume=True)
    assert [c[0] for c in res.learning_curve] == [0]
    assert loops.read_checkpoint(tmp_path / "checkpoint.dcp")["epoch"] == 1
    _only_the_committed_save(tmp_path / "checkpoint.dcp")


def test_a_sharded_checkpoint_of_another_model_or_loop_is_refused_before_anything_is_loaded(tmp_path):
    _loop(tmp_path, "simple", 1)
    path = tmp_path / "checkpoint.dcp"
    torch.manual_seed(3)
    other = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    before = {k: v.clone() for k, v in other.state_dict().items()}
    x, y = _loop_script.data()
    with pytest.raises(ValueError, match="another model"):
        loops.epochs(other, torch.optim.Adam(other.parameters()), [(x, y)], loss_fn=F.cross_entropy, max_epochs=2,
                     resume=path, progress=False)
    assert all(torch.equal(v, other.state_dict()[k]) for k, v in before.items())
    model, _ = _loop_script.build()
    with pytest.raises(ValueError, match="saved by another optimizer class"):
        loops.epochs(model, torch.optim.SGD(model.parameters(), lr=0.1), [(x, y)], loss_fn=F.cross_entropy,
                     max_epochs=2, resume=path, progress=False)
    with pytest.raises(ValueError, match="SimpleLoopState checkpoint cannot resume swa_epochs"):
        loops.swa_epochs(model, torch.optim.Adam(model.parameters()), [(x, y)], loss_fn=F.cross_entropy,
                         max_epochs=2, resume=path, progress=False)
    with pytest.raises(ValueError, match="checkpoint_format must be one of"):
        loops.epochs(model, torch.optim.Adam(model.parameters()), [(x, y)], loss_fn=F.cross_entropy,
                     max_epochs=2, checkpoint_format="shards")


@pytest.mark.parametrize("first,then", [("document", "sharded"), ("sharded", "document")])
def test_a_run_switches_checkpoint_format_on_resume(tmp_path, first, then):
    """The resume reads whichever format ``resume`` names; the run goes on writing its own."""
    names = {"document": "checkpoint.json", "sharded": "checkpoint.dcp"}
    a = _loop(tmp_path / "a", "simple_then_swa", 4, checkpoint_format=then)
    _loop(tmp_path / "b", "simple_then_swa", 4, stop_after=3, checkpoint_format=first)
    b = _loop(tmp_path / "b", "simple_then_swa", 4, resume=str(tmp_path / "b" / names[first]),
              checkpoint_format=then)
    assert a.learning_curve == b.learning_curve
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())
    _assert_same_checkpoint(tmp_path / "a" / names[then], tmp_path / "b" / names[then])
    _assert_same_files(tmp_path / "a", tmp_path / "b")
