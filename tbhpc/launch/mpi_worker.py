"""MPI mode: `srun --mpi=pmix -n N python -m tbhpc.launch.mpi_worker RUN STAGE` inside one
allocation. Rank 0 hands out chunk indices on request, so a rank stuck on long episodes never
holds back the others (no static split); ranks 1..N-1 run chunks exactly like array tasks (same
shard names per chunk, same skip-what-is-written rule, same USR2/SIGTERM handling).
With a single rank, that rank runs every chunk itself.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from tbhpc.campaign.worker import Worker
from tbhpc.launch.array_task import run_task
from tbhpc.launch.stages import read_chunks
from tbhpc.store.run_dir import RunDir

READY, WORK, STOP = 1, 2, 3


def main(argv: list[str] | None = None) -> int:
    from mpi4py import MPI  # imported here: only MPI mode needs it

    args = argv if argv is not None else sys.argv[1:]
    run_path, stage = Path(args[0]), int(args[1])
    flush_every = int(os.environ.get("TBHPC_FLUSH_EVERY", "8"))
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    n_chunks = len(read_chunks(RunDir(run_path), stage))
    if size == 1:
        worker = Worker(run_path)
        return max((run_task(run_path, stage, i, flush_every, worker) for i in range(n_chunks)), default=0)
    if rank == 0:
        queue, active = list(range(n_chunks)), size - 1
        status = MPI.Status()
        while active:
            comm.recv(source=MPI.ANY_SOURCE, tag=READY, status=status)
            if queue:
                comm.send(queue.pop(0), dest=status.Get_source(), tag=WORK)
            else:
                comm.send(None, dest=status.Get_source(), tag=STOP)
                active -= 1
        print(f"[tbhpc] mpi rank 0: handed out {n_chunks} chunks to {size - 1} ranks", flush=True)
        return 0
    worker, worst = Worker(run_path), 0
    status = MPI.Status()
    while True:
        comm.send(rank, dest=0, tag=READY)
        index = comm.recv(source=0, tag=MPI.ANY_TAG, status=status)
        if status.Get_tag() == STOP:
            return worst
        worst = max(worst, run_task(run_path, stage, index, flush_every, worker))


if __name__ == "__main__":
    sys.exit(main())
