"""The campaign driver: tasks x repeats x one policy -> attempts, resumable and idempotent.

`run_campaign` creates (or reopens) the run directory, merges whatever shards exist, computes the
pending keys (never run, or last result a system error), hands them to an executor in chunks,
and merges again. Re-running the same command after a crash, a kill or a partial failure
executes exactly the missing work.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TaskProgressColumn, TextColumn,
                           TimeElapsedColumn, TimeRemainingColumn)

from tbhpc.agents import check_judge
from tbhpc.campaign.config import CampaignConfig, auto_workers, campaign_tasks, identity_hash, pack_hash, plan_rows
from tbhpc.campaign.executors import Executor, LocalExecutor
from tbhpc.config import resolved
from tbhpc.env.registry import preflight
from tbhpc.errors import UserError
from tbhpc.interrupts import Interrupted, second_interrupt_exits
from tbhpc.interrupts import check as check_interrupt
from tbhpc.outpaths import check_run_folder
from tbhpc.store.merge import MergeReport, connect, merge
from tbhpc.store.run_dir import RunDir
from tbhpc.tasks.select import pack_source


@dataclass
class CampaignResult:
    planned: int
    already_done: int
    executed: int
    ok: int
    system_errors: int
    missing: int
    merge: MergeReport


def open_run(cfg: CampaignConfig, out: Path) -> tuple[RunDir, list[dict], list]:
    """Create the run directory, or check that an existing one holds the same campaign."""
    check_run_folder(Path(out), cfg.kind)
    from tbhpc.policy import check_policy_ready
    check_policy_ready(cfg.policy, cfg.policy_opts)
    skipped: dict[str, str] = {}
    tasks = campaign_tasks(cfg, skipped)
    for file, why in skipped.items():
        print(f"tbhpc: skipped {file}: {why}", file=sys.stderr)
    check_judge(tasks, cfg.judge, cfg.rubrics)
    digest = pack_hash(pack_source(cfg.pack))
    chash = identity_hash(cfg, digest)
    run = RunDir(Path(out))
    rows = plan_rows(tasks, cfg.repeats)
    if run.exists():
        check_same_campaign(run, cfg, chash)
        preflight(tasks, cfg.servers, cfg.openenv_spec)      # after the cheap checks: a refused resume starts no server
        return run, rows, tasks
    preflight(tasks, cfg.servers, cfg.openenv_spec)
    campaign = {"campaign": cfg.name, "kind": cfg.kind, "policy_id": cfg.resolved_policy_id, "config_hash": chash,
                "pack_hash": digest, "config": resolved(cfg), "created_at": datetime.now(timezone.utc).isoformat(sep=" ")[:26],
                "source": "tbhpc"}
    run.create(resolved(cfg), chash, campaign, rows, [t.to_dict() for t in tasks])
    return run, rows, tasks


def check_same_campaign(run: RunDir, cfg: CampaignConfig, chash: str | None = None) -> None:
    """An existing run resumed with `cfg` must hold the same campaign (kind, fields, policy, pack);
    read-only, so `submit --dry-run` says it too."""
    chash = chash or identity_hash(cfg, pack_hash(pack_source(cfg.pack)))
    if run.config_hash() == chash:
        return
    old = yaml.safe_load(run.config_file.read_text(encoding="utf-8")) or {}
    diffs = sorted((k for k, v in cfg.identity().items() if old.get(k, v) != v and k != "policy_id"),
                   key=lambda k: k != "kind")    # another kind of campaign says so first
    old_pid, new_pid = run.campaign().get("policy_id"), cfg.resolved_policy_id
    what = (f"kind {old['kind']}, not {cfg.kind}" if diffs and diffs[0] == "kind" else
            f"field {diffs[0]!r} differs" if diffs else
            f"policy {old_pid!r} is now {new_pid!r} (the served weights changed?)" if old_pid != new_pid else
            "the task pack changed")
    raise UserError(f"{run.path}: holds a different campaign ({what}); use a new --out directory")


def _log(run: RunDir, line: str) -> None:
    """One line per invocation in logs/campaign.log: what each (re)run did."""
    run.logs.mkdir(parents=True, exist_ok=True)
    with open(run.logs / "campaign.log", "a", encoding="utf-8") as f:
        f.write(f"{datetime.now(timezone.utc).isoformat(timespec='seconds')} {line}\n")


def grading_notes(run: RunDir) -> list[str]:
    """What a reader of the run's numbers must know: attempts whose environment lacked something,
    and attempts graded without their rubrics (said by the campaign summary and by `agg`). Results
    files written before a column existed lack it until their next merge: nothing to say then."""
    con = connect(run, read_only=True)
    try:
        columns = {d[0] for d in con.execute("SELECT * FROM attempts LIMIT 0").description}
        degraded = con.execute("SELECT env_degraded, count(*), count(DISTINCT task_id) FROM attempts WHERE env_degraded "
                               "IS NOT NULL GROUP BY 1 ORDER BY 1").fetchall() if "env_degraded" in columns else []
        skipped = con.execute("SELECT count(*), count(DISTINCT task_id) FROM attempts WHERE rubrics_skipped > 0"
                              ).fetchall() if "rubrics_skipped" in columns else []
    finally:
        con.close()
    lines = [f"{n} attempt(s) of {tasks} task(s) ran with env_degraded = {what!r}" for what, n, tasks in degraded]
    lines += [f"{n} attempt(s) of {tasks} task(s) were graded without their yes/no rubrics (rubrics=skip: a pass "
              "means the database matched; attempts.rubrics_skipped)" for n, tasks in skipped if n]
    return lines


def system_error_causes(run: RunDir, limit: int = 3) -> list[tuple[str, str, int]]:
    """(kind, message, attempts) of the commonest causes of the run's system errors."""
    con = connect(run, read_only=True)
    try:
        return con.execute("SELECT coalesce(error_kind, 'infra'), left(coalesce(error, '(no message)'), 160), count(*) "
                           "FROM attempts WHERE status = 'system_error' GROUP BY 1, 2 ORDER BY 3 DESC, 1, 2 LIMIT ?",
                           [limit]).fetchall()
    finally:
        con.close()


def pending_keys(run: RunDir, rows: list[dict]) -> tuple[list[tuple[str, int]], int]:
    camp = run.campaign()
    con = connect(run, read_only=True)
    try:
        ok = set(con.execute("SELECT task_id, attempt_index FROM attempts WHERE campaign = ? AND policy_id = ? AND status = 'ok'",
                             [camp["campaign"], camp["policy_id"]]).fetchall())
    finally:
        con.close()
    planned = [(r["task_id"], i) for r in rows for i in range(r["repeats"])]
    return [k for k in planned if k not in ok], len(planned)


@dataclass
class Plan:
    """A campaign opened and its pending work: what every way of running it starts from."""
    run: RunDir
    rows: list[dict]
    tasks: list
    keys: list[tuple[str, int]]
    planned: int
    merge: MergeReport

    def chunks(self, size: int) -> list[list[tuple[str, int]]]:
        return [self.keys[i:i + size] for i in range(0, len(self.keys), size)]


def plan_campaign(cfg: CampaignConfig, out: Path, console: Console | None = None) -> Plan:
    """Open (or resume) the run, merge what earlier runs left in shards, and list the pending keys."""
    run, rows, tasks = open_run(cfg, out)
    if cfg.workers == "auto":
        cfg.workers, why = auto_workers(tasks, cfg.servers)
        if console is not None:
            console.print(f"workers: auto -> {cfg.workers} ({why})")
    report = merge(run, verify=True)  # pick up shards of an earlier, interrupted run (a damaged file: stop)
    for line in report.lines():
        if console is not None:
            console.print(f"[red]warning[/]: {line}")
    keys, planned = pending_keys(run, rows)
    check_interrupt()  # one a DuckDB call swallowed
    return Plan(run, rows, tasks, keys, planned, report)


def run_campaign(cfg: CampaignConfig, out: Path, executor: Executor | None = None, console: Console | None = None) -> CampaignResult:
    console = console or Console(stderr=True)
    plan = plan_campaign(cfg, out, console)
    run, rows, keys, planned, report = plan.run, plan.rows, plan.keys, plan.planned, plan.merge
    if executor is not None and getattr(executor, "workers", None) == "auto":
        executor.workers = cfg.workers
    executor = executor or LocalExecutor(cfg.workers)
    chunks = plan.chunks(cfg.chunk_size)
    counts = {"ok": 0, "err": 0}
    console.print(f"campaign [bold]{cfg.name}[/] ({cfg.kind}, policy {cfg.resolved_policy_id}): {planned} attempts planned, "
                  f"{planned - len(keys)} done, {len(keys)} to run with {executor.name} x{cfg.workers}")
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[rate]}"), TimeElapsedColumn(), TimeRemainingColumn())
    failure: Exception | None = None
    interrupted = False
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(cfg.kind, total=len(keys), rate="")

        def on_chunk(ok: int, err: int) -> None:
            counts["ok"] += ok
            counts["err"] += err
            elapsed = progress.tasks[0].elapsed or 1e-9
            progress.update(bar, advance=ok + err, rate=f"{(counts['ok'] + counts['err']) / elapsed:.1f} att/s")

        try:
            executor.run(run.path, chunks, on_chunk)
        except Exception as exc:  # keep what finished: merge before reporting
            failure = exc
        except KeyboardInterrupt:  # the executor has stopped its workers
            interrupted = True
    with second_interrupt_exits():  # cleanup: a second Ctrl-C exits at once
        final = merge(run)
        for line in final.lines():
            console.print(f"[red]warning[/]: {line}")
        for line in grading_notes(run):
            console.print(f"[yellow]note[/]: {line}")
        remaining, _ = pending_keys(run, rows)
        result = CampaignResult(planned, planned - len(keys), counts["ok"] + counts["err"], counts["ok"], counts["err"],
                                len(remaining), final)
        if interrupted:
            failure = Interrupted(f"{run.path}: interrupted; {planned - len(remaining)} of {planned} attempts are saved, "
                                  f"re-run the same command to run the other {len(remaining)}")
        _log(run, f"{executor.name} x{cfg.workers}: planned {planned}, already done {result.already_done}, executed "
                  f"{result.executed} ({result.ok} ok, {result.system_errors} system errors), still to run {result.missing}, "
                  f"quarantined shards {len(report.quarantined) + len(final.quarantined)}"
                  + (f", stopped by: {failure}" if failure else ""))
    if failure is not None:
        raise failure
    return result
