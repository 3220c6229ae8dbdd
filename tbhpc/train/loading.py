"""Building the policy a trainer rank trains: under ZeRO-3, partitioned from the first byte.

Why not `from_pretrained` and let DeepSpeed partition afterwards: then every rank first holds the
whole model (54 GB in bf16 for 27B parameters: ~430 GB of host memory on an 8-GPU node, and the
whole model on each GPU before ZeRO-3 shards it). transformers' own ZeRO-3 path
(`HfDeepSpeedConfig` before `from_pretrained`) builds the model partitioned but then memory-maps
every checkpoint shard at once and copies all of it on rank 0, whose resident memory passes the
model's size.

Here the model is built inside `deepspeed.zero.Init` (each parameter partitioned as it is
created, no random initialisation) and each parameter is then filled from the safetensors files
with plain reads, one module at a time: its parameters gathered on every rank, rank 0 reads them
into a buffer and DeepSpeed re-partitions them from rank 0. A rank's peak is its partition
(1/world of the model) plus one module's parameters gathered and one read buffer.
"""
from __future__ import annotations

import json
import struct
from pathlib import Path

import torch

from tbhpc.errors import UserError

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool}


def checkpoint_index(model_dir: str | Path) -> dict[str, tuple[Path, dict, int]]:
    """{tensor name: (file, header entry, data offset)} over a directory's safetensors files
    (one `model.safetensors` or the shards named by `model.safetensors.index.json`)."""
    d = Path(model_dir)
    index = d / "model.safetensors.index.json"
    if index.is_file():
        files = sorted({d / f for f in json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()})
    elif (d / "model.safetensors").is_file():
        files = [d / "model.safetensors"]
    else:
        raise UserError(f"{d}: no model.safetensors (or its index); the partitioned loader reads safetensors only "
                        f"(save the model with save_pretrained(safe_serialization=True))")
    out: dict[str, tuple[Path, dict, int]] = {}
    for f in files:
        with open(f, "rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            header = json.loads(fh.read(n))
        for name, entry in header.items():
            if name != "__metadata__":
                out[name] = (f, entry, 8 + n)
    return out


def read_tensor(file: Path, entry: dict, base: int) -> torch.Tensor:
    """One tensor read into fresh memory with a plain read (no memory map left behind)."""
    begin, end = entry["data_offsets"]
    dtype = _DTYPES.get(entry["dtype"])
    if dtype is None:
        raise UserError(f"{file}: tensor dtype {entry['dtype']} is not supported by the partitioned loader")
    raw = torch.empty(end - begin, dtype=torch.uint8)
    with open(file, "rb") as fh:
        fh.seek(base + begin)
        if fh.readinto(raw.numpy()) != end - begin:
            raise UserError(f"{file}: truncated (a tensor's bytes end past the file)")
    return raw.view(dtype).reshape(entry["shape"])


def load_hf(model_dir: str, dtype, attn_implementation: str):
    """The whole model in this process (ZeRO stages 0-2, and any non-DeepSpeed use)."""
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, attn_implementation=attn_implementation)


def load_partitioned(model_dir: str, dtype, attn_implementation: str, ds_config: dict, rank: int):
    """The model built and filled under ZeRO-3 partitioning (module docstring)."""
    import deepspeed
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    try:
        from transformers.initialization import no_init_weights
    except ImportError:                     # transformers releases that keep it beside the model code
        from transformers.modeling_utils import no_init_weights

    config = AutoConfig.from_pretrained(model_dir)
    index = checkpoint_index(model_dir)
    # dtype=None: the config's bf16/fp16 flags decide what zero.Init partitions into. An explicit
    # dtype is ignored by DeepSpeed 0.19.8 on CPUs without fp16 support (bf16 instead: precision.py)
    with no_init_weights(), deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=None):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation=attn_implementation)
    model.tie_weights()          # the output head shares the embedding's partitioned tensor (tie_word_embeddings)
    missing = []
    with torch.no_grad():
        for prefix, module in model.named_modules():
            params = dict(module.named_parameters(prefix=prefix, recurse=False))
            if params:
                missing += [k for k in params if k not in index and not _tied_to_loaded(model, k, index)]
                with deepspeed.zero.GatheredParameters(list(params.values()), modifier_rank=0):
                    if rank == 0:
                        for name, p in params.items():
                            if name in index:
                                p.data.copy_(read_tensor(*index[name]).to(p.dtype))
            for name, buf in module.named_buffers(prefix=prefix, recurse=False):
                if name in index and buf is not None:
                    buf.copy_(read_tensor(*index[name]).to(buf.dtype))
    if missing:
        raise UserError(f"{model_dir}: the checkpoint lacks {len(missing)} of the model's parameters "
                        f"(first: {missing[0]})")
    model.name_or_path = str(model_dir)
    if (Path(model_dir) / "generation_config.json").is_file():      # what vLLM reads from the published copies
        model.generation_config = GenerationConfig.from_pretrained(model_dir)
    return model


def _tied_to_loaded(model, name: str, index: dict) -> bool:
    """A parameter the checkpoint leaves out because it is tied to one it holds (lm_head <- embed)."""
    if not getattr(model.config, "tie_word_embeddings", False):
        return False
    tied = getattr(model, "_tied_weights_keys", None) or {}
    if isinstance(tied, dict):          # transformers 5: {tied name: the name it shares}
        return name in tied and tied[name] in index
    return name in tied                 # earlier releases list the tied names only
