"""`tbhpc merge RUN [--rebuild]`: fold a run's shards into results.duckdb, or rebuild a damaged one."""
from __future__ import annotations

from pathlib import Path


def add_parser(sub) -> None:
    p = sub.add_parser("merge", help="merge a run's shards into results.duckdb")
    p.set_defaults(func=run)
    p.add_argument("run", type=Path)
    p.add_argument("--rebuild", action="store_true", help="set a damaged results.duckdb aside and merge every shard again")


def run(args) -> int:
    from rich.console import Console

    from tbhpc.store.merge import merge, rebuild
    from tbhpc.store.run_dir import RunDir
    run_dir = RunDir(args.run).require()
    console = Console(stderr=True)
    if args.rebuild:
        aside, rep = rebuild(run_dir)
        steps = ""
        if run_dir.campaign().get("kind") == "train":
            from tbhpc.train.record import restore_steps
            steps = f", {restore_steps(run_dir)} training step(s) from logs/train_steps.jsonl"
        for line in rep.lines():
            console.print(f"[red]error[/]: {line}")
        print(f"{args.run}: rebuilt from {rep.new_shards} shard(s): {rep.rows} attempt row(s){steps}"
              + (f"; the old file is {aside.name} (re-run `tbhpc select` to store its pools in the run again)"
                 if aside else ""))
        return 1 if rep.quarantined else 0
    rep = merge(run_dir, verify=True)    # damage anywhere in the file, before anything is written
    for line in rep.lines():
        console.print(f"[red]error[/]: {line}")
    print(f"{args.run}: merged {rep.new_shards} new shard(s), {rep.rows} attempt row(s)")
    return 1 if rep.quarantined else 0
