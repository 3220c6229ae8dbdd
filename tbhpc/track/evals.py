"""An export's evaluation, logged to the training run's trackers at the step it evaluated.

Why here and not in the trainer: an export's eval runs detached (a local campaign, or its own
Slurm pipeline) and often ends after training has. Whatever aggregates it (`tbhpc agg` on
RUN/evals/step-N, the last stage of that pipeline) reopens the run's trackers by the ids they
kept in RUN/trackers/ and logs the metrics on the `eval/step` axis, once (a marker in the eval
directory says it was done), so the eval curve sits beside the training curve.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Callable

from tbhpc.track.run_trackers import reopen_trackers
from tbhpc.track.settings import trackers_dir

MARKER = "tracked.json"
_STEP_DIR = re.compile(r"step-(\d{6})$")


def eval_metrics(summary: dict) -> dict[str, float]:
    """The tracker scalars of an `agg` summary (names every tracker accepts: MLflow refuses @ and ^)."""
    out = {"eval/pass_at_1": summary["pass@1"]["value"], "eval/k_of_k": summary["k/k"]["value"],
           "eval/k_of_k_tasks": summary["k/k"]["count"], "eval/tasks": summary["tasks"]}
    for k, v in summary["pass@k"].items():
        out[f"eval/pass_at_{k}"] = v["value"]
    for k, v in summary["pass^k"].items():
        out[f"eval/pass_hat_{k}"] = v["unbiased"]["value"]
    for d in summary["by_domain"]["domains"]:
        out[f"eval/{d['domain']}/pass_at_1"] = d["pass_rate"]
        out[f"eval/{d['domain']}/k_of_k_tasks"] = d["k/k"]
    return {k: float(v) for k, v in out.items()}


def training_run_of(eval_dir: Path) -> tuple[Path, int] | None:
    """(training run, step) when `eval_dir` is an export's eval (RUN/evals/step-N) of a run that
    has trackers; else None."""
    eval_dir = eval_dir.resolve()
    m = _STEP_DIR.search(eval_dir.name)
    if not m or eval_dir.parent.name != "evals":
        return None
    run = eval_dir.parent.parent
    return (run, int(m.group(1))) if (trackers_dir(run) / "run.json").exists() else None


def log_eval(eval_dir: Path, summary: dict, log: Callable[[str], None]) -> bool:
    """Log `summary` to the trackers of the run `eval_dir` belongs to, unless done before. True when logged."""
    found = training_run_of(eval_dir)
    if found is None or (eval_dir / MARKER).exists():
        return False
    run, step = found
    trackers = reopen_trackers(run, log, wandb_dir=eval_dir)
    metrics = eval_metrics(summary)
    trackers.evals(step, metrics)
    trackers.close()
    names = trackers.working()
    (eval_dir / MARKER).write_text(json.dumps({"step": step, "trackers": names, "metrics": metrics}))
    log(f"tracked: step {step}'s eval logged to {', '.join(names) or 'no tracker'}")
    return True
