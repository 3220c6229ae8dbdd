"""LoRA for the trainer: the base frozen, low-rank adapters trained, adapters (or merged weights) published.

What leaves the trainer: by default each step's adapter alone (`adapter_tensors`, written in PEFT's
format by serve/adapter.py), which a LoRA-serving vLLM loads in place over the base; with
`lora_sync: merged`, or for a merged export, W + (alpha / r) B A under the base name (`merged`), so
everything that speaks the base model's names and shapes (the HF export, the digest, the fingerprint)
works unchanged. Only the adapters and their optimiser states take memory and gradient traffic.

Gradient checkpointing with a frozen base: reentrant checkpointing recomputes a layer only when
one of its *inputs* requires grad, and with frozen embeddings none does, so the adapters inside
would get no gradient; the trainer uses non-reentrant checkpointing when LoRA is on.
"""
from __future__ import annotations

PREFIX = "base_model.model."


def wrap(model, rank: int, alpha: float, dropout: float, targets: list[str], seed: int = 0):
    """The model with LoRA adapters on `targets` (peft); every other parameter frozen. The adapters'
    random init (A; B starts at zero) is drawn from `seed`: the same on every rank and every run."""
    import torch
    from peft import LoraConfig, get_peft_model
    from tbhpc.errors import UserError
    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    missing = [t for t in targets if t not in names]
    if missing:
        raise UserError(f"train config: field 'lora_targets': the model has no module named {missing[0]!r} "
                        f"(its linear layers include {', '.join(sorted(n for n in names if n.endswith('proj'))[:8])})")
    config = LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=dropout, target_modules=list(targets), bias="none")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_peft_model(model, config)


def is_lora(module) -> bool:
    return hasattr(module, "peft_config")


def base_name(name: str) -> str:
    """peft's parameter name -> the base model's (`base_model.model.x.q_proj.base_layer.weight` -> `x.q_proj.weight`)."""
    return name.removeprefix(PREFIX).replace(".base_layer.", ".")


def adapted_layers(module) -> dict[int, object]:
    """id(base_layer.weight) -> its LoRA layer, for every adapted linear layer."""
    from peft.tuners.lora import LoraLayer
    return {id(m.base_layer.weight): m for m in module.modules() if isinstance(m, LoraLayer)}


def merged(layer, base_weight):
    """W + scale * B @ A for the default adapter, in the base weight's dtype (tensors already gathered)."""
    a = layer.lora_A["default"].weight
    b = layer.lora_B["default"].weight
    scale = layer.scaling["default"]
    return (base_weight.float() + scale * (b.float() @ a.float())).to(base_weight.dtype)


def layer_params(layer) -> list:
    """What must be gathered to merge one layer: its base weight and both adapter matrices."""
    return [layer.base_layer.weight, layer.lora_A["default"].weight, layer.lora_B["default"].weight]


def adapter_tensors(module, zero3: bool, keep: bool) -> dict:
    """{"model.layers.0.self_attn.q_proj.lora_A.weight": float32 tensor, ...} of every adapter, B
    scaled by alpha / r (serve/adapter.py says why), on the ranks where `keep` (empty elsewhere).
    Collective under ZeRO-3: each layer's two matrices are gathered, copied and released in turn."""
    from contextlib import nullcontext

    from peft.tuners.lora import LoraLayer
    out = {}
    for name, m in module.named_modules():
        if not isinstance(m, LoraLayer):
            continue
        a, b = m.lora_A["default"].weight, m.lora_B["default"].weight
        if zero3:
            import deepspeed
            gather = deepspeed.zero.GatheredParameters([a, b], modifier_rank=None)
        else:
            gather = nullcontext()
        with gather:
            if keep:
                base = name.removeprefix(PREFIX)
                out[f"{base}.lora_A.weight"] = a.data.detach().float().cpu().clone()
                out[f"{base}.lora_B.weight"] = (b.data.detach().float() * m.scaling["default"]).cpu()
    return out


def load_adapted(base_model: str, adapter_dir: str, dtype=None):
    """The base model with an adapter directory merged in (transformers + peft, on the CPU): what a
    server serving that adapter computes, as a plain transformers model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM
    base = AutoModelForCausalLM.from_pretrained(base_model, dtype=dtype or torch.float32)
    return PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()


def publish_adapter_checkpoint(run_dir, step: int, peft_model, tokenizer, rank: int, targets: list[str], base_model: str):
    """An adapter of your own (a peft model on the CPU) published as a LoRA run's step: its tensors
    (B scaled), their digests in the served dtype, the adapted model's fingerprint, then the marker.
    The single-process counterpart of the trainer's publish_adapter (train/publish.py)."""
    from pathlib import Path

    from tbhpc.serve.adapter import adapter_digests, write_adapter
    from tbhpc.serve.checkpoints import CKPT_DIR, mark_ready, version_name
    from tbhpc.serve.digest import served_dtypes
    from tbhpc.serve.fingerprint import compute_fingerprint
    tensors = adapter_tensors(peft_model, False, True)
    fp = compute_fingerprint(peft_model, tokenizer)
    digests = adapter_digests(tensors, served_dtypes(run_dir, fp.dtype))
    dest = write_adapter(Path(run_dir) / CKPT_DIR / version_name(step), tensors, rank, targets, base_model)
    return mark_ready(run_dir, step, dest, fp, digests, weights="adapter")
