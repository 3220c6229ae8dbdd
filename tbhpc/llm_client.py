"""A minimal OpenAI-compatible chat client (stdlib HTTP), shared by the `openai` policy, the LLM
user simulator and the LLM judge.

Why stdlib and not the `openai` package: one fewer pinned dependency on every node, and the
three callers need only `POST /v1/chat/completions` with retries. Transient failures (connection
errors, 429, 5xx) are retried with backoff; what still fails raises `EndpointError`, which the
episode records as a system error, never as a 0.
"""
from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from tbhpc.errors import EndpointError

RETRY_STATUS = {408, 429, 500, 502, 503, 504}


@dataclass
class Usage:
    input_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0

    def add(self, other: "Usage") -> None:
        self.input_tokens += other.input_tokens
        self.cached_tokens += other.cached_tokens
        self.output_tokens += other.output_tokens
        self.reasoning_tokens += other.reasoning_tokens

    @classmethod
    def from_openai(cls, u: dict | None) -> "Usage":
        u = u or {}
        details = u.get("prompt_tokens_details") or {}
        out_details = u.get("completion_tokens_details") or {}
        return cls(int(u.get("prompt_tokens") or 0), int(details.get("cached_tokens") or 0),
                   int(u.get("completion_tokens") or 0), int(out_details.get("reasoning_tokens") or 0))


@dataclass
class ChatEndpoint:
    """Where and how to call: base URL (…/v1), model name, sampling defaults, retry policy."""

    base_url: str
    model: str
    api_key: str = field(default_factory=lambda: os.environ.get("OPENAI_API_KEY", "EMPTY"), repr=False)
    timeout_s: float = 600.0
    retries: int = 5
    backoff_s: float = 1.0
    sampling: dict[str, Any] = field(default_factory=dict)

    def chat(self, messages: list[dict], **overrides: Any) -> tuple[dict, Usage]:
        """POST a chat completion; return (choice message dict, usage)."""
        body = {"model": self.model, "messages": messages, **self.sampling, **overrides}
        body = {k: v for k, v in body.items() if v is not None}
        url = self.base_url.rstrip("/") + "/chat/completions"
        payload = post_json(url, body, self.timeout_s, self.retries, self.backoff_s, {"Authorization": f"Bearer {self.api_key}"})
        try:
            return payload["choices"][0]["message"], Usage.from_openai(payload.get("usage"))
        except (KeyError, IndexError, TypeError) as exc:
            raise EndpointError(f"{url} returned an unexpected payload", exc) from None


def post_json(url: str, body: dict, timeout_s: float, retries: int, backoff_s: float,
              headers: dict[str, str] | None = None) -> Any:
    """POST JSON, retrying transient failures (connection errors, 408/429/5xx, e.g. a server
    restarting for a weight sync) with exponential backoff; anything else raises EndpointError."""
    data = json.dumps(body).encode("utf-8")
    last: Exception | None = None
    for attempt in range(retries + 1):
        req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return json.loads(resp.read().decode("utf-8"))
        except urllib.error.HTTPError as exc:
            last = exc
            if exc.code not in RETRY_STATUS:
                detail = exc.read().decode("utf-8", "replace")[:300]
                raise EndpointError(f"{url} answered HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, TimeoutError, ConnectionError, OSError) as exc:
            last = exc
        except ValueError as exc:
            raise EndpointError(f"{url} returned an unexpected payload", exc) from None
        if attempt < retries:
            time.sleep(backoff_s * (2 ** attempt))
    raise EndpointError(f"{url} failed after {retries + 1} attempts", last)
