"""The shape of a model as the memory plan needs it, read from its `config.json` alone (no
weights): dense decoder-only models (Qwen2/3, Llama, Mistral and alike), their parameter counts
per layer and head, and what LoRA adds to them.

Why apart from the plan's terms (memory.py): the shape is the model's, the terms the run's; the
fake-tensor checks (train/memcheck.py) and the benchmarks build models of a given shape too.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tbhpc.errors import UserError


@dataclass(frozen=True)
class ModelShape:
    """What the plan needs of a dense decoder-only model (Qwen2/3, Llama, Mistral and alike)."""
    model_type: str
    vocab: int
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    tied: bool
    qk_norm: bool
    attn_bias: bool

    @classmethod
    def from_config(cls, cfg: dict, source: str = "config.json") -> "ModelShape":
        text = cfg.get("text_config") or cfg
        for key in ("num_experts", "num_local_experts", "n_routed_experts"):
            if (text.get(key) or 0) > 0:
                raise UserError(f"{source}: field {key!r}: the memory plan covers dense models; mixture-of-experts is not planned")
        need = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
        missing = [k for k in need if not isinstance(text.get(k), int) or text.get(k) <= 0]
        if missing:
            raise UserError(f"{source}: field {missing[0]!r} is missing or not a positive integer")
        heads = text["num_attention_heads"]
        return cls(model_type=str(text.get("model_type") or cfg.get("model_type") or "?"), vocab=text["vocab_size"],
                   hidden=text["hidden_size"], layers=text["num_hidden_layers"], heads=heads,
                   kv_heads=int(text.get("num_key_value_heads") or heads),
                   head_dim=int(text.get("head_dim") or text["hidden_size"] // heads),
                   intermediate=text["intermediate_size"],
                   tied=bool(cfg.get("tie_word_embeddings", text.get("tie_word_embeddings", False))),
                   qk_norm=str(text.get("model_type", "")).startswith("qwen3"),
                   attn_bias=bool(text.get("attention_bias", str(text.get("model_type", "")) == "qwen2")))

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h = self.hidden
        attn = h * self.q_width + 2 * h * self.kv_width + self.q_width * h
        if self.attn_bias:
            attn += self.q_width + 2 * self.kv_width
        norms = 2 * h + (2 * self.head_dim if self.qk_norm else 0)
        return attn + 3 * h * self.intermediate + norms

    @property
    def head_params(self) -> int:
        return self.vocab * self.hidden

    def projection(self, name: str) -> tuple[int, int]:
        """(in, out) features of a decoder layer's linear layer, by its HF name."""
        h, q, kv, m = self.hidden, self.q_width, self.kv_width, self.intermediate
        dims = {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                "gate_proj": (h, m), "up_proj": (h, m), "down_proj": (m, h)}
        if name not in dims:
            raise UserError(f"train config: field 'lora_targets': the plan knows the projections {', '.join(dims)}, "
                            f"not {name!r}")
        return dims[name]

    def lora_layer_params(self, rank: int, targets: tuple[str, ...]) -> int:
        """Adapter parameters of one layer: rank x (in + out) for each adapted projection."""
        return sum(rank * sum(self.projection(t)) for t in targets)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.head_params * (1 if self.tied else 2) + self.hidden


def read_shape(model: str) -> ModelShape:
    """The shape of the model a config names: a directory holding config.json (weights not needed)."""
    if not model:
        raise UserError("train config: field 'model' is required (an HF model directory; its config.json is enough "
                        "for the plan)")
    path = Path(model).expanduser() / "config.json"
    if not path.is_file():
        raise UserError(f"train config: field 'model': {path} not found (the plan reads the model's config.json)")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read it as JSON ({str(exc).splitlines()[0]})") from None
    if not isinstance(doc, dict):
        raise UserError(f"{path}: expected a JSON object")
    return ModelShape.from_config(doc, str(path))
