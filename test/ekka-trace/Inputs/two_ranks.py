"""Two gloo ranks on CPU, each running a small module: each rank's trace goes
to rank-N/ of the trace directory. With `rank-0-idle`, rank 0 only
coordinates (runs no module): only rank-1/ is written."""
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, port, idle):
    os.environ.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    torch.manual_seed(rank)
    layer = torch.nn.Linear(4, 4)
    out = torch.ones(1, 4) if rank == 0 and idle else layer(torch.ones(1, 4))
    dist.all_reduce(out)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    mp.spawn(run, args=(free_port(), sys.argv[1:] == ["rank-0-idle"]), nprocs=2)
    print("ranks done")
