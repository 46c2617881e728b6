"""What the Hugging Face tests share: the data and the model (with their DDP script), and an Accelerate epoch."""
import torch


class Tokens(torch.utils.data.Dataset):
    """16 fixed sequences of 8 token ids (labels = inputs: a language-model objective)."""

    def __init__(self, n=16, length=8):
        self.x = torch.randint(0, 64, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return {"input_ids": self.x[i], "labels": self.x[i]}


def tiny_gpt2():
    """A one-layer GPT-2 built from a config (nothing downloaded), seeded."""
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=16,
                                     bos_token_id=0, eos_token_id=0)
    return transformers.GPT2LMHeadModel(config)


def tiny_llama():
    """A two-layer Llama (hidden 64, 2 heads of 32, vocab 256) built from a config (nothing downloaded), seeded."""
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=2, head_dim=32,
                                      num_hidden_layers=2, vocab_size=256, intermediate_size=128,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config)


def accelerate_epoch(acc, model, opt, loader, sched, epoch=0):
    """One epoch of the MSE regression the Accelerate tests train; returns each batch's loss."""
    if hasattr(loader, "set_epoch"):
        loader.set_epoch(epoch)
    losses = []
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses
