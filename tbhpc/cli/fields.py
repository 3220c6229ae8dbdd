"""`tbhpc fields [KIND]`: every field of a config kind (or every option of a policy), with its
type, default and meaning, read from the code (tbhpc/fielddoc.py). Where a misspelt field's
one-line error sends a reader: the same list the site's Configuration reference shows.
"""
from __future__ import annotations

import dataclasses
import typing

from tbhpc.errors import UserError
from tbhpc.fielddoc import KINDS, closest, config_class, config_rows, field_comments, field_default, type_name


def add_parser(sub) -> None:
    p = sub.add_parser("fields", help="every field of a config kind (train, campaign, serve, ...) or a policy's options")
    p.set_defaults(func=run)
    p.add_argument("kind", nargs="?", help=f"one of {', '.join(KINDS)}, or policy:NAME (none: list the kinds)")


def run(args) -> int:
    if not args.kind:
        print("config kinds: " + ", ".join(KINDS) + "; a policy's options: policy:NAME (tbhpc fields policy:openai)")
        return 0
    print(render(args.kind, rows_for(args.kind)), end="")
    return 0


def rows_for(kind: str) -> list[tuple[str, str, str, str]]:
    if kind.startswith("policy:"):
        return policy_rows(kind.split(":", 1)[1])
    if kind not in KINDS:
        near = closest(kind, [*KINDS, "policy:"])
        raise UserError(f"fields: unknown kind {kind!r}" + (f" (did you mean {' or '.join(map(repr, near))}?)" if near
                                                            else f" (one of {', '.join(KINDS)}, policy:NAME)"))
    return config_rows(config_class(kind))


def render(kind: str, rows: list[tuple[str, str, str, str]]) -> str:
    """Aligned plain text, one field a line (pure: tested)."""
    if not rows:
        return f"{kind}: no fields\n"
    width, type_width = max(len(r[0]) for r in rows), max(len(r[1]) for r in rows)
    return "".join(f"{name:<{width}}  {kind_:<{type_width}}  default {default.strip('`')}" + (f"  # {what}" if what else "")
                   + "\n" for name, kind_, default, what in rows)


def policy_rows(name: str) -> list[tuple[str, str, str, str]]:
    """(option, type, default, help) for each option of a policy, as `policy_opts` spells them:
    a policy's own fields and, for one that takes sampling settings flat, Sampling's (with that
    policy's defaults). Fields a user cannot give (internal state, callables) are left out."""
    from tbhpc.policy import policy_class
    from tbhpc.policy.sampling import Sampling
    cls = policy_class(name)
    hints, helps = typing.get_type_hints(cls), field_comments(cls)
    flat = getattr(cls, "sampling_options", None) or {}
    rows = []
    for f in dataclasses.fields(cls):
        kind = type_name(hints.get(f.name))
        if f.name == "name" or f.name.startswith("_") or not f.repr or "Callable" in kind or (flat and f.name == "sampling"):
            continue
        rows.append((f.name, kind, field_default(f), helps.get(f.name, "")))
    if flat:
        sampling = next(f for f in dataclasses.fields(cls) if f.name == "sampling").default_factory()
        kinds, sampling_helps = typing.get_type_hints(Sampling), field_comments(Sampling)
        for option, field_name in flat.items():
            rows.append((option, type_name(kinds[field_name]), f"`{getattr(sampling, field_name)!r}`",
                         sampling_helps.get(field_name, "")))
    return rows
