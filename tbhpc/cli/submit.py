"""`tbhpc submit probe|eval|train --out RUN`: fire-and-forget submission to Slurm. A campaign is
an array -> merge -> agg/select chain (launch/submit.py); a training run is the serving job and
the trainer job (launch/train.py). `--dry-run` prints the scripts and submits nothing."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import add_overrides
from tbhpc.outpaths import out_arg


def add_parser(sub) -> None:
    p = sub.add_parser("submit", help="submit to Slurm: a campaign (array -> merge -> agg/select) or a training run "
                                      "(serving job + trainer job); fire and forget")
    p.set_defaults(func=run)
    p.add_argument("kind", choices=("probe", "eval", "train"))
    p.add_argument("--out", type=out_arg, required=True)
    p.add_argument("--config", type=Path)
    p.add_argument("--dry-run", action="store_true", help="print the sbatch scripts, submit nothing")
    p.add_argument("--wait", action="store_true", help="train: follow the run until the trainer job ends")
    add_overrides(p)


def run(args) -> int:
    if args.kind == "train":
        from tbhpc.launch.train import submit_train
        from tbhpc.outpaths import check_run_folder
        from tbhpc.train.config import load_train_config
        check_run_folder(args.out, "train")
        cfg = load_train_config(args.config, args.overrides)
        print(submit_train(cfg, args.out, args.dry_run, wait=args.wait), end="" if args.dry_run else "\n")
        return 0
    from tbhpc.campaign.config import load_campaign
    from tbhpc.launch.submit import submit_campaign
    cfg = load_campaign(args.config, args.kind, args.overrides)
    print(submit_campaign(cfg, args.out, args.dry_run), end="" if args.dry_run else "\n")
    return 0
