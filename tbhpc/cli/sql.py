"""`tbhpc sql [ROOT] QUERY`: SQL over every run under a folder (union views with a `run` column)."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.cli.options import float_in


def add_parser(sub) -> None:
    q = sub.add_parser("sql", help="SQL over every run under a folder (union views with a `run` column)")
    q.set_defaults(func=run)
    q.add_argument("args", nargs="+", metavar="[ROOT] QUERY", help="ROOT defaults to runs/ (or . if there is none)")
    q.add_argument("--format", choices=("table", "csv", "json"), default="table")
    q.add_argument("--wait", type=float_in(0, 3600), default=10.0, help="seconds to wait for a run whose merge is writing")


def run(args) -> int:
    import csv
    import json

    from tbhpc.errors import UserError
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
