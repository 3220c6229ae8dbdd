"""Digests of the weights a vLLM worker computes with, named like the checkpoint's tensors.

Why not just `model.named_parameters()`: what the server holds is not the checkpoint's layout.
vLLM fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` (rows stacked in the order of
the model's `packed_modules_mapping`), pads vocabulary rows, ties `lm_head` to the embedding, and
on CPU moves every linear weight into a packed kernel copy (oneDNN handle, AMX sgl-kernel, zentorch)
and frees the parameter. So each tensor is digested where it really lives:
- `param`: a parameter that still holds data, cut back into the checkpoint tensors it fuses;
- `kernel`: a packed copy, read back exactly by running the layer's own kernel closure on blocks
  of an identity matrix (x = I: out = W^T; one non-zero term per output, so the product and the
  dtype round-trip are exact), then cut the same way. This is the compute path a reload can leave
  stale (a packed lm_head over a new embedding: tbhpc_vllm_worker.py): the digest reads what the
  kernel multiplies by, not what the parameter says.
With tensor parallelism each worker holds row or column shards (and replicated norms, key/value
heads copied to several ranks when they are fewer than the ranks): each worker digests its pieces
at their positions in the checkpoint tensor, replicated pieces on their first holder only, and the
supervisor adds the workers' sums into the tensor's digest (the definition is a sum over elements,
tbhpc_digest.py), so a shard that is missing, doubled or stale changes the total.
Runs in the vLLM environment: torch and vLLM objects only.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tbhpc_digest import MASK64, block_digest, hexd

PACKED_PATHS = {"onednn", "sgl", "zentorch"}      # kernel paths that keep their own copy of the weight
IDENTITY_BLOCK = 1 << 20                           # output elements per identity block (memory bound)


@dataclass(frozen=True)
class Piece:
    """Rows [row0, row0 + rows) of a worker's tensor hold the checkpoint tensor `name`'s rows from
    `grow0` (columns from `gcol0` of `gcols`, None: all of them); `counted`: this worker is the one
    whose copy enters the sum (replicated pieces count once, on their first holder)."""
    name: str
    row0: int
    rows: int
    grow0: int = 0
    gcol0: int = 0
    gcols: int | None = None
    counted: bool = True


def _tp(module) -> tuple[int, int]:
    return int(getattr(module, "tp_rank", 0) or 0), int(getattr(module, "tp_size", 1) or 1)


def _pieces(module_name: str, module, rows: int, packed: dict, tp_rank: int, ndim: int = 2) -> list[Piece]:
    """Where each row block of this worker's copy of `module`'s weight sits in the checkpoint: the
    fused sub-tensors (q/k/v, gate/up), each at its tensor-parallel offset; key/value heads that
    several ranks replicate counted on the first of them; vocabulary rows past the real vocab
    (padding) left out; the columns a row-parallel layer holds; everything else replicated."""
    head, _, last = module_name.rpartition(".")
    subs = packed.get(last)
    sizes = [int(s) for s in getattr(module, "output_partition_sizes", None) or []]
    rank, size = _tp(module)
    kind = type(module).__mro__
    names = {c.__name__ for c in kind}
    if "VocabParallelEmbedding" in names and getattr(module, "shard_indices", None) is not None:
        shard = module.shard_indices
        return [Piece(module_name, 0, int(shard.org_vocab_end_index - shard.org_vocab_start_index),
                      int(shard.org_vocab_start_index))]
    if "RowParallelLinear" in names and ndim < 2:          # its bias: whole on every rank
        return [Piece(module_name, 0, rows, counted=tp_rank == 0)]
    if "RowParallelLinear" in names:
        k = int(module.input_size_per_partition)
        return [Piece(module_name, 0, rows, 0, rank * k, k * size)]
    if subs and len(subs) == len(sizes) and sum(sizes) == rows:          # fused: q/k/v, gate/up
        replicas = int(getattr(module, "num_kv_head_replicas", 1) or 1) if "QKVParallelLinear" in names else 1
        out, start = [], 0
        for i, (sub, n) in enumerate(zip(subs, sizes)):
            kv = replicas > 1 and i > 0                  # q, then k and v (replicated when kv heads < tp)
            owner = rank // replicas if kv else rank
            out.append(Piece(f"{head}.{sub}" if head else sub, start, n, owner * n,
                             counted=not kv or rank % replicas == 0))
            start += n
        return out
    if "ColumnParallelLinear" in names:
        return [Piece(module_name, 0, rows, rank * rows)]
    return [Piece(module_name, 0, rows, counted=tp_rank == 0)]


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


def _piece_digest(x: torch.Tensor, piece: Piece, col0: int = 0, width: int | None = None) -> int:
    """The digest contribution of one piece of a worker's tensor (`col0`, `width`: the first local
    column `x` holds and the local width, for kernel copies read back a block of columns at a time)."""
    if x.ndim == 0:
        return block_digest(x)
    part = x[piece.row0:piece.row0 + piece.rows]
    if part.ndim == 1:                                      # a bias or norm: rows of one column
        return block_digest(part.reshape(-1, 1), piece.grow0, 0, 1)
    cols = piece.gcols if piece.gcols is not None else (width or part[0].numel())
    return block_digest(part, piece.grow0, piece.gcol0 + col0, cols)


def served_digests(model, dtype: torch.dtype, kernel_path, tp_rank: int = 0) -> dict:
    """{"tensors": {checkpoint tensor name: {"shape", "param"?, "kernel"?}}, ...}: this worker's
    contributions (hex) to each checkpoint tensor's digest, at the tensor's global positions. A
    worker holding the whole model reports whole digests; tensor-parallel workers report partial
    sums that add up (mod 2^64) to them (`merge_served` on the supervisor's side)."""
    t0 = time.perf_counter()
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
            rows = x.shape[0] if x.ndim else 1
            for piece in _pieces(mname, module, rows, packed, tp_rank, x.ndim):
                if piece.counted:
                    _add(table, f"{piece.name}.{pname}", "param", _piece_digest(x, piece), (piece.rows, *x.shape[1:]))
        if kernel_path(module) in PACKED_PATHS and (shape := _kernel_blocks(module)):
            n, k = shape
            pieces = [pc for pc in _pieces(mname, module, n, packed, tp_rank, 2) if pc.counted]
            for k0, w in read_kernel_weight(module, dtype):
                for piece in pieces:
                    _add(table, f"{piece.name}.weight", "kernel", _piece_digest(w, piece, k0, k), (piece.rows, k))
            n_kernel += 1
    tensors = {name: {kk: (hexd(v) if kk != "shape" else v) for kk, v in e.items()} for name, e in table.items()}
    return {"dtype": str(dtype).removeprefix("torch."), "tensors": tensors, "kernel_layers": n_kernel,
            "digest_s": round(time.perf_counter() - t0, 4)}
