"""GRPO vs continued SFT from the SFT plateau, paired, over training seeds: `make demo`'s pipeline
once per seed (`train.seed=N`; the same plateau, probe, pool and evaluation seeds: every seed
runs them again in its own directory, a campaign is tied to its files), then one table of GRPO - SFT on the
held-out split (110 x 20) and on fresh instances (330 x 10): pass@1, pass^k (all k of k), pass@k,
each with its paired bootstrap interval, and the goal the demo is held to (pass^k above SFT with
the interval above 0 on at least 2 of 3 seeds, pass@1 not below SFT, pass@k about flat).

    python bench/grpo_vs_sft.py [--seeds 0 1 2] [--out runs/grpo-vs-sft] [key=value ...]

key=value: demo config overrides for every seed (e.g. train.clip_high=0.28).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from tbhpc.config import load_config
from tbhpc.demo.config import DemoConfig
from tbhpc.demo.pipeline import run_demo


def seed_run(base: Path, seed: int, overrides: list[str], con: Console) -> dict:
    out = base / f"seed-{seed}"
    cfg = load_config(DemoConfig, Path("jobs/demo-pack.yaml"), [f"out={out}", "sft_baseline=true", *overrides])
    cfg.train = {**cfg.train, "seed": seed}
    if not (out / "demo.json").exists():
        run_demo(cfg, con)
    return json.loads((out / "demo.json").read_text())


def cell(d: dict) -> str:
    return f"{100 * d['delta']:+.1f} [{100 * d['lo']:+.1f}, {100 * d['hi']:+.1f}]"


def table(results: dict[int, dict]) -> str:
    lines = ["| seed | split | pass@1: GRPO - SFT | pass^k: GRPO - SFT | pass@k: GRPO - SFT | GRPO pass^k / SFT pass^k | "
             "GRPO wall |", "|---|---|---|---|---|---|---|"]
    for seed, doc in sorted(results.items()):
        for split, m in doc["grpo_vs_sft"].items():
            pk = next((k for k in m if k.startswith("pass@") and k != "pass@1"), None)
            lines.append(f"| {seed} | {split} | {cell(m['pass@1']['grpo_minus_sft'])} | {cell(m['k/k']['grpo_minus_sft'])} | "
                         f"{cell(m[pk]['grpo_minus_sft']) if pk else '-'} | {m['k/k']['grpo']:.3f} / {m['k/k']['sft']:.3f} | "
                         f"{doc['stage_seconds'].get('train', 0):.0f} s |")
    return "\n".join(lines)


def goal(results: dict[int, dict]) -> str:
    out = []
    for split in ("held-out", "fresh"):
        rows = [doc["grpo_vs_sft"][split] for doc in results.values() if split in doc["grpo_vs_sft"]]
        above = sum(r["k/k"]["grpo_minus_sft"]["lo"] > 0 for r in rows)
        not_below = sum(r["pass@1"]["grpo_minus_sft"]["hi"] >= 0 for r in rows)
        out.append(f"{split}: pass^k interval above 0 on {above} of {len(rows)} seeds; pass@1 not below SFT "
                   f"(interval reaches 0 or above) on {not_below} of {len(rows)}")
    return "; ".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--out", type=Path, default=Path("runs/grpo-vs-sft"))
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    con = Console()
    results = {}
    for seed in args.seeds:
        con.rule(f"seed {seed}")
        results[seed] = seed_run(args.out, seed, args.overrides, con)
    md = table(results) + "\n\n" + goal(results) + ".\n"
    (args.out / "grpo_vs_sft.md").write_text(md, encoding="utf-8")
    con.print(md)
    con.print(f"table: {args.out / 'grpo_vs_sft.md'}; per-seed reports: {args.out}/seed-N/report/README.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
