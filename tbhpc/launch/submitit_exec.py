"""Campaign chunks as one submitit array job: the Python API's path for users who submit with submitit.

Why submitit's machinery here and plain sbatch text in the CLI: a user who already drives Slurm
from Python has an `AutoExecutor` that carries their cluster's parameters (partition, time,
`slurm_array_parallelism`, ...). `map_array` turns the chunks into one array job and gives back
handles to wait on or cancel. The CLI's scripts stay golden-tested sbatch text (launch/sbatch.py).

Exactly-once, as on the sbatch path: the chunks are written into a stage
(`stages.write_chunks`), array index i runs chunk i through `ChunkRun` (launch/array_task.py),
which skips every key a shard of (stage, i) already holds, so a requeued, retried or re-run index
finishes its chunk without duplicating an attempt; the merge is keyed in any case.

Preemption and time limits follow submitit's protocol: on USR2 it calls `ChunkJob.checkpoint`,
which flushes the attempts finished so far and returns a fresh submission of the same index;
submitit requeues it. An `scontrol requeue` (SIGTERM, which submitit ignores, then SIGKILL)
loses at most the attempts not yet flushed (`flush_every`, 1 by default), which the requeued
index runs again.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from tbhpc.errors import UserError
from tbhpc.launch.stages import next_stage, record_jobs, write_chunks
from tbhpc.store.run_dir import RunDir

Key = tuple[str, int]


class ChunkJob:
    """The callable submitit pickles: chunk `index` of a stage (returns (ok, system errors))."""

    def __init__(self, run_path: str, stage: int, flush_every: int = 1):
        self.run_path, self.stage, self.flush_every = run_path, stage, flush_every
        self._chunk = None

    def __call__(self, index: int) -> tuple[int, int]:
        from tbhpc.campaign.worker import Worker
        from tbhpc.launch.array_task import ChunkRun
        self._chunk = ChunkRun(Worker(self.run_path), self.stage, index, self.flush_every)
        _, todo = self._chunk.todo()
        return self._chunk.run(todo)

    def checkpoint(self, index: int) -> Any:
        """submitit's preemption/timeout hook: save what is finished, resubmit the same index."""
        import submitit
        if self._chunk is not None:
            self._chunk.flush()
        return submitit.helpers.DelayedSubmission(ChunkJob(self.run_path, self.stage, self.flush_every), index)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_chunk": None}    # the worker (policy, servers) is rebuilt where it runs


def check_executor(executor: Any) -> None:
    """A submitit executor with a folder for its pickles and logs, or one line saying what is wrong."""
    if not hasattr(executor, "map_array") or not hasattr(executor, "update_parameters"):
        raise UserError(f"executor: expected 'local', 'slurm', 'mpi' or a submitit executor, got {type(executor).__name__}")
    if not str(getattr(executor, "folder", "") or ""):
        raise UserError("submitit executor: no folder (give one: submitit.AutoExecutor(folder='logs/submitit'))")


class SubmititExecutor:
    name = "submitit"

    def __init__(self, executor: Any, flush_every: int = 1, log=print):
        check_executor(executor)
        self.executor, self.flush_every, self.log = executor, flush_every, log
        self.jobs: list = []

    def submit(self, run_path: Path | str, chunks: list[list[Key]]) -> list:
        """Write the chunks as a new stage and submit them as one array; returns submitit's jobs."""
        run = RunDir(Path(run_path).resolve())
        stage = next_stage(run)
        write_chunks(run, stage, chunks)
        (run.logs / "slurm").mkdir(parents=True, exist_ok=True)
        self.jobs = self.executor.map_array(ChunkJob(str(run.path), stage, self.flush_every), list(range(len(chunks))))
        if self.jobs and _on_slurm(self.executor):     # `tbhpc status RUN` then follows it like an sbatch stage
            record_jobs(run, stage, {"submitit": self.jobs[0].job_id.split("_")[0], "tasks": len(chunks)})
        self.log(f"submitted stage {stage}: {len(chunks)} chunk(s) through submitit "
                 f"({type(self.executor).__name__}, {self.jobs[0].job_id.split('_')[0] if self.jobs else 'no job'})")
        return self.jobs

    def run(self, run_path: Path, chunks: list[list[Key]], on_chunk) -> None:
        """Submit and wait, reporting each finished chunk. A chunk whose job ended without finishing
        (cancelled, failed) is said and left pending: running the campaign again runs only it."""
        if not chunks:
            return
        import submitit
        for job in submitit.helpers.as_completed(self.submit(run_path, chunks)):
            try:
                ok, errors = job.result()
            except Exception as exc:  # noqa: BLE001 - the job's own failure; its keys stay pending
                self.log(f"submitit job {job.job_id} ended without finishing its chunk: {_first_line(exc)}")
                continue
            on_chunk(ok, errors)


def _on_slurm(executor: Any) -> bool:
    return getattr(executor, "cluster", None) == "slurm" or type(executor).__name__ == "SlurmExecutor"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[-1] if text else ''}"[:300]
