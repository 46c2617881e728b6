#!/usr/bin/env python3
"""vLLM weight loading: the ``tensorlist`` load format against vLLM's own loaders, warm and cold.

One run: a random Llama (hidden 2048, 4 layers, vocab 16000, float32: 0.83 GB; ``--layers`` for
more) saved once with ``save_pretrained`` (safetensors) and converted (``tensorlist.convert``), then
loaded by vLLM's engine in a fresh process per measurement with each load format:

* ``safetensors``: vLLM's default loader (``DefaultModelLoader``, safetensors' mmap);
* ``safetensors_mt``: the same with ``enable_multithread_load`` (vLLM's threaded safetensors reads);
* ``runai_streamer``, ``fastsafetensors``: where their packages install and run on the CPU (a peer
  that fails is named with its error, and left out of the ratios);
* ``tensorizer``: vLLM's tensorizer format over the same state dict in one tensorizer file (made once
  where tensorizer is installed; vLLM loads it in ``load_model``, the child times its ``load_weights``);
* ``tensorlist``: ``tensorlist.vllm``'s loader (copy-on-write mappings of the shards, read whole as each
  opens; a parameter given a whole weight, or a fused one its parts lying back to back, takes the
  mapping's pages instead of a copy).

The time is that of the loader's ``load_weights`` (what vLLM logs as ``Loading weights took``), not
the engine's start-up: the child wraps the loader class's ``load_weights``, prints its time and exits.
Two conditions: warm (every file in the page cache) and cold (each file's pages evicted with
``posix_fadvise(DONTNEED)`` before each run, checked with ``mincore``; ``--drop-caches``: drop the
whole page cache instead, root only). Contenders run in a new seeded order each round
(``--repeat`` rounds). Ratio = peer's median / tensorlist's median: > 1 means tensorlist is faster.

Usage:
    python bench/vllm_load.py [--repeat 5] [--layers 4] [--conditions warm,cold] [--only REGEX]
                              [--dir DIR] [--drop-caches] [--json out.json]
"""
from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fresh import installed_env  # noqa: E402
from pagecache import evict, evict_dir, resident_fraction, warm  # noqa: E402

FORMATS = {
    "safetensors": ("hf", "safetensors", {}),
    "safetensors_mt": ("hf", "safetensors", {"enable_multithread_load": True}),
    "runai_streamer": ("hf", "runai_streamer", {}),
    "fastsafetensors": ("hf", "fastsafetensors", {}),
    "tensorizer": ("hf", "tensorizer", {}),  # its file: tz/model.tensors (see run_one)
    "tensorlist": ("tl", "tensorlist", {}),
}

CHILD = r"""
import json, os, sys, time
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
folder, load_format, extra = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
from vllm import LLM
from vllm.config.load import LoadConfig
from vllm.model_executor.model_loader import get_model_loader
from vllm.plugins import load_general_plugins
load_general_plugins()
cls = type(get_model_loader(LoadConfig(load_format=load_format, model_loader_extra_config=extra)))
inner = cls.load_weights
def timed(self, model, model_config):
    t = time.perf_counter()
    inner(self, model, model_config)
    print("LOADED", json.dumps(time.perf_counter() - t), flush=True)
    os._exit(0)  # the engine's start-up after the weights is not measured
cls.load_weights = timed
if load_format == "tensorizer":  # a Hugging Face state dict in one tensorizer file: vLLM loads it in load_model
    import torch
    from vllm.model_executor.model_loader.utils import initialize_model
    from vllm.utils.torch_utils import set_default_torch_dtype
    def serialized(self, vllm_config, prefix=""):  # vLLM's _load_model_serialized_cpu, its weights timed
        with set_default_torch_dtype(vllm_config.model_config.dtype):
            with torch.device(vllm_config.device_config.device):
                model = initialize_model(vllm_config=vllm_config, prefix=prefix)
            t = time.perf_counter()
            model.load_weights(self._get_weights_iterator())
        print("LOADED", json.dumps(time.perf_counter() - t), flush=True)
        os._exit(0)
    cls._load_model_serialized_cpu = serialized
LLM(model=folder, load_format=load_format, model_loader_extra_config=extra, dtype="float32", max_model_len=128,
    max_num_seqs=1, enforce_eager=True, kv_cache_memory_bytes=64 << 20, skip_tokenizer_init=True)
"""


def build(folder: str, layers: int) -> dict:
    """The safetensors and tensorlist directories of the bench's model (made once, kept in ``folder``)."""
    dirs = {"hf": os.path.join(folder, "hf"), "tl": os.path.join(folder, "tl"), "tz": os.path.join(folder, "tz")}
    if not os.path.exists(os.path.join(dirs["tl"], "config.json")):
        import torch
        from transformers import LlamaConfig, LlamaForCausalLM

        import tensorlist.convert

        torch.manual_seed(0)
        config = LlamaConfig(hidden_size=2048, intermediate_size=4096, num_hidden_layers=layers,
                             num_attention_heads=16, num_key_value_heads=4, vocab_size=16000,
                             max_position_embeddings=256, tie_word_embeddings=False)
        with torch.device("meta"):
            model = LlamaForCausalLM(config)
        model = model.to_empty(device="cpu")
        with torch.no_grad():
            for p in model.parameters():
                p.normal_(0, 0.02)
        model.save_pretrained(dirs["hf"], max_shard_size="400MB")
        tensorlist.convert.convert(dirs["hf"], dirs["tl"])
    if not os.path.exists(os.path.join(dirs["tz"], "model.tensors")):
        _tensorize(dirs["hf"], dirs["tz"])
    return dirs


def _tensorize(hf: str, out: str) -> None:
    """The safetensors shards' state dict in one tensorizer file (where tensorizer is installed)."""
    try:
        from safetensors.torch import load_file
        from tensorizer import TensorSerializer
    except ImportError:
        return
    os.makedirs(out, exist_ok=True)
    state = {}
    for p in files_of(hf):
        if p.endswith(".safetensors"):
            state.update(load_file(p))
    s = TensorSerializer(os.path.join(out, "model.tensors"))
    s.write_state_dict(state)
    s.close()


def files_of(folder: str):
    return [os.path.join(folder, n) for n in sorted(os.listdir(folder)) if os.path.isfile(os.path.join(folder, n))]


def run_one(key: str, dirs: dict, cold: bool, drop_all: bool) -> float:
    kind, load_format, extra = FORMATS[key]
    folder = dirs[kind]
    files = files_of(folder)
    if key == "tensorizer":
        uri = os.path.join(dirs["tz"], "model.tensors")
        if not os.path.exists(uri):
            raise RuntimeError("tensorizer: not installed")
        # top level for the engine's arguments (which rebuild tensorizer_config), nested for the loader's
        extra = {"tensorizer_uri": uri, "tensorizer_config": {"tensorizer_uri": uri}}
        files = [p for p in files if ".safetensors" not in p] + [uri]
    if cold:
        evict(files, drop_all)
        worst = max(resident_fraction(p) for p in files)
        if worst > 0.01:
            raise RuntimeError(f"{folder}: {worst:.1%} of a file stayed in the page cache after eviction")
    else:
        warm(files)
    out = subprocess.run([sys.executable, "-c", CHILD, folder, load_format, json.dumps(extra)],
                         capture_output=True, text=True, env=installed_env(VLLM_LOGGING_LEVEL="WARNING"))
    m = re.search(r"^LOADED (\S+)$", out.stdout, re.M)
    if not m:
        tail = (out.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise RuntimeError(f"{key}: no load: {tail[:300]}")
    return float(m.group(1))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--conditions", default="warm,cold")
    ap.add_argument("--only", default=None, help="regex of the contenders to run (tensorlist always runs)")
    ap.add_argument("--dir", default=None, help="keep the model here (default: a temporary directory)")
    ap.add_argument("--drop-caches", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    keys = [k for k in FORMATS if k == "tensorlist" or not args.only or re.search(args.only, k)]
    with tempfile.TemporaryDirectory() as tmp:
        dirs = build(args.dir or tmp, args.layers)
        size = sum(os.path.getsize(p) for p in files_of(dirs["tl"]) if p.endswith(".data"))
        print(f"model: Llama hidden 2048, {args.layers} layers, float32, {size / 1e9:.2f} GB of weights; "
              f"{args.repeat} rounds, a fresh process per load")
        results, failed = _measure(keys, dirs, args)
    _report(results, failed)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"results": results, "failed": failed}, f, indent=1)
    return 0


def _measure(keys, dirs, args):
    results = {c: {k: [] for k in keys} for c in args.conditions.split(",")}
    failed = {}
    rng = random.Random(0)
    for cond in results:
        for _ in range(args.repeat):
            order = [k for k in keys if k not in failed]
            rng.shuffle(order)
            for k in order:
                try:
                    results[cond][k].append(run_one(k, dirs, cond == "cold", args.drop_caches))
                except RuntimeError as e:
                    failed[k] = str(e)
    return results, failed


def _report(results, failed) -> None:
    for cond, by_key in results.items():
        if not by_key["tensorlist"]:
            continue
        base = statistics.median(by_key["tensorlist"])
        print(f"\n{cond}: load_weights seconds (median, min, max) and ratio peer/tensorlist (> 1: tensorlist faster)")
        for k, times in by_key.items():
            if not times:
                continue
            med = statistics.median(times)
            print(f"  {k:16s} {med:7.3f} {min(times):7.3f} {max(times):7.3f}   ratio {med / base:5.2f}")
    for k, why in failed.items():
        print(f"  {k}: did not run: {why}")


if __name__ == "__main__":
    sys.exit(main())
