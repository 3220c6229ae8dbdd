"""The body of one Slurm array task: `python -m tbhpc.launch.array_task RUN STAGE`.

It runs the attempt keys of chunk $SLURM_ARRAY_TASK_ID, skipping keys its earlier runs already
wrote (after a requeue or preemption), and flushes a shard every `flush_every` attempts. On USR2
(time limit near) it flushes and asks Slurm to requeue this very task; on SIGTERM (preemption,
scancel, node drain) it flushes and exits. Partial work is therefore in an atomic shard or not at
all; `kill -9` loses at most the unflushed attempts, which the stage re-runs.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tbhpc.campaign.worker import Worker
from tbhpc.launch.stages import keys_written, read_chunks, shard_prefix
from tbhpc.store.shards import shard_name, write_shard


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise(signum, _frame):
    raise Interrupted(signum)


def run_task(run_path: Path, stage: int, index: int, flush_every: int = 8, worker: Worker | None = None) -> int:
    worker = worker or Worker(run_path)
    prefix = shard_prefix(stage, index)
    keys = read_chunks(worker.run, stage)[index]
    done = keys_written(worker.run, prefix)
    todo = [k for k in keys if k not in done]
    print(f"[tbhpc] stage {stage} task {index}: {len(keys)} keys, {len(keys) - len(todo)} already written, "
          f"{len(todo)} to run on {os.environ.get('SLURMD_NODENAME', '?')}", flush=True)
    buffer: list[dict] = []

    def flush() -> None:
        if buffer:
            write_shard(worker.run.shards, buffer, name=shard_name(prefix))
            buffer.clear()

    signal.signal(signal.SIGUSR2, _raise)
    signal.signal(signal.SIGTERM, _raise)
    try:
        for task_id, attempt in todo:
            buffer.append(worker.attempt(task_id, attempt))
            if len(buffer) >= flush_every:
                flush()
        flush()
    except Interrupted as sig:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        flush()
        print(f"[tbhpc] stage {stage} task {index}: {sig} received, finished attempts saved", flush=True)
        if sig.signum == signal.SIGUSR2 and os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
            subprocess.run(["scontrol", "requeue", job], check=False)
            print(f"[tbhpc] requeued {job}", flush=True)
            return 0
        return 128 + sig.signum
    print(f"[tbhpc] stage {stage} task {index}: done", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    run_path, stage = Path(args[0]), int(args[1])
    index = int(os.environ["SLURM_ARRAY_TASK_ID"]) if len(args) < 3 else int(args[2])
    flush_every = int(os.environ.get("TBHPC_FLUSH_EVERY", "8"))
    return run_task(run_path, stage, index, flush_every)


if __name__ == "__main__":
    sys.exit(main())
