"""A rank of the TensorListTrainer DDP test (gloo on 127.0.0.1): ``python SCRIPT MODE RANK WORLD PORT ROOT``.

``full``: 8 steps with checkpoints every 3 into ROOT/run, rank 0 writing the logged losses to ROOT/full.json.
``resume``: the same Trainer resumed from ROOT/run/checkpoint-3, rank 0 writing the losses logged after step 3
to ROOT/resumed.json. The test compares them.
"""
import json
import os
import sys

mode, rank, world, port, root = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port)

import torch  # noqa: E402

torch.set_num_threads(1)

import transformers  # noqa: E402

from _hf_support import Tokens, tiny_gpt2  # noqa: E402
from tensorlist.huggingface import TensorListTrainer  # noqa: E402

args = transformers.TrainingArguments(
    output_dir=os.path.join(root, "run"), max_steps=8, per_device_train_batch_size=2, save_steps=3,
    logging_steps=1, report_to=[], use_cpu=True, seed=0, disable_tqdm=True, learning_rate=1e-2,
    dataloader_num_workers=0, ddp_backend="gloo")
trainer = TensorListTrainer(model=tiny_gpt2(), args=args, train_dataset=Tokens())
assert trainer.args.world_size == world, trainer.args.world_size
if mode == "full":
    trainer.train()
else:
    trainer.train(resume_from_checkpoint=os.path.join(root, "run", "checkpoint-3"))
if rank == 0:
    after = 0 if mode == "full" else 3
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e and e["step"] > after]
    with open(os.path.join(root, f"{mode}.json"), "w") as f:
        json.dump(losses, f)
# The Trainer leaves its gloo group up; tearing it down before exit keeps gloo's threads from being destroyed
# still running at interpreter exit ("terminate called without an active exception", SIGABRT in CI).
if torch.distributed.is_initialized():
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()
import _ranks  # noqa: E402
_ranks.exit_now()
