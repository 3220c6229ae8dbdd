"""`tbhpc train RUN` (every rank of a training job runs this; locally, one process) and the
`train` kind of `tbhpc submit` (the serving job and the trainer job, see launch/train.py)."""
from __future__ import annotations

import sys
from pathlib import Path

from tbhpc.config import load_config


def add_parsers(sub) -> None:
    p = sub.add_parser("train", help="GRPO on the run's pool: rollouts, DeepSpeed update, publish, repeat")
    p.add_argument("run", type=Path, help="run directory (shared by the trainer ranks and the serving job)")
    p.add_argument("--config", type=Path, help="YAML train config (see jobs/train.yaml)")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")


def load(args):
    from tbhpc.train.config import TrainConfig
    cfg = load_config(TrainConfig, args.config, args.overrides)
    cfg.validate(str(args.config or "train config"))
    return cfg


def run(args) -> int:
    from tbhpc.train.loop import Preempted, Trainer, requeue_or_exit

    cfg = load(args)
    trainer = Trainer(cfg, args.run, log=lambda m: print(m, flush=True))
    try:
        last = trainer.fit()
    except Preempted as exc:
        if trainer.rank0:
            print(f"train: {exc}", flush=True)
        return requeue_or_exit(trainer.rank0)
    if trainer.rank0:
        print(f"train: {args.run}: {last} steps done; weights in {args.run}/exports/step-{last:06d}", flush=True)
    sys.stdout.flush()
    return 0
