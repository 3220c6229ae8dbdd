"""Per-attempt overhead of running tasks on MCP tool servers, against the in-process backend.

The same built-in tasks, exported as a ThinkingBox data directory served by `tbhpc mcp-serve`
(real stdio server processes), run with the oracle policy (no model: what is left is the
environment's cost) in four ways:
  in-process      the built-in domain (a private SQLite copy per attempt)
  mcp warm pool   `reuse: true`: one server process serves attempt after attempt (init resets it)
  mcp fresh+spare a fresh process per attempt, the next one started while this attempt runs
                  (`reuse: false, spare: 1`: what the reference servers need; with the oracle the
                  episode is far shorter than a start-up, so this shows the start-up rate)
  mcp cold        a fresh process per attempt, started when the attempt begins (`spare: 0`)
and prints the mean wall time per attempt and its ratio to in-process, plus the server's own
figures: spawn to ready, one tool call, one geteffects, resident memory per server process.
Reference figures (the issue, the reference servers on this kind of machine): ~1.5 s spawn to
ready, ~86 MiB per process, 2.5 ms per tool call, 20 ms per geteffects.

Usage: python bench/mcp_overhead.py [--tasks 24] [--cold 8]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.judge import KeywordJudge
from tbhpc.env.registry import Environments
from tbhpc.env.users import ScriptedUser
from tbhpc.mcp.client import ServerConnection, ServerSpec
from tbhpc.policy.scripted import OraclePolicy
from tbhpc.tasks.loader import load_pack
from tbhpc.tb.dataset import TBDataset
from tbhpc.mcp.export import write_dataset

REFERENCE = {"ready_s": 1.5, "rss_mib": 86.0, "call_ms": 2.5, "effects_ms": 20.0}


def run_all(tasks, env_of) -> tuple[float, int]:
    oracle, user, judge = OraclePolicy(), ScriptedUser(), KeywordJudge()
    t0, passed = time.perf_counter(), 0
    for t in tasks:
        res = run_episode(t, env_of(t), oracle, user, judge)
        assert res.status == "ok", res.error
        passed += res.passed
    return (time.perf_counter() - t0) / len(tasks), passed


def servers_file(root: Path, domains: list[str], reuse: bool, spare: int) -> Path:
    doc = yaml.safe_load((root / "servers.yaml").read_text())
    for d in domains:
        doc["servers"][d].update(reuse=reuse, spare=spare)
    path = root / f"servers-{int(reuse)}-{spare}.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def child_rss_mib() -> list[float]:
    me, out = os.getpid(), []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == me:
                status = (stat.parent / "status").read_text()
                out.append(int(next(ln for ln in status.splitlines() if ln.startswith("VmRSS:")).split()[1]) / 1024)
        except (OSError, StopIteration, IndexError, ValueError):
            continue
    return out


def server_figures(domain: str, task) -> dict:
    spec = ServerSpec(domain, sys.executable, ("-m", "tbhpc.cli", "mcp-serve", "--domain", domain))
    readies = []
    for _ in range(3):
        conn = ServerConnection(spec)
        conn.wait_ready()
        readies.append(conn.ready_s)
        conn.close()
    conn = ServerConnection(spec)
    conn.wait_ready()
    config = {"data_patch": task.data_patch, "golden_test_case": {"tool_interactions": [c.to_dict() for c in task.golden_calls]}}
    conn.call("__reserved__init", {"config": config}, 30)
    rss = max(child_rss_mib() or [float("nan")])
    call = task.golden_calls[0]
    t0 = time.perf_counter()
    for _ in range(200):
        conn.call(call.tool, dict(call.parameters), 30)
    call_ms = (time.perf_counter() - t0) * 1000 / 200
    t0 = time.perf_counter()
    for _ in range(50):
        conn.call("__reserved__geteffects", {}, 30)
    effects_ms = (time.perf_counter() - t0) * 1000 / 50
    conn.close()
    return {"ready_s": statistics.median(readies), "rss_mib": rss, "call_ms": call_ms, "effects_ms": effects_ms}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tasks", type=int, default=24)
    ap.add_argument("--cold", type=int, default=8, help="attempts for the two fresh-process modes (each ~1 s)")
    args = ap.parse_args()
    console = Console()
    pack = [t for t in load_pack() if t.split == "eval" and t.domain in ("retail", "travel") and not t.rubrics_yesno]
    by_domain = [[t for t in pack if t.domain == d] for d in ("retail", "travel")]
    picked = [t for pair in zip(*by_domain) for t in pair][: args.tasks]          # alternate the two domains
    root = write_dataset(picked, Path(tempfile.mkdtemp(prefix="mcp-bench-")))
    ids = yaml.safe_load((root / "testlist.yaml").read_text())
    tb_tasks = TBDataset(root).tasks(ids)
    domains = sorted({t.domain for t in picked})
    for d in domains:
        _ = get_domain(d).template
    run_all(picked[:2], lambda t: get_domain(t.domain))                  # warm caches
    local, ok_local = run_all(picked, lambda t: get_domain(t.domain))
    rows = [("in-process", local, ok_local, len(picked))]
    for label, reuse, spare, n in (("mcp warm pool (reuse)", True, 1, len(picked)),
                                   ("mcp fresh + spare", False, 1, args.cold),
                                   ("mcp cold (spare 0)", False, 0, args.cold)):
        envs = Environments(servers_file(root, domains, reuse, spare))
        run_all(tb_tasks[:2], envs.for_task)               # the first process of each server starts once per worker
        per, ok = run_all(tb_tasks[:n], envs.for_task)
        envs.close()
        rows.append((label, per, ok, n))
        console.print(f"{label}: {per * 1000:.1f} ms per attempt ({ok}/{n} passed)")
    table = Table(title=f"per-attempt wall time, oracle policy ({len(picked)} tasks: {', '.join(domains)})")
    for col in ("mode", "attempts", "passed", "ms / attempt", "x in-process"):
        table.add_column(col, justify="right" if col != "mode" else "left")
    for label, per, ok, n in rows:
        table.add_row(label, str(n), str(ok), f"{per * 1000:.1f}", f"{per / local:.1f}")
    console.print(table)
    figs = server_figures(domains[0], picked[0])
    t2 = Table(title=f"one `tbhpc mcp-serve --domain {domains[0]}` process vs the reference servers (quoted)")
    for col in ("figure", "tbhpc mcp-serve", "reference", "ratio"):
        t2.add_column(col, justify="right" if col != "figure" else "left")
    for key, label in (("ready_s", "spawn to ready (s)"), ("rss_mib", "resident memory (MiB)"),
                       ("call_ms", "tool call (ms)"), ("effects_ms", "geteffects (ms)")):
        t2.add_row(label, f"{figs[key]:.2f}", f"{REFERENCE[key]:.2f}", f"{figs[key] / REFERENCE[key]:.2f}")
    console.print(t2)


if __name__ == "__main__":
    main()
