"""Part `nccl`, 1: NCCL initialises with the trainer's collective timeout and all-reduces (gloo in a rehearsal)."""
import datetime
import os
import time

import torch
import torch.distributed as dist
from common import DEVICE, REHEARSAL

from tbhpc.train.config import TrainConfig
from tbhpc.train.dist import free_port_pair

cfg = TrainConfig(model="m", pool="p", gpus_per_node=1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port_pair()))
t0 = time.perf_counter()
dist.init_process_group("gloo" if REHEARSAL else "nccl", rank=0, world_size=1,
                        timeout=datetime.timedelta(seconds=cfg.collective_timeout))
x = torch.ones(1 << 20, device=DEVICE)
dist.all_reduce(x)
if not REHEARSAL:
    torch.cuda.synchronize()
version = "gloo (rehearsal)" if REHEARSAL else "NCCL " + ".".join(map(str, torch.cuda.nccl.version()))
print(f"{version}: init + all_reduce {time.perf_counter() - t0:.2f} s, timeout {cfg.collective_timeout:.0f} s "
      "(collective_timeout_s default)", flush=True)
dist.destroy_process_group()
