"""Checks JSON values against the small JSON-schema subset that tool parameters use.

Why its own module: tool calls from a model (env), golden calls in a task pack (tasks) and the
interpreter's type coercion all need the same notion of "this argument fits this schema", and
those packages must not import each other. The subset: type (string, integer, number, boolean,
array, object, null), enum, anyOf, items, properties/required/additionalProperties, minimum,
maximum, maxLength, maxItems. Errors are short and name the argument path.
"""
from __future__ import annotations

from typing import Any

_PY_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
    "object": (dict,),
    "null": (type(None),),
}


def type_ok(value: Any, type_name: str) -> bool:
    """True when `value` is of JSON type `type_name` (bool is not an integer)."""
    if type_name in ("integer", "number") and isinstance(value, bool):
        return False
    if type_name == "integer" and isinstance(value, float):
        return value.is_integer()
    return isinstance(value, _PY_TYPES.get(type_name, ()))


def check_value(value: Any, schema: dict, path: str) -> str | None:
    """Return an error message for the first mismatch, or None when `value` fits."""
    if "anyOf" in schema:
        errors = [check_value(value, member, path) for member in schema["anyOf"]]
        if all(errors):
            return next(e for e in errors if e)
        return None
    expected = schema.get("type")
    if expected is not None:
        names = expected if isinstance(expected, list) else [expected]
        if not any(type_ok(value, n) for n in names):
            return f"{path}: expected {'|'.join(names)}, got {_json_type(value)}"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(repr(v) for v in schema["enum"])
        return f"{path}: {_short(value)} is not one of {allowed}"
    if isinstance(value, str) and len(value) > schema.get("maxLength", 10_000):
        return f"{path}: string longer than {schema.get('maxLength', 10_000)} characters"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            return f"{path}: {value} is below the minimum {schema['minimum']}"
        if "maximum" in schema and value > schema["maximum"]:
            return f"{path}: {value} is above the maximum {schema['maximum']}"
    if isinstance(value, list):
        if len(value) > schema.get("maxItems", 1000):
            return f"{path}: more than {schema.get('maxItems', 1000)} items"
        for i, item in enumerate(value):
            err = check_value(item, schema.get("items", {}), f"{path}[{i}]")
            if err:
                return err
    if isinstance(value, dict) and (schema.get("type") == "object" or "properties" in schema):
        return check_object(value, schema, path)
    return None


def check_object(args: Any, schema: dict, path: str = "arguments") -> str | None:
    """Check an object: required keys present, no unknown keys, each value fits."""
    if not isinstance(args, dict):
        return f"{path}: expected object, got {_json_type(args)}"
    props = schema.get("properties", {})
    if schema.get("additionalProperties", False) is False:
        unknown = sorted(k for k in args if k not in props)
        if unknown:
            return f"{path}: unknown argument(s) {', '.join(map(repr, unknown))}"
    for key in schema.get("required", []):
        if key not in args:
            return f"{path}: missing required argument {key!r}"
    for key, value in args.items():
        if key in props:
            err = check_value(value, props[key], f"{path}.{key}" if path != "arguments" else key)
            if err:
                return err
    return None


def _json_type(value: Any) -> str:
    for name in ("null", "boolean", "integer", "number", "string", "array", "object"):
        if type_ok(value, name):
            return name
    return type(value).__name__


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
