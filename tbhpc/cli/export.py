"""`tbhpc export RUN --parquet DIR`: a run's tables as Parquet files (pandas, polars, Spark)."""
from __future__ import annotations

from pathlib import Path

from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    x = sub.add_parser("export", help="a run's tables as Parquet files (pandas, polars, Spark)")
    x.set_defaults(func=run)
    x.add_argument("run", type=Path)
    x.add_argument("--parquet", type=out_arg, required=True, metavar="DIR")
    x.add_argument("--force", action="store_true", help="write into a non-empty folder that is not a previous export")


def run(args) -> int:
    from tbhpc.errors import UserError
    from tbhpc.outpaths import check_output_folder
    from tbhpc.store.catalogue import export_parquet
    from tbhpc.store.run_dir import RunDir
    run = RunDir(args.run).require()
    if not run.db.exists():
        raise UserError(f"{args.run}: no results.duckdb yet (run `tbhpc merge {args.run}`)")
    check_output_folder(args.parquet, "parquet", "--parquet", force=args.force)
    files = export_parquet(run.db, args.parquet)
    print(f"wrote {len(files)} Parquet files to {args.parquet}: {', '.join(p.stem for p in files)}")
    return 0
