"""A submitted stage on disk: RUN/slurm/stage-NNN/ holds `chunks.jsonl` (line i = the attempt
keys of array task i), the rendered scripts and `jobs.json` (job ids, for status). Array tasks
name their shards `shard-sNNN-tIIIII-...`, so a requeued task finds its own finished work."""
from __future__ import annotations

import json
import os
from pathlib import Path

from tbhpc.store.run_dir import RunDir
from tbhpc.store.shards import list_shards

Key = tuple[str, int]


def stage_dir(run: RunDir, stage: int) -> Path:
    return run.path / "slurm" / f"stage-{stage:03d}"


def next_stage(run: RunDir) -> int:
    root = run.path / "slurm"
    nums = [int(p.name.split("-")[1]) for p in root.glob("stage-*") if p.name.split("-")[1].isdigit()] if root.exists() else []
    return max(nums, default=0) + 1


def write_chunks(run: RunDir, stage: int, chunks: list[list[Key]]) -> Path:
    d = stage_dir(run, stage)
    d.mkdir(parents=True, exist_ok=True)
    tmp = d / ".chunks.jsonl.tmp"
    tmp.write_text("".join(json.dumps([[t, i] for t, i in c]) + "\n" for c in chunks), encoding="utf-8")
    os.replace(tmp, d / "chunks.jsonl")
    return d / "chunks.jsonl"


def read_chunks(run: RunDir, stage: int) -> list[list[Key]]:
    lines = (stage_dir(run, stage) / "chunks.jsonl").read_text(encoding="utf-8").splitlines()
    return [[(t, int(i)) for t, i in json.loads(line)] for line in lines if line.strip()]


def shard_prefix(stage: int, index: int) -> str:
    return f"shard-s{stage:03d}-t{index:05d}"


def keys_written(run: RunDir, prefix: str) -> set[Key]:
    """Keys with a row in this run's shards whose name starts with `prefix` (any status)."""
    done: set[Key] = set()
    for path in list_shards(run.shards):
        if path.name.startswith(prefix + "-"):
            done |= _keys_in(path)
    return done


def keys_written_by_task(run: RunDir, stage: int) -> dict[int, set[Key]]:
    """{array task index: keys written} for one stage, in a single pass over the shards."""
    head = f"shard-s{stage:03d}-t"
    out: dict[int, set[Key]] = {}
    for path in list_shards(run.shards):
        if path.name.startswith(head):
            index = int(path.name[len(head):len(head) + 5])
            out.setdefault(index, set()).update(_keys_in(path))
    return out


def _keys_in(path: Path) -> set[Key]:
    keys: set[Key] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
            keys.add((row["task_id"], int(row["attempt_index"])))
        except (ValueError, KeyError, TypeError):
            continue  # a damaged shard: merge will quarantine it; its keys are simply redone
    return keys


def record_jobs(run: RunDir, stage: int, jobs: dict) -> None:
    path = stage_dir(run, stage) / "jobs.json"
    old = json.loads(path.read_text()) if path.exists() else {}
    old.update(jobs)
    path.write_text(json.dumps(old, indent=1, sort_keys=True) + "\n", encoding="utf-8")


def stage_jobs(run: RunDir) -> dict[int, dict]:
    out = {}
    for d in sorted((run.path / "slurm").glob("stage-*")) if (run.path / "slurm").exists() else []:
        f = d / "jobs.json"
        if f.exists():
            out[int(d.name.split("-")[1])] = json.loads(f.read_text())
    return out
