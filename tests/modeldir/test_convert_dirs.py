"""Model directories converted both ways (``tensorlist convert HF_DIR OUT`` and back), torch-free.

The safetensors fixtures are written with ``safetensors.numpy`` (and tensorlist's own safetensors
writer for bfloat16/float8), so these run on the CI leg without torch.
"""
import json
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from safetensors.numpy import load_file, save_file

import tensorlist as tl
from _compat import bfloat16_bits
from _modeldir_support import OTHERS, SHARDS, hf_dir
from _record_support import full_record
from tensorlist._base.dtypes import from_name
from tensorlist.cli import main
from tensorlist.convert import convert
from tensorlist.convert.modeldir import ST_INDEX, ST_WEIGHTS, TL_INDEX, TL_WEIGHTS
from tensorlist.errors import DestinationExistsError, FormatError
from tensorlist.provenance.record import read_training_record, save_model_file, verify_model_file

def _files(d) -> dict:
    out = {}
    for base, _, names in os.walk(d):
        for n in names:
            with open(os.path.join(base, n), "rb") as f:
                out[os.path.relpath(os.path.join(base, n), d)] = f.read()
    return out


@pytest.mark.parametrize("shards", [SHARDS, {"one": {**SHARDS["model-00001-of-00002.safetensors"],
                                                      **SHARDS["model-00002-of-00002.safetensors"]}}],
                         ids=["sharded", "one file"])
def test_hf_to_tensorlist_and_back(tmp_path, shards):
    hf = hf_dir(tmp_path / "hf", shards)
    convert(hf, tmp_path / "tl", progress=False)
    tl_files = _files(tmp_path / "tl")
    assert not [n for n in tl_files if n.endswith(".safetensors")]
    for rel, data in OTHERS.items():
        assert tl_files[rel] == data
    if len(shards) > 1:
        with open(tmp_path / "tl" / TL_INDEX) as f:
            index = json.load(f)
        with open(tmp_path / "hf" / ST_INDEX) as f:
            source = json.load(f)
        assert index["metadata"] == source["metadata"]
        assert index["weight_map"] == {t: s.replace(".safetensors", ".json") for t, s in source["weight_map"].items()}
        for name, tensors in shards.items():
            got = tl.load(tmp_path / "tl" / name.replace(".safetensors", ".json"))
            assert list(got) == sorted(tensors, key=lambda t: list(load_file(os.path.join(hf, name))).index(t))
    else:
        got = tl.load(tmp_path / "tl" / TL_WEIGHTS)
        assert set(got) == set(next(iter(shards.values())))
    convert(tmp_path / "tl", tmp_path / "hf2", progress=False)
    assert _files(tmp_path / "hf2") == _files(hf)  # every file byte for byte, shards and index included
    for name in (n for n in _files(hf) if n.endswith(".safetensors")):
        a, b = load_file(os.path.join(hf, name)), load_file(str(tmp_path / "hf2" / name))
        assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) and a[k].dtype == b[k].dtype for k in a)


def test_the_training_record_survives_a_round_trip(tmp_path, capsys):
    d = tmp_path / "tl"
    d.mkdir()
    record = full_record()
    record["weights"] = dict(record["weights"], sha256=None)
    save_model_file(str(d / TL_WEIGHTS), {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(3, np.int8)},
                    training=record, dataset_params={"name": "toy", "split": "train"})
    (d / "config.json").write_bytes(OTHERS["config.json"])
    convert(d, tmp_path / "hf", progress=False)
    assert load_file(str(tmp_path / "hf" / ST_WEIGHTS))["b"].dtype == np.int8
    convert(tmp_path / "hf", tmp_path / "back", progress=False)
    assert read_training_record(tmp_path / "back" / TL_WEIGHTS) == read_training_record(d / TL_WEIGHTS)
    # the record's weights hash is over the list in its order: safetensors' layout order (b before w) is not kept
    assert verify_model_file(str(tmp_path / "back" / TL_WEIGHTS)) == read_training_record(d / TL_WEIGHTS)
    assert list(tl.open(tmp_path / "back" / TL_WEIGHTS).keys()) == ["w", "b"]
    outputs = []
    for path in (d / TL_WEIGHTS, tmp_path / "back" / TL_WEIGHTS):
        assert main(["record", str(path), "--json"]) == 0
        outputs.append(capsys.readouterr().out)
    assert outputs[0] == outputs[1]


def _bits(dtype_name: str, n: int, seed: int) -> np.ndarray:
    raw = np.random.default_rng(seed).integers(0, 256, n * np.dtype(dtype_name).itemsize, dtype=np.uint8)
    return raw.view(dtype_name)


NAMES = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=12).filter(
    lambda s: s != "__metadata__")
SHAPES = st.lists(st.integers(0, 3), max_size=3)
DTYPES = st.sampled_from(["float32", "float16", "int8", "uint8", "int64", "bool", "bfloat16", "float8_e4m3fn"])


@st.composite
def state_dicts(draw):
    names = draw(st.lists(NAMES, min_size=1, max_size=6, unique=True))
    out = {}
    for i, name in enumerate(names):
        dtype, shape = draw(DTYPES), draw(SHAPES)
        n = int(np.prod(shape))
        if dtype == "bool":
            a = np.random.default_rng(i).integers(0, 2, n).astype(bool)
        elif dtype == "bfloat16":
            a = bfloat16_bits(np.random.default_rng(i).standard_normal(n).astype(np.float32))
        elif dtype == "float8_e4m3fn":
            a = np.random.default_rng(i).integers(0, 256, n, dtype=np.uint8).view(from_name(dtype).bits)
        else:
            a = _bits(dtype, n, i)
        out[name] = a.reshape(shape)
    return out, draw(st.integers(1, 3))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=state_dicts())
def test_hf_to_tensorlist_to_hf_is_tensor_identical(tmp_path_factory, case):
    """Random names, dtypes (bfloat16 and float8 as safetensors holds them) and shapes, in 1 to 3 shards."""
    state, nshards = case
    root = tmp_path_factory.mktemp("h")
    src = root / "src"
    src.mkdir()
    names = list(state)
    groups = [names[i::nshards] for i in range(nshards) if names[i::nshards]]
    files = [ST_WEIGHTS] if len(groups) == 1 else \
        [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for fname, group in zip(files, groups):
        tl.save(root / "tmp.tl", {n: state[n] for n in group})
        convert(root / "tmp.tl", src / fname, progress=False)
    if len(groups) > 1:
        (src / ST_INDEX).write_text(json.dumps({"metadata": {"total_size": 0}, "weight_map": {
            n: f for f, group in zip(files, groups) for n in group}}, indent=2, ensure_ascii=False) + "\n")
    (src / "config.json").write_text("{}")
    convert(src, root / "tl", progress=False)
    convert(root / "tl", root / "back", progress=False)
    assert _files(root / "back") == _files(src)


class TestHostile:
    def test_config_without_weights(self, tmp_path):
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        with pytest.raises(FormatError, match="holds no weights") as e:
            convert(tmp_path / "m", tmp_path / "out", progress=False)
        assert e.value.file == str(tmp_path / "m") and not (tmp_path / "out").exists()

    def test_an_index_naming_a_missing_shard(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        os.unlink(os.path.join(hf, "model-00002-of-00002.safetensors"))
        with pytest.raises(FormatError, match="does not exist") as e:
            convert(hf, tmp_path / "out", progress=False)
        assert (e.value.file, e.value.field) == (os.path.join(hf, ST_INDEX), "weight_map/head.weight")
        assert not (tmp_path / "out").exists()

    @pytest.mark.parametrize("how", ["symlink", "dotdot"])
    def test_a_shard_outside_the_directory(self, tmp_path, how):
        hf = hf_dir(tmp_path / "hf")
        shard = os.path.join(hf, "model-00002-of-00002.safetensors")
        os.replace(shard, tmp_path / "outside.safetensors")
        with open(os.path.join(hf, ST_INDEX)) as f:
            index = json.load(f)
        if how == "symlink":
            os.symlink(tmp_path / "outside.safetensors", shard)
        else:
            index["weight_map"] = {t: "../outside.safetensors" if s.startswith("model-00002") else s
                                   for t, s in index["weight_map"].items()}
            with open(os.path.join(hf, ST_INDEX), "w") as f:
                json.dump(index, f)
        with pytest.raises(FormatError, match="outside the model directory|escapes") as e:
            convert(hf, tmp_path / "out", progress=False)
        assert e.value.file == os.path.join(hf, ST_INDEX) and e.value.field.startswith("weight_map/")
        assert not (tmp_path / "out").exists()

    def test_a_tensor_in_two_shards(self, tmp_path):
        shards = {**SHARDS, "model-00002-of-00002.safetensors": {**SHARDS["model-00002-of-00002.safetensors"],
                                                                 "norm.weight": np.ones(4, np.float16)}}
        hf = hf_dir(tmp_path / "hf", shards)
        with pytest.raises(FormatError, match="is in shards") as e:
            convert(hf, tmp_path / "out", progress=False)
        assert e.value.tensor_name == "norm.weight" and e.value.file == os.path.join(hf, ST_INDEX)

    def test_a_tensor_listed_twice_in_the_index(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        with open(os.path.join(hf, ST_INDEX)) as f:
            text = f.read()
        with open(os.path.join(hf, ST_INDEX), "w") as f:
            f.write(text.replace('"weight_map": {', '"weight_map": {"mask": "model-00001-of-00002.safetensors", '))
        with pytest.raises(FormatError, match="mask") as e:
            convert(hf, tmp_path / "out", progress=False)
        assert e.value.file == os.path.join(hf, ST_INDEX)

    @pytest.mark.parametrize("name", ["pytorch_model.bin", "pytorch_model-00001-of-00002.bin", "sub/w.pt",
                                      "extra.ckpt", "x.pth"])
    def test_pickled_weights_are_refused_unopened(self, tmp_path, name):
        hf = hf_dir(tmp_path / "hf")
        os.makedirs(os.path.dirname(os.path.join(hf, name)), exist_ok=True)
        with open(os.path.join(hf, name), "wb") as f:
            f.write(b"\x80\x02 not to be unpickled")
        with pytest.raises(FormatError, match="never unpickles.*tensorlist convert") as e:
            convert(hf, tmp_path / "out", progress=False)
        assert e.value.file == os.path.join(hf, name)

    def test_a_stray_safetensors_file_is_refused(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        save_file({"x": np.ones(2, np.float32)}, os.path.join(hf, "sub", "adapter.safetensors"))
        with pytest.raises(FormatError, match="not among the model's weights") as e:
            convert(hf, tmp_path / "out", progress=False)
        assert e.value.file == os.path.join(hf, "sub", "adapter.safetensors")

    def test_a_file_leading_outside_is_refused(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        (tmp_path / "secret").write_text("no")
        os.symlink(tmp_path / "secret", os.path.join(hf, "tokenizer.model"))
        with pytest.raises(FormatError, match="outside the model directory"):
            convert(hf, tmp_path / "out", progress=False)
        convert(hf, tmp_path / "out", progress=False, allow_outside=True)  # trusted, it is copied
        assert (tmp_path / "out" / "tokenizer.model").read_text() == "no"

    def test_a_fifo_is_refused(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        os.mkfifo(os.path.join(hf, "pipe"))
        with pytest.raises(FormatError, match="not a regular file"):
            convert(hf, tmp_path / "out", progress=False)

    def test_the_cli_says_it_in_one_line(self, tmp_path, capsys):
        (tmp_path / "m").mkdir()
        (tmp_path / "m" / "config.json").write_text("{}")
        assert main(["convert", str(tmp_path / "m"), str(tmp_path / "out")]) == 1
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Traceback" not in err
        assert err.startswith(f"tensorlist convert: error: {tmp_path / 'm'}: holds no weights")


class TestDestination:
    def test_a_directory_holding_files_is_refused_unless_overwrite(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        out = tmp_path / "out"
        out.mkdir()
        (out / "mine.txt").write_text("keep")
        with pytest.raises(DestinationExistsError):
            convert(hf, out, progress=False, overwrite=False)
        assert os.listdir(out) == ["mine.txt"]
        convert(hf, out, progress=False)  # overwrite: namesakes replaced, the rest kept
        assert (out / "mine.txt").read_text() == "keep" and (out / TL_INDEX).exists()
        convert(hf, out, progress=False)  # again: the old descriptors' data files go with them
        assert len([n for n in os.listdir(out) if n.endswith(".data")]) == 2

    def test_a_conversion_that_fails_leaves_nothing(self, tmp_path):
        d = tmp_path / "tl"
        d.mkdir()
        tl.save(d / TL_WEIGHTS, {"z": np.ones(2, np.complex128)})  # safetensors has no complex128
        with pytest.raises(TypeError, match="complex128") as e:
            convert(d, tmp_path / "new" / "out", progress=False)
        assert str(e.value).startswith(f"{tmp_path / 'new' / 'out' / 'model.safetensors'}: tensor 'z'")
        assert os.listdir(tmp_path) == ["tl"]

    def test_no_shard_size_or_pointer(self, tmp_path):
        with pytest.raises(TypeError, match="shard"):
            convert(hf_dir(tmp_path / "hf"), tmp_path / "out", shard_bytes=10, progress=False)

    def test_the_command_line_as_a_user_runs_it(self, tmp_path):
        hf = hf_dir(tmp_path / "hf")
        run = [sys.executable, "-m", "tensorlist", "convert", hf, str(tmp_path / "tl"), "--no-progress"]
        p = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert (p.returncode, p.stdout, p.stderr) == (0, "", "")
        p = subprocess.run(run, capture_output=True, text=True, timeout=120)
        assert p.returncode == 1
        assert p.stderr == f"tensorlist convert: error: {tmp_path / 'tl'}: exists and is not empty; pass --force to replace it\n"
        assert main(["convert", str(tmp_path / "tl"), str(tmp_path / "hf2"), "--no-progress"]) == 0
        assert _files(tmp_path / "hf2") == _files(hf)
