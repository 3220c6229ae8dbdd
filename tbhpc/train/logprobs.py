"""Per-token logprobs (and entropies) of a causal LM without ever holding its `[T, V]` logits.

Why: the trainer needs one number per token, log p(target), but the obvious route materialises
the logits of every position over the whole vocabulary, upcasts them to fp32 and log-softmaxes
them; autograd then keeps about three such tensors for the backward. At V = 151,936 that is
0.6 GB per 1k tokens each, ~60 GB for a 32k-token micro-batch: more than the GPU has.

Here the output head runs on `chunk` positions at a time, inside one autograd function:
- forward: logits of a chunk computed in fp32 (`_logits`), their log-sum-exp, the target's logprob and (if asked) the
  entropy; the chunk's logits are dropped before the next chunk;
- backward: the chunk's logits are recomputed and the gradient with respect to them is formed in
  place (d lp / dz = onehot - p; d H / dz = -p (z - E_p[z])), then turned into the gradients of the
  hidden states and of the head's weight. Peak: ~2 x chunk x V x 4 bytes, whatever T is.

It plugs into any HF causal LM whose output head is a plain bias-free `nn.Linear` (Qwen, Llama,
Mistral, ...): the head's class is swapped for `LogprobHead`, a `Linear` subclass (same
parameter, same state-dict keys, tying kept). With targets set, the model's own forward hands
the head the final hidden states of every position and gets `[1, T, 2]` (logprob, entropy) back;
without, the head is the plain Linear (generation, fingerprints). So the computation runs inside
the model's forward, where DeepSpeed ZeRO-3's hooks gather the head's weight once per pass and
reduce its gradient once, and a sequence-parallel rank computes its own slice of the sequence.
"""
from __future__ import annotations

from contextlib import contextmanager

import torch

from tbhpc.errors import UserError

DEFAULT_CHUNK = 2048
VOCAB_BLOCK = 8192      # rows of a bf16 head widened at once where no fp32-output GEMM exists (CPUs)


def _wide(x):
    """fp32 at least (bf16 logits are upcast; fp64 stays fp64, for gradcheck)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def _rowdot(a, b):
    """Row-wise dot product of two [c, V] tensors without a third [c, V] temporary."""
    return (a[:, None, :] @ b[:, :, None]).reshape(-1)


def _logits(h, weight):
    """A chunk's logits computed in fp32, not bf16 logits upcast: a bf16 GEMM output rounds every
    logit to 8 bits of mantissa (steps of 0.125 at |z| in 16-32), ~0.01 nats of noise in each logprob
    that would enter the ratio, the clip and the mismatch figures. On a GPU the bf16 GEMM writes fp32
    (aten::mm.dtype); where that kernel is missing (CPUs) the operands are widened, which is exact."""
    if h.dtype not in (torch.bfloat16, torch.float16):
        return _wide(torch.nn.functional.linear(h, weight))
    if h.is_cuda:
        try:
            return torch.mm(h, weight.t(), out_dtype=torch.float32)
        except (TypeError, NotImplementedError, RuntimeError):      # a torch without the fp32-output GEMM
            pass
    wide = h.float()                # the head widened a block of the vocabulary at a time: no fp32 copy of it all
    z = torch.empty((h.shape[0], weight.shape[0]), dtype=torch.float32, device=h.device)
    for a in range(0, weight.shape[0], VOCAB_BLOCK):
        z[:, a:a + VOCAB_BLOCK] = wide @ weight[a:a + VOCAB_BLOCK].float().t()
    return z


def _chunk_terms(h, weight, targets, entropy: bool):
    """Logits of one chunk in fp32 and the per-token (logprob, entropy, log-sum-exp)."""
    z = _logits(h, weight)
    lse = torch.logsumexp(z, -1)
    lp = z.gather(1, targets[:, None]).squeeze(1) - lse
    ent = None
    if entropy:
        p = torch.exp(z - lse[:, None])
        ent = lse - _rowdot(p, z)
    return z, lse, lp, ent


class _ChunkedLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, targets, chunk: int, entropy: bool):
        n = hidden.shape[0]
        out = torch.zeros((n, 2), dtype=torch.promote_types(hidden.dtype, torch.float32), device=hidden.device)
        with torch.no_grad():
            for a in range(0, n, chunk):
                _, _, lp, ent = _chunk_terms(hidden[a:a + chunk], weight, targets[a:a + chunk], entropy)
                out[a:a + chunk, 0] = lp
                if ent is not None:
                    out[a:a + chunk, 1] = ent
        ctx.save_for_backward(hidden, weight, targets)
        ctx.chunk, ctx.entropy = chunk, entropy
        return out

    @staticmethod
    def backward(ctx, grad_out):
        hidden, weight, targets = ctx.saved_tensors
        chunk, n = ctx.chunk, hidden.shape[0]
        want_h, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_h = torch.empty_like(hidden) if want_h else None
        grad_w = torch.zeros(weight.shape, dtype=grad_out.dtype, device=weight.device) if want_w else None
        for a in range(0, n, chunk):
            h, t, g = hidden[a:a + chunk], targets[a:a + chunk], grad_out[a:a + chunk]
            with torch.no_grad():
                z = _logits(h, weight)
                lse = torch.logsumexp(z, -1, keepdim=True)
                p = z.sub(lse).exp_()
                if ctx.entropy and bool((g[:, 1] != 0).any()):
                    mean_z = _rowdot(p, z)[:, None]
                    z.sub_(mean_z).mul_(p).mul_(-g[:, 1:2])          # d H / dz, in z's buffer
                else:
                    z.zero_()
                p.mul_(-g[:, 0:1])                                     # d lp / dz = onehot - p ...
                p.scatter_add_(1, t[:, None], g[:, 0:1])               # ... the onehot part
                z.add_(p)                                              # grad of the chunk's logits
                del p
                if want_h:
                    grad_h[a:a + chunk] = (z.to(weight.dtype) @ weight).to(hidden.dtype)
                if want_w:
                    grad_w.addmm_(z.t(), h.to(z.dtype))
        if grad_w is not None:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None


def chunked_logprobs(hidden, weight, targets, chunk: int = DEFAULT_CHUNK, entropy: bool = False):
    """`[N, 2]` fp32: log p(targets[i] | hidden[i]) and (if `entropy`) the entropy of that
    distribution, for hidden `[N, H]`, weight `[V, H]` (logits = hidden @ weight.T)."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    return _ChunkedLogprobs.apply(hidden, weight, targets, int(chunk), bool(entropy))


class LogprobHead(torch.nn.Linear):
    """An output head that returns per-token (logprob, entropy) instead of logits while `targets`
    is set (see the module docstring); the plain Linear otherwise."""
    targets = None
    chunk = DEFAULT_CHUNK
    entropy = False

    def forward(self, hidden):
        if self.targets is None:
            return super().forward(hidden)
        b, t, h = hidden.shape
        if self.targets.numel() != b * t:
            raise RuntimeError(f"LogprobHead: {self.targets.numel()} targets for {b * t} positions")
        out = chunked_logprobs(hidden.reshape(b * t, h), self.weight, self.targets.reshape(-1), self.chunk, self.entropy)
        return out.view(b, t, 2)


def _unwrap(model):
    """The HF model inside a DeepSpeed engine (or the model itself)."""
    return getattr(model, "module", model)


def install(model) -> LogprobHead:
    """Swap `model`'s output head for a LogprobHead in place (idempotent); returns it."""
    hf = _unwrap(model)
    head = hf.get_output_embeddings()
    if isinstance(head, LogprobHead):
        return head
    cfg = hf.config
    for name in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(cfg, name, None) not in (None, 1, 1.0):
            raise UserError(f"model config: field {name!r} rescales the logits after the head; the trainer's "
                            f"chunked logprobs support plain linear heads only")
    if type(head) is not torch.nn.Linear or head.bias is not None:
        raise UserError(f"model: the output head is {type(head).__name__}"
                        f"{' with a bias' if getattr(head, 'bias', None) is not None else ''}; the trainer's chunked "
                        f"logprobs need a bias-free nn.Linear head")
    head.__class__ = LogprobHead
    return head


@contextmanager
def targets_set(model, targets, chunk: int = DEFAULT_CHUNK, entropy: bool = False):
    """While inside, `model(...)` returns `[1, T, 2]` (logprob, entropy) of `targets` as its logits."""
    head = install(model)
    head.targets, head.chunk, head.entropy = targets, int(chunk), bool(entropy)
    try:
        yield head
    finally:
        head.targets, head.entropy = None, False


def token_logprobs(model, mb, chunk: int = DEFAULT_CHUNK, entropy: bool = False):
    """Logprob of every target token of one packed micro-batch (`packing.Packed`) under `model`
    (an HF model or a DeepSpeed engine around one): `[T-1]` fp32, and with `entropy` also the
    entropy of each position's distribution (`[T-1]`)."""
    ids = mb.input_ids
    sliced = getattr(mb, "targets", None) is not None        # a sequence-parallel slice: a target per position
    targets = mb.targets if sliced else torch.cat([ids[0, 1:], ids.new_zeros(1)])   # position T-1: a dummy target
    with targets_set(model, targets.to(ids.device), chunk, entropy):
        out = model(input_ids=ids, position_ids=mb.position_ids, use_cache=False).logits[0]
    out = out if sliced else out[:-1]
    return (out[:, 0], out[:, 1]) if entropy else out[:, 0]


def full_logprobs(model, mb):
    """The reference computation through the full `[T, V]` fp32 logits (tests and benchmarks
    compare the chunked one against it)."""
    logits = _unwrap(model)(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, mb.input_ids[0, 1:, None]).squeeze(1)
