"""`tbhpc probe|eval --out RUN`: run (or resume) a campaign into a run directory, here or on Slurm."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import add_overrides, int_in
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    for kind in ("probe", "eval"):
        p = sub.add_parser(kind, help=f"run (or resume) {'a probe' if kind == 'probe' else 'an eval'} campaign into a run directory")
        p.set_defaults(func=run)
        p.add_argument("--out", type=out_arg, required=True, help="run directory (created, or resumed if it exists)")
        p.add_argument("--config", type=Path, help=f"YAML campaign config (see jobs/{kind}.yaml)")
        p.add_argument("--executor", default="local")
        p.add_argument("--workers", type=int_in(1, 1024), help="local worker processes (overrides workers=)")
        add_overrides(p)


def run(args) -> int:
    from rich.console import Console

    from tbhpc.campaign.config import load_campaign
    from tbhpc.campaign.runner import run_campaign, system_error_causes
    from tbhpc.launch.executors import make_executor
    from tbhpc.store.run_dir import RunDir
    overrides = list(args.overrides) + ([f"workers={args.workers}"] if args.workers is not None else [])
    cfg = load_campaign(args.config, args.cmd, overrides)
    res = run_campaign(cfg, args.out, make_executor(args.executor, cfg.workers, cfg.slurm), Console(stderr=True))
    print(f"{args.out}: {res.planned} planned, {res.already_done} already done, {res.executed} executed "
          f"({res.ok} ok, {res.system_errors} system errors), {res.missing} still to run")
    if res.missing or res.system_errors:   # why, even when every re-run has since succeeded
        for kind, message, n in system_error_causes(RunDir(args.out)):
            print(f"  system errors: {n} x {kind}: {message}")
    return 0 if res.missing == 0 else 1
