"""Talking to a policy server: where it answers and the run token it wants, in one value.

Why one value: every caller that reaches a server (the supervisor's admin routes, the weight
checks, `serve-check`, the policies) needs both, and a function that takes a URL alone is one
that forgets the token. The token is left out of the repr, so a logged or printed client never
shows it.
"""
from __future__ import annotations

import json
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tbhpc.serve.auth import bearer, read_token


def http_json(url: str, body: dict | None = None, timeout: float = 30.0, token: str = "") -> Any:
    """GET (no body) or POST `body` as JSON; the parsed answer (None when empty; the text itself from
    a route that answers in plain text, like vLLM's LoRA routes)."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method="POST" if data is not None else "GET",
                                 headers={"Content-Type": "application/json", **bearer(token)})
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        raw = resp.read()
    if not raw.strip():
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode("utf-8", "replace")


@dataclass(frozen=True)
class ServerClient:
    base_url: str                                   # http://host:port (no /v1)
    token: str = field(default="", repr=False)

    @classmethod
    def at(cls, url: str, token_file: Path | str | None = None) -> "ServerClient":
        """A server given by URL (with or without /v1), its token read from `token_file` if any."""
        return cls(url.rstrip("/").removesuffix("/v1"), read_token(token_file) if token_file else "")

    @property
    def headers(self) -> dict[str, str]:
        return bearer(self.token)

    def get(self, route: str, timeout: float = 30.0) -> Any:
        return http_json(self.base_url + route, timeout=timeout, token=self.token)

    def post(self, route: str, body: dict | None = None, timeout: float = 30.0) -> Any:
        return http_json(self.base_url + route, {} if body is None else body, timeout=timeout, token=self.token)
