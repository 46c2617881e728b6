"""Tiny Llama models for the vLLM tests (tests/vllm/): a Hugging Face directory and its tensorlist twin.

Nothing is downloaded: the config, random weights (seeded) and a byte-level
WordLevel tokenizer are made here. vLLM's CPU attention needs head_dim >= 32.
"""
import json
import os
import shutil

import numpy as np

#: prompts as token ids (the engines run with a tokenizer, but ids keep the comparison exact)
PROMPTS = [[1, 17, 42, 99, 5], [1, 200, 3, 3, 3, 61, 7], [1, 128]]


def tokenizer(vocab_size: int):
    """A WordLevel tokenizer over ``vocab_size`` words ``t0``, ``t1``... split on whitespace."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"t{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="t1", eos_token="t2", unk_token="t0")


def hf_model(folder, *, tied=False, dtype="float32", shards=1, vocab_size=384, kv_heads=2, layers=2, seed=0,
             hidden=64, intermediate=128):
    """Saves a random Llama (``save_pretrained``, safetensors) and its tokenizer in ``folder``; returns it."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(hidden_size=hidden, num_attention_heads=hidden // 32, num_key_value_heads=kv_heads,
                         head_dim=32, intermediate_size=intermediate, num_hidden_layers=layers,
                         vocab_size=vocab_size, tie_word_embeddings=tied, max_position_embeddings=128,
                         bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).to(getattr(torch, dtype))
    with torch.no_grad():  # spread the weights so that greedy tokens vary
        for p in model.parameters():
            p.normal_(0, 0.5)
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    model.save_pretrained(folder, max_shard_size=size // shards + 1 if shards > 1 else "10GB")
    tokenizer(vocab_size).save_pretrained(folder)
    return os.fspath(folder)


def convert_by_hand(hf_dir, out_dir):
    """The tensorlist model directory of ``hf_dir``: one descriptor per safetensors shard, same tensor names.

    Non-weight files are copied byte for byte; several shards get ``model.index.json``
    (``weight_map`` onto the descriptors).
    """
    import safetensors.numpy
    import tensorlist

    os.makedirs(out_dir, exist_ok=True)
    shards = sorted(n for n in os.listdir(hf_dir) if n.endswith(".safetensors"))
    renamed = {}
    for n in shards:
        new = n[:-len(".safetensors")] + ".json"
        renamed[n] = new
        tensorlist.save(os.path.join(out_dir, new), _numpy_shard(os.path.join(hf_dir, n), safetensors.numpy))
    for n in os.listdir(hf_dir):
        if n.endswith(".safetensors") or n == "model.safetensors.index.json":
            continue
        shutil.copyfile(os.path.join(hf_dir, n), os.path.join(out_dir, n))
    index = os.path.join(hf_dir, "model.safetensors.index.json")
    if os.path.exists(index):
        with open(index) as f:
            doc = json.load(f)
        doc["weight_map"] = {k: renamed[v] for k, v in doc["weight_map"].items()}
        with open(os.path.join(out_dir, "model.index.json"), "w") as f:
            json.dump(doc, f)
    return os.fspath(out_dir)


def _numpy_shard(path, st_numpy):
    """A safetensors shard as numpy arrays; bfloat16 (which safetensors.numpy refuses) through torch."""
    try:
        return st_numpy.load_file(path)
    except (TypeError, ValueError):
        import safetensors.torch
        import tensorlist.torch as tt

        return {k: tt.to_numpy(v, bits=True) for k, v in safetensors.torch.load_file(path).items()}


def edit_tensors(folder, edit):
    """Rewrites ``folder``'s one tensorlist shard ``model.json`` with ``edit(dict of arrays)`` applied."""
    import tensorlist

    path = os.path.join(folder, "model.json")
    arrays = {k: np.array(v) for k, v in tensorlist.load(path, bits=True).items()}
    edit(arrays)
    tensorlist.save(path, arrays)
