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
from tbhpc.slurm_options import REQUEUE_ENV
from tbhpc.store.shards import shard_name, write_shard


class Interrupted(Exception):
    def __init__(self, signum: int):
        self.signum = signum
        super().__init__(signal.Signals(signum).name)


def _raise(signum, _frame):
    raise Interrupted(signum)


class ChunkRun:
    """One chunk of a stage: its keys not yet in a shard of this (stage, chunk), run and flushed
    every `flush_every` attempts. Shared by sbatch array tasks and the submitit executor."""

    def __init__(self, worker: Worker, stage: int, index: int, flush_every: int = 8):
        self.worker, self.stage, self.index, self.flush_every = worker, stage, index, flush_every
        self.prefix = shard_prefix(stage, index)
        self.buffer: list[dict] = []
        self.ok = self.errors = 0

    def todo(self) -> tuple[int, list]:
        keys = read_chunks(self.worker.run, self.stage)[self.index]
        done = keys_written(self.worker.run, self.prefix)
        return len(keys), [k for k in keys if k not in done]

    def run(self, todo: list) -> tuple[int, int]:
        """(ok, system errors) of the attempts this call ran."""
        for task_id, attempt in todo:
            row = self.worker.attempt(task_id, attempt)
            self.buffer.append(row)
            failed = row["status"] == "system_error"
            self.ok, self.errors = self.ok + (not failed), self.errors + failed
            if len(self.buffer) >= self.flush_every:
                self.flush()
        self.flush()
        return self.ok, self.errors

    def flush(self) -> None:
        if self.buffer:
            rows, self.buffer = self.buffer, []
            write_shard(self.worker.run.shards, rows, name=shard_name(self.prefix))


def run_task(run_path: Path, stage: int, index: int, flush_every: int = 8, worker: Worker | None = None) -> int:
    chunk = ChunkRun(worker or Worker(run_path), stage, index, flush_every)
    n, todo = chunk.todo()
    print(f"[tbhpc] stage {stage} task {index}: {n} keys, {n - len(todo)} already written, "
          f"{len(todo)} to run on {os.environ.get('SLURMD_NODENAME', '?')}", flush=True)
    signal.signal(signal.SIGUSR2, _raise)
    signal.signal(signal.SIGTERM, _raise)
    try:
        chunk.run(todo)
    except Interrupted as sig:
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        chunk.flush()
        print(f"[tbhpc] stage {stage} task {index}: {sig} received, finished attempts saved", flush=True)
        if sig.signum == signal.SIGUSR2 and os.environ.get("SLURM_ARRAY_JOB_ID"):
            job = f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
            if os.environ.get(REQUEUE_ENV):     # in a container: the job's script requeues (launch/container.py)
                print(f"[tbhpc] asking the job's script to requeue {job}", flush=True)
                return int(os.environ[REQUEUE_ENV])
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
