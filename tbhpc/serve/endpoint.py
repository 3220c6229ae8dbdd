"""`RUN/endpoint.json`: where the policy server of a run listens and which weights it serves.

Written atomically by the supervisor once `/health` passes (and again after each weight sync),
removed when it stops. Clients (the `openai`/`tokens` policies, rollout workers on other nodes)
read it instead of being told a host and port: a Slurm job learns its node only when it starts.
"""
from __future__ import annotations

import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from tbhpc.errors import UserError

FILENAME = "endpoint.json"


@dataclass
class Endpoint:
    host: str
    port: int
    model: str              # served model name (what requests put in "model")
    version: str            # weight version served ("base" until the first sync)
    model_path: str = ""    # weights the server started from (tokenizer and chat template live there)
    pid: int = 0
    job_id: str = ""
    started_at: float = 0.0
    dtype: str = ""         # the dtype the engine computes in: publishers digest their weights in it
    workers: int = 1        # vLLM workers (tensor x data parallel): a broadcast waits for each of them
    device: str = ""        # cpu | cuda: the collective a broadcast uses (gloo | NCCL)
    token_file: str = ""    # the run's token (serve/auth.py): every route but /health wants it; never the token itself

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def openai_url(self) -> str:
        return self.base_url + "/v1"

    def client(self):
        """A client of this server that sends the run's token (read here, from `token_file`)."""
        from tbhpc.serve.client import ServerClient
        return ServerClient.at(self.base_url, self.token_file or None)


def endpoint_path(run_dir: Path | str) -> Path:
    p = Path(run_dir)
    return p if p.name == FILENAME else p / FILENAME


def write_endpoint(run_dir: Path | str, ep: Endpoint) -> Path:
    path = endpoint_path(run_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".tmp-{path.name}-{os.getpid()}")
    tmp.write_text(json.dumps(asdict(ep), indent=1) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path


def read_endpoint(run_dir: Path | str, wait_s: float = 0.0) -> Endpoint:
    """The endpoint of a run (a run directory or an endpoint.json path); waits up to `wait_s`."""
    path = endpoint_path(run_dir)
    deadline = time.monotonic() + wait_s
    while not path.exists():
        if time.monotonic() >= deadline:
            raise UserError(f"{path}: no endpoint file (is `tbhpc serve` running for this run?)")
        time.sleep(0.5)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Endpoint(**data)
    except (ValueError, TypeError) as exc:
        raise UserError(f"{path}: not a valid endpoint file ({exc})") from None


def remove_endpoint(run_dir: Path | str) -> None:
    endpoint_path(run_dir).unlink(missing_ok=True)


def wait_for_version(run_dir: Path | str, version: str, timeout_s: float = 600.0, poll_s: float = 0.2,
                     or_newer: bool = False, stop=None) -> Endpoint | None:
    """Block until the run's server announces `version` (a verified sync; with `or_newer`, a newer
    verified one will do) and return its endpoint.
    A server that refused it (`rejected:<version>`, the check failed) raises at once with the
    check's figures; so does a timeout. What a trainer calls before sampling from new weights.
    `stop` (a threading.Event the trainer's signal handler sets): once set, the wait ends with None
    within `poll_s`, so a preempted trainer need not sit out a slow sync before it checkpoints."""
    from tbhpc.errors import EndpointError
    from tbhpc.serve.checkpoints import REJECTED, read_syncs, trusted_version, version_step
    deadline = time.monotonic() + timeout_s
    while True:
        if stop is not None and stop.is_set():
            return None
        if not endpoint_path(run_dir).exists() and time.monotonic() < deadline:
            time.sleep(poll_s)      # the server job has not started yet
            continue
        ep = read_endpoint(run_dir)  # past the deadline with no file: says so
        if ep.version == version:
            return ep
        if or_newer and trusted_version(ep.version) and version_step(ep.version) > version_step(version):
            return ep
        if ep.version == REJECTED + version:
            last = next((s for s in reversed(read_syncs(Path(endpoint_path(run_dir)).parent))
                         if s.get("version") == version), {})
            raise EndpointError(f"the server refused weights {version}: {last.get('error', 'fingerprint mismatch')}")
        if _restarted_without(run_dir, ep, version):
            raise EndpointError(f"the server restarted after {version} was broadcast into it and serves {ep.version}; "
                                "resume the run (it publishes its weights again)")
        if time.monotonic() >= deadline:
            raise EndpointError(f"the server did not announce {version} within {timeout_s:.0f} s (it says {ep.version})")
        time.sleep(poll_s)


def _restarted_without(run_dir: Path | str, ep: Endpoint, version: str) -> bool:
    """True when `version` was broadcast into a server that has restarted since: it started from the
    newest checkpoint with files and will never hold it."""
    from tbhpc.serve.checkpoints import published, trusted_version, version_step
    if not trusted_version(version) or version_step(version) == 0:
        return False
    pub = published(Path(endpoint_path(run_dir)).parent, version_step(version))
    return (pub is not None and pub.transport == "broadcast" and ep.started_at > pub.published_at
            and not ep.version.endswith(version))
