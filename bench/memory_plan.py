"""Benchmark: the trainer's memory, measured against the memory plan and against the route it replaced.

1. Logprobs at T = 16,384, V = 151,936, hidden 1,024 (fp32): the chunked route (tbhpc/train/logprobs.py)
   against the [T, V] route, both measured in this run with torch's MemTracker on fake tensors (the
   [T, V] route needs ~30 GB, more than this machine has); the chunked route also for real (peak RSS
   in its own process), and both routes for real at T = 2,048 to check the fake figures.
2. The plan against real DeepSpeed steps of small Qwen3 models on this CPU (tests/test_memory_plan.py's
   cases and two more), peak RSS above the process's baseline.
3. One decoder layer and the output head at 27B width on fake tensors against the plan's terms.
4. The reference run's plan (jobs/train-reference.yaml, jobs/models/qwen3-27b-class) on 80 and 141 GB GPUs.

    python bench/memory_plan.py [--quick] [--plot docs/memory-plan.png]

--quick skips the real T = 16,384 run (~2 minutes on 2 cores). Prints ratios; writes the plot.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
GB = 1e9
V, H = 151_936, 1_024
STEP_CASES = [
    {"hidden": 256, "vocab": 16384, "tokens": 1024},
    {"hidden": 256, "vocab": 4096, "tokens": 4096, "intermediate": 2048},
    {"hidden": 256, "vocab": 4096, "tokens": 2048, "gradient_checkpointing": False},
    {"hidden": 256, "vocab": 4096, "tokens": 4096, "intermediate": 2048, "tiled_mlp": True},
    {"hidden": 512, "heads": 8, "kv_heads": 4, "layers": 2, "vocab": 8192, "tokens": 2048, "intermediate": 1536},
    {"hidden": 256, "layers": 8, "vocab": 4096, "tokens": 8192},
    {"hidden": 512, "heads": 8, "kv_heads": 4, "intermediate": 1536, "vocab": 32768, "tokens": 4096, "logprob_chunk": 512},
]


def logprob_section(quick: bool) -> dict:
    from tbhpc.train.memcheck import fake_logprobs, run_logprobs
    print(f"1. logprobs and their backward, V {V:,}, hidden {H:,}, fp32, chunk 2,048 (peak bytes above the inputs)")
    curve = {}
    for t in (2048, 4096, 8192, 16384):
        curve[t] = (fake_logprobs(V, H, t, 2048, "chunked", "float32"), fake_logprobs(V, H, t, 2048, "full", "float32"))
        print(f"   T {t:>6,}: chunked {curve[t][0] / GB:6.2f} GB   [T, V] route {curve[t][1] / GB:6.2f} GB   "
              f"ratio {curve[t][0] / curve[t][1]:.3f}   (MemTracker, fake tensors)")
    real = {2048: (run_logprobs(V, H, 2048, 2048, "chunked"), run_logprobs(V, H, 2048, 2048, "full"))}
    print(f"   T  2,048 for real: chunked {real[2048][0] / GB:.2f} GB, [T, V] route {real[2048][1] / GB:.2f} GB "
          f"(ratio {real[2048][0] / real[2048][1]:.3f}; RSS in their own processes)")
    if not quick:
        real[16384] = (run_logprobs(V, H, 16384, 2048, "chunked", timeout=1800), None)
        print(f"   T 16,384 for real: chunked {real[16384][0] / GB:.2f} GB (the [T, V] route would need "
              f"{curve[16384][1] / GB:.0f} GB: not run on this machine)")
    c, f = curve[16384]
    print(f"   => at T 16,384 the chunked route holds {c / f:.3f} of the [T, V] route's peak (target <= 0.25)")
    return {"curve": curve, "real": real}


def step_section() -> list[tuple[dict, float, float]]:
    from tbhpc.train.memcheck import _cpu, run_case
    print(f"2. the plan against real DeepSpeed steps (1 CPU rank, ZeRO-3, fp32; {_cpu()})")
    rows = []
    for case in STEP_CASES:
        r = run_case(case)
        measured, planned = r["step_peaks"][-1], r["plan_total"]
        rows.append((case, planned, measured))
        print(f"   {r['params'] / 1e6:6.1f}M params {case}: plan {planned / GB:.3f} GB ({r['plan_phase']}), "
              f"measured {measured / GB:.3f} GB -> {planned / measured:.2f}x")
    return rows


def fake_27b_section() -> None:
    from tbhpc.plan.memory import head_phase, Layout, layer_saved, layer_work
    from tbhpc.plan.shape import read_shape
    from tbhpc.train.config import TrainConfig
    from tbhpc.train.memcheck import fake_layer, fake_logprobs
    shape = read_shape(str(REPO / "jobs" / "models" / "qwen3-27b-class"))
    print("3. 27B width on fake tensors (MemTracker), bytes per token of one Qwen3 layer, and the output head")
    for dtype, pb in (("bfloat16", 2), ("float32", 4)):
        saved = fake_layer(shape, 4096, dtype, checkpoint=False)["saved_per_token"]
        a, b = (fake_layer(shape, n, dtype)["work_per_token"] * n for n in (8192, 32768))
        print(f"   {dtype}: kept {saved:,.0f} (plan {layer_saved(shape, pb):,.0f}); backward {(b - a) / 24576:,.0f} "
              f"(plan {layer_work(shape, pb, 1):,.0f})")
    lay = Layout.of(TrainConfig(gpus_per_node=8, dtype="bf16", sp_size=1))
    for t in (4096, 16384, 32768):
        got = fake_logprobs(shape.vocab, shape.hidden, t, 2048)
        planned = sum(x.bytes for x in head_phase(shape, lay, t) if x.name in ("logprobs", "head gradient")) \
            - shape.head_params * 4
        print(f"   head, T {t:,}, bf16: {got / GB:.2f} GB (plan {planned / GB:.2f})")


def reference_section() -> None:
    from tbhpc.config import load_config
    from tbhpc.plan.memory import plan
    from tbhpc.train.config import TrainConfig
    print("4. the reference run's plan (jobs/train-reference.yaml, jobs/models/qwen3-27b-class)")
    for gb in (80, 141):
        cfg = load_config(TrainConfig, REPO / "jobs" / "train-reference.yaml",
                          [f"model={REPO / 'jobs' / 'models' / 'qwen3-27b-class'}", f"gpu_memory_gb={gb}"])
        p = plan(cfg)
        print(f"   {gb} GB: {p.total / GB:.1f} GB at the peak ({p.phase}), headroom {(gb * GB - p.total) / GB:.1f} GB, "
              f"longest episode {p.longest_episode:,} tokens: {'fits' if p.fits else p.problem}")


def plot(logprobs: dict, rows: list, path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.2))
    ts = sorted(logprobs["curve"])
    a.plot(ts, [logprobs["curve"][t][1] / GB for t in ts], "o-", color="#c44", label="[T, V] route (fake tensors)")
    a.plot(ts, [logprobs["curve"][t][0] / GB for t in ts], "o-", color="#26a", label="chunked (fake tensors)")
    for t, (c, f) in logprobs["real"].items():
        a.plot([t], [c / GB], "s", color="#26a", mfc="none", ms=9)
        if f:
            a.plot([t], [f / GB], "s", color="#c44", mfc="none", ms=9)
    a.plot([], [], "s", color="grey", mfc="none", label="measured here (RSS)")
    a.set(xlabel="tokens T", ylabel="peak GB", title=f"logprobs + backward, V {V:,}, hidden {H:,}, fp32")
    a.legend(fontsize=8)
    m = [r[2] / GB for r in rows]
    p = [r[1] / GB for r in rows]
    lim = max(m + p) * 1.15
    b.fill_between([0, lim], [0, lim * 0.8], [0, lim * 1.2], color="#ddd", label="within 20%")
    b.plot([0, lim], [0, lim], color="grey", lw=0.8)
    b.plot(m, p, "o", color="#26a", label="small Qwen3 steps (CPU)")
    b.set(xlim=(0, lim), ylim=(0, lim), xlabel="measured peak GB", ylabel="planned GB", title="memory plan vs a real step")
    b.legend(fontsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"plot: {path}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="skip the real T = 16,384 chunked run")
    ap.add_argument("--plot", type=Path, default=REPO / "docs" / "memory-plan.png")
    args = ap.parse_args()
    lp = logprob_section(args.quick)
    rows = step_section()
    fake_27b_section()
    reference_section()
    plot(lp, rows, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
