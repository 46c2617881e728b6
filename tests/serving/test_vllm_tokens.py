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
