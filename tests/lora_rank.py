"""One rank of a real gloo process group running one DeepSpeed GRPO update with LoRA on (a script
tests/test_train_lora.py starts 1 or 2 times): rank 0 writes what the optimiser holds, the
consolidated (peft-named) weights, the merged, base-named weights and the adapter tensors (B
scaled) the trainer publishes."""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
from train_rank import batch  # noqa: E402


def main(model: str, world: int, rank: int, out: str, stage: int, overrides: str = "{}") -> None:
    import torch

    from tbhpc.train.config import TrainConfig
    from tbhpc.train.engine import DistEnv, Engine
    from tbhpc.train.packing import pack

    cfg = TrainConfig(model=model, pool="-", lr=1e-2, zero_stage=stage, microbatch_tokens=96, lora_rank=4,
                      lora_alpha=8.0, **json.loads(overrides))
    eng = Engine(cfg, DistEnv(rank, world, 0, "127.0.0.1", int(os.environ["MASTER_PORT"])))
    eps, adv = batch(eng.module.config.vocab_size)
    mine = list(range(rank, len(eps), world))
    optimised = sum(p.numel() for g in eng.engine.optimizer.param_groups for p in g["params"]) if stage == 0 else None
    trainable = sorted(n for n, p in eng.module.named_parameters() if p.requires_grad)
    stats = eng.update(pack([eps[i] for i in mine], [adv[i] for i in mine], cfg.microbatch_tokens))
    loss = eng.all_reduce([stats.loss])[0]       # each rank's share of the global loss
    sd = eng.consolidated_state_dict()
    merged = {name: t for _, name, t in eng.full_params() if t is not None}
    meta = [m["name"] for m in eng.param_meta()]
    from tbhpc.train.lora import adapter_tensors
    adapter = adapter_tensors(eng.module, stage == 3, rank == 0)      # what a LoRA step publishes
    if rank == 0:
        torch.save({"sd": sd, "merged": merged, "adapter": adapter}, out + ".pt")
        json.dump({"trainable": trainable, "optimised": optimised, "meta": meta, "grad_norm": stats.grad_norm,
                   "loss": loss}, open(out + ".json", "w"))
    eng.leave(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]), *sys.argv[6:])
