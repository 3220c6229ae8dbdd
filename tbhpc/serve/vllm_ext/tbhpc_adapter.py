"""A LoRA adapter inside a running vLLM worker: load a trainer's adapter in place, and digest the
adapter tensors the worker really computes with.

Why not vLLM's `/v1/load_lora_adapter` with `load_inplace` for every sync: the API server keeps
that request, flag included, and the worker's LRU manager reloads an adapter whose request says
`load_inplace` at *every* scheduler step (from a directory the trainer prunes a few steps later).
So the server registers the adapter's name once over HTTP (the supervisor's null adapter), and
each sync replaces that adapter's weights here, under the same id, with a request that does not
ask for reloads.

What is digested: the worker's stacked LoRA buffers at the adapter's slot (`lora_a_stacked[i]
[slot, 0, :r, :]`, `lora_b_stacked[i][slot, 0, :, :r]`), i.e. what the punica kernels multiply
by, cut back into the checkpoint's tensors (`...q_proj.lora_A.weight` from the fused `qkv_proj`),
each at its global position under tensor parallelism (column-parallel layers hold rows of B and
all of A, row-parallel ones columns of A and all of B), so the supervisor's sum over workers is
the digest of the published tensor. Rank padding (the buffers are `max_lora_rank` wide) must be
zero, and a slice the adapter does not adapt must be zero too: anything else is reported as a
tensor the checkpoint has no digest for, and the check fails.
Runs in the vLLM environment: torch and vLLM objects only.
"""
from __future__ import annotations

import time

from tbhpc_digest import MASK64, block_digest, hexd


def _manager(worker):
    mgr = getattr(worker.model_runner, "lora_manager", None)
    if mgr is None:
        raise RuntimeError("this server was started without LoRA (serve with lora_rank > 0)")
    return mgr


def adapter_id(worker) -> int:
    """The id of the one adapter this worker holds (the supervisor registers exactly one)."""
    ids = sorted(_manager(worker).list_adapters())
    if len(ids) != 1:
        raise RuntimeError(f"the server holds {len(ids)} LoRA adapters, not the one the supervisor registered")
    return ids[0]


def load_adapter(worker, path: str, name: str) -> dict:
    """Replace the registered adapter's weights with the PEFT directory `path`, under its id."""
    from vllm.lora.request import LoRARequest
    lora_id = adapter_id(worker)
    t0 = time.perf_counter()
    worker.add_lora(LoRARequest(lora_name=name, lora_int_id=lora_id, lora_path=path, load_inplace=True))
    return {"adapter_id": lora_id, "load_s": round(time.perf_counter() - t0, 4)}


def _slices(module_name: str, module, packed: dict) -> list[str]:
    head, _, last = module_name.rpartition(".")
    n = len(module.lora_a_stacked)
    subs = packed.get(last) if n > 1 else [last]
    if not subs or len(subs) != n:
        raise RuntimeError(f"{module_name}: {n} LoRA slices but packed modules {subs}")
    return [f"{head}.{s}" if head else s for s in subs]


def _adapted(lora_model, module_name: str, i: int) -> bool:
    lw = lora_model.get_lora(module_name) if lora_model is not None else None
    if lw is None:
        return False
    a = lw.lora_a
    return (a[i] is not None) if isinstance(a, list) else i == 0


def adapter_digests(worker, dtype, tp_rank: int = 0) -> dict:
    """{"dtype", "tensors": {checkpoint adapter tensor: {"shape", "param"}}, "adapter_id", "rank"}:
    this worker's contributions to each adapter tensor's digest (see the module docstring)."""
    t0 = time.perf_counter()
    am = _manager(worker)._adapter_manager
    lora_id = adapter_id(worker)
    slot = am.lora_index_to_id.index(lora_id)
    lora_model = am.get_adapter(lora_id)
    rank = int(lora_model.rank)
    packed = dict(getattr(am, "packed_modules_mapping", None) or {})
    table: dict[str, dict] = {}

    def add(name: str, value: int, shape) -> None:
        entry = table.setdefault(name, {"shape": list(shape)})
        entry["param"] = (entry.get("param", 0) + value) & MASK64

    for module_name, module in am.modules.items():
        if not isinstance(getattr(module, "lora_a_stacked", None), (tuple, list)):
            continue                    # not a linear layer with LoRA (embeddings and heads stack differently)
        names = {c.__name__ for c in type(getattr(module, "base_layer", module)).__mro__}
        row_parallel = "RowParallelLinear" in names
        tp = int(getattr(module, "tp_size", 1) or 1)
        replicas = int(getattr(module, "num_kv_head_replicas", 1) or 1)
        output_ids = getattr(module, "output_ids", None)
        for i, name in enumerate(_slices(module_name, module, packed)):
            a_all = module.lora_a_stacked[i][slot, 0]
            b_all = module.lora_b_stacked[i][slot, 0]
            a, b = a_all[:rank].to(dtype), b_all[:, :rank].to(dtype)
            if bool(a_all[rank:].any()) or bool(b_all[:, rank:].any()):
                add(f"{name}.lora_padding", 1, (0,))
            if not (_adapted(lora_model, module_name, i) or bool(a.any()) or bool(b.any())):
                continue
            if tp == 1:
                add(f"{name}.lora_A.weight", block_digest(a), a.shape)
                add(f"{name}.lora_B.weight", block_digest(b), b.shape)
            elif row_parallel:                  # A: this rank's columns; B: whole on every rank
                k = a.shape[1]
                add(f"{name}.lora_A.weight", block_digest(a, 0, tp_rank * k, k * tp), (rank, k * tp))
                if tp_rank == 0:
                    add(f"{name}.lora_B.weight", block_digest(b), b.shape)
            else:                               # A: whole on every rank; B: this rank's rows
                shard = int(output_ids[i]) if output_ids is not None else tp_rank
                kv = replicas > 1 and i > 0
                if tp_rank == 0:
                    add(f"{name}.lora_A.weight", block_digest(a), a.shape)
                if not kv or tp_rank % replicas == 0:
                    add(f"{name}.lora_B.weight", block_digest(b, shard * b.shape[0]), b.shape)
    tensors = {n: {"shape": e["shape"], "param": hexd(e["param"])} for n, e in table.items()}
    return {"dtype": str(dtype).removeprefix("torch."), "tensors": tensors, "kernel_layers": 0,
            "adapter_id": lora_id, "rank": rank, "digest_s": round(time.perf_counter() - t0, 4)}


def flip_adapter(worker, tensor: str) -> None:
    """Test-only: move one element of adapter tensor `tensor` (`...q_proj.lora_B.weight`) by one ulp
    in the worker's stacked buffer."""
    import torch
    from tbhpc_digest import _BITS
    am = _manager(worker)._adapter_manager
    lora_id = adapter_id(worker)
    slot, rank = am.lora_index_to_id.index(lora_id), int(am.get_adapter(lora_id).rank)
    packed = dict(getattr(am, "packed_modules_mapping", None) or {})
    which, _, _ = tensor.rpartition(".weight")[0].rpartition(".")
    for module_name, module in am.modules.items():
        if not isinstance(getattr(module, "lora_a_stacked", None), (tuple, list)):
            continue
        for i, name in enumerate(_slices(module_name, module, packed)):
            if name != which:
                continue
            buf = (module.lora_a_stacked if ".lora_A." in tensor else module.lora_b_stacked)[i][slot, 0]
            part = buf[:rank] if ".lora_A." in tensor else buf[:, :rank]
            ints, _, exponent, _ = _BITS[buf.dtype]
            flat = part.contiguous().view(ints).reshape(-1)
            at = int(torch.nonzero(flat & exponent)[0])
            flat[at] ^= 1
            part.copy_(flat.view(buf.dtype).reshape(part.shape))
            return
    raise RuntimeError(f"no LoRA slice named {which!r} on this worker")
