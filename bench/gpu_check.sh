#!/usr/bin/env bash
# The GPU check: what tbhpc needs to know from the first GPU machine, as one script with a timeout per
# part, each part a file of its own (bench/gpu/). Parts:
#   tests     pytest -m gpu tests/test_gpu.py: a ZeRO-3 bf16 step against fp32, chunked logprobs against
#             the [T, V] route, the memory plan against the CUDA allocator, the weight broadcast's group
#             (settle, shut down), fused AdamW, the device binding
#   logprobs  the output head at 27B width, T = 4k..32k: measured peak beside the plan
#   memory    DeepSpeed steps of a 2-layer model at 27B width, four cases, each its own process and timeout
#   nccl      NCCL init with the trainer's timeout, a missing peer's timeout, fused AdamW's speed, the weight
#             broadcast to a second process
#   serve     (needs a CUDA vLLM: TBHPC_VLLM_PYTHON) serving, eval, probe, a verified sync, throughput
#   train     (needs the tiny warm start or builds it) a 2-step GRPO run on every visible GPU via torchrun
#
#   bash bench/gpu_check.sh [--rehearsal] [PART ...]      # default: tests logprobs memory nccl
#
# The default parts need CUDA torch, transformers and the wheels bench/gpu_wheels.sh makes (DeepSpeed,
# pytest and the few packages a bare image lacks), no vLLM; predicted ~5 minutes on one H100 and never
# more than the sum of the timeouts (9 min 40 s). `--rehearsal` plays the same parts on the CPU with small
# sizes (gloo for NCCL): `make test` runs it, so that a bug in the script fails CI before a GPU sees it.
# Prints one line per part (ok, or FAILED with why) after its output; exits 1 if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${TBHPC_PY:-.venv/bin/python}
PARTS=()
REHEARSAL=0
for arg in "$@"; do
  case $arg in
    --rehearsal) REHEARSAL=1 ;;
    tests|logprobs|memory|nccl|serve|train) PARTS+=("$arg") ;;
    *) echo "gpu_check: unknown part '$arg' (tests logprobs memory nccl serve train, or --rehearsal)" >&2; exit 2 ;;
  esac
done
[ ${#PARTS[@]} -gt 0 ] || PARTS=(tests logprobs memory nccl)
if [ $REHEARSAL = 1 ]; then
  export TBHPC_GPU_REHEARSAL=1 DS_ACCELERATOR=cpu OMP_NUM_THREADS=1
  echo "gpu_check: rehearsal on the CPU ($(nproc --all) cores): small sizes, gloo for NCCL; figures are not a GPU's"
else
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || echo "gpu_check: no nvidia-smi"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
failed=0

part() {    # part NAME LIMIT_S COMMAND...: the command's output indented, then one line
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  timeout "$limit" "$@" 2>&1 | sed -u 's/^/    /'
  rc=${PIPESTATUS[0]}
  if [ "$rc" = 0 ]; then
    echo "  $name: ok ($((SECONDS - t0)) s)"
  else
    [ "$rc" = 124 ] && rc="timed out after $limit s" || rc="exit $rc"
    echo "  $name: FAILED ($rc)"
    failed=$((failed + 1))
  fi
}

for p in "${PARTS[@]}"; do
  case $p in
    tests) part "tests" 150 "$PY" -m pytest -q --noconftest -p no:cacheprovider -m gpu tests/test_gpu.py ;;
    logprobs) part "logprobs" 90 "$PY" bench/gpu/logprobs.py ;;
    memory)
      cases=(0 1 2 3)
      [ $REHEARSAL = 1 ] && cases=(0)
      for i in "${cases[@]}"; do part "memory case $i" 60 "$PY" bench/gpu/memory_case.py "$i"; done ;;
    nccl)
      part "nccl init" 20 "$PY" bench/gpu/nccl_init.py
      part "nccl timeout" 25 "$PY" bench/gpu/nccl_timeout.py
      part "fused adamw" 15 "$PY" bench/gpu/adamw.py
      part "broadcast" 40 "$PY" bench/gpu/broadcast.py ;;
    serve) part "serve" 1200 bash bench/gpu/serve.sh ;;
    train) part "train" 900 bash bench/gpu/train.sh ;;
  esac
done
echo "gpu_check: ${#PARTS[@]} part(s): $([ $failed = 0 ] && echo 'all ok' || echo "$failed step(s) FAILED")"
[ $failed = 0 ]
