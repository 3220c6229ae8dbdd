"""One generation interface, two engines: token ids in, token ids + behaviour logprobs out.

- `ServerGenerator`: a vLLM server's `/inference/v1/generate` (tokens mode): the server never
  re-tokenises anything, returns the sampled ids, their logprobs and the weight version of each
  generated span. Used on clusters (the server is a Slurm job next to the trainer) and on CPU.
- `LocalGenerator`: the policy model in this process (transformers `generate`), no server:
  colocated generation for small runs and tests.
Both return the same `Generation`, so the token-exact policy and the trainer cannot tell them
apart. What they sample with is a `Sampling` (policy/sampling.py).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from tbhpc.errors import EndpointError
from tbhpc.llm_client import post_json
from tbhpc.policy.sampling import Sampling
from tbhpc.serve.auth import bearer


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]           # behaviour logprob of each generated token (raw model distribution)
    finish_reason: str              # stop (EOS or stop token) | length
    version: str = "base"           # weight version that generated the tokens ("mixed:a,b" if a sync hit mid-turn)
    seconds: float = 0.0


class Generator(Protocol):
    def generate(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Generation: ...


@dataclass
class ServerGenerator:
    base_url: str                   # http://host:port (no /v1)
    model: str = "policy"
    timeout_s: float = 600.0
    retries: int = 5
    backoff_s: float = 1.0
    token: str = field(default="", repr=False)      # the run's server token (serve/auth.py); never printed

    def generate(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Generation:
        body = {"model": self.model, "token_ids": list(map(int, prompt_ids)), "sampling_params": {
            "temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p,
            "max_tokens": sampling.max_tokens, "seed": seed, "logprobs": 0}}
        t0 = time.monotonic()
        payload = self._post("/inference/v1/generate", body)
        try:
            choice = payload["choices"][0]
            ids = [int(t) for t in choice["token_ids"]]
            lps = [float(c["logprob"]) for c in choice["logprobs"]["content"]]
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EndpointError(f"{self.base_url}/inference/v1/generate returned an unexpected payload", exc) from None
        if len(lps) != len(ids):
            raise EndpointError(f"{self.base_url}: {len(ids)} tokens but {len(lps)} logprobs")
        versions = sorted({s["version"] for s in choice.get("weight_versions") or []})
        version = versions[0] if len(versions) == 1 else ("mixed:" + ",".join(versions) if versions else "unknown")
        return Generation(ids, lps, choice.get("finish_reason") or "stop", version, time.monotonic() - t0)

    def _post(self, route: str, body: dict) -> Any:
        return post_json(self.base_url.rstrip("/") + route, body, self.timeout_s, self.retries, self.backoff_s,
                         bearer(self.token))


@dataclass
class LocalGenerator:
    """Colocated: `model` and `eos_token_id` from a loaded transformers model (see HFPolicy)."""

    model: Any
    eos_token_id: int
    pad_token_id: int = 0
    version: str = "base"
    lock: Any = field(default_factory=threading.Lock, repr=False)   # one generate at a time: it seeds torch's global RNG

    @classmethod
    def for_tokenizer(cls, model: Any, tok: Any) -> "LocalGenerator":
        return cls(model, tok.eos_token_id, tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)

    def generate(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Generation:
        import torch

        t0 = time.monotonic()
        inp = torch.tensor([list(prompt_ids)], dtype=torch.long, device=self.model.device)
        with self.lock, torch.no_grad():
            torch.manual_seed(seed)
            out = self.model.generate(
                input_ids=inp, attention_mask=torch.ones_like(inp), do_sample=sampling.temperature > 0,
                temperature=sampling.temperature or None, top_k=sampling.top_k, top_p=sampling.top_p,
                max_new_tokens=sampling.max_tokens, eos_token_id=self.eos_token_id, pad_token_id=self.pad_token_id,
                return_dict_in_generate=True, output_logits=True)
        new = out.sequences[0, inp.shape[1]:].tolist()
        # raw logits -> behaviour logprobs of the sampled tokens (the same quantity vLLM reports
        # with logprobs_mode=raw_logprobs)
        lps = [float(torch.log_softmax(step[0].float(), -1)[tok]) for step, tok in zip(out.logits, new)]
        finish = "stop" if new and new[-1] == self.eos_token_id else "length"
        return Generation(new, lps, finish, self.version, time.monotonic() - t0)


def recompute_logprobs(model: Any, token_ids: list[int], start: int) -> list[float]:
    """Logprob of token_ids[i] for i >= start under `model`, from one forward pass: the
    in-process recomputation a trainer does (and the tests compare servers against)."""
    import torch

    device = getattr(model, "device", "cpu")      # a trainer's module may sit on a GPU
    with torch.no_grad():
        logits = model(torch.tensor([list(token_ids)], device=device)).logits[0].float()
    lp = torch.log_softmax(logits[start - 1:-1], -1)
    return lp.gather(1, torch.tensor(token_ids[start:], device=device).unsqueeze(1)).squeeze(1).tolist()
