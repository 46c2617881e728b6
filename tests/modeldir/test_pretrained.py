"""``tensorlist.huggingface.from_pretrained`` against transformers' own ``from_pretrained`` (needs torch, transformers)."""
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="from_pretrained needs torch")
transformers = pytest.importorskip("transformers", reason="from_pretrained needs transformers")

import tensorlist as tl  # noqa: E402
from _record_support import full_record  # noqa: E402
from tensorlist.convert import convert  # noqa: E402
from tensorlist.convert.modeldir import TL_WEIGHTS, tensor_shards  # noqa: E402
from tensorlist.errors import FormatError  # noqa: E402
from tensorlist.huggingface import from_pretrained  # noqa: E402
from tensorlist.provenance.record import save_model_file  # noqa: E402


def tiny(tie: bool):
    return transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                    num_hidden_layers=2, vocab_size=256, intermediate_size=128,
                                    tie_word_embeddings=tie)


def _logits(model, ids):
    with torch.no_grad():
        return model(ids).logits


@pytest.mark.parametrize("sharded", [False, True], ids=["one shard", "shards"])
@pytest.mark.parametrize("tie", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["float32", "bfloat16"])
def test_the_logits_equal_the_safetensors_directorys(tmp_path, sharded, tie, dtype):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny(tie)).to(dtype)
    hf = tmp_path / "hf"
    model.save_pretrained(hf, max_shard_size="50KB" if sharded else "5GB")
    assert os.path.exists(hf / ("model.safetensors.index.json" if sharded else "model.safetensors"))
    convert(hf, tmp_path / "tl", progress=False)
    ids = torch.randint(0, 256, (2, 7), generator=torch.Generator().manual_seed(1))
    stock = transformers.AutoModelForCausalLM.from_pretrained(hf)
    for cls in (transformers.AutoModelForCausalLM, transformers.LlamaForCausalLM):
        ours = from_pretrained(cls, tmp_path / "tl")
        assert type(ours) is type(stock) and not ours.training and ours.dtype == stock.dtype == dtype
        assert torch.equal(_logits(ours, ids), _logits(stock, ids))
        if tie:
            assert ours.lm_head.weight is ours.model.embed_tokens.weight
    cast = from_pretrained(transformers.AutoModelForCausalLM, tmp_path / "tl", dtype=torch.float16)
    stock_cast = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float16)
    assert cast.dtype == torch.float16 and torch.equal(_logits(cast, ids), _logits(stock_cast, ids))


def _trainer_dir(tmp_path):
    """A directory as ``TensorListTrainer.save_model`` writes it: the model file with its record, the configs."""
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny(True))
    d = tmp_path / "trained"
    d.mkdir()
    record = full_record()
    record["weights"] = dict(record["weights"], sha256=None)
    save_model_file(str(d / TL_WEIGHTS), model.state_dict(), training=record,
                    dataset_params={"name": "toy", "split": "train"})
    model.config.save_pretrained(d)
    model.generation_config.save_pretrained(d)
    (d / "tokenizer.json").write_text('{"version": "1.0"}')
    (d / "training_args.json").write_text("{}")
    return model, d


def test_a_trainer_output_is_a_model_directory(tmp_path):
    model, d = _trainer_dir(tmp_path)
    ids = torch.randint(0, 256, (1, 5), generator=torch.Generator().manual_seed(2))
    model.eval()
    convert(d, tmp_path / "hf", progress=False)
    stock = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")
    ours = from_pretrained(transformers.AutoModelForCausalLM, d)
    assert torch.equal(_logits(stock, ids), _logits(model, ids))
    assert torch.equal(_logits(ours, ids), _logits(model, ids))
    assert (tmp_path / "hf" / "tokenizer.json").read_text() == '{"version": "1.0"}'


def _one_file(tmp_path, change):
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(tiny(False))
    d = tmp_path / "tl"
    d.mkdir()
    state = {k: v.numpy() for k, v in model.state_dict().items()}
    change(state)
    tl.save(d / TL_WEIGHTS, state)
    model.config.save_pretrained(d)
    return d


@pytest.mark.parametrize("change,name,reason", [
    (lambda s: s.pop("model.norm.weight"), "model.norm.weight", "missing"),
    (lambda s: s.__setitem__("extra.weight", np.ones(2, np.float32)), "extra.weight", "not a tensor of the model"),
    (lambda s: s.__setitem__("model.norm.weight", np.ones(3, np.float32)), "model.norm.weight", "shape"),
], ids=["missing", "extra", "wrong shape"])
def test_a_tensor_that_does_not_fit_is_named(tmp_path, change, name, reason):
    d = _one_file(tmp_path, change)
    with pytest.raises(FormatError, match=reason) as e:
        from_pretrained(transformers.LlamaForCausalLM, d)
    assert e.value.tensor_name == name or name in str(e.value)
    assert e.value.file == str(d / TL_WEIGHTS)


def test_a_directory_without_config(tmp_path):
    d = _one_file(tmp_path, lambda s: None)
    os.unlink(d / "config.json")
    with pytest.raises(FormatError, match="config.json"):
        from_pretrained(transformers.AutoModelForCausalLM, d)
    assert tensor_shards(d)
