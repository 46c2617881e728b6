"""A model directory that does not fit the model: the engine is not built, and the user is told which
tensor of which file. Ported from vLLM's test_default_loader_missing_weights.py (a parameter the
checkpoint lacks), with a tensor of the wrong dims and one the model lacks; each scenario also runs on
the stock ``safetensors`` format (which fails too, with its own message, except where noted).

In these tests the engine runs in this process, so the FormatError raised by the loader reaches the
caller of ``LLM(...)`` itself. With vLLM's default (the engine core in a process of its own),
``LLM(...)`` raises ``RuntimeError("Engine core initialization failed...")`` and the FormatError, with
its message, is in the engine's log (stdout): ``test_spawned_engine_logs_the_format_error``.
"""
import os
import shutil

import numpy as np
import pytest

pytest.importorskip("vllm")
torch = pytest.importorskip("torch")
import safetensors.torch  # noqa: E402

from _vllm_support import edit_tensors, start  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402

DOWN = "model.layers.1.mlp.down_proj.weight"
NORM = "model.layers.0.post_attention_layernorm.weight"
K = "model.layers.0.self_attn.k_proj.weight"
EXTRA = "model.layers.0.mlp.extra.weight"

EDITS = {
    "dims": lambda a: a.__setitem__(DOWN, a[DOWN][:, :100].copy()),
    "missing": lambda a: a.pop(NORM),
    "missing_part": lambda a: a.pop(K),
    "extra": lambda a: a.__setitem__(EXTRA, np.zeros(3, np.float32)),
}


@pytest.fixture
def broken(models, tmp_path):
    """``(case, format) -> directory``: a copy of the float32 model with ``EDITS[case]`` applied to its weights."""
    def make(case, load_format):
        src = models("float32")[0 if load_format == "safetensors" else 1]
        out = tmp_path / f"{case}-{load_format}"
        shutil.copytree(src, out)
        if load_format == "tensorlist":
            edit_tensors(out, EDITS[case])
        else:
            path = os.path.join(out, "model.safetensors")
            arrays = {k: v.numpy() for k, v in safetensors.torch.load_file(path).items()}
            EDITS[case](arrays)
            safetensors.torch.save_file({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()},
                                        path, metadata={"format": "pt"})
        return out
    return make


@pytest.mark.parametrize("case,tensor,reason", [
    ("dims", DOWN, r"float32 \[64, 100\] does not fit the model \(LlamaForCausalLM\)"),
    ("extra", EXTRA, r"float32 \[3\] does not fit the model \(LlamaForCausalLM\): ValueError: There is no module"),
])
def test_tensor_that_does_not_fit(broken, case, tensor, reason):
    folder = broken(case, "tensorlist")
    with pytest.raises(FormatError, match=reason) as e:
        start(folder, "tensorlist")
    assert e.value.tensor_name == tensor and e.value.file == os.path.join(folder, "model.json")
    assert str(e.value).startswith(f"{folder}{os.sep}model.json: tensor ") and repr(tensor) in str(e.value)


@pytest.mark.parametrize("case,tensor", [("missing", NORM), ("missing_part", K)])
def test_tensor_missing(broken, case, tensor):
    folder = broken(case, "tensorlist")
    with pytest.raises(FormatError, match=f"tensor '{tensor}' is missing: the model .LlamaForCausalLM. needs it") as e:
        start(folder, "tensorlist")
    assert e.value.tensor_name == tensor and e.value.file == os.path.join(folder, "model.json")


@pytest.mark.parametrize("case,message", [("dims", "exceeds dimension size"), ("extra", "There is no module"),
                                          ("missing", "Following weights were not initialized")])
def test_stock_safetensors_fails_too(broken, case, message):
    with pytest.raises(Exception, match=message):
        start(broken(case, "safetensors"), "safetensors")


def test_stock_safetensors_serves_a_missing_part(broken):
    """Stock vLLM 0.32 serves a model whose k_proj is missing (q and v fill qkv_proj): tensorlist refuses it."""
    start(broken("missing_part", "safetensors"), "safetensors")


def test_spawned_engine_logs_the_format_error(broken, spawned, capfd):
    folder = broken("dims", "tensorlist")
    with pytest.raises(RuntimeError, match="Engine core initialization failed"):
        start(folder, "tensorlist")
    log = "".join(capfd.readouterr())  # vLLM logs the workers' tracebacks to stdout
    assert f"tensorlist.errors.FormatError: {folder}{os.sep}model.json: tensor 12 ({DOWN!r}): float32 [64, 100]" in log
