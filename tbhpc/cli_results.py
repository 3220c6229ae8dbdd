"""`tbhpc agg|select|report|import-tb`: read campaigns back as numbers, pools and reports."""
from __future__ import annotations

from pathlib import Path

from rich.console import Console

from tbhpc.campaign.validate import validate
from tbhpc.errors import UserError
from tbhpc.metrics import render
from tbhpc.metrics.agg import compare, load_counts, load_prices, summarise
from tbhpc.selection.bands import DEFAULT_KEEP
from tbhpc.selection.pool import SelectConfig, run_select
from tbhpc.store.run_dir import RunDir


def add_parsers(sub) -> None:
    a = sub.add_parser("agg", help="pass@1, pass@k, pass^k, k/k, per domain, cost")
    a.add_argument("run", type=Path)
    a.add_argument("--by", choices=("domain",), help="(per-domain tables are always included)")
    a.add_argument("--format", choices=("table", "json", "csv", "md"), default="table")
    a.add_argument("--vs", type=Path, help="second run: paired comparison on shared tasks (other - base)")
    a.add_argument("--prices", type=Path, help="YAML price table per role (USD per 1M tokens)")
    a.add_argument("--bootstrap", type=int, default=1000, help="bootstrap replicates over tasks (0 = off)")
    a.add_argument("--allow-incomplete", action="store_true")

    i = sub.add_parser("import-tb", help="import ThinkingBox `tb infer` JSONL results into a run directory")
    i.add_argument("files", type=Path, nargs="+")
    i.add_argument("--out", type=Path, required=True)
    i.add_argument("--campaign", help="campaign name (default: the first file's stem)")
    i.add_argument("--policy-id", default="thinkingbox")

    r = sub.add_parser("report", help="Markdown + HTML report with plots")
    r.add_argument("run", type=Path)
    r.add_argument("--vs", type=Path)
    r.add_argument("--out", type=Path, help="output folder (default: RUN/report)")
    r.add_argument("--prices", type=Path)
    r.add_argument("--bootstrap", type=int, default=1000)
    r.add_argument("--allow-incomplete", action="store_true")

    s = sub.add_parser("select", help="Jeffreys difficulty bands -> training pool (YAML) + manifest + DuckDB table")
    s.add_argument("run", type=Path, help="probe run directory")
    s.add_argument("--out", type=Path, required=True, help="pool file to write (YAML)")
    s.add_argument("--keep", default=",".join(DEFAULT_KEEP), help="bands to keep (comma-separated)")
    s.add_argument("--min-clean-runs", type=int, default=3)
    s.add_argument("--exclude", type=Path, action="append", default=[],
                   help="exclusion list (ids one per line); default: the probed pack's eval_ids.txt")
    s.add_argument("--reference", type=Path, help="reference-policy probe run for the solvability gate")
    s.add_argument("--reference-min-successes", type=int, default=1)
    s.add_argument("--reference-min-clean-runs", type=int, default=4)


def checked_counts(path: Path, allow_incomplete: bool):
    run = RunDir(path).require()
    val = validate(run)
    if not val.ok and not allow_incomplete:
        raise UserError(f"{path}: campaign is incomplete ({val.reason()}); re-run the campaign to finish it, "
                        "or pass --allow-incomplete")
    return load_counts(run)


def run(args) -> int:
    if args.cmd == "agg":
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
        return 0
    if args.cmd == "select":
        return _select(args)
    if args.cmd == "report":
        from tbhpc.report.build import build_report
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
    if args.cmd == "import-tb":
        from tbhpc.campaign.validate import validate as check
        from tbhpc.store.import_tb import import_files
        run, rep = import_files(args.files, args.out, args.campaign, args.policy_id)
        val = check(run)
        print(f"{args.out}: imported {rep.rows} attempt rows for {len(run.plan())} tasks ({rep.reader} read); "
              f"{len(val.system_errors)} system error(s)")
        return 0
    raise UserError(f"unknown command {args.cmd}")


def _select(args) -> int:
    from tbhpc.campaign.config import CampaignConfig, pack_path
    from tbhpc.config import from_dict
    run = RunDir(args.run).require()
    excludes = [str(p) for p in args.exclude]
    camp = run.campaign()
    pack = pack_path(from_dict(CampaignConfig, camp["config"])) if camp.get("source") == "tbhpc" else None
    if not excludes and isinstance(pack, Path):  # default: the probed pack's held-out ids (a tb: source has none)
        default = pack / "eval_ids.txt"
        if default.exists():
            excludes = [str(default)]
    cfg = SelectConfig(keep=[b.strip() for b in args.keep.split(",") if b.strip()], min_clean_runs=args.min_clean_runs,
                       exclude=excludes, reference=str(args.reference) if args.reference else None,
                       reference_min_successes=args.reference_min_successes,
                       reference_min_clean_runs=args.reference_min_clean_runs)
    sel = run_select(args.run, args.out, cfg)
    print("bands: " + ", ".join(f"{b} {n}" for b, n in sel.band_counts.items()))
    print(f"excluded by id before selection: {sel.excluded} (lists: {', '.join(excludes) or 'none'})")
    print(f"pool: {len(sel.pool)} tasks -> {args.out} (manifest {args.out.with_suffix('.manifest.json')})")
    return 0
