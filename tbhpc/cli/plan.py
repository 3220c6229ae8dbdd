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
    pl.add_argument("--rates", type=Path, default=None,
                    help="scaling-model rates for the step time by max_staleness (default: jobs/plan/h100-27b.yaml when "
                         "present; a GPU config)")


def run(args) -> int:
    import json

    from tbhpc.config import load_config
    from tbhpc.errors import UserError
    from tbhpc.plan.memory import plan
    from tbhpc.plan.render import render
    from tbhpc.train.config import TrainConfig
    if args.rates is not None and not args.rates.is_file():
        raise UserError(f"--rates: {args.rates} is not a file (a scaling-model rates file, e.g. jobs/plan/h100-27b.yaml)")
    cfg = load_config(TrainConfig, args.config, args.overrides)
    p = plan(cfg)
    ahead = _staleness(cfg, args.rates or DEFAULT_RATES)
    if args.json:
        print(json.dumps({**p.as_dict(), **({"staleness": vars(ahead)} if ahead else {})}, indent=1, default=str), flush=True)
    else:
        from tbhpc.plan.staleness import render as render_staleness
        print(render(p) + ("\n" + "\n".join(render_staleness(ahead)) if ahead else ""), flush=True)
    if not p.fits:
        raise UserError(f"{args.config}: {p.problem}")
    return 0


DEFAULT_RATES = Path("jobs/plan/h100-27b.yaml")


def _staleness(cfg, rates: Path):
    """The step time by max_staleness on a GPU config whose server generates (None otherwise, or
    without the rates file)."""
    if not (cfg.gpus_per_node and cfg.generator == "server" and rates.exists()):
        return None
    from tbhpc.errors import UserError
    from tbhpc.launch.train import serve_config_for
    from tbhpc.plan.staleness import staleness_plan
    try:
        serve = serve_config_for(cfg)
    except UserError:           # its serve_config is elsewhere: one replica assumed (the plan says how many)
        serve = None
    return staleness_plan(cfg, rates, serve)
