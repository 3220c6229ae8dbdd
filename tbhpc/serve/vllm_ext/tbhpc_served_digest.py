"""Digests of the weights a vLLM worker computes with, named like the checkpoint's tensors.

Why not just `model.named_parameters()`: what the server holds is not the checkpoint's layout.
vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (rows stacked in the order of
the model's `packed_modules_mapping`), pads vocabulary rows, ties `lm_head` to the embedding, and
on CPU moves every linear weight into a packed kernel copy (oneDNN handle, AMX sgl-kernel, zentorch)
and frees the parameter. So each tensor is digested where it really lives:
- `param`: a parameter that still holds data, cut back into the checkpoint tensors it fuses;
- `kernel`: a packed copy, read back exactly by running the layer's own kernel closure on blocks
  of an identity matrix (x = I: out = W^T; one non-zero term per output, so the product and the
  dtype round-trip are exact), then cut the same way. This is the compute path the AMX bug broke
  (a stale packed lm_head over a new embedding): the digest reads what the kernel multiplies by,
  not what the parameter says.
Tensor parallelism > 1 is not covered yet (each rank holds row or column shards whose global
positions this module does not derive): the report says so and the functional probe remains.
Runs in the vLLM environment: torch and vLLM objects only.
"""
from __future__ import annotations

import time

import torch

from tbhpc_digest import MASK64, block_digest, hexd

PACKED_PATHS = {"onednn", "sgl", "zentorch"}      # kernel paths that keep their own copy of the weight
IDENTITY_BLOCK = 1 << 20                           # output elements per identity block (memory bound)


def _row_shards(module_name: str, module, rows: int, packed: dict) -> list[tuple[str, int, int]]:
    """(checkpoint module name, first local row, row count) for each checkpoint tensor whose rows
    this module's weight (dim 0) holds."""
    head, _, last = module_name.rpartition(".")
    subs = packed.get(last)
    sizes = getattr(module, "output_partition_sizes", None)
    if subs and sizes and len(sizes) == len(subs) and sum(sizes) == rows:
        out, start = [], 0
        for sub, size in zip(subs, sizes):
            out.append((f"{head}.{sub}" if head else sub, start, int(size)))
            start += int(size)
        return out
    shard = getattr(module, "shard_indices", None)
    if shard is not None:                              # vocabulary rows past the real vocab are padding
        return [(module_name, 0, int(shard.org_vocab_end_index - shard.org_vocab_start_index))]
    return [(module_name, 0, rows)]


def _add(table: dict, name: str, kind: str, value: int, shape) -> None:
    entry = table.setdefault(name, {"shape": list(shape)})
    entry[kind] = (entry.get(kind, 0) + value) & MASK64


def _kernel_blocks(module) -> tuple[int, int] | None:
    """(rows N, columns K) of the weight a packed kernel multiplies by."""
    k = getattr(module, "input_size_per_partition", None) or getattr(module, "embedding_dim", None)
    if not k:
        return None
    sizes = getattr(module, "output_partition_sizes", None)
    n = sum(sizes) if sizes else getattr(module, "num_embeddings_per_partition", None)
    return (int(n), int(k)) if n else None


def read_kernel_weight(module, dtype: torch.dtype):
    """Yield (first column, W[:, block]) of the weight the layer's kernel computes with, by
    running its closure on identity rows (exact: each output has one non-zero product)."""
    n, k = _kernel_blocks(module)
    step = max(1, IDENTITY_BLOCK // n)
    device = next((p.device for p in module.parameters()), torch.device("cpu"))
    for k0 in range(0, k, step):
        kb = min(step, k - k0)
        eye = torch.zeros(kb, k, dtype=dtype, device=device)
        eye[torch.arange(kb), torch.arange(k0, k0 + kb)] = 1
        out = module.cpu_linear(eye, module.weight, None)    # [kb, N] = W[:, k0:k0+kb]^T
        yield k0, out.t()


def served_digests(model, dtype: torch.dtype, kernel_path, shards: int = 1) -> dict:
    """{checkpoint tensor name: {"shape", "param"?, "kernel"?}} (digests as hex) for one worker
    holding the whole model (`shards`: tensor x pipeline parallel size)."""
    t0 = time.perf_counter()
    if shards != 1:
        return {"unsupported": f"the model is split over {shards} workers (tensor/pipeline parallel): "
                               "the digest covers one"}
    packed = dict(getattr(model, "packed_modules_mapping", None) or {})
    table: dict = {}
    seen: set[int] = set()
    n_kernel = 0
    for mname, module in model.named_modules():
        for pname, p in module.named_parameters(recurse=False):
            if id(p) in seen or p.is_meta or p.numel() == 0:      # tied twice, or freed by a packed kernel
                continue
            seen.add(id(p))
            x = p.detach().to(dtype)
            for base, r0, nrows in _row_shards(mname, module, x.shape[0] if x.ndim else 1, packed):
                part = x[r0:r0 + nrows] if x.ndim else x
                _add(table, f"{base}.{pname}", "param", block_digest(part), part.shape)
        if kernel_path(module) in PACKED_PATHS and (shape := _kernel_blocks(module)):
            n, k = shape
            shards = _row_shards(mname, module, n, packed)
            for k0, w in read_kernel_weight(module, dtype):
                for base, r0, nrows in shards:
                    _add(table, f"{base}.weight", "kernel", block_digest(w[r0:r0 + nrows], 0, k0, k), (nrows, k))
            n_kernel += 1
    tensors = {name: {kk: (hexd(v) if kk != "shape" else v) for kk, v in e.items()} for name, e in table.items()}
    return {"dtype": str(dtype).removeprefix("torch."), "tensors": tensors, "kernel_layers": n_kernel,
            "digest_s": round(time.perf_counter() - t0, 4)}
