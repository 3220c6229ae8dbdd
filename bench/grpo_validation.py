"""GRPO settings from the SFT plateau, compared on *validation* instances, never the eval split.

Why: the demo's settings (lr, clip-higher, ...) must be chosen before the held-out and fresh
evaluations run, or the comparison with continued SFT would be tuned to the split that judges it.
This bench runs `make demo`'s probe and select once (seed 0), then each variant's GRPO run (the
demo's train section plus the variant's `train.*` overrides), and, for each distinct lr, continued
SFT at that lr for the GRPO run's wall time (the demo's baseline rule); every model, the plateau
included, is evaluated on the validation instances the plateau itself was chosen on (demo pack
seed 1001, eval split, x 16: warm_select.evaluate).

    python bench/grpo_validation.py [--config C] [--out runs/grpo-validation] [--set key=value ...] [--no-sft]
                                    [--variant NAME key=value ...]

--config: the demo config (default jobs/demo-pack-plateau.yaml, where these settings were chosen; jobs/demo-pack.yaml
from the base). --set: its overrides, e.g. candidates_seed=null (probe the bundled train split). An RFT variant:
--variant rft algorithm=rft.

Default variants: the demo's config and lr 3e-5. (Not clip-higher: on-policy with one update per step
the ratio is 1 to within 1e-8, so no token is ever clipped and clip_high changes nothing.)
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from tbhpc.campaign.runner import run_campaign
from tbhpc.config import load_config
from tbhpc.demo.baseline import grpo_seconds, sft_baseline
from tbhpc.demo.config import DemoConfig
from tbhpc.demo.pipeline import _stream, campaign, eval_ids_file, run_training, train_config, write_candidates
from tbhpc.selection.pool import SelectConfig, run_select
from tbhpc.store.run_dir import RunDir
from tbhpc.train.record import read_steps
from tbhpc.train.warm_select import evaluate, validation_pack

DEFAULT_VARIANTS = {"demo": [], "lr3e-5": ["lr=3.0e-5"]}


def parse_variants(items: list[list[str]] | None) -> dict[str, list[str]]:
    if not items:
        return DEFAULT_VARIANTS
    return {v[0]: v[1:] for v in items}


def overrides(pairs: list[str]) -> dict:
    import yaml
    return {k: yaml.safe_load(v) for k, v in (p.split("=", 1) for p in pairs)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("runs/grpo-validation"))
    ap.add_argument("--variant", nargs="+", action="append", metavar="NAME [key=value]",
                    help="a variant: its name, then train.* overrides (repeatable)")
    ap.add_argument("--repeats", type=int, default=16)
    ap.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", help="demo config overrides")
    ap.add_argument("--config", type=Path, default=Path("jobs/demo-pack-plateau.yaml"),
                    help="the demo config (jobs/demo-pack.yaml: from the base; RFT: --variant rft algorithm=rft)")
    ap.add_argument("--no-sft", action="store_true", help="no continued-SFT run per lr")
    args = ap.parse_args()
    con, out = Console(), args.out
    cfg = load_config(DemoConfig, args.config, [f"out={out}", *args.set])
    warm = cfg.warm_path
    if cfg.candidates_seed is not None:
        write_candidates(cfg)
    run_campaign(campaign(cfg, "probe", "probe", "train", cfg.probe_repeats, warm), out / "probe", console=con)
    sel = run_select(out / "probe", out / "pool.yaml", SelectConfig(exclude=eval_ids_file(cfg.pack)))
    con.print(f"pool: {len(sel.pool)} tasks")
    val = validation_pack(out / "validation-pack") if not (out / "validation-pack").exists() else str(out / "validation-pack")

    def validate(name: str, model: str) -> dict:
        f = out / name / "validation.json"
        if not f.exists():
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(json.dumps(evaluate(model, val, out / name / "validation", args.repeats, cfg.workers)))
        return json.loads(f.read_text())

    rows = {"start": validate("plateau" if cfg.start == "plateau" else "start", warm)}
    sft_done: dict[float, str] = {}
    for name, pairs in parse_variants(args.variant).items():
        tcfg = train_config(cfg, out, warm)
        tcfg.update(overrides(pairs))
        run = out / name / "train"
        label = f"{tcfg.get('algorithm', 'grpo')} {name}"
        rows[label] = validate(name, run_training(tcfg, run, con))
        rows[label]["train_s"] = grpo_seconds(run)
        rows[label]["steps"] = len(read_steps(RunDir(run)))
        lr = float(tcfg["lr"])
        if lr not in sft_done and not args.no_sft:
            sft_done[lr] = name
            model = sft_baseline(out / f"sft-lr{lr:g}", warm, out / "pool.yaml", lr, grpo_seconds(run),
                                 int(tcfg["seed"]), con, _stream, tcfg["pack"], demo_pack=True)
            rows[f"sft lr {lr:g}"] = validate(f"sft-lr{lr:g}", model)
    types = sorted(rows["start"]["per_type"])
    lines = ["| model | steps | validation pass@1 | " + " | ".join(t.replace("demo_", "") for t in types) + " |",
             "|---|---|---|" + "---|" * len(types)]
    for name, r in rows.items():
        lines.append(f"| {name} | {r.get('steps', '')} | {r['pass_at_1']:.3f} | "
                     + " | ".join(f"{r['per_type'].get(t, 0):.2f}" for t in types) + " |")
    md = "\n".join(lines) + "\n"
    (out / "grpo_validation.md").write_text(md, encoding="utf-8")
    con.print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
