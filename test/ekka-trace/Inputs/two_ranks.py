"""Two gloo ranks on CPU, each running a small module: each rank's trace goes
to rank-N/ of the trace directory."""
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=os.environ.get("EKKA_TEST_PORT", "29517"))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.manual_seed(rank)
    layer = torch.nn.Linear(4, 4)
    out = layer(torch.ones(1, 4))
    dist.all_reduce(out)
    dist.destroy_process_group()


if __name__ == "__main__":
    mp.spawn(run, nprocs=2)
    print("ranks done")
