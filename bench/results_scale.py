"""Results at scale: ingest (merge of shards into DuckDB) and `agg` on synthetic campaigns of
507 tasks x 20 repeats (the published evaluation) and 1,000,000 attempts (50,000 x 20).

Each phase runs in a fresh subprocess so its peak RSS is its own. The baseline in the same run is
what the reference harness does for aggregation: read every result line with Python's json module
and count per task. Targets on this machine: agg <= 0.5 s (507 x 20) and <= 3 s (1M).

Usage: python bench/results_scale.py [--scales 507x20,50000x20] [--keep DIR]
"""
from __future__ import annotations

import argparse
import json
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROWS_PER_SHARD = 10_000
DOMAINS = ["retail", "insurance", "travel", "neobank", "consulting"]


def make_campaign(root: Path, tasks: int, repeats: int) -> Path:
    """A run directory with a plan and JSONL shards written by DuckDB (fast, realistic files)."""
    import duckdb

    from tbhpc.store.run_dir import RunDir
    run = RunDir(root)
    plan = [{"task_id": f"task-{i:06d}", "domain": DOMAINS[i % 5], "split": "eval", "n_golden_calls": 3, "tags": [],
             "template": "synthetic", "repeats": repeats} for i in range(tasks)]
    run.create({"name": "bench"}, "synthetic", {"campaign": "bench", "kind": "eval", "policy_id": "synthetic",
                                               "config_hash": "synthetic", "config": {}, "source": "bench"}, plan)
    total = tasks * repeats
    con = duckdb.connect()
    for s, start in enumerate(range(0, total, ROWS_PER_SHARD)):
        stop = min(total, start + ROWS_PER_SHARD)
        # per-task success probability from a hash of the task; per-attempt draw from a hash of the key
        con.execute(f"""COPY (
            SELECT 'bench' AS campaign, printf('task-%06d', i // {repeats}) AS task_id, (i % {repeats})::INTEGER AS attempt_index,
                   'synthetic' AS policy_id, {DOMAINS!r}[(i // {repeats}) % 5 + 1] AS domain,
                   p AS passed, CASE WHEN p THEN 1.0 ELSE 0.0 END AS reward, 'ok' AS status, 'done' AS finish_reason,
                   (3 + i % 7)::INTEGER AS agent_turns, 1200 + i % 900 AS agent_in, 400 AS agent_cached, 250 + i % 300 AS agent_out,
                   'node1' AS host, TIMESTAMP '2026-01-01' + to_seconds(i) AS finished_at
            FROM (SELECT i, (hash(i) % 1000) < (hash(i // {repeats} + 7) % 1000) AS p FROM range({start}, {stop}) t(i))
        ) TO '{run.shards}/shard-{s:05d}.jsonl' (FORMAT json)""")
    con.close()
    return root


def phase(name: str, run: str) -> dict:
    """Runs inside a fresh interpreter; prints {seconds, peak_mib}."""
    start = time.perf_counter()
    if name == "merge":
        from tbhpc.store.merge import merge
        from tbhpc.store.run_dir import RunDir
        rep = merge(RunDir(Path(run)))
        extra = {"rows": rep.rows, "shards": rep.new_shards}
    elif name == "agg":
        t0 = time.perf_counter()
        from tbhpc.cli_results import checked_counts
        from tbhpc.metrics.agg import summarise
        imports = time.perf_counter() - t0
        t1 = time.perf_counter()
        s = summarise(checked_counts(Path(run), False), bootstrap=1000)
        extra = {"agg_s": time.perf_counter() - t1, "imports_s": imports, "pass@1": s["pass@1"]["value"], "tasks": s["tasks"]}
    else:  # baseline: the reference's approach, every line through json.loads, counts per task
        counts: dict[str, list[int]] = {}
        for f in sorted((Path(run) / "shards").glob("*.jsonl")):
            with open(f, encoding="utf-8") as fh:
                for line in fh:
                    row = json.loads(line)
                    nc = counts.setdefault(row["task_id"], [0, 0])
                    nc[0] += 1
                    nc[1] += bool(row["passed"])
        extra = {"tasks": len(counts), "pass@1": sum(c for _, c in counts.values()) / sum(n for n, _ in counts.values())}
    return {"seconds": time.perf_counter() - start, "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, **extra}


def run_phase(name: str, run: Path) -> dict:
    out = subprocess.run([sys.executable, __file__, "--phase", name, str(run)], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--scales", default="507x20,50000x20")
    ap.add_argument("--phase")
    ap.add_argument("run", nargs="?")
    ap.add_argument("--keep", type=Path)
    args = ap.parse_args()
    if args.phase:
        print(json.dumps(phase(args.phase, args.run)))
        return 0
    from rich.console import Console
    from rich.table import Table
    console = Console()
    results: dict[str, list[str]] = {}
    root = args.keep or Path(tempfile.mkdtemp(prefix="tbhpc-bench-"))
    try:
        for scale in args.scales.split(","):
            tasks, repeats = (int(x) for x in scale.split("x"))
            run = root / scale
            shutil.rmtree(run, ignore_errors=True)
            t0 = time.perf_counter()
            make_campaign(run, tasks, repeats)
            console.print(f"{scale}: generated {tasks * repeats:,} synthetic attempts in {time.perf_counter() - t0:.1f} s")
            ing, agg, base = run_phase("merge", run), run_phase("agg", run), run_phase("baseline", run)
            assert abs(agg["pass@1"] - base["pass@1"]) < 1e-12 and agg["tasks"] == base["tasks"] == tasks
            target = 0.5 if tasks * repeats <= 20_000 else 3.0
            results[scale] = [f"{tasks * repeats:,}", str(ing["shards"]), f"{ing['seconds']:.2f}", f"{ing['peak_mib']:.0f}",
                              f"{agg['agg_s']:.3f}", f"{agg['agg_s'] + agg['imports_s']:.2f}", f"{agg['peak_mib']:.0f}",
                              f"{base['seconds']:.2f}", f"{base['seconds'] / agg['agg_s']:.1f}x",
                              f"<= {target} s: {'met' if agg['agg_s'] <= target else 'MISSED'}"]
        table = Table(title="results at scale (each phase in a fresh process)")
        table.add_column("measure")
        for scale in results:
            table.add_column(scale, justify="right")
        names = ["attempts", "shards", "ingest (merge) s", "ingest peak MiB", "agg s", "agg + cold imports s", "agg peak MiB",
                 "baseline: json.loads per line s", "baseline / agg", "agg target"]
        for i, name in enumerate(names):
            table.add_row(name, *(v[i] for v in results.values()))
        console.print(table)
        console.print("agg = completeness check + per-task counts + every metric with 1,000 bootstrap replicates over tasks;"
                      " 'cold imports' adds loading duckdb/numpy/scipy in a fresh interpreter.")
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
