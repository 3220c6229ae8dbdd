"""ASGI middleware that answers only requests carrying the run's token (`Authorization: Bearer ...`).

Why here and not vLLM's `--api-key`: that guards `/v1/*` only, while the routes that steer a
training run (`/collective_rpc`, `/pause`, `/resume`, `/reset_prefix_cache`, `/update_weight_version`,
`/inference/v1/generate`) stay open, and the key would sit on the command line or in the
environment. This middleware wraps the whole app (vLLM adds it last, so it runs first) and reads
the token from the file `TBHPC_TOKEN_FILE` names. Only `/health` stays open: Slurm and the
supervisor probe it, and it tells nobody anything. Without a token file the server does not
start. Stdlib only: it runs in vLLM's environment (and in any other ASGI server of tbhpc's).
"""
from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import time

TOKEN_ENV = "TBHPC_TOKEN_FILE"
OPEN_PATHS = frozenset({"/health"})
LOG_BURST = 20            # refusals logged one by one per LOG_WINDOW_S; beyond that, one line with the count
LOG_WINDOW_S = 60.0

log = logging.getLogger("vllm.tbhpc.auth")     # under vLLM's logger: its format and handler


def read_token_file(path: str | None = None) -> str:
    """The run's token from `path` (default: the file TBHPC_TOKEN_FILE names): what the middleware
    checks requests against and what the worker proves a broadcast group with. RuntimeError when
    there is none: nothing of tbhpc's serves without it."""
    path = path or os.environ.get(TOKEN_ENV, "")
    if not path:
        raise RuntimeError(f"tbhpc_auth: {TOKEN_ENV} is not set; refusing to serve without the run's token")
    with open(path, encoding="utf-8") as f:
        token = f.read().strip()
    if len(token) < 32:
        raise RuntimeError(f"tbhpc_auth: {path} holds no token")
    return token


def _digest(value: bytes) -> bytes:
    return hashlib.sha256(value).digest()      # equal-length inputs for the constant-time compare


class RequireRunToken:
    def __init__(self, app, token_file: str | None = None):
        self.app = app
        self._want = _digest(read_token_file(token_file).encode())
        self._window_start, self._logged, self._suppressed = 0.0, 0, 0

    def authorized(self, headers) -> bool:
        value = b""
        for name, v in headers:
            if name.lower() == b"authorization":
                value = v
                break
        scheme, _, given = value.partition(b" ")
        ok = hmac.compare_digest(_digest(given.strip()), self._want)
        return ok and scheme.lower() == b"bearer"

    async def __call__(self, scope, receive, send):
        if scope["type"] not in ("http", "websocket") or scope.get("path") in OPEN_PATHS:
            return await self.app(scope, receive, send)
        if self.authorized(scope.get("headers") or []):
            return await self.app(scope, receive, send)
        self._note_refusal(scope)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = json.dumps({"error": {"message": "unauthorized: this server answers only requests that carry the "
                                                "run's token (Authorization: Bearer ...; endpoint.json names its file)",
                                     "type": "Unauthorized", "code": 401}}).encode()
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer"),
                                (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    def _note_refusal(self, scope) -> None:
        """One line per refused request (peer, method, path; never a header), at most LOG_BURST per
        window so a scan cannot fill the log."""
        now = time.monotonic()
        if now - self._window_start > LOG_WINDOW_S:
            if self._suppressed:
                log.warning("refused %d more requests without the run's token in the last %.0f s",
                            self._suppressed, LOG_WINDOW_S)
            self._window_start, self._logged, self._suppressed = now, 0, 0
        if self._logged >= LOG_BURST:
            self._suppressed += 1
            return
        self._logged += 1
        host, port = (scope.get("client") or ("?", 0))[:2]
        log.warning("401 %s %r from %s:%s: no valid run token", scope.get("method", "WEBSOCKET"),
                    str(scope.get("path", "?"))[:200], host, port)      # %r: a path cannot forge log lines
