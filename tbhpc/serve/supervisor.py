"""`tbhpc serve RUN`: keep one policy server alive for a run and apply weight syncs.

The loop: start vLLM on the newest published checkpoint (or the base model), wait for `/health`,
publish `RUN/endpoint.json`; then poll `RUN/checkpoints/` and, for each newer ready marker,
reload the weights in place (or restart on them), confirm the version the server reports, time
the sync and append it to `RUN/logs/weight_sync.jsonl`. SIGTERM/SIGINT (Slurm ending the job,
Ctrl-C) stop the server by PID and remove the endpoint file.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import threading
import time
from dataclasses import replace
from pathlib import Path

from tbhpc.errors import EndpointError
from tbhpc.serve.checkpoints import Published, latest_ready, record_sync
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.endpoint import Endpoint, remove_endpoint, write_endpoint
from tbhpc.serve.server import VLLMServer

BASE_VERSION = "base"


def version_step(version: str) -> int:
    """'step-000012' -> 12; the base model -> 0 (the integer rollout buffers store)."""
    return int(version.rsplit("-", 1)[1]) if version.startswith("step-") else 0


def resolve_device(cfg: ServeConfig) -> ServeConfig:
    if cfg.device != "auto":
        return cfg
    return replace(cfg, device="cuda" if shutil.which("nvidia-smi") else "cpu")


class Supervisor:
    def __init__(self, run_dir: Path | str, cfg: ServeConfig, log=print):
        cfg.validate()
        self.run, self.cfg, self.log = Path(run_dir), resolve_device(cfg), log
        self.stop_event = threading.Event()
        self.server: VLLMServer | None = None
        self.endpoint: Endpoint | None = None
        self.current: Published | None = None

    def publish_host(self) -> str:
        return socket.gethostname() if self.cfg.host in ("0.0.0.0", "::") else self.cfg.host

    def start(self) -> Endpoint:
        pub = latest_ready(self.run)
        model, version = (str(pub.path), pub.version) if pub else (self.cfg.model, BASE_VERSION)
        self.current = pub
        self.server = VLLMServer(self.cfg, model, self.run / "logs" / "vllm-server.log")
        self.server.start()
        self.log(f"serve: starting vLLM ({self.cfg.device}) on {model} port {self.server.port} (pid {self.server.proc.pid})")
        ready = self.server.wait_ready(should_stop=self.stop_event.is_set)
        self.server.set_version(version)
        self.endpoint = Endpoint(self.publish_host(), self.server.port, self.cfg.served_model_name, version,
                                 model_path=str(Path(model).resolve()), pid=self.server.proc.pid,
                                 job_id=_job_id(), started_at=self.server.started_at)
        write_endpoint(self.run, self.endpoint)
        self.log(f"serve: ready in {ready:.1f} s at {self.endpoint.openai_url} serving {version}")
        return self.endpoint

    def sync_if_new(self) -> dict | None:
        pub = latest_ready(self.run)
        if pub is None or (self.current is not None and pub.step <= self.current.step):
            return None
        return self.sync(pub)

    def sync(self, pub: Published) -> dict:
        assert self.server is not None and self.endpoint is not None
        t0, mode = time.time(), self.cfg.sync_mode
        if mode == "reload":
            try:
                self.server.reload(str(pub.path), pub.version)
            except Exception as exc:  # a loader without in-place reload: fall back, say so
                self.log(f"serve: in-place reload failed ({type(exc).__name__}: {exc}); restarting instead")
                mode = "restart"
        if mode == "restart":
            port = self.server.port
            self.server.stop()
            self.server = VLLMServer(self.cfg, str(pub.path), self.server.log_path, port=port).start()
            self.server.wait_ready(should_stop=self.stop_event.is_set)
            self.server.set_version(pub.version)
            self.endpoint.pid, self.endpoint.model_path = self.server.proc.pid, str(pub.path)
        served = self.server.weight_version()
        if served != pub.version:
            raise EndpointError(f"weight sync: server reports {served!r} after loading {pub.version!r}")
        done = time.time()
        self.current, self.endpoint.version = pub, pub.version
        write_endpoint(self.run, self.endpoint)
        entry = {"version": pub.version, "step": pub.step, "mode": mode, "sync_s": round(done - t0, 4),
                 "lag_s": round(done - pub.published_at, 4), "published_at": pub.published_at, "served_at": done,
                 "path": str(pub.path)}
        record_sync(self.run, entry)
        self.log(f"serve: now serving {pub.version} ({mode} {entry['sync_s']:.2f} s, {entry['lag_s']:.2f} s after publish)")
        return entry

    def run_forever(self) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR2):
            signal.signal(sig, lambda *_: self.stop_event.set())
        try:
            self.start()
            while not self.stop_event.wait(self.cfg.poll_s):
                if not self.server.alive():
                    raise EndpointError(f"vLLM server died (code {self.server.proc.returncode}); log tail:\n"
                                        f"{self.server.log_tail()}")
                self.sync_if_new()
            return 0
        finally:
            self.close()

    def close(self) -> None:
        remove_endpoint(self.run)
        if self.server is not None:
            self.server.stop()
            self.log("serve: stopped")


def _job_id() -> str:
    return os.environ.get("SLURM_JOB_ID", "")
