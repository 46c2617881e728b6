"""``from_pretrained`` for a tensorlist model directory (docs/FORMAT.md, "Model directories").

:func:`from_pretrained` reads the directory's weights through
``convert.modeldir.tensor_shards`` (every shard confined and checked against
the index) as copy-on-write mappings of the files (``tensorlist.torch.load_state``,
no copy until a tensor is written), and hands them to transformers' own
``from_pretrained`` as its ``state_dict``: the model is built on the meta device,
its weights converted, cast, tied and put in ``eval()`` mode exactly as for a
safetensors directory, so the two give the same model bit for bit.

Imports torch, transformers (when called), ``convert.modeldir``, ``torch`` and ``errors``.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Tuple

from tensorlist.convert.modeldir import CONFIG, tensor_shards
from tensorlist.errors import FormatError
from tensorlist.torch import load_state

__all__ = ["from_pretrained"]

#: The generation settings a stock load reads beside ``config.json``.
GENERATION_CONFIG = "generation_config.json"


def _state(directory: str, allow_outside: bool, key=None) -> Tuple[Dict[str, Any], Dict[str, str]]:
    """(every tensor of the directory, each tensor's file), each file mapped copy-on-write once."""
    shards = tensor_shards(directory, allow_outside=allow_outside)
    state: Dict[str, Any] = {}
    for path in dict.fromkeys(shards.values()):
        state.update(load_state(path, mmap="copy", key=key))
    return state, shards


def _refuse(info: dict, shards: Dict[str, str], directory: str) -> None:
    """A FormatError naming the first tensor the model lacks, does not know, or holds in another shape."""
    first_file = next(iter(shards.values()), directory)
    for key, why in (("mismatched_keys", "has another shape than the model's"),
                     ("unexpected_keys", "is not a tensor of the model"),
                     ("missing_keys", "is missing: the model needs it")):
        found = sorted(info.get(key) or ())
        if found:
            name = found[0][0] if isinstance(found[0], tuple) else found[0]
            raise FormatError(why, file=shards.get(name, first_file), tensor_name=name)


def from_pretrained(model_class, directory, *, allow_outside: bool = False, key=None, **kwargs):
    """``model_class.from_pretrained`` for a tensorlist model directory (or a ``TensorListTrainer`` output).

    Args:
        model_class: a transformers model class (``AutoModelForCausalLM``, ``LlamaForCausalLM``...).
        directory: a directory holding ``config.json`` and ``model.json`` (or ``model.index.json``).
        allow_outside: trust shards and data files outside the directory.
        key: the key of an encrypted directory (a ``tensorlist.Key`` or 32
            bytes): its weights are decrypted into private memory.
        **kwargs: passed to ``model_class.from_pretrained`` (``dtype``/``torch_dtype``,
            ``attn_implementation``, ``config``...).

    Returns:
        The model, in ``eval()`` mode, equal to ``model_class.from_pretrained`` of the
        safetensors directory it was converted from (or converts to).

    Raises:
        EncryptionError: an encrypted shard and no key, or the wrong key (naming the file).
        FormatError: a tensor the model lacks, does not know or holds in another shape (naming the
            tensor and its file), or a bad directory (naming the file and field).
    """
    import transformers  # here: importing tensorlist.huggingface does not import transformers

    directory = os.fspath(directory)
    config = kwargs.pop("config", None)
    if config is None:
        if not os.path.isfile(os.path.join(directory, CONFIG)):
            raise FormatError(f"holds no {CONFIG}: a model directory's configuration", file=directory)
        config = transformers.AutoConfig.from_pretrained(directory)
    if not hasattr(model_class, "config_class"):  # an Auto class: the concrete class it picks for this config
        import torch

        with torch.device("meta"):  # no memory, no initialisation worth the name
            model_class = type(model_class.from_config(config))
    state, shards = _state(directory, allow_outside, key)
    ignore = kwargs.pop("ignore_mismatched_sizes", False)  # asked for, a shape mismatch is transformers' to report
    model, info = model_class.from_pretrained(None, config=config, state_dict=state, output_loading_info=True,
                                              ignore_mismatched_sizes=True, **kwargs)
    _refuse({k: v for k, v in info.items() if not (ignore and k == "mismatched_keys")}, shards, directory)
    model.config.name_or_path = directory
    if os.path.isfile(os.path.join(directory, GENERATION_CONFIG)) and getattr(model, "generation_config", None):
        model.generation_config = transformers.GenerationConfig.from_pretrained(directory)
    return model
