"""A training run's trackers: started once, reopened later by whatever logs into the same run.

Why a record (RUN/trackers/run.json): the eval of an export, a requeued trainer and
`tbhpc tracker-sync` must find the same tracker runs in the same places, even from another
node or shell whose environment differs. So the first start writes which trackers, the
project, the run's name and tags, and every tracker variable as it was (never a key); a reopen
puts those variables back before any tracker loads.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable

from tbhpc.errors import UserError
from tbhpc.track.backends import RunIdentity
from tbhpc.track.fanout import Trackers
from tbhpc.track.settings import apply, network_facts, placement, trackers_dir

# what says where a tracker writes; never WANDB_API_KEY or a token
TRACKER_VARIABLES = ("TRACKIO_DIR", "TRACKIO_STORAGE_MODE", "WANDB_DIR", "WANDB_MODE", "WANDB_CACHE_DIR",
                     "WANDB_DATA_DIR", "WANDB_SILENT", "WANDB_BASE_URL", "WANDB_ENTITY", "MLFLOW_TRACKING_URI",
                     "MLFLOW_DISABLE_TELEMETRY")


def start_trackers(names: list[str], run_path: Path, project: str, tags: list[str], config: dict,
                   log: Callable[[str], None] = print) -> Trackers | None:
    """Decide where each tracker writes (settings.placement), say it, record it, start them.
    A run resumed here reopens the tracker runs it started before."""
    if not names:
        return None
    record = trackers_dir(run_path) / "run.json"
    if record.exists():
        return reopen_trackers(run_path, log, config)
    place = placement(names, run_path, os.environ, network_facts())
    apply(place)
    for note in place.notes:
        log(f"train: tracker {note}")
    spec = {"trackers": list(names), "project": project, "name": run_path.resolve().name, "tags": list(tags),
            "env": {k: os.environ[k] for k in TRACKER_VARIABLES if k in os.environ}}
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps(spec, indent=1))
    return Trackers(names, RunIdentity(run_path, project, spec["name"], tuple(tags), config), log)


def reopen_trackers(run_path: Path, log: Callable[[str], None] = print, config: dict | None = None,
                    wandb_dir: Path | None = None) -> Trackers:
    """The run's trackers, where its first start put them (RUN/trackers/run.json). `wandb_dir`: where
    this process's wandb record goes instead (two evals ending in the same second would otherwise
    share one offline directory: wandb names it by the second and the run id)."""
    spec = read_record(run_path)
    os.environ.pop("WANDB_SERVICE", None)      # a parent's wandb helper (the trainer's, inherited) is not this run's
    for key, value in spec["env"].items():
        os.environ[key] = value
    if wandb_dir is not None:
        os.environ["WANDB_DIR"] = str(wandb_dir)
    return Trackers(spec["trackers"], RunIdentity(run_path, spec["project"], spec["name"], tuple(spec["tags"]),
                                                  config or {}), log)


def read_record(run_path: Path) -> dict:
    path = trackers_dir(run_path) / "run.json"
    try:
        spec = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the run's tracker record ({exc})") from None
    return spec
