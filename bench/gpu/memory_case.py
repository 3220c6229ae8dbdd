"""Part `memory`, one case per process and per timeout (`python bench/gpu/memory_case.py N`): DeepSpeed
steps of a 2-layer model at 27B width (2.3B parameters) on one GPU, the peak the CUDA allocator saw
beside the plan. A rehearsal runs a small Qwen3 on the CPU instead."""
import sys
import tempfile

from common import DEVICE, REHEARSAL

from tbhpc.train.memcheck import run_case

CASES = [{"tokens": 32768}, {"tokens": 32768, "tiled_mlp": True}, {"tokens": 32768, "checkpoint_offload": True},
         {"tokens": 65536, "tiled_mlp": True}]
SHAPE = {"hidden": 5120, "heads": 40, "kv_heads": 8, "head_dim": 128, "intermediate": 21504, "vocab": 151936,
         "layers": 2, "steps": 2}
REHEARSED = {"hidden": 256, "vocab": 16384, "tokens": 1024, "steps": 1}

index = int(sys.argv[1])
case = {**(REHEARSED if REHEARSAL else {**SHAPE, **CASES[index]}), "device": DEVICE,
        "model_dir": tempfile.mkdtemp() + "/m"}
r = run_case(case, timeout=55)
print(f"case {index} {'(rehearsal) ' + str(REHEARSED) if REHEARSAL else CASES[index]}: peak {max(r['step_peaks']) / 1e9:.2f} GB, "
      f"plan {r['plan_total'] / 1e9:.2f} GB ({r['plan_phase']}; + reserve {r['plan_reserve'] / 1e9:.1f}) on {r['device']}",
      flush=True)
