"""One ZeRO-3 `Engine` alone on this machine's device, for tests/test_gpu.py: it loads the model
partitioned, runs one GRPO update of the fixed batch (train_rank.batch) in the dtype asked, and writes
what it saw as JSON: the loss and gradient norm, where and in what dtype the parameters and their
partitions live, and the dtypes ZeRO accumulates and reduces gradients in.

    python tests/gpu_rank.py MODEL_DIR bf16|fp32 OUT.json      (DS_ACCELERATOR=cpu: on the CPU)
"""
import json
import os
import sys


def main(model: str, dtype: str, out: str) -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from train_rank import batch

    from tbhpc.train.config import TrainConfig
    from tbhpc.train.dist import DistEnv, free_port_pair, use_gpu
    from tbhpc.train.engine import Engine
    from tbhpc.train.packing import pack
    from tbhpc.train.precision import stored_dtypes

    gpu = use_gpu()
    cfg = TrainConfig(model=model, pool="-", lr=1e-3, zero_stage=3, microbatch_tokens=96, dtype=dtype,
                      gpus_per_node=1 if gpu else 0)
    eng = Engine(cfg, DistEnv(0, 1, 0, "127.0.0.1", free_port_pair()))
    eps, adv = batch(eng.module.config.vocab_size)
    st = eng.update(pack(eps, adv, 96))
    params = list(eng.module.parameters())
    seen = {"loss": st.loss, "grad_norm": st.grad_norm, "peak_bytes": st.peak_bytes, "device": str(eng.device),
            "dtypes": sorted(stored_dtypes(eng.module)),
            "partitions_on": sorted({str(p.ds_tensor.device.type) for p in params if hasattr(p, "ds_tensor")}),
            "grad_accum": str(eng.engine.optimizer.grad_partitions_flat_buffer.dtype).removeprefix("torch."),
            "communication": str(eng.engine.communication_data_type).removeprefix("torch.")}
    with open(out, "w") as f:
        json.dump(seen, f)
    eng.leave(0)


if __name__ == "__main__":
    main(*sys.argv[1:4])
