#!/usr/bin/env bash
# GPU check of the serving path, prepared to run as one script whenever a GPU machine with vLLM
# is available (none is in CI): serves a small model with `tbhpc serve` on the GPU, runs a short
# eval (openai policy) and probe (token-exact policy) through it, publishes a checkpoint and
# times the verified weight sync (probe error of bf16 on the GPU against an fp32 fingerprint, exact
# digests of every served tensor) and the digest's rate on the GPU (and its equality with the CPU's),
# runs `tbhpc serve-check`, measures tokens/s (bench/serve_throughput.py --device cuda), then
# trains: two GRPO steps with DeepSpeed on the GPU (NCCL process group, ZeRO-3, bf16, one rank per
# GPU via torchrun) on the tiny warm start with the in-process generator.
#
#   TBHPC_PY=.venv/bin/python TBHPC_VLLM_PYTHON=/path/to/vllm-env/bin/python \
#     bash bench/gpu_check.sh [MODEL_DIR]        # default: build/models/smollm2-135m, else a tiny model
#
# Prints one summary block; exits non-zero at the first failing step.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${TBHPC_PY:-.venv/bin/python}

# `bash bench/gpu_check.sh memory`: the memory parts alone (no vLLM needed; DeepSpeed and its few missing
# dependencies carried as wheels: bench/gpu_wheels.sh). Each part has its own timeout;
# the whole runs in ~4 minutes on one H100 (predicted) and never past 7.5 (its timeouts). Prints measured
# beside planned figures.
if [ "${1:-}" = memory ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  # 1. logprobs at 27B width (hidden 5,120, V 151,936, bf16): chunked vs the [T, V] route, T = 4k..32k
  timeout 150 "$PY" - <<'PY' || echo "part 1 failed or timed out ($?)"
from tbhpc.plan.memory import GB, Layout, head_phase, read_shape
from tbhpc.train.config import TrainConfig
from tbhpc.train.memcheck import run_logprobs
s = read_shape("jobs/models/qwen3-27b-class")
lay = Layout.of(TrainConfig(gpus_per_node=8, dtype="bf16"))
for t in (4096, 8192, 16384, 32768):
    planned = sum(x.bytes for x in head_phase(s, lay, t) if x.name in ("logprobs", "head gradient")) - s.head_params * 4
    chunked = run_logprobs(s.vocab, s.hidden, t, 2048, "chunked", device="cuda")     # the weight's gradient included
    try:
        full = f"{run_logprobs(s.vocab, s.hidden, t, 2048, 'full', device='cuda') / GB:.2f} GB"
    except RuntimeError as exc:
        full = "out of memory" if "out of memory" in str(exc).lower() else f"failed: {str(exc).splitlines()[-1][:80]}"
    print(f"logprobs T {t:>6,}: chunked {chunked / GB:6.2f} GB (plan {planned / GB:.2f})   [T, V] route {full}", flush=True)
PY
  # 2. DeepSpeed steps of a 2-layer model at 27B width (2.3B parameters) on one GPU under the new settings
  timeout 300 "$PY" - <<'PY' || echo "part 2 failed or timed out ($?)"
import tempfile
from tbhpc.train.memcheck import run_case
shape = {"device": "cuda", "hidden": 5120, "heads": 40, "kv_heads": 8, "head_dim": 128, "intermediate": 21504,
         "vocab": 151936, "layers": 2, "steps": 2, "model_dir": tempfile.mkdtemp() + "/m"}
for extra in ({"tokens": 32768}, {"tokens": 32768, "tiled_mlp": True}, {"tokens": 32768, "checkpoint_offload": True},
              {"tokens": 65536, "tiled_mlp": True}):
    r = run_case({**shape, **extra}, timeout=240)
    print(f"step {extra}: peak {r['step_peaks'][-1] / 1e9:.2f} GB allocated, plan {r['plan_total'] / 1e9:.2f} GB "
          f"({r['plan_phase']}; + reserve {r['plan_reserve'] / 1e9:.1f}) on {r['device']}", flush=True)
PY
  exit 0
fi
# `bash bench/gpu_check.sh nccl`: the collective parts alone on one GPU (torch only: no vLLM, no DeepSpeed),
# each with its own timeout, ~2 minutes in all (predicted). Records what docs/weight-sync.md and
# docs/cluster-run.md predict: NCCL initialises with the config's timeout, a peer that never comes ends
# the wait within it, torch's fused AdamW runs without a compiler, and tbhpc's weight broadcast reaches a
# second process (NCCL refuses two ranks on one GPU, so that part says which backend it could use).
if [ "${1:-}" = nccl ]; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  timeout 60 "$PY" - <<'PY' || echo "part 1 (init) failed or timed out ($?)"
import datetime, os, time, torch, torch.distributed as dist
from tbhpc.train.config import TrainConfig
cfg = TrainConfig(model="m", pool="p", gpus_per_node=1)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29611")
t0 = time.perf_counter()
dist.init_process_group("nccl", rank=0, world_size=1, timeout=datetime.timedelta(seconds=cfg.collective_timeout))
x = torch.ones(1 << 20, device="cuda"); dist.all_reduce(x); torch.cuda.synchronize()
print(f"1. NCCL {'.'.join(map(str, torch.cuda.nccl.version()))}: init + all_reduce {time.perf_counter() - t0:.2f} s, "
      f"timeout {cfg.collective_timeout:.0f} s (collective_timeout_s default)", flush=True)
dist.destroy_process_group()
PY
  timeout 90 "$PY" - <<'PY' || echo "part 2 (timeout path) failed or timed out ($?)"
import datetime, time, torch.distributed as dist
t0 = time.perf_counter()
try:      # a peer that never joins: the wait ends within the timeout, with an error, not a hang
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29612", rank=0, world_size=2,
                            timeout=datetime.timedelta(seconds=15))
    print("2. timeout path: UNEXPECTED: a group of 2 formed with one member")
except Exception as exc:
    print(f"2. timeout path: the missing peer ended the wait after {time.perf_counter() - t0:.1f} s "
          f"(timeout 15 s): {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", flush=True)
PY
  timeout 60 "$PY" - <<'PY' || echo "part 3 (fused AdamW) failed or timed out ($?)"
import time, torch
p = torch.nn.Parameter(torch.randn(64 << 20, device="cuda"))      # 256 MB of fp32 master weights
opt = torch.optim.AdamW([p], lr=1e-6, fused=True)
p.grad = torch.randn_like(p); opt.step(); torch.cuda.synchronize()
t0 = time.perf_counter()
for _ in range(10):
    opt.step()
torch.cuda.synchronize()
s = (time.perf_counter() - t0) / 10
print(f"3. fused AdamW (torch, no nvcc): {p.numel() / 1e6:.0f}M parameters in {s * 1e3:.1f} ms a step; "
      f"a rank's 1.67B of the reference (16 ranks): ~{1.67e9 / p.numel() * s:.2f} s", flush=True)
PY
  timeout 240 "$PY" - <<'PY' || echo "part 4 (weight broadcast) failed or timed out ($?)"
import multiprocessing as mp, time, torch
from tbhpc.serve.vllm_ext import tbhpc_wire as wire
def receive(port, device, meta, q):
    g = wire.Group("127.0.0.1", port, 1, 2, device, 120, "t" * 43).join()
    n = sum(t.numel() * t.element_size() for _, t in wire.receive(g, meta))
    g.close(); q.put(n)
def run(device):
    state = {f"w{i}": torch.randn(64 << 20, device="cuda", dtype=torch.bfloat16) for i in range(16)}   # 2.1 GB
    meta = [wire.meta_of(n, t) for n, t in state.items()]
    g = wire.listen("127.0.0.1", 2, device, 120, "t" * 43)
    ctx = mp.get_context("spawn"); q = ctx.Queue()
    p = ctx.Process(target=receive, args=(g.port, device, meta, q)); p.start()
    assert g.wait_joined(60)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    sent = wire.send(g, meta, state.values()); g.close(); torch.cuda.synchronize()
    s = time.perf_counter() - t0
    assert q.get(timeout=120) == sent; p.join(30)
    return sent, s
for device in ("cuda", "cpu"):
    try:
        sent, s = run(device)
        print(f"4. weight broadcast to a second process over {'NCCL' if device == 'cuda' else 'gloo (GPU tensors via host)'}: "
              f"{sent / 1e9:.2f} GB in {s:.2f} s = {sent / s / 1e9:.2f} GB/s", flush=True)
        break
    except Exception as exc:
        print(f"4. over {'NCCL' if device == 'cuda' else 'gloo'}: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}", flush=True)
PY
  exit 0
fi
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

# DeepSpeed + NCCL: a real GRPO run, one rank per visible GPU (torchrun sets RANK/WORLD_SIZE like srun)
WARM=build/models/tiny-warm
[ -f "$WARM/config.json" ] || "$PY" -m tbhpc.cli warmstart --out "$WARM" --tasks jobs/pools/smoke.yaml --steps 100
NGPU=$(nvidia-smi -L | wc -l)
"$PY" -m torch.distributed.run --nproc-per-node "$NGPU" -m tbhpc.cli train "$OUT/gpu-train" "model=$WARM" \
  pool=jobs/pools/smoke.yaml generator=local steps=2 group_size=8 groups_per_step=2 max_tokens=64 response_budget=256 \
  lr=1e-4 | grep -E "^step|steps done"
"$PY" - "$OUT/gpu-train" <<'PY'
import sys, duckdb
con = duckdb.connect(f"{sys.argv[1]}/results.duckdb", read_only=True)
print(con.sql("SELECT step, world, kept, loss_tokens, grad_norm, mismatch, update_s FROM train_steps ORDER BY step"))
PY
