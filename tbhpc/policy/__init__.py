"""Policy room: things that produce model text for an episode. They never grade and never parse
tool calls themselves (the shared interpreter does).

`make_policy(name, **options)` builds one by name: oracle, noop, openai, hf, tokens.
"""
from __future__ import annotations

from typing import Any

from tbhpc.errors import UserError
from tbhpc.policy.base import Completion, Policy, PolicySession

POLICY_NAMES = ("oracle", "noop", "openai", "hf", "tokens")


def make_policy(name: str, **options: Any) -> Policy:
    if name == "oracle":
        from tbhpc.policy.scripted import OraclePolicy
        return OraclePolicy(**options)
    if name == "noop":
        from tbhpc.policy.scripted import NoopPolicy
        return NoopPolicy()
    if name == "openai":
        from tbhpc.policy.openai import OpenAIPolicy
        return OpenAIPolicy(**options)
    if name == "hf":
        from tbhpc.policy.hf import HFPolicy
        return HFPolicy(**options)
    if name == "tokens":
        from tbhpc.policy.tokens import TokenPolicy
        return TokenPolicy(**options)
    raise UserError(f"--policy: unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")


__all__ = ["Completion", "Policy", "PolicySession", "make_policy", "POLICY_NAMES"]
