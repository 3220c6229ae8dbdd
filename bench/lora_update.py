"""Benchmark: one GRPO update with LoRA against the same update of every parameter, time and peak memory.

The largest model that trains here in fp32 with Adam on every parameter (24 GB of RAM): a random Qwen3
of ~0.6B parameters (hidden 1,536, 16 layers, the project's tokenizer). The same batch (agentic-shaped
episodes of bench/train_step.py's "smollm2" size, 8 episodes of 64-1,024 tokens) goes through tbhpc's
DeepSpeed engine (ZeRO-3, one rank, fp32, gradient checkpointing on as the reference runs it) twice, each
mode in its own process so peak RSS is its own: full parameters, then rank-16 adapters on all 7 projections.
Printed: the update's seconds (median of 3 after a warm-up), the optimiser's parameters and the process's
peak RSS, and the ratios. The plan's LoRA terms are for GPUs; this is the CPU's measurement of the same
shift (the optimiser states and gradients of the base gone, the frozen base and activations left).

    python bench/lora_update.py [--hidden 1536] [--layers 16] [--rank 16]
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def build(out: Path, hidden: int, layers: int) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, Qwen3Config

    from tbhpc.policy.tiny import build_tiny_model
    build_tiny_model(out, arch="qwen3")
    vocab = AutoModelForCausalLM.from_pretrained(out).config.vocab_size
    cfg = Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=hidden * 8 // 3 // 64 * 64,
                      num_hidden_layers=layers, num_attention_heads=hidden // 128, num_key_value_heads=max(1, hidden // 512),
                      head_dim=128, max_position_embeddings=4096, tie_word_embeddings=False)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(cfg)
    for f in out.glob("*.safetensors"):
        f.unlink()
    model.save_pretrained(out)
    return out


def side(path: str, rank: int) -> dict:
    import torch
    from train_step import batch
    from tbhpc.train.config import TrainConfig
    from tbhpc.train.engine import DistEnv, Engine
    from tbhpc.train.packing import effective_budget, pack
    cfg = TrainConfig(model=path, pool="-", lr=1e-6, zero_stage=3, gradient_checkpointing=True,
                      torch_threads=torch.get_num_threads(), lora_rank=rank, lora_alpha=2.0 * rank if rank else 16.0,
                      lora_targets=TARGETS)
    eng = Engine(cfg, DistEnv(0, 1, 0, "127.0.0.1", int(os.environ.get("MASTER_PORT", "29534"))))
    eps, adv = batch("smollm2", eng.module.config.vocab_size)
    budget = effective_budget(cfg.microbatch_tokens, [len(e.tokens) for e in eps], "sdpa")
    eng.update(pack(eps[:2], adv[:2], budget))              # warm-up: allocations, the optimiser's states
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        eng.update(pack(eps, adv, budget))
        times.append(time.perf_counter() - t0)
    trained = sum(getattr(p, "ds_numel", p.numel()) for p in eng.module.parameters() if p.requires_grad)
    total = sum(getattr(p, "ds_numel", p.numel()) for p in eng.module.parameters())
    return {"update_s": statistics.median(times), "trained": trained, "params": total,
            "peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--hidden", type=int, default=1536)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--side", nargs=2, help=argparse.SUPPRESS)       # internal: PATH RANK, one mode in this process
    args = ap.parse_args()
    if args.side:
        print(json.dumps(side(args.side[0], int(args.side[1]))))
        return
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}
    with tempfile.TemporaryDirectory(prefix="tbhpc-lora-update-") as tmp:
        path = build(Path(tmp) / "model", args.hidden, args.layers)
        out = {}
        for name, rank in (("full", 0), (f"LoRA r={args.rank}", args.rank)):
            p = subprocess.run([sys.executable, __file__, "--side", str(path), str(rank)], capture_output=True,
                               text=True, env=env, timeout=3600)
            if p.returncode:
                raise SystemExit(f"{name}: exit {p.returncode}\n{p.stderr[-3000:]}")
            out[name] = json.loads(p.stdout.strip().splitlines()[-1])
    full, lora = out["full"], out[f"LoRA r={args.rank}"]
    print(f"model: {full['params'] / 1e9:.2f}B parameters fp32 (hidden {args.hidden}, {args.layers} layers), "
          f"ZeRO-3 on 1 rank, gradient checkpointing, {env['OMP_NUM_THREADS']} threads")
    print(f"{'mode':<14}{'trained':>14}{'update s':>10}{'peak RSS GB':>13}")
    for name, r in out.items():
        print(f"{name:<14}{r['trained'] / 1e6:>12.1f}M{r['update_s']:>10.2f}{r['peak_gb']:>13.2f}")
    print(f"LoRA / full: update time {lora['update_s'] / full['update_s']:.2f}, peak RSS {lora['peak_gb'] / full['peak_gb']:.2f}, "
          f"trained parameters {lora['trained'] / full['trained']:.4f}")


if __name__ == "__main__":
    main()
