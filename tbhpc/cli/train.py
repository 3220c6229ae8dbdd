"""`tbhpc train RUN`: GRPO on the run's pool. Every rank of a training job runs this (locally,
one process); `tbhpc submit train` starts it on Slurm beside the serving job (launch/train.py)."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import add_overrides
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    p = sub.add_parser("train", help="GRPO on the run's pool: rollouts, DeepSpeed update, publish, repeat")
    p.set_defaults(func=run)
    p.add_argument("run", type=out_arg, help="run directory (shared by the trainer ranks and the serving job)")
    p.add_argument("--config", type=Path, help="YAML train config (see jobs/train.yaml)")
    add_overrides(p)


def run(args) -> int:
    from tbhpc.openmp import keep_workers_spinning
    keep_workers_spinning()      # before torch loads: the trainer and its generator thread (tbhpc/openmp.py)
    from tbhpc.outpaths import check_run_folder
    from tbhpc.train.config import load_train_config
    from tbhpc.train.jobs import finish_submissions, requeue_or_exit, stop_serving_job
    from tbhpc.train.build import build_trainer
    from tbhpc.train.loop import Preempted
    from tbhpc.train.watch import RankLost

    cfg = load_train_config(args.config, args.overrides)
    check_run_folder(args.run, "train", flag="train")   # before the model loads
    trainer = build_trainer(cfg, args.run, log=lambda m: print(m, flush=True))
    try:
        last = trainer.fit()
    except Preempted as exc:
        if trainer.rank0:
            print(f"train: {exc}", flush=True)
        code = requeue_or_exit(trainer.rank0, run=args.run)
    except RankLost as exc:      # a peer died or hung: end the job (no barrier: nobody would come)
        trainer.fatal(str(exc))
    else:
        if trainer.rank0:
            if trainer.stopped:
                print(f"train: {args.run}: stopped by the collapse guard at {trainer.stopped}", flush=True)
            elif trainer.out_of_time:
                print(f"train: {args.run}: time budget of {cfg.max_seconds:g} s spent after step {last}", flush=True)
            print(f"train: {args.run}: {last} steps done; weights in {args.run}/exports/step-{last:06d}", flush=True)
            finish_submissions(log=lambda m: print(m, flush=True))
            stop_serving_job(args.run, log=lambda m: print(m.replace("train: ", "train: training done; "), flush=True))
        code = 0
    trainer.leave(code)     # ends this process: every rank's work is written by now
