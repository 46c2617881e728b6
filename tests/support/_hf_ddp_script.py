"""A rank of the Accelerate DDP test (gloo on 127.0.0.1): ``python _hf_ddp_script.py MODE RANK WORLD PORT ROOT``.

``save``: one epoch, ``tensorlist.huggingface.save_state`` into ROOT/ckpt, a second epoch, its losses into
ROOT/full_<rank>.json. ``resume``: fresh objects (another seed), ``load_state`` from ROOT/ckpt, the second
epoch, its losses into ROOT/resumed_<rank>.json. The test compares the two.
"""
import json
import os
import sys

mode, rank, world, port, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)

import torch  # noqa: E402

torch.set_num_threads(1)

from accelerate import Accelerator  # noqa: E402

from tensorlist import huggingface as hf  # noqa: E402


def schedule(step):
    return 1.0 / (1 + step)


torch.manual_seed(0 if mode == "save" else 5)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.2), torch.nn.Linear(8, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule)
x = torch.randn(32, 4, generator=torch.Generator().manual_seed(1))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4,
                                     shuffle=True)
acc = Accelerator(cpu=True)
assert acc.num_processes == world, acc.state
model, opt, loader, sched = acc.prepare(model, opt, loader, sched)


def epoch(number):
    loader.set_epoch(number)
    losses = []
    for xb, yb in loader:
        loss = torch.nn.functional.mse_loss(model(xb), yb)
        acc.backward(loss)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


ckpt = os.path.join(root, "ckpt")
if mode == "save":
    epoch(0)
    hf.save_state(acc, ckpt)
    out = epoch(1)
else:
    hf.load_state(acc, ckpt)
    out = epoch(1)
with open(os.path.join(root, f"{'full' if mode == 'save' else 'resumed'}_{rank}.json"), "w") as f:
    json.dump(out, f)
acc.wait_for_everyone()
acc.end_training()
import _ranks  # noqa: E402
_ranks.exit_now()
