"""`tbhpc agg|select|report|import-tb`: read campaigns back as numbers, pools and reports."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.cli_types import float_in, int_in
from tbhpc.outpaths import check_output_folder, out_arg
from tbhpc.selection.bands import DEFAULT_KEEP
from tbhpc.store.run_dir import RunDir

# Building the parser imports nothing heavy (every `tbhpc` command builds all of them): each
# command imports what it runs (metrics and scipy, DuckDB, rich) when it runs.


def add_parsers(sub) -> None:
    a = sub.add_parser("agg", help="pass@1, pass@k, pass^k, k/k, per domain, cost")
    a.add_argument("run", type=Path)
    a.add_argument("--by", choices=("domain",), help="(per-domain tables are always included)")
    a.add_argument("--format", choices=("table", "json", "csv", "md"), default="table")
    a.add_argument("--vs", type=Path, help="second run: paired comparison on shared tasks (other - base)")
    a.add_argument("--prices", type=Path, help="YAML price table per role (USD per 1M tokens)")
    a.add_argument("--bootstrap", type=int_in(0, 1_000_000), default=1000, help="bootstrap replicates over tasks (0 = off)")
    a.add_argument("--allow-incomplete", action="store_true")

    w = sub.add_parser("show", help="one attempt of a run: its transcript, tool calls, outputs and grade")
    w.add_argument("run", type=Path)
    w.add_argument("task_id")
    w.add_argument("--attempt", type=int_in(0), help="attempt index (default: the task's first failed attempt, else its first)")
    w.add_argument("--policy", help="policy id, when the run holds several (training runs: one per weight version)")
    w.add_argument("--system", action="store_true", help="also print the system prompt")
    w.add_argument("--format", choices=("text", "json"), default="text")

    q = sub.add_parser("sql", help="SQL over every run under a folder (union views with a `run` column)")
    q.add_argument("args", nargs="+", metavar="[ROOT] QUERY", help="ROOT defaults to runs/ (or . if there is none)")
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    q.add_argument("--wait", type=float_in(0, 3600), default=10.0, help="seconds to wait for a run whose merge is writing")

    x = sub.add_parser("export", help="a run's tables as Parquet files (pandas, polars, Spark)")
    x.add_argument("run", type=Path)
    x.add_argument("--parquet", type=out_arg, required=True, metavar="DIR")
    x.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a previous export")

    i = sub.add_parser("import-tb", help="import ThinkingBox `tb infer` JSONL results into a run directory")
    i.add_argument("files", type=Path, nargs="+")
    i.add_argument("--out", type=out_arg, required=True)
    i.add_argument("--campaign", help="campaign name (default: the first file's stem)")
    i.add_argument("--policy-id", default="thinkingbox")
    i.add_argument("--lenient", action="store_true", help="convert values of the wrong type (e.g. \"yes\" for true, "
                   "a number as uid, negative tokens to 0) instead of stopping; the lines converted are counted")

    r = sub.add_parser("report", help="Markdown + HTML report with plots")
    r.add_argument("run", type=Path)
    r.add_argument("--vs", type=Path)
    r.add_argument("--out", type=out_arg, help="output folder (default: RUN/report)")
    r.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a previous report")
    r.add_argument("--prices", type=Path)
    r.add_argument("--bootstrap", type=int_in(0, 1_000_000), default=1000)
    r.add_argument("--allow-incomplete", action="store_true")

    s = sub.add_parser("select", help="Jeffreys difficulty bands -> training pool (YAML) + manifest + DuckDB table")
    s.add_argument("run", type=Path, help="probe run directory")
    s.add_argument("--out", type=out_arg, required=True, help="pool file to write (YAML)")
    s.add_argument("--force", action="store_true", help="replace a file that is not a pool written by select")
    s.add_argument("--keep", default=",".join(DEFAULT_KEEP), help="bands to keep (comma-separated)")
    s.add_argument("--min-clean-runs", type=int_in(0), default=3)
    s.add_argument("--exclude", type=Path, action="append", default=[],
                   help="exclusion list (ids one per line); default: the probed pack's eval_ids.txt")
    s.add_argument("--reference", type=Path, help="reference-policy probe run for the solvability gate")
    s.add_argument("--reference-min-successes", type=int_in(0), default=1)
    s.add_argument("--reference-min-clean-runs", type=int_in(0), default=4)


def run(args) -> int:
    if args.cmd == "agg":
        from rich.console import Console

        from tbhpc.metrics import render
        from tbhpc.metrics.agg import checked_counts, compare, load_prices, summarise
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
        from tbhpc.campaign.runner import grading_notes
        for line in grading_notes(RunDir(args.run)):
            print(f"note: {line}", file=sys.stderr)
        return 0
    if args.cmd == "select":
        return _select(args)
    if args.cmd == "report":
        from tbhpc.metrics.agg import checked_counts, load_prices
        from tbhpc.report.build import build_report
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
    if args.cmd == "show":
        return _show(args)
    if args.cmd == "sql":
        return _sql(args)
    if args.cmd == "export":
        from tbhpc.store.catalogue import export_parquet
        run = RunDir(args.run).require()
        if not run.db.exists():
            raise UserError(f"{args.run}: no results.duckdb yet (run `tbhpc merge {args.run}`)")
        check_output_folder(args.parquet, "parquet", "--parquet", force=args.force)
        files = export_parquet(run.db, args.parquet)
        print(f"wrote {len(files)} Parquet files to {args.parquet}: {', '.join(p.stem for p in files)}")
        return 0
    if args.cmd == "import-tb":
        from tbhpc.store.import_tb import import_files
        _, rep = import_files(args.files, args.out, args.campaign, args.policy_id, lenient=args.lenient)
        print(f"{args.out}: imported {rep.rows} attempt rows for {rep.tasks} tasks ({rep.reader} read); "
              f"{rep.system_errors} system error(s)" + (f"; {rep.coerced} line(s) with values converted (--lenient)"
                                                         if args.lenient else ""))
        return 0
    raise UserError(f"unknown command {args.cmd}")


def _show(args) -> int:
    import json
    from tbhpc.report.transcript import render_attempt
    from tbhpc.store.attempts import read_attempt
    run = RunDir(args.run).require()
    if not run.db.exists():
        raise UserError(f"{args.run}: no results.duckdb yet (run `tbhpc merge {args.run}`)")
    row = read_attempt(run.db, args.task_id, args.attempt, args.policy)
    if args.format == "json":
        print(json.dumps(row, indent=1, ensure_ascii=False, default=str))
        return 0
    print(render_attempt(str(args.run), row, args.system))
    return 0


def _sql(args) -> int:
    import csv
    import json
    import sys
    from tbhpc.store.catalogue import Catalogue
    if len(args.args) > 2:
        raise UserError("sql: expected [ROOT] QUERY (quote the query)")
    root = Path(args.args[0]) if len(args.args) == 2 else (Path("runs") if Path("runs").is_dir() else Path("."))
    cat = Catalogue(root, wait_s=args.wait)
    try:
        cur = cat.sql(args.args[-1])
        names = [d[0] for d in cur.description] if cur.description else []
        rows = cur.fetchall() if names else []
    finally:
        cat.close()
    for line in cat.skipped:
        print(f"tbhpc: left out: {line}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps([dict(zip(names, r)) for r in rows], indent=1, default=str, ensure_ascii=False))
    elif args.format == "csv":
        w = csv.writer(sys.stdout)
        w.writerow(names)
        w.writerows(rows)
    else:
        from rich.console import Console
        from rich.table import Table
        table = Table(*names)
        for r in rows:
            table.add_row(*["" if v is None else str(v) for v in r])
        Console().print(table)
        print(f"{len(rows)} row(s) from {len(cat.attached)} run(s) under {root}")
    return 0


def _select(args) -> int:
    from tbhpc.selection.pool import SelectConfig, default_exclusions, select_pool
    excludes = [str(p) for p in args.exclude] or default_exclusions(RunDir(args.run).require())
    cfg = SelectConfig(keep=[b.strip() for b in args.keep.split(",") if b.strip()], min_clean_runs=args.min_clean_runs,
                       exclude=excludes, reference=str(args.reference) if args.reference else None,
                       reference_min_successes=args.reference_min_successes,
                       reference_min_clean_runs=args.reference_min_clean_runs)
    sel = select_pool(args.run, args.out, cfg, args.force, default_exclude=False)
    print("bands: " + ", ".join(f"{b} {n}" for b, n in sel.band_counts.items()))
    print(f"excluded by id before selection: {sel.excluded} (lists: {', '.join(excludes) or 'none'})")
    print(f"pool: {len(sel.pool)} tasks -> {args.out} (manifest {args.out.with_suffix('.manifest.json')})")
    return 0
