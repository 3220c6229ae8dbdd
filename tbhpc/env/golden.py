"""The golden state of a task on a built-in domain: replay its golden calls on a fresh copy.

Golden replay ignores business errors of individual calls (as the reference does); a backend
failure during replay is a system error. The golden state of a task is deterministic, so it is
cached per process by (domain, task id, patch+calls fingerprint): every attempt of a task grades
against one replay.

Why apart from `domain` and `grade`: a domain knows its tables and tools, grading compares
states; the replay needs the one and feeds the other, and the in-process session (`local`) and
the MCP tool server (`tbhpc.mcp.serve`) both call it.
"""
from __future__ import annotations

import hashlib
import json

from tbhpc.env.domain_view import DomainView
from tbhpc.env.state import State, canonical_state, state_hash
from tbhpc.tasks.schema import Task

_GOLDEN_CACHE: dict[tuple[str, str, str], tuple[State, str]] = {}


def task_fingerprint(task: Task) -> str:
    payload = json.dumps([task.data_patch, [c.to_dict() for c in task.golden_calls]], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def golden_state(domain: DomainView, task: Task) -> tuple[State, str]:
    key = (domain.name, task.id, task_fingerprint(task))
    hit = _GOLDEN_CACHE.get(key)
    if hit is not None:
        return hit
    backend = domain.backend(task)
    box = domain.toolbox(backend)
    for call in task.golden_calls:
        box.call(call.tool, dict(call.parameters))  # business errors ignored; infra errors raise
    state = canonical_state(backend)
    backend.conn.close()
    result = (state, state_hash(state))
    if len(_GOLDEN_CACHE) > 50_000:
        _GOLDEN_CACHE.clear()
    _GOLDEN_CACHE[key] = result
    return result


def initial_state(domain: DomainView, task: Task) -> State:
    backend = domain.backend(task)
    try:
        return canonical_state(backend)
    finally:
        backend.conn.close()
