"""Grading: binary reward from the final database state (+ output checks and yes/no rubrics).

Reward 1 iff
  1. the canonical hash of the final state equals the hash after replaying the task's golden
     calls on a fresh copy of the same initial state (seed + data patch), and
  2. every `output_contains` string appears in the final message, and
  3. the judge answers yes to every `rubrics_yesno` item about the final message.
Golden replay ignores business errors of individual calls (as the reference does); a backend
failure during replay is a system error. The golden state of a task is deterministic, so it is
cached per process by (domain, task id, patch+calls fingerprint).
"""
from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field

from tbhpc.env.domain import Domain
from tbhpc.env.judge import Judge, KeywordJudge
from tbhpc.env.session import StateCheck
from tbhpc.env.state import State, canonical_state, state_hash
from tbhpc.llm_client import Usage
from tbhpc.tasks.schema import Task

_GOLDEN_CACHE: dict[tuple[str, str, str], tuple[State, str]] = {}


@dataclass
class Grade:
    reward: float
    passed: bool
    state_match: bool
    final_hash: str
    golden_hash: str
    diff: list[str] = field(default_factory=list)
    output_missing: list[str] = field(default_factory=list)
    rubrics: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def contains_phrase(text: str, phrase: str) -> bool:
    """Case- and whitespace-insensitive containment on word boundaries: "3" is not in "13"."""
    words = [re.escape(w) for w in phrase.lower().split()]
    if not words:
        return True
    pattern = r"(?<![\w.])" + r"\s+".join(words) + r"(?![\w]|\.\d)"
    return re.search(pattern, text.lower()) is not None


def task_fingerprint(task: Task) -> str:
    payload = json.dumps([task.data_patch, [c.to_dict() for c in task.golden_calls]], sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:16]


def golden_state(domain: Domain, task: Task) -> tuple[State, str]:
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


def initial_state(domain: Domain, task: Task) -> State:
    backend = domain.backend(task)
    try:
        return canonical_state(backend)
    finally:
        backend.conn.close()


def grade(task: Task, check: StateCheck, final_message: str, judge: Judge | None,
          judge_usage: Usage | None = None) -> Grade:
    """The reward from the state check (in process or a tool server's effects) and the message checks."""
    match = check.match
    missing = [s for s in task.output_contains if not contains_phrase(final_message, s)]
    rubrics = []
    judge = judge or KeywordJudge()
    for rubric in task.rubrics_yesno:
        yes, usage = judge.answer(rubric, final_message)
        if judge_usage is not None:
            judge_usage.add(usage)
        rubrics.append({"question": rubric.question, "yes": yes})
    passed = match and not missing and all(r["yes"] for r in rubrics)
    return Grade(1.0 if passed else 0.0, passed, match, check.final_hash, check.golden_hash,
                 list(check.diff), missing, rubrics)
