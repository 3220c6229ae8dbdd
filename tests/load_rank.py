"""One rank of a gloo group loading a model the way a trainer rank does (tests/test_train_loading.py):
`partitioned` (tbhpc.train.loading.load_partitioned under ZeRO-3) or `whole` (from_pretrained, what every
rank did before). Writes its peak resident memory above its baseline; with `check`, rank 0 also
compares every parameter (gathered one at a time) with the checkpoint's tensors."""
import json
import os
import sys


def main(model: str, mode: str, out: str, check: str = "") -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch

    from tbhpc.train import memstat
    from tbhpc.train.config import TrainConfig
    from tbhpc.train.engine import DistEnv, ds_config
    from tbhpc.train.loading import checkpoint_index, load_hf, load_partitioned, read_tensor
    from tbhpc.train.memcheck import _warm_imports

    env = DistEnv.from_environ()
    env.export()
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed(dist_backend="gloo", verbose=False)
    torch.set_num_threads(1)
    _warm_imports()
    from transformers import AutoConfig
    hidden = AutoConfig.from_pretrained(model).hidden_size
    cfg = ds_config(TrainConfig(model=model, pool="-", zero_stage=3), gpu=False, hidden=hidden)
    base = memstat.rss()
    memstat.reset_peak()
    if mode == "partitioned":
        m = load_partitioned(model, torch.float32, "sdpa", cfg, env.rank)
    else:      # transformers maps the file and reads it lazily: the first use (DeepSpeed's partitioning, or
        m = load_hf(model, torch.float32, "sdpa")     # the copy to the GPU) reads every tensor; so here
        with torch.no_grad():
            sum(float(p.sum()) for p in m.parameters())
    peak = memstat.peak() - base
    mismatched = []
    if check:
        index = checkpoint_index(model)
        for name, p in m.named_parameters():
            with deepspeed.zero.GatheredParameters([p]) if mode == "partitioned" else _null():
                if env.rank == 0:
                    key = name if name in index else "model.embed_tokens.weight"     # a tied head
                    if not torch.equal(p.data, read_tensor(*index[key]).to(p.dtype)):
                        mismatched.append(name)
    import torch.distributed as dist
    peaks = [None] * env.world
    dist.all_gather_object(peaks, peak)
    if env.rank == 0:
        from tbhpc.train.precision import stored_dtypes
        json.dump({"peaks": peaks, "mismatched": mismatched, "dtypes": sorted(stored_dtypes(m)), "params": sum(p.ds_numel if hasattr(p, "ds_numel") else
                   p.numel() for p in m.parameters())}, open(out, "w"))
    dist.barrier()
    os._exit(0)


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


if __name__ == "__main__":
    main(*sys.argv[1:])
