"""What a job asks Slurm for (`SlurmOptions`) and the environment it exports (`check_env`).

Execution settings only: they never change a campaign's identity, so a campaign can move between
local, Slurm and MPI execution and resume. Why at the bottom of the package, not in `launch`:
the campaign, serve and train configs each hold a `slurm` section and check it when they load,
while `launch` (which renders and submits the jobs) sits above all three.
"""
from __future__ import annotations

import math
import re
import sys
from dataclasses import dataclass, field

from tbhpc.errors import UserError

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# sbatch --time: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or no limit
_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d{1,2}|\d+-\d{1,2}:\d{1,2}|\d+-\d{1,2}:\d{1,2}:\d{1,2})$")
_MEM = re.compile(r"^\d+[KMGT]?$", re.IGNORECASE)     # sbatch --mem: megabytes, or a K/M/G/T suffix
RUNTIMES = ("pyxis", "apptainer", "charliecloud")
# Work in a container cannot reach scontrol: the job's script exports REQUEUE_ENV, and an array task
# exits with its value (a trainer leaves its marker) to have the script requeue the job.
REQUEUE_ENV, REQUEUE_EXIT = "TBHPC_REQUEUE_EXIT", 75      # 75: EX_TEMPFAIL
# ... and cannot reach sbatch: a trainer's export evals are submitted by its job's script, which
# watches this directory (launch/container.py renders the watcher, launch/slurm.py writes to it).
OUTBOX_ENV = "TBHPC_SBATCH_OUTBOX"
MOUNT_FLAGS = {"pyxis": {"ro", "rw"}, "apptainer": {"ro", "rw"}, "charliecloud": set()}


def check_slurm_time(value, where: str) -> None:
    """One line unless `value` is a time sbatch accepts."""
    if not isinstance(value, str) or not (_TIME.match(value.strip()) or value.strip().upper() in ("UNLIMITED", "INFINITE")):
        raise UserError(f"{where}: {value!r} is not a Slurm time (minutes, HH:MM:SS, D-HH:MM:SS or UNLIMITED)")


def check_slurm_mem(value, where: str) -> None:
    if value is not None and not (isinstance(value, str) and _MEM.match(value.strip())):
        raise UserError(f"{where}: {value!r} is not a Slurm memory size (e.g. 2G, 500M, 4096)")


def check_env(env, where: str) -> dict[str, str]:
    """A job's extra environment (NCCL/InfiniBand settings and alike) as {NAME: value}; one line
    naming the entry unless each name is a shell variable name and each value one line of text."""
    if not isinstance(env, dict):
        raise UserError(f"{where}: expected a mapping NAME: value, got {type(env).__name__}")
    out = {}
    for name, value in env.items():
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            raise UserError(f"{where}: {name!r} is not an environment variable name")
        if isinstance(value, bool) or not isinstance(value, (str, int, float)) or any(c in str(value) for c in "\n\r\0"):
            raise UserError(f"{where}: {name}: the value must be one line of text or a number, got {value!r}")
        out[name] = str(value)
    return out


@dataclass
class ContainerOptions:
    """The container every script of a job runs its work in (launch/container.py renders it).

    pyxis: enroot images through srun's --container-* flags (an enroot URI such as
    nvcr.io#nvidia/pytorch:25.01-py3, or a .sqsh path); apptainer: a .sif run by `apptainer exec`;
    charliecloud: an image directory run by `ch-run`. The job's working directory and the run
    directory are mounted at their own paths whatever `mounts` says."""

    runtime: str | None = None          # pyxis | apptainer | charliecloud; None: no container
    image: str = ""                     # what the runtime runs (URI, .sqsh, .sif or image directory)
    mounts: list[str] = field(default_factory=list)   # SRC[:DST[:ro]]: host paths the job sees inside
    env: dict[str, str] = field(default_factory=dict)  # exported for the job; wins over the image's own values
    python: str | None = None           # the interpreter inside the image; None: slurm.python (a bound-in environment)

    def __post_init__(self) -> None:
        where = "slurm option 'container'"
        if self.runtime is None:
            if self.image or self.mounts or self.env or self.python:
                raise UserError(f"{where}: 'runtime' is missing (choose {', '.join(RUNTIMES)}); without it nothing runs in a container")
            return
        if self.runtime not in RUNTIMES:
            raise UserError(f"{where}: field 'runtime': {self.runtime!r} is not one of {', '.join(RUNTIMES)}")
        if not isinstance(self.image, str) or not self.image.strip():
            raise UserError(f"{where}: field 'image' is empty: name the image {self.runtime} runs")
        for mount in self.mounts:
            check_mount(mount, self.runtime, f"{where}: field 'mounts'")
        self.env = check_env(self.env, f"{where}: field 'env'")
        if self.python is not None and not self.python.startswith("/"):
            raise UserError(f"{where}: field 'python': {self.python!r} is not an absolute path inside the image")


def check_mount(mount, runtime: str, where: str) -> tuple[str, str, str]:
    """(source, destination, flags) of one `SRC[:DST[:FLAGS]]`; one line unless both are absolute
    paths and the runtime takes the flags."""
    if not isinstance(mount, str) or not mount or any(c in mount for c in ", \n\t"):
        raise UserError(f"{where}: {mount!r} is not SRC[:DST[:ro]] (absolute paths, no commas or spaces)")
    parts = mount.split(":")
    if len(parts) > 3 or not all(p.startswith("/") for p in parts[:2]):
        raise UserError(f"{where}: {mount!r} is not SRC[:DST[:ro]] with absolute paths")
    src, dst, flags = parts[0], parts[1] if len(parts) > 1 else parts[0], parts[2] if len(parts) > 2 else ""
    if flags and flags not in MOUNT_FLAGS[runtime]:
        raise UserError(f"{where}: {mount!r}: {runtime} mounts take "
                        + (f"the flags {' or '.join(sorted(MOUNT_FLAGS[runtime]))}" if MOUNT_FLAGS[runtime] else "no flags"))
    return src.rstrip("/") or "/", dst.rstrip("/") or "/", flags


@dataclass
class SlurmOptions:
    partition: str | None = None          # sbatch --partition
    account: str | None = None            # sbatch --account (fair-share is charged to it)
    qos: str | None = None                # sbatch --qos
    nice: int | None = None               # sbatch --nice
    time: str = "02:00:00"              # per array task
    mem: str | None = "2G"              # sbatch --mem per array task (None: the partition's default)
    cpus_per_task: int = 1              # sbatch --cpus-per-task
    gres: str | None = None             # e.g. gpu:1
    array_parallelism: int = 32         # the %P throttle: at most P array tasks run at once
    attempts_per_task: int = 0          # 0: sized from the two fields below
    attempt_seconds: float = 60.0       # expected seconds per attempt (LLM episodes: about a minute)
    target_task_minutes: float = 10.0   # array tasks should run minutes, not seconds
    max_array_tasks: int = 1000         # never more array tasks than this (chunks grow instead)
    flush_every: int = 8                # attempts per shard inside an array task
    signal_seconds: int = 120           # USR2 this long before the time limit: flush, requeue
    task_retries: int = 2               # resubmit array tasks that died without finishing their chunk
    poll_seconds: float = 10.0          # the blocking executor's squeue interval
    python: str = field(default_factory=lambda: sys.executable)  # the Python the jobs run (the submitting one)
    extra_sbatch: list[str] = field(default_factory=list)  # more #SBATCH lines, as they are
    # MPI mode: one allocation, rank 0 hands out chunks
    nodes: int = 1
    ntasks: int = 2                     # MPI mode: ranks in the allocation
    mpi: str = "pmix"                   # MPI mode: srun --mpi
    container: ContainerOptions = field(default_factory=ContainerOptions)  # run every script's work in a container

    def __post_init__(self) -> None:
        if isinstance(self.container, dict):        # the Python API: slurm=SlurmOptions(container={...})
            try:
                self.container = ContainerOptions(**self.container)
            except TypeError as exc:
                raise UserError(f"slurm option 'container': {exc}") from None
        check_slurm_time(self.time, "slurm option 'time'")
        check_slurm_mem(self.mem, "slurm option 'mem'")
        for name, low in (("cpus_per_task", 1), ("array_parallelism", 1), ("attempts_per_task", 0), ("max_array_tasks", 1),
                          ("flush_every", 1), ("signal_seconds", 0), ("task_retries", 0), ("nodes", 1), ("ntasks", 1)):
            if getattr(self, name) < low:
                raise UserError(f"slurm option {name!r} must be >= {low}, got {getattr(self, name)!r}")
        for name in ("attempt_seconds", "target_task_minutes", "poll_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise UserError(f"slurm option {name!r} must be a positive number of {name.split('_')[-1]}, got {value!r}")
        if self.nice is not None and abs(self.nice) > 2147483645:
            raise UserError(f"slurm option 'nice' must be within +-2147483645, got {self.nice}")

    @property
    def job_python(self) -> str:
        """The interpreter the job's work runs: the image's when it names one."""
        return self.container.python or self.python

    def task_size(self, n_keys: int) -> int:
        """Attempts per array task: explicit, else about target_task_minutes of work, and never
        more array tasks than max_array_tasks."""
        size = self.attempts_per_task or max(1, round(self.target_task_minutes * 60 / max(self.attempt_seconds, 1e-3)))
        return max(size, math.ceil(n_keys / self.max_array_tasks))
