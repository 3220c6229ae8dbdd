"""The scaling model (tbhpc/plan/model.py), calibrated on runs measured here, checked against them,
then asked about the reference's 3 x 8 H100 and 64 x 8: step time and idle per job, on-policy vs one
step off-policy, and the 507 x 20 eval campaign across K array tasks under fair share.

    python bench/scaling.py --runs RUN... [--calibrate RUN] [--shared-cores 2] \
        [--hardware jobs/plan/h100-27b.yaml] [--workload RUN] [--out runs/scaling]

RUN: training run directories (`make train NODES=n`, `tbhpc submit train ... steps=6`). The rates
come from --calibrate (default: the on-policy runs with the fewest and the most ranks,
tbhpc/plan/calibrate.py says what each gives); every other run is a prediction from its own
workload (its attempts) and those rates, printed next to what it measured. --shared-cores: the
runs' jobs shared this many cores (the local cluster: 2), so at most that many ranks compute at
once and the model gives overlapping generation with the update no gain.
Writes OUT/calibration.yaml (re-usable inputs), OUT/scaling.md (the tables) and two plots.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from tbhpc.plan.calibrate import calibrate, measure_run
from tbhpc.plan.model import Campaign, Cluster, Workload, campaign_time, step_time


def _md(headers, rows) -> str:
    return "\n".join(["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
                     + ["| " + " | ".join(str(c) for c in r) + " |" for r in rows])


def _show(con: Console, title: str, heads, rows) -> None:
    t = Table(title=title)
    for h in heads:
        t.add_column(h)
    for r in rows:
        t.add_row(*map(str, r))
    con.print(t)


def local_points(runs, cal_runs, shared_cores: int):
    measured = [measure_run(Path(r)) for r in runs]
    names = {str(Path(r)) for r in cal_runs or []}
    base = [m for m in measured if str(Path(m.run)) in names]
    if not base:     # default: the on-policy runs with the fewest and the most ranks
        on = [m for m in measured if m.max_staleness == 0]
        base = [min(on, key=lambda m: m.world), max(on, key=lambda m: m.world)]
    cluster = calibrate(base, parallel_ranks=shared_cores, shared_compute=bool(shared_cores))
    rows = []
    for m in measured:
        c = dataclasses.replace(cluster, trainer_nodes=m.world, in_flight=m.in_flight)
        rows.append((m, step_time(m.workload, c, m.max_staleness), m in base))
    return base, cluster, rows


KS = (0, 1, 2, 3)        # max_staleness: on-policy, one step off-policy, bounded asynchronous
MODES = {0: "0 (on-policy)", 1: "1 (off-policy)", 2: "2", 3: "3"}


def reference_points(hw: dict, workload: Workload):
    """3 x 8 and 64 x 8 (the recipe's 18 groups, and 18 x 64/3 groups: the batch scaled with the
    GPUs): every split of the nodes between trainer and serving job, for each max_staleness in KS
    (k >= 2 with the episodes in flight of one step's draws: the reference keeps them all in flight)."""
    per_node, replica = int(hw["gpus_per_node"]), int(hw["replica_gpus"])
    base = Cluster(**hw["cluster"])
    scaled = dataclasses.replace(workload, groups=workload.groups * 64 // 3)
    out = []
    for label, nodes, w in (("3 x 8", 3, workload), ("64 x 8", 64, workload),
                            (f"64 x 8, {scaled.groups} groups", 64, scaled)):
        for train_nodes in range(1, nodes):
            c = dataclasses.replace(base, trainer_nodes=train_nodes, ranks_per_node=per_node,
                                    replicas=(nodes - train_nodes) * per_node // replica)
            c = dataclasses.replace(c, in_flight=int(w.episodes))
            out.append((label, nodes, train_nodes, {k: step_time(w, c, k) for k in KS}))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", nargs="+", default=[], help="measured runs (none: the reference's predictions only)")
    ap.add_argument("--calibrate", nargs="+", default=None, help="the runs whose rates are used (default: on-policy, "
                    "fewest and most ranks)")
    ap.add_argument("--shared-cores", type=int, default=0)
    ap.add_argument("--hardware", default="jobs/plan/h100-27b.yaml")
    ap.add_argument("--workload", default=None, help="a run whose attempts give the reference workload")
    ap.add_argument("--out", default="runs/scaling")
    args = ap.parse_args()
    con, out = Console(), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    md_parts, rows, worst = [], [], float("nan")
    if args.runs:
        base, cluster, rows = local_points(args.runs, args.calibrate, args.shared_cores)
        (out / "calibration.yaml").write_text(yaml.safe_dump({
            "calibrated_on": [m.run for m in base], "cluster": dataclasses.asdict(cluster),
            "workload": dataclasses.asdict(base[0].workload)}, sort_keys=False))
        heads = ["run", "ranks", "in flight", "staleness", "step s measured", "step s predicted", "error", "rollout m/p",
                 "update m/p", "trainer wait m/p"]
        table = []
        for m, p, fitted in rows:
            err = (p.step_s - m.step_s) / m.step_s
            table.append([Path(m.run).name + (" (calibration)" if fitted else ""), m.world, m.in_flight, m.max_staleness,
                          f"{m.step_s:.1f}", f"{p.step_s:.1f}", f"{err:+.0%}",
                          f"{m.rollout_s:.1f}/{p.rollout_s:.1f}", f"{m.update_s:.1f}/{p.update_s:.1f}",
                          f"{m.trainer_wait_s:.1f}/{p.trainer_idle_s:.1f}"])
        cal = " + ".join(Path(m.run).name for m in base)
        _show(con, f"predicted vs measured (rates from {cal})", heads, table)
        worst = max((abs((p.step_s - m.step_s) / m.step_s) for m, p, fitted in rows if not fitted), default=float("nan"))
        md_parts = [f"## Predicted vs measured (rates from {cal}; largest error off the calibration runs {worst:.0%})",
                    _md(heads, table)]

    hw = yaml.safe_load(Path(args.hardware).read_text())
    workload = Workload(**hw["workload"])
    if args.workload:
        workload = dataclasses.replace(measure_run(Path(args.workload)).workload, groups=workload.groups,
                                       group_size=workload.group_size)
    ref = reference_points(hw, workload)
    best = {}
    for label, nodes, tn, by_k in ref:
        for k, p in by_k.items():
            key = (round(p.step_s, 1), p.trainer_idle_s + p.server_idle_s)   # equal steps: the least idle split
            if (label, k) not in best or key < best[(label, k)][3]:
                best[(label, k)] = (nodes, tn, p, key)
    rheads = ["GPUs", "max_staleness", "trainer nodes", "serving nodes", "rollout s", "update s", "publish+sync s",
              "step s", "vs k = 1", "trainer idle", "server idle"]
    rtable = []
    for (label, k), (nodes, tn, p, _) in best.items():
        rtable.append([label, MODES[k], tn, nodes - tn, f"{p.rollout_s:.0f}", f"{p.update_s:.0f}",
                       f"{p.publish_s + p.sync_s:.0f}", f"{p.step_s:.0f}", f"{best[(label, 1)][2].step_s / p.step_s:.2f}x",
                       f"{p.trainer_idle_s / p.step_s:.0%}", f"{p.server_idle_s / p.step_s:.0%}"])
    _show(con, f"{hw['name']}: best split per mode", rheads, rtable)

    camp = hw["campaign"]
    cheads = ["array tasks K", "fair-share slots", "waves", "attempts per task", "hours"]
    ctable = []
    for k, slots in ((8, 8), (32, 32), (128, 32), (128, 128), (507, 64)):
        c = campaign_time(Campaign(**{**camp, "array_tasks": k, "slots": slots}))
        ctable.append([k, slots, c["waves"], c["per_array_task"], f"{c['total_s'] / 3600:.2f}"])
    _show(con, f"eval {camp['tasks']} tasks x {camp['repeats']} ({camp['workers']} episodes in flight per array task)",
          cheads, ctable)

    md = "\n\n".join([*md_parts, f"## {hw['name']}", _md(rheads, rtable), "## Eval campaign", _md(cheads, ctable)])
    (out / "scaling.md").write_text(md + "\n")
    _plots(rows, ref, out)
    if rows:
        con.print(f"largest error on the local points the rates did not come from: {worst:.0%}")
    con.print(f"wrote {out}/scaling.md, scaling.png" + (", calibration.yaml" if rows else ""))
    return 0


def _plots(rows, ref, out: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    if rows:
        fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    else:
        fig, b = plt.subplots(figsize=(6, 4))
    if rows:
        ms = [m.step_s for m, _, _ in rows]
        ps = [p.step_s for _, p, _ in rows]
        a.scatter(ms, ps)
        for (m, _, _), x, y in zip(rows, ms, ps):
            a.annotate(f"{Path(m.run).name}", (x, y), fontsize=8)
        hi = max(ms + ps) * 1.1
        a.plot([0, hi], [0, hi], "k--", lw=0.8)
        a.set(xlabel="measured step s", ylabel="predicted step s", title="local cluster")
    for i, label in enumerate(dict.fromkeys(r[0] for r in ref)):
        style = ["--", "-", ":"][i % 3]
        for k in (0, 1, 2):
            pts = [(tn / n, by_k[k].step_s) for lab, n, tn, by_k in ref if lab == label]
            b.plot([p[0] for p in pts], [p[1] for p in pts], f"C{k}" + style, label=f"{label}, k = {k}")
    b.set(xlabel="share of nodes training", ylabel="step s", yscale="log", title="27B on H100: step time by split")
    b.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "scaling.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
