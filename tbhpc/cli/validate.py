"""`tbhpc validate RUN`: does the run hold exactly tasks x repeats keys, none a system error?"""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import int_in


def add_parser(sub) -> None:
    p = sub.add_parser("validate", help="check a run holds exactly tasks x repeats keys and no system errors")
    p.set_defaults(func=run)
    p.add_argument("run", type=Path)
    p.add_argument("--tasks", type=Path, help="expected task ids (YAML list, pool file, or one per line)")
    p.add_argument("--repeats", type=int_in(1))


def run(args) -> int:
    from tbhpc.campaign.validate import validate
    from tbhpc.store.run_dir import RunDir
    from tbhpc.tasks.loader import read_id_list
    run_dir = RunDir(args.run).require()
    ids = read_id_list(args.tasks) if args.tasks else None
    val = validate(run_dir, ids, args.repeats)
    print(val.summary())
    return 0 if val.ok else 1
