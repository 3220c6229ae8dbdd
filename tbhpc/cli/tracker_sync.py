"""`tbhpc tracker-sync RUN`: upload a training run's offline tracker records from a login node."""
from __future__ import annotations

from pathlib import Path

from tbhpc.cli.options import non_empty, positive


def add_parser(sub) -> None:
    p = sub.add_parser("tracker-sync", help="upload a training run's offline tracker records (wandb, trackio, MLflow)")
    p.set_defaults(func=run)
    p.add_argument("run", type=lambda t: Path(non_empty("a run directory")(t)), help="the training run directory")
    p.add_argument("--trackio-space", default="", help="USER/SPACE: push the trackio project to this Hugging Face Space")
    p.add_argument("--mlflow-uri", default="", help="copy the MLflow run into this tracking URI (a server, or another store)")
    p.add_argument("--timeout", type=positive(86400), default=600.0, help="seconds each upload may take (wandb sync with no "
                   "network waits forever)")
    p.add_argument("--dry-run", action="store_true", help="print what would be uploaded, and do nothing")


def run(args) -> int:
    import json
    import os
    import subprocess

    from tbhpc.errors import UserError
    from tbhpc.track.run_trackers import read_record
    from tbhpc.track.sync import copy_mlflow_run, sync_plan, wandb_offline_dirs
    if args.mlflow_uri and "://" not in args.mlflow_uri:
        raise UserError(f"--mlflow-uri: expected a tracking URI (http://..., sqlite:///...), got {args.mlflow_uri!r}")
    record = read_record(args.run)
    failed = 0
    for step in sync_plan(args.run, record, wandb_offline_dirs(args.run), args.trackio_space, args.mlflow_uri):
        print(("would run: " if args.dry_run and (step.argv or step.copy_to) else "") + step.note)
        if args.dry_run or not (step.argv or step.copy_to):
            continue
        try:
            if step.argv:
                res = subprocess.run(step.argv, env={**os.environ, **step.env}, capture_output=True, text=True,
                                     timeout=args.timeout)
                if res.returncode != 0:
                    last = (res.stderr or res.stdout).strip().splitlines()[-1:]
                    raise RuntimeError(last[0] if last else f"exit {res.returncode}")
            else:
                ids = json.loads((args.run / "trackers" / "mlflow.json").read_text())
                new = copy_mlflow_run(ids["uri"], ids["run_id"], step.copy_to)
                print(f"mlflow: run {new} in {step.copy_to}")
        except subprocess.TimeoutExpired:
            failed += 1
            print(f"tbhpc: error: {step.tracker}: no answer in {args.timeout:g} s (no network from here?)")
        except Exception as exc:   # noqa: BLE001 - one tracker's upload failing leaves the others to run
            failed += 1
            print(f"tbhpc: error: {step.tracker}: {type(exc).__name__}: {' '.join(str(exc).split())[:200]}")
    return 1 if failed else 0
