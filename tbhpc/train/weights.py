"""Which weights the rollouts sample from. The trainer asks a source for step N's weights
(`load(N)`); the rollout policy then samples from them. Two sources, one interface:

- `ServerWeights` (generator=server): wait until the run's vLLM server serves step N's version,
  or a newer verified one when the run may sample one step off-policy;
- `LocalWeights` (generator=local | batched): load the published copy of step N (not the trainer's
  module: exactly the weights a server would load) into an in-process generator and hand it to
  the policy; the batched generator takes new weights in place.

Why apart from the loop: the trainer neither knows how a generator is built nor reaches into the
policy that holds it; what a source needs (the run, the tokenizer, the policy) it is given once.
"""
from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

from tbhpc.policy.batched import BatchedGenerator
from tbhpc.policy.generation import LocalGenerator
from tbhpc.policy.tokens import TokenPolicy
from tbhpc.serve.checkpoints import published
from tbhpc.serve.endpoint import wait_for_version
from tbhpc.train.config import TrainConfig
from tbhpc.train.lora import load_adapted
from tbhpc.train.record import version_of


def rollout_policy(cfg: TrainConfig, run_path: Path) -> TokenPolicy:
    """The token-exact policy the rollouts run: the run's sampling, its server (endpoint.json in the
    run directory) unless it generates in process."""
    return TokenPolicy(model_path=cfg.model, generator=cfg.generator, endpoint=str(run_path), sampling=cfg.sampling,
                       response_budget=cfg.response_budget, max_context=cfg.max_context, seed=cfg.seed,
                       threads=cfg.torch_threads, timeout_s=cfg.request_timeout_s)


class ServerWeights:
    """The run's server: `load(N)` waits (up to `timeout_s`) for the version of step N, or a newer
    verified one when `or_newer`. A set `stop` ends the wait early: the rollouts that follow then
    claim nothing and the loop stops at its next safe point."""

    def __init__(self, run_path: Path, timeout_s: float, or_newer: bool, stop: threading.Event):
        self.run_path, self.timeout_s, self.or_newer, self.stop = run_path, timeout_s, or_newer, stop
        self.exact: int | None = None

    def pin(self, step: int) -> None:
        """The next load waits for exactly step `step`'s weights, whatever it asks for: after a rewind
        the server may still serve a discarded, newer step."""
        self.exact = step

    def load(self, step: int) -> None:
        exact, self.exact = self.exact, None
        wait_for_version(self.run_path, version_of(step if exact is None else exact), timeout_s=self.timeout_s,
                         or_newer=self.or_newer and exact is None, stop=self.stop)


class LocalWeights:
    """The in-process generator of `policy`: `load(N)` loads step N's published weights (the base
    model for step 0) into a new generator, or into the batched one in place."""

    def __init__(self, policy: TokenPolicy, tokenizer: Any, run_path: Path, base_model: str, batched: bool):
        self.policy, self.tokenizer, self.run_path = policy, tokenizer, run_path
        self.base_model, self.batched = base_model, batched
        self.generator = None

    def pin(self, step: int) -> None:
        """Nothing to pin: each load is of exactly the step asked for."""

    def load(self, step: int) -> None:
        want = version_of(step)
        model = self._published_model(step)
        if self.batched and self.generator is not None:
            self.generator.load_weights(model, want)
            return
        if self.batched:
            gen = BatchedGenerator(model, self.tokenizer.eos_token_id, version=want)
        else:
            gen = LocalGenerator.for_tokenizer(model, self.tokenizer)
            gen.version = want
        self.generator = gen
        self.policy.use(self.tokenizer, gen)

    def _published_model(self, step: int):
        import torch        # here, not at the top: `tbhpc train` sets the OpenMP policy before torch loads (engine.py)
        from transformers import AutoModelForCausalLM
        pub = published(self.run_path, step) if step else None
        if pub is not None and pub.weights == "adapter":
            return load_adapted(self.base_model, str(pub.path)).eval()
        path = str(pub.path) if pub is not None else self.base_model
        return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
