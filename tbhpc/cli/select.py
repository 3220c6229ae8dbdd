"""`tbhpc select PROBE_RUN --out POOL`: Jeffreys difficulty bands -> the training pool."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import int_in, non_empty
from tbhpc.outpaths import out_arg
from tbhpc.selection.bands import DEFAULT_KEEP


def add_parser(sub) -> None:
    s = sub.add_parser("select", help="Jeffreys difficulty bands -> training pool (YAML) + manifest + DuckDB table")
    s.set_defaults(func=run)
    s.add_argument("run", type=Path, help="probe run directory")
    s.add_argument("--out", type=out_arg, required=True, help="pool file to write (YAML)")
    s.add_argument("--force", action="store_true", help="replace a file that is not a pool written by select")
    s.add_argument("--keep", type=non_empty("band names"), default=",".join(DEFAULT_KEEP), help="bands to keep (comma-separated)")
    s.add_argument("--min-clean-runs", type=int_in(0), default=3)
    s.add_argument("--exclude", type=Path, action="append", default=[],
                   help="exclusion list (ids one per line); default: the probed pack's eval_ids.txt")
    s.add_argument("--reference", type=Path, help="reference-policy probe run for the solvability gate")
    s.add_argument("--reference-min-successes", type=int_in(0), default=1)
    s.add_argument("--reference-min-clean-runs", type=int_in(0), default=4)


def run(args) -> int:
    from tbhpc.selection.pool import SelectConfig, default_exclusions, select_pool
    from tbhpc.store.run_dir import RunDir
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
