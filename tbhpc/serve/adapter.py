"""LoRA adapters on disk in PEFT's format: what a LoRA run publishes each step and exports.

Why the scale is folded into B: PEFT and vLLM both compute x A^T B^T (alpha / r), and vLLM folds
that scale into its copy of B in the serving dtype when it loads (`lora_b *= scaling`), a rounding
the publisher would have to reproduce bit for bit to digest what the server holds. An adapter
written with B already scaled (in float32) and `lora_alpha = r` computes the same update, every
reader applies a scale of exactly 1, and the digest of each tensor cast to the served dtype is the
digest of what the server multiplies by.

Why a null adapter: the server serves the base model under `NAME-base` and the run's adapter under
the served name that clients ask for, so the name never changes when the first adapter arrives.
Until then it serves an adapter whose B is zero (one rank-1 adapter on the first layer's down
projection): it adds exact zeros, so its outputs are the base model's.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
# the ranks vLLM accepts for --max-lora-rank (its LoRAConfig.max_lora_rank)
VLLM_MAX_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def is_adapter(path: Path | str | None) -> bool:
    return path is not None and (Path(path) / CONFIG_FILE).is_file()


def vllm_max_rank(rank: int) -> int:
    """The smallest --max-lora-rank vLLM accepts that holds a rank-`rank` adapter."""
    for r in VLLM_MAX_RANKS:
        if r >= rank:
            return r
    raise ValueError(f"LoRA rank {rank} is above vLLM's largest ({VLLM_MAX_RANKS[-1]})")


def peft_config(rank: int, targets: list[str], base_model: str = "") -> dict:
    """A PEFT LoraConfig (as JSON) with the scale folded in: lora_alpha = r."""
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": int(rank), "lora_alpha": int(rank),
            "lora_dropout": 0.0, "target_modules": sorted(targets), "bias": "none", "fan_in_fan_out": False,
            "use_rslora": False, "use_dora": False, "modules_to_save": None, "init_lora_weights": True,
            "inference_mode": True, "base_model_name_or_path": str(base_model)}


def write_adapter(dest: Path | str, tensors: dict[str, Any], rank: int, targets: list[str],
                  base_model: str = "", tokenizer: Any = None) -> Path:
    """`dest` written whole or not at all: adapter_config.json and adapter_model.safetensors with
    `tensors` ({"model.layers.0.self_attn.q_proj.lora_A.weight": tensor, ...}, B already scaled)
    under PEFT's names."""
    from safetensors.torch import save_file

    from tbhpc.serve.checkpoints import whole_dir
    dest = Path(dest)
    with whole_dir(dest) as tmp:
        save_file({PEFT_PREFIX + n: t.contiguous() for n, t in tensors.items()}, str(tmp / WEIGHTS_FILE),
                  metadata={"format": "pt"})
        (tmp / CONFIG_FILE).write_text(json.dumps(peft_config(rank, targets, base_model), indent=1) + "\n")
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
    return dest


def read_adapter(path: Path | str) -> dict[str, Any]:
    """{name without PEFT's prefix: tensor} of an adapter directory."""
    from safetensors.torch import load_file
    return {n.removeprefix(PEFT_PREFIX): t for n, t in load_file(str(Path(path) / WEIGHTS_FILE)).items()}


def adapter_digests(tensors: dict[str, Any], dtypes: list[str]) -> dict[str, dict]:
    """{dtype: digest table} of an adapter's tensors cast to each dtype (serve/digest.py)."""
    from tbhpc.serve.digest import digest_each, digest_table
    return {dt: digest_table(digest_each(tensors, dt), dt) for dt in dtypes}


def write_null_adapter(dest: Path | str, base_model: str) -> Path:
    """A rank-1 adapter of zeros on the first layer's MLP down projection of `base_model` (its
    config.json: a Llama/Qwen/Mistral-style decoder): the base model's outputs, served under the
    adapter's name until the run's first adapter replaces it."""
    import torch
    cfg = json.loads((Path(base_model) / "config.json").read_text())
    cfg = cfg.get("text_config", cfg)
    inner, hidden = int(cfg["intermediate_size"]), int(cfg["hidden_size"])
    name = "model.layers.0.mlp.down_proj"
    return write_adapter(dest, {f"{name}.lora_A.weight": torch.zeros(1, inner),
                                f"{name}.lora_B.weight": torch.zeros(hidden, 1)}, 1, ["down_proj"], base_model)

