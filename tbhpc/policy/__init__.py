"""Policy package: things that produce model text for an episode. They never grade and never parse
tool calls themselves (the shared interpreter does).

`make_policy(name, **options)` builds one by name: oracle, noop, openai, hf, tokens.
"""
from __future__ import annotations

from typing import Any

from tbhpc.errors import UserError
from tbhpc.env.agent import Completion, Policy, PolicySession
from tbhpc.policy.sampling import option_fields

POLICY_NAMES = ("oracle", "noop", "openai", "hf", "tokens")


def policy_class(name: str) -> type:
    if name == "oracle":
        from tbhpc.policy.scripted import OraclePolicy
        return OraclePolicy
    if name == "noop":
        from tbhpc.policy.scripted import NoopPolicy
        return NoopPolicy
    if name == "openai":
        from tbhpc.policy.openai import OpenAIPolicy
        return OpenAIPolicy
    if name == "hf":
        from tbhpc.policy.hf import HFPolicy
        return HFPolicy
    if name == "tokens":
        from tbhpc.policy.tokens import TokenPolicy
        return TokenPolicy
    raise UserError(f"--policy: unknown policy {name!r} (choose from {', '.join(POLICY_NAMES)})")


def check_policy_options(name: str, options: dict[str, Any], where: str = "policy_opts") -> dict[str, Any]:
    """The options' names and types against the policy's fields, without building it (a campaign
    checks them before its run directory exists): one line naming `where` and the field."""
    from tbhpc.config import checked_values
    if not isinstance(options, dict):
        raise UserError(f"{where}: expected a mapping of {name} policy options, got {type(options).__name__}")
    cls = policy_class(name)
    values = checked_values(option_fields(cls), options, {k: f"{where} ({name} policy)" for k in options},
                            kind=f"policy:{name}")
    if hasattr(cls, "check_ranges"):       # policies whose values have ranges say so without being built
        cls.check_ranges(values)
    return values


def check_policy_ready(name: str, options: dict[str, Any]) -> None:
    """What the policy needs on disk to run (its model), said before anything is written."""
    cls = policy_class(name)
    if hasattr(cls, "check_ready"):
        cls.check_ready(options)


def make_policy(name: str, **options: Any) -> Policy:
    cls = policy_class(name)
    return cls(**check_policy_options(name, options))


__all__ = ["Completion", "Policy", "PolicySession", "check_policy_options", "check_policy_ready", "make_policy", "policy_class", "POLICY_NAMES"]
