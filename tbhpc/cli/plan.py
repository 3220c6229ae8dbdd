"""`tbhpc plan CONFIG`: a training config's memory plan, per GPU, from the model's config.json alone."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import add_overrides


def add_parser(sub) -> None:
    pl = sub.add_parser("plan", help="a training config's memory plan: per-GPU bytes by term, the longest episode it "
                                     "can train, whether it fits (the model's config.json is enough)")
    pl.set_defaults(func=run)
    pl.add_argument("config", type=Path, help="YAML train config (see jobs/train-reference.yaml)")
    add_overrides(pl, help="e.g. model=DIR gpu_memory_gb=141 sp_size=8")
    pl.add_argument("--json", action="store_true", help="the plan as JSON")


def run(args) -> int:
    import json

    from tbhpc.config import load_config
    from tbhpc.errors import UserError
    from tbhpc.plan.memory import plan
    from tbhpc.plan.render import render
    from tbhpc.train.config import TrainConfig
    cfg = load_config(TrainConfig, args.config, args.overrides)
    p = plan(cfg)
    print(json.dumps(p.as_dict(), indent=1, default=str) if args.json else render(p), flush=True)
    if not p.fits:
        raise UserError(f"{args.config}: {p.problem}")
    return 0
