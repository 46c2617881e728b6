"""Fixtures of the vLLM tests: tiny Llama directories (safetensors and tensorlist twins) and engines.

The engines run in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: a failed load raises here, and
an engine starts in ~2 s instead of ~17 s); tests that need vLLM's own processes say so and run them
(see ``spawned``). Nothing here imports vLLM at module level: without it, the test modules skip.
"""
import os

import pytest


@pytest.fixture(autouse=True, scope="session")
def _in_process():
    """Engines in this process; vLLM caches its environment once an engine started, so the cache is reset too."""
    import vllm.envs

    old = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    vllm.envs.disable_envs_cache()
    yield
    if old is None:
        os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    else:
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = old


@pytest.fixture
def spawned():
    """vLLM's default: the engine core in a process of its own (the plugin then registers itself there)."""
    import vllm.envs

    vllm.envs.disable_envs_cache()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "1"
    yield
    vllm.envs.disable_envs_cache()
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """``case -> (safetensors dir, tensorlist dir)`` for ``_vllm_support.CASES``, each built on first use."""
    import _vllm_support as S

    built = {}

    def get(case):
        if case not in built:
            root = tmp_path_factory.mktemp(case)
            hf = S.hf_model(root / "hf", **S.CASES[case])
            built[case] = hf, S.convert(hf, root / "tl")
        return built[case]

    return get


@pytest.fixture
def loader_log(monkeypatch):
    """The messages the loader logs in this process at INFO.

    Recorded at the loader's ``logger.info`` itself: vLLM's logging set-up, rerun as an engine
    starts, drops the handlers of its child loggers, and its own handler keeps the stdout it first saw.
    """
    from tensorlist.vllm import loader

    messages = []
    info = loader.logger.info

    def recorded(msg, *args, **kwargs):
        messages.append(msg % args)
        info(msg, *args, **kwargs)

    monkeypatch.setattr(loader.logger, "info", recorded)
    return messages
