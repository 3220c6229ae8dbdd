"""The `openai` policy: any OpenAI-compatible chat endpoint (vLLM, a hosted API).

Why the answer is turned back into text: servers may run their own tool-call and reasoning
parsers and return structured `tool_calls` / `reasoning_content`; we re-render those as text so
that tbhpc's one interpreter still decides what the calls are (and coerces their types).
Defaults follow the published sampling: temperature 1.0, top-k 20, top-p 0.95.
`endpoint=RUN_DIR` reads the URL and model name from the run's endpoint.json (written by
`tbhpc serve`, which may be a Slurm job on a node nobody knew in advance).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from tbhpc.interpret import render_tool_call
from tbhpc.llm_client import ChatEndpoint
from tbhpc.env.agent import Completion
from tbhpc.tasks.schema import Task

DEFAULT_SAMPLING = {"temperature": 1.0, "top_p": 0.95, "top_k": 20, "max_tokens": 8192}


@dataclass
class OpenAIPolicy:
    base_url: str = "http://127.0.0.1:8000/v1"   # the OpenAI-compatible API (…/v1)
    model: str = "default"              # the model name the server serves
    endpoint: str = ""                  # a run dir / endpoint.json: overrides base_url and model, sends the run's token
    token_file: str = ""                # with base_url: a file holding the server's key (else $OPENAI_API_KEY)
    response_budget: int = 0            # completion tokens per episode (0: no budget); max_tokens caps each turn
    sampling: dict[str, Any] = field(default_factory=dict)   # request fields over the defaults (temperature 1.0, top_k 20, top_p 0.95)
    send_tools: bool = True             # send the tool schemas as `tools` (off: the prompt alone describes them)
    timeout_s: float = 600.0            # one request's HTTP timeout
    retries: int = 5                    # retries of a request that fails to connect or answers 408/429/5xx
    backoff_s: float = 1.0              # first wait between retries (doubling)
    name: str = "openai"

    def __post_init__(self) -> None:
        key: dict[str, str] = {}
        if self.endpoint:
            from tbhpc.serve.endpoint import read_endpoint
            ep = read_endpoint(self.endpoint)
            self.base_url, self.model = ep.openai_url, ep.model
            key = {"api_key": token} if (token := ep.client().token) else {}
        elif self.token_file:
            from tbhpc.serve.auth import read_token
            key = {"api_key": read_token(self.token_file)}
        self.chat = ChatEndpoint(self.base_url, self.model, timeout_s=self.timeout_s, retries=self.retries, backoff_s=self.backoff_s,
                                 sampling={**DEFAULT_SAMPLING, **self.sampling}, **key)

    def session(self, task: Task, seed: int = 0) -> "_OpenAISession":
        return _OpenAISession(self, seed)


@dataclass
class _OpenAISession:
    policy: OpenAIPolicy
    seed: int
    used: int = 0

    def complete(self, messages: list[dict], tools: list[dict]) -> Completion:
        p = self.policy
        extra: dict[str, Any] = {"tools": tools} if (p.send_tools and tools) else {}
        if p.response_budget:
            left = p.response_budget - self.used
            if left <= 0:
                return Completion("", finish_reason="response_budget")
            extra["max_tokens"] = min(left, p.chat.sampling.get("max_tokens") or left)
        msg, usage = p.chat.chat(chat_messages(messages), seed=self.seed, **extra)
        self.used += usage.output_tokens
        return Completion(message_to_text(msg), usage)


def message_to_text(msg: dict) -> str:
    """Server message -> raw text the interpreter understands."""
    parts = []
    reasoning = msg.get("reasoning_content") or msg.get("reasoning")
    if reasoning:
        parts.append(f"<think>{reasoning}</think>")
    if msg.get("content"):
        parts.append(msg["content"])
    for call in msg.get("tool_calls") or []:
        fn = call.get("function", {})
        args: Any = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError:
                parts.append(f'<tool_call>{{"name": {json.dumps(fn.get("name", ""))}, "arguments": {args}}}</tool_call>')
                continue
        parts.append(render_tool_call(fn.get("name", ""), args))
    return "\n".join(parts)


def chat_messages(messages: list[dict]) -> list[dict]:
    """History as an OpenAI-compatible server expects it (our bookkeeping keys removed)."""
    keep = ("role", "content", "tool_calls", "tool_call_id", "name")
    return [{k: m[k] for k in keep if k in m} for m in messages]
