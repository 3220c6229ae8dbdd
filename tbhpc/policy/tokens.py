"""The `tokens` policy: token-exact rollouts for training (and evaluation) with either engine.

Each episode keeps a `TokenTrace`: prompt ids rendered once, generated ids and behaviour logprobs
exactly as sampled, observation deltas with loss mask 0, and the weight version of every turn.
The generated text goes through the same interpreter as every other policy (the episode loop
does that); this policy only turns history into ids and ids into text.

Options: `generator=server` (a vLLM server: `endpoint=RUN_DIR` reads RUN/endpoint.json, or
`base_url=http://host:port`), `generator=local` (the model at `model_path`, in process, one
`generate` per turn) or `generator=batched` (in process, continuous batching across the episodes
a worker runs at once: campaigns set `concurrency`).
`model_path` also supplies the tokenizer and chat template in server mode (on a cluster: the
same shared directory the server loads). Sampling: `sampling` (a Sampling), or its fields as
options (`temperature=0.7`, `max_tokens` per turn); `response_budget` generated tokens per episode.
A trainer hands the policy its in-process generator (`use`) each time it loads new weights.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from tbhpc import progress
from tbhpc.errors import UserError
from tbhpc.llm_client import Usage
from tbhpc.env.agent import Completion
from tbhpc.policy.generation import Generator, LocalGenerator, ServerGenerator
from tbhpc.policy.sampling import Sampling, flat_sampling
from tbhpc.rollout.tokens import TokenTrace
from tbhpc.tasks.schema import Task


MAX_KEPT_TRACES = 256
_TRACES_LOCK = threading.Lock()
_LOAD_LOCK = threading.Lock()


@flat_sampling()
@dataclass
class TokenPolicy:
    model_path: str = ""                # tokenizer and chat template (server mode); the model itself (local, batched)
    generator: str = "server"           # server | local | batched
    endpoint: str = ""                  # server mode: run dir or endpoint.json
    base_url: str = ""                  # server mode: http://host:port (instead of endpoint)
    token_file: str = ""                # with base_url: the file holding the server's token (endpoint= reads the run's)
    served_model: str = "policy"        # with base_url: the model name the server serves
    sampling: Sampling = field(default_factory=Sampling)
    response_budget: int = 8192         # generated tokens per episode
    max_context: int = 0                # stop an episode whose prompt reaches this (0: no check)
    check_prefix: bool = True           # verify each finished trace against a fresh rendering
    on_template_break: str = "split"    # a template that rewrites earlier turns: split the episode into samples | error
    seed: int = 0                       # sampling seed (combined with each attempt's and each turn's)
    threads: int = 1                    # torch threads (local, batched)
    timeout_s: float = 600.0            # server mode: one generation request's HTTP timeout
    name: str = "tokens"
    traces: dict = field(default_factory=dict, repr=False)   # (task_id, seed) -> finished TokenTrace
    _engine: tuple = field(default=(), repr=False)

    @staticmethod
    def check_ranges(options: dict) -> None:
        """What loading would refuse, said when the options are checked (a campaign checks them
        before its run directory exists): the generator's name, and a server to ask."""
        generator = options.get("generator", "server")
        if generator not in ("server", "local", "batched"):
            raise UserError(f"--policy tokens: generator must be server, local or batched, got {generator!r}")
        if generator == "server" and not (options.get("endpoint") or options.get("base_url")):
            raise UserError("--policy tokens generator=server needs endpoint=RUN_DIR or base_url=http://host:port")
        timeout = options.get("timeout_s", 600.0)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout < float("inf"):
            raise UserError(f"--policy tokens: timeout_s must be a positive number of seconds, got {timeout!r}")

    @staticmethod
    def check_ready(options: dict) -> None:
        """The model a local generator loads is there (checked before a campaign writes anything;
        not in check_ranges, which also runs on the stored config of a finished run)."""
        from tbhpc.policy.hf import model_dir_problem
        generator, model = options.get("generator", "server"), str(options.get("model_path") or "")
        if generator != "server" and (problem := model_dir_problem(model)):
            raise UserError(f"--policy tokens generator={generator}: model_path {problem}")

    def load(self) -> tuple[Any, Generator]:
        with _LOAD_LOCK:          # the first sessions of a worker's episode threads arrive together
            return self._load()

    def _load(self) -> tuple[Any, Generator]:
        if not self._engine:
            self.check_ranges(vars(self))       # also when built directly (the trainer), not by make_policy
            self._engine = self._server_engine() if self.generator == "server" else self._local_engine()
        return self._engine

    def _server_engine(self) -> tuple[Any, Generator]:
        from tbhpc.serve.client import ServerClient
        from tbhpc.serve.endpoint import read_endpoint
        if self.endpoint:
            ep = read_endpoint(self.endpoint)
            server, model, path = ep.client(), ep.model, self.model_path or ep.model_path
        else:                   # check_ranges: one of the two is there
            server, model, path = ServerClient.at(self.base_url, self.token_file or None), self.served_model, self.model_path
        if not path:
            raise UserError("--policy tokens: model_path (tokenizer + chat template) is required")
        try:
            from transformers import AutoTokenizer
        except ImportError as exc:  # pragma: no cover - depends on the install
            raise UserError(f"--policy tokens needs transformers ({exc}); run `make env`") from None
        from tbhpc.policy.hf import from_pretrained
        return from_pretrained(AutoTokenizer, path, "--policy tokens"), ServerGenerator(server.base_url, model, timeout_s=self.timeout_s,
                                                                    token=server.token)

    def _local_engine(self) -> tuple[Any, Generator]:
        from tbhpc.policy.hf import HFPolicy
        tok, model = HFPolicy(model_path=self.model_path, threads=self.threads)._load()
        if self.generator == "batched":
            from tbhpc.policy.batched import BatchedGenerator
            return tok, BatchedGenerator(model, tok.eos_token_id)
        return tok, LocalGenerator.for_tokenizer(model, tok)

    def use(self, tokenizer: Any, generator: Generator) -> None:
        """Sessions opened from now on generate with `generator` (an in-process one its owner loads
        weights into) and render with `tokenizer`."""
        self._engine = (tokenizer, generator)

    def session(self, task: Task, seed: int = 0) -> "TokenSession":
        tok, gen = self.load()
        s = TokenSession(self, task.id, seed, TokenTrace(tok, on_break=self.on_template_break), gen)
        with _TRACES_LOCK:        # sessions open from many episode threads
            self.traces[(task.id, seed)] = s.trace
            while len(self.traces) > MAX_KEPT_TRACES:   # a campaign never pops them: keep the newest only
                self.traces.pop(next(iter(self.traces)))
        return s

    def pop_trace(self, task_id: str, seed: int) -> TokenTrace | None:
        """The trace of an episode; None if it never opened a session (e.g. its backend failed first)."""
        with _TRACES_LOCK:
            return self.traces.pop((task_id, seed), None)


@dataclass
class TokenSession:
    policy: TokenPolicy
    task_id: str
    seed: int
    trace: TokenTrace
    gen: Generator
    turn: int = 0

    def complete(self, messages: list[dict], tools: list[dict]) -> Completion:
        p, tr = self.policy, self.trace
        prompt = tr.prompt(messages, tools)
        left = p.response_budget - tr.generated
        if left <= 0:
            return Completion("", finish_reason="response_budget")
        if p.max_context and len(prompt) >= p.max_context:
            return Completion("", finish_reason="context_limit")
        per_turn = p.sampling.max_tokens
        cap = min(per_turn, left) if not p.max_context else min(per_turn, left, p.max_context - len(prompt))
        g = self.gen.generate(prompt, replace(p.sampling, max_tokens=cap), seed=(p.seed * 1_000_003 + self.seed) * 1009 + self.turn)
        progress.mark()          # a rank that still generates is slow, not hung (tbhpc/train/watch.py)
        self.turn += 1
        tr.add_generation(g.token_ids, g.logprobs, g.version, g.reissued, g.reprefilled, g.token_versions)
        text = tr.tokenizer.decode(g.token_ids, skip_special_tokens=True)
        return Completion(text, Usage(input_tokens=len(prompt), output_tokens=len(g.token_ids)))
