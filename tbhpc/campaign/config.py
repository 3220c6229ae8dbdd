"""Campaign configuration and planning: which tasks, how many repeats, which policy, user, judge.

The *identity* of a campaign (everything except how it is executed) is hashed; re-running into
an existing run directory with a different identity is refused, so a run directory never mixes
two experiments. Execution fields (workers, chunk size) may change between resumptions.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from tbhpc.config import from_dict, load_config
from tbhpc.errors import UserError
from tbhpc.slurm_options import SlurmOptions
from tbhpc.tasks.loader import pack_files
from tbhpc.tasks.schema import Task
from tbhpc.tasks.select import select_tasks
from tbhpc.tb.dataset import TBDataset, is_tb_source

EXECUTION_FIELDS = ("workers", "chunk_size", "concurrency", "slurm", "transcripts", "openenv")
KINDS = ("probe", "eval")
# what `tbhpc probe` / `tbhpc eval` (and api.config) start from before a config file and overrides
KIND_DEFAULTS = {
    "probe": {"name": "probe", "kind": "probe", "split": "train", "repeats": 8},
    "eval": {"name": "eval", "kind": "eval", "split": "eval", "repeats": 1},
}


@dataclass
class CampaignConfig:
    name: str = "eval"                 # the campaign's name (its rows' campaign column)
    kind: str = "eval"                 # probe | eval
    pack: str | None = None            # pack file/dir; tb:DIR = a ThinkingBox data checkout; None = the bundled pack
    split: str = "eval"                # train | eval | all (built-in packs; a ThinkingBox source is selected by `tasks`)
    tasks: str | None = None           # file of task ids: YAML list (a ThinkingBox test list), pool file {tasks: [...]}, or one id per line
    servers: str | None = None         # servers file for MCP tool servers (needed by tb: sources)
    environment: str = "local"         # local (tbhpc's backends) | openenv (every attempt on the OpenEnv environment below)
    openenv: dict[str, Any] = field(default_factory=dict)   # OpenEnvSpec: url | launch | uv_project, timeouts (execution only)
    domains: list[str] = field(default_factory=list)        # only these domains (empty: all)
    limit: int | None = None           # first N tasks after filtering (smoke runs)
    repeats: int = 1                   # attempts per task (n)
    policy: str = "oracle"             # oracle | noop | openai | hf | tokens
    policy_opts: dict[str, Any] = field(default_factory=dict)  # the policy's options (the Configuration reference lists them per policy)
    policy_id: str | None = None       # default: derived from policy and its options
    user: str = "scripted"             # scripted | openai
    user_url: str | None = None        # the simulated user's OpenAI-compatible endpoint (user: openai)
    user_model: str = "default"        # the simulated user's model name
    judge: str = "keyword"             # keyword | openai
    judge_url: str | None = None       # the judge's OpenAI-compatible endpoint (judge: openai)
    judge_model: str = "default"       # the judge's model name
    rubrics: str = "judge"             # judge | skip: grade yes/no rubrics, or not (recorded per attempt as rubrics_skipped)
    seed: int = 0                      # seeds every attempt's sampling (attempt i of a task gets its own seed)
    workers: int | str = 1             # execution only; auto: by CPUs and backend (`auto_workers`)
    concurrency: int = 1               # episodes in flight per worker (threads; a batched generator serves them together;
                                       # the `hf` policy seeds torch's global RNG per call and is not meant for > 1)
    chunk_size: int = 8                # attempts per shard (execution only)
    transcripts: bool = True           # store each attempt's conversation (attempts.transcript; execution only)
    slurm: dict[str, Any] = field(default_factory=dict)  # SlurmOptions fields (execution only)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise UserError(f"campaign config: field 'kind' must be probe or eval, got {self.kind!r}")
        if self.rubrics not in ("judge", "skip"):
            raise UserError(f"campaign config: field 'rubrics' must be judge or skip, got {self.rubrics!r}")
        if not self.name or len(self.name) > 100 or any(c == "/" or not c.isprintable() or c.isspace() for c in self.name):
            raise UserError(f"campaign config: field 'name' must be 1-100 printable characters without '/' or spaces "
                            f"(it names Slurm jobs and their log files), got {self.name!r}")
        for role, default in (("user", "scripted"), ("judge", "keyword")):
            if getattr(self, role) not in (default, "openai"):
                raise UserError(f"campaign config: field {role!r} must be {default} or openai, got {getattr(self, role)!r}")
            if getattr(self, role) == "openai" and not getattr(self, f"{role}_url"):
                raise UserError(f"campaign config: field {role!r} openai needs {role}_url (an OpenAI-compatible base URL "
                                "ending in /v1)")
        if self.split not in ("train", "eval", "all"):
            raise UserError(f"campaign config: field 'split' must be train, eval or all, got {self.split!r}")
        if isinstance(self.workers, str) and self.workers != "auto":
            raise UserError(f"campaign config: field 'workers' must be a whole number >= 1 or auto, got {self.workers!r}")
        for name in ("repeats", "workers", "chunk_size", "concurrency"):
            if getattr(self, name) != "auto" and getattr(self, name) < 1:
                raise UserError(f"campaign config: field {name!r} must be >= 1, got {getattr(self, name)!r}")
        if self.servers and not Path(self.servers).is_file():
            raise UserError(f"campaign config: field 'servers': {self.servers} is not a file (the MCP servers file)")
        from tbhpc.openenv.launch import openenv_spec
        openenv_spec(self.environment, self.openenv, "campaign config")
        if self.limit is not None and self.limit < 1:
            raise UserError(f"campaign config: field 'limit' must be >= 1 (or null: every task), got {self.limit!r}")
        from tbhpc.policy import check_policy_options
        check_policy_options(self.policy, self.policy_opts, "campaign config: policy_opts")
        if self.slurm:  # checked now, not when an executor or `submit` first reads them
            from_dict(SlurmOptions, self.slurm, {k: "campaign config field 'slurm'" for k in self.slurm})

    @property
    def openenv_spec(self):
        from tbhpc.openenv.launch import openenv_spec
        return openenv_spec(self.environment, self.openenv, "campaign config")

    @property
    def resolved_policy_id(self) -> str:
        if self.policy_id:
            return self.policy_id
        if not self.policy_opts:
            return self.policy
        label = self.policy_opts.get("model") or Path(str(self.policy_opts.get("model_path", ""))).name
        if self.policy_opts.get("endpoint"):   # a served policy: name the weights it serves now
            from tbhpc.serve.endpoint import read_endpoint
            ep = read_endpoint(self.policy_opts["endpoint"])
            label = f"{ep.model}@{ep.version}"
        digest = hashlib.sha256(json.dumps(self.policy_opts, sort_keys=True).encode()).hexdigest()[:8]
        return f"{self.policy}:{label}:{digest}" if label else f"{self.policy}:{digest}"

    def identity(self) -> dict:
        d = asdict(self)
        for k in EXECUTION_FIELDS:
            d.pop(k)
        if d["rubrics"] == "judge":       # the default: campaigns made before the field existed keep their hash
            d.pop("rubrics")
        if d["environment"] == "local":   # likewise
            d.pop("environment")
        d["policy_id"] = self.resolved_policy_id
        return d


def auto_workers(tasks: list[Task], servers: str | None, cpus: int | None = None) -> tuple[int, str]:
    """Local worker processes for `workers: auto`, and why. Built-in tasks: one per CPU. Tasks on
    MCP servers started fresh for each attempt: one per two CPUs, since each worker also starts its
    next servers ahead and a server's start-up is CPU work (100 ThinkingBox release tasks with the
    oracle on 2 CPUs: 109-110 s with 1 worker, 121-126 s with 2)."""
    cpus = cpus or len(os.sched_getaffinity(0))
    fresh = False
    if servers and any(t.backend for t in tasks):
        from tbhpc.mcp.servers import load_servers
        fresh = any(not spec.reuse for spec in load_servers(servers).servers.values())
    if fresh:
        return max(1, cpus // 2), f"MCP servers started fresh for each attempt, {cpus} CPU(s): one worker per two"
    return cpus, f"{cpus} CPU(s): one worker each"


def pack_hash(pack: Path | str) -> str:
    h = hashlib.sha256()
    if is_tb_source(str(pack)):
        return TBDataset(pack).digest()
    for p in pack_files(pack):
        h.update(p.name.encode())
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


def identity_hash(cfg: CampaignConfig, pack_digest: str) -> str:
    text = json.dumps({**cfg.identity(), "pack_hash": pack_digest}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def load_campaign(source: "CampaignConfig | Path | str | None", kind: str, overrides: list[str] | tuple = (),
                  updates: dict[str, Any] | None = None) -> CampaignConfig:
    """The one way a campaign config is read (`tbhpc probe|eval|submit`, the API): the kind's
    defaults (or a config object) < the YAML file < `updates` < `key=value` overrides. The command
    sets the kind, so a file or override that says another kind is a mistake, said in one line."""
    if kind not in KIND_DEFAULTS:
        raise UserError(f"kind: expected probe or eval, got {kind!r}")
    if isinstance(source, CampaignConfig):
        cfg = load_config(CampaignConfig, None, list(overrides), base=asdict(source), updates=updates)
    else:
        cfg = load_config(CampaignConfig, source, list(overrides), base=KIND_DEFAULTS[kind], updates=updates)
    if cfg.kind != kind:
        raise UserError(f"{kind}: the campaign config says kind: {cfg.kind} (config file or override); "
                        f"the command sets the kind: run `tbhpc {cfg.kind}`, or drop the field")
    return cfg


def campaign_tasks(cfg: CampaignConfig, skipped: dict[str, str] | None = None) -> list[Task]:
    """The campaign's tasks; `skipped` (if given) receives the ThinkingBox files left out, and why."""
    return select_tasks(cfg.pack, cfg.tasks, cfg.split, cfg.domains, cfg.limit, skipped)


def plan_rows(tasks: list[Task], repeats: int) -> list[dict]:
    return [{"task_id": t.id, "domain": t.domain, "split": t.split, "n_golden_calls": t.n_golden_calls,
             "tags": list(t.tags), "template": t.template, "repeats": repeats} for t in tasks]
