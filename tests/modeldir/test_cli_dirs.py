"""``tensorlist inspect DIR`` and ``tensorlist validate [--verify] DIR`` on model directories of both kinds, torch-free."""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

from _modeldir_support import SHARDS, hf_dir
from _record_support import full_record
from tensorlist.cli import main
from tensorlist.convert import convert
from tensorlist.convert.modeldir import ST_INDEX, ST_WEIGHTS, TL_INDEX, TL_WEIGHTS
from tensorlist.provenance.record import save_model_file

ONE = {"one": {t: a for tensors in SHARDS.values() for t, a in tensors.items()}}
TENSORS = sorted(ONE["one"])
SHARD1, SHARD2 = sorted(SHARDS)


def cli(capsys, *argv):
    rc = main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return rc, out, err


def model_dir(tmp_path, kind: str, sharded: bool) -> str:
    """A model directory of ``kind`` ("hf" or "tl"), one weight file or two shards and an index."""
    hf = hf_dir(tmp_path / "hf", SHARDS if sharded else ONE)
    if kind == "hf":
        return hf
    convert(hf, tmp_path / "tl", progress=False)
    return str(tmp_path / "tl")


def _shard(kind: str, name: str) -> str:
    return name if kind == "hf" else name[: -len(".safetensors")] + ".json"


def _index(kind: str) -> str:
    return ST_INDEX if kind == "hf" else TL_INDEX


def _error(err: str, file) -> str:
    """The one error line, checked to name ``file`` first; its problem."""
    lines = err.splitlines()
    assert len(lines) == 1, err
    head = f"tensorlist validate: error: {file}: "
    assert lines[0].startswith(head), (lines[0], head)
    return lines[0][len(head):]


@pytest.mark.parametrize("sharded", [False, True], ids=["one file", "shards"])
@pytest.mark.parametrize("kind", ["hf", "tl"])
class TestGood:
    def test_validate(self, tmp_path, capsys, kind, sharded):
        d = model_dir(tmp_path, kind, sharded)
        fmt = "hf-model" if kind == "hf" else "tensorlist-model"
        files = 2 if sharded else 1
        rc, out, err = cli(capsys, "validate", d)
        assert (rc, err) == (0, "")
        assert out == (f"{d}: ok ({fmt}, 4 tensors in {files} weight file{'s' if sharded else ''}"
                       f"{', as its index says' if sharded else ''})\n")
        rc, out, err = cli(capsys, "validate", "--verify", d)
        assert (rc, err) == (0, "")
        assert out.endswith(", checksums verified)\n" if kind == "tl" else ", no checksums in safetensors)\n")

    def test_inspect(self, tmp_path, capsys, kind, sharded):
        d = model_dir(tmp_path, kind, sharded)
        rc, out, err = cli(capsys, "inspect", d)
        assert (rc, err) == (0, "")
        lines = out.splitlines()
        assert lines[0].startswith(f"{d}  (format {'hf-model' if kind == 'hf' else 'tensorlist-model'}: ")
        held = {t: name for name, tensors in SHARDS.items() for t in tensors}
        for t in TENSORS:
            row = [line for line in lines if line.split()[:1] == [t]]
            want = _shard(kind, held[t]) if sharded else (ST_WEIGHTS if kind == "hf" else TL_WEIGHTS)
            assert len(row) == 1 and row[0].split()[-1] == want
        assert "  4 tensors, 122 B of data" in lines
        rc, out, err = cli(capsys, "inspect", "--json", d)
        doc = json.loads(out)
        assert (rc, err, doc["format"], doc["tensor_bytes"]) == (0, "", "hf-model" if kind == "hf" else
                                                                 "tensorlist-model", 122)
        assert sorted(r["name"] for r in doc["tensors"]) == TENSORS
        assert doc["index"] == (_index(kind) if sharded else None)
        assert doc["files"] == ([_shard(kind, SHARD1), _shard(kind, SHARD2)] if sharded else
                                [ST_WEIGHTS if kind == "hf" else TL_WEIGHTS])
        if sharded:  # the index's
            assert doc["metadata"] == {"total_size": 122, "total_parameters": 30}


def test_a_model_file_with_a_training_record(tmp_path, capsys):
    d = tmp_path / "trained"
    d.mkdir()
    record = full_record()
    record["weights"] = dict(record["weights"], sha256=None)
    save_model_file(str(d / TL_WEIGHTS), {"w": np.arange(6, dtype=np.float32), "b": np.ones(3, np.int8)},
                    training=record, dataset_params={"name": "toy", "split": "train"})
    (d / "config.json").write_text('{"model_type": "llama"}')
    rc, out, err = cli(capsys, "validate", "--verify", d)
    assert (rc, err) == (0, "") and out == f"{d}: ok (tensorlist-model, 2 tensors in 1 weight file, checksums verified)\n"
    rc, out, err = cli(capsys, "inspect", d)
    assert (rc, err) == (0, "") and "  training record:\n" in out and "<training record: see below>" in out
    rc, out, err = cli(capsys, "inspect", "--json", d)
    assert json.loads(out)["training_record"]["seed"] == full_record()["seed"]


@pytest.mark.parametrize("kind", ["hf", "tl"])
class TestBroken:
    """Each broken directory: one error line naming the file at fault (and the field, the tensor), status 1,
    from validate and inspect alike; validate goes on with the next directory."""

    def _refused(self, capsys, d, file, *words, verify=False):
        rc, out, err = cli(capsys, "validate", *(["--verify"] if verify else []), d)
        assert (rc, out) == (1, "")
        problem = _error(err, file)
        assert all(w in problem for w in words), problem
        if not verify:
            rc, out, err = cli(capsys, "inspect", d)
            assert (rc, out) == (1, "") and _error(err.replace("inspect", "validate", 1), file) == problem
        return problem

    def test_a_shard_missing(self, tmp_path, capsys, kind):
        d = model_dir(tmp_path, kind, True)
        os.remove(os.path.join(d, _shard(kind, SHARD2)))
        self._refused(capsys, d, os.path.join(d, _index(kind)), "weight_map/", _shard(kind, SHARD2), "does not exist")

    def test_a_truncated_data_file(self, tmp_path, capsys, kind):
        d = model_dir(tmp_path, kind, True)
        shard = os.path.join(d, _shard(kind, SHARD1))
        data = shard if kind == "hf" else \
            os.path.join(d, [n for n in os.listdir(d) if n.startswith(_shard(kind, SHARD1) + ".")][0])
        with open(data, "r+b") as f:
            f.truncate(os.path.getsize(data) - 4)
        self._refused(capsys, d, shard, "truncated")

    def test_an_index_naming_a_tensor_not_in_its_shard(self, tmp_path, capsys, kind):
        d = model_dir(tmp_path, kind, True)
        index = os.path.join(d, _index(kind))
        with open(index) as f:
            doc = json.load(f)
        doc["weight_map"]["mask"] = _shard(kind, SHARD1)
        with open(index, "w") as f:
            json.dump(doc, f)
        self._refused(capsys, d, index, "weight_map/mask", f"is in shard '{_shard(kind, SHARD2)}'",
                      f"not in '{_shard(kind, SHARD1)}'")

    def test_an_index_missing_a_tensor_of_a_shard(self, tmp_path, capsys, kind):
        d = model_dir(tmp_path, kind, True)
        index = os.path.join(d, _index(kind))
        with open(index) as f:
            doc = json.load(f)
        del doc["weight_map"]["mask"]
        with open(index, "w") as f:
            json.dump(doc, f)
        self._refused(capsys, d, index, "weight_map", "but not in weight_map")

    def test_a_tensor_in_two_shards(self, tmp_path, capsys, kind):
        shards = {SHARD1: SHARDS[SHARD1], SHARD2: {**SHARDS[SHARD2], "norm.weight": np.ones(4, np.float16)}}
        hf = hf_dir(tmp_path / "hf", shards)
        d = hf
        if kind == "tl":  # converted before the second copy is put in: the converter refuses it too
            hf_dir(tmp_path / "good", SHARDS)
            convert(tmp_path / "good", tmp_path / "tl", progress=False)
            save_file(shards[SHARD2], str(tmp_path / "two.safetensors"))
            os.remove(tmp_path / "tl" / _shard(kind, SHARD2))
            convert(tmp_path / "two.safetensors", tmp_path / "tl" / _shard(kind, SHARD2), progress=False)
            d = str(tmp_path / "tl")
        self._refused(capsys, d, os.path.join(d, _index(kind)), "weight_map/norm.weight", "is in shards")

    def test_validate_goes_on_with_the_next_directory(self, tmp_path, capsys, kind):
        bad = model_dir(tmp_path / "bad", kind, True)
        os.remove(os.path.join(bad, _shard(kind, SHARD1)))
        good = model_dir(tmp_path / "good", kind, False)
        rc, out, err = cli(capsys, "validate", bad, good)
        assert rc == 1 and out.startswith(f"{good}: ok (") and _error(err, os.path.join(bad, _index(kind)))


def test_a_checksum_that_does_not_match_is_found_by_verify(tmp_path, capsys):
    d = model_dir(tmp_path, "tl", True)
    shard = _shard("tl", SHARD2)
    with open(os.path.join(d, [n for n in os.listdir(d) if n.startswith(shard + ".")][0]), "r+b") as f:
        f.write(b"\xff")
    assert cli(capsys, "validate", d)[0] == 0
    TestBroken()._refused(capsys, d, os.path.join(d, shard), "crc32c", "head.weight", verify=True)
