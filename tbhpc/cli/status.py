"""`tbhpc status RUN`: per-stage progress of a submitted campaign (launch/status.py)."""
from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("status", help="per-stage progress of a submitted campaign (one batched squeue call)")
    p.set_defaults(func=run)
    p.add_argument("run", type=Path)


def run(args) -> int:
    from tbhpc.launch.status import render_status, run_status
    from tbhpc.store.run_dir import RunDir
    print(render_status(run_status(RunDir(args.run).require())), end="")
    return 0
