"""Model directories for the tests: a Hugging Face one written with ``safetensors.numpy`` (no torch needed)."""
import json
import os

import numpy as np
from safetensors.numpy import save_file

from tensorlist.convert.modeldir import ST_INDEX, ST_WEIGHTS

SHARDS = {"model-00001-of-00002.safetensors": {"embed.weight": np.arange(12, dtype=np.float32).reshape(3, 4),
                                               "norm.weight": np.ones(4, np.float16)},
          "model-00002-of-00002.safetensors": {"head.weight": np.arange(8, dtype=np.int64).reshape(2, 4),
                                               "mask": np.array([True, False])}}
#: Files a Hugging Face model directory holds besides its weights (a nested one included).
OTHERS = {"config.json": b'{"model_type": "llama", "vocab_size": 256}\n', "tokenizer.json": b'{"version": "1.0"}',
          "tokenizer_config.json": b"{}", "special_tokens_map.json": b"{}", "README.md": b"# a model\n",
          "chat_template.jinja": b"{{ messages }}", os.path.join("sub", "deeper", "notes.bin"): bytes(range(256))}


def _others(d) -> None:
    for rel, data in OTHERS.items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "wb") as f:
            f.write(data)


def hf_dir(d, shards=SHARDS, metadata=None) -> str:
    """A Hugging Face model directory: sharded (an index) for several shards, else ``model.safetensors``."""
    os.makedirs(d, exist_ok=True)
    if len(shards) == 1:
        save_file(next(iter(shards.values())), os.path.join(d, ST_WEIGHTS), metadata={"format": "pt"})
    else:
        for name, tensors in shards.items():
            save_file(tensors, os.path.join(d, name), metadata={"format": "pt"})
        wm = {t: name for name, tensors in shards.items() for t in sorted(tensors)}
        with open(os.path.join(d, ST_INDEX), "w") as f:  # as huggingface_hub writes it
            f.write(json.dumps({"metadata": metadata or {"total_size": 122, "total_parameters": 30},
                                "weight_map": wm}, indent=2) + "\n")
    _others(d)
    return str(d)
