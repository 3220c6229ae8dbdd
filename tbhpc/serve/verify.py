"""`tbhpc serve-check`: does a running server compute the weights it claims to serve?

Why a command of its own: the supervisor checks every sync it applies, but users also bring their
own vLLM servers (started by hand, by another launcher, restarted by an operator), and anyone
should be able to ask "which weights is this thing really serving?" in one line. It resolves the
server and the fingerprint to compare with, then runs the same check as the supervisor.
"""
from __future__ import annotations

from pathlib import Path

from tbhpc.errors import InfraError, UserError
from tbhpc.serve.checkpoints import REJECTED, UNVERIFIED, published, version_step
from tbhpc.serve.endpoint import read_endpoint
from tbhpc.serve.fingerprint import Check, Fingerprint, check_server, default_tol, fingerprint_dir
from tbhpc.serve.server import http_json, merge_reports


def check_endpoint(run: Path | None = None, url: str | None = None, model: str = "", checkpoint: Path | None = None,
                   tol: float = 0.0) -> tuple[Check, str]:
    """(the check, where its fingerprint came from). RUN: the run's endpoint and the ready marker
    of the version the server reports (or the run's model directory for `base`); URL: a server
    of your own, compared with `checkpoint` fingerprinted here."""
    if run is not None:
        ep = read_endpoint(run)
        base_url, model = ep.base_url, model or ep.model
    else:
        base_url = url.rstrip("/").removesuffix("/v1")
    _reachable(base_url, f"serve-check {run}" if run is not None else "serve-check --url")
    if run is None:
        model = model or _first_model(base_url)
    version = _served_version(base_url, model)
    if checkpoint is not None:
        fp, source = fingerprint_dir(str(checkpoint)), str(checkpoint)
    elif run is not None:
        fp, source = _run_fingerprint(run, version, ep.model_path)
    else:
        raise UserError("serve-check --url: --checkpoint DIR (the weights it should serve) is required")
    tol = tol or max(default_tol(fp.dtype), default_tol(_served_dtype(base_url)))
    return check_server(base_url, model, fp, version, tol), source


def _run_fingerprint(run: Path, version: str, model_path: str) -> tuple[Fingerprint, str]:
    claimed = version.removeprefix(UNVERIFIED).removeprefix(REJECTED)
    try:
        step = version_step(claimed)
    except ValueError:
        raise UserError(f"serve-check {run}: the server reports version {version!r}, which names no checkpoint") from None
    if step == 0:
        return fingerprint_dir(model_path), model_path
    pub = published(run, step)
    if pub is None:
        raise UserError(f"serve-check {run}: no ready marker for {claimed} under {run}/checkpoints")
    if not pub.fingerprint:
        return fingerprint_dir(str(pub.path)), str(pub.path)
    return Fingerprint.from_json(pub.fingerprint), f"{claimed} marker"


def _reachable(base_url: str, who: str) -> None:
    """One line when nothing answers at `base_url` (a dead server, a wrong port or host)."""
    import urllib.error
    try:
        http_json(base_url + "/v1/models", timeout=10.0)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InfraError(f"{who}: no vLLM server answers at {base_url} ({reason})") from None


def _first_model(base_url: str) -> str:
    data = http_json(base_url + "/v1/models").get("data") or []
    if not data:
        raise UserError(f"serve-check: {base_url}/v1/models lists no model")
    return data[0]["id"]


def _served_dtype(base_url: str) -> str:
    """The dtype the engine computes in, from tbhpc's worker extension; '' (the loosest
    tolerance applies) on a server without it."""
    try:
        results = http_json(base_url + "/collective_rpc", {"method": "tbhpc_kernel_paths"}).get("results") or []
        return merge_reports(results)["dtype"]
    except Exception:
        return ""


def _served_version(base_url: str, model: str) -> str:
    """The weight version the server reports (tbhpc's middleware on /v1/models, else vLLM's
    dev-mode /weight_info), or 'unknown'."""
    try:
        for card in http_json(base_url + "/v1/models").get("data") or []:
            if card.get("id") == model and card.get("weight_version"):
                return str(card["weight_version"])
        return str(http_json(base_url + "/weight_info")["weight_version"])
    except Exception:  # a server without either route still gets checked
        return "unknown"
