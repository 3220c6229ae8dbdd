"""The unit of work every executor runs: a chunk of attempt keys -> one atomic shard.

A worker process builds its context once (config, tasks, policy, user, judge) from the run
directory alone, so local processes, Slurm array tasks and MPI ranks all start the same way:
`Worker(run_path).run_chunk(keys)`.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from datetime import datetime, timezone
from pathlib import Path

from tbhpc.agents import build_judge, build_user
from tbhpc.campaign.config import CampaignConfig, campaign_tasks
from tbhpc.config import load_config
from tbhpc.env.episode import EpisodeResult, run_episode
from tbhpc.env.registry import Environments
from tbhpc.policy import make_policy
from tbhpc.store.run_dir import RunDir
from tbhpc.tasks.loader import parse_task
from tbhpc.store.schema import ROLES
from tbhpc.store.shards import write_shard
from tbhpc.store.transcripts import compact

Key = tuple[str, int]  # (task_id, attempt_index); campaign and policy id are the run's


def run_tasks(run: RunDir, cfg: CampaignConfig) -> list:
    """The run's own snapshot of its tasks (fast, and immune to later pack edits); the pack for
    run directories made before snapshots existed."""
    if run.tasks_file.exists():
        raw = json.loads(run.tasks_file.read_text(encoding="utf-8"))
        return [parse_task(r, str(run.tasks_file), i) for i, r in enumerate(raw)]
    return campaign_tasks(cfg)


def attempt_seed(seed: int, task_id: str, attempt_index: int) -> int:
    digest = hashlib.sha256(f"{seed}:{task_id}:{attempt_index}".encode()).digest()
    return int.from_bytes(digest[:4], "big") & 0x7FFFFFFF


class Worker:
    def __init__(self, run_path: Path | str):
        self.run = RunDir(Path(run_path)).require()
        self.cfg = load_config(CampaignConfig, self.run.config_file)
        self.campaign = self.run.campaign()
        self.tasks = {t.id: t for t in run_tasks(self.run, self.cfg)}
        self.policy = make_policy(self.cfg.policy, **self.cfg.policy_opts)
        self.user = build_user(self.cfg)
        self.judge = build_judge(self.cfg)
        self.envs = Environments(self.cfg.servers, openenv=self.cfg.openenv_spec)

    def close(self) -> None:
        self.envs.close()

    def run_chunk(self, keys: list[Key]) -> tuple[int, int]:
        """Run the attempts, write one shard; returns (ok, system_errors)."""
        if self.cfg.concurrency > 1 and len(keys) > 1:
            from concurrent.futures import ThreadPoolExecutor
            pool = ThreadPoolExecutor(min(self.cfg.concurrency, len(keys)), thread_name_prefix="episode")
            try:
                rows = list(pool.map(lambda k: self.attempt(*k), keys))
            finally:  # on Ctrl-C drop the queued attempts: only the running ones finish
                pool.shutdown(wait=False, cancel_futures=True)
        else:
            rows = [self.attempt(task_id, index) for task_id, index in keys]
        write_shard(self.run.shards, rows)
        errors = sum(r["status"] == "system_error" for r in rows)
        return len(rows) - errors, errors

    def attempt(self, task_id: str, index: int) -> dict:
        task = self.tasks[task_id]
        skipped = len(task.rubrics_yesno) if self.cfg.rubrics == "skip" else 0
        if skipped:     # graded on the database only, and the row says so
            task = dataclasses.replace(task, rubrics_yesno=())
        started = datetime.now(timezone.utc)
        res = run_episode(task, self.envs.for_task(task), self.policy, self.user, self.judge,
                          seed=attempt_seed(self.cfg.seed, task_id, index))
        row = attempt_row(res, self.campaign["campaign"], self.campaign["policy_id"], index, started,
                          self.run.blobs if self.cfg.transcripts else None, self.cfg.transcripts)
        row["rubrics_skipped"] = skipped or None
        return row


def attempt_row(res: EpisodeResult, campaign: str, policy_id: str, index: int, started: datetime,
                blob_dir: Path | None = None, transcript: bool = True) -> dict:
    row = {
        "campaign": campaign, "task_id": res.task_id, "attempt_index": index, "policy_id": policy_id,
        "domain": res.domain, "reward": res.reward, "passed": res.passed, "status": res.status,
        "finish_reason": res.finish_reason, "agent_turns": res.agent_turns, "user_turns": res.user_turns,
        "tool_calls": res.tool_calls, "tool_errors": res.tool_errors, "wall_s": res.wall_s, "host": res.host,
        "worker_pid": os.getpid(), "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_array_job_id": os.environ.get("SLURM_ARRAY_JOB_ID"),
        "slurm_array_task_id": os.environ.get("SLURM_ARRAY_TASK_ID"),
        "started_at": started.replace(tzinfo=None), "finished_at": datetime.now(timezone.utc).replace(tzinfo=None),
        "error": res.error or None, "error_kind": res.error_kind or None,
        "final_hash": (res.grade or {}).get("final_hash"), "golden_hash": (res.grade or {}).get("golden_hash"),
        "diff": json.dumps((res.grade or {}).get("diff")) if res.grade and res.grade.get("diff") else None,
        "final_message": res.final_message[:4000] or None,
        "env_degraded": res.degraded or None,
        "transcript": compact(res.messages, res.tools, res.finish_reason, (res.grade or {}).get("rubrics") or [], blob_dir)
                      if transcript else None,
    }
    names = {"in": "input_tokens", "cached": "cached_tokens", "out": "output_tokens", "reasoning": "reasoning_tokens"}
    for role in ROLES:
        usage = res.usage.get(role, {})
        for short, long in names.items():
            row[f"{role}_{short}"] = int(usage.get(long, 0))
    return row
