#!/usr/bin/env bash
# Part `serve` of bench/gpu_check.sh (needs a CUDA vLLM environment: TBHPC_VLLM_PYTHON): serves a small
# model with `tbhpc serve` on the GPU, runs a short eval (openai policy) and probe (token-exact policy)
# through it, publishes a checkpoint and times the verified weight sync (probe error of bf16 on the GPU
# against an fp32 fingerprint, exact digests of every served tensor) and the digest's rate on the GPU (and
# its equality with the CPU's), runs `tbhpc serve-check`, measures tokens/s (bench/serve_throughput.py).
#   bash bench/gpu/serve.sh [MODEL_DIR]        # default: build/models/smollm2-135m, else a tiny model
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${TBHPC_PY:-.venv/bin/python}
export TBHPC_VLLM_PYTHON=${TBHPC_VLLM_PYTHON:-$PWD/.venv-vllm/bin/python}
OUT=${OUT:-$(mktemp -d)}
RUN=$OUT/gpu-serve
MODEL=${1:-build/models/smollm2-135m}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
"$TBHPC_VLLM_PYTHON" -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.cuda.is_available())"
if [ ! -f "$MODEL/config.json" ]; then
  MODEL=$OUT/tiny-qwen3
  "$PY" -c "from tbhpc.policy.tiny import build_tiny_model; build_tiny_model('$MODEL')"
fi
echo "model: $MODEL"

"$PY" -m tbhpc.cli serve "$RUN" "model=$MODEL" device=cuda gpu_memory_utilization=0.5 max_model_len=8192 \
  tool_call_parser=hermes poll_s=0.2 > "$OUT/serve.log" 2>&1 &
SERVE=$!
trap 'kill -TERM $SERVE 2>/dev/null; wait $SERVE 2>/dev/null || true' EXIT
for _ in $(seq 600); do [ -f "$RUN/endpoint.json" ] && break; kill -0 $SERVE || { cat "$OUT/serve.log"; exit 1; }; sleep 1; done
grep "ready in" "$OUT/serve.log"

"$PY" -m tbhpc.cli eval --out "$OUT/eval" limit=20 repeats=1 workers=8 policy=openai \
  "policy_opts={endpoint: $RUN, sampling: {max_tokens: 256}}" | tail -1
"$PY" -m tbhpc.cli probe --out "$OUT/probe" limit=10 repeats=2 workers=8 policy=tokens \
  "policy_opts={endpoint: $RUN, max_tokens: 256, response_budget: 1024}" | tail -1

"$PY" - "$RUN" "$MODEL" <<'PY'
import sys, time
from transformers import AutoModelForCausalLM, AutoTokenizer
from tbhpc.serve.checkpoints import publish_checkpoint, read_syncs
from tbhpc.serve.endpoint import wait_for_version
run, model = sys.argv[1], sys.argv[2]
m, tok = AutoModelForCausalLM.from_pretrained(model), AutoTokenizer.from_pretrained(model)
t0 = time.time()
publish_checkpoint(run, 1, m, tok)          # fp32 fingerprint on the CPU; the server computes in bf16 on the GPU
wait_for_version(run, "step-000001", timeout_s=600)
s = read_syncs(run)[-1]
print(f"weight sync: publish->served {time.time() - t0:.2f} s (server side {s['sync_s']:.2f} s, mode {s['mode']}, "
      f"kernels {s['kernels']}); verified {s['verified']}: probe mean |dlogprob| {s['probe_mean_err']:.2e} "
      f"max {s['probe_max_err']:.2e} (tolerance {s['probe_tol']}), check {s['check_s']:.3f} s; digest "
      f"{'identical' if s['digest_equal'] else 'DIFFERS'} over {s['digest_tensors']} tensors in {s['digest_s']:.3f} s")
PY
# the exact digest's rate on the GPU (what a 27B bf16 sync's identity check costs: 54 GB at this rate)
"$TBHPC_VLLM_PYTHON" - <<'PY'
import sys, time, torch
sys.path.insert(0, "tbhpc/serve/vllm_ext")
from tbhpc_digest import tensor_digest
x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)      # 2 GiB
tensor_digest(x[: 1 << 20]); torch.cuda.synchronize()
t0 = time.perf_counter(); d = tensor_digest(x); torch.cuda.synchronize(); s = time.perf_counter() - t0
assert d == tensor_digest(x.cpu()), "GPU and CPU digests differ"
print(f"digest on {torch.cuda.get_device_name()}: {x.numel() * 2 / s / 1e9:.1f} GB/s (2 GiB bf16 in {s:.3f} s); "
      f"27B bf16 (54 GB): ~{54e9 / (x.numel() * 2 / s):.1f} s; equal to the CPU digest")
PY
"$PY" -m tbhpc.cli serve-check "$RUN"
kill -TERM $SERVE; wait $SERVE || true; trap - EXIT
"$PY" bench/serve_throughput.py --device cuda --model "$MODEL" --max-tokens 256 --prompts 32

