"""What lets one episode of 100k+ tokens through a training step: sequence parallelism, tiled
MLPs, gradient checkpoints kept in host memory. Each is a TrainConfig field, each off by default,
and each changes only where memory goes, never the update (tests/test_train_longseq.py compares
every one with the plain step).

- `sp_size` (Ulysses, DeepSpeed's `UlyssesSPAttentionHF`): the ranks of one SP group share each
  micro-batch, every rank holding 1/sp of its tokens through the whole model except attention,
  where an all-to-all swaps the sequence split for a head split. Activations per rank shrink by
  sp. The group pools its episodes (`sp_share`), and `sp_slice` cuts each packed micro-batch
  into equal slices (padded with masked tokens). SDPA under SP attends causally over the whole
  gathered sequence (Ulysses drops the mask), so without FlashAttention every micro-batch holds
  one episode (`packing.effective_budget`).
- `tiled_mlp` (DeepSpeed's `TiledMLP`): each MLP runs on slices of at most hidden_size tokens and
  recomputes them in the backward, so its `[t, intermediate]` activations exist for one slice at
  a time. Ranks agree on the slice count (ZeRO-3 gathers parameters inside each call).
- `checkpoint_offload`: gradient checkpointing keeps each layer's input (t x hidden per layer,
  21 GB for 64 layers at 32k tokens and hidden 5,120); here that input waits in host memory and
  comes back for the layer's recompute.
"""
from __future__ import annotations

import math
import types
from collections import Counter
from dataclasses import replace

import torch

from tbhpc.errors import UserError
from tbhpc.train.packing import Packed

USED: Counter = Counter()       # how often each option engaged in this process (tiled MLP calls, offloaded recomputes)


# ---- sequence parallelism -------------------------------------------------------------------------
def register_ulysses(model, attn_implementation: str, sp_size: int):
    """Route `model`'s attention through Ulysses SP; returns the mpu DeepSpeed is initialised with.
    Eval-mode forwards (fingerprints, generation) bypass it: they run whole on every rank."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    cfg = model.config.get_text_config()
    heads, kv = cfg.num_attention_heads, cfg.num_key_value_heads
    if heads % sp_size or kv % sp_size:
        # (Ulysses could replicate key/value heads when sp > kv, but it then rewrites the attention modules'
        # num_key_value_groups, which breaks the whole-sequence forwards of eval mode: not offered)
        raise UserError(f"train config: field 'sp_size' ({sp_size}) must divide the model's {heads} attention heads "
                        f"and its {kv} key/value heads")
    return UlyssesSPAttentionHF.register_with_transformers(model, attn_implementation, sp_size, micro_batch_size=1,
                                                           seq_length_is_variable=True, disable_in_eval=True)


def sp_share(packs: list[Packed], group, sp_size: int) -> list[Packed]:
    """Every rank of an SP group gets the group's micro-batches (its own and its peers', in rank
    order): they are processed together, each rank holding its slice."""
    import torch.distributed as dist
    gathered: list = [None] * sp_size
    dist.all_gather_object(gathered, packs, group=group)
    return [p for part in gathered for p in part]


def sp_slice(p: Packed, sp_rank: int, sp_size: int, count_episodes: bool) -> Packed:
    """This rank's equal slice of micro-batch `p`, per position (position i predicts token i+1).
    The row is padded to a multiple of sp_size with masked tokens after its end (causal
    attention: nothing before them sees them). `count_episodes`: whether this slice carries the
    micro-batch's episode count (one rank of the group does, so seq-mean normalises once)."""
    ids, pos = p.input_ids[0], p.position_ids[0]
    n = ids.shape[0]
    total = math.ceil(n / sp_size) * sp_size
    pad = total - n

    def per_position(x, fill=0.0):        # [n-1] per target -> [total] per position
        return torch.cat([x, x.new_full((1 + pad,), fill)])

    targets = torch.cat([ids[1:], ids.new_zeros(1 + pad)])
    ids = torch.cat([ids, ids.new_zeros(pad)])
    pos = torch.cat([pos, pos[-1] + 1 + torch.arange(pad, dtype=pos.dtype)])
    a, b = sp_rank * (total // sp_size), (sp_rank + 1) * (total // sp_size)
    mask = per_position(p.loss_mask)[a:b]
    return replace(p, input_ids=ids[a:b][None], position_ids=pos[a:b][None], loss_mask=mask,
                   behaviour=per_position(p.behaviour)[a:b], advantages=per_position(p.advantages)[a:b],
                   weights=None if p.weights is None else per_position(p.weights)[a:b],
                   staleness=None if p.staleness is None else per_position(p.staleness, -1)[a:b],
                   episodes=p.episodes if count_episodes else [], n_tokens=b - a, n_loss_tokens=int(mask.sum()),
                   targets=targets[a:b])


# ---- tiled MLP ------------------------------------------------------------------------------------
def tile_mlps(model, agree) -> int:
    """Make every decoder layer's MLP a DeepSpeed TiledMLP (slices of <= hidden_size tokens).
    `agree(n)` returns the slice count all ranks use (the max over ranks). Returns the MLPs tiled."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import TiledMLP
    hidden = model.config.get_text_config().hidden_size
    mlps = [m for name, m in model.named_modules() if name.endswith(".mlp")]
    if not mlps or not all(hasattr(m, a) for m in mlps for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        raise UserError("train config: field 'tiled_mlp' needs gated MLPs (gate_proj/up_proj/down_proj, as in "
                        "Qwen, Llama, Mistral); this model's layers have none")

    def mlp_fn(self, x):
        return self.down_proj(self.act_fn(self.gate_proj(x)) * self.up_proj(x))

    def tiled_forward(self, x):
        if not self.training:
            return mlp_fn(self, x)
        shards = agree(max(1, math.ceil(x.shape[-2] / hidden)))
        USED["mlp_tiles"] += shards
        params = [self.gate_proj.weight, self.up_proj.weight, self.down_proj.weight]
        return TiledMLP.apply(mlp_fn, self, x, shards, params)

    for m in mlps:
        m.forward = types.MethodType(tiled_forward, m)
    return len(mlps)


# ---- gradient checkpoints in host memory -----------------------------------------------------------
class HostSlot:
    """One checkpointed layer's place in host memory, reused by every micro-batch. On a GPU it is
    pinned, and torch's pinned allocator rounds each request up to a power of two and caches freed
    blocks per size for the life of the process: a fresh buffer per layer and micro-batch would hold up
    to twice the plan's "checkpoints" term, more when micro-batches differ in length. A slot grows to the
    largest input it has held and keeps that one buffer; the plan counts `layers x tokens x hidden`."""

    def __init__(self):
        self.buf = None
        self.busy = False

    def hold(self, hidden: torch.Tensor) -> torch.Tensor:
        """A host copy of `hidden` (asynchronous from a GPU: the backward's copy back is queued after it)."""
        n = hidden.numel()
        if self.busy:           # a second forward before the backward (never in tbhpc's step): a buffer of its own
            return self._new(hidden.dtype, n, hidden.is_cuda)[:n].view(hidden.shape).copy_(hidden, non_blocking=True)
        if self.buf is None or self.buf.numel() < n or self.buf.dtype != hidden.dtype:
            self.buf = None
            self.buf = self._new(hidden.dtype, n, hidden.is_cuda)
        self.busy = True
        return self.buf[:n].view(hidden.shape).copy_(hidden.detach(), non_blocking=True)

    def release(self) -> None:
        self.busy = False

    @staticmethod
    def _new(dtype, n: int, pinned: bool) -> torch.Tensor:
        USED["host_buffers"] += 1
        return torch.empty(n, dtype=dtype, pin_memory=pinned)


class _OffloadedCheckpoint(torch.autograd.Function):
    """A layer run without keeping its activations, its input parked in host memory (the layer's
    HostSlot) until the backward recomputes it (the reentrant form: DeepSpeed ZeRO-3 gathers the
    layer's parameters again for the recompute through its module hooks)."""

    @staticmethod
    def forward(ctx, run, slot, hidden, *rest):
        ctx.run, ctx.rest, ctx.device, ctx.slot = run, rest, hidden.device, slot
        ctx.rng = torch.get_rng_state(), (torch.cuda.get_rng_state(hidden.device) if hidden.is_cuda else None)
        with torch.no_grad():
            out = run(hidden, *rest)
        ctx.host = slot.hold(hidden)
        return out

    @staticmethod
    def backward(ctx, grad):
        hidden = ctx.host.to(ctx.device, non_blocking=True)
        if hidden is ctx.host:      # a CPU rank: the slot itself, which the next micro-batch overwrites
            hidden = hidden.clone()
        hidden.requires_grad_(True)
        USED["offloaded_recomputes"] += 1
        ctx.host = None
        ctx.slot.release()
        cpu_rng, dev_rng = ctx.rng
        with torch.random.fork_rng(devices=[ctx.device] if dev_rng is not None else []):
            torch.set_rng_state(cpu_rng)
            if dev_rng is not None:
                torch.cuda.set_rng_state(dev_rng, ctx.device)
            with torch.enable_grad():
                out = ctx.run(hidden, *ctx.rest)
        out = out[0] if isinstance(out, tuple) else out
        torch.autograd.backward(out, grad)
        return (None, None, hidden.grad) + (None,) * len(ctx.rest)


def offloaded_checkpoint(slot: HostSlot):
    """The gradient-checkpointing function one HF layer calls (`_gradient_checkpointing_func`)."""
    return lambda run, hidden, *rest: _OffloadedCheckpoint.apply(run, slot, hidden, *rest)


def offload_checkpoints(model) -> int:
    """Gradient checkpointing on, with each checkpointed layer's input kept in host memory.
    Returns the number of layers checkpointed."""
    model.gradient_checkpointing_enable()
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", False)]
    for m in layers:
        m._gradient_checkpointing_func = offloaded_checkpoint(HostSlot())
    if not layers:
        raise UserError("train config: field 'checkpoint_offload' needs a model with HF gradient checkpointing")
    return len(layers)
