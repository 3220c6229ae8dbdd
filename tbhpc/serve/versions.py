"""The names of weight versions, as servers announce them and rollout rows record them: the base
model, a verified step, or a step still being checked (`unverified:`) or refused (`rejected:`).

Why a module of its own: the generator that reads versions off each generated token (policy) and
the checkpoints that name them (serve) both need these names, and neither should import the other.
"""
from __future__ import annotations

BASE_VERSION = "base"
UNVERIFIED = "unverified:"      # loaded, not yet checked against its fingerprint
REJECTED = "rejected:"          # loaded, and its fingerprint did not match: never announced


def version_name(step: int) -> str:
    return f"step-{step:06d}"


def trusted_version(version: str) -> bool:
    """True for versions a trainer may learn from: the base weights or a verified step."""
    return version == BASE_VERSION or (version.startswith("step-") and version[5:].isdigit())


def version_step(version: str) -> int:
    """'step-000012' -> 12; the base model -> 0 (the integer rollout buffers store). Anything
    else (unverified, rejected, unknown) is not a step and raises ValueError."""
    if not trusted_version(version):
        raise ValueError(f"weight version {version!r} is not a verified step")
    return 0 if version == BASE_VERSION else int(version[5:])
