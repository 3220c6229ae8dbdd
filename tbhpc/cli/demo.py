"""`tbhpc demo [--config jobs/demo.yaml] [KEY=VALUE ...]`: the recipe on the bundled pack (tbhpc/demo)."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import add_overrides


def add_parser(sub) -> None:
    p = sub.add_parser("demo", help="the recipe on the bundled pack: the model pipeline, or quick=true for the "
                                    "noisy-oracle check")
    p.set_defaults(func=run)
    p.add_argument("--config", type=Path, default=None, help="YAML config (see jobs/demo.yaml)")
    add_overrides(p)


def run(args) -> int:
    from tbhpc import demo
    from tbhpc.demo.config import load_demo_config
    return demo.run(load_demo_config(args.config, args.overrides))
