"""Lineage: real chains of fine-tuned model files (TrainingRecorder and the reference loop), every link broken once.

Each chain is trained here: a base model from the random state, a fine-tune
loaded from it (``TrainingRecorder`` with ``initial_weights.origin``), and a
second fine-tune by ``tensorlist.loops.epochs``. The same cases run through the
Python API and the command line (``python -m tensorlist lineage``).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="these tests train models (pip install 'tensorlist[torch]')")

import tensorlist.provenance
from tensorlist import loops
from tensorlist.errors import FormatError
from tensorlist.provenance.lineage import DIRECTORY_SIGNATURE, MAX_LINEAGE_DEPTH, LineageError, lineage
from tensorlist.provenance.record import (
    TrainingRecorder,
    model_file_origin,
    read_training_record,
    save_model_file,
    weights_sha256,
)

X = torch.linspace(-1, 1, 32).reshape(16, 2)
Y = X[:, :1] * 2 - X[:, 1:]
DATA = {"name": "toy-linear", "split": "train"}
from _paths import ROOT, SUPPORT


def _model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(2, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))


def _load(model, path):
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in tensorlist.load(path).items()})
    return model


def _recorder_run(out_dir, *, origin_file=None, seed=0, lr=0.05):
    """One epoch with TrainingRecorder; from the random state, or fine-tuned from ``origin_file``."""
    os.makedirs(out_dir, exist_ok=True)
    model = _model(seed)
    initial = {"from": "random_state"}
    if origin_file is not None:
        _load(model, origin_file)
        initial = {"from": None, "origin": model_file_origin(origin_file, relative_to=out_dir)}
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(X, Y), batch_size=8)
    rec = TrainingRecorder(model, opt, loss=torch.nn.MSELoss(), train_loader=loader, epochs=1, seed=seed,
                           initial_weights=initial)
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        opt.step()
    rec.epoch_done(0.5)
    path = os.path.join(out_dir, "final.tl")
    rec.save(path, model, dataset_params=DATA)
    return path


def _loop_run(out_dir, origin_file):
    """One epoch of the reference loop, fine-tuning the model of ``origin_file``."""
    model = _load(_model(), origin_file)
    res = loops.epochs(model, torch.optim.SGD(model.parameters(), lr=0.05), [(X, Y)],
                       loss_fn=torch.nn.functional.mse_loss, max_epochs=1, progress=False, out_dir=str(out_dir),
                       dataset_params=DATA, seed=0,
                       initial_weights={"from": None,
                                        "origin": model_file_origin(origin_file, relative_to=out_dir)})
    return res.files["final"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """runs/base/final.tl <- runs/ft1/final.tl <- runs/ft2/<loop's final file>, trained once."""
    runs = tmp_path_factory.mktemp("trained") / "runs"
    base = _recorder_run(str(runs / "base"))
    ft1 = _recorder_run(str(runs / "ft1"), origin_file=base)
    os.makedirs(runs / "ft2")
    ft2 = _loop_run(str(runs / "ft2"), ft1)
    return str(runs), [os.path.relpath(p, runs) for p in (base, ft1, ft2)]


@pytest.fixture
def chain(trained, tmp_path):
    """A copy of the trained chain for one test to break (the origins are relative: the copy resolves alike)."""
    runs = str(tmp_path / "runs")
    shutil.copytree(trained[0], runs)
    base, ft1, ft2 = (os.path.join(runs, p) for p in trained[1])
    return types.SimpleNamespace(runs=runs, base=base, ft1=ft1, ft2=ft2)


def _cli(*args, cwd=None):
    env = dict(os.environ, PYTHONPATH=os.path.abspath(ROOT))
    return subprocess.run([sys.executable, "-m", "tensorlist", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd, timeout=300)


def _both(path, **kw):
    """The chain through the API, and the CLI's exit status and stderr for the same arguments."""
    chain = lineage(path, **kw)
    args = ["lineage", path]
    if kw.get("root"):
        args += ["--root", kw["root"]]
    if kw.get("allow_outside"):
        args.append("--allow-outside")
    if "max_depth" in kw:
        args += ["--max-depth", kw["max_depth"]]
    return chain, _cli(*args)


def test_a_real_chain_holds_through_api_and_cli(chain):
    result = lineage(chain.ft2, root=chain.runs).check()
    assert [os.path.realpath(k.file) for k in result.links] == [os.path.realpath(p) for p in
                                                                (chain.ft2, chain.ft1, chain.base)]
    assert [k.weights_sha256 for k in result.links] == [weights_sha256(p) for p in (chain.ft2, chain.ft1, chain.base)]
    assert result.links[1].recorded == os.path.join("..", "ft1", "final.tl")
    assert result.links[-1].origin is None and result.links[-1].record["initial_weights"]["from"] == "random_state"
    run = _cli("lineage", chain.ft2, "--root", chain.runs)
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert len(lines) == 4 and lines[-1] == "lineage: 3 links, every one holds"
    for line, path in zip(lines, (chain.ft2, chain.ft1, chain.base)):
        assert path in line or os.path.relpath(path) in line or os.path.basename(os.path.dirname(path)) in line
        assert weights_sha256(path)[:16] in line
    js = json.loads(_cli("lineage", chain.ft2, "--root", chain.runs, "--json").stdout)
    assert js["broken"] is None and [k["weights_sha256"] for k in js["links"]] == \
        [k.weights_sha256 for k in result.links]


def _expect_broken(path, index, match, **kw):
    result, run = _both(path, **kw)
    assert not result.ok and result.broken.index == index, result.broken
    assert len(result.links) == index
    with pytest.raises(LineageError, match=match) as e:
        result.check()
    assert e.value.file == result.broken.file
    assert run.returncode == 1 and f"broken link {index}" in run.stderr, (run.stdout, run.stderr)
    assert len(run.stdout.splitlines()) == index  # the links that held, one line each
    return result


def test_default_root_refuses_an_origin_outside_it(chain):
    _expect_broken(chain.ft2, 1, "outside the allowed root")
    assert lineage(chain.ft2, allow_outside=True).ok


def test_a_missing_origin(chain):
    os.unlink(chain.base)
    _expect_broken(chain.ft2, 2, "missing", root=chain.runs)


def test_an_origin_retrained_in_place(chain):
    """The origin file replaced by other weights (with a valid record of its own): the child's hash no longer holds."""
    _recorder_run(os.path.dirname(chain.ft1), origin_file=chain.base, lr=0.3)  # overwrites ft1/final.tl
    _expect_broken(chain.ft2, 1, "changed origin", root=chain.runs)


def test_an_origin_whose_weights_were_edited(chain):
    """A tensor byte changed in the origin's data file: its own record's hash fails first."""
    data = tensorlist.open(chain.base).descriptor.data_path
    with open(data, "r+b") as f:
        f.seek(0)
        b = f.read(1)
        f.seek(0)
        f.write(bytes([b[0] ^ 1]))
    _expect_broken(chain.ft2, 2, "weights were changed after saving", root=chain.runs)


def test_the_model_itself_edited_or_without_record(chain, tmp_path):
    data = tensorlist.open(chain.ft2).descriptor.data_path
    with open(data, "r+b") as f:
        f.write(b"\xff\xff\xff\xff")
    _expect_broken(chain.ft2, 0, "weights were changed", root=chain.runs)
    plain = str(tmp_path / "plain.tl")
    tensorlist.save(plain, {"w": np.zeros(2, np.float32)})
    _expect_broken(plain, 0, "holds no training record")


def _fine_tune_record(origin_file, out_dir):
    rec = read_training_record(origin_file)
    rec["initial_weights"] = {"from": None, "origin": model_file_origin(origin_file, relative_to=out_dir)}
    rec["weights"] = dict(rec["weights"], sha256=None)
    return rec


def test_a_cycle(tmp_path):
    """a <- b <- a: two files that name each other (b re-saved after a named it)."""
    w = {"w": np.arange(3, dtype=np.float32)}
    a, b = str(tmp_path / "a.tl"), str(tmp_path / "b.tl")
    base = _recorder_run(str(tmp_path / "base"))
    save_model_file(b, w, training=_fine_tune_record(base, str(tmp_path)), dataset_params=DATA)
    save_model_file(a, w, training=_fine_tune_record(b, str(tmp_path)), dataset_params=DATA)
    save_model_file(b, w, training=_fine_tune_record(a, str(tmp_path)), dataset_params=DATA)  # same weights
    _expect_broken(a, 2, "a cycle: this file is link 0 again")


def test_a_chain_deeper_than_the_limit(tmp_path):
    w = {"w": np.arange(3, dtype=np.float32)}
    prev = _recorder_run(str(tmp_path / "base"))
    for i in range(4):
        path = str(tmp_path / f"m{i}.tl")
        save_model_file(path, w, training=_fine_tune_record(prev, str(tmp_path)), dataset_params=DATA)
        prev = path
    assert len(lineage(prev, root=str(tmp_path)).check().links) == 5
    _expect_broken(prev, 3, "more than 2 origins deep", root=str(tmp_path), max_depth=2)
    assert MAX_LINEAGE_DEPTH >= 5


def test_a_symlinked_origin_leaving_the_root(chain, tmp_path):
    """The origin's directory swapped for a symlink to a copy elsewhere: confinement follows the real path."""
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(os.path.dirname(chain.ft1), elsewhere)
    shutil.rmtree(os.path.dirname(chain.ft1))
    os.symlink(elsewhere, os.path.dirname(chain.ft1))
    _expect_broken(chain.ft2, 1, "outside the allowed root", root=chain.runs)


def test_url_origins_and_hostile_recorded_names(chain, tmp_path):
    w = {"w": np.arange(3, dtype=np.float32)}
    rec = read_training_record(chain.base)
    rec["weights"] = dict(rec["weights"], sha256=None)
    rec["initial_weights"] = {"from": None, "origin": {"file": "s3://bucket/base.tl", "weights_sha256": "a" * 64}}
    url_child = str(tmp_path / "url.tl")
    save_model_file(url_child, w, training=rec, dataset_params=DATA)
    _expect_broken(url_child, 1, "URL origin is not followed")
    hostile = "gone\x1b]0;owned\x07\n\u202efile.tl"
    rec["initial_weights"] = {"from": None, "origin": {"file": hostile, "weights_sha256": "a" * 64}}
    child = str(tmp_path / "hostile.tl")
    save_model_file(child, w, training=rec, dataset_params=DATA)
    result, run = _both(child)
    assert result.broken.index == 1 and "missing" in result.broken.reason
    assert run.returncode == 1
    assert "\x1b" not in run.stderr and "\x07" not in run.stderr and "\u202e" not in run.stderr
    assert "\\x1b" in run.stderr and "\\u202e" in run.stderr
    assert len(run.stderr.strip().splitlines()) == 1  # the newline in the name is escaped too
    rec["initial_weights"] = {"from": None, "origin": {"file": "a\x00b.tl", "weights_sha256": "a" * 64}}
    save_model_file(child, w, training=rec, dataset_params=DATA)
    _expect_broken(child, 1, "holds a NUL character")


def test_signatures_are_found_and_checked_through_the_signing_hook(chain, tmp_path, monkeypatch):
    """The hook calls ``tensorlist.provenance.signing.verify(path, public_key=, signature=)`` for each signature found.

    ``tensorlist.provenance.signing`` (the [sign] extra) is another module's; this stands in for it so that the hook's
    calls, and a refusal it reports, are checked here.
    """
    with open(chain.ft1 + ".sig", "w") as f:
        f.write("{}")
    with open(os.path.join(os.path.dirname(chain.base), DIRECTORY_SIGNATURE), "w") as f:
        f.write("{}")
    calls = []
    refuse = set()

    def verify(path, *, public_key, signature):
        calls.append((path, public_key, signature))
        if os.path.realpath(signature) in refuse:
            raise FormatError("the digest of final.tl differs", file=signature)
        return True

    monkeypatch.setitem(sys.modules, "tensorlist.provenance.signing", types.SimpleNamespace(verify=verify))
    monkeypatch.setattr(tensorlist.provenance, "signing", sys.modules["tensorlist.provenance.signing"], raising=False)
    unchecked = lineage(chain.ft2, root=chain.runs).check()
    assert [k.signature_verified for k in unchecked.links] == [None, None, None] and not calls
    assert os.path.realpath(unchecked.links[1].signature) == os.path.realpath(chain.ft1 + ".sig")
    checked = lineage(chain.ft2, root=chain.runs, public_key="team.pub").check()
    assert [k.signature_verified for k in checked.links] == [None, True, True]
    base_dir = os.path.dirname(chain.base)
    real = [tuple(os.path.realpath(p) if i != 1 else p for i, p in enumerate(c)) for c in calls]
    assert real == [(os.path.realpath(chain.ft1), "team.pub", os.path.realpath(chain.ft1 + ".sig")),
                    (os.path.realpath(base_dir), "team.pub", os.path.realpath(os.path.join(base_dir, DIRECTORY_SIGNATURE)))]
    with pytest.raises(LineageError, match="link 0: unsigned"):
        lineage(chain.ft2, root=chain.runs, public_key="team.pub", require_signatures=True).check()
    refuse.add(os.path.realpath(chain.ft1 + ".sig"))
    result = lineage(chain.ft2, root=chain.runs, public_key="team.pub")
    assert result.broken.index == 1 and "does not verify: " in result.broken.reason
    assert "digest of final.tl differs" in result.broken.reason


def test_bad_arguments():
    with pytest.raises(TypeError, match="expected the path of a model file"):
        lineage(3)
    with pytest.raises(ValueError, match="max_depth"):
        lineage("x.tl", max_depth=-1)
    with pytest.raises(ValueError, match="is a URL"):
        lineage("s3://bucket/x.tl")
    run = _cli("lineage", "s3://bucket/x.tl")
    assert run.returncode == 1 and "tensorlist lineage: error:" in run.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory", "data file"])
def test_an_origin_that_is_not_a_model_file(chain, kind):
    """A FIFO (never blocks), a directory, or the data file in place of the descriptor: a broken link, named."""
    os.unlink(chain.ft1)
    if kind == "fifo":
        os.mkfifo(chain.ft1)
        match = "not a regular file: it is a FIFO"
    elif kind == "directory":
        os.mkdir(chain.ft1)
        match = "not a regular file: it is a directory"
    else:
        data = [n for n in os.listdir(os.path.dirname(chain.ft1)) if n.endswith(".data")][0]
        shutil.copyfile(os.path.join(os.path.dirname(chain.ft1), data), chain.ft1)
        match = "descriptor is not UTF-8"
    _expect_broken(chain.ft2, 1, match, root=chain.runs)


def test_a_key_without_the_signing_module_is_one_clear_error(chain, monkeypatch):
    """Signatures found and a key given, but tensorlist.provenance.signing cannot be imported: say which extra, not 'verified'."""
    with open(chain.ft1 + ".sig", "w") as f:
        f.write("{}")
    monkeypatch.setitem(sys.modules, "tensorlist.provenance.signing", None)  # import fails, as without the [sign] extra
    monkeypatch.delattr(tensorlist.provenance, "signing", raising=False)
    with pytest.raises(ImportError, match=r"tensorlist\[sign\]"):
        lineage(chain.ft2, root=chain.runs, public_key="team.pub")


def test_a_lightning_checkpoint_as_origin_is_followed_and_its_weights_hashed_again(tmp_path, monkeypatch):
    """A model fine-tuned from a Lightning checkpoint (tensorlist.lightning's document): its weights at /state_dict."""
    pytest.importorskip("lightning", reason="the Lightning integration needs lightning")
    monkeypatch.syspath_prepend(SUPPORT)
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    import _lightning_script

    from tensorlist.lightning import TensorListCheckpointIO
    from tensorlist.provenance.record import CHECKPOINT_WEIGHTS

    runs = tmp_path / "runs"
    _lightning_script.fit(runs / "pl", 1, plugins=[TensorListCheckpointIO()])
    ckpt = str(runs / "pl" / "epoch=0-step=4.ckpt")
    weights = tensorlist.load(ckpt, pointer=CHECKPOINT_WEIGHTS)
    net = _lightning_script.Tiny().net
    net.load_state_dict({k[len("net."):]: torch.from_numpy(np.array(v)) for k, v in weights.items()})
    out = runs / "ft"
    origin = model_file_origin(ckpt, relative_to=out)
    assert origin == {"file": os.path.join("..", "pl", "epoch=0-step=4.ckpt"),
                      "weights_sha256": weights_sha256(weights)}
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    rec = TrainingRecorder(net, opt, train_loader={"batch_size": 4, "shuffle": False, "drop_last": False,
                                                   "sampler": None}, epochs=1, initial_weights={"from": None,
                                                                                                 "origin": origin})
    rec.epoch_done(0.5)
    child = str(out / "final.tl")
    os.makedirs(out)
    rec.save(child, net, dataset_params=DATA)
    result = lineage(child, root=str(runs)).check()
    assert [os.path.basename(k.file) for k in result.links] == ["final.tl", "epoch=0-step=4.ckpt"]
    assert result.links[1].weights_sha256 == origin["weights_sha256"]
    assert result.links[1].record["weights"]["kind"] == "checkpoint" and result.links[1].origin is None
    run = _cli("lineage", child, "--root", runs)
    assert run.returncode == 0 and run.stdout.splitlines()[-1] == "lineage: 2 links, every one holds", run.stderr
    # its weights changed after the child recorded them: the checkpoint's own record says so, naming it
    data = next(p for p in (runs / "pl").iterdir() if p.name.startswith("epoch=0-step=4.ckpt.") and
                p.name.endswith(".data"))
    state_dict = tensorlist.load(ckpt, pointer=CHECKPOINT_WEIGHTS, mmap=False)
    assert state_dict  # the bytes of a weight, found in the data file and changed there
    first = np.ascontiguousarray(next(iter(state_dict.values()))).tobytes()
    raw = data.read_bytes()
    at = raw.index(first)
    data.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1:])
    broken = lineage(child, root=str(runs))
    assert broken.broken is not None and broken.broken.index == 1 and broken.broken.file.endswith("epoch=0-step=4.ckpt")
    assert "the weights were changed after saving" in broken.broken.reason, broken.broken.reason
