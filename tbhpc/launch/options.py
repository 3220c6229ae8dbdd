"""What a campaign asks Slurm for. Execution settings only: they never change a campaign's
identity, so a campaign can move between local, Slurm and MPI execution and resume."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field


@dataclass
class SlurmOptions:
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    nice: int | None = None
    time: str = "02:00:00"              # per array task
    mem: str | None = "2G"
    cpus_per_task: int = 1
    gres: str | None = None             # e.g. gpu:1
    array_parallelism: int = 32         # the %P throttle: at most P array tasks run at once
    attempts_per_task: int = 0          # 0: sized from the two fields below
    attempt_seconds: float = 60.0       # expected seconds per attempt (LLM episodes: about a minute)
    target_task_minutes: float = 10.0   # array tasks should run minutes, not seconds
    max_array_tasks: int = 1000
    flush_every: int = 8                # attempts per shard inside an array task
    signal_seconds: int = 120           # USR2 this long before the time limit: flush, requeue
    task_retries: int = 2               # resubmit array tasks that died without finishing their chunk
    poll_seconds: float = 10.0
    python: str = field(default_factory=lambda: sys.executable)
    extra_sbatch: list[str] = field(default_factory=list)
    # MPI mode: one allocation, rank 0 hands out chunks
    nodes: int = 1
    ntasks: int = 2
    mpi: str = "pmix"

    def task_size(self, n_keys: int) -> int:
        """Attempts per array task: explicit, else about target_task_minutes of work, and never
        more array tasks than max_array_tasks."""
        size = self.attempts_per_task or max(1, round(self.target_task_minutes * 60 / max(self.attempt_seconds, 1e-3)))
        return max(size, math.ceil(n_keys / self.max_array_tasks))
