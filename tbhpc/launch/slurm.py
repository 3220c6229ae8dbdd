"""The Slurm executor: one array per campaign stage, waited on with one batched `squeue` call per
poll, failed array tasks resubmitted, progress read from the stage's own shards.

It implements the same interface as the local executor (`run(run_path, chunks, on_chunk)`), so
`tbhpc probe|eval --executor slurm` resumes, merges and validates exactly like a local run.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from tbhpc.errors import InfraError
from tbhpc.slurm_options import OUTBOX_ENV, SlurmOptions
from tbhpc.launch.sbatch import Stage, render_array, render_mpi
from tbhpc.launch.stages import Key, keys_written_by_task, next_stage, record_jobs, stage_dir, write_chunks
from tbhpc.store.run_dir import RunDir
from tbhpc.store.shards import list_shards


def outbox_sbatch(script: Path, outbox: Path, timeout_s: float = 300.0) -> str:
    """sbatch through the job script's watcher (launch/container.py: outbox_watch): a request file
    naming the script, then its answer, the job id or sbatch's error."""
    name = outbox / f"{uuid.uuid4().hex}"
    tmp = name.with_suffix(".writing")
    tmp.write_text(str(Path(script).resolve()), encoding="utf-8")
    tmp.rename(name.with_suffix(".req"))            # whole, or not there: the watcher never reads half a path
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (answer := name.with_suffix(".id")).exists():
            return answer.read_text().strip().split(";")[0]
        if (error := name.with_suffix(".err")).exists():
            raise InfraError(f"sbatch {script} (submitted by the job's script) failed: {error.read_text().strip()[:300]}")
        time.sleep(0.5)
    raise InfraError(f"sbatch {script}: no answer in {outbox} after {timeout_s:.0f} s (is the job's script watching it?)")


NEVER_STARTS = {"PartitionConfig", "PartitionNodeLimit", "BadConstraints", "InvalidAccount", "InvalidQOS",
                "AccountNotAllowed", "QOSNotAllowed", "PartitionTimeLimit"}


@dataclass
class SlurmClient:
    """Thin wrapper over the Slurm commands that counts every call (the bench reports them)."""

    calls: Counter = field(default_factory=Counter)

    def _run(self, cmd: list[str]) -> subprocess.CompletedProcess:
        self.calls[cmd[0]] += 1
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except FileNotFoundError:
            raise InfraError(f"{cmd[0]} not found: is this a Slurm login node (or run `make slurm-up`)?") from None

    def sbatch(self, script: Path) -> str:
        if os.environ.get(OUTBOX_ENV) and not shutil.which("sbatch"):      # in a container: the job's script submits
            self.calls["sbatch"] += 1
            return outbox_sbatch(Path(script), Path(os.environ[OUTBOX_ENV]))
        res = self._run(["sbatch", "--parsable", str(script)])
        if res.returncode != 0:
            raise InfraError(f"sbatch {script} failed: {res.stderr.strip()[:300]}")
        return res.stdout.strip().split(";")[0]

    def queued(self, job_ids: list[str]) -> dict[str, str]:
        """{job_or_array_task_id: state} for jobs still in the queue; one squeue call for all.
        A job the scheduler can never start (bad partition, account, size) raises instead of
        being waited on forever."""
        if not job_ids:
            return {}
        res = self._run(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", "%i %T %r"])
        if res.returncode != 0:  # every id unknown: all of them left the queue
            return {}
        out = {}
        for line in res.stdout.splitlines():
            parts = line.split()
            if len(parts) < 2:
                continue
            if parts[1] == "PENDING" and len(parts) > 2 and parts[2] in NEVER_STARTS:
                self._run(["scancel", parts[0].split("_")[0]])
                raise InfraError(f"Slurm job {parts[0]} can never start ({parts[2]}): check partition, account, "
                                 "nodes/ntasks and memory against the cluster; the job was cancelled")
            out[parts[0]] = parts[1]
        return out

    def accounted(self, job_ids: list[str]) -> dict[str, str]:
        """{job_id: state} from accounting (one sacct call); empty when accounting is off."""
        if not job_ids:
            return {}
        res = self._run(["sacct", "-n", "-P", "-X", "-j", ",".join(job_ids), "-o", "JobID,State"])
        if res.returncode != 0:
            return {}
        return dict(line.split("|", 1) for line in res.stdout.splitlines() if "|" in line)


class SlurmExecutor:
    name = "slurm"
    kind = "array"

    def __init__(self, opts: SlurmOptions, client: SlurmClient | None = None, workdir: str | None = None, log=print):
        self.opts, self.client, self.log = opts, client or SlurmClient(), log
        self.workdir = workdir or os.getcwd()

    def run(self, run_path: Path, chunks: list[list[Key]], on_chunk) -> None:
        keys = [k for c in chunks for k in c]
        if not keys:
            return
        run = RunDir(Path(run_path).resolve())
        size = self.opts.task_size(len(keys))
        tasks = [keys[i:i + size] for i in range(0, len(keys), size)]
        stage = next_stage(run)
        write_chunks(run, stage, tasks)
        st = Stage(str(run.path), stage, run.campaign()["campaign"], self.workdir)
        (run.logs / "slurm").mkdir(parents=True, exist_ok=True)
        progress = _Progress(run, stage, on_chunk)
        todo = list(range(len(tasks)))
        for attempt in range(self.opts.task_retries + 1):
            suffix = f"-retry{attempt}" if attempt else ""
            script = stage_dir(run, stage) / f"{self.kind}{suffix}.sbatch"
            script.write_text(self.render(st, len(tasks), todo if attempt else None))
            job = self.client.sbatch(script)
            record_jobs(run, stage, {f"{self.kind}{suffix}": job, "tasks": len(tasks)})
            self.log(f"submitted stage {stage}: {self.kind} job {job}, {len(todo)} chunk(s) of <= {size} attempts")
            while self.client.queued([job]):
                progress.poll()
                time.sleep(self.opts.poll_seconds)
            progress.poll()
            written = keys_written_by_task(run, stage)
            todo = [i for i in todo if not set(tasks[i]) <= written.get(i, set())]
            if not todo:
                return
            self.log(f"stage {stage}: {len(todo)} array task(s) ended without finishing their chunk: {todo[:10]}")

    def render(self, st: Stage, n_tasks: int, only: list[int] | None) -> str:
        return render_array(st, self.opts, n_tasks, None if only is None else ",".join(map(str, only)))


class MPIExecutor(SlurmExecutor):
    """One allocation (`nodes`, `ntasks`), chunks handed out dynamically by rank 0. A rerun after
    a failure resubmits the job; ranks skip every key already written."""

    name = "mpi"
    kind = "mpi"

    def render(self, st: Stage, n_tasks: int, only: list[int] | None) -> str:
        return render_mpi(st, self.opts)


class _Progress:
    """Reports finished attempts by reading the stage's new shards (no extra Slurm calls)."""

    def __init__(self, run: RunDir, stage: int, on_chunk):
        self.run, self.prefix, self.on_chunk, self.seen = run, f"shard-s{stage:03d}-", on_chunk, set()

    def poll(self) -> None:
        for path in list_shards(self.run.shards):
            if path.name.startswith(self.prefix) and path.name not in self.seen:
                self.seen.add(path.name)
                statuses = Counter(json.loads(line).get("status") for line in path.read_text().splitlines() if line.strip())
                self.on_chunk(statuses.get("ok", 0), statuses.get("system_error", 0))
