"""Reading one attempt: its transcript and grade as terminal text (pure functions of the data).

Why pure: `tbhpc episode` (a fresh attempt) and `tbhpc show` (a stored one) print the same
layout, and a golden test pins it.
"""
from __future__ import annotations

import json
from typing import Any

_WIDTH = 4000     # characters of one message shown (the JSON form has everything)


def render_messages(messages: list[dict], show_system: bool = False) -> list[str]:
    lines = []
    for m in messages:
        role = m.get("role", "?").upper()
        if role == "SYSTEM" and not show_system:
            lines.append(f"[SYSTEM] ({len(m.get('content') or '')} characters; --system to show)")
            continue
        if m.get("reasoning"):
            lines.append(f"[{role} reasoning] {_cut(m['reasoning'])}")
        if role == "TOOL":
            lines.append(f"[TOOL {m.get('name', '?')}] {_cut(m.get('content') or '')}")
        elif m.get("content"):
            lines.append(f"[{role}] {_cut(m['content'])}")
        for c in m.get("tool_calls") or []:
            fn = c.get("function", {})
            error = f"  (not run: {c['error']})" if c.get("error") else ""
            lines.append(f"[{role} -> {fn.get('name', '?')}] {_cut(fn.get('arguments', ''))}{error}")
    return lines


def render_attempt(run_label: str, row: dict[str, Any], show_system: bool = False) -> str:
    """`tbhpc show`'s text for one attempt row (as `read_attempt` returns it)."""
    tr = row["transcript"]
    head = [f"{run_label} · {row['campaign']} · policy {row['policy_id']}"
            + (f" (+{row['other_policies']} other policies: --policy)" if row["other_policies"] else "")]
    body = render_messages(tr["messages"], show_system) if tr else ["(no transcript stored for this attempt: "
                                                                    "a run made before transcripts, or an import)"]
    return "\n".join(head + [""] + body + [""] + render_outcome(row, tr["judge"] if tr else None))


def render_outcome(row: dict[str, Any], judge: list[dict] | None = None) -> list[str]:
    """The grade of an attempt row (reward, finish, error, state diff, output checks, rubrics)."""
    lines = [f"task {row['task_id']} attempt {row.get('attempt_index', 0)}: status={row['status']} "
             f"finish={row['finish_reason']} reward={row['reward']}"]
    if row.get("error"):
        lines.append(f"error ({row.get('error_kind') or 'infra'}): {row['error']}")
    if row.get("env_degraded"):
        lines.append(f"environment: {row['env_degraded']}")
    diff = row.get("diff")
    diff = json.loads(diff) if isinstance(diff, str) else (diff or [])
    if row.get("final_hash") and row.get("golden_hash"):
        same = row["final_hash"] == row["golden_hash"]
        lines.append(f"state: {'matches the golden state' if same else 'differs from the golden state'}")
    lines += [f"  diff: {d}" for d in diff]
    for miss in row.get("output_missing") or []:
        lines.append(f"  missing in final message: {miss!r}")
    for r in judge or []:
        lines.append(f"  rubric {'YES' if r.get('yes') else 'NO '}: {r.get('question')}")
    return lines


def _cut(text: str) -> str:
    text = str(text)
    return text if len(text) <= _WIDTH else text[:_WIDTH] + f" ... ({len(text) - _WIDTH} more characters)"
