"""Episodes per second through OpenEnv on loopback, against tbhpc's in-process path, same run.

The same demo-pack tasks, the oracle policy (no model: what is left is the environment's cost),
run three ways:
  in-process       the built-in domain (a private SQLite copy per attempt)
  openenv x1       `tbhpc openenv-serve` (OpenEnv's server, .venv-openenv) on loopback, one session at a time
  openenv xN       the same with N sessions in flight (threads here, one OpenEnv session each)
Every attempt through OpenEnv is checked against the in-process one (verdict and final-state
hash). Prints attempts/s, the ratio to in-process, and the messages per attempt.

Usage: python bench/openenv_overhead.py [--tasks 200] [--sessions 8]
"""
from __future__ import annotations

import argparse
import os
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.openenv.launch import Launched, OpenEnvSpec
from tbhpc.openenv.remote import OpenEnvEnvironment
from tbhpc.policy.scripted import OraclePolicy
from tbhpc.tasks.loader import load_pack, resolve_pack

REPO = Path(__file__).resolve().parents[1]


def timed(tasks, env_of, workers: int) -> tuple[float, list]:
    oracle, user = OraclePolicy(), ScriptedUser()
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(lambda t: run_episode(t, env_of(t), oracle, user), tasks))
    return time.perf_counter() - t0, results


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=200)
    ap.add_argument("--sessions", type=int, default=8)
    args = ap.parse_args()
    con = Console()
    python = os.environ.get("TBHPC_OPENENV_PYTHON") or str(REPO / ".venv-openenv" / "bin" / "python")
    if not Path(python).exists():
        con.print(f"no OpenEnv environment at {python}: run `make env-openenv`")
        return 2
    tasks = random.Random(0).sample(load_pack(resolve_pack("demo")), args.tasks)
    server = Launched(OpenEnvSpec(launch=f"{python} -m tbhpc.cli openenv-serve demo --max-sessions {args.sessions} --port {{port}}"))
    try:
        remote = OpenEnvEnvironment(server.url)
        timed(tasks[:10], lambda t: remote, 1)                        # warm both sides (templates, golden cache)
        timed(tasks[:10], lambda t: get_domain(t.domain), 1)
        local_s, local = timed(tasks, lambda t: get_domain(t.domain), 1)
        one_s, one = timed(tasks, lambda t: remote, 1)
        many_s, many = timed(tasks, lambda t: remote, args.sessions)
    finally:
        server.stop()
    for a, b, c in zip(local, one, many):
        assert a.status == b.status == c.status == "ok", (b.error, c.error)
        assert a.passed == b.passed == c.passed and a.grade["final_hash"] == b.grade["final_hash"] == c.grade["final_hash"]
    msgs = sum(3 + r.tool_calls + r.user_turns for r in one) / len(one)    # reset, list_tools, calls, user turns, finish
    table = Table(title=f"{len(tasks)} demo-pack attempts, oracle policy (verdicts and final states identical)")
    for col in ("path", "attempts/s", "ms/attempt", "vs in-process"):
        table.add_column(col, justify="right" if col != "path" else "left")
    for name, secs in (("in-process", local_s), ("openenv x1 (loopback)", one_s), (f"openenv x{args.sessions}", many_s)):
        table.add_row(name, f"{len(tasks) / secs:.1f}", f"{1000 * secs / len(tasks):.2f}", f"{secs / local_s:.1f}x time")
    con.print(table)
    con.print(f"WebSocket requests per attempt through OpenEnv: {msgs:.1f} (reset, list_tools, tool calls, finish); "
              f"CPU: {os.cpu_count()} cores")
    return 0


if __name__ == "__main__":
    sys.exit(main())
