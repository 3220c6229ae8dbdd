"""One rank of a ZeRO-3 `Engine` built on a CPU class chosen by the test (tests/test_train_precision.py).

`fp16`: what the CPU accelerator is made to answer to `is_fp16_supported()` ("no" is an AVX2 machine,
or an AVX-512 one without AVX512-FP16; "yes" an AMX one), on whatever machine runs the test.
`bf16-init`: DeepSpeed's `zero.Init` made to pick bf16 whatever it is asked (a future release that
changes precision again); the engine must refuse the run. `update`: one GRPO update. `overrides`:
TrainConfig fields as JSON (a bf16 LoRA run). Rank 0 writes what it saw as JSON: the refusal, or {dtype: parameter count}."""
import json
import os
import sys


def main(model: str, world: int, rank: int, out: str, fp16: str, mode: str, overrides: str = "{}") -> None:
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero import partition_parameters

    accel = get_accelerator()
    accel.is_fp16_supported = lambda: fp16 == "yes"
    if mode == "bf16-init":
        real = partition_parameters.Init._set_dtype

        def bf16_always(self, ds_config, dtype):
            real(self, ds_config, dtype)
            self.dtype = torch.bfloat16
        partition_parameters.Init._set_dtype = bf16_always

    from tbhpc.errors import TbhpcError
    from tbhpc.train.config import TrainConfig
    from tbhpc.train.engine import DistEnv, Engine
    from tbhpc.train.precision import stored_dtypes

    cfg = TrainConfig(model=model, pool="-", lr=1e-3, zero_stage=3, microbatch_tokens=96,
                      **{"dtype": "fp32", **json.loads(overrides)})
    seen = {"fp16_supported": accel.is_fp16_supported()}
    try:
        eng = Engine(cfg, DistEnv(rank, world, 0, "127.0.0.1", int(os.environ["MASTER_PORT"])))
    except TbhpcError as e:
        seen["refused"] = str(e)
        eng = None
    else:
        seen["dtypes"] = {d: len(names) for d, names in stored_dtypes(eng.module).items()}
        opt = eng.engine.optimizer          # ZeRO-3: the gradient partitions it accumulates into
        seen["grad_accum"] = str(opt.grad_partitions_flat_buffer.dtype).removeprefix("torch.")
        seen["communication"] = str(eng.engine.communication_data_type).removeprefix("torch.")
        if mode == "update":                # DeepSpeed accepts the pair at stage 3 and steps with it
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            from train_rank import batch

            from tbhpc.train.packing import pack
            eps, adv = batch(eng.module.config.vocab_size)
            seen["loss"] = eng.update(pack(eps[rank::world], adv[rank::world], 96)).loss
        seen["adapters"] = sorted({d for d, names in stored_dtypes(eng.module).items() for n in names if ".lora_" in n})
        sd = eng.consolidated_state_dict()
        if rank == 0:
            seen["export"] = sorted({str(t.dtype) for t in sd.values()})
    if rank == 0:
        json.dump(seen, open(out, "w"))
    if eng is not None:
        eng.leave(0)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), *sys.argv[4:])
