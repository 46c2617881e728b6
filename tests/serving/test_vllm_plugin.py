"""The plugin's registration, ported from vLLM's tests/model_executor/model_loader/ (test_registry.py,
the runai streamer's test_get_model_loader_with_runai_flag, the sharded-state loader's extra-config
checks), each run against a stock load format too."""
import importlib.metadata
import subprocess
import sys

import pytest

pytest.importorskip("vllm")

from vllm.config.load import LoadConfig  # noqa: E402
from vllm.model_executor.model_loader import DefaultModelLoader, get_model_loader  # noqa: E402
from vllm.plugins import load_general_plugins  # noqa: E402

from tensorlist.vllm.loader import TensorListModelLoader  # noqa: E402


def test_entry_point_names_register():
    (ep,) = [e for e in importlib.metadata.entry_points(group="vllm.general_plugins") if e.name == "tensorlist"]
    assert ep.value == "tensorlist.vllm:register"


@pytest.mark.parametrize("load_format,cls", [("tensorlist", TensorListModelLoader),
                                             ("safetensors", DefaultModelLoader)])
def test_get_model_loader(load_format, cls):
    load_general_plugins()  # what every vLLM process does first: the entry point registers "tensorlist"
    assert type(get_model_loader(LoadConfig(load_format=load_format))) is cls


@pytest.mark.parametrize("load_format", ["tensorlist", "safetensors"])
def test_rejects_unexpected_extra_config(load_format):
    load_general_plugins()
    with pytest.raises(ValueError, match="unexpected"):
        get_model_loader(LoadConfig(load_format=load_format, model_loader_extra_config={"unexpected": 1}))


def test_verify_needs_a_key():
    with pytest.raises(ValueError, match="public_key or certificate_chain"):
        TensorListModelLoader(LoadConfig(load_format="tensorlist", model_loader_extra_config={"verify": True}))


def test_register_imports_nothing_without_vllm():
    """Without vLLM, register() is a no-op that imports neither vLLM nor torch (vLLM hidden from find_spec)."""
    code = ("import importlib.util, sys\n"
            "real = importlib.util.find_spec\n"
            "importlib.util.find_spec = lambda name, *a: None if name == 'vllm' else real(name, *a)\n"
            "import tensorlist.vllm\n"
            "tensorlist.vllm.register()\n"
            "assert 'vllm' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)
