"""Token identity: greedy tokens from a tensorlist model directory equal those of its safetensors twin.

Ported from vLLM's loader tests (test_sharded_state_loader.py's ``out_before == out_after``, the runai
streamer's and fastsafetensors' generate-from-a-model tests), on tiny random Llamas built here, each
case served by the stock ``safetensors`` format and by ``tensorlist``.
"""
import pytest

pytest.importorskip("vllm")

from _vllm_support import CASES, generate  # noqa: E402


@pytest.fixture(scope="module")
def stock_tokens(models):
    cache = {}

    def get(case):
        if case not in cache:
            cache[case] = generate(models(case)[0], "safetensors")
        return cache[case]

    return get


@pytest.mark.parametrize("case", sorted(CASES))
def test_same_tokens_as_safetensors(case, models, stock_tokens, loader_log):
    tokens = generate(models(case)[1], "tensorlist")
    assert tokens == stock_tokens(case)
    assert len({t for seq in tokens for t in seq}) > 8  # greedy tokens that vary: the weights are used
    assert any(m.startswith("Loading weights took ") for m in loader_log)
    # whole weights (o_proj, down_proj, norms, embeddings) are the mappings' pages, not copies, where the
    # stored dtype is the engine's (float32); bfloat16 weights are converted by the loaders' copies
    adopted = any(m.endswith(" taken from the mappings uncopied") for m in loader_log)
    assert adopted == (case != "bfloat16"), loader_log


def test_same_tokens_with_the_engine_in_its_own_process(models, stock_tokens, spawned):
    """vLLM's default: the engine core and its worker are spawned, and register the plugin themselves."""
    assert generate(models("float32")[1], "tensorlist") == stock_tokens("float32")


PART_ORDERS = {  # each layer's tensors in this order in the shard
    "fused parts back to back": ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
    "fused parts apart": ["q_proj", "o_proj", "k_proj", "v_proj", "gate_proj", "down_proj", "up_proj"],
    "fused parts reversed": ["v_proj", "k_proj", "q_proj", "o_proj", "up_proj", "gate_proj", "down_proj"],
}


@pytest.mark.parametrize("order", sorted(PART_ORDERS))
def test_fused_parameters_take_their_parts_only_where_they_lie_in_order(order, models, stock_tokens, loader_log,
                                                                         tmp_path):
    """qkv_proj and gate_up_proj view the shard where their parts lie back to back in their order; a part
    found elsewhere undoes that view before anything is written: the tokens are the stock ones either way."""
    import re
    import shutil

    import numpy as np

    import tensorlist

    folder = shutil.copytree(models("float32")[1], tmp_path / "tl")
    parts = PART_ORDERS[order]

    def place(name):
        m = re.match(r"model\.layers\.(\d+)\.", name)
        part = next((i for i, p in enumerate(parts) if f".{p}." in name), len(parts))
        return (int(m.group(1)) if m else -1, part, name)

    path = folder / "model.json"
    arrays = {k: np.array(v) for k, v in tensorlist.load(path, bits=True).items()}
    tensorlist.save(path, {k: arrays[k] for k in sorted(arrays, key=place)})
    assert generate(folder, "tensorlist") == stock_tokens("float32")
    (count, nbytes), = [tuple(map(int, m.groups())) for m in
                        (re.match(r"(\d+) tensors \((\d+) bytes\) taken", line) for line in loader_log) if m]
    everything = sum(a.nbytes for a in arrays.values())
    if order == "fused parts back to back":
        assert nbytes == everything  # every weight is the mapping's pages
    else:
        fused = sum(a.nbytes for k, a in arrays.items() if re.search(r"(q|k|v|gate|up)_proj", k))
        assert nbytes == everything - fused
