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
    p.add_argument("--user-url"), p.add_argument("--user-model", default="default")
    p.add_argument("--judge", choices=("keyword", "openai"), default="keyword")
    p.add_argument("--judge-url"), p.add_argument("--judge-model", default="default")


def policy_options(pairs: list[str]) -> dict[str, Any]:
    """`--opt key=value` flags as a dict, values read as YAML (as config overrides are)."""
    return dict(key_value(p, "--opt") for p in pairs or [])
