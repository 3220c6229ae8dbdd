"""Grading: binary reward from the final database state (+ output checks and yes/no rubrics).

Reward 1 iff
  1. the canonical hash of the final state equals the hash after replaying the task's golden
     calls on a fresh copy of the same initial state (seed + data patch), and
  2. every `output_contains` string appears in the final message, and
  3. the judge answers yes to every `rubrics_yesno` item about the final message.
The golden state (1.) comes from `tbhpc.env.golden` for built-in domains, from the tool server
for MCP ones; this module only compares.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from tbhpc.env.judge import Judge, KeywordJudge
from tbhpc.env.session import StateCheck
from tbhpc.llm_client import Usage
from tbhpc.tasks.schema import Task

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
