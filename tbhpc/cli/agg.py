"""`tbhpc agg RUN [--vs OTHER]`: pass@1, pass@k, pass^k, k/k, per domain, cost, intervals."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.cli.options import int_in


def add_parser(sub) -> None:
    a = sub.add_parser("agg", help="pass@1, pass@k, pass^k, k/k, per domain, cost")
    a.set_defaults(func=run)
    a.add_argument("run", type=Path)
    a.add_argument("--by", choices=("domain",), help="(per-domain tables are always included)")
    a.add_argument("--format", choices=("table", "json", "csv", "md"), default="table")
    a.add_argument("--vs", type=Path, help="second run: paired comparison on shared tasks (other - base)")
    a.add_argument("--prices", type=Path, help="YAML price table per role (USD per 1M tokens)")
    a.add_argument("--bootstrap", type=int_in(0, 1_000_000), default=1000, help="bootstrap replicates over tasks (0 = off)")
    a.add_argument("--allow-incomplete", action="store_true")
    a.add_argument("--no-track", action="store_true",
                   help="an export's eval (TRAIN_RUN/evals/step-N): do not log it to the training run's trackers")


def run(args) -> int:
    from rich.console import Console

    from tbhpc.campaign.runner import grading_notes
    from tbhpc.metrics import render
    from tbhpc.campaign.validate import checked_counts
    from tbhpc.metrics.agg import compare, load_prices, summarise
    from tbhpc.store.run_dir import RunDir
    prices = load_prices(args.prices) if args.prices else None
    counts = checked_counts(args.run, args.allow_incomplete)
    summary = summarise(counts, prices, args.bootstrap)
    cmp = None
    if args.vs:
        cmp = compare(counts, checked_counts(args.vs, args.allow_incomplete), args.bootstrap)
    if args.format == "json":
        print(render.to_json({"summary": summary, **({"comparison": cmp} if cmp else {})}), end="")
    elif args.format == "csv":
        print(render.to_csv(summary), end="")
    elif args.format == "md":
        print(render.to_markdown(summary) + ("\n" + render.comparison_markdown(cmp) if cmp else ""), end="")
    else:
        console = Console()
        for t in render.to_tables(summary):
            console.print(t)
        if cmp:
            console.print(render.comparison_markdown(cmp))
    for line in grading_notes(RunDir(args.run)):
        print(f"note: {line}", file=sys.stderr)
    if not args.no_track:                 # an export's eval: beside the training curve, once (track/evals.py)
        from tbhpc.track.evals import log_eval
        log_eval(args.run, summary, lambda line: print(line, file=sys.stderr))
    return 0
