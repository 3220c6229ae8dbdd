"""`tbhpc report RUN [--vs OTHER]`: a Markdown + HTML report with plots (a training run's own kind)."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import int_in
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    r = sub.add_parser("report", help="Markdown + HTML report with plots")
    r.set_defaults(func=run)
    r.add_argument("run", type=Path)
    r.add_argument("--vs", type=Path)
    r.add_argument("--out", type=out_arg, help="output folder (default: RUN/report)")
    r.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a previous report")
    r.add_argument("--prices", type=Path)
    r.add_argument("--bootstrap", type=int_in(0, 1_000_000), default=1000)
    r.add_argument("--allow-incomplete", action="store_true")


def run(args) -> int:
    from tbhpc.campaign.validate import checked_counts
    from tbhpc.metrics.agg import load_prices
    from tbhpc.outpaths import check_output_folder
    from tbhpc.report.build import build_report
    from tbhpc.store.run_dir import RunDir
    check_output_folder(args.out or args.run / "report", "report", force=args.force)
    if RunDir(args.run).campaign().get("kind") == "train":
        from tbhpc.report.train import build_train_report
        md, page = build_train_report(args.run, args.out or args.run / "report")
        print(f"wrote {md} and {page}")
        return 0
    counts = checked_counts(args.run, args.allow_incomplete)
    other = checked_counts(args.vs, args.allow_incomplete) if args.vs else None
    kind = RunDir(args.run).campaign().get("kind", "eval")
    md, page = build_report(counts, args.out or args.run / "report", kind, other,
                            load_prices(args.prices) if args.prices else None, args.bootstrap)
    print(f"wrote {md} and {page}")
    return 0
