"""`tbhpc show RUN TASK_ID`: one attempt of a run, its transcript, tool calls, outputs and grade."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import int_in


def add_parser(sub) -> None:
    w = sub.add_parser("show", help="one attempt of a run: its transcript, tool calls, outputs and grade")
    w.set_defaults(func=run)
    w.add_argument("run", type=Path)
    w.add_argument("task_id")
    w.add_argument("--attempt", type=int_in(0), help="attempt index (default: the task's first failed attempt, else its first)")
    w.add_argument("--policy", help="policy id, when the run holds several (training runs: one per weight version)")
    w.add_argument("--system", action="store_true", help="also print the system prompt")
    w.add_argument("--format", choices=("text", "json"), default="text")


def run(args) -> int:
    import json

    from tbhpc.errors import UserError
    from tbhpc.report.transcript import render_attempt
    from tbhpc.store.attempts import read_attempt
    from tbhpc.store.run_dir import RunDir
    run = RunDir(args.run).require()
    if not run.db.exists():
        raise UserError(f"{args.run}: no results.duckdb yet (run `tbhpc merge {args.run}`)")
    row = read_attempt(run.db, args.task_id, args.attempt, args.policy)
    if args.format == "json":
        print(json.dumps(row, indent=1, ensure_ascii=False, default=str))
        return 0
    print(render_attempt(str(args.run), row, args.system))
    return 0
