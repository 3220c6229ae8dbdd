"""`tbhpc tracker-sync RUN`: what was recorded offline on compute nodes, uploaded from a login node.

Why a plan first: each tracker uploads its own way (wandb replays its offline run files, trackio
pushes a project's SQLite file to a Hugging Face Space, an MLflow run is copied into a tracking
server), and a login node may reach one service and not another. So the plan (`sync_plan`, pure)
says for each tracker what will run or what to pass; `--dry-run` prints it and does nothing.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SyncStep:
    tracker: str
    argv: list[str] | None = None             # an external command, or None
    env: dict[str, str] = field(default_factory=dict)
    copy_to: str = ""                         # mlflow: the tracking URI the run is copied into
    note: str = ""                            # what the line says (and, with nothing to run, what to do)


def wandb_offline_dirs(run_path: Path) -> list[Path]:
    """The training run's offline record and each export eval's (evals write their own)."""
    return (sorted(run_path.glob("trackers/wandb/offline-run-*"))
            + sorted(run_path.glob("evals/step-*/wandb/offline-run-*")))


def sync_plan(run_path: Path, record: dict, wandb_dirs: list[Path], trackio_space: str = "",
              mlflow_uri: str = "", bin_dir: Path = Path(sys.executable).parent) -> list[SyncStep]:
    steps = []
    env = record.get("env", {})
    for name in record["trackers"]:
        if name == "wandb":
            if not wandb_dirs:
                steps.append(SyncStep("wandb", note="wandb: no offline record (an online run is uploaded already)"))
            else:
                steps.append(SyncStep("wandb", [str(bin_dir / "wandb"), "sync", *map(str, wandb_dirs)],
                                      note=f"wandb: wandb sync of {len(wandb_dirs)} offline records "
                                           f"(run {record['project']}/{record['name']})"))
        elif name == "trackio":
            where = env.get("TRACKIO_DIR", str(run_path / "trackers" / "trackio"))
            if trackio_space:
                steps.append(SyncStep("trackio", [str(bin_dir / "trackio"), "sync", "--project", record["project"],
                                                   "--space-id", trackio_space, "--force"], {"TRACKIO_DIR": where},
                                      note=f"trackio: project {record['project']} to the Space {trackio_space}"))
            else:
                steps.append(SyncStep("trackio", note=f"trackio: local only; --trackio-space USER/SPACE pushes it to a "
                                                      f"Hugging Face Space, or view it here: TRACKIO_DIR={where} trackio show"))
        elif name == "mlflow":
            source = env.get("MLFLOW_TRACKING_URI", "")
            if mlflow_uri:
                steps.append(SyncStep("mlflow", copy_to=mlflow_uri, note=f"mlflow: the run copied from {source} to {mlflow_uri}"))
            else:
                steps.append(SyncStep("mlflow", note=f"mlflow: in {source}; --mlflow-uri URI copies the run into a "
                                                     "tracking server"))
        elif name == "tensorboard":
            steps.append(SyncStep("tensorboard", note=f"tensorboard: event files; tensorboard --logdir {run_path / 'tensorboard'}"))
    return steps


def copy_mlflow_run(src_uri: str, run_id: str, dst_uri: str) -> str:
    """The run (its parameters, tags, every metric's whole history, its artifacts and status) into
    another tracking store, under an experiment of the same name. Returns the new run's id."""
    import tempfile

    from mlflow.entities import Metric, Param, RunTag
    from mlflow.tracking import MlflowClient
    src, dst = MlflowClient(src_uri), MlflowClient(dst_uri)
    run = src.get_run(run_id)
    name = src.get_experiment(run.info.experiment_id).name
    exp = dst.get_experiment_by_name(name)
    artifacts = None                  # a server keeps artifacts where it keeps them; a sqlite store beside its file
    if dst_uri.startswith("sqlite:///"):
        artifacts = (Path(dst_uri[len("sqlite:///"):]).parent / "mlflow-artifacts").as_uri()
    exp_id = exp.experiment_id if exp is not None else dst.create_experiment(name, artifact_location=artifacts)
    tags = {k: v for k, v in run.data.tags.items() if not k.startswith("mlflow.")}
    new = dst.create_run(exp_id, run_name=run.info.run_name, tags=tags).info.run_id
    params = [Param(k, v) for k, v in run.data.params.items()]
    for i in range(0, len(params), 100):
        dst.log_batch(new, params=params[i:i + 100])
    metrics = [Metric(m.key, m.value, m.timestamp, m.step) for key in run.data.metrics
               for m in src.get_metric_history(run_id, key)]
    for i in range(0, len(metrics), 1000):
        dst.log_batch(new, metrics=metrics[i:i + 1000])
    dst.log_batch(new, tags=[RunTag("tbhpc.copied_from", f"{src_uri} {run_id}")])
    with tempfile.TemporaryDirectory() as tmp:
        if src.list_artifacts(run_id):
            local = src.download_artifacts(run_id, "", tmp)
            dst.log_artifacts(new, local)
    dst.set_terminated(new, run.info.status)
    return new
