"""One OpenEnv session over its WebSocket (`/ws`): reset, step, state, close, as JSON messages.

Why tbhpc's own few lines instead of OpenEnv's client classes: campaign workers and trainers
run in tbhpc's environment, where the openenv package cannot be installed beside the MCP SDK
tbhpc uses; the wire format is small and pinned (openenv 0.10), and the tests hold this client
to OpenEnv's own server (and OpenEnv's own client to tbhpc's server). Every transport failure
(refused, timed out, closed, not JSON, an error reply) is an InfraError naming its cause: an
attempt that hits one is a system error, re-run, never a 0.
"""
from __future__ import annotations

import json
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from tbhpc.errors import InfraError


class OpenEnvError(InfraError):
    kind = "openenv"


def ws_url(url: str) -> str:
    """http(s)://host:port[/prefix] or ws(s)://... -> the session endpoint ws(s)://host:port[/prefix]/ws."""
    parts = urlsplit(url)
    scheme = {"http": "ws", "https": "wss", "ws": "ws", "wss": "wss"}.get(parts.scheme)
    if scheme is None or not parts.netloc:
        raise ValueError(f"not an http(s):// or ws(s):// URL: {url!r}")
    path = parts.path.rstrip("/")
    return urlunsplit((scheme, parts.netloc, path if path.endswith("/ws") else path + "/ws", "", ""))


class Connection:
    """A synchronous session: each request waits for its one reply (the server answers in order)."""

    def __init__(self, url: str, timeout_s: float = 60.0, connect_timeout_s: float = 10.0):
        try:
            from websockets.sync.client import connect
        except ImportError:
            from tbhpc.errors import UserError
            raise UserError("an OpenEnv environment needs the websockets package: pip install -e '.[openenv]' "
                            "(make env installs it)") from None
        self.url, self.timeout = ws_url(url), timeout_s
        try:
            self.ws = connect(self.url, open_timeout=connect_timeout_s, max_size=100 * 2**20, legacy=True)  # held across calls
        except (OSError, TimeoutError) as exc:
            raise OpenEnvError(f"OpenEnv environment {self.url}: cannot connect", exc) from None
        except Exception as exc:           # a handshake refused by the server (HTTP status, bad upgrade)
            raise OpenEnvError(f"OpenEnv environment {self.url}: handshake failed", exc) from None

    def request(self, kind: str, data: dict | None = None) -> dict:
        """Send one message; its reply's `data` (an error reply raises OpenEnvError with its message)."""
        msg: dict[str, Any] = {"type": kind}
        if data is not None:
            msg["data"] = data
        try:
            self.ws.send(json.dumps(msg))
            raw = self.ws.recv(timeout=self.timeout)
        except TimeoutError as exc:
            raise OpenEnvError(f"OpenEnv environment {self.url}: no reply to {kind} within {self.timeout:g} s", exc) from None
        except Exception as exc:           # the connection closed or broke
            raise OpenEnvError(f"OpenEnv environment {self.url}: {kind} failed", exc) from None
        try:
            reply = json.loads(raw)
        except ValueError:
            raise OpenEnvError(f"OpenEnv environment {self.url}: {kind} reply is not JSON: {str(raw)[:200]!r}") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("data"), dict):
            raise OpenEnvError(f"OpenEnv environment {self.url}: malformed {kind} reply: {str(raw)[:200]!r}")
        if reply.get("type") == "error":
            d = reply["data"]
            raise OpenEnvError(f"OpenEnv environment {self.url}: {kind}: {d.get('message', '?')} ({d.get('code', '?')})")
        return reply["data"]

    def close(self) -> None:
        try:
            self.ws.send(json.dumps({"type": "close"}))
        except Exception:
            pass
        try:
            self.ws.close()
        except Exception:
            pass
