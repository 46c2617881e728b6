"""``encryption_key=`` of the reference loops: model files, the checkpoint document and sharded checkpoints.

A run with the key writes every file encrypted (the records sealed in the
lists' metadata, none left readable at the document's top level) and a
resume with the same key continues it exactly as a plain resume does;
without the key, or with another, the resume raises ``EncryptionError``
naming the checkpoint and touches nothing.
"""
import json
import os

import pytest

pytest.importorskip("cryptography")
torch = pytest.importorskip("torch")

import tensorlist as tl  # noqa: E402
import tensorlist.loops as loops  # noqa: E402
from tensorlist.provenance.record import read_training_record, verify_model_file  # noqa: E402

import _loop_script  # noqa: E402

KEY = tl.Key(bytes(range(32)))
F = torch.nn.functional


def _loop(out, mode, n, *, stop_after=None, **kw):
    model, opt, train, validation = _loop_script.toy()
    handlers = {}
    if stop_after is not None:
        done = [0]

        def stop(state):
            done[0] += 1
            state.should_stop = done[0] >= stop_after
        handlers[loops.Events.EPOCH_COMPLETED] = stop
    return _loop_script.run(mode, model, opt, train, n, loss_fn=F.cross_entropy, validation=validation, out_dir=out,
                            progress=False, dataset_params={"name": "toy"}, seed=1, handlers=handlers, **kw)


def _same(a, b):
    assert a.learning_curve == b.learning_curve
    assert all(torch.equal(v, b.model.state_dict()[k]) for k, v in a.model.state_dict().items())


@pytest.mark.parametrize("mode,n,stop", [("simple", 4, 2), ("simple_then_swa", 4, 3)])
def test_an_encrypted_run_resumes_as_a_plain_one(tmp_path, mode, n, stop):
    plain = _loop(tmp_path / "plain", mode, n)
    _loop(tmp_path / "sealed", mode, n, stop_after=stop, encryption_key=KEY)
    ckpt = str(tmp_path / "sealed" / "checkpoint.json")
    with open(ckpt) as f:
        doc = json.load(f)
    assert "training" not in doc and "dataset_params" not in doc  # sealed in the model list's metadata only
    assert "toy" not in json.dumps(doc)
    sealed = _loop(tmp_path / "sealed", mode, n, resume=True, encryption_key=KEY)
    _same(plain, sealed)
    final = str(tmp_path / "sealed" / "final.json")
    assert tl.open(final).encrypted
    record = verify_model_file(final, key=KEY)
    assert record.epochs.done == n
    assert record["history"] == verify_model_file(str(tmp_path / "plain" / "final.json"))["history"]
    back = loops.read_checkpoint(ckpt, key=KEY)
    assert back["type"] == json.loads((tmp_path / "plain" / "checkpoint.json").read_text())["type"]


def test_a_resume_without_the_key_or_with_another_is_refused(tmp_path):
    _loop(tmp_path, "simple", 2, encryption_key=KEY)
    ckpt = str(tmp_path / "checkpoint.json")
    before = sorted(os.listdir(tmp_path))
    for key, words in ((None, "pass key="), (tl.Key.generate(), "another key")):
        with pytest.raises(tl.EncryptionError, match=words) as info:
            _loop(tmp_path, "simple", 3, resume=True, encryption_key=key)
        assert info.value.file == ckpt
        with pytest.raises(tl.EncryptionError, match=words):
            loops.read_checkpoint(ckpt, key=key)
        with pytest.raises(tl.EncryptionError, match=words):
            read_training_record(str(tmp_path / "final.json"), key=key)
    assert sorted(os.listdir(tmp_path)) == before
    assert loops.read_checkpoint(ckpt, key=KEY)["epoch"] == 2


@pytest.mark.slow
def test_a_sharded_encrypted_run_resumes_as_a_plain_one(tmp_path):
    pytest.importorskip("torch.distributed.checkpoint")
    plain = _loop(tmp_path / "plain", "simple", 4, checkpoint_format="sharded")
    _loop(tmp_path / "sealed", "simple", 4, stop_after=2, checkpoint_format="sharded", encryption_key=KEY)
    ckpt = str(tmp_path / "sealed" / "checkpoint.dcp")
    shards = [f for f in os.listdir(ckpt) if f.endswith(".tl")]
    assert shards and all(tl.open(os.path.join(ckpt, f)).encrypted for f in shards)
    with pytest.raises(tl.EncryptionError, match="pass key="):
        _loop(tmp_path / "sealed", "simple", 4, resume=True, checkpoint_format="sharded")
    sealed = _loop(tmp_path / "sealed", "simple", 4, resume=True, checkpoint_format="sharded", encryption_key=KEY)
    _same(plain, sealed)
    assert loops.read_checkpoint(ckpt, key=KEY)["tensorlist"]["checkpointFormat"] == "sharded"
