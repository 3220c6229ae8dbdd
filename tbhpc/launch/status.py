"""`tbhpc status RUN`: per-stage progress from one batched `squeue` call (plus one `sacct` call
when accounting is on), never one call per job; attempts done are counted from the shards."""
from __future__ import annotations

from collections import Counter

from tbhpc.launch.slurm import SlurmClient
from tbhpc.launch.stages import keys_written, read_chunks, stage_jobs
from tbhpc.store.run_dir import RunDir

FAILED = {"FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"}


def run_status(run: RunDir, client: SlurmClient | None = None) -> list[dict]:
    client = client or SlurmClient()
    stages = stage_jobs(run)
    job_ids = sorted({str(v) for jobs in stages.values() for k, v in jobs.items() if k != "tasks"})
    queued = client.queued(job_ids)
    accounted = client.accounted(job_ids)
    out = []
    for stage, jobs in stages.items():
        chunks = read_chunks(run, stage)
        planned = sum(len(c) for c in chunks)
        done = len(keys_written(run, f"shard-s{stage:03d}"))
        ids = {str(v) for k, v in jobs.items() if k != "tasks"}
        states = Counter(state for jid, state in queued.items() if jid.split("_")[0] in ids)
        failed = sum(1 for jid, state in accounted.items() if jid.split("_")[0] in ids and "_" in jid
                     and state.split()[0] in FAILED)
        out.append({"stage": stage, "jobs": {k: v for k, v in jobs.items() if k != "tasks"}, "array_tasks": len(chunks),
                    "running": states.get("RUNNING", 0), "pending": states.get("PENDING", 0) + states.get("REQUEUED", 0),
                    "failed_tasks": failed, "attempts_done": done, "attempts_planned": planned})
    return out


def render_status(rows: list[dict]) -> str:
    lines = ["stage  jobs                              tasks  running  pending  failed  attempts"]
    for r in rows:
        jobs = " ".join(f"{k}={v}" for k, v in r["jobs"].items())
        lines.append(f"{r['stage']:>5}  {jobs:<32}  {r['array_tasks']:>5}  {r['running']:>7}  {r['pending']:>7}  "
                     f"{r['failed_tasks']:>6}  {r['attempts_done']}/{r['attempts_planned']}")
    return "\n".join(lines) + "\n"
