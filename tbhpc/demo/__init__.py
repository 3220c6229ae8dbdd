"""`tbhpc demo` / `make demo`: the recipe on the embedded default. `pipeline.py` is the real demo
(a model the project builds learns with GRPO); `quick.py` the model-free pipeline check."""
from __future__ import annotations

from rich.console import Console

from tbhpc.demo.config import DemoConfig


def run(cfg: DemoConfig) -> int:
    from pathlib import Path

    from tbhpc.outpaths import check_output_folder
    check_output_folder(Path(cfg.out), "demo", flag="demo config field 'out':")
    check_inputs(cfg)
    console = Console()
    if cfg.quick:
        from tbhpc.demo.quick import run_quick
        return run_quick(cfg, console)
    from tbhpc.demo.pipeline import run_demo
    return run_demo(cfg, console)


def check_inputs(cfg: DemoConfig) -> None:
    """The pack, task list and price table the config names, read as the stages will read them,
    before any stage writes (a typo found by the report stage would cost the whole run). The
    default price table is optional (costs are left out without it); one the config names is not."""
    from pathlib import Path

    from tbhpc.metrics.agg import load_prices
    from tbhpc.tasks.select import select_tasks
    for split in ("train", "eval"):
        select_tasks(cfg.pack, cfg.tasks if split == "train" else None, split, limit=cfg.limit)
    if cfg.prices and (Path(cfg.prices).exists() or cfg.prices != DemoConfig.prices):
        load_prices(cfg.prices)
