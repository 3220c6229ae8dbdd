#!/usr/bin/env bash
# Part `train` of bench/gpu_check.sh: a real GRPO run with DeepSpeed on the GPUs (NCCL process group,
# ZeRO-3, bf16, one rank per visible GPU via torchrun, which sets RANK/WORLD_SIZE as srun does) on the
# tiny warm start with the in-process generator: two steps, then its train_steps rows.
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${TBHPC_PY:-.venv/bin/python}
OUT=${OUT:-$(mktemp -d)}
WARM=build/models/tiny-warm
[ -f "$WARM/config.json" ] || "$PY" -m tbhpc.cli warmstart --out "$WARM" --tasks jobs/pools/smoke.yaml --steps 100
NGPU=$(nvidia-smi -L | wc -l)
"$PY" -m torch.distributed.run --nproc-per-node "$NGPU" -m tbhpc.cli train "$OUT/gpu-train" "model=$WARM" \
  gpus_per_node="$NGPU" pool=jobs/pools/smoke.yaml generator=local steps=2 group_size=8 groups_per_step=2 max_tokens=64 response_budget=256 \
  lr=1e-4 | grep -E "^step|steps done"
"$PY" - "$OUT/gpu-train" <<'PY'
import sys, duckdb
con = duckdb.connect(f"{sys.argv[1]}/results.duckdb", read_only=True)
print(con.sql("SELECT step, world, kept, loss_tokens, grad_norm, mismatch, update_s FROM train_steps ORDER BY step"))
PY
