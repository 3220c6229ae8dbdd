"""Environment overhead per oracle episode (reset + tool calls + grade; no model), against the
reference harness's isolation unit: spawning a fresh Python process per attempt.

Prints median and p99 per episode (golden state cached, as in a campaign where each task runs n
times, and cold, recomputing the golden replay every time), the ratio of one bare Python
subprocess spawn to the median episode, and resident memory per concurrent episode.
Target on a 2-core machine: median <= 5 ms.

Usage: python bench/episode_overhead.py [--rounds 3] [--concurrent 200]
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

from rich.console import Console
from rich.table import Table

from tbhpc.domains import get_domain
from tbhpc.env import golden
from tbhpc.env.episode import run_episode
from tbhpc.env.judge import KeywordJudge
from tbhpc.env.users import ScriptedUser
from tbhpc.policy import make_policy
from tbhpc.tasks.loader import load_pack

REFERENCE_SERVER_READY_S = 1.5     # measured on this kind of machine for one fresh tool-server process
REFERENCE_SERVER_RSS_MIB = 86.0


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


def time_episodes(tasks, rounds: int, cold: bool) -> list[float]:
    oracle, user, judge = make_policy("oracle"), ScriptedUser(), KeywordJudge()
    times = []
    for _ in range(rounds):
        for t in tasks:
            if cold:
                golden._GOLDEN_CACHE.clear()
            start = time.perf_counter()
            r = run_episode(t, get_domain(t.domain), oracle, user, judge)
            times.append(time.perf_counter() - start)
            assert r.passed, t.id
    return times


def time_subprocess(n: int) -> tuple[float, float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "pass"], check=True)
        times.append(time.perf_counter() - start)
    # the child's own peak (VmHWM): RUSAGE_CHILDREN's ru_maxrss would carry this process's peak,
    # which Linux hands down across fork and exec
    peak = subprocess.run([sys.executable, "-c", "print([l.split()[1] for l in open('/proc/self/status') "
                           "if l.startswith('VmHWM:')][0])"], check=True, capture_output=True, text=True)
    return statistics.median(times), int(peak.stdout) / 1024


def memory_per_episode(tasks, k: int) -> float:
    """Open k episodes at once (private backend with patch applied and golden calls replayed)."""
    base = rss_mib()
    held = []
    for t in (tasks * (k // len(tasks) + 1))[:k]:
        d = get_domain(t.domain)
        b = d.backend(t)
        box = d.toolbox(b)
        for c in t.golden_calls:
            box.call(c.tool, dict(c.parameters))
        held.append((b, box))
    per = (rss_mib() - base) / k
    for b, _ in held:
        b.conn.close()
    return per


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrent", type=int, default=200)
    ap.add_argument("--spawns", type=int, default=10)
    args = ap.parse_args()
    console = Console()
    tasks = load_pack()
    for d in {t.domain for t in tasks}:
        _ = get_domain(d).template  # template images are built once per process, not per episode
    time_episodes(tasks[:50], 1, cold=False)  # warm-up
    warm = time_episodes(tasks, args.rounds, cold=False)
    cold = time_episodes(tasks, 1, cold=True)
    spawn_s, child_mib = time_subprocess(args.spawns)
    mem = memory_per_episode(tasks, args.concurrent)

    table = Table(title=f"Oracle episode overhead ({len(tasks)} tasks, {os.cpu_count()} CPUs)")
    for col in ("measure", "median ms", "p99 ms", "spawn / median"):
        table.add_column(col, justify="right" if col != "measure" else "left")
    for name, ts in (("episode, golden cached", warm), ("episode, golden replayed", cold)):
        med = statistics.median(ts)
        table.add_row(name, f"{med * 1e3:.2f}", f"{pct(ts, 0.99) * 1e3:.2f}", f"{spawn_s / med:,.0f}x")
    table.add_row("python subprocess spawn (baseline)", f"{spawn_s * 1e3:.1f}", "", "1x")
    console.print(table)
    med = statistics.median(warm)
    console.print(f"target median <= 5 ms: {'met' if med <= 0.005 else 'MISSED'} ({med * 1e3:.2f} ms)")
    console.print(f"reference harness: ~{REFERENCE_SERVER_READY_S:.1f} s to a ready tool server per attempt -> "
                  f"{REFERENCE_SERVER_READY_S / med:,.0f}x the median episode here")
    console.print(f"memory per concurrent episode: {mem * 1024:.0f} KiB RSS ({args.concurrent} held open); "
                  f"bare python child peak RSS {child_mib:.1f} MiB; reference tool server ~{REFERENCE_SERVER_RSS_MIB:.0f} MiB "
                  f"-> {REFERENCE_SERVER_RSS_MIB / max(mem, 1e-9):,.0f}x less per episode")
    return 0


if __name__ == "__main__":
    sys.exit(main())
