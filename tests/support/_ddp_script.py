"""One rank of the data-parallel test: python _ddp_script.py RANK WORLD PORT OUT_DIR EPOCHS [--resume]."""
import sys

import torch
import torch.distributed as dist

torch.set_num_threads(1)

import tensorlist.loops as loops  # noqa: E402


def data():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(64, 4, generator=g)
    return x, x @ torch.tensor([[1.0], [-1.0], [2.0], [0.5]]) + 0.1


def main(rank, world, port, out, n, resume=False):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    x, y = data()
    ds = torch.utils.data.TensorDataset(x, y)
    sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=world, rank=rank, shuffle=False)
    train = torch.utils.data.DataLoader(ds, batch_size=64 // world, sampler=sampler)
    loops.epochs(ddp, opt, train, loss_fn=torch.nn.functional.mse_loss, max_epochs=n, validation=train,
                 out_dir=out, resume=resume, progress=False, dataset_params={"name": "ddp-toy"})
    dist.destroy_process_group()


if __name__ == "__main__":
    main(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), "--resume" in sys.argv)
    import _ranks
    _ranks.exit_now()
