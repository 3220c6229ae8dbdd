"""Coerce string tool arguments to the types their JSON schema declares.

Why: Qwen3 XML tool calls carry every parameter as text, and Hermes JSON calls from small models
often quote numbers. Without coercion a boolean or integer arrives as a string and the typed tool
rejects it. Rules (as the reference interpreter): boolean from true/false, integer via int,
number via float, array/object via JSON, null from null/none/empty; `anyOf` members are tried in
order; string-typed parameters are left untouched; a failed cast keeps the raw string (the tool's
own validation then reports the mismatch to the model).
"""
from __future__ import annotations

import json
from typing import Any

_FAIL = object()


def coerce_arguments(arguments: dict[str, Any], schema: dict | None) -> dict[str, Any]:
    """Return a copy with string values cast to their property's schema type."""
    if not schema:
        return dict(arguments)
    props = schema.get("properties", {})
    return {k: coerce_value(v, props[k]) if k in props else v for k, v in arguments.items()}


def coerce_value(value: Any, schema: dict) -> Any:
    if not isinstance(value, str):
        return value
    types = _types(schema)
    if not types or "string" in types:
        return value
    for t in types:
        cast = _cast(value, t)
        if cast is not _FAIL:
            return cast
    return value


def _types(schema: dict) -> list[str]:
    if "anyOf" in schema:
        out: list[str] = []
        for member in schema["anyOf"]:
            out.extend(t for t in _types(member) if t not in out)
        # prefer non-null members: "None" for an optional integer should stay a failed cast
        # only when no other member matches
        return [t for t in out if t != "null"] + (["null"] if "null" in out else [])
    t = schema.get("type")
    if t is None:
        return []
    return list(t) if isinstance(t, list) else [t]


def _cast(text: str, type_name: str) -> Any:
    s = text.strip()
    try:
        if type_name == "boolean":
            low = s.lower()
            return True if low == "true" else False if low == "false" else _FAIL
        if type_name == "integer":
            if s.lstrip("+-").isdigit():
                return int(s)
            f = float(s)
            return int(f) if f.is_integer() else _FAIL
        if type_name == "number":
            f = float(s)
            return int(f) if s.lstrip("+-").isdigit() else f
        if type_name in ("array", "object"):
            v = json.loads(s)
            want = list if type_name == "array" else dict
            return v if isinstance(v, want) else _FAIL
        if type_name == "null":
            return None if s.lower() in ("null", "none", "") else _FAIL
    except (ValueError, json.JSONDecodeError):
        return _FAIL
    return _FAIL
