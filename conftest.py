"""pytest's collection at the repository root: the package's doctests need torch only in its adapters.

Without torch installed (``pip install .`` plus the test tools), the modules
that import torch are not collected for ``--doctest-modules``, so every other
doctest and test still runs; their tests in ``tests/`` skip with a reason.
"""
import importlib.util

collect_ignore = []
if importlib.util.find_spec("torch") is None:
    collect_ignore += ["tensorlist/torch.py", "tensorlist/_torch_bridge.py", "tensorlist/_staging.py",
                       "tensorlist/nn.py", "tensorlist/dcp/_storage.py", "tensorlist/loops"]
if importlib.util.find_spec("jax") is None:
    collect_ignore += ["tensorlist/jax.py", "tensorlist/_jax_bridge.py", "tensorlist/_jax_shards.py"]
