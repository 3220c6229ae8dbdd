"""In-process continuous batching for small models: many episodes in flight, one model.

Why: on a CPU the cost of an agent episode is the history, not the answer. `model.generate` per
turn re-reads the whole conversation every turn and decodes one sequence at a time. Here each
conversation keeps its key/value cache between turns (a turn computes only the tokens added since
the last one: tool output, user reply), a new conversation starts from the cache of the longest
prompt prefix already computed (the per-domain system prompt is computed once), and every
sequence that is generating advances together, one forward per token for all of them.

Callers are episode threads: `generate()` blocks until its sequence is finished while one
scheduler thread runs the model, so the same `Generator` interface serves campaigns and the
trainer. The forward is written out for the two architectures the project builds (Qwen3 and
Llama: RMSNorm, rotary positions, grouped-query attention, SwiGLU), reading the weights of a
transformers model in place; `check_against_transformers` proves it computes the same logits.
Weights change only through `load_weights` (all caches dropped; the version is what the
generations report).
"""
from __future__ import annotations

import queue
import random
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from tbhpc.errors import UserError
from tbhpc.policy.generation import Generation, Sampling


@dataclass
class _Request:
    prompt: list[int]
    sampling: Sampling
    seed: int
    done: threading.Event = field(default_factory=threading.Event)
    out: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    finish: str = ""
    error: BaseException | None = None
    slot: Any = None
    rng: Any = None
    t0: float = 0.0


@dataclass(eq=False)          # slots are compared by identity (their fields hold tensors)
class _Slot:
    """One conversation's cache: keys/values of `tokens[:length]` per layer."""
    keys: list                      # per layer [kv_heads, capacity, head_dim]
    values: list
    tokens: list[int] = field(default_factory=list)
    length: int = 0
    busy: bool = False
    used: float = 0.0


class BatchedGenerator:
    """`Generator` for a transformers Qwen3/Llama model; thread-safe, one scheduler thread."""

    def __init__(self, model: Any, eos_token_id: int, version: str = "base", max_slots: int = 128,
                 max_batch: int = 128, min_shared_prefix: int = 16, cache_bytes: int = 2 << 30):
        import torch
        self.torch = torch
        self.eos = eos_token_id
        self.version = version
        self.max_slots, self.max_batch, self.min_shared = max_slots, max_batch, min_shared_prefix
        # Idle conversations' caches are kept for their next turn and as prompt-prefix donors, up
        # to max_slots and this many bytes (a SmolLM2-135M cache is ~46 KB per token: 128 idle
        # episodes of 2k tokens would be 12 GB); caches of running sequences are never dropped.
        self.cache_bytes = cache_bytes
        self.slots: list[_Slot] = []
        self.requests: queue.Queue[_Request] = queue.Queue()
        self.lock = threading.Lock()                 # weights and slots: the scheduler or load_weights
        self.stats = {"prefill_tokens": 0, "reused_tokens": 0, "decode_steps": 0, "decoded_tokens": 0}
        self._bind(model)
        self._stop = False
        self._thread = threading.Thread(target=self._loop, name="batched-generator", daemon=True)
        self._thread.start()

    # -- weights -------------------------------------------------------------------------------
    def _bind(self, model: Any) -> None:
        cfg = model.config
        kind = getattr(cfg, "model_type", "")
        if kind not in ("qwen3", "llama"):
            raise UserError(f"batched generator: supports qwen3 and llama models, got model_type {kind!r}")
        self.model, self.cfg = model.eval(), cfg
        self.layers = model.model.layers
        self.heads, self.kv_heads = cfg.num_attention_heads, cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        rope = getattr(cfg, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(cfg, "rope_theta", 10000.0))
        if rope.get("rope_type", "default") != "default":
            raise UserError(f"batched generator: rope type {rope.get('rope_type')!r} is not supported")
        torch = self.torch
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32) / self.head_dim))
        self.qk_norm = kind == "qwen3"

    def load_weights(self, model: Any, version: str) -> None:
        """New weights (a whole model); every cached key/value belonged to the old ones."""
        with self.lock:
            self._bind(model)
            self.version = version
            self.slots.clear()

    def close(self) -> None:
        self._stop = True
        self.requests.put(None)  # type: ignore[arg-type]
        self._thread.join(timeout=10)

    # -- the Generator interface --------------------------------------------------------------
    def generate(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Generation:
        if not prompt_ids:
            raise UserError("batched generator: empty prompt")
        r = _Request(list(map(int, prompt_ids)), sampling, seed, t0=time.monotonic())
        self.requests.put(r)
        r.done.wait()
        if r.error is not None:
            raise r.error
        return Generation(r.out, r.logprobs, r.finish, self.version, time.monotonic() - r.t0)

    # -- scheduler ------------------------------------------------------------------------------
    def _loop(self) -> None:
        active: list[_Request] = []
        while not self._stop:
            new = self._take(block=not active)
            with self.lock, self.torch.inference_mode():
                for r in new:                   # a bad prompt fails its own request only
                    try:
                        self._start(r, active)
                    except BaseException as exc:
                        self._fail([r], exc)
                if active:
                    try:
                        self._decode(active)
                    except BaseException as exc:    # never leave a caller waiting
                        self._fail(active, exc)
            active[:] = [r for r in active if not r.done.is_set()]

    def _fail(self, reqs: list[_Request], exc: BaseException) -> None:
        """Deliver `exc` to the callers; their caches may be half written, so they are dropped."""
        for r in reqs:
            if r.slot is not None and r.slot in self.slots:
                self.slots.remove(r.slot)
            if not r.done.is_set():
                r.error = exc
                r.done.set()

    def _take(self, block: bool) -> list[_Request]:
        out = []
        try:
            r = self.requests.get(block=block, timeout=None if block else 0)
            while True:
                if r is None:
                    return out
                out.append(r)
                r = self.requests.get_nowait()
        except queue.Empty:
            return out

    def _start(self, r: _Request, active: list[_Request]) -> None:
        slot, start = self._slot_for(r.prompt)
        slot.busy, slot.used = True, time.monotonic()
        r.slot = slot
        r.rng = random.Random(int(r.seed))
        self.stats["reused_tokens"] += start
        self.stats["prefill_tokens"] += len(r.prompt) - start
        logits = self._forward([slot], [r.prompt[start:]], [start])
        slot.tokens, slot.length = list(r.prompt), len(r.prompt)
        self._emit([r], logits)
        if not r.done.is_set():
            active.append(r)

    def _decode(self, active: list[_Request]) -> None:
        batch = active[: self.max_batch]
        logits = self._forward([r.slot for r in batch], [[r.out[-1]] for r in batch], [r.slot.length for r in batch])
        self.stats["decode_steps"] += 1
        self.stats["decoded_tokens"] += len(batch)
        for r in batch:
            r.slot.tokens.append(r.out[-1])
            r.slot.length += 1
        self._emit(batch, logits)
        if len(active) > len(batch):            # more sequences than one forward takes: take turns
            active[:] = active[len(batch):] + batch

    def _emit(self, reqs: list[_Request], logits) -> None:
        """Sample each request's next token from its row of raw logits; finish those that end."""
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(reqs):
            s = r.sampling
            groups.setdefault((s.temperature, s.top_k, s.top_p), []).append(i)
        for rows in groups.values():
            toks, lps = sample_batch(logits[rows] if len(rows) < len(reqs) else logits, reqs[rows[0]].sampling,
                                     [reqs[i].rng.random() for i in rows])
            for i, tok, lp in zip(rows, toks, lps):
                r = reqs[i]
                r.out.append(tok)
                r.logprobs.append(lp)
                if tok == self.eos or len(r.out) >= r.sampling.max_tokens:
                    r.finish = "stop" if tok == self.eos else "length"
                    r.slot.busy = False
                    r.done.set()

    # -- cache slots ----------------------------------------------------------------------------
    def _slot_for(self, prompt: list[int]) -> tuple[_Slot, int]:
        """A slot whose cache is a prefix of `prompt` (continue it), else a fresh slot seeded with
        the longest shared prefix of any cached conversation (e.g. the system prompt)."""
        best, best_n = None, 0
        for s in self.slots:
            if not s.busy and 0 < s.length < len(prompt) and s.length > best_n and prompt[:s.length] == s.tokens[:s.length]:
                best, best_n = s, s.length
        if best is not None:
            return best, best_n
        donor, shared = None, 0
        for s in self.slots:
            n = _common_prefix(prompt, s.tokens, s.length)
            if n > shared:
                donor, shared = s, n
        shared = min(shared, len(prompt) - 1)
        slot = self._new_slot(max(len(prompt) + 64, 256))
        if donor is not None and shared >= self.min_shared:
            for layer in range(len(self.layers)):
                slot.keys[layer][:, :shared] = donor.keys[layer][:, :shared]
                slot.values[layer][:, :shared] = donor.values[layer][:, :shared]
            slot.tokens, slot.length = prompt[:shared], shared
            return slot, shared
        return slot, 0

    def _new_slot(self, capacity: int) -> _Slot:
        torch = self.torch
        dtype = self.model.model.embed_tokens.weight.dtype
        need = 2 * len(self.layers) * self.kv_heads * capacity * self.head_dim * torch.empty((), dtype=dtype).element_size()
        idle = sorted((s for s in self.slots if not s.busy), key=lambda s: s.used)
        held = sum(_slot_bytes(s) for s in self.slots)
        while idle and (len(self.slots) >= self.max_slots or held + need > self.cache_bytes):
            oldest = idle.pop(0)                    # least recently used first
            self.slots.remove(oldest)
            held -= _slot_bytes(oldest)
        shape = (self.kv_heads, capacity, self.head_dim)
        s = _Slot([torch.zeros(shape, dtype=dtype) for _ in self.layers], [torch.zeros(shape, dtype=dtype) for _ in self.layers])
        self.slots.append(s)
        return s

    def _ensure(self, slot: _Slot, needed: int) -> None:
        cap = slot.keys[0].shape[1]
        if needed <= cap:
            return
        torch, new_cap = self.torch, max(needed, 2 * cap)
        for layer in range(len(self.layers)):
            for store in (slot.keys, slot.values):
                grown = torch.zeros((self.kv_heads, new_cap, self.head_dim), dtype=store[layer].dtype)
                grown[:, :slot.length] = store[layer][:, :slot.length]
                store[layer] = grown

    # -- the model ------------------------------------------------------------------------------
    def _forward(self, slots: list[_Slot], chunks: list[list[int]], starts: list[int]):
        """Run `chunks[i]` (new tokens at positions starts[i]...) through the model, writing
        their keys/values into slots[i]; returns the raw logits of each chunk's last token."""
        torch = self.torch
        F = torch.nn.functional
        lens = [len(c) for c in chunks]
        for s, st, n in zip(slots, starts, lens):
            self._ensure(s, st + n)
        ids = torch.tensor([t for c in chunks for t in c], dtype=torch.long)
        pos = torch.cat([torch.arange(st, st + n) for st, n in zip(starts, lens)]).float()
        ang = pos[:, None] * self.inv_freq[None, :]
        cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)
        hd, h, kvh = self.head_dim, self.heads, self.kv_heads
        x = self.model.model.embed_tokens(ids)
        cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        for li, layer in enumerate(self.layers):
            att = layer.self_attn
            y = layer.input_layernorm(x)
            q = att.q_proj(y).view(-1, h, hd)
            k = att.k_proj(y).view(-1, kvh, hd)
            v = att.v_proj(y).view(-1, kvh, hd)
            if self.qk_norm:
                q, k = att.q_norm(q), att.k_norm(k)
            q, k = _rope(q, cos, sin), _rope(k, cos, sin)
            outs, o = [], 0
            for s, st, n in zip(slots, starts, lens):
                s.keys[li][:, st:st + n] = k[o:o + n].transpose(0, 1)
                s.values[li][:, st:st + n] = v[o:o + n].transpose(0, 1)
                kk, vv = s.keys[li][:, :st + n], s.values[li][:, :st + n]
                if n == 1:      # decode: the query heads of one kv head become its query rows, no mask
                    a = F.scaled_dot_product_attention(q[o].view(1, kvh, h // kvh, hd), kk.unsqueeze(0), vv.unsqueeze(0))
                    outs.append(a.reshape(1, h * hd))
                else:
                    qq = q[o:o + n].transpose(0, 1).unsqueeze(0)                 # [1, h, n, hd]
                    mask = torch.arange(st + n)[None, :] <= (st + torch.arange(n))[:, None]
                    a = F.scaled_dot_product_attention(qq, kk.unsqueeze(0), vv.unsqueeze(0), attn_mask=mask,
                                                       enable_gqa=h != kvh)
                    outs.append(a[0].transpose(0, 1).reshape(n, h * hd))
                o += n
            x = x + att.o_proj(torch.cat(outs) if len(outs) > 1 else outs[0])
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        last = torch.tensor([sum(lens[:i + 1]) - 1 for i in range(len(lens))])
        h_last = self.model.model.norm(x[last])
        return self.model.lm_head(h_last).float()


def _slot_bytes(slot: _Slot) -> int:
    return sum(t.numel() * t.element_size() for t in slot.keys + slot.values)


def _rope(x, cos, sin):
    """Rotary embedding, rotate-half convention (as transformers' Qwen3/Llama): x [T, heads, hd]."""
    import torch
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), -1)
    return x * cos[:, None, :] + rot * sin[:, None, :]


def _common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """Length of the common prefix of a and b[:limit] (binary search on slice equality)."""
    lo, hi = 0, min(len(a), limit)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


def sample_batch(logits, sampling: Sampling, uniforms: list[float]) -> tuple[list[int], list[float]]:
    """One token per row of raw logits [B, V] with temperature / top-k / top-p, drawn by inverse
    CDF from the given uniforms (one per row: each request has its own seeded stream, so a
    request's tokens do not depend on what else is in the batch). Returns the tokens and their
    raw logprobs (the behaviour logprob vLLM reports with logprobs_mode=raw_logprobs)."""
    import torch
    raw = torch.log_softmax(logits, -1)
    if sampling.temperature <= 0:
        toks = torch.argmax(logits, -1)
    else:
        if sampling.top_k and 0 < sampling.top_k < logits.shape[-1]:     # the k best, in descending order
            scores, order = torch.topk(logits / sampling.temperature, sampling.top_k, dim=-1)
        else:
            scores, order = torch.sort(logits / sampling.temperature, dim=-1, descending=True)
        probs = torch.softmax(scores, -1)
        cum = probs.cumsum(-1)
        if 0 < sampling.top_p < 1.0:       # keep the smallest prefix whose mass reaches top_p
            probs = probs.masked_fill(cum - probs > sampling.top_p, 0.0)
            cum = probs.cumsum(-1)
        u = torch.tensor(uniforms, dtype=cum.dtype)[:, None] * cum[:, -1:]
        idx = (cum < u).sum(-1).clamp(max=scores.shape[-1] - 1)
        idx = torch.minimum(idx, (probs > 0).sum(-1) - 1)        # never step past the kept set
        toks = order.gather(1, idx[:, None])[:, 0]
    lps = raw.gather(1, toks[:, None])[:, 0]
    return toks.tolist(), lps.tolist()


def check_against_transformers(model: Any, token_ids: list[int], split: int) -> float:
    """Max |Δ| between this module's logits (cache built from token_ids[:split], then the rest
    token by token) and one transformers forward over the whole sequence."""
    import torch
    gen = BatchedGenerator(model, eos_token_id=-1)
    try:
        with torch.inference_mode():
            ref = model(torch.tensor([token_ids])).logits[0].float()
            slot = gen._new_slot(len(token_ids))
            got = [gen._forward([slot], [token_ids[:split]], [0])[0]]
            for i in range(split, len(token_ids)):
                got.append(gen._forward([slot], [[token_ids[i]]], [i])[0])
        return float((torch.stack(got) - ref[split - 1:]).abs().max())
    finally:
        gen.close()
