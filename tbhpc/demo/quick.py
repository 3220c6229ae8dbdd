"""`tbhpc demo quick=true`: the pipeline check without a model (probe -> select -> evaluate ->
aggregate -> report in ~90 s), kept for tests and for checking an installation.

The "base policy" here is a noisy oracle (each golden step kept with probability `skill`), so the
probe has a real spread of difficulty without a model; the oracle is evaluated as the upper bound.
Every step resumes: running the demo again reuses finished attempts.
"""
from __future__ import annotations

import time
from pathlib import Path

from rich.console import Console

from tbhpc.campaign.runner import run_campaign
from tbhpc.campaign.config import CampaignConfig
from tbhpc.config import config_hash
from tbhpc.demo.config import DemoConfig
from tbhpc.metrics import render
from tbhpc.metrics.agg import compare, load_counts, summarise
from tbhpc.report.build import build_report
from tbhpc.selection.pool import SelectConfig, run_select
from tbhpc.store.run_dir import RunDir
from tbhpc.tasks.loader import resolve_pack


def run_quick(cfg: DemoConfig, console: Console) -> int:
    out = Path(cfg.out)
    start = time.perf_counter()
    console.rule(f"tbhpc demo quick (config {config_hash(cfg)}) -> {out}")
    common = dict(pack=cfg.pack, workers=cfg.workers, chunk_size=32, limit=cfg.limit)
    base = {"skill": cfg.skill}

    console.print("[bold]1. probe[/] the base policy on the train split")
    run_campaign(CampaignConfig(name="probe", kind="probe", split="train", repeats=cfg.probe_repeats, policy_opts=base,
                                tasks=_sample(cfg, "train"), **common), out / "probe", console=console)

    console.print("[bold]2. select[/] the policy-relative pool (Jeffreys bands, eval ids excluded)")
    pack = resolve_pack(cfg.pack)
    excl = [str(pack / "eval_ids.txt")] if (pack / "eval_ids.txt").exists() else []
    sel = run_select(out / "probe", out / "pool.yaml", SelectConfig(exclude=excl))
    console.print("   bands: " + ", ".join(f"{b} {n}" for b, n in sel.band_counts.items()) + f"; pool {len(sel.pool)} tasks")

    console.print("[bold]3. evaluate[/] base and oracle (upper bound) on the held-out eval split")
    for name, opts in (("eval-base", base), ("eval-oracle", {})):
        run_campaign(CampaignConfig(name=name, split="eval", repeats=cfg.eval_repeats, policy_opts=opts,
                                    tasks=_sample(cfg, "eval"), **common), out / name, console=console)

    console.print("[bold]4. aggregate[/]")
    base_counts, oracle_counts = load_counts(RunDir(out / "eval-base")), load_counts(RunDir(out / "eval-oracle"))
    for table in render.to_tables(summarise(base_counts)):
        console.print(table)
    console.print(render.comparison_markdown(compare(base_counts, oracle_counts)))
    md, page = build_report(base_counts, out / "report", "eval", oracle_counts)
    probe_md, _ = build_report(load_counts(RunDir(out / "probe")), out / "probe-report", "probe")
    console.print(f"reports: {md}, {page}, {probe_md}")
    console.print(f"demo finished in {time.perf_counter() - start:.1f} s; next: tbhpc agg {out / 'eval-base'} "
                  f"--vs {out / 'eval-oracle'} --format md")
    return 0


def _sample(cfg: DemoConfig, split: str) -> str | None:
    """The config's evenly spaced sample of `split` as an id file (None: the whole split)."""
    from tbhpc.demo.pipeline import sample_file
    return str(sample_file(cfg, split)) if cfg.sample else None
