"""One rank of a real gloo process group running one DeepSpeed GRPO update on a fixed global batch
(a script the tests start 1, 2 or 3 times; tests/test_train_engine.py). Rank r takes episodes
r, r+W, r+2W, ... of the same synthetic batch; rank 0 writes the loss, grad norm and weights."""
import json
import sys

import numpy as np


def batch(vocab: int):
    """The fixed global batch: 7 episodes of uneven lengths, their behaviour logprobs and advantages."""
    from tbhpc.rollout.buffer import Episode
    rng = np.random.default_rng(0)
    eps, adv = [], []
    for n in (40, 7, 130, 22, 65, 12, 90):
        mask = (rng.random(n) < 0.6).astype(np.uint8)
        mask[0] = 0
        eps.append(Episode(rng.integers(0, vocab, n), mask, np.where(mask, rng.normal(-3, 0.5, n), 0.0), 0, 0.0))
        adv.append(float(rng.normal()))
    return eps, adv


def main(model: str, world: int, rank: int, port: int, out: str, stage: int, loss_agg: str = "token-mean",
         overrides: str = "{}") -> None:
    """`port` 0: MASTER_PORT from the environment (tests/helpers.run_ranks). `overrides`: TrainConfig
    fields as JSON (the memory options of tests/test_train_longseq.py)."""
    import torch

    from tbhpc.train.config import TrainConfig
    from tbhpc.train.engine import DistEnv, Engine
    from tbhpc.train import longseq
    from tbhpc.train.packing import effective_budget, pack

    cfg = TrainConfig(model=model, pool="-", lr=1e-3, zero_stage=stage, microbatch_tokens=96, dual_clip=3.0,
                      loss_agg=loss_agg, **json.loads(overrides))
    import os
    eng = Engine(cfg, DistEnv(rank, world, 0, "127.0.0.1", port or int(os.environ["MASTER_PORT"])))
    eps, adv = batch(eng.module.config.vocab_size)
    mine = list(range(rank, len(eps), world))
    budget = effective_budget(cfg.microbatch_tokens, [len(eps[i].tokens) for i in mine], "sdpa", cfg.sp_size)
    if cfg.sp_size == 1:
        budget = cfg.microbatch_tokens      # packed rows as the 1/2/3-rank comparison always had them
    stats = eng.update(pack([eps[i] for i in mine], [adv[i] for i in mine], budget,
                            seq_weights=loss_agg == "seq-mean-token-mean"))
    loss, loss_tokens = eng.all_reduce([stats.loss, stats.loss_tokens])
    sd = eng.consolidated_state_dict()
    if rank == 0:
        torch.save(sd, out + ".pt")
        import deepspeed.comm as dscomm
        json.dump({"loss": loss, "grad_norm": stats.grad_norm, "micro": stats.micro_batches,
                   "entropy": stats.entropy, "loss_tokens": loss_tokens, "tokens": stats.tokens,
                   "used": dict(longseq.USED), "sp": eng.sp,
                   "offload": [bool(eng.engine.zero_offload_optimizer()), bool(eng.engine.zero_offload_param())],
                   "shm_op_built": dscomm.comm.cdb.shm_comm_op is not None}, open(out + ".json", "w"))
    eng.leave(0)     # the rank's exit path of `tbhpc train` (Engine.leave says why)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]), *sys.argv[7:])
