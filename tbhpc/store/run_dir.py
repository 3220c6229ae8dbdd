"""A run directory: everything one campaign produced, in one place.

    RUN/
      config.yaml      resolved campaign config       config.hash   hash of its identity fields
      campaign.json    campaign metadata (name, kind, policy id, created)
      plan.jsonl       the planned tasks (metadata + repeats), one per line
      tasks.json       the planned tasks in full: what every worker runs, even if the pack changes later
      shards/          attempt shards (JSONL, atomic); shards/quarantine/ holds corrupt ones
      blobs/           transcript parts shared by many attempts, by content hash (loaded into `blobs`)
      results.duckdb   the merged store (written only by the merge step)
      logs/
"""
from __future__ import annotations

import fcntl
import json
import os
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import yaml

from tbhpc.errors import UserError


@dataclass(frozen=True)
class RunDir:
    path: Path

    @property
    def config_file(self) -> Path:
        return self.path / "config.yaml"

    @property
    def hash_file(self) -> Path:
        return self.path / "config.hash"

    @property
    def campaign_file(self) -> Path:
        return self.path / "campaign.json"

    @property
    def plan_file(self) -> Path:
        return self.path / "plan.jsonl"

    @property
    def tasks_file(self) -> Path:
        return self.path / "tasks.json"

    @property
    def shards(self) -> Path:
        return self.path / "shards"

    @property
    def blobs(self) -> Path:
        """Content-addressed transcript parts (system prompts, tool schemas): tbhpc.store.transcripts."""
        return self.path / "blobs"

    @property
    def quarantine(self) -> Path:
        return self.path / "shards" / "quarantine"

    @property
    def db(self) -> Path:
        return self.path / "results.duckdb"

    @property
    def logs(self) -> Path:
        return self.path / "logs"

    def exists(self) -> bool:
        return self.campaign_file.exists()

    def require(self) -> "RunDir":
        if not self.exists():
            raise UserError(f"{self.path}: not a run directory (no campaign.json)")
        return self

    def create(self, config: dict, config_hash: str, campaign: dict, plan_rows: list[dict] | Path,
               tasks: list[dict] | None = None) -> None:
        """`plan_rows`: the plan's rows, or a finished plan file on the same file system (moved in)."""
        for d in (self.path, self.shards, self.logs):
            d.mkdir(parents=True, exist_ok=True)
        _atomic_text(self.config_file, yaml.safe_dump(config, sort_keys=False))
        if tasks is not None:
            _atomic_text(self.tasks_file, json.dumps(tasks, ensure_ascii=False))
        _atomic_text(self.hash_file, config_hash + "\n")
        if isinstance(plan_rows, Path):
            os.replace(plan_rows, self.plan_file)
        else:
            _atomic_text(self.plan_file, "".join(json.dumps(r, sort_keys=True) + "\n" for r in plan_rows))
        _atomic_text(self.campaign_file, json.dumps(campaign, indent=1, sort_keys=True) + "\n")  # last: marks a complete run dir

    def campaign(self) -> dict:
        return json.loads(self.require().campaign_file.read_text(encoding="utf-8"))

    def plan(self) -> list[dict]:
        return [json.loads(line) for line in self.plan_file.read_text(encoding="utf-8").splitlines() if line.strip()]

    def config_hash(self) -> str:
        return self.hash_file.read_text(encoding="utf-8").strip()

    @contextmanager
    def lock(self) -> Iterator[None]:
        """Exclusive lock for writing results.duckdb: never two writers on one DuckDB file."""
        self.path.mkdir(parents=True, exist_ok=True)
        with open(self.path / ".merge.lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)


def _atomic_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)
