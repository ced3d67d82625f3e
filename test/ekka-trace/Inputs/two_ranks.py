"""Two gloo ranks on CPU, each running a small module: each rank's trace goes
to rank-N/ of the trace directory."""
import datetime
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, port):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(rank)
    layer = torch.nn.Linear(4, 4)
    out = layer(torch.ones(1, 4))
    dist.all_reduce(out)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(run, args=(free_port(),), nprocs=2)
    print("ranks done")
