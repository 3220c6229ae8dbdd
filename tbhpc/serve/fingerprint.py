"""Weight fingerprints: a checkpoint says what it computes, so a server's claim to serve it is
checked instead of trusted.

Why: a weight sync that reports the new version while computing with (some of) the old weights
is silent: tokens change, versions match, and the trainer learns from samples of weights nobody
published. The publisher therefore stores, in the checkpoint's ready marker, a fixed probe
sequence and its own logprobs on it (one forward pass); after a sync the supervisor (or anyone,
with `tbhpc serve-check`) scores the same ids through the server's standard completions route
(`prompt_logprobs`, a single prefill) and compares. The probe is ordinary text rendered by the
checkpoint's tokenizer (a chat turn with a tool call), so it exercises the layers a rollout does.

The comparison is the mean |Δ logprob| over the probe tokens (max reported too): serving in bf16
against an fp32 fingerprint moves single low-probability tokens, not the mean, while a wrong
layer or a stale copy moves every token. Tolerances: `default_tol(dtype)`, measured in docs/guides/serving.md.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

from tbhpc.errors import EndpointError, UserError
from tbhpc.llm_client import post_json
from tbhpc.serve.client import ServerClient

PROBE_TEXT = (
    "<|im_start|>system\nYou are a support agent for Northwind Home. Follow the policy manual; "
    "verify the customer's identity before any change.<|im_end|>\n<|im_start|>user\nHi, I'd like to "
    "return the bookshelf from order O2067, I changed my mind. My email is jonas.petrov21@example.com."
    "<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{\"name\": \"find_customer\", \"arguments\": "
    "{\"email\": \"jonas.petrov21@example.com\"}}\n</tool_call><|im_end|>\n")
PROBE_MAX_TOKENS = 64         # one prefill of this many tokens per check (docs/guides/serving.md: cost)
# mean |Δ logprob| a faithful server stays under, by the dtype it computes in (docs/guides/serving.md: measured
# noise floors vs an fp32 fingerprint, with margin); a wrong or stale layer is far above both.
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.1, "float16": 0.1}


def default_tol(dtype: str | None) -> float:
    return TOLERANCE.get(str(dtype or "").removeprefix("torch."), max(TOLERANCE.values()))


@dataclass(frozen=True)
class Fingerprint:
    tokens: list[int]           # the probe ids
    logprobs: list[float]       # logprob of tokens[i] given tokens[:i], i >= 1 (len(tokens) - 1 values)
    dtype: str = ""             # the dtype the publisher computed in

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "Fingerprint":
        fp = cls([int(t) for t in d["tokens"]], [float(x) for x in d["logprobs"]], str(d.get("dtype", "")))
        if len(fp.tokens) < 2 or len(fp.logprobs) != len(fp.tokens) - 1:
            raise ValueError(f"fingerprint has {len(fp.tokens)} tokens but {len(fp.logprobs)} logprobs")
        return fp


def probe_tokens(tokenizer: Any = None, vocab_size: int = 0) -> list[int]:
    """The probe ids: PROBE_TEXT through the checkpoint's tokenizer, or (no tokenizer) a fixed
    pseudo-random walk over the vocabulary."""
    if tokenizer is not None:
        ids = tokenizer.encode(PROBE_TEXT, add_special_tokens=False)[:PROBE_MAX_TOKENS]
        if len(ids) >= 2:
            return [int(i) for i in ids]
    if vocab_size <= 1:
        raise ValueError("probe_tokens needs a tokenizer or a vocab_size")
    x, ids = 12345, []
    for _ in range(PROBE_MAX_TOKENS):
        x = (1103515245 * x + 12345) % 2**31
        ids.append(x % vocab_size)
    return ids


def compute_fingerprint(model: Any, tokenizer: Any = None) -> Fingerprint:
    """The model's own logprobs on the probe (one forward pass, no grad, in the model's dtype)."""
    from tbhpc.policy.generation import recompute_logprobs
    vocab = int(getattr(getattr(model, "config", None), "vocab_size", 0) or 0)
    ids = probe_tokens(tokenizer, vocab)
    dtype = str(getattr(model, "dtype", "")).removeprefix("torch.")
    training = bool(getattr(model, "training", False))
    if training:
        model.eval()          # no dropout: the server never applies it
    try:
        lps = recompute_logprobs(model, ids, 1)
    finally:
        if training:
            model.train()
    return Fingerprint(ids, [float(x) for x in lps], dtype)


def load_checkpoint(path: str, dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer or None) of a checkpoint directory on disk, loaded with transformers on
    the CPU: to fingerprint and digest checkpoints written by other code or served by others."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype))
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{path}: cannot load the checkpoint to fingerprint it ({str(exc).splitlines()[0]})") from None
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except (OSError, ValueError):
        tok = None
    return model, tok



def served_logprobs(server: ServerClient, model: str, tokens: list[int], timeout_s: float = 120.0) -> list[float]:
    """Teacher-forced logprobs of `tokens` through an OpenAI-compatible vLLM server
    (`/v1/completions` with `prompt_logprobs`, one prefill; nothing is sampled that matters)."""
    body = {"model": model, "prompt": list(map(int, tokens)), "max_tokens": 1, "temperature": 0.0,
            "prompt_logprobs": 0}
    payload = post_json(server.base_url + "/v1/completions", body, timeout_s, 2, 0.5, server.headers)
    try:
        rows = payload["choices"][0]["prompt_logprobs"]
        out = [float(rows[i][str(tokens[i])]["logprob"]) for i in range(1, len(tokens))]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise EndpointError(f"{server.base_url}: /v1/completions returned no prompt logprobs for the probe", exc) from None
    return out


@dataclass
class Check:
    version: str                # what the server reported while it was scored
    max_err: float
    mean_err: float
    tol: float
    n_tokens: int
    seconds: float
    served: list[float] = field(default_factory=list, repr=False)   # the server's logprobs on the probe

    @property
    def passed(self) -> bool:
        return self.mean_err <= self.tol

    def summary(self) -> str:
        verdict = "PASS" if self.passed else "FAIL"
        return (f"{verdict}: serves {self.version}; probe mean |Δlogprob| {self.mean_err:.2e} (tolerance {self.tol:.2e}), "
                f"max {self.max_err:.2e} over {self.n_tokens} tokens; {self.seconds * 1000:.0f} ms")

    def to_json(self) -> dict:
        return {"probe_version": self.version, "probe_mean_err": round(self.mean_err, 6),
                "probe_max_err": round(self.max_err, 6), "probe_tol": self.tol, "probe_tokens": self.n_tokens,
                "check_s": round(self.seconds, 4), "verified": self.passed}


def distance(a: list[float], b: list[float]) -> tuple[float, float]:
    """(max, mean) |a - b| over two logprob lists of one probe."""
    if len(a) != len(b) or not a:
        raise ValueError(f"cannot compare {len(a)} with {len(b)} logprobs")
    d = [abs(x - y) for x, y in zip(a, b)]
    return max(d), sum(d) / len(d)


def check_server(server: ServerClient, model: str, fp: Fingerprint, version: str, tol: float,
                 timeout_s: float = 120.0) -> Check:
    t0 = time.monotonic()
    served = served_logprobs(server, model, fp.tokens, timeout_s)
    mx, mean = distance(served, fp.logprobs)
    return Check(version, mx, mean, tol, len(fp.logprobs), time.monotonic() - t0, served)
