"""Where an OpenEnv environment lives: a URL, or a server this process starts and stops by PID.

Why a launch of its own per worker: an array task on a compute node cannot reach a server on
the login node, and one environment server per worker keeps sessions local and the failure
of one server to one worker. `uv_project` renders OpenEnv's own uv launch (`uv run --isolated --project DIR
-- uvicorn server.app:app`); `launch` takes any command with `{port}` (e.g. `tbhpc openenv-serve`
from .venv-openenv). A server that does not come up is the user's configuration: one line with
the tail of its output, before any attempt runs.
"""
from __future__ import annotations

import atexit
import os
import shlex
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from dataclasses import dataclass

from tbhpc.errors import UserError

WHERE = "field 'openenv'"


@dataclass
class OpenEnvSpec:
    url: str | None = None              # a running environment: http(s):// or ws(s)://
    launch: str | None = None           # a command that serves it on {port} (started here, stopped by PID)
    uv_project: str | None = None       # an OpenEnv environment directory, served with uv
    app: str = "server.app:app"         # the ASGI app uv serves
    timeout_s: float = 120.0            # one reply: a tool call, the user's answer, the grade
    start_timeout_s: float = 300.0      # a launched server answering /health

    def __post_init__(self) -> None:
        given = [k for k in ("url", "launch", "uv_project") if getattr(self, k)]
        if len(given) != 1:
            raise UserError(f"{WHERE}: give exactly one of url, launch, uv_project (got {', '.join(given) or 'none'})")
        if self.url:
            from tbhpc.openenv.wire import ws_url
            try:
                ws_url(self.url)
            except ValueError as exc:
                raise UserError(f"{WHERE}: url: {exc}") from None
        if self.launch and "{port}" not in self.launch:
            raise UserError(f"{WHERE}: launch must contain {{port}} (where the server listens), got {self.launch!r}")
        for name in ("timeout_s", "start_timeout_s"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0:
                raise UserError(f"{WHERE}: {name} must be a number > 0, got {v!r}")

    def command(self, port: int) -> list[str]:
        if self.uv_project:
            return ["uv", "run", "--isolated", "--project", self.uv_project, "--", "uvicorn", self.app,   # as OpenEnv's UVProvider,
                    "--app-dir", self.uv_project, "--host", "127.0.0.1", "--port", str(port)]     # from any directory
        return shlex.split(self.launch.replace("{port}", str(port)))


class Launched:
    """A started environment server: its URL, and a stop by PID (its whole process group)."""

    def __init__(self, spec: OpenEnvSpec):
        port = _free_port()
        cmd = spec.command(port)
        self.url = f"http://127.0.0.1:{port}"
        self.log = tempfile.TemporaryFile(mode="w+")     # never a pipe: a chatty server would block on it
        try:
            self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        except OSError as exc:
            raise UserError(f"{WHERE}: cannot start {cmd[0]!r}: {exc.strerror}") from None
        deadline = time.monotonic() + spec.start_timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.log.seek(0)
                tail = " | ".join(self.log.read().strip().splitlines()[-3:])
                raise UserError(f"{WHERE}: the environment server exited with status {self.proc.returncode} "
                                f"before answering: {tail[-400:] or 'no output'}")
            if _healthy(self.url):
                atexit.register(self.stop)      # a worker that exits without closing still stops it (a trainer,
                return                          # which ends with os._exit, closes its Environments first)
            time.sleep(0.2)
        self.stop()
        raise UserError(f"{WHERE}: the environment server did not answer {self.url}/health within {spec.start_timeout_s:g} s")

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                try:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.proc.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


ENVIRONMENTS = ("local", "openenv")


def openenv_spec(environment: str, openenv: dict, source: str) -> OpenEnvSpec | None:
    """The `environment` / `openenv` pair of a campaign or training config, checked: None for
    tbhpc's own backends, else where the OpenEnv environment is."""
    if environment not in ENVIRONMENTS:
        raise UserError(f"{source}: field 'environment' must be local or openenv, got {environment!r}")
    if not isinstance(openenv, dict):
        raise UserError(f"{source}: field 'openenv' must be a mapping (url, launch or uv_project, ...), got {openenv!r}")
    if environment == "local":
        if openenv:
            raise UserError(f"{source}: field 'openenv' is set but field 'environment' is local (say environment: openenv)")
        return None
    from tbhpc.config import from_dict
    try:
        return from_dict(OpenEnvSpec, openenv, {k: f"{source}: field 'openenv'" for k in openenv})
    except UserError as exc:
        msg = str(exc)
        raise UserError(msg if msg.startswith(source) else f"{source}: {msg}") from None
