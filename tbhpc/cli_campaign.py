"""`tbhpc probe|eval|merge|validate`: run, resume, merge and check campaigns."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli_types import int_in
from tbhpc.errors import UserError
from tbhpc.outpaths import out_arg
from tbhpc.store.run_dir import RunDir

# Building the parser imports nothing heavy: every `tbhpc` command builds all of them, so each
# command imports what it runs (the campaign runner, DuckDB, rich) when it runs.

def add_parsers(sub) -> None:
    for kind in ("probe", "eval"):
        p = sub.add_parser(kind, help=f"run (or resume) a {kind} campaign into a run directory")
        p.add_argument("--out", type=out_arg, required=True, help="run directory (created, or resumed if it exists)")
        p.add_argument("--config", type=Path, help=f"YAML campaign config (see jobs/{kind}.yaml)")
        p.add_argument("--executor", default="local")
        p.add_argument("--workers", type=int_in(1, 1024), help="local worker processes (overrides workers=)")
        p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    sb = sub.add_parser("submit", help="submit to Slurm: a campaign (array -> merge -> agg/select) or a training run "
                                       "(serving job + trainer job); fire and forget")
    sb.add_argument("kind", choices=("probe", "eval", "train"))
    sb.add_argument("--out", type=out_arg, required=True)
    sb.add_argument("--config", type=Path)
    sb.add_argument("--dry-run", action="store_true", help="print the sbatch scripts, submit nothing")
    sb.add_argument("--wait", action="store_true", help="train: follow the run until the trainer job ends")
    sb.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    stt = sub.add_parser("status", help="per-stage progress of a submitted campaign (one batched squeue call)")
    stt.add_argument("run", type=Path)
    m = sub.add_parser("merge", help="merge a run's shards into results.duckdb")
    m.add_argument("run", type=Path)
    m.add_argument("--rebuild", action="store_true", help="set a damaged results.duckdb aside and merge every shard again")
    v = sub.add_parser("validate", help="check a run holds exactly tasks x repeats keys and no system errors")
    v.add_argument("run", type=Path)
    v.add_argument("--tasks", type=Path, help="expected task ids (YAML list, pool file, or one per line)")
    v.add_argument("--repeats", type=int_in(1))


def check_kind(cfg, command: str) -> None:
    """`tbhpc eval` runs an eval: a config file or override that says otherwise is a mistake."""
    if cfg.kind != command:
        raise UserError(f"{command}: the campaign config says kind: {cfg.kind} (config file or override); "
                        f"the command sets the kind: run `tbhpc {cfg.kind}`, or drop the field")


def run(args) -> int:
    from rich.console import Console

    from tbhpc.campaign.config import KIND_DEFAULTS, CampaignConfig, read_task_ids
    from tbhpc.config import load_config
    console = Console(stderr=True)
    if args.cmd in ("probe", "eval"):
        from tbhpc.campaign.executors import make_executor
        from tbhpc.campaign.runner import run_campaign
        overrides = list(args.overrides) + ([f"workers={args.workers}"] if args.workers is not None else [])
        cfg = load_config(CampaignConfig, args.config, overrides, base=KIND_DEFAULTS[args.cmd])
        check_kind(cfg, args.cmd)
        res = run_campaign(cfg, args.out, make_executor(args.executor, cfg.workers, cfg.slurm), console)
        print(f"{args.out}: {res.planned} planned, {res.already_done} already done, {res.executed} executed "
              f"({res.ok} ok, {res.system_errors} system errors), {res.missing} still to run")
        if res.missing or res.system_errors:   # why, even when every re-run has since succeeded
            from tbhpc.campaign.runner import system_error_causes
            for kind, message, n in system_error_causes(RunDir(args.out)):
                print(f"  system errors: {n} x {kind}: {message}")
        return 0 if res.missing == 0 else 1
    if args.cmd == "submit" and args.kind == "train":
        from tbhpc.cli_train import load
        from tbhpc.launch.train import submit_train
        from tbhpc.outpaths import check_run_folder
        check_run_folder(args.out, "train")
        print(submit_train(load(args), args.out, args.dry_run, wait=args.wait), end="" if args.dry_run else "\n")
        return 0
    if args.cmd == "submit":
        from tbhpc.launch.submit import submit_campaign
        cfg = load_config(CampaignConfig, args.config, args.overrides, base=KIND_DEFAULTS[args.kind])
        check_kind(cfg, args.kind)
        print(submit_campaign(cfg, args.out, args.dry_run), end="" if args.dry_run else "\n")
        return 0
    run_dir = RunDir(args.run).require()
    if args.cmd == "status":
        from tbhpc.launch.status import render_status, run_status
        print(render_status(run_status(run_dir)), end="")
        return 0
    if args.cmd == "merge" and args.rebuild:
        from tbhpc.store.merge import rebuild
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
    if args.cmd == "merge":
        from tbhpc.store.merge import merge
        rep = merge(run_dir, verify=True)    # damage anywhere in the file, before anything is written
        for line in rep.lines():
            console.print(f"[red]error[/]: {line}")
        print(f"{args.run}: merged {rep.new_shards} new shard(s), {rep.rows} attempt row(s)")
        return 1 if rep.quarantined else 0
    from tbhpc.campaign.validate import validate
    ids = read_task_ids(args.tasks) if args.tasks else None
    val = validate(run_dir, ids, args.repeats)
    print(val.summary())
    return 0 if val.ok else 1
