"""The model directory layout (``tensorlist.convert.modeldir``): what a tensorlist model directory holds, read back.

Torch-free: the safetensors fixtures are written with ``safetensors.numpy``.
"""
import json
import os

import numpy as np
import pytest
from safetensors.numpy import save_file

import tensorlist as tl
from tensorlist.convert import convert, infer_format
from tensorlist.convert.modeldir import (ST_INDEX, TL_INDEX, TL_WEIGHTS, is_hf_model_dir, is_tl_model_dir, model_format,
                                         tensor_shards, weight_files)
from tensorlist.errors import FormatError

SHARDS = {"model-00001-of-00002.safetensors": {"a": np.arange(6, dtype=np.float32), "b": np.ones((2, 2), np.int8)},
          "model-00002-of-00002.safetensors": {"c": np.arange(3, dtype=np.float16)}}


def hf_sharded(d, shards=SHARDS, weight_map=None) -> str:
    os.makedirs(d, exist_ok=True)
    for name, tensors in shards.items():
        save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
    wm = weight_map or {t: name for name, tensors in shards.items() for t in tensors}
    with open(os.path.join(d, ST_INDEX), "w") as f:
        json.dump({"metadata": {"total_size": 36}, "weight_map": wm}, f)
    with open(os.path.join(d, "config.json"), "w") as f:
        f.write('{"model_type": "llama"}')
    return str(d)


def tl_sharded(tmp_path) -> str:
    convert(hf_sharded(tmp_path / "hf"), tmp_path / "tl", progress=False)
    return str(tmp_path / "tl")


def test_a_sharded_directory_is_read_shard_by_shard(tmp_path):
    d = tl_sharded(tmp_path)
    assert weight_files(d) == [os.path.join(d, "model-00001-of-00002.json"), os.path.join(d, "model-00002-of-00002.json")]
    assert tensor_shards(d) == {"a": weight_files(d)[0], "b": weight_files(d)[0], "c": weight_files(d)[1]}
    with open(os.path.join(d, TL_INDEX)) as f:
        assert json.load(f) == {"metadata": {"total_size": 36}, "weight_map": {
            "a": "model-00001-of-00002.json", "b": "model-00001-of-00002.json", "c": "model-00002-of-00002.json"}}


def test_one_file(tmp_path):
    d = tmp_path / "tl"
    d.mkdir()
    tl.save(d / TL_WEIGHTS, {"w": np.ones(3, np.float32), "v": np.zeros(2, np.int64)})
    assert weight_files(d) == [str(d / TL_WEIGHTS)]
    assert tensor_shards(d) == {"w": str(d / TL_WEIGHTS), "v": str(d / TL_WEIGHTS)}


def test_the_kinds_are_told_apart(tmp_path):
    hf = hf_sharded(tmp_path / "hf")
    tl_dir = tl_sharded(tmp_path / "x")
    assert (is_hf_model_dir(hf), is_tl_model_dir(hf), model_format(hf)) == (True, False, "hf-model")
    assert (is_hf_model_dir(tl_dir), is_tl_model_dir(tl_dir), model_format(tl_dir)) == (False, True, "tensorlist-model")
    assert infer_format(hf, for_reading=True) == "hf-model"
    assert infer_format(tl_dir, for_reading=True) == "tensorlist-model"
    assert model_format(tmp_path / "none") is None


@pytest.mark.parametrize("weight_map,field,reason", [
    ({"a": "model-00001-of-00002.json", "b": "model-00001-of-00002.json", "c": "missing.json"},
     "weight_map/c", "does not exist"),
    ({"a": "model-00001-of-00002.json", "b": "model-00001-of-00002.json", "c": "../x.json"},
     "weight_map/c", "escapes"),
    ({"a": "model-00001-of-00002.json", "b": "model-00001-of-00002.json", "c": "model-00001-of-00002.json"},
     "weight_map/c", "c.*is in no shard"),
    ({"a": "model-00001-of-00002.json", "c": "model-00002-of-00002.json"}, "weight_map", "not in weight_map"),
    ({"a": "model-00001-of-00002.json", "b": "model-00001-of-00002.json", "c": 3}, "weight_map/c", "file name"),
])
def test_a_bad_index_names_the_file_and_the_field(tmp_path, weight_map, field, reason):
    d = tl_sharded(tmp_path)
    with open(os.path.join(d, TL_INDEX), "w") as f:
        json.dump({"metadata": {}, "weight_map": weight_map}, f)
    with pytest.raises(FormatError, match=reason) as e:
        tensor_shards(d)
    assert (e.value.file, e.value.field) == (os.path.join(d, TL_INDEX), field)


def test_a_shard_leading_outside_by_a_symlink_is_refused(tmp_path):
    d = tl_sharded(tmp_path)
    outside = tmp_path / "elsewhere.json"
    os.replace(os.path.join(d, "model-00002-of-00002.json"), outside)
    os.symlink(outside, os.path.join(d, "model-00002-of-00002.json"))
    with pytest.raises(FormatError, match="outside the model directory") as e:
        weight_files(d)
    assert e.value.field == "weight_map/c"


def test_a_directory_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FormatError, match="holds no weights") as e:
        weight_files(tmp_path)
    assert e.value.file == str(tmp_path)
