"""The memory plan of a training config: what one GPU (or CPU rank) holds at the peak of an
update, term by term, from the model's `config.json` alone. Pure functions.

Why before anything runs: a config that does not fit fails at its first update, hours into a
48-hour allocation, after the serving job loaded and the first rollouts ran. The plan answers
first (`tbhpc plan CONFIG`, and the same check inside `tbhpc train` and `tbhpc submit train`),
names the term that does not fit and the field that shrinks it, and says the longest episode the
config can train.

The terms, per rank, at the worst micro-batch of T tokens (t = T / sp_size of them on each rank):
- model states under ZeRO (DeepSpeed's layout): bf16 parameters, fp32 gradient partitions, the
  fp32 master copy (none when the parameters are fp32 already) and Adam's two moments, each
  divided by the ranks that partition it; offload moves them to host memory;
- ZeRO's working buffers: the reduce bucket, one or two layers' parameters gathered, the output
  head gathered while it runs;
- activations under gradient checkpointing: each layer's input kept (L x t x hidden), plus one
  layer's activations and their gradients while the backward recomputes it (the MLP part on
  slices of <= hidden tokens with `tiled_mlp`); without checkpointing every layer's activations;
- the output head: chunked logprobs hold chunk x V logits (and their gradient) at a time and the
  head's gradient in fp32 (tbhpc/train/logprobs.py);
- a reserve for the CUDA context, NCCL's buffers and the allocator's fragmentation.

The coefficients were measured (docs/measurements/training.md, "The memory plan against measured
peaks"): the per-layer activation bytes on real CPU steps of small Qwen3 models of several widths
and lengths (tests/test_memory_plan.py holds the plan within 20% of them) and on fake tensors at
27B width (bench/memory_plan.py).
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tbhpc.errors import UserError
from tbhpc.plan.shape import ModelShape, read_shape

GB = 1e9
RESERVE_GB = 3.0            # CUDA context (~0.6 GB), NCCL's channel buffers (~1 GB), cuBLAS workspaces
FRAGMENTATION = 0.05        # PyTorch's caching allocator: blocks reserved but not usable for the next request


# Gradients are reduced in fp32 and, under ZeRO, accumulated in fp32 whatever the training dtype
# (train/dsconfig.fp32_gradients): ZeRO's bucket and gradient partitions hold 4 bytes an element.
COMM_BYTES = 4


def zero_buffers(hidden: int) -> dict:
    """ZeRO's buffer sizes scaled to the model's width (the values transformers' DeepSpeed integration
    derives with "auto"): a bucket of hidden^2 elements reduces gradients, prefetch ~0.9 hidden^2,
    parameters under 10 x hidden elements stay gathered (norms)."""
    h2 = int(hidden) ** 2
    return {"reduce_bucket_size": max(h2, 1_000_000), "stage3_prefetch_bucket_size": max(int(0.9 * h2), 1_000_000),
            "stage3_param_persistence_threshold": 10 * int(hidden), "stage3_max_live_parameters": 1_000_000_000}


# ---- the run's layout -----------------------------------------------------------------------------
@dataclass(frozen=True)
class Layout:
    nodes: int
    per_node: int               # ranks per node (GPUs, or 1 on CPU nodes)
    gpu: bool
    sp: int
    zero: int
    dtype_bytes: int            # parameters and activations: 2 (bf16) or 4 (fp32)
    attention: str              # flash (assumed) | flash-attn (it imports) | sdpa (packed rows: a T^2 mask)
    checkpointing: bool
    checkpoint_offload: bool
    tiled_mlp: bool
    offload_optimizer: bool
    offload_params: bool
    chunk: int                  # logprob chunk (positions)
    microbatch_tokens: int
    max_context: int
    memory_bytes: float         # one GPU (or a CPU rank's share of its node)
    host_bytes: float           # one node (0: not checked)
    lora_rank: int = 0          # > 0: the base frozen, adapters of this rank on `lora_targets` trained
    lora_targets: tuple[str, ...] = ()

    @property
    def ranks(self) -> int:
        return self.nodes * self.per_node

    @property
    def dp(self) -> int:
        return self.ranks // self.sp

    @classmethod
    def of(cls, cfg, flash: bool | None = None) -> "Layout":
        """From a TrainConfig (any object with its fields). `flash`: whether flash-attn imports on the
        GPU nodes (doctor and the trainer know; None: assumed, and the plan says so)."""
        gpu = cfg.gpus_per_node > 0
        bf16 = cfg.dtype == "bf16" or (cfg.dtype == "auto" and gpu)
        return cls(nodes=cfg.nodes, per_node=max(cfg.gpus_per_node, 1), gpu=gpu, sp=cfg.sp_size, zero=cfg.zero_stage,
                   dtype_bytes=2 if bf16 else 4,
                   attention=("flash" if flash is None else "flash-attn" if flash else "sdpa") if gpu else "sdpa",
                   checkpointing=bool(cfg.gradient_checkpointing or cfg.checkpoint_offload),
                   checkpoint_offload=bool(cfg.checkpoint_offload), tiled_mlp=bool(cfg.tiled_mlp),
                   offload_optimizer=bool(cfg.offload_optimizer), offload_params=bool(cfg.offload_params),
                   chunk=cfg.logprob_chunk, microbatch_tokens=cfg.microbatch_tokens, max_context=cfg.max_context,
                   memory_bytes=cfg.gpu_memory_gb * GB if gpu else (cfg.host_memory_gb * GB / max(cfg.gpus_per_node, 1)
                                                                    if cfg.host_memory_gb else math.inf),
                   host_bytes=cfg.host_memory_gb * GB, lora_rank=int(getattr(cfg, "lora_rank", 0) or 0),
                   lora_targets=tuple(getattr(cfg, "lora_targets", ()) or ()))


# ---- the terms -------------------------------------------------------------------------------------
@dataclass
class Term:
    name: str
    bytes: float
    field: str          # the config field that shrinks it ('' for none)
    note: str = ""


# One decoder layer's activations, in bytes per token, measured with torch's MemTracker on fake tensors
# (bench/memory_plan.py --layers: Qwen3 layers of 5 shapes from hidden 256 to 5,120, fp32 and bf16) and
# fitted exactly by: hidden x (7 pb + 3 up) + (q + kv width) x (4 pb + up) + intermediate x 4 pb saved
# for the backward, where pb is the dtype's bytes and up = 2 extra bytes for the fp32 copy each RMSNorm
# makes of a bf16 input; one more hidden and 2 x intermediate while the backward runs (gradients).
def layer_saved(s: ModelShape, pb: int, tiled: bool = False) -> float:
    """Bytes per token a layer keeps for its backward (its MLP part only for the slice being run when tiled)."""
    up = 2 if pb == 2 else 0
    return s.hidden * (7 * pb + 3 * up) + (s.q_width + s.kv_width) * (4 * pb + up) + (0 if tiled else 4 * s.intermediate * pb)


def layer_work(s: ModelShape, pb: int, tokens: int, tiled: bool = False) -> float:
    """Bytes of one layer's backward at `tokens` tokens: its saved activations and the gradients
    through them (a tiled MLP: the slice's MLP activations and the hidden-size gradients it keeps)."""
    up = 2 if pb == 2 else 0
    base = s.hidden * (8 * pb + 3 * up) + (s.q_width + s.kv_width) * (4 * pb + up)
    if not tiled:
        return tokens * (base + 6 * s.intermediate * pb)
    return tokens * (base + 2 * s.hidden * pb) + min(tokens, s.hidden) * 6 * s.intermediate * pb


def model_state_terms(s: ModelShape, lay: Layout) -> tuple[list[Term], list[Term]]:
    """(on the GPU, in host memory) terms of parameters, gradients and optimizer states. Under LoRA
    the base is frozen (its parameters only, partitioned as before) and gradients, the fp32 master
    and Adam's moments exist for the adapters alone."""
    n, pb = s.params, lay.dtype_bytes
    shard = lay.ranks if lay.zero >= 1 else 1
    a = s.layers * s.lora_layer_params(lay.lora_rank, lay.lora_targets) if lay.lora_rank else 0
    trained = a or n
    params = (n + a) * pb / (lay.ranks if lay.zero == 3 else 1)
    # ZeRO-2/3: fp32 partitions; ZeRO-1 under bf16 (DeepSpeed's BF16_Optimizer): the bf16 gradients
    # and a whole-model fp32 accumulator; no ZeRO: the parameters' own gradients
    grads = trained * 4 / lay.ranks if lay.zero >= 2 else trained * (pb + (4 if lay.zero == 1 and pb < 4 else 0))
    master = trained * 4 / shard    # DeepSpeed keeps an fp32 copy even of fp32 parameters (measured)
    adam = trained * 8 / shard
    what = f"{n / 1e9:.2f}B" + (f" frozen + {a / 1e6:.1f}M adapters" if a else "")
    gpu, host = [], []
    (host if lay.offload_params else gpu).append(
        Term("parameters", params, "offload_params" if lay.zero == 3 else "zero_stage",
             f"{what} x {pb} B" + (f" / {lay.ranks} ranks" if lay.zero == 3 else "")))
    (host if lay.offload_optimizer else gpu).append(
        Term("gradients", grads, "offload_optimizer", ("adapters' " if a else "")
             + ("fp32 partitions" if lay.zero >= 2 else "whole model" + (", and in fp32" if lay.zero == 1 and pb < 4 else ""))))
    (host if lay.offload_optimizer else gpu).append(
        Term("optimizer states", master + adam, "offload_optimizer",
             f"fp32 master + Adam m, v{' of the adapters' if a else ''}{f' / {shard} ranks' if shard > 1 else ''}"))
    return gpu, host


def _local(lay: Layout, tokens: int) -> int:
    return math.ceil(tokens / lay.sp)


def common_terms(s: ModelShape, lay: Layout, tokens: int) -> tuple[list[Term], list[Term]]:
    """(GPU, host) terms present through the whole backward: states, ZeRO's bucket, checkpoints."""
    gpu, host = model_state_terms(s, lay)
    pb, t = lay.dtype_bytes, _local(lay, tokens)
    if lay.zero >= 1 and lay.gpu:
        gpu.append(Term("reduce bucket", zero_buffers(s.hidden)["reduce_bucket_size"] * COMM_BYTES, "",
                        "ZeRO's gradient bucket, fp32"))
    if lay.checkpointing:
        kept = Term("checkpoints", s.layers * t * s.hidden * pb, "checkpoint_offload",
                    f"{s.layers} layers x {t:,} tokens x {s.hidden:,}")
        (host if lay.checkpoint_offload else gpu).append(kept)
    else:
        gpu.append(Term("activations", (s.layers - 1) * t * layer_saved(s, pb, lay.tiled_mlp), "gradient_checkpointing",
                        f"{s.layers - 1} layers' activations kept (no checkpointing)"))
    up = 2 if pb == 2 else 0
    gpu.append(Term("hidden states", t * s.hidden * (3 * pb + 2 * up), "sp_size", "final norm and its gradient"))
    if lay.gpu and lay.attention == "sdpa" and lay.sp == 1:
        # transformers gives SDPA a dense [T, T] bool mask for a packed row and PyTorch's CUDA kernels turn
        # it into a bias of the query's dtype (read from their sources, not measured on a GPU yet); one
        # layer's at a time under checkpointing. Under SP each pass holds one episode: no mask (packing.py)
        gpu.append(Term("packed mask", tokens * tokens * (1 + pb), "", "no flash-attn: SDPA's T x T mask and its bias"))
    return gpu, host


def head_phase(s: ModelShape, lay: Layout, tokens: int) -> list[Term]:
    """The output head's backward: the head gathered, a chunk's logits in fp32 with their softmax and
    gradient, the head's weight gradient in fp32 (and its cast), the last layer's activations."""
    pb, t = lay.dtype_bytes, _local(lay, tokens)
    c = min(lay.chunk, t)
    out = [Term("logprobs", c * s.vocab * (8 + pb), "logprob_chunk", f"chunks of {c:,} x {s.vocab:,} vocab")]
    if not lay.lora_rank:           # under LoRA the head is frozen: no weight gradient
        out.append(Term("head gradient", s.head_params * (4 + (pb if pb < 4 else 0) + (2 * COMM_BYTES if lay.zero >= 2 else 0)),
                        "", "fp32, its cast; ZeRO's flattened copy and reduce-scatter output, fp32"))
    if lay.zero == 3:
        out.append(Term("head gathered", s.head_params * pb, "", "ZeRO-3 gathers the head to run it"))
    if not lay.checkpointing:
        out.append(Term("last layer", t * layer_saved(s, pb, lay.tiled_mlp), "gradient_checkpointing", ""))
    return out


def layer_phase(s: ModelShape, lay: Layout, tokens: int) -> list[Term]:
    """A layer's backward: its activations (recomputed under checkpointing) and gradients, its
    parameters gathered with the next layer's prefetched, its full parameter gradients."""
    pb, t = lay.dtype_bytes, _local(lay, tokens)
    out = [Term("layer backward", layer_work(s, pb, t, lay.tiled_mlp),
                "tiled_mlp" if not lay.tiled_mlp else "sp_size",
                ("recomputed " if lay.checkpointing else "") + "activations and their gradients"
                + (", MLP in slices" if lay.tiled_mlp else ""))]
    if lay.zero == 3 and lay.lora_rank:
        grads = s.lora_layer_params(lay.lora_rank, lay.lora_targets)
        out.append(Term("layers gathered", 2 * s.layer_params * pb + 2 * grads * pb, "",
                        "this layer and the next one, this layer's adapter gradients and their flattened copy"))
    elif lay.zero == 3:
        out.append(Term("layers gathered", 4 * s.layer_params * pb, "",
                        "this layer and the next one, this layer's gradients and their flattened copy"))
    return out


def full_logprob_bytes(s: ModelShape, tokens: int, dtype_bytes: int) -> float:
    """What the [T, V] route held (the logits, their fp32 copy, log-softmax and its gradient): the
    baseline bench/memory_plan.py measures the chunked route against."""
    return float(tokens) * s.vocab * (dtype_bytes + 3 * 4)


# ---- the plan -------------------------------------------------------------------------------------
@dataclass
class MemoryPlan:
    model: str
    shape: ModelShape
    layout: Layout
    tokens: int                                 # the worst micro-batch's tokens (whole, before sp)
    terms: list[Term] = field(default_factory=list)
    host_terms: list[Term] = field(default_factory=list)
    total: float = 0.0
    host_total: float = 0.0
    longest_episode: int = 0
    problem: str = ""                           # one line when it does not fit
    phase: str = ""                             # where the peak is
    packed_total: float = 0.0                   # the total at a micro-batch of microbatch_tokens
    smallest: str = ""                          # GPU configs: the fewest GPUs this run fits on, and how
    sync_transport: str = "files"               # the config's, marked in the sync prediction

    @property
    def fits(self) -> bool:
        return not self.problem

    def as_dict(self) -> dict:
        d = asdict(self)
        d.update(fits=self.fits, params=self.shape.params, ranks=self.layout.ranks, dp=self.layout.dp)
        return d


def _sum(terms: list[Term]) -> float:
    return sum(t.bytes for t in terms)


def peak_terms(s: ModelShape, lay: Layout, tokens: int) -> tuple[list[Term], list[Term], str]:
    """Every (GPU, host) term at the peak of a micro-batch of `tokens` tokens (the reserve included on a
    GPU), and which phase the peak is in: the output head's backward or a layer's."""
    gpu, host = common_terms(s, lay, tokens)
    head, layer = head_phase(s, lay, tokens), layer_phase(s, lay, tokens)
    phase, extra = ("output head backward", head) if _sum(head) >= _sum(layer) else ("layer backward", layer)
    gpu += extra
    if lay.gpu:
        gpu.append(Term("reserve", RESERVE_GB * GB + FRAGMENTATION * lay.memory_bytes, "",
                        f"CUDA context, NCCL, {FRAGMENTATION:.0%} fragmentation"))
    host = [Term(t.name, t.bytes * lay.per_node, t.field, t.note + f" x {lay.per_node} ranks") for t in host]
    return gpu, host, phase


def longest_episode(s: ModelShape, lay: Layout) -> int:
    """The most tokens one micro-batch (one episode alone) can hold and still fit (0: none)."""
    def fits(n: int) -> bool:
        gpu, host, _ = peak_terms(s, lay, n)
        return _sum(gpu) <= lay.memory_bytes and (not lay.host_bytes or _sum(host) <= lay.host_bytes)
    if not math.isfinite(lay.memory_bytes) or not fits(lay.sp):
        return 0
    lo, hi = lay.sp, lay.sp
    while fits(hi * 2) and hi < 1 << 26:
        hi *= 2
    lo, hi = hi, hi * 2
    while hi - lo > lay.sp:
        mid = (lo + hi) // 2 // lay.sp * lay.sp
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def plan(cfg, shape: ModelShape | None = None, suggest: bool = True, flash: bool | None = None) -> MemoryPlan:
    """The plan of a TrainConfig (the model's config.json read unless `shape` is given). A config that
    does not fit gets the smallest change that would (`suggest`)."""
    s = shape or read_shape(cfg.model)
    lay = Layout.of(cfg, flash)
    if lay.gpu and lay.ranks % lay.sp:      # (CPU ranks are not counted by the config: Engine checks the real world)
        return MemoryPlan(cfg.model, s, lay, 0, problem=f"field 'sp_size' ({lay.sp}) must divide the trainer's "
                          f"{lay.ranks} ranks (nodes x gpus_per_node)")
    if lay.sp > 1 and (s.heads % lay.sp or s.kv_heads % lay.sp):
        return MemoryPlan(cfg.model, s, lay, 0, problem=f"field 'sp_size' ({lay.sp}) must divide the model's {s.heads} "
                          f"attention heads and its {s.kv_heads} key/value heads")
    tokens = max(lay.microbatch_tokens, lay.max_context)
    gpu, host, phase = peak_terms(s, lay, tokens)
    p = MemoryPlan(cfg.model, s, lay, tokens, gpu, host, _sum(gpu), _sum(host), longest_episode(s, lay), phase=phase,
                   sync_transport="adapter" if getattr(cfg, "adapter_sync", False) else getattr(cfg, "sync_transport", "files"))
    p.packed_total = _sum(peak_terms(s, lay, lay.microbatch_tokens)[0])
    p.problem = verdict(p)
    if suggest and lay.gpu:
        p.smallest = smallest_layout(cfg, s, flash)
    if p.problem and suggest:
        fix = smallest_fix(cfg, s, flash)
        if fix:
            p.problem += f"; {fix} would fit"
    return p


def smallest_fix(cfg, s: ModelShape, flash: bool | None = None) -> str:
    """The first change (in order of cost to the run: none learns differently) that makes `cfg` fit:
    sequence parallelism up to a node, tiled MLPs, then checkpoints and optimizer states in host memory."""
    found = _first_fit(cfg, s, flash)
    if found is None:
        return ""
    change, q = found
    return " ".join(f"{k}={str(v).lower()}" for k, v in change.items()) + f" ({q.total / GB:.1f} GB)"


def _first_fit(cfg, s: ModelShape, flash: bool | None = None):
    """(the change, its plan) of smallest_fix, or None."""
    import dataclasses
    if not dataclasses.is_dataclass(cfg):
        return None
    ranks, sps = cfg.nodes * max(cfg.gpus_per_node, 1), []
    sp = cfg.sp_size * 2
    while sp <= min(ranks, max(cfg.gpus_per_node, 1)) and not (ranks % sp or s.heads % sp or s.kv_heads % sp):
        sps.append(sp)
        sp *= 2
    tries = [{"sp_size": v} for v in sps] + [{"tiled_mlp": True}]
    tries += [{"sp_size": v, "tiled_mlp": True} for v in sps]
    tries += [{**t, "checkpoint_offload": True} for t in [{}] + [{"tiled_mlp": True}] + [{"sp_size": v} for v in sps]]
    tries += [{**t, "offload_optimizer": True} for t in tries[:]]
    for change in tries:
        change = {k: v for k, v in change.items() if getattr(cfg, k) != v}
        if not change:
            continue
        try:
            q = plan(dataclasses.replace(cfg, **change), s, suggest=False, flash=flash)
        except UserError:
            continue
        if q.fits:
            return change, q
    return None


LAYOUTS = ((1, 1), (1, 2), (1, 4), (1, 8), (2, 8), (3, 8), (4, 8), (6, 8), (8, 8))   # (nodes, GPUs per node)


def smallest_layout(cfg, s: ModelShape, flash: bool | None = None) -> str:
    """The fewest GPUs (of LAYOUTS) on which `cfg` trains, as it is or with its smallest fix, with
    what a GPU and a node's host memory then hold, e.g. '1 node x 4 GPUs: sp_size=4 (61.2 GB per
    GPU)'; '' when none does. Host memory is counted whether or not host_memory_gb bounds it."""
    import dataclasses
    if not dataclasses.is_dataclass(cfg):
        return ""
    for nodes, per in LAYOUTS:
        sp = min(cfg.sp_size, per)
        while sp > 1 and (nodes * per % sp or s.heads % sp or s.kv_heads % sp):
            sp //= 2
        trial = dataclasses.replace(cfg, nodes=nodes, gpus_per_node=per, sp_size=sp)
        try:
            q = plan(trial, s, suggest=False, flash=flash)
        except UserError:
            continue
        change = {"sp_size": sp} if sp != cfg.sp_size else {}
        if not q.fits:
            found = _first_fit(trial, s, flash)
            if found is None:
                continue
            change, q = {**change, **found[0]}, found[1]
        what = " ".join(f"{k}={str(v).lower()}" for k, v in change.items()) or "as configured"
        host = f", {q.host_total / GB:.0f} GB host memory per node" if q.host_total else ""
        return (f"{nodes} node{'s' if nodes > 1 else ''} x {per} GPU{'s' if per > 1 else ''}: {what} "
                f"({q.total / GB:.1f} GB per GPU{host})")
    return ""


def plannable(model: str) -> bool:
    """Whether `model` is a local directory holding config.json (a hub name or a missing path is not planned)."""
    return bool(model) and (Path(model).expanduser() / "config.json").is_file()


def require_fit(cfg, source: str) -> None:
    """Refuse, in one line, a config whose plan does not fit (`tbhpc train`, `submit train` and the API
    call it before any run directory exists). A model that is not plannable is not planned."""
    if not plannable(cfg.model):
        return
    p = plan(cfg)
    if not p.fits:
        shown = source if source.endswith((".yaml", ".yml")) else "CONFIG"
        raise UserError(f"{source}: {p.problem} (`tbhpc plan {shown}` prints the whole plan)")


def verdict(p: MemoryPlan) -> str:
    """'' when the plan fits, else one line naming the term that does not fit and the field to change."""
    lay = p.layout
    what = "a GPU" if lay.gpu else "a rank"
    if p.total > lay.memory_bytes:
        big = max((t for t in p.terms if t.field), key=lambda t: t.bytes)
        episode = (f"an episode of max_context {lay.max_context:,} tokens" if lay.max_context >= lay.microbatch_tokens
                   else f"a micro-batch of microbatch_tokens {lay.microbatch_tokens:,}")
        return (f"does not fit: {episode} needs {p.total / GB:.1f} GB on {what} of {lay.memory_bytes / GB:.0f} GB; "
                f"the largest term is {big.name} ({big.bytes / GB:.1f} GB): change field '{big.field}'"
                + (f" (the longest episode that fits: {p.longest_episode:,} tokens)" if p.longest_episode else ""))
    if lay.host_bytes and p.host_total > lay.host_bytes:
        big = max(p.host_terms, key=lambda t: t.bytes)
        return (f"does not fit: host memory {p.host_total / GB:.1f} GB per node of host_memory_gb "
                f"{lay.host_bytes / GB:.0f}; the largest term is {big.name} ({big.bytes / GB:.1f} GB): change field "
                f"'{big.field}'")
    return ""
