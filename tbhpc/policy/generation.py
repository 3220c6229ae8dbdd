"""One generation interface, two engines: token ids in, token ids + behaviour logprobs out.

- `ServerGenerator`: a vLLM server's `/inference/v1/generate` (tokens mode): the server never
  re-tokenises anything, returns the sampled ids, their logprobs and the weight version of each
  generated span. Used on clusters (the server is a Slurm job next to the trainer) and on CPU.
  A turn a weight sync interrupted (`pause_mode: abort` ends it with finish_reason "abort"), or
  that weights still being verified sampled (`unverified:step-N`), is issued again, once the
  server serves a verified version: such tokens are never trained on, and dropping the whole
  group for them (what raising would do) wastes every other episode of it.
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
from tbhpc.serve.versions import UNVERIFIED
from tbhpc.serve.client import http_json


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]           # behaviour logprob of each generated token (raw model distribution)
    finish_reason: str              # stop (EOS or stop token) | length
    version: str = "base"           # weight version that generated the tokens ("mixed:a,b" if a sync hit mid-turn)
    seconds: float = 0.0
    token_versions: list[str] | None = None   # the version of each token, where it differs within the turn
    reissued: int = 0               # times this turn was issued again (aborted by a sync, or sampled by unverified weights)
    reprefilled: int = 0            # tokens the server prefilled again for this turn because weights changed under it
    discarded: int = 0              # tokens generated, then thrown away by those re-issues

    def versions(self) -> list[str]:
        """The weight version of each generated token."""
        return list(self.token_versions) if self.token_versions is not None else [self.version] * len(self.token_ids)


def spans_to_versions(spans: list[dict] | None, n: int) -> list[str]:
    """vLLM's weight-version spans ({version, start, end} over output-token indexes) -> one version
    per token; "unknown" where no span covers a token (a server that does not label versions)."""
    out = ["unknown"] * n
    for s in spans or []:
        for i in range(max(0, int(s["start"])), min(n, int(s["end"]))):
            out[i] = str(s["version"])
    return out


def turn_version(versions: list[str]) -> str:
    """One label for a turn: its version, or "mixed:a,b" when a sync changed it mid-turn."""
    distinct = sorted(set(versions))
    return distinct[0] if len(distinct) == 1 else ("mixed:" + ",".join(distinct) if distinct else "unknown")


def switch_points(versions: list[str]) -> list[int]:
    """Output indexes where the version changes (a `keep` pause resumed the turn on new weights)."""
    return [i for i in range(1, len(versions)) if versions[i] != versions[i - 1]]


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
    max_reissues: int = 8           # a turn aborted or sampled by unverified weights this many times: EndpointError
    verified_wait_s: float = 1800.0  # how long a re-issue waits for the server to serve a verified version
    syncing: threading.Event = field(default_factory=threading.Event, repr=False, compare=False)

    def generate(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Generation:
        """One turn. Re-issued (same prompt and seed) when a sync aborted it or when weights still
        being verified sampled any of it; the re-issue waits until the server serves a trusted
        version. A turn a `keep` pause continued on new weights is returned with its per-token
        versions; the server prefilled prompt + the tokens before each switch again."""
        t0 = time.monotonic()
        reissued = discarded = reprefilled = 0
        moved_from = ""
        while True:
            if self.syncing.is_set():           # a turn saw a sync: wait for its verdict, not sample under it
                self._await_trusted(t0 + self.verified_wait_s, moved_from)
            g = self._once(prompt_ids, sampling, seed)
            versions = g.versions()
            unverified = any(v.startswith(UNVERIFIED) for v in versions)
            if g.finish_reason != "abort" and not unverified:
                reprefilled += sum(len(prompt_ids) + i for i in switch_points(versions))
                g.reissued, g.discarded, g.reprefilled = reissued, discarded, reprefilled
                g.seconds = time.monotonic() - t0
                return g
            reissued += 1
            discarded += len(g.token_ids)
            reprefilled += len(prompt_ids)
            if reissued > self.max_reissues:
                why = "aborted by weight syncs" if g.finish_reason == "abort" else "sampled by unverified weights"
                raise EndpointError(f"{self.base_url}: a turn was {why} {reissued} times in a row")
            if g.finish_reason == "abort" and versions and not unverified:
                moved_from = versions[-1]       # aborted before the new weights were in: wait for them
            self.syncing.set()

    def _await_trusted(self, deadline: float, moved_from: str = "", move_wait_s: float = 60.0) -> None:
        """Until the server serves a verified step or the base (a sync's check is running); a
        refused version (`rejected:`) returns too: the next turn is then refused by the rollout.
        `moved_from`: a version an abort interrupted; up to `move_wait_s` more for the server to
        leave it (the sync's load may not have begun yet)."""
        move_until = time.monotonic() + move_wait_s
        while True:
            try:
                served = str(http_json(self.base_url.rstrip("/") + "/weight_info", timeout=30, token=self.token)
                             ["weight_version"])
            except Exception:           # a server restarting for the sync: ask again
                served = UNVERIFIED
            if not served.startswith(UNVERIFIED) and (served != moved_from or time.monotonic() > move_until):
                self.syncing.clear()
                return
            if time.monotonic() > deadline:
                raise EndpointError(f"{self.base_url}: the server's weights were still being verified after "
                                    f"{self.verified_wait_s:g} s")
            time.sleep(0.2)

    def _once(self, prompt_ids: list[int], sampling: Sampling, seed: int) -> Generation:
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
        versions = spans_to_versions(choice.get("weight_versions"), len(ids))
        return Generation(ids, lps, choice.get("finish_reason") or "stop", turn_version(versions), time.monotonic() - t0,
                          token_versions=versions)

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
