"""`make demo`: evaluate the bundled pack with the built-in policies and print a summary.

For now the main job on the embedded default is an evaluation (oracle and noop over every task,
scripted user, keyword judge); later stages (probe, select, train) join it as they land.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from tbhpc.config import config_hash, load_config
from tbhpc.domains import get_domain
from tbhpc.errors import UserError
from tbhpc.env.episode import EpisodeResult, run_episode
from tbhpc.env.judge import KeywordJudge
from tbhpc.env.users import ScriptedUser
from tbhpc.policy import make_policy
from tbhpc.tasks.loader import default_pack_dir, load_pack


@dataclass
class DemoConfig:
    pack: str | None = None
    split: str = "all"
    policies: list[str] = field(default_factory=lambda: ["oracle", "noop"])

    def __post_init__(self) -> None:
        if self.split not in ("all", "train", "eval"):
            raise UserError(f"demo config: field 'split' must be all, train or eval, got {self.split!r}")


def evaluate(tasks, policy_name: str, progress: Progress | None = None) -> list[EpisodeResult]:
    policy, user, judge = make_policy(policy_name), ScriptedUser(), KeywordJudge()
    bar = progress.add_task(f"{policy_name:>6}", total=len(tasks)) if progress else None
    results = []
    for task in tasks:
        results.append(run_episode(task, get_domain(task.domain), policy, user, judge))
        if progress:
            progress.advance(bar)
    return results


def summary_table(by_policy: dict[str, list[EpisodeResult]]) -> Table:
    table = Table(title="Pass rate by domain (reward 1 = final DB state matches golden, checks pass)")
    table.add_column("domain")
    for name in by_policy:
        table.add_column(name, justify="right")
    domains = sorted({r.domain for rs in by_policy.values() for r in rs})
    for dom in domains + ["ALL"]:
        cells = []
        for rs in by_policy.values():
            sel = [r for r in rs if dom in ("ALL", r.domain)]
            ok = [r for r in sel if r.status == "ok"]
            passed = sum(1 for r in ok if r.passed)
            errs = len(sel) - len(ok)
            cells.append(f"{passed}/{len(ok)} ({passed / max(len(ok), 1):.0%})" + (f" +{errs} err" if errs else ""))
        table.add_row(dom, *cells)
    return table


def run(args) -> int:
    console = Console()
    cfg = load_config(DemoConfig, args.config, args.overrides)
    pack = Path(cfg.pack) if cfg.pack else default_pack_dir()
    tasks = [t for t in load_pack(pack) if cfg.split == "all" or t.split == cfg.split]
    console.print(f"[bold]tbhpc demo[/]: {len(tasks)} tasks from {pack}, policies {', '.join(cfg.policies)} "
                  f"(config {config_hash(cfg)})")
    by_policy: dict[str, list[EpisodeResult]] = {}
    start = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console) as prog:
        for name in cfg.policies:
            by_policy[name] = evaluate(tasks, name, prog)
    console.print(summary_table(by_policy))
    n = sum(len(v) for v in by_policy.values())
    finishes = defaultdict(int)
    for rs in by_policy.values():
        for r in rs:
            finishes[r.finish_reason] += 1
    console.print(f"{n} episodes in {time.perf_counter() - start:.1f} s; finish reasons: {dict(finishes)}")
    return 0
