"""pytest's collection at the repository root: the doctests need torch, mlx, tensorflow only in their adapters.

Without torch installed (``pip install .`` plus the test tools), the modules
that import torch are not collected for ``--doctest-modules``, so every other
doctest and test still runs; their tests in ``tests/`` skip with a reason.
"""
import importlib.util
import sys

# torch's CUDA wheels (the registry's torch on every Python but 3.11 here) bring triton, and TensorFlow
# bundles its own LLVM: once tensorflow is imported (collecting tests/adapters/test_tensorflow.py does), torch's
# first import of triton (torch.optim -> torch._dynamo -> triton) kills the process with a segfault
# (TensorFlow 2.21, torch 2.13.0 CUDA wheel, Python 3.12). No test uses triton (every test runs on
# the CPU), so the suite hides it from torch where both are installed; docs/FRAMEWORKS.md says what a
# program that imports both should do.
if importlib.util.find_spec("tensorflow") is not None and importlib.util.find_spec("triton") is not None:
    sys.modules.setdefault("triton", None)  # `import triton` then raises ImportError: torch runs without it

collect_ignore = []
if importlib.util.find_spec("torch") is None:
    collect_ignore += ["tensorlist/torch.py", "tensorlist/_bridges/torch.py", "tensorlist/dcp/torch_storage.py",
                       "tensorlist/loops", "tensorlist/huggingface"]
if importlib.util.find_spec("mlx") is None:
    collect_ignore += ["tensorlist/mlx.py", "tensorlist/_bridges/mlx.py"]
if importlib.util.find_spec("tensorflow") is None:
    collect_ignore += ["tensorlist/tensorflow.py", "tensorlist/_bridges/tf.py"]
if importlib.util.find_spec("jax") is None:
    collect_ignore += ["tensorlist/jax.py", "tensorlist/_bridges/jax.py", "tensorlist/dcp/jax_shards.py"]
# The Orbax adapter imports orbax-checkpoint (and jax): its doctests need both.
if importlib.util.find_spec("orbax") is None or importlib.util.find_spec("jax") is None:
    collect_ignore += ["tensorlist/orbax.py"]
if importlib.util.find_spec("transformers") is None:  # TensorListTrainer's module imports transformers at its top
    collect_ignore += ["tensorlist/huggingface/trainer.py"]
if importlib.util.find_spec("lightning") is None:  # tensorlist.lightning needs lightning (and torch)
    collect_ignore += ["tensorlist/lightning"]
if importlib.util.find_spec("vllm") is None or importlib.util.find_spec("torch") is None:  # the loader imports both
    collect_ignore += ["tensorlist/vllm/loader.py", "tensorlist/vllm/adopt.py"]
if importlib.util.find_spec("torch") is None:  # the slices of a tensor-parallel rank are torch tensors
    collect_ignore += ["tensorlist/vllm/slices.py"]
if importlib.util.find_spec("cryptography") is None:  # tensorlist.provenance.signing's example makes a key (tensorlist[sign])
    collect_ignore += ["tensorlist/provenance/signing"]
