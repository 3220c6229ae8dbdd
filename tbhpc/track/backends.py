"""One adapter per tracker, each the same four calls: open (or reopen the run it opened before),
scalars at a step, a table at a step, close.

Why reopen: a requeued trainer, and the eval of an export that finishes after training, log into
the same tracker run, found by the ids each adapter keeps in RUN/trackers/<name>.json. Eval
metrics have their own x-axis (`eval/step`: the training step the export came from), so they can
arrive in any order. Imports are local: a run pays only for the trackers it names.
"""
from __future__ import annotations

import json
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path

from tbhpc.track.settings import trackers_dir


@dataclass(frozen=True)
class RunIdentity:
    run_path: Path
    project: str
    name: str
    tags: tuple[str, ...] = ()
    config: dict = field(default_factory=dict)

    def ids_file(self, tracker: str) -> Path:
        return trackers_dir(self.run_path) / f"{tracker}.json"

    def load_ids(self, tracker: str) -> dict:
        try:
            return json.loads(self.ids_file(tracker).read_text())
        except (OSError, ValueError):
            return {}

    def save_ids(self, tracker: str, ids: dict) -> None:
        path = self.ids_file(tracker)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(ids))
        os.replace(tmp, path)


class Tensorboard:
    name = "tensorboard"

    def __init__(self, ident: RunIdentity):
        from torch.utils.tensorboard import SummaryWriter
        self.writer = SummaryWriter(str(ident.run_path / "tensorboard"))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        for k, v in values.items():
            self.writer.add_scalar(k, v, step)
        self.writer.flush()

    def table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        self.writer.add_text(key, markdown_table(columns, rows), step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Trackio:
    """Through trackio's SQLite storage, synchronously: `trackio.init`'s run writes on a thread of its
    own and turns a failed write into a Python warning (measured: a read-only directory costs
    "failed to flush" warnings and nothing else), which a run could not tell from success. Here a
    failed write raises in the tracker's own thread: one warning line, and it is off."""
    name = "trackio"

    def __init__(self, ident: RunIdentity):
        import trackio
        from trackio.sqlite_storage import SQLiteStorage
        self.trackio, self.storage, self.ident = trackio, SQLiteStorage, ident
        ids = ident.load_ids(self.name)
        self.run_id = ids.get("run_id") or secrets.token_hex(16)
        ident.save_ids(self.name, {"project": ident.project, "name": ident.name, "run_id": self.run_id,
                                   "dir": os.environ.get("TRACKIO_DIR", "")})
        self.config = ident.config or None            # stored with the first entry (a reopen passes none)

    def _log(self, values: dict, step: int) -> None:
        self.storage.bulk_log(project=self.ident.project, run=self.ident.name, run_id=self.run_id,
                              metrics_list=[values], steps=[step], config=self.config)
        self.config = None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        self._log(values, step)

    def table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        tab = self.trackio.Table(columns=columns, data=rows)
        self._log({key: tab._to_dict(project=self.ident.project, run=self.ident.name, step=step)}, step)

    def close(self) -> None:
        pass


class Wandb:
    name = "wandb"

    def __init__(self, ident: RunIdentity):
        import wandb
        self.wandb = wandb
        ids = ident.load_ids(self.name)
        run_id = ids.get("id") or secrets.token_hex(4)      # wandb ids: [a-z0-9]
        ident.save_ids(self.name, {"id": run_id, "project": ident.project, "name": ident.name})
        self.run = wandb.init(project=ident.project, name=ident.name, id=run_id, resume="allow", config=ident.config,
                              tags=list(ident.tags), dir=os.environ.get("WANDB_DIR"),
                              settings=wandb.Settings(console="off", x_disable_stats=True, silent=True))
        self.run.define_metric("eval/step")
        self.run.define_metric("eval/*", step_metric="eval/step")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if "eval/step" in values:
            self.run.log(values)                 # its own x-axis: an export's eval may finish after later steps
        else:
            self.run.log(values, step=step)

    def table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        self.run.log({key: self.wandb.Table(columns=columns, data=rows)}, step=step)

    def close(self) -> None:
        self.run.finish()


class Mlflow:
    name = "mlflow"

    def __init__(self, ident: RunIdentity):
        import logging

        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        for noisy in ("mlflow", "alembic"):           # the store's first-use migration talks at INFO
            logging.getLogger(noisy).setLevel(logging.WARNING)
        uri = os.environ["MLFLOW_TRACKING_URI"]
        self.client = MlflowClient(uri)
        ids = ident.load_ids(self.name)
        if ids.get("uri") == uri and ids.get("run_id"):
            self.run_id = ids["run_id"]
            self.client.update_run(self.run_id, status="RUNNING")
            return
        exp = self.client.get_experiment_by_name(ident.project)
        if exp is None:
            artifacts = None
            if uri.startswith("sqlite:///"):
                artifacts = (trackers_dir(ident.run_path) / "mlflow-artifacts").as_uri()
            exp_id = self.client.create_experiment(ident.project, artifact_location=artifacts)
        else:
            exp_id = exp.experiment_id
        self.run_id = self.client.create_run(exp_id, run_name=ident.name, tags={t: "" for t in ident.tags}).info.run_id
        params = [Param(k, str(v)[:500]) for k, v in flatten(ident.config).items()]
        for i in range(0, len(params), 100):         # MLflow takes at most 100 params a batch
            self.client.log_batch(self.run_id, params=params[i:i + 100])
        ident.save_ids(self.name, {"uri": uri, "run_id": self.run_id, "experiment": ident.project})

    def scalars(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, float(v), now, step) for k, v in values.items()])

    def table(self, step: int, key: str, columns: list[str], rows: list[list]) -> None:
        # the layout mlflow's log_table writes, without the pandas it needs for that
        self.client.log_dict(self.run_id, {"columns": columns, "data": rows}, f"{key}/step-{step:06d}.json")

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


BACKENDS = {b.name: b for b in (Tensorboard, Trackio, Wandb, Mlflow)}


def flatten(config: dict, prefix: str = "") -> dict:
    """Nested config as dotted keys (MLflow's params are flat)."""
    out = {}
    for k, v in config.items():
        if isinstance(v, dict) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def markdown_table(columns: list[str], rows: list[list]) -> str:
    """A table as Markdown (TensorBoard's text plugin renders it); cells on one line each."""
    def cell(v) -> str:
        return str(v).replace("|", "\\|").replace("\n", "<br>")
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return "\n".join(lines)
