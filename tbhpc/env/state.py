"""Canonical backend state, its hash, and a readable diff between two states.

Why this exact canonical form: the reward is "final state == golden state", so the form must
ignore what is legitimately free (volatile free-text columns, row insertion order, the order of
primitive lists) and keep everything structured (status, amounts, enums, ids, who/what). Rows
are sorted by id, keys sorted, JSON compact; the hash is SHA-256 of that text.
"""
from __future__ import annotations

import hashlib
import json
from typing import Any

from tbhpc.env.db import Backend, _id_key

State = dict[str, list[dict[str, Any]]]


def canonical_state(backend: Backend) -> State:
    state: State = {}
    for name, table in sorted(backend.tables.items()):
        # all_rows() returns rows sorted by id (naturally: T2 before T10)
        state[name] = [{k: _canon(v) for k, v in row.items() if k not in table.volatile} for row in backend.all_rows(name)]
    return state


def state_hash(state: State) -> str:
    text = json.dumps(state, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def diff_states(actual: State, golden: State, limit: int = 20) -> list[str]:
    """Human-readable differences, golden as reference: missing, unexpected and changed rows."""
    lines: list[str] = []
    for table in sorted(set(actual) | set(golden)):
        a = {r["id"]: r for r in actual.get(table, [])}
        g = {r["id"]: r for r in golden.get(table, [])}
        for rid in sorted(set(a) | set(g), key=_id_key):
            if rid not in a:
                lines.append(f"{table}[{rid}]: missing (golden has {_brief(g[rid])})")
            elif rid not in g:
                lines.append(f"{table}[{rid}]: unexpected row {_brief(a[rid])}")
            elif a[rid] != g[rid]:
                fields = sorted(k for k in set(a[rid]) | set(g[rid]) if a[rid].get(k) != g[rid].get(k))
                changes = ", ".join(f"{k}: {a[rid].get(k)!r} != golden {g[rid].get(k)!r}" for k in fields)
                lines.append(f"{table}[{rid}]: {changes}")
            if len(lines) >= limit:
                lines.append("... (more differences omitted)")
                return lines
    return lines


def _canon(value: Any) -> Any:
    if isinstance(value, list):
        items = [_canon(v) for v in value]
        if all(not isinstance(v, (dict, list)) for v in items):
            return sorted(items, key=lambda v: (str(type(v)), v))
        return items
    if isinstance(value, dict):
        return {k: _canon(v) for k, v in sorted(value.items())}
    if isinstance(value, float):
        return round(value, 6)  # float noise must not flip a reward
    return value


def _brief(row: dict, limit: int = 160) -> str:
    text = json.dumps(row, sort_keys=True, ensure_ascii=False)
    return text if len(text) <= limit else text[: limit - 3] + "..."
