"""`tbhpc serve RUN`: keep one policy server alive for a run and apply weight syncs, each one verified.

The loop: start vLLM on the newest published checkpoint (or the base model), wait for `/health`,
publish `RUN/endpoint.json`; then poll `RUN/checkpoints/` and, for each newer ready marker (or a
trainer's open broadcast offer, received in place: broadcast.py, then checked the same way):
1. load it in place (`tbhpc_reload`: vLLM's reload + re-packing of CPU kernel copies) or, with
   `sync_mode=restart`, start a fresh server on it; the server says `unverified:step-N` meanwhile;
2. check it (`verify.check_weights`): the digests of every tensor the server now holds, in the
   dtype it computes in, must equal the marker's exactly, and the checkpoint's probe scored
   through the server must be within the dtype's tolerance; a reload that fails is retried as a
   restart (exact by construction), and a restart that fails too is refused: the server then
   says `rejected:step-N`, endpoint.json too, and nothing is announced;
3. only a match announces `step-N`. Every sync (timings, kernel paths, both checks' figures) is
   appended to `RUN/logs/weight_sync.jsonl`.
SIGTERM/SIGINT (Slurm ending the job, Ctrl-C) stop the server by PID and remove the endpoint file.
The server answers only requests carrying the run's token (auth.py, made here if the run has none);
endpoint.json names the token's file for every client.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

from tbhpc.errors import EndpointError, UserError
from tbhpc.serve.auth import ensure_token
from tbhpc.serve.broadcast import Offer, latest_offer
from tbhpc.serve.checkpoints import (BASE_VERSION, REJECTED, UNVERIFIED, Published, latest_ready, published,
                                     record_sync, version_step)
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.endpoint import Endpoint, remove_endpoint, write_endpoint
from tbhpc.serve.fingerprint import Fingerprint, default_tol, distance, served_logprobs
from tbhpc.serve.server import UnjoinedGroup, UntrustedGroup, VLLMServer
from tbhpc.serve.verify import Verdict, check_weights

__all__ = ["Supervisor", "version_step", "BASE_VERSION"]


def resolve_device(cfg: ServeConfig) -> ServeConfig:
    """`auto` is the device the vLLM environment was built for; a device the build cannot run on is
    refused in one line (a CPU build on a GPU node would serve, slowly, on the node's CPUs)."""
    from tbhpc.serve.server import vllm_build
    build, what = vllm_build(cfg.python)
    if cfg.device == "auto":
        return replace(cfg, device=build or ("cuda" if shutil.which("nvidia-smi") else "cpu"))
    if build and build != cfg.device:
        fix = "VLLM_BUILD=cuda make env-vllm" if cfg.device == "cuda" else "VLLM_BUILD=cpu make env-vllm"
        raise UserError(f"serve config: field 'device' is {cfg.device} but the vLLM environment {cfg.python} is the "
                        f"{build} build ({what}); build it with `{fix}` (or point field 'python' at another one)")
    return cfg


class SyncRefused(Exception):
    """The served weights are not the checkpoint's (digest or probe), or it carries nothing to check them by."""

    def __init__(self, reason: str, verdict: Verdict | None = None):
        super().__init__(reason)
        self.verdict = verdict


class Supervisor:
    def __init__(self, run_dir: Path | str, cfg: ServeConfig, log=print):
        cfg.validate()
        self.run, self.cfg, self.log = Path(run_dir), resolve_device(cfg), log
        self.token_file = ensure_token(self.run)     # every client of the server must present it
        self.stop_event = threading.Event()
        self.server: VLLMServer | None = None
        self.endpoint: Endpoint | None = None
        self.current: Published | None = None
        self.untrusted_at = float("-inf")      # the last offer whose group a stranger joined: not retried
        self.kernels: dict = {}

    def publish_host(self) -> str:
        return socket.gethostname() if self.cfg.host in ("0.0.0.0", "::") else self.cfg.host

    def start(self) -> Endpoint:
        pub = latest_ready(self.run, loadable=True)
        model = str(pub.path) if pub and pub.weights == "full" and not self.cfg.lora_rank else self.cfg.model
        self.current = pub
        self._launch(model, port=0)
        self.endpoint = Endpoint(self.publish_host(), self.server.port, self.cfg.served_model_name, BASE_VERSION,
                                 model_path=str(Path(model).resolve()), pid=self.server.proc.pid,
                                 job_id=_job_id(), started_at=self.server.started_at,
                                 dtype=self.kernels.get("dtype", ""), device=self.cfg.device,
                                 workers=self.cfg.tensor_parallel_size * self.cfg.data_parallel_size,
                                 token_file=str(self.token_file))
        ready = time.time() - self.server.started_at
        if pub is None:
            self._announce(BASE_VERSION)
        else:   # a restarted serve job resumes on the newest checkpoint: verified like any sync
            self.server.set_version(UNVERIFIED + pub.version)
            try:
                self._expect(pub)
                if pub.weights == "adapter":
                    self._load_adapter_at_start(pub)
                check = self.verify(pub)
                self._announce(pub.version)
            except SyncRefused as exc:
                check = None
                self._refuse(pub, exc, {"mode": "start"})
            if check is not None:
                self.log(f"serve: {check.summary()}")
        self.log(f"serve: ready in {ready:.1f} s at {self.endpoint.openai_url} serving {self.endpoint.version} "
                 f"(kernels {_paths(self.kernels)})")
        return self.endpoint

    def _load_adapter_at_start(self, pub: Published) -> None:
        """The newest adapter into a (re)started LoRA server; a load that fails is that step refused,
        not the serve job ended (the base keeps serving under `rejected:step-N`)."""
        try:
            self.server.load_adapter(str(pub.path), UNVERIFIED + pub.version)
        except Exception as exc:
            raise SyncRefused(f"loading the adapter failed ({type(exc).__name__}: {exc})") from None

    def _launch(self, model: str, port: int) -> None:
        self.server = VLLMServer(self.cfg, model, self.run / "logs" / "vllm-server.log", port=port,
                                 token_file=str(self.token_file)).start()
        self.log(f"serve: starting vLLM ({self.cfg.device}) on {model} port {self.server.port} (pid {self.server.proc.pid})")
        self.server.wait_ready(should_stop=self.stop_event.is_set)
        if self.cfg.lora_rank:      # the served name answers at once: the base through a null adapter
            from tbhpc.serve.adapter import write_null_adapter
            self.server.register_adapter(str(write_null_adapter(self.run / "serve" / "null-adapter", self.cfg.model)))
        try:
            self.kernels = self.server.kernel_report()
        except Exception as exc:   # a server without the worker extension: verification still works
            self.kernels = {"error": f"{type(exc).__name__}: {exc}"}
        try:   # the first request of a fresh engine pays its one-off set-up (~2 s here): not the check
            served_logprobs(self.server.client, self.cfg.served_model_name, [0, 1, 2, 3])
        except EndpointError as exc:
            self.log(f"serve: warm-up request failed ({exc})")

    def _announce(self, version: str) -> None:
        self.server.set_version(version)
        self.endpoint.version = version
        write_endpoint(self.run, self.endpoint)

    def sync_if_new(self) -> dict | None:
        """The newest publication since the one served: an open broadcast offer (joined at once: the
        trainer is waiting), else a checkpoint on disk. Newer means published later, not a higher
        step: a trainer resumed from an earlier DeepSpeed checkpoint publishes that step again."""
        since = self.current.published_at if self.current is not None else float("-inf")
        if self.cfg.sync_mode == "reload" and (offer := latest_offer(self.run, newer_than=max(since, self.untrusted_at))) is not None:
            return self.receive(offer)
        pub = latest_ready(self.run, loadable=True)
        if pub is None or pub.published_at <= since:
            return None
        return self.sync(pub)

    def receive(self, offer: Offer, marker_timeout_s: float = 120.0) -> dict:
        """A broadcast sync: every worker receives and loads the trainer's stream, then the ready
        marker the trainer writes when the stream ends is checked like any sync. A stream that
        breaks leaves the server's weights unknown: refused, loudly (the trainer's wait fails)."""
        t0, provisional = time.time(), UNVERIFIED + offer.version
        previous = self.current
        try:
            report = self.server.receive(offer, provisional)
        except UntrustedGroup as exc:   # nothing was sent (not trusted, or not formed): keep serving, wait for the files
            self.untrusted_at = offer.offered_at
            key, what = ("unjoined", "did not happen") if isinstance(exc, UnjoinedGroup) else ("untrusted", "was not trusted")
            entry = {"version": offer.version, "transport": "broadcast", "mode": "broadcast", key: str(exc),
                     "verified": False, "served_as": self.endpoint.version}
            record_sync(self.run, entry)
            self.log(f"serve: WARNING: the broadcast of {offer.version} {what} ({exc}); still serving "
                     f"{self.endpoint.version}")
            return entry
        except Exception as exc:    # the trainer vanished mid-stream, a worker failed: nothing to announce
            pub = Published(offer.step, None, offer.offered_at, transport="broadcast")
            self.current = pub
            return self._refuse(pub, SyncRefused(f"the broadcast of {offer.version} failed ({type(exc).__name__}: "
                                                 f"{exc})"), {"mode": "broadcast", "sync_s": round(time.time() - t0, 4)})
        received = time.time()
        pub = _await_marker(self.run, offer, marker_timeout_s, self.stop_event)
        if pub is None:
            pub = Published(offer.step, None, offer.offered_at, transport="broadcast")
            self.current = pub
            return self._refuse(pub, SyncRefused(f"no ready marker for {offer.version} within {marker_timeout_s:.0f} s "
                                                 "of its broadcast"), {"mode": "broadcast"})
        self.current = pub
        entry = {"attempts": [], "transport": "broadcast",
                 "broadcast": {"bytes": int(report.get("bytes", 0)), "join_s": report.get("join_s"),
                               "receive_s": report.get("receive_s"), "workers": offer.world - 1,
                               "gb_per_s": round(report.get("bytes", 0) / max(report.get("receive_s") or 1e-9, 1e-9) / 1e9, 3)},
                 "reload": {k: report[k] for k in ("refreshed", "reload_s", "refresh_s") if k in report}}
        try:
            check = self.verify(pub, previous)
        except SyncRefused as exc:      # no files to restart on: refused at once
            entry.update(mode="broadcast", sync_s=round(time.time() - t0, 4))
            return self._refuse(pub, exc, entry, previous)
        return self._accept(pub, previous, check, "broadcast", t0, entry, received_at=received)

    def sync(self, pub: Published) -> dict:
        assert self.server is not None and self.endpoint is not None
        t0, mode, entry = time.time(), self.cfg.sync_mode, {"attempts": []}
        previous, self.current = self.current, pub
        provisional = UNVERIFIED + pub.version
        check: Verdict | None = None
        try:
            self._expect(pub)
            self._references(pub)
        except SyncRefused as exc:          # nothing to check it against: not loaded at all
            return self._refuse(pub, exc, {**entry, "mode": "none"}, previous)
        if pub.weights == "adapter":
            return self._sync_adapter(pub, previous, t0, entry)
        if mode == "reload":
            try:
                report = self.server.reload(str(pub.path), provisional, self.cfg.reload_method)
                entry["reload"] = {k: report[k] for k in ("refreshed", "reload_s", "refresh_s") if k in report}
                check = self.verify(pub, previous)
            except SyncRefused as exc:
                if self.stop_event.is_set():
                    return self._abandon(pub)
                if self.cfg.on_mismatch == "refuse":
                    entry.update(mode=mode, sync_s=round(time.time() - t0, 4))
                    return self._refuse(pub, exc, entry, previous)
                entry["attempts"].append({"mode": "reload", "error": str(exc)})
                self.log(f"serve: in-place reload of {pub.version} does not serve the published weights ({exc}); "
                         "restarting on the checkpoint")
                mode = "restart"
            except Exception as exc:  # a loader without in-place reload, stale kernel copies: fall back, say so
                entry["attempts"].append({"mode": "reload", "error": f"{type(exc).__name__}: {exc}"})
                self.log(f"serve: in-place reload failed ({type(exc).__name__}: {exc}); restarting instead")
                mode = "restart"
        if mode == "restart" and self.stop_event.is_set():
            return self._abandon(pub)
        if mode == "restart":
            self.server.stop()
            self._launch(str(pub.path), port=self.endpoint.port)
            self.endpoint.pid, self.endpoint.model_path = self.server.proc.pid, str(pub.path)
            self.endpoint.dtype = self.kernels.get("dtype", "")
            self.server.set_version(provisional)
            try:
                check = self.verify(pub, previous)
            except SyncRefused as exc:
                entry.update(mode=mode, sync_s=round(time.time() - t0, 4))
                return self._refuse(pub, exc, entry, previous)
        return self._accept(pub, previous, check, mode, t0, entry)

    def _sync_adapter(self, pub: Published, previous: Published | None, t0: float, entry: dict) -> dict:
        """A LoRA sync: the step's adapter replaces the served one in place, then the same check (the
        digest of the adapter tensors the server holds, the probe through the adapted model). A
        failed check loads the adapter once more into a fresh server (on_mismatch=restart)."""
        from tbhpc.serve.adapter import WEIGHTS_FILE
        provisional = UNVERIFIED + pub.version
        entry.update(weights="adapter", adapter={"bytes": (pub.path / WEIGHTS_FILE).stat().st_size})
        tried = "adapter"
        for mode in ("adapter", "restart"):
            if mode == "restart":
                if self.cfg.on_mismatch == "refuse" or self.stop_event.is_set():
                    break
                tried = mode
                self.log(f"serve: the adapter of {pub.version} is not served exactly ({entry['attempts'][-1]['error']}); "
                         "loading it into a fresh server")
                self.server.stop()
                self._launch(self.cfg.model, port=self.endpoint.port)
                self.endpoint.pid = self.server.proc.pid
            try:
                report = self.server.load_adapter(str(pub.path), provisional)
                entry["adapter"].update(load_s=report["load_s"])
                check = self.verify(pub, previous)
            except SyncRefused as exc:
                refusal = exc
            except Exception as exc:        # the load itself failed (an unreadable adapter, a worker error)
                refusal = SyncRefused(f"loading the adapter failed ({type(exc).__name__}: {exc})")
            else:
                return self._accept(pub, previous, check, mode, t0, entry)
            if self.stop_event.is_set():
                return self._abandon(pub)
            entry["attempts"].append({"mode": mode, "error": str(refusal)})
        entry.update(mode=tried, sync_s=round(time.time() - t0, 4))
        return self._refuse(pub, refusal, entry, previous)

    def _abandon(self, pub: Published) -> dict:
        """Slurm is ending the job, and its SIGTERM may have reached vLLM first (the end of a run
        cancels its serving job while the last step's sync may still run): a sync that fails now says
        nothing about the weights, so it is abandoned, neither recorded as refused nor restarted."""
        self.log(f"serve: stopping; the sync of {pub.version} is abandoned")
        return {"version": pub.version, "abandoned": True}

    def _expect(self, pub: Published) -> None:
        """A LoRA server takes adapters, any other server full checkpoints: the other kind is refused."""
        want = "adapter" if self.cfg.lora_rank else "full"
        if pub.weights != want:
            fix = ("publish adapters (the run's lora_sync: adapter)" if self.cfg.lora_rank
                   else "serve with lora_rank > 0")
            raise SyncRefused(f"{pub.version} is {'an adapter' if pub.weights == 'adapter' else 'a full checkpoint'} "
                              f"but this server serves {'LoRA adapters' if self.cfg.lora_rank else 'full weights'}; {fix}")

    def _accept(self, pub: Published, previous: Published | None, check: Verdict | None, mode: str, t0: float,
                entry: dict, received_at: float | None = None) -> dict:
        provisional = UNVERIFIED + pub.version
        served = self.server.weight_version()
        if served != provisional:
            raise EndpointError(f"weight sync: server reports {served!r} after loading {pub.version!r}")
        done = time.time()
        entry.update({"version": pub.version, "step": pub.step, "mode": mode, "sync_s": round(done - t0, 4),
                      "lag_s": round(done - pub.published_at, 4), "published_at": pub.published_at,
                      "served_at": done, "path": str(pub.path) if pub.path else None, "kernels": self.kernels})
        if received_at is not None:
            entry["check_wait_s"] = round(done - received_at, 4)
        entry.update(check.to_json() if check else {"verified": None})
        entry.update(self._step_delta(pub, previous))
        record_sync(self.run, entry)        # logged before announced: whoever sees step-N finds its line
        self._announce(pub.version)
        how = f"verified: {check.summary()}" if check else "NOT verified (verify=false)"
        self.log(f"serve: now serving {pub.version} ({mode} {entry['sync_s']:.2f} s, {entry['lag_s']:.2f} s after "
                 f"publish; {how})")
        return entry

    def verify(self, pub: Published, previous: Published | None = None) -> Verdict | None:
        """Digest and probe the server against the checkpoint; raise SyncRefused on a mismatch."""
        refs = self._references(pub)
        if refs is None:
            return None
        want, fp = refs
        tol = self.cfg.verify_tol or max(default_tol(fp.dtype), default_tol(self.kernels.get("dtype")))
        prev = _fingerprint_of(previous)
        verdict = check_weights(self.server.client, self.cfg.served_model_name, self.server.weight_version(), want,
                                fp, tol, prev, report_dir=self.run / "logs" / ".digests",
                                replicas=self.cfg.data_parallel_size, adapter=pub.weights == "adapter")
        if not verdict.passed:
            raise SyncRefused(verdict.summary(), verdict)
        return verdict

    def _references(self, pub: Published) -> tuple[dict | None, Fingerprint] | None:
        """(the marker's digest in the served dtype, its fingerprint); None when verify is off.
        SyncRefused when the marker lacks either. The digest is None only when the server reports
        no dtype (started without tbhpc's worker extension): the check then fails, saying so."""
        if not self.cfg.verify:
            return None
        fp = _fingerprint_of(pub)
        if fp is None:
            raise SyncRefused(f"{pub.version} has no usable fingerprint in its ready marker (publish with "
                              "publish_checkpoint or mark_ready, or serve with verify=false)")
        dtype = self.kernels.get("dtype")
        if not dtype:
            return None, fp
        digests = pub.digests or {}
        if not isinstance(digests.get(dtype), dict):
            raise SyncRefused(f"{pub.version}: its ready marker has no weight digest for {dtype}, the dtype this "
                              f"server computes in (it has: {', '.join(digests) or 'none'}); publish with "
                              "publish_checkpoint or mark_ready after the server wrote endpoint.json, "
                              "or serve with verify=false")
        return digests[dtype], fp

    def _refuse(self, pub: Published, refusal: SyncRefused, entry: dict, previous: Published | None = None) -> dict:
        """Leave `rejected:step-N` on the server and in endpoint.json; record why, loudly."""
        version = REJECTED + pub.version
        reason = str(refusal)
        entry.update({"version": pub.version, "step": pub.step, "verified": False, "served_as": version,
                      "error": reason, "published_at": pub.published_at, "path": str(pub.path) if pub.path else None,
                      "kernels": self.kernels})
        if refusal.verdict is not None:     # every figure: errors measured, tolerance, digest result
            entry.update({k: v for k, v in refusal.verdict.to_json().items() if k != "verified"})
        entry.update(self._step_delta(pub, previous))
        record_sync(self.run, entry)        # logged before announced: wait_for_version quotes this line
        self._announce(version)
        msg = f"serve: ERROR: weight sync to {pub.version} REFUSED: {reason}; the server says {version}"
        self.log(msg)
        print(msg, file=sys.stderr, flush=True)
        return entry

    @staticmethod
    def _step_delta(pub: Published, previous: Published | None) -> dict:
        """How far this step moved the probe (fingerprints alone): a check can only tell apart
        two versions whose fingerprints differ by more than its tolerance."""
        a, b = _fingerprint_of(previous), _fingerprint_of(pub)
        if a is None or b is None or a.tokens != b.tokens:
            return {}
        return {"step_delta": round(distance(a.logprobs, b.logprobs)[1], 6)}

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


def _await_marker(run: Path, offer: Offer, timeout_s: float, stop: threading.Event) -> Published | None:
    """The ready marker the trainer writes once its broadcast of `offer` ended (None: not in time)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not stop.is_set():
        pub = published(run, offer.step)
        if pub is not None and pub.transport == "broadcast" and pub.published_at >= offer.offered_at:
            return pub
        time.sleep(0.05)
    return None


def _fingerprint_of(pub: Published | None) -> Fingerprint | None:
    if pub is None or not pub.fingerprint:
        return None
    try:
        return Fingerprint.from_json(pub.fingerprint)
    except (KeyError, TypeError, ValueError):
        return None


def _paths(kernels: dict) -> str:
    if "error" in kernels:
        return "unknown"
    return ", ".join(f"{k}×{n}" for k, n in sorted((kernels.get("paths") or {}).items())) + f" ({kernels.get('dtype', '?')})"


def _job_id() -> str:
    return os.environ.get("SLURM_JOB_ID", "")
