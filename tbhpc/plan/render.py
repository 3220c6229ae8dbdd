"""The memory plan as text (`tbhpc plan`, and the plan's lines in `tbhpc doctor`): pure, so it is
golden-tested (tests/golden/plan_reference*.txt)."""
from __future__ import annotations

import math

from tbhpc.plan.memory import GB, MemoryPlan
from tbhpc.plan.sync import predict, predict_adapter, render as render_sync


def render(p: MemoryPlan) -> str:
    """The plan as text (pure: golden-tested)."""
    s, lay = p.shape, p.layout
    lines = [f"memory plan: {p.model or '(model)'}",
             f"  model     {s.model_type}, {s.params / 1e9:.2f}B parameters: {s.layers} layers, hidden {s.hidden:,}, "
             f"{s.heads}/{s.kv_heads} heads x {s.head_dim}, MLP {s.intermediate:,}, vocab {s.vocab:,}"
             f"{', tied head' if s.tied else ''}",
             f"  layout    {lay.nodes} node(s) x {lay.per_node} {'GPU' if lay.gpu else 'CPU rank'}(s) = {lay.ranks} ranks; "
             f"sequence parallel {lay.sp}, data parallel {lay.dp}; ZeRO-{lay.zero}; "
             f"{'bf16' if lay.dtype_bytes == 2 else 'fp32'}; attention {lay.attention}"
             + (" (assumes flash-attn on the nodes)" if lay.gpu and lay.attention == "flash" else
                " (no flash-attn on the nodes: packed micro-batches pay a T x T mask)" if lay.gpu and lay.attention == "sdpa"
                else ""),
             f"  options   checkpointing {'offloaded' if lay.checkpoint_offload else 'on' if lay.checkpointing else 'off'}, "
             f"tiled MLP {'on' if lay.tiled_mlp else 'off'}, optimizer offload {'on' if lay.offload_optimizer else 'off'}, "
             f"parameter offload {'on' if lay.offload_params else 'off'}, logprob chunk {lay.chunk:,}",
             f"  worst micro-batch: {p.tokens:,} tokens ({math.ceil(p.tokens / lay.sp):,} on each rank of an SP group)",
             f"  per {'GPU' if lay.gpu else 'rank'}, at the peak ({p.phase}):"]
    for t in p.terms:
        lines.append(f"    {t.name:<18} {t.bytes / GB:8.2f} GB  {t.note}")
    if math.isfinite(lay.memory_bytes):
        lines.append(f"    {'total':<18} {p.total / GB:8.2f} GB  of {lay.memory_bytes / GB:.0f} GB: headroom "
                     f"{(lay.memory_bytes - p.total) / GB:.2f} GB")
    else:
        lines.append(f"    {'total':<18} {p.total / GB:8.2f} GB  (CPU ranks: give host_memory_gb to check it)")
    if p.host_terms:
        lines.append("  host memory per node:")
        for t in p.host_terms:
            lines.append(f"    {t.name:<18} {t.bytes / GB:8.2f} GB  {t.note}")
        lines.append(f"    {'total':<18} {p.host_total / GB:8.2f} GB"
                     + (f"  of {lay.host_bytes / GB:.0f} GB" if lay.host_bytes else ""))
    if p.longest_episode:
        lines.append(f"  longest episode that fits: {p.longest_episode:,} tokens")
    if p.packed_total and lay.max_context > lay.microbatch_tokens:
        lines.append(f"  a packed micro-batch of microbatch_tokens {lay.microbatch_tokens:,}: {p.packed_total / GB:.2f} GB")
    if lay.gpu:
        served = s.params * 2                   # vLLM serves bf16
        plans = predict(served, lay.nodes, lay.ranks)
        if lay.lora_rank:                       # the adapter in fp32 (serve/adapter.py)
            plans += (predict_adapter(s.layers * s.lora_layer_params(lay.lora_rank, lay.lora_targets) * 4),)
        lines += render_sync(served, plans, p.sync_transport)
    if p.smallest:
        lines.append(f"  smallest layout for the trainer: {p.smallest}")
    lines.append(f"  verdict: {'fits' if p.fits else p.problem}")
    return "\n".join(lines)
