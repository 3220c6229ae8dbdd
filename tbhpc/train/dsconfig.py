"""The DeepSpeed config of a training run, and the dtype and attention kernel it trains with.

Why apart from the engine: it is pure (golden-tested without DeepSpeed): what ZeRO stage, buffers,
offload and optimiser the TrainConfig asks for, on a GPU or a CPU rank. engine.py builds with it.
"""
from __future__ import annotations

from typing import Any

from tbhpc.plan.memory import zero_buffers
from tbhpc.train.config import TrainConfig


def attention_kernel(gpu: bool) -> str:
    """FlashAttention-2 (varlen: packed episodes never attend to each other at no extra cost) when it
    imports on a GPU node, else SDPA (packing then pays the block mask; see packing.py)."""
    if gpu and flash_attn_state()[0]:
        return "flash_attention_2"
    return "sdpa"


def flash_attn_state() -> tuple[bool, str]:
    """(importable, why not). Found is not enough: a flash-attn wheel built for another torch is found
    but fails to import (undefined symbols), and transformers then fails to build the model."""
    import importlib.util
    if importlib.util.find_spec("flash_attn") is None:
        return False, ""
    try:
        import flash_attn  # noqa: F401
    except Exception as exc:        # ImportError, OSError: an ABI the installed torch does not provide
        first = str(exc).splitlines()[0][:160] if str(exc) else ""
        return False, f"{type(exc).__name__}: {first}"
    return True, ""


def resolved_dtype(cfg: TrainConfig, gpu: bool) -> str:
    return cfg.dtype if cfg.dtype != "auto" else ("bf16" if gpu else "fp32")


def fp32_gradients(zero_stage: int) -> dict:
    """Under bf16, DeepSpeed accumulates gradients in the model's dtype and reduces them in it unless
    told otherwise (engine.get_data_types, communication_data_type): a step sums dozens of micro-batches
    per rank, and bf16's 8 bits of mantissa lose the small ones. ZeRO 1-3 accumulate in fp32 (stage 3
    allocates its gradient partitions in this dtype) and every stage reduces in fp32. Without ZeRO,
    DeepSpeed has no fp32 accumulation for bf16 parameters (it refuses the pair), so only the reduction is fp32."""
    out: dict[str, Any] = {"communication_data_type": "fp32"}
    if zero_stage >= 1:
        out["data_types"] = {"grad_accum_dtype": "fp32"}
    return out


def ds_config(cfg: TrainConfig, gpu: bool, hidden: int) -> dict:
    """The DeepSpeed config (pure: golden-tested). One micro-batch per backward, boundaries set by hand.
    ZeRO's buffer sizes follow the model's width (`plan.memory.zero_buffers`: what the plan counts)."""
    bf16 = resolved_dtype(cfg, gpu) == "bf16"
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    buffers = zero_buffers(hidden)
    if cfg.zero_stage:
        zero["reduce_bucket_size"] = buffers["reduce_bucket_size"]
    if cfg.zero_stage == 3:
        zero.update({"stage3_gather_16bit_weights_on_model_save": True, "overlap_comm": gpu, "contiguous_gradients": True,
                     "reduce_scatter": True,
                     **{k: v for k, v in buffers.items() if k.startswith("stage3_")}})
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": gpu}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": gpu}
    # torch's AdamW everywhere, fused on a GPU: DeepSpeed's own FusedAdam is compiled with nvcc on its
    # first use, on every node; only optimizer offload on a GPU takes DeepSpeed's CPU Adam (a C++ build)
    adamw: dict[str, Any] = {"lr": cfg.lr, "weight_decay": cfg.weight_decay, "betas": list(cfg.betas), "eps": 1e-8,
                             "torch_adam": not (gpu and cfg.offload_optimizer)}
    if gpu and not cfg.offload_optimizer:
        adamw["fused"] = True
    extra: dict[str, Any] = {}
    if bf16:
        extra.update(fp32_gradients(cfg.zero_stage))
    if (cfg.offload_optimizer or cfg.offload_params) and not gpu:
        extra["zero_force_ds_cpu_optimizer"] = False      # a CPU rank keeps torch's AdamW (no C++ build)
    return {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "optimizer": {"type": "AdamW", "params": adamw},
        "bf16": {"enabled": bf16},
        "fp16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        **extra,
    }
