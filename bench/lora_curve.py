"""Does LoRA GRPO learn where full-parameter GRPO does? Both on the small pool of bench/grpo_fits_pool.py.

That bench showed the trainer fitting a pool of 4 tasks with every parameter trained (the pool's pass
rate 18.8% -> 64.1% in 15 steps at lr 1e-4, README). Here the same probe and pool choice (its functions,
its seeds), then two runs of the same steps on that pool from the same warm start and seed: every
parameter at lr 1e-4 (that bench's setting), and rank-8 adapters on all 7 projections at lr 1e-3 (10x,
the usual LoRA scaling, chosen before any run and not tuned). Each step's rollouts are 4 groups of 8
attempts of the current policy on the pool (more when zero-variance groups are replaced), so the mean
reward of the step's attempts is the pool's on-policy pass rate;
both curves go on one plot. Then both final exports (LoRA: its merged export) are evaluated on the pool
x 32 with attempt seeds the probe and training never used.

    python bench/lora_curve.py [--out runs/lora-curve] [--steps 15] [--seeds 0 1]

Writes OUT/curves.png and prints the table; each stage resumes (a finished one is not run again).
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import yaml
from rich.console import Console

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
RUNS = {"full": {"lr": 1e-4}, "lora": {"lr": 1e-3, "lora_rank": 8, "lora_alpha": 16, "lora_targets": TARGETS,
                                       "export_merged": True}}


def main() -> int:
    from grpo_fits_pool import GEN, campaign, counts, pick
    from tbhpc.campaign.runner import run_campaign
    from tbhpc.demo.pipeline import eval_ids_file, evenly_spaced
    from tbhpc.metrics.stats import jeffreys_interval
    from tbhpc.tasks.select import select_tasks

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/lora-curve"))
    ap.add_argument("--model", default="models/demo-warm-long")
    ap.add_argument("--steps", type=int, default=15)
    ap.add_argument("--repeats", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0, help="the probe's (and the pool's)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0], help="training seeds, each run for both modes")
    args = ap.parse_args()
    console, out = Console(), args.out
    out.mkdir(parents=True, exist_ok=True)
    sample, pool = out / "sample.txt", out / "pool.txt"
    if not sample.exists():
        ids = [t.id for t in select_tasks(split="train")]
        sample.write_text("".join(i + "\n" for i in evenly_spaced(ids, 64)))
    console.rule(f"1. probe 64 train tasks x 8 with {args.model} (grpo_fits_pool's)")
    run_campaign(campaign("probe", "probe", sample, 8, args.model, args.seed), out / "probe", console=console)
    if not pool.exists():
        pool.write_text("".join(t + "\n" for t in pick(counts(out / "probe"), 4)))
    console.print("pool: " + ", ".join(pool.read_text().split()))

    curves, finals = {}, {}
    for seed in args.seeds:
        for name, fields in RUNS.items():
            tag = name if seed == 0 else f"{name}-s{seed}"
            console.rule(f"2. {name}, seed {seed}: {args.steps} steps x 4 groups of 8 on the pool, lr {fields['lr']}")
            run = out / f"train-{tag}"
            export = run / "exports" / (f"step-{args.steps:06d}" + ("-merged" if "lora_rank" in fields else ""))
            if not (export / "config.json").exists():
                cfg = {"name": f"lora-curve-{name}", "model": args.model, "pool": str(pool), "seed": seed,
                       "exclude": eval_ids_file(None), "steps": args.steps, "group_size": 8, "groups_per_step": 4,
                       "max_draws": 8, "generator": "batched", "episodes_in_flight": 32, "max_tokens": GEN["max_tokens"],
                       "response_budget": GEN["response_budget"], "zero_stage": 3, "microbatch_tokens": 8192,
                       "torch_threads": 2, "checkpoint_every": 5, "keep_checkpoints": 1, "keep_published": 1,
                       "export_every": args.steps, "nodes": 1, "gpus_per_node": 0, **fields}
                (out / f"train-{tag}.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
                subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", str(run), "--config",
                                str(out / f"train-{tag}.yaml")], check=True)
            curves[(name, seed)] = step_pass_rates(run)
            console.rule(f"3. {name}, seed {seed}: the export on the pool x {args.repeats} (fresh attempt seeds)")
            run_campaign(campaign(f"eval-{tag}", "eval", pool, args.repeats, str(export), args.seed + 1),
                         out / f"eval-{tag}", console=console)
            finals[f"{name}, seed {seed}"] = counts(out / f"eval-{tag}")
    run_campaign(campaign("eval-warm", "eval", pool, args.repeats, args.model, args.seed + 1), out / "eval-warm",
                 console=console)
    finals = {"warm start": counts(out / "eval-warm"), **finals}

    console.print(f"pass rate on the pool x {args.repeats} (attempt seed {args.seed + 1}):")
    for name, c in finals.items():
        n, k = (sum(v) for v in zip(*c.values()))
        lo, hi = jeffreys_interval(k, n)
        console.print(f"  {name:<15} {k}/{n} = {k / n:.1%} [{lo:.1%}, {hi:.1%}]")
    for (name, seed), rows in curves.items():
        console.print(f"  {name}, seed {seed}, training reward by step: " + " ".join(f"{r:.2f}" for _, r in rows))
    plot(out / "curves.png", curves, args)
    console.print(f"plot: {out / 'curves.png'}")
    return 0


def step_pass_rates(run: Path) -> list[tuple[int, float]]:
    """(step, mean reward of every attempt the step sampled: the groups kept and the zero-variance ones
    replaced) from the run's DuckDB rows: the current policy's pass rate on the pool."""
    import duckdb
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    try:
        return con.execute("SELECT train_step, avg(reward) FROM attempts WHERE status = 'ok' GROUP BY 1 ORDER BY 1"
                           ).fetchall()
    finally:
        con.close()


def plot(path: Path, curves: dict, args) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    colours = {"full": "tab:blue", "lora": "tab:orange"}
    for (name, seed), rows in curves.items():
        label = {"full": "every parameter, lr 1e-4", "lora": "LoRA r=8, lr 1e-3"}[name] + f", seed {seed}"
        ax.plot([s for s, _ in rows], [r for _, r in rows], marker="o", ms=3, color=colours[name],
                linestyle="-" if seed == args.seeds[0] else "--", label=label)
    ax.set_xlabel("step")
    ax.set_ylabel("pool pass rate (the step's attempts)")
    ax.set_ylim(0, 1)
    ax.set_title(f"GRPO on a 4-task pool, {args.model.rsplit('/', 1)[-1]}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    sys.exit(main())
