"""Dataclass configs loaded from YAML files in `jobs/`, overridable with `key=value`.

Why dataclasses: a misspelt key must fail at load time with one line naming the file and the
field, and every run can write back exactly what it resolved (`resolved()` + `config_hash()`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from tbhpc.errors import UserError
from tbhpc.fielddoc import closest, kind_of

T = TypeVar("T")


def load_config(cls: type[T], path: Path | str | None = None, overrides: list[str] | None = None,
                base: dict[str, Any] | None = None, updates: dict[str, Any] | None = None) -> T:
    """`base` values (e.g. a command's defaults) < the YAML file < `updates` (Python keyword
    arguments, from the API) < `key=value` overrides."""
    values: dict[str, Any] = dict(base or {})
    origin = {k: "defaults" for k in values}
    source = str(path) if path else "<defaults>"
    if path is not None:
        try:
            doc = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
        except OSError as exc:
            raise UserError(f"{path}: cannot read: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise UserError(f"{path}: malformed YAML: {str(exc).splitlines()[0]}") from None
        if not isinstance(doc, dict):
            raise UserError(f"{path}: expected a mapping of config fields")
        values.update(doc)
        origin.update({k: source for k in doc})
    values = merge_sections(cls, values, updates or {})
    origin.update({key: f"argument {key}={value!r}" for key, value in (updates or {}).items()})
    for item in overrides or []:
        key, value = key_value(item)
        if "." in key:       # section.field=value: one field of a nested section (slurm.container.image=...)
            set_path(values, key.split("."), value)
            key = key.split(".", 1)[0]
        else:
            values[key] = value
        origin[key] = f"override {item!r}"
    return from_dict(cls, values, origin)


def set_path(values: dict[str, Any], parts: list[str], value: Any) -> None:
    """values[a][b][c] = value for parts [a, b, c], keeping the other fields of each section."""
    head, rest = parts[0], parts[1:]
    if not rest:
        values[head] = value
        return
    nested = values.get(head)
    values[head] = dict(nested) if isinstance(nested, dict) else {}
    set_path(values[head], rest, value)


def merge_sections(cls: type, values: dict[str, Any], updates: dict[str, Any]) -> dict[str, Any]:
    """`values` with `updates` over them; a config section (a dataclass-typed field, e.g. `slurm`)
    given as a mapping on both sides is merged field by field, so an update that names one field
    of a section keeps the others. Any other value (a policy's options included) is replaced."""
    hints = typing.get_type_hints(cls)
    merged = dict(values)
    for key, value in updates.items():
        old = merged.get(key)
        section = dataclasses.is_dataclass(hints.get(key)) and isinstance(value, dict) and isinstance(old, dict)
        merged[key] = {**old, **value} if section else value
    return merged


def key_value(item: str, flag: str = "override") -> tuple[str, Any]:
    """One `key=value` of the command line: the key, and the value as YAML reads it. Every
    override and `--opt` goes through here, so each mistake reads the same one line."""
    if "=" not in item:
        raise UserError(f"{flag} {item!r}: expected key=value")
    key, raw = item.split("=", 1)
    return key.strip(), yaml_value(raw, f"{flag} {item!r}")


def yaml_value(raw: str, where: str) -> Any:
    """A `key=value` override's value as YAML reads it; malformed YAML is one line naming `where`."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise UserError(f"{where}: malformed YAML value: {' '.join(str(exc).split())[:160]}") from None


def from_dict(cls: type[T], values: dict[str, Any], origin: dict[str, str] | None = None) -> T:
    """Build a config dataclass from plain values; unknown keys and wrong types fail in one line
    naming where the value came from (`origin`: key -> file or override)."""
    return cls(**checked_values(cls, values, origin))


def checked_values(cls: type, values: dict[str, Any], origin: dict[str, str] | None = None,
                   kind: str | None = None) -> dict[str, Any]:
    """`values` checked against `cls`'s fields (names and types; nested sections built), without
    building `cls` itself: for options checked long before the object they configure exists.
    `kind`: what `tbhpc fields` calls the field list (default: the class's config kind)."""
    origin = origin or {}
    fields = {f.name for f in dataclasses.fields(cls) if not f.name.startswith("_")}
    unknown = sorted(set(values) - fields)
    if unknown:
        raise UserError(unknown_field(origin.get(unknown[0], cls.__name__), unknown[0], fields, kind or kind_of(cls)))
    hints = typing.get_type_hints(cls)
    defaults = {f.name: f.default_factory for f in dataclasses.fields(cls) if f.default_factory is not dataclasses.MISSING}
    values = dict(values)
    for key, value in values.items():
        want = hints.get(key)
        if dataclasses.is_dataclass(want) and isinstance(value, dict):   # a nested config section
            sub = {k: f"{origin.get(key, cls.__name__)} ({key}.{k})" for k in value}
            # the fields it names replace those of the section's default, not of the section's class:
            # `slurm: {cpus_per_task: 3}` keeps a training job's 24 hours, not a campaign's 2
            section = defaults[key]() if key in defaults else None
            values[key] = (dataclasses.replace(section, **checked_values(want, value, sub)) if isinstance(section, want)
                           else from_dict(want, value, sub))
            continue
        if isinstance(value, str) and want is not None and _fits(1.0, want) and not _fits(value, want):
            try:    # YAML 1.1 reads 1e-6 (no dot) as a string; a float field takes it as the number it is
                values[key] = value = float(value)
            except ValueError:
                pass
        if want is not None and not _fits(value, want):
            where = origin.get(key, cls.__name__)
            raise UserError(f"{where}: field {key!r}: expected {_name(want)}, got {type(value).__name__}")
    return values


def unknown_field(where: str, key: str, known: set[str], kind: str | None, limit: int = 300) -> str:
    """One line for a misspelt field: where, the closest known names, and where every field is
    listed (`tbhpc fields KIND`), never the whole list; at most `limit` characters."""
    near = closest(str(key), known)
    hint = f"; did you mean {' or '.join(map(repr, near))}?" if near else f", not close to any of the {len(known)} fields"
    look = f"tbhpc fields {kind}" if kind else "the Configuration reference"
    tail = f": unknown field {str(key)[:60]!r}{hint} (every field: {look})"
    room = limit - len(tail)
    return (where if len(where) <= room else "..." + where[len(where) - room + 3:]) + tail


def _fits(value: Any, want: Any) -> bool:
    origin, args = typing.get_origin(want), typing.get_args(want)
    if origin in (typing.Union, types.UnionType):
        return any(_fits(value, a) for a in args)
    if origin is list:
        return isinstance(value, list) and all(_fits(v, args[0]) for v in value) if args else isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict)
    if want is type(None):
        return value is None
    if want is Any or not isinstance(want, type):
        return True
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def _name(want: Any) -> str:
    return getattr(want, "__name__", None) or str(want).replace("typing.", "")


def resolved(cfg: Any) -> dict:
    return dataclasses.asdict(cfg)


def config_hash(cfg: Any) -> str:
    text = json.dumps(resolved(cfg), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]
