"""`tbhpc demo` / `make demo`: the recipe on the embedded default. `pipeline.py` is the real demo
(a model the project builds learns with GRPO); `quick.py` the model-free pipeline check."""
from __future__ import annotations

from rich.console import Console

from tbhpc.config import load_config
from tbhpc.demo.config import DemoConfig


def run(args) -> int:
    cfg = load_config(DemoConfig, args.config, args.overrides)
    from pathlib import Path

    from tbhpc.outpaths import check_output_folder
    check_output_folder(Path(cfg.out), "demo", flag="demo config field 'out':")
    console = Console()
    if cfg.quick:
        from tbhpc.demo.quick import run_quick
        return run_quick(cfg, console)
    from tbhpc.demo.pipeline import run_demo
    return run_demo(cfg, console)
