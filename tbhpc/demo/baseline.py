"""The demo's baseline beside GRPO: continued supervised fine-tuning of the warm start, for the
same wall time as the GRPO run took, at the same learning rate, on oracle episodes of the same
pool tasks. Why: a GRPO gain means little unless it beats simply training the warm start longer
on the data it came from, so it is reported whichever wins.

Run in a child process (`tbhpc warmstart --base WARM --tasks POOL --max-seconds S`), like the
trainer, so the demo's own process keeps no torch state; cached: a finished baseline is reused.
"""
from __future__ import annotations

import sys
from pathlib import Path

from rich.console import Console

from tbhpc.store.run_dir import RunDir


def grpo_seconds(train_run: Path) -> float:
    """The GRPO run's measured wall time: the sum of its steps' times (resumes included once)."""
    from tbhpc.train.record import read_steps
    return float(sum(row.get("step_s", 0.0) for row in read_steps(RunDir(train_run))))


def sft_baseline(out: Path, warm: str, pool: Path, lr: float, seconds: float, seed: int, console: Console, stream,
                 pack: str | None = None, demo_pack: bool | None = None) -> str:
    """Continued SFT of `warm` for `seconds` at `lr` on the pool's tasks (of `pack`) with the oracle
    episodes its warm start learnt from; returns its directory."""
    target = out / "sft-baseline"
    if (target / "config.json").exists():
        console.print(f"   continued-SFT baseline: {target} (done)")
        return str(target)
    console.print(f"   continued SFT of {warm} on the pool's oracle episodes: {seconds:.0f} s at lr {lr:g}")
    steps = 100_000                       # the time budget ends it
    # the demo pack's warm start learnt from episodes without questions (the query names every value)
    demo_pack = pack == "demo" if demo_pack is None else demo_pack
    stream([sys.executable, "-m", "tbhpc.cli", "warmstart", "--base", warm, "--tasks", str(pool),
            *(["--pack", str(pack)] if pack else []), *([] if demo_pack else ["--ask"]),
            "--out", str(target), "--steps", str(steps), "--lr", str(lr), "--warmup", "0", "--threads", "2",
            "--batch-tokens", "8000", "--size", "demo-pack" if demo_pack else "demo", "--seed", str(seed),
            "--max-seconds", f"{seconds:.0f}"], console)
    return str(target)
