"""A step's sample episodes as a table: task, reward, and the transcript `tbhpc show` prints.

Why from results.duckdb: the table shows what the run recorded (the attempt rows the step's
shards merged into), through the same reader and renderer as `tbhpc show`, so a transcript in
a tracker is one a user can find again with `tbhpc show RUN TASK --policy VERSION`.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.report.transcript import render_attempt
from tbhpc.store.attempts import read_attempt
from tbhpc.store.health import open_results

COLUMNS = ["step", "task", "attempt", "reward", "transcript"]


def step_samples(run_path: Path, step: int, n: int) -> list[list]:
    """Up to `n` episodes of training step `step` (lowest task ids first: the same ones every run)."""
    db = run_path / "results.duckdb"
    con = open_results(db, read_only=True)
    try:
        keys = con.execute("SELECT task_id, attempt_index, policy_id, reward FROM attempts WHERE train_step = ? "
                           "ORDER BY task_id, attempt_index LIMIT ?", [step, n]).fetchall()
    finally:
        con.close()
    return [[step, task, attempt, reward, render_attempt(str(run_path), read_attempt(db, task, attempt, policy))]
            for task, attempt, policy, reward in keys]
