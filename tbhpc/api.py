"""tbhpc from Python: probe, select, train, evaluate and read results without writing shell.

Why a thin layer: every function here calls exactly what its `tbhpc` command calls (configs with
the same precedence and one-line errors, `plan_campaign` / `run_campaign`, `select_pool`,
`summarise` / `compare`, `submit_train`), so the API can never plan, grade or count differently
from the CLI. What it adds: Python values back (run paths, counts, the resolved config hash,
DuckDB relations, job handles) and submitit as an executor (`tbhpc.launch.submitit_exec`).

    import submitit
    from tbhpc import api
    ex = submitit.AutoExecutor(folder="logs/submitit")
    ex.update_parameters(timeout_min=60, slurm_array_parallelism=16)
    probe = api.probe("jobs/probe.yaml", out="runs/probe", executor=ex, wait=False)   # returns at once
    probe.wait()                                                 # merged; counts refreshed
    pool = api.select(probe, out="pool.yaml")
    base = api.evaluate("jobs/eval.yaml", out="runs/eval-base", executor=ex)
    print(api.agg(base)["pass@1"], api.results(base).filter("NOT passed").df())

Executors (`executor=`): "local" (worker processes here), "slurm" / "mpi" (tbhpc's sbatch
path), a submitit executor (`AutoExecutor`, `LocalExecutor`, `DebugExecutor`: one array job of
the campaign's chunks), or any object with tbhpc's `Executor` interface.
"""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tbhpc.campaign.config import CampaignConfig
from tbhpc.errors import UserError
from tbhpc.store.run_dir import RunDir

PathLike = str | os.PathLike


@dataclass
class Campaign:
    """A campaign's run directory and where it stands (refreshed by `refresh` / `wait`)."""
    path: Path
    name: str
    kind: str
    policy_id: str
    config_hash: str
    planned: int
    done: int                      # attempt keys with a clean result
    missing: int                   # still to run (never run, or last result a system error)
    jobs: list = field(default_factory=list, repr=False)   # submitit jobs of the last submission

    @property
    def complete(self) -> bool:
        return self.missing == 0

    def refresh(self) -> "Campaign":
        """Merge the shards written so far and recount."""
        fresh = status(self.path)
        fresh.jobs = self.jobs
        return fresh

    def wait(self) -> "Campaign":
        """Wait for this submission's jobs (a failed or cancelled one is not an error here: its keys stay
        missing, and running the campaign again runs only them), then merge and recount."""
        for job in self.jobs:
            try:
                job.result()
            except Exception:  # noqa: BLE001 - said through `missing`
                pass
        return self.refresh()

    def cancel(self) -> None:
        for job in self.jobs:
            job.cancel(check=False)

    def __fspath__(self) -> str:
        return str(self.path)


def config(config: CampaignConfig | PathLike | None = None, kind: str = "eval", overrides: list[str] | tuple = (),
           **fields: Any) -> CampaignConfig:
    """A campaign config: the command's defaults < a YAML file (or a config object) < `fields` <
    `overrides` ("key=value", as on the command line). A misspelt field is one line naming it."""
    from tbhpc.campaign.config import load_campaign
    return load_campaign(config, kind, overrides, fields)


def campaign(config_: CampaignConfig | PathLike | None = None, *, out: PathLike, kind: str = "eval",
             executor: Any = "local", wait: bool = True, overrides: list[str] | tuple = (), **fields: Any) -> Campaign:
    """Run (or resume) a probe or eval campaign into `out`, like `tbhpc probe|eval`. With a submitit
    executor and `wait=False` it returns as soon as the array is submitted (`.wait()` later)."""
    from rich.console import Console

    from tbhpc.campaign.runner import plan_campaign, run_campaign
    cfg = config(config_, kind, overrides, **fields)
    runner = _executor(executor, cfg)                 # bad input before anything is written
    if not wait:
        from tbhpc.launch.submitit_exec import SubmititExecutor
        if not isinstance(runner, SubmititExecutor):
            raise UserError("wait=False: only a submitit executor returns before its jobs end")
        plan = plan_campaign(cfg, Path(out))
        jobs = runner.submit(plan.run.path, plan.chunks(cfg.chunk_size)) if plan.keys else []
        return dataclasses.replace(status(out), jobs=jobs)
    run_campaign(cfg, Path(out), runner, Console(stderr=True))
    return dataclasses.replace(status(out), jobs=list(getattr(runner, "jobs", [])))


def probe(config_: CampaignConfig | PathLike | None = None, **kwargs: Any) -> Campaign:
    return campaign(config_, kind="probe", **kwargs)


def evaluate(config_: CampaignConfig | PathLike | None = None, **kwargs: Any) -> Campaign:
    return campaign(config_, kind="eval", **kwargs)


def status(run: PathLike) -> Campaign:
    """Where a campaign stands: its shards merged, its planned keys counted."""
    from tbhpc.campaign.runner import pending_keys
    from tbhpc.store.merge import merge
    rd = RunDir(Path(run)).require()
    camp = rd.campaign()
    if camp.get("kind") not in ("probe", "eval"):
        raise UserError(f"{rd.path}: a {camp.get('kind')} run, not a probe or eval campaign")
    merge(rd)
    keys, planned = pending_keys(rd, rd.plan())
    return Campaign(rd.path, camp["campaign"], camp["kind"], camp["policy_id"], camp["config_hash"], planned,
                    planned - len(keys), len(keys))


def select(probe_run: PathLike, out: PathLike, *, keep: list[str] | None = None, min_clean_runs: int = 3,
           exclude: list[PathLike] | None = None, reference: PathLike | None = None, force: bool = False):
    """The policy-relative pool of a probe (Jeffreys bands), like `tbhpc select`; returns the Selection."""
    from tbhpc.selection.bands import DEFAULT_KEEP
    from tbhpc.selection.pool import SelectConfig, select_pool
    cfg = SelectConfig(keep=list(keep or DEFAULT_KEEP), min_clean_runs=min_clean_runs,
                       exclude=[str(p) for p in exclude or []], reference=str(reference) if reference else None)
    return select_pool(Path(probe_run), Path(out), cfg, force, default_exclude=exclude is None)


def agg(run: PathLike, *, allow_incomplete: bool = False, prices: PathLike | None = None, bootstrap: int = 1000) -> dict:
    """pass@1, pass@k, pass^k, k/k, per domain, cost: the summary `tbhpc agg --format json` prints."""
    from tbhpc.campaign.validate import checked_counts
    from tbhpc.metrics.agg import load_prices, summarise
    return summarise(checked_counts(Path(run), allow_incomplete), load_prices(prices) if prices else None, bootstrap)


def compare(run: PathLike, other: PathLike, *, allow_incomplete: bool = False, bootstrap: int = 1000) -> dict:
    """Paired differences of two campaigns over their shared tasks (`tbhpc agg RUN --vs OTHER`)."""
    from tbhpc.campaign.validate import checked_counts
    from tbhpc.metrics.agg import compare as paired
    return paired(checked_counts(Path(run), allow_incomplete), checked_counts(Path(other), allow_incomplete), bootstrap)


def results(run: PathLike, table: str = "attempts"):
    """A DuckDB relation over the run's results on a read-only connection (`.df()` with pandas,
    `.fetchall()`, `.filter(...)`); the tables and views `tbhpc sql` offers."""
    from tbhpc.store.health import attached_results
    rd = RunDir(Path(run)).require()
    if not rd.db.exists():
        raise UserError(f"{rd.path}: no results.duckdb yet (run `tbhpc merge {rd.path}`)")
    return attached_results(rd.db).table(table)


def show(run: PathLike, task_id: str, attempt: int | None = None, policy: str | None = None, system: bool = False) -> str:
    """One attempt's conversation and grade as `tbhpc show` prints it."""
    from tbhpc.report.transcript import render_attempt
    from tbhpc.store.attempts import read_attempt
    rd = RunDir(Path(run)).require()
    if not rd.db.exists():
        raise UserError(f"{rd.path}: no results.duckdb yet (run `tbhpc merge {rd.path}`)")
    return render_attempt(os.fspath(run), read_attempt(rd.db, task_id, attempt, policy), system)


@dataclass
class Training:
    """A training run started from Python: its directory and how to follow it."""
    path: Path
    jobs: dict[str, str] = field(default_factory=dict)      # Slurm: {"serve": id, "train": id}
    process: subprocess.Popen | None = field(default=None, repr=False)   # local: the `tbhpc train` process
    scripts: str = ""                                       # dry_run: the job scripts, nothing submitted

    def wait(self) -> int:
        if self.process is not None:
            return self.process.wait()
        from tbhpc.config import load_config
        from tbhpc.launch.train import follow_train
        from tbhpc.train.config import TrainConfig
        steps = load_config(TrainConfig, self.path / "train.yaml").steps      # the run's own resolved config
        follow_train(self.path, self.jobs, steps, log=lambda m: None)
        return 0

    def cancel(self) -> None:
        if self.process is not None:
            self.process.terminate()
        if self.jobs:
            from tbhpc.launch.train import cancel_jobs
            cancel_jobs(self.jobs.values())


def train(config_: PathLike | None = None, *, out: PathLike, executor: str = "local", overrides: list[str] | tuple = (),
          log: PathLike | None = None, env: dict[str, str] | None = None, dry_run: bool = False,
          **fields: Any) -> Training:
    """Start a GRPO run; returns at once. "slurm": the serving + trainer jobs of `tbhpc submit train`
    (its sbatch path, not submitit: the trainer must start while the serving job runs and read its
    endpoint file, which submitit's job dependencies cannot say), as job ids; `dry_run`: their
    scripts, nothing submitted. "local": `tbhpc train` in a subprocess (its ranks end their own
    process when training ends) with `env` (default: this process's), output to `log`."""
    import json

    from tbhpc.outpaths import check_run_folder
    from tbhpc.train.config import load_train_config
    cfg = load_train_config(config_, overrides, fields)
    args = [f"{k}={json.dumps(v)}" for k, v in fields.items()] + list(overrides)   # JSON is YAML; the same precedence
    out = Path(out)
    check_run_folder(out, "train", flag="out")
    if executor == "slurm":
        import yaml

        from tbhpc.launch.train import submit_train
        if dry_run:
            return Training(out.resolve(), scripts=submit_train(cfg, out, dry_run=True))
        submit_train(cfg, out, log=lambda m: None)
        jobs = yaml.safe_load((out / "slurm" / "train-jobs.yaml").read_text(encoding="utf-8"))
        return Training(out.resolve(), {k: str(v) for k, v in jobs.items()})
    if executor != "local" or dry_run:
        raise UserError(f"train: executor must be 'local' or 'slurm' (dry_run: slurm only), got {executor!r}")
    cmd = [sys.executable, "-m", "tbhpc.cli", "train", str(out), *(["--config", str(config_)] if config_ else []), *args]
    sink = open(log, "ab") if log else None
    proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT if sink else None, env=env)
    return Training(out.resolve(), process=proc)


def _executor(executor: Any, cfg: CampaignConfig):
    from tbhpc.launch.executors import make_executor
    if isinstance(executor, str):
        return make_executor(executor, cfg.workers, cfg.slurm)
    if hasattr(executor, "map_array") or hasattr(executor, "update_parameters"):
        from tbhpc.launch.submitit_exec import SubmititExecutor
        if (cfg.slurm.get("container") or {}).get("runtime"):
            raise UserError("slurm.container: a submitit executor writes its own scripts, which tbhpc's container "
                            "option does not reach; use executor='slurm' (or submitit's own srun_args)")
        return SubmititExecutor(executor, log=lambda m: print(m, file=sys.stderr, flush=True))
    if callable(getattr(executor, "run", None)) and hasattr(executor, "name"):
        return executor
    raise UserError(f"executor: expected 'local', 'slurm', 'mpi' or a submitit executor, got {type(executor).__name__}")
