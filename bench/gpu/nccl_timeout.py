"""Part `nccl`, 2: a peer that never joins ends the wait within the timeout, with an error, not a hang."""
import datetime
import time

import torch.distributed as dist
from common import REHEARSAL, first_line

from tbhpc.train.dist import free_port_pair

t0 = time.perf_counter()
try:
    dist.init_process_group("gloo" if REHEARSAL else "nccl", init_method=f"tcp://127.0.0.1:{free_port_pair()}",
                            rank=0, world_size=2, timeout=datetime.timedelta(seconds=1 if REHEARSAL else 15))
    raise SystemExit("timeout path: UNEXPECTED: a group of 2 formed with one member")
except SystemExit:
    raise
except Exception as exc:
    print(f"timeout path: the missing peer ended the wait after {time.perf_counter() - t0:.1f} s: {first_line(exc)}",
          flush=True)
