"""On- vs one-step-off-policy GRPO on the demo pack, paired seeds: the demo model (the committed
warm start), the demo's probe -> Jeffreys pool, then the demo's training config twice per seed,
max_staleness 0 and 1, everything else equal (same draws: they are a function of seed and step).
Reports the reward of the training rollouts per sample (does off-policy learn worse per sample?)
and per second, as a table and OUT/offpolicy.png.

    python bench/offpolicy_demo.py [--steps 30] [--seeds 0] [--out runs/offpolicy-demo] [key=value ...]

key=value: more TrainConfig fields for both arms (e.g. tis_cap=2).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from tbhpc.config import load_config
from tbhpc.demo.config import DemoConfig
from tbhpc.demo.pipeline import campaign, ensure_warm_start, eval_ids_file, run_training, train_config
from tbhpc.store.run_dir import RunDir
from tbhpc.train.record import read_steps


def prepare_pool(cfg: DemoConfig, out: Path, console: Console) -> str:
    from tbhpc.campaign.runner import run_campaign
    from tbhpc.selection.pool import SelectConfig, run_select
    warm = ensure_warm_start(cfg, console)
    if not (out / "pool.yaml").exists():
        run_campaign(campaign(cfg, "probe", "probe", "train", cfg.probe_repeats, warm), out / "probe", console=console)
        run_select(out / "probe", out / "pool.yaml", SelectConfig(exclude=eval_ids_file(cfg.pack)))
    return warm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0])
    ap.add_argument("--out", default="runs/offpolicy-demo")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    con, out = Console(), Path(args.out)
    cfg = load_config(DemoConfig, Path("jobs/demo-pack.yaml"), [f"out={out}"])
    out.mkdir(parents=True, exist_ok=True)
    warm = prepare_pool(cfg, out, con)
    extra = dict(o.split("=", 1) for o in args.overrides)
    curves = {}
    for seed in args.seeds:
        for k in (0, 1):
            tcfg = {**train_config(cfg, out, warm), "steps": args.steps, "seed": seed, "max_staleness": k,
                    "keep_published": 2, "name": f"demo-s{seed}-k{k}", **extra}
            tcfg["export_every"] = args.steps
            run = out / f"train-s{seed}-k{k}"
            con.print(f"[bold]seed {seed}, max_staleness {k}[/] -> {run}")
            run_training(tcfg, run, con)
            curves[(seed, k)] = read_steps(RunDir(run))
    rows = []
    for (seed, k), steps in sorted(curves.items()):
        half = steps[len(steps) // 2:]
        eps = sum(s["episodes"] for s in steps)
        rows.append({"seed": seed, "max_staleness": k, "steps": len(steps), "episodes": eps,
                     "reward_first_half": _mean([s["reward_mean"] for s in steps[:len(steps) // 2]]),
                     "reward_second_half": _mean([s["reward_mean"] for s in half]),
                     "reward_per_sample": sum(s["reward_mean"] * s["episodes"] for s in steps) / max(1, eps),
                     "wall_s": sum(s["step_s"] for s in steps), "s_per_step": _mean([s["step_s"] for s in steps[1:]])})
    t = Table(title="training rollouts' reward, on vs one step off-policy (paired seeds)")
    for c in rows[0]:
        t.add_column(c)
    for r in rows:
        t.add_row(*[f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()])
    con.print(t)
    (out / "offpolicy.json").write_text(json.dumps(rows, indent=1) + "\n")
    _plot(curves, out / "offpolicy.png")
    con.print(f"wrote {out}/offpolicy.json and offpolicy.png")
    return 0


def _mean(xs) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def _plot(curves, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for (seed, k), steps in sorted(curves.items()):
        eps = np.cumsum([s["episodes"] for s in steps])
        wall = np.cumsum([s["step_s"] for s in steps])
        r = np.array([s["reward_mean"] for s in steps])
        smooth = np.convolve(r, np.ones(5) / 5, mode="valid") if len(r) >= 5 else r
        style = dict(color=f"C{k}", ls="-" if seed == min(s for s, _ in curves) else "--",
                     label=f"seed {seed}, {'off' if k else 'on'}-policy")
        a.plot(eps[len(eps) - len(smooth):], smooth, **style)
        b.plot(wall[len(wall) - len(smooth):], smooth, **style)
    a.set(xlabel="training episodes (samples)", ylabel="rollout reward (5-step mean)", title="per sample")
    b.set(xlabel="wall seconds", title="per second")
    a.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
