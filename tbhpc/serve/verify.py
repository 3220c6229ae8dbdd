"""How a running server is checked against the checkpoint it claims to serve, and `tbhpc serve-check`.

Two checks, each for what it can prove (docs/guides/serving.md: what each check proves):
- identity: the digests of every tensor the server holds (parameters and packed kernel copies,
  in the dtype it computes in) equal, bit for bit, the digests the publisher wrote (digest.py);
- function: the checkpoint's probe scored through the server is within the dtype's tolerance
  of the publisher's own logprobs (fingerprint.py): the kernels, dtype and layout compute what
  the weights say. Reported against the previous version too, so a reader sees whether the
  probe could tell the two apart at all.
The supervisor runs `check_weights` after every sync; the command runs it on demand, because
users also bring their own vLLM servers and anyone should be able to ask "which weights is this
thing really serving?" in one line.
"""
from __future__ import annotations

import json
import shutil
import tempfile
import urllib.error
from dataclasses import dataclass
from pathlib import Path

from tbhpc.errors import InfraError, UserError
from tbhpc.serve.checkpoints import REJECTED, UNVERIFIED, published, version_step
from tbhpc.serve.digest import DigestCheck, compare_replicas, merge_served, model_digests, served_dtypes
from tbhpc.serve.endpoint import read_endpoint
from tbhpc.serve.fingerprint import (Check, Fingerprint, check_server, compute_fingerprint, default_tol, distance,
                                     load_checkpoint)
from tbhpc.serve.client import ServerClient
from tbhpc.serve.server import merge_reports


@dataclass
class Verdict:
    digest: DigestCheck | None          # None: identity not checked (verify=false)
    probe: Check | None                 # None: function not checked (verify=false)
    prev_err: tuple[float, float] | None = None   # probe (max, mean) |Δ| of the served logprobs vs the previous version

    @property
    def passed(self) -> bool:
        identity = self.digest is None or self.digest.equal      # a digest that could not be taken is no pass
        return identity and (self.probe is None or self.probe.passed)

    def summary(self) -> str:
        parts = [self.probe.summary()] if self.probe else []
        if self.prev_err is not None:
            parts.append(f"vs the previous version: mean |Δlogprob| {self.prev_err[1]:.2e}")
        if self.digest is not None:
            parts.append(self.digest.summary())
        text = "; ".join(parts)
        if self.probe is not None and self.probe.passed and not self.passed:
            text = "FAIL" + text.removeprefix("PASS")
        return text

    def to_json(self) -> dict:
        out = {**(self.probe.to_json() if self.probe else {}), **(self.digest.to_json() if self.digest else {})}
        if self.prev_err is not None:
            out["probe_prev_mean_err"] = round(self.prev_err[1], 6)
        out["verified"] = self.passed
        return out


def served_digest(server: ServerClient, report_dir: Path | str | None = None, replicas: int = 0,
                  adapter: bool = False) -> list[dict] | dict:
    """The server's digests of what it holds (tbhpc's worker extension), one per data-parallel
    replica, or {"unsupported": why}. Every worker also writes its report into `report_dir` (a
    fresh directory the server can write): vLLM's RPC answers with the first replica's workers only.
    `replicas`: how many data-parallel replicas the server runs (0: as many as report). `adapter`:
    the LoRA adapter it serves instead of the model's weights."""
    own = report_dir is None
    report_dir = Path(tempfile.mkdtemp(prefix="tbhpc-digest-")) if own else Path(report_dir)
    if not own:                           # the last check's reports are not this one's
        shutil.rmtree(report_dir, ignore_errors=True)
    report_dir.mkdir(parents=True, exist_ok=True)
    try:
        body = {"method": "tbhpc_digest", "kwargs": {"report_dir": str(report_dir), "replicas": replicas,
                                                     **({"adapter": True} if adapter else {})}}
        results = (server.post("/collective_rpc", body, timeout=1800) or {}).get("results") or []
        files = [json.loads(f.read_text()) for f in sorted(report_dir.glob("dp*-pp*-tp*.json"))]
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return {"unsupported": f"the server cannot digest its weights ({getattr(exc, 'reason', exc)})"}
    finally:
        if own:
            shutil.rmtree(report_dir, ignore_errors=True)
    return merge_served(files if len(files) >= len(results) else results)


NO_DTYPE = "the server reports no dtype (started without tbhpc's worker extension), so its weights cannot be digested"


def check_weights(server: ServerClient, model: str, version: str, want: dict | None, fp: Fingerprint | None, tol: float,
                  previous: Fingerprint | None = None, report_dir: Path | None = None, replicas: int = 0,
                  adapter: bool = False) -> Verdict:
    """Identity (`want`: the published digest in the served dtype, of the model or with `adapter`
    of the LoRA adapter; None when the server reports no dtype, so it cannot digest either), then
    the probe (through the served name: the adapted model under LoRA)."""
    digest = (compare_replicas(want, served_digest(server, report_dir, replicas, adapter)) if want is not None
              else DigestCheck("", unsupported=NO_DTYPE))
    probe = check_server(server, model, fp, version, tol) if fp is not None else None
    prev = None
    if probe is not None and previous is not None and previous.tokens == fp.tokens:
        prev = distance(probe.served, previous.logprobs)
    return Verdict(digest, probe, prev)


# --- `tbhpc serve-check` ---------------------------------------------------------------------------

def check_endpoint(run: Path | None = None, url: str | None = None, model: str = "", checkpoint: Path | None = None,
                   tol: float = 0.0, token_file: Path | None = None) -> tuple[Verdict, str]:
    """(the verdict, where its reference came from). RUN: the run's endpoint (and its token) and
    the ready marker of the version the server reports (or the run's model directory for `base`);
    URL: a server of your own (its token in `token_file`, if it wants one), compared with
    `checkpoint`, fingerprinted and digested here."""
    if run is not None:
        ep = read_endpoint(run)
        server, model = ep.client(), model or ep.model
    else:
        server = ServerClient.at(url, token_file)
    _reachable(server, f"serve-check {run}" if run is not None else "serve-check --url")
    if run is None:
        model = model or _first_model(server)
    version, dtype = _served_version(server, model), _served_dtype(server)
    adapter = False
    if checkpoint is not None:
        (fp, digests), source = _reference_of(checkpoint, dtype), str(checkpoint)
    elif run is not None:
        fp, digests, source, adapter = _run_reference(run, version, ep.model_path, dtype)
    else:
        raise UserError("serve-check --url: --checkpoint DIR (the weights it should serve) is required")
    tol = tol or max(default_tol(fp.dtype), default_tol(dtype))
    want = (digests or {}).get(dtype) if dtype else None
    verdict = check_weights(server, model, version, want, fp, tol, adapter=adapter)
    if dtype and want is None:
        verdict.digest = DigestCheck(dtype, mismatch=f"the reference has no digest for {dtype} (only "
                                                     f"{', '.join(digests or {}) or 'none'})")
    return verdict, source


def _reference_of(path: Path | str, dtype: str) -> tuple[Fingerprint, dict]:
    model, tok = load_checkpoint(str(path))
    return compute_fingerprint(model, tok), model_digests(model, [dtype] if dtype else served_dtypes(None, "float32"))


def _run_reference(run: Path, version: str, model_path: str, dtype: str) -> tuple[Fingerprint, dict, str, bool]:
    """(fingerprint, digests, where they came from, whether they are of a LoRA adapter)."""
    claimed = version.removeprefix(UNVERIFIED).removeprefix(REJECTED)
    try:
        step = version_step(claimed)
    except ValueError:
        raise UserError(f"serve-check {run}: the server reports version {version!r}, which names no checkpoint") from None
    if step == 0:
        return (*_reference_of(model_path, dtype), model_path, False)
    pub = published(run, step)
    if pub is None:
        raise UserError(f"serve-check {run}: no ready marker for {claimed} under {run}/checkpoints")
    adapter = pub.weights == "adapter"
    if (not pub.fingerprint or not pub.digests) and not adapter:
        return (*_reference_of(pub.path, dtype), str(pub.path), False)
    if not pub.fingerprint or not pub.digests:
        raise UserError(f"serve-check {run}: the marker of {claimed} (a LoRA adapter) has no fingerprint or digest")
    return Fingerprint.from_json(pub.fingerprint), pub.digests, f"{claimed} marker", adapter


def _reachable(server: ServerClient, who: str) -> None:
    """One line when nothing answers at the server's URL (a dead server, a wrong port or host) or
    it refuses our token."""
    try:
        server.get("/v1/models", timeout=10.0)
    except urllib.error.HTTPError as exc:
        if exc.code == 401:
            fix = "the run's token file is not the one it was started with" if server.token else "give --token-file"
            raise UserError(f"{who}: {server.base_url} refused the request (401 unauthorized: {fix})") from None
        raise InfraError(f"{who}: {server.base_url}/v1/models answered {exc.code} {exc.reason}") from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise InfraError(f"{who}: no vLLM server answers at {server.base_url} ({reason})") from None


def _first_model(server: ServerClient) -> str:
    data = server.get("/v1/models").get("data") or []
    if not data:
        raise UserError(f"serve-check: {server.base_url}/v1/models lists no model")
    return data[0]["id"]


def _served_dtype(server: ServerClient) -> str:
    """The dtype the engine computes in, from tbhpc's worker extension; '' (the loosest
    tolerance applies, no digest) on a server without it."""
    try:
        results = server.post("/collective_rpc", {"method": "tbhpc_kernel_paths"}).get("results") or []
        return merge_reports(results)["dtype"]
    except Exception:
        return ""


def _served_version(server: ServerClient, model: str) -> str:
    """The weight version the server reports (tbhpc's middleware on /v1/models, else vLLM's
    dev-mode /weight_info), or 'unknown'."""
    try:
        for card in server.get("/v1/models").get("data") or []:
            if card.get("id") == model and card.get("weight_version"):
                return str(card["weight_version"])
        return str(server.get("/weight_info")["weight_version"])
    except Exception:  # a server without either route still gets checked
        return "unknown"
