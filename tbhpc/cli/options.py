"""Flags more than one command declares, and the argparse `type=` functions they use.

Why ranges as types: `type=int` takes `--bootstrap -5` and `type=float` takes `nan` or `inf`;
the command would then fail deep inside (a traceback) or wait forever. A range belongs where the
flag is declared, so a bad value is argparse's one-line error.
"""
from __future__ import annotations

import argparse
import math
from typing import Any

from tbhpc.config import key_value


def int_in(low: int, high: int | None = None):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low or (high is not None and value > high):
            raise argparse.ArgumentTypeError(f"expected an integer within [{low}, {high if high is not None else 'inf'}], got {value}")
        return value
    parse.__name__ = "integer"
    return parse


def float_in(low: float, high: float):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and low <= value <= high):
            raise argparse.ArgumentTypeError(f"expected a number within [{low:g}, {high:g}], got {text}")
        return value
    parse.__name__ = "number"
    return parse


def positive(high: float):
    """A finite number in (0, high]: seconds, rates (0 would mean "fail at once" or "never")."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (math.isfinite(value) and 0 < value <= high):
            raise argparse.ArgumentTypeError(f"expected a number > 0 and <= {high:g}, got {text}")
        return value
    parse.__name__ = "number"
    return parse


port = int_in(1, 65535)            # a TCP port to listen on (0 would bind one nobody is told)
port.__name__ = "port"


def host(text: str) -> str:
    """An interface to listen on: a name or an address, never empty (that binds every interface)."""
    if not text or any(c.isspace() for c in text) or not text.isprintable():
        raise argparse.ArgumentTypeError(f"expected a host name or address, got {text!r}")
    return text


def http_url(text: str) -> str:
    """An http(s) URL with a host: `localhost:8000/v1` (no scheme) would fail only at the first call."""
    from urllib.parse import urlsplit
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise argparse.ArgumentTypeError(f"expected an http(s)://host[:port]/... URL, got {text!r}")
    try:
        parts.port
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: {exc}") from None
    return text


def non_empty(what: str):
    """A name or path that must not be empty (an empty pack path would read the current directory)."""
    def parse(text: str) -> str:
        if not text.strip():
            raise argparse.ArgumentTypeError(f"expected {what}, got an empty string")
        return text
    parse.__name__ = what
    return parse


def check_listen(host_name: str, port_number: int, flag: str = "--host/--port") -> None:
    """Bind and release `host:port` before a server starts, so a port in use, one below 1024
    without the right, or a host that does not resolve is one line, not a server's late exit."""
    import socket
    try:
        infos = socket.getaddrinfo(host_name, port_number, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(address)
    except (OSError, OverflowError) as exc:
        from tbhpc.errors import UserError
        raise UserError(f"{flag}: cannot listen on {host_name}:{port_number}: {getattr(exc, 'strerror', None) or exc}") from None


def add_overrides(p: argparse.ArgumentParser, help: str | None = None) -> None:
    """`KEY=VALUE ...`: config fields over the config file (also after options: `main.parse`)."""
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help=help)


def add_agent_flags(p: argparse.ArgumentParser, policy: bool = True) -> None:
    """Who plays the agent (with `policy`), the simulated user and the judge of an episode."""
    if policy:
        p.add_argument("--policy", default="oracle", help="oracle | noop | openai | hf | tokens")
        p.add_argument("--opt", action="append", default=[], metavar="KEY=VALUE",
                       help="policy option, e.g. endpoint=RUN_DIR, base_url=http://127.0.0.1:8000/v1, model=NAME, "
                            "model_path=DIR")
    p.add_argument("--user", choices=("scripted", "openai"), default="scripted")
    p.add_argument("--user-url", type=http_url), p.add_argument("--user-model", default="default")
    p.add_argument("--judge", choices=("keyword", "openai"), default="keyword")
    p.add_argument("--judge-url", type=http_url), p.add_argument("--judge-model", default="default")


def policy_options(pairs: list[str]) -> dict[str, Any]:
    """`--opt key=value` flags as a dict, values read as YAML (as config overrides are)."""
    return dict(key_value(p, "--opt") for p in pairs or [])
