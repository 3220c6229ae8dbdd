"""Verified weight syncs without a server: fingerprints, ready markers, trusted versions, waiting for
a version, and the supervisor's decisions (reload -> check -> restart -> check -> refuse).

The supervisor tests replace the vLLM process with `FakeServer` (it records what it "loaded"; its
digest RPC reports that checkpoint's digest, or another one for a damaged copy, and its probe
score is set per case) because a real server takes a minute to start; the real thing, with real
kernels and real mismatches, is tests/test_vllm.py. Everything else is real: the comparison of
digests, markers on disk, endpoint.json, logs/weight_sync.jsonl.
"""
import json
import threading
import time
from dataclasses import dataclass, field

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tbhpc.errors import EndpointError, UserError
from tbhpc.policy.generation import recompute_logprobs
from tbhpc.serve import supervisor as sup_mod
from tbhpc.serve import verify as verify_mod
from tbhpc.serve.checkpoints import (latest_ready, mark_ready, publish_checkpoint, published, read_syncs,
                                     trusted_version, version_step)
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.digest import model_digests
from tbhpc.serve.endpoint import Endpoint, read_endpoint, wait_for_version, write_endpoint
from tbhpc.serve.fingerprint import Check, Fingerprint, compute_fingerprint, default_tol, distance, probe_tokens


@pytest.fixture(scope="module")
def model_a(tiny_dir):
    return AutoModelForCausalLM.from_pretrained(tiny_dir), AutoTokenizer.from_pretrained(tiny_dir)


def test_fingerprint_is_the_models_own_logprobs_on_a_fixed_probe(model_a, tiny_dir_b):
    model, tok = model_a
    fp = compute_fingerprint(model, tok)
    assert fp.tokens == probe_tokens(tok) and 32 <= len(fp.tokens) <= 64 and fp.dtype == "float32"
    assert fp.logprobs == pytest.approx(recompute_logprobs(model, fp.tokens, 1), abs=1e-6)
    assert Fingerprint.from_json(json.loads(json.dumps(fp.to_json()))) == fp
    other = compute_fingerprint(AutoModelForCausalLM.from_pretrained(tiny_dir_b), tok)
    assert distance(fp.logprobs, other.logprobs)[1] > 10 * default_tol("float32")   # it tells weights apart
    raw = probe_tokens(None, vocab_size=500)                                          # no tokenizer: a fixed walk
    assert raw == probe_tokens(None, vocab_size=500) and max(raw) < 500
    with pytest.raises(ValueError, match="3 tokens but 1 logprobs"):
        Fingerprint.from_json({"tokens": [1, 2, 3], "logprobs": [0.0]})


def test_markers_carry_the_fingerprint_and_digests(tmp_path, model_a, tiny_dir):
    model, tok = model_a
    pub = publish_checkpoint(tmp_path, 4, model, tok)
    back = latest_ready(tmp_path)
    assert back == pub and published(tmp_path, 4) == pub and published(tmp_path, 5) is None
    assert Fingerprint.from_json(back.fingerprint) == compute_fingerprint(model, tok)
    # no server yet: digests in the checkpoint's dtype and in bf16; each one of what was written
    assert sorted(back.digests) == ["bfloat16", "float32"]
    assert back.digests["float32"]["tensors"] == model_digests(model, ["float32"])["float32"]["tensors"]
    # a directory written by other code: mark_ready fingerprints and digests it from disk, same figures,
    # in the dtype the run's server announced
    write_endpoint(tmp_path, Endpoint("127.0.0.1", 1, "policy", "base", dtype="bfloat16"))
    marked = mark_ready(tmp_path, 7, tiny_dir)
    fp = Fingerprint.from_json(marked.fingerprint)
    assert fp.tokens == back.fingerprint["tokens"] and distance(fp.logprobs, back.fingerprint["logprobs"])[0] < 1e-5
    assert list(marked.digests) == ["bfloat16"] and marked.digests["bfloat16"]["total"] == back.digests["bfloat16"]["total"]


def test_only_base_and_verified_steps_are_trusted():
    assert trusted_version("base") and trusted_version("step-000003") and version_step("step-000003") == 3
    for v in ("unverified:step-000003", "rejected:step-000003", "unknown", "step-", "mixed:base,step-000001"):
        assert not trusted_version(v)
        with pytest.raises(ValueError, match="not a verified step"):
            version_step(v)


def test_wait_for_version(tmp_path):
    ep = Endpoint("127.0.0.1", 1, "policy", "step-000002")
    write_endpoint(tmp_path, ep)
    assert wait_for_version(tmp_path, "step-000002", timeout_s=1).version == "step-000002"
    with pytest.raises(EndpointError, match="did not announce step-000003 within 0 s"):
        wait_for_version(tmp_path, "step-000003", timeout_s=0.3, poll_s=0.05)
    from tbhpc.serve.checkpoints import record_sync
    record_sync(tmp_path, {"version": "step-000003", "verified": False, "error": "FAIL: mean 0.4"})
    ep.version = "rejected:step-000003"
    write_endpoint(tmp_path, ep)
    with pytest.raises(EndpointError, match="refused weights step-000003: FAIL: mean 0.4"):
        wait_for_version(tmp_path, "step-000003", timeout_s=5)


def test_a_stop_ends_the_wait_for_a_version_early(tmp_path):
    """A trainer preempted while the server syncs (or before the server job started) stops waiting
    within a poll instead of sitting out sync_timeout_s; the version arriving still ends it as before."""
    write_endpoint(tmp_path, Endpoint("127.0.0.1", 1, "policy", "step-000001"))
    for run in (tmp_path, tmp_path / "no-server-yet"):
        stop = threading.Event()
        threading.Timer(0.3, stop.set).start()
        t0 = time.monotonic()
        assert wait_for_version(run, "step-000002", timeout_s=60, poll_s=0.05, stop=stop) is None
        assert 0.25 < time.monotonic() - t0 < 5
    assert wait_for_version(tmp_path, "step-000001", timeout_s=1, stop=threading.Event()).version == "step-000001"
    with pytest.raises(UserError, match="no endpoint file"):
        wait_for_version(tmp_path / "no-server-yet", "step-000001", timeout_s=0.2, poll_s=0.05)

# --- the supervisor's decisions, vLLM replaced by a fake process -------------------------------

@dataclass
class FakeProc:
    pid: int

    def poll(self):
        return None


@dataclass
class FakeServer:
    """Loads what it is told, except that a `vllm`-method reload keeps a stale copy (the CPU bug)."""
    loaded: str
    port: int = 9000
    version: str = "base"
    stale_reload: bool = False
    proc: FakeProc = field(default_factory=lambda: FakeProc(100))
    base_url: str = "http://fake"
    client: str = "client of http://fake"     # what check_weights is handed (the fakes below ignore it)
    started_at: float = 0.0
    stopped: bool = False

    skip_adapter_loads: int = 0               # adapter loads that keep the old adapter (a load that read nothing)

    def load_adapter(self, path, version):
        if self.skip_adapter_loads:
            self.skip_adapter_loads -= 1
        else:
            self.loaded = path
        self.version = version
        return {"load_s": 0.001}

    def reload(self, path, version, method):
        self.loaded = "stale" if (self.stale_reload and method == "vllm") else path
        self.version = version
        return {"refreshed": ["lm_head"]} if method == "tbhpc" else {}

    def set_version(self, v):
        self.version = v

    def weight_version(self):
        return self.version

    def stop(self):
        self.stopped = True


def _digest(path: str) -> str:
    return f"{abs(hash(path)) & (2**64 - 1):016x}"


def _supervisor(tmp_path, monkeypatch, stale_reload=False, corrupt=(), probe_err=None, dtype="float32", skip_adapter_loads=0,
                **cfg):
    """A Supervisor over FakeServers; `corrupt`: checkpoint paths whose weights on disk do not
    match their marker (a damaged copy): every server that loads them holds other digests.
    `probe_err`: the probe's mean error whatever is loaded (default: 0 on a match, 0.3 otherwise)."""
    servers = []
    s = sup_mod.Supervisor(tmp_path, ServeConfig(model="/base", device="cpu", **cfg), log=lambda m: None)

    def launch(model, port):
        s.server = FakeServer(model, port=port or 9000, stale_reload=stale_reload, proc=FakeProc(100 + len(servers)),
                              skip_adapter_loads=skip_adapter_loads if not servers else 0)
        servers.append(s.server)
        s.kernels = {"paths": {"onednn": 10}, "dtype": dtype}

    def served_digest(base_url, report_dir=None, replicas=0, adapter=False):
        held = s.server.loaded + ("#damaged" if s.server.loaded in corrupt else "")
        return {"dtype": dtype, "digest_s": 0.01, "tensors": {"w": {"shape": [2], "kernel": _digest(held)}}}

    def probe(base_url, model, fp, version, tol):
        ok = s.server.loaded == str(s.current.path) and s.server.loaded not in corrupt
        err = probe_err if probe_err is not None else (0.0 if ok else 0.3)
        return Check(version, 2 * err, err, tol, len(fp.logprobs), 0.01, [-1.0 - err, -2.0])

    monkeypatch.setattr(s, "_launch", launch)
    monkeypatch.setattr(verify_mod, "served_digest", served_digest)
    monkeypatch.setattr(verify_mod, "check_server", probe)
    s.start()
    return s, servers


def _publish(tmp_path, step, fingerprint=True, digests=("float32",), weights="full"):
    path = tmp_path / "checkpoints" / f"step-{step:06d}"
    path.mkdir(parents=True)
    (path / "adapter_model.safetensors").write_bytes(b"x" * 4096)
    fp = Fingerprint([1, 2, 3], [-1.0, -2.0], "float32") if fingerprint else None
    if fp is None:
        marker = tmp_path / "checkpoints" / f"step-{step:06d}.ready"
        marker.write_text(json.dumps({"step": step, "path": str(path), "published_at": 0.0}))
        return str(path)
    mark_ready(tmp_path, step, path, fp, {dt: {"dtype": dt, "tensors": {"w": _digest(str(path.resolve()))},
                                               "total": "t"} for dt in digests}, weights=weights)
    return str(path)


def _logged_when_announced(tmp_path, monkeypatch) -> list:
    """(version announced, versions in weight_sync.jsonl at that moment) for every endpoint write."""
    seen, write = [], sup_mod.write_endpoint

    def spy(run, ep):
        seen.append((ep.version, [e.get("version") for e in read_syncs(tmp_path)]))
        return write(run, ep)
    monkeypatch.setattr(sup_mod, "write_endpoint", spy)
    return seen


def test_an_exact_reload_is_checked_then_announced(tmp_path, monkeypatch):
    seen = _logged_when_announced(tmp_path, monkeypatch)
    s, servers = _supervisor(tmp_path, monkeypatch)
    assert read_endpoint(tmp_path).version == "base"
    _publish(tmp_path, 1)
    entry = s.sync_if_new()
    assert entry["mode"] == "reload" and entry["verified"] is True and entry["probe_version"] == "unverified:step-000001"
    assert entry["digest_equal"] is True and entry["digest_tensors"] == 1 and entry["digest_kernel_copies"] == 1
    assert entry["reload"] == {"refreshed": ["lm_head"]} and entry["kernels"]["paths"] == {"onednn": 10}
    assert read_endpoint(tmp_path).version == "step-000001" and len(servers) == 1
    assert s.sync_if_new() is None                                  # nothing newer: nothing happens
    assert seen[-1] == ("step-000001", ["step-000001"])             # its log line exists once it is announced


def test_an_inexact_reload_falls_back_to_a_restart_that_is_checked_too(tmp_path, monkeypatch):
    s, servers = _supervisor(tmp_path, monkeypatch, stale_reload=True, reload_method="vllm")
    path = _publish(tmp_path, 1)
    entry = s.sync_if_new()
    assert entry["mode"] == "restart" and entry["verified"] is True
    assert entry["attempts"][0]["mode"] == "reload" and entry["attempts"][0]["error"].startswith("FAIL")
    assert "digest: DIFFERS (float32): w (packed kernel copy" in entry["attempts"][0]["error"]
    assert len(servers) == 2 and servers[0].stopped and servers[1].loaded == path and servers[1].port == 9000
    ep = read_endpoint(tmp_path)
    assert ep.version == "step-000001" and ep.pid == 101 and ep.model_path == path


def test_a_lora_server_loads_each_adapter_in_place_and_checks_it(tmp_path, monkeypatch):
    """lora_rank > 0: the step's adapter replaces the served one in place (the base untouched), is
    digested and probed like any sync, and the record says it was an adapter and how many bytes."""
    s, servers = _supervisor(tmp_path, monkeypatch, lora_rank=4)
    path = _publish(tmp_path, 1, weights="adapter")
    entry = s.sync_if_new()
    assert (entry["mode"], entry["weights"], entry["verified"], entry["digest_equal"]) == ("adapter", "adapter", True, True)
    assert entry["adapter"] == {"bytes": 4096, "load_s": 0.001} and entry["attempts"] == []
    assert servers[0].loaded == path and len(servers) == 1
    ep = read_endpoint(tmp_path)
    assert ep.version == "step-000001" and ep.model_path == "/base"          # the base it started on, untouched


def test_an_adapter_load_that_did_not_take_is_loaded_into_a_fresh_server(tmp_path, monkeypatch):
    s, servers = _supervisor(tmp_path, monkeypatch, lora_rank=4, skip_adapter_loads=1)
    _publish(tmp_path, 1, weights="adapter")
    entry = s.sync_if_new()
    assert (entry["mode"], entry["verified"]) == ("restart", True) and len(servers) == 2 and servers[0].stopped
    assert entry["attempts"][0]["mode"] == "adapter" and "digest: DIFFERS" in entry["attempts"][0]["error"]
    refusing, _ = _supervisor(tmp_path / "r", monkeypatch, lora_rank=4, skip_adapter_loads=1, on_mismatch="refuse")
    _publish(tmp_path / "r", 1, weights="adapter")
    entry = refusing.sync_if_new()
    assert (entry["served_as"], entry["mode"]) == ("rejected:step-000001", "adapter")


def test_a_restarted_lora_server_loads_the_newest_adapter_or_refuses_it(tmp_path, monkeypatch):
    """A serve job (re)started mid-run starts on the base and loads the newest adapter, checked; an
    adapter that cannot be loaded is that step refused, and the job keeps serving."""
    path = _publish(tmp_path, 1, weights="adapter")
    s, servers = _supervisor(tmp_path, monkeypatch, lora_rank=4)
    assert read_endpoint(tmp_path).version == "step-000001" and servers[0].loaded == path
    broken = tmp_path / "b"
    _publish(broken, 1, weights="adapter")

    def fail(self, path, version):
        raise OSError("adapter_model.safetensors: truncated")
    monkeypatch.setattr(FakeServer, "load_adapter", fail)
    s, _ = _supervisor(broken, monkeypatch, lora_rank=4)
    entry = read_syncs(broken)[-1]
    assert read_endpoint(broken).version == "rejected:step-000001" and entry["mode"] == "start"
    assert entry["error"] == "loading the adapter failed (OSError: adapter_model.safetensors: truncated)"


@pytest.mark.parametrize("lora_rank, weights, message", [
    (0, "adapter", "step-000001 is an adapter but this server serves full weights; serve with lora_rank > 0"),
    (4, "full", "step-000001 is a full checkpoint but this server serves LoRA adapters; publish adapters"),
])
def test_a_server_refuses_the_other_kind_of_weights(tmp_path, monkeypatch, lora_rank, weights, message):
    s, servers = _supervisor(tmp_path, monkeypatch, lora_rank=lora_rank)
    _publish(tmp_path, 1, weights=weights)
    entry = s.sync_if_new()
    assert entry["served_as"] == "rejected:step-000001" and entry["error"].startswith(message), entry["error"]
    assert servers[0].loaded == "/base" and len(servers) == 1                # nothing was loaded


def test_a_checkpoint_that_never_matches_is_refused_not_announced(tmp_path, monkeypatch, capsys):
    seen = _logged_when_announced(tmp_path, monkeypatch)
    damaged = str(tmp_path / "checkpoints" / "step-000002")
    s, servers = _supervisor(tmp_path, monkeypatch, corrupt=(damaged,))
    _publish(tmp_path, 1)
    s.sync_if_new()
    _publish(tmp_path, 2)
    entry = s.sync_if_new()
    assert entry["verified"] is False and entry["served_as"] == "rejected:step-000002" and entry["mode"] == "restart"
    assert entry["probe_mean_err"] == 0.3 and entry["probe_tol"] == default_tol("float32")   # every figure kept
    assert entry["digest_equal"] is False and entry["digest_mismatch"].startswith("w (packed kernel copy")
    assert read_endpoint(tmp_path).version == "rejected:step-000002" == servers[-1].version
    assert "REFUSED" in capsys.readouterr().err
    assert [e["verified"] for e in read_syncs(tmp_path)] == [True, False]
    assert s.sync_if_new() is None                                  # refused once, not retried in a loop
    assert ("rejected:step-000002", ["step-000001", "step-000002"]) in seen   # logged before it is said
    with pytest.raises(EndpointError, match="refused weights step-000002"):
        wait_for_version(tmp_path, "step-000002", timeout_s=1)
    _publish(tmp_path, 3)                                           # the next good checkpoint recovers
    assert s.sync_if_new()["verified"] is True and read_endpoint(tmp_path).version == "step-000003"


def test_a_checkpoint_without_fingerprint_is_refused_unless_verify_is_off(tmp_path, monkeypatch):
    s, servers = _supervisor(tmp_path / "a", monkeypatch)
    _publish(tmp_path / "a", 1, fingerprint=False)
    entry = s.sync_if_new()
    assert entry["verified"] is False and "no usable fingerprint" in entry["error"] and entry["mode"] == "none"
    assert servers[0].loaded == "/base" and len(servers) == 1            # nothing loaded, nothing restarted
    assert read_endpoint(tmp_path / "a").version == "rejected:step-000001"
    s, _ = _supervisor(tmp_path / "b", monkeypatch, verify=False)
    _publish(tmp_path / "b", 1, fingerprint=False)
    entry = s.sync_if_new()
    assert entry["verified"] is None and read_endpoint(tmp_path / "b").version == "step-000001"


def test_a_server_that_never_reloaded_passes_the_probe_but_not_the_digest(tmp_path, monkeypatch):
    """The case the probe cannot catch: consecutive bf16 versions closer than its tolerance. A
    reload that kept the old weights scores within tolerance (0.05 < 0.1) yet is refused, and with
    on_mismatch=refuse nothing is restarted: the server says rejected:step-N at once."""
    s, servers = _supervisor(tmp_path, monkeypatch, stale_reload=True, reload_method="vllm", probe_err=0.05,
                             dtype="bfloat16", on_mismatch="refuse")
    _publish(tmp_path, 1, digests=("bfloat16",))
    entry = s.sync_if_new()
    assert entry["probe_mean_err"] <= entry["probe_tol"] == default_tol("bfloat16")    # the probe alone: "verified"
    assert entry["verified"] is False and entry["digest_equal"] is False and entry["mode"] == "reload"
    assert entry["error"].startswith("FAIL: serves unverified:step-000001") and "digest: DIFFERS" in entry["error"]
    assert "probe_prev_mean_err" not in entry                      # no previous version: nothing to compare with
    assert len(servers) == 1 and read_endpoint(tmp_path).version == "rejected:step-000001"
    with pytest.raises(EndpointError, match="refused weights step-000001: FAIL.*digest: DIFFERS"):
        wait_for_version(tmp_path, "step-000001", timeout_s=1)


def test_the_marker_must_carry_a_digest_in_the_served_dtype(tmp_path, monkeypatch):
    s, servers = _supervisor(tmp_path, monkeypatch, dtype="bfloat16")
    _publish(tmp_path, 1, digests=("float32",))
    entry = s.sync_if_new()
    assert entry["verified"] is False and entry["mode"] == "none" and servers[0].loaded == "/base"
    assert "no weight digest for bfloat16, the dtype this server computes in (it has: float32)" in entry["error"]
    with pytest.raises(UserError, match="field 'on_mismatch' must be restart or refuse"):
        ServeConfig(model="/m", on_mismatch="retry").validate()


def test_a_server_that_cannot_digest_everything_it_holds_is_refused(tmp_path, monkeypatch):
    """"Could not digest" is no pass: a replica or shard that did not report, a server without the
    worker extension. The probe still passes (same weights): only the digest refuses them."""
    s, _ = _supervisor(tmp_path, monkeypatch, on_mismatch="refuse")
    _publish(tmp_path, 1)
    assert s.sync_if_new()["verified"] is True
    monkeypatch.setattr(verify_mod, "served_digest",
                        lambda url, report_dir=None, replicas=0, adapter=False: {"unsupported": "no digest from replica 1 of 2 x 4 workers"})
    _publish(tmp_path, 2)
    entry = s.sync_if_new()
    assert entry["verified"] is False and entry["digest_equal"] is False and entry["probe_mean_err"] == 0.0
    assert "replica 1 of 2 x 4 workers" in entry["digest_unsupported"] and read_endpoint(tmp_path).version == "rejected:step-000002"
    s.kernels = {"error": "no worker extension"}                   # no dtype reported: no digest to ask for
    _publish(tmp_path, 3)
    entry = s.sync_if_new()
    assert entry["verified"] is False and "started without tbhpc's worker extension" in entry["digest_unsupported"]


def test_a_restarted_serve_job_checks_the_checkpoint_it_resumes_on(tmp_path, monkeypatch):
    _publish(tmp_path, 5)
    s, servers = _supervisor(tmp_path, monkeypatch)
    assert servers[0].loaded.endswith("step-000005") and read_endpoint(tmp_path).version == "step-000005"


def test_serve_config_and_check_command_errors(capsys):
    from tbhpc.cli import main
    with pytest.raises(UserError, match="field 'reload_method' must be tbhpc or vllm"):
        ServeConfig(model="/m", reload_method="nccl").validate()
    assert main(["serve-check"]) == 2 and "give either RUN or --url" in capsys.readouterr().err
    assert main(["serve-check", "/nonexistent-run"]) == 2 and "no endpoint file" in capsys.readouterr().err


def test_a_trainer_resumed_from_an_older_checkpoint_takes_the_server_back_to_it(tmp_path, monkeypatch):
    """checkpoint_every > 1: the trainer resumes from step 1 after publishing step 2, discards step 2
    and publishes step 1 again; the server follows the newer publication, though its step is lower."""
    s, _ = _supervisor(tmp_path, monkeypatch)
    _publish(tmp_path, 1)
    s.sync_if_new()
    _publish(tmp_path, 2)
    assert s.sync_if_new()["version"] == "step-000002"
    from types import SimpleNamespace

    from tbhpc.serve.broadcast import offer_path
    from tbhpc.train.loop import Trainer
    offer_path(tmp_path, 3).write_text("{}")              # an offer left by the run that stopped
    trainer = SimpleNamespace(run_path=tmp_path)
    assert Trainer._rewind_publications(trainer, 1) is True
    left = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert left == ["step-000001", "step-000001.ready"], left
    assert Trainer._rewind_publications(trainer, 1) is False    # nothing newer any more
    import shutil                                         # then the trainer publishes step 1 again
    (tmp_path / "checkpoints" / "step-000001.ready").unlink()
    shutil.rmtree(tmp_path / "checkpoints" / "step-000001")
    _publish(tmp_path, 1)
    entry = s.sync_if_new()
    assert entry["version"] == "step-000001" and entry["verified"] is True
    assert read_endpoint(tmp_path).version == "step-000001" and s.sync_if_new() is None


def test_a_wait_for_a_broadcast_version_fails_at_once_when_the_server_restarted_without_it(tmp_path):
    """A broadcast leaves no files: a server (re)started after it serves an older version for good, so
    the trainer's wait says so now instead of after sync_timeout_s."""
    fp = Fingerprint([1, 2, 3], [-1.0, -2.0], "float32")
    pub = mark_ready(tmp_path, 3, None, fp, {"float32": {"dtype": "float32", "tensors": {}, "total": ""}},
                     transport="broadcast")
    write_endpoint(tmp_path, Endpoint("127.0.0.1", 1, "policy", "step-000002", started_at=pub.published_at - 5))
    with pytest.raises(EndpointError, match="did not announce step-000003 within 0 s"):     # not restarted: waits
        wait_for_version(tmp_path, "step-000003", timeout_s=0.3, poll_s=0.05)
    write_endpoint(tmp_path, Endpoint("127.0.0.1", 1, "policy", "step-000002", started_at=pub.published_at + 5))
    t0 = time.monotonic()
    with pytest.raises(EndpointError, match="restarted after step-000003 was broadcast into it and serves step-000002"):
        wait_for_version(tmp_path, "step-000003", timeout_s=60, poll_s=0.05)
    assert time.monotonic() - t0 < 5


def test_a_sync_that_fails_while_the_job_is_ending_is_abandoned_not_refused(tmp_path, monkeypatch):
    """scancel reaches vLLM and the supervisor together (a run's end cancels its serving job while the
    last step's sync may still run): the failed load says nothing about the weights, so nothing is
    recorded as refused and no fresh server is started; before the signal, the same failure is refused."""
    for ending in (True, False):
        run = tmp_path / ("ending" if ending else "running")
        s, servers = _supervisor(run, monkeypatch, lora_rank=4)

        def gone(path, version):
            raise EndpointError("http://fake/v1/completions failed after 3 attempts: Connection refused")
        monkeypatch.setattr(servers[0], "load_adapter", gone)
        if ending:
            s.stop_event.set()
        _publish(run, 1, weights="adapter")
        entry = s.sync_if_new()
        if ending:
            assert entry == {"version": "step-000001", "abandoned": True} and len(servers) == 1
            assert read_syncs(run) == [] and read_endpoint(run).version == "base"
        else:
            assert entry["attempts"][0]["error"].startswith("loading the adapter failed") and len(servers) == 2
