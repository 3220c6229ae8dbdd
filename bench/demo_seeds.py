"""`make demo`'s comparison over training seeds: the demo's pipeline once per seed (`train.seed=N`;
the same start, probe, pool and evaluation seeds: each seed runs them again in its own directory, a
campaign is tied to its files), then one table per split of every paired difference the demo
reports (GRPO - start, RFT - start, GRPO - RFT, GRPO - oracle SFT) on pass@1, pass^k (all k of k)
and pass@k, each with its paired bootstrap interval, and the goal the demo is held to: GRPO above
its start on pass@1 and pass^k (interval above 0) on every seed, pass@k within 2 pts of the start,
GRPO - RFT >= 0 on pass^k.

    python bench/demo_seeds.py [--config jobs/demo-pack.yaml] [--seeds 0 1 2] [--out runs/demo-seeds] [key=value ...]

key=value: demo config overrides for every seed (e.g. train.max_seconds=300). The plateau experiment:
--config jobs/demo-pack-plateau.yaml.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from tbhpc.config import load_config
from tbhpc.demo.comparison import LABELS, PAIRS
from tbhpc.demo.config import DemoConfig
from tbhpc.demo.pipeline import run_demo


def seed_run(config: Path, base: Path, seed: int, overrides: list[str], con: Console) -> dict:
    out = base / f"seed-{seed}"
    cfg = load_config(DemoConfig, config, [f"out={out}", *overrides])
    cfg.train = {**cfg.train, "seed": seed}
    if not (out / "demo.json").exists():
        run_demo(cfg, con)
    return json.loads((out / "demo.json").read_text())


def cell(d: dict) -> str:
    return f"{100 * d['delta']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def pairs_of(split: dict) -> list[str]:
    return [f"{b}-{a}" for a, b in PAIRS if f"{b}-{a}" in split["pass@1"]]


def pair_label(key: str) -> str:
    b, a = key.split("-")
    return f"{LABELS[b]} - {LABELS[a]}"


def table(results: dict[int, dict]) -> str:
    """One row per seed, split and paired difference: pass@1, pass^k, pass@k (pts, paired 95%)."""
    lines = ["| seed | split | difference | pass@1 | pass^k (all k of k) | pass@k | tasks at k/k |",
             "|---|---|---|---|---|---|---|"]
    for seed, doc in sorted(results.items()):
        for split, m in doc["comparison"].items():
            pk = next((k for k in m if k.startswith("pass@") and k != "pass@1"), None)
            kk = " / ".join(f"{LABELS[r]} {round(m['k/k'][r] * m['tasks'])}" for r in LABELS if r in m["k/k"])
            for key in pairs_of(m):
                lines.append(f"| {seed} | {split} | {pair_label(key)} | {cell(m['pass@1'][key])} | {cell(m['k/k'][key])} | "
                             f"{cell(m[pk][key]) if pk else '-'} | {kk} |")
    return "\n".join(lines)


def goal(results: dict[int, dict]) -> str:
    out = []
    for split in ("held-out", "fresh"):
        rows = [doc["comparison"][split] for doc in results.values() if split in doc["comparison"]]
        if not rows:
            continue
        n = len(rows)
        p1 = sum(r["pass@1"]["trained-warm"]["lo"] > 0 for r in rows)
        kk = sum(r["k/k"]["trained-warm"]["lo"] > 0 for r in rows)
        pk = []                                            # (row, its pass@k key): only where the report has one
        for r in rows:
            key = next((k for k in r if k.startswith("pass@") and k != "pass@1"), None)
            if key:
                pk.append((r, key))
        flat = sum(abs(r[k]["trained-warm"]["delta"]) <= 0.02 for r, k in pk)
        line = (f"{split}: GRPO above the start with the interval above 0 on pass@1 {p1} of {n} seeds, on pass^k {kk} of {n}"
                + (f"; pass@k within 2 pts of the start {flat} of {len(pk)}" if pk else ""))
        if all("trained-rft" in r["k/k"] for r in rows):
            line += f"; GRPO - RFT >= 0 on pass^k {sum(r['k/k']['trained-rft']['delta'] >= 0 for r in rows)} of {n}"
        out.append(line)
    return ". ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("jobs/demo-pack.yaml"))
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/demo-seeds"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    con = Console()
    results = {}
    for seed in args.seeds:
        con.rule(f"seed {seed}")
        results[seed] = seed_run(args.config, args.out, seed, args.overrides, con)
    md = table(results) + "\n\n" + goal(results) + ".\n"
    (args.out / "demo_seeds.md").write_text(md, encoding="utf-8")
    con.print(md)
    con.print(f"table: {args.out / 'demo_seeds.md'}; per-seed reports: {args.out}/seed-N/report/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
