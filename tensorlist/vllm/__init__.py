"""vLLM's ``tensorlist`` load format: a tensorlist model directory served by vLLM (docs/FRAMEWORKS.md, "vLLM").

:func:`register` is the ``vllm.general_plugins`` entry point (pyproject.toml): vLLM calls it in every
process it starts, so ``LLM(model=DIR, load_format="tensorlist")`` and ``vllm serve DIR --load-format
tensorlist`` work with nothing imported by the user. Without vLLM installed it does nothing and imports
neither vLLM nor torch. The loader is :mod:`tensorlist.vllm.loader`.

Example:
    >>> register()  # what vLLM does itself; harmless without vLLM, and when called again
"""
from __future__ import annotations

import importlib.util

__all__ = ["register"]


def register() -> None:
    """Registers the load format ``"tensorlist"`` with vLLM; a no-op where vLLM is not installed."""
    if importlib.util.find_spec("vllm") is None:
        return
    from tensorlist.vllm.loader import register_loader

    register_loader()
