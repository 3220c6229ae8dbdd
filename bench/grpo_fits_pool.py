"""Does the trainer learn at all? GRPO on a pool of a few tasks must raise those tasks' pass rate.

The demo's GRPO runs give no held-out gain (README, "What GRPO did to the demo model"), which
leaves a question no unit test answers: is the update pointed the right way end to end (rollout
tokens, advantages, packing, the DeepSpeed step, publication, the next step's generator)? A
wrong sign or a stale policy would look exactly like "noise" on the full pool. On a pool of k
tasks drawn every step the gradient is the same few tasks' every step, so a correct trainer must
fit them within tens of steps; this measures that, warm start against the trained export on the
same tasks, with fresh attempt seeds.

Stages (each resumable: a finished stage is not run again): probe an evenly spaced sample of the
train split; pick the k tasks with the fewest successes among those passing 2..n/2 of n; train;
evaluate both checkpoints on the k tasks x R, and on the held-out (eval split) instances of the
same task templates x R; print per-task counts and the pooled differences. ~50 minutes here with
the defaults (2 cores).

Usage: python bench/grpo_fits_pool.py [--out runs/grpo-fit] [--model models/demo-warm-long]
       [--sample 64] [--tasks 4] [--steps 30] [--lr 1e-4] [--repeats 32]
"""
from __future__ import annotations

import argparse
import math
import subprocess
import sys
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from tbhpc.campaign.config import CampaignConfig
from tbhpc.tasks.select import select_tasks
from tbhpc.campaign.runner import run_campaign
from tbhpc.demo.pipeline import eval_ids_file, evenly_spaced
from tbhpc.metrics.agg import load_counts
from tbhpc.metrics.stats import jeffreys_interval
from tbhpc.store.run_dir import RunDir

GEN = {"generator": "batched", "max_tokens": 160, "response_budget": 640, "temperature": 1.0, "threads": 1}


def campaign(name: str, kind: str, tasks: Path, repeats: int, model: str, seed: int, split: str = "train") -> CampaignConfig:
    return CampaignConfig(name=name, kind=kind, split=split, repeats=repeats, tasks=str(tasks), seed=seed,
                          policy="tokens", policy_opts={"model_path": model, **GEN}, workers=2, concurrency=48,
                          chunk_size=96)


def counts(run: Path) -> dict[str, tuple[int, int]]:
    """task id -> (clean attempts, successes)."""
    c = load_counts(RunDir(run))
    return {t: (int(n), int(k)) for t, n, k in zip(c.task_ids.tolist(), c.n, c.c) if n}


def pick(probe: dict[str, tuple[int, int]], k: int) -> list[str]:
    """The k tasks with the fewest successes among those solved 2..n/2 times (room to improve,
    and enough successes for GRPO to have mixed groups); ties by id."""
    ok = [(c, t) for t, (n, c) in probe.items() if 2 <= c <= n // 2]
    return [t for _, t in sorted(ok)[:k]]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=Path("runs/grpo-fit"))
    ap.add_argument("--model", default="models/demo-warm-long")
    ap.add_argument("--sample", type=int, default=64)
    ap.add_argument("--tasks", type=int, default=4)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--repeats", type=int, default=32)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    console, out = Console(), args.out
    out.mkdir(parents=True, exist_ok=True)

    sample = out / "sample.txt"
    if not sample.exists():
        ids = [t.id for t in select_tasks(split="train")]
        sample.write_text("".join(i + "\n" for i in evenly_spaced(ids, args.sample)))
    console.rule(f"1. probe {args.sample} train tasks x 8 with {args.model}")
    run_campaign(campaign("probe", "probe", sample, 8, args.model, args.seed), out / "probe", console=console)

    pool = out / "pool.txt"
    if not pool.exists():
        chosen = pick(counts(out / "probe"), args.tasks)
        if len(chosen) < 2:
            raise SystemExit(f"{out}/probe: fewer than 2 tasks solved 2..4 of 8 times; probe a larger --sample")
        pool.write_text("".join(t + "\n" for t in chosen))
    console.print("pool: " + ", ".join(pool.read_text().split()))

    console.rule(f"2. GRPO: {args.steps} steps x {args.tasks} groups of 8 on the pool, lr {args.lr}")
    export = out / "train" / "exports" / f"step-{args.steps:06d}"
    if not (export / "config.json").exists():
        cfg = {"name": "grpo-fit", "model": args.model, "pool": str(pool), "seed": args.seed,
               "exclude": eval_ids_file(None), "steps": args.steps, "group_size": 8,
               "groups_per_step": args.tasks, "max_draws": 2 * args.tasks, "generator": "batched",
               "episodes_in_flight": 32, "max_tokens": GEN["max_tokens"], "response_budget": GEN["response_budget"],
               "lr": args.lr, "zero_stage": 3, "microbatch_tokens": 8192, "torch_threads": 2, "checkpoint_every": 5,
               "keep_checkpoints": 1, "keep_published": 1, "export_every": args.steps, "nodes": 1, "gpus_per_node": 0}
        (out / "train.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", str(out / "train"), "--config",
                        str(out / "train.yaml")], check=True)

    console.rule(f"3. evaluate both checkpoints on the pool x {args.repeats} (attempt seeds the probe never used)")
    seed = args.seed + 1
    for name, model in (("eval-warm", args.model), ("eval-trained", str(export))):
        run_campaign(campaign(name, "eval", pool, args.repeats, model, seed), out / name, console=console)
    report(console, "the pool GRPO trained on", counts(out / "eval-warm"), counts(out / "eval-trained"), counts(out / "probe"))

    held = out / "held-out.txt"
    if not held.exists():
        templates = {t.template for t in select_tasks(ids=pool)}
        held.write_text("".join(t.id + "\n" for t in select_tasks(split="eval") if t.template in templates))
    console.rule(f"4. held-out instances of the pool's templates (eval split) x {args.repeats}")
    for name, model in (("held-warm", args.model), ("held-trained", str(export))):
        run_campaign(campaign(name, "eval", held, args.repeats, model, seed, "eval"), out / name, console=console)
    report(console, "held-out tasks of the same templates", counts(out / "held-warm"), counts(out / "held-trained"))
    return 0


def report(console: Console, title: str, warm: dict, trained: dict, probe: dict | None = None) -> None:
    table = Table(title=f"pass rate on {title}")
    for col in ("task", "probe", "warm start", "trained"):
        table.add_column(col, justify="left" if col == "task" else "right")
    for t in sorted(warm):
        table.add_row(t, "{1}/{0}".format(*probe[t]) if probe else "-", "{1}/{0}".format(*warm[t]),
                      "{1}/{0}".format(*trained.get(t, (0, 0))))
    (nw, cw), (nt, ct) = (tuple(map(sum, zip(*d.values()))) for d in (warm, trained))
    pw, pt = cw / nw, ct / nt
    half = 1.96 * math.sqrt(pw * (1 - pw) / nw + pt * (1 - pt) / nt)
    iw, it = jeffreys_interval(cw, nw), jeffreys_interval(ct, nt)
    table.add_row("pooled", "", f"{pw:.1%} [{iw[0]:.1%}, {iw[1]:.1%}]", f"{pt:.1%} [{it[0]:.1%}, {it[1]:.1%}]")
    console.print(table)
    console.print(f"trained - warm: {100 * (pt - pw):+.1f} pts [{100 * (pt - pw - half):+.1f}, {100 * (pt - pw + half):+.1f}] "
                  "(normal interval over attempts: these tasks are the population here)")


if __name__ == "__main__":
    sys.exit(main())
