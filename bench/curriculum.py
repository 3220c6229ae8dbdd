"""Does the curriculum keep a long run updating? The demo's GRPO run for N steps (no time budget)
from a demo config's start and pool, with the curriculum (refresh_below / refresh_window; candidates:
every candidate instance of the demo's probe, the pool's own skipped) and, with --without, the same
run without it (same seed, so the same draws until the first refresh). Exports every 50 steps are
evaluated on validation instances (demo pack seed 1001, never the eval split; x 8), the last one also
on the held-out split x 20 (pass@1, pass^20, pass@20). Reports, per run: steps with no informative
group (no update) in the first and last thirds, the mixed share of the first and last 25 steps,
the refreshes, and a plot of the mixed share and reward against the step.

    python bench/curriculum.py [--config jobs/demo-pack-plateau.yaml] [--steps 300] [--without]
                               [--out runs/curriculum] [--also NAME=RUN ...] [key=value ...]

key=value: TrainConfig fields for the run(s) (e.g. refresh_below=0.25 refresh_window=10).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from tbhpc.config import load_config
from tbhpc.demo.config import DemoConfig
from tbhpc.demo.pipeline import campaign, ensure_warm_start, eval_ids_file, run_training, train_config, write_candidates
from tbhpc.store.run_dir import RunDir
from tbhpc.train.record import read_steps


def prepare(cfg: DemoConfig, out: Path, con: Console) -> tuple[str, Path]:
    """The start, and the demo's probe -> pool in `out`; returns (start, candidate id list)."""
    from tbhpc.campaign.runner import run_campaign
    from tbhpc.selection.pool import SelectConfig, run_select
    from tbhpc.tasks.loader import load_pack
    warm = ensure_warm_start(cfg, con)
    pack = write_candidates(cfg)
    if not (out / "pool.yaml").exists():
        run_campaign(campaign(cfg, "probe", "probe", "train", cfg.probe_repeats, warm), out / "probe", console=con)
        run_select(out / "probe", out / "pool.yaml", SelectConfig(exclude=eval_ids_file(cfg.pack)))
    ids = out / "candidates.txt"
    ids.write_text("".join(t.id + "\n" for t in load_pack(pack) if t.split == "train"), encoding="utf-8")
    return warm, ids


def summary(steps: list[dict]) -> dict:
    n = len(steps)
    third = max(n // 3, 1)
    idle = [int(s["kept"] == 0) for s in steps]
    share = [s["mixed_share"] for s in steps]
    return {"steps": n, "idle_first_third": sum(idle[:third]), "idle_last_third": sum(idle[-third:]), "idle": sum(idle),
            "mixed_first25": round(sum(share[:25]) / max(len(share[:25]), 1), 3),
            "mixed_last25": round(sum(share[-25:]) / max(len(share[-25:]), 1), 3),
            "pool_versions": max((s.get("pool_version") or 0) for s in steps) if steps else 0}


def held_out(cfg: DemoConfig, model: str, out: Path, con: Console) -> dict:
    from tbhpc.campaign.runner import run_campaign
    from tbhpc.metrics.agg import load_counts, summarise
    run_campaign(campaign(cfg, out.name, "eval", "eval", cfg.eval_repeats, model), out, console=con)
    s = summarise(load_counts(RunDir(out)))
    k = cfg.eval_repeats
    return {"pass@1": s["pass@1"]["value"], f"pass^{k}": s["k/k"]["value"], f"pass@{k}": s["pass@k"][k]["value"]}


def plot(curves: dict[str, list[dict]], path: Path) -> Path:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for name, steps in curves.items():
        x = [s["step"] for s in steps]
        axes[0].plot(x, [s["mixed_share"] for s in steps], lw=1, label=name)
        axes[1].plot(x, [s["reward_mean"] for s in steps], lw=1, label=name)
    axes[0].set_title("mixed-group share")
    axes[1].set_title("reward of the drawn episodes")
    for ax in axes:
        ax.set_xlabel("step")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--config", type=Path, default=Path("jobs/demo-pack-plateau.yaml"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--without", action="store_true", help="also the same run without the curriculum")
    ap.add_argument("--out", type=Path, default=Path("runs/curriculum"))
    ap.add_argument("--also", nargs="+", default=[], metavar="NAME=RUN",
                    help="draw an earlier training run's curves beside these (e.g. plain=runs/curriculum/train-curriculum)")
    ap.add_argument("overrides", nargs="*")
    args = ap.parse_args()
    con, out = Console(), args.out
    cfg = load_config(DemoConfig, args.config, [f"out={out}"])
    out.mkdir(parents=True, exist_ok=True)
    warm, candidates = prepare(cfg, out, con)
    from tbhpc.train.warm_select import evaluate, validation_pack
    val = validation_pack(out / "validation-pack") if not (out / "validation-pack").exists() else str(out / "validation-pack")
    extra = {k: v for k, v in (o.split("=", 1) for o in args.overrides)}
    arms = {"curriculum": {"refresh_below": 0.25, "refresh_window": 10, "refresh_pool": str(candidates)}}
    if args.without:
        arms["without"] = {}
    results, curves = {}, {}
    for name, fields in arms.items():
        import yaml
        tcfg = {**train_config(cfg, out, warm), "steps": args.steps, "max_seconds": 0, "export_every": 50,
                "name": f"curriculum-{name}", **fields, **{k: yaml.safe_load(v) for k, v in extra.items()}}
        run = out / f"train-{name}"
        con.rule(f"{name}: {args.steps} steps -> {run}")
        final = run_training(tcfg, run, con)
        steps = read_steps(RunDir(run))
        curves[name] = steps
        val_curve = {}
        for export in sorted((run / "exports").glob("step-*")):
            val_curve[export.name] = round(evaluate(str(export), val, out / f"val-{name}-{export.name}", 8, cfg.workers)
                                           ["pass_at_1"], 4)
        results[name] = {**summary(steps), "validation_pass@1": val_curve,
                         "held_out": held_out(cfg, final, out / f"eval-{name}", con)}
    results["start_validation_pass@1"] = round(evaluate(warm, val, out / "val-start", 8, cfg.workers)["pass_at_1"], 4)
    for item in args.also:
        name, run = item.split("=", 1)
        curves[name] = read_steps(RunDir(Path(run)))
    results["plot"] = str(plot(curves, out / "curriculum.png"))
    (out / "curriculum.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    con.print_json(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
