"""Baselines that need no model: `oracle` replays the task's golden calls, then answers with the
golden response and `<DONE>`; `noop` answers `<DONE>` at once.

A noisy oracle (`skill` < 1) gives every task a success rate of about skill^(writes + 1), so the
probe -> select -> evaluate pipeline has a realistic spread of difficulty without any model.

Why they speak text through the interpreter (not direct tool calls): the oracle then exercises
the same path a model does (tool-call text -> interpreter -> tools), so "oracle passes 100%"
proves the whole pipeline, not only the backend.
"""
from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Callable

from tbhpc.errors import UserError
from tbhpc.interpret import render_tool_call
from tbhpc.env.agent import Completion
from tbhpc.tasks.schema import GoldenCall, Task


@dataclass
class OraclePolicy:
    """`calls` may replace the golden trajectory (tests drop a call to prove grading bites)."""

    fmt: str = "hermes"       # how it writes tool calls: hermes | qwen3_xml (both go through the one interpreter)
    calls: Callable[[Task], list[GoldenCall]] | None = None
    delay_s: float = 0.0      # emulated model latency per completion (executor tests, benchmarks)
    skill: float = 1.0        # < 1: a noisy oracle that skips each golden call (and the answer) with 1 - skill
    ask: bool = False         # first ask the user for the private facts its calls use (what a model must do)
    name: str = "oracle"

    def __post_init__(self) -> None:
        self.check_ranges(vars(self))

    @staticmethod
    def check_ranges(options: dict) -> None:
        """Called on the options alone too (tbhpc.policy.check_policy_options), before any run exists."""
        skill, delay = options.get("skill", 1.0), options.get("delay_s", 0.0)
        if not 0.0 <= skill <= 1.0:      # NaN fails both
            raise UserError(f"oracle policy: field 'skill' must be within [0, 1], got {skill!r}")
        if not 0.0 <= delay < float("inf"):
            raise UserError(f"oracle policy: field 'delay_s' must be a finite number >= 0, got {delay!r}")

    def session(self, task: Task, seed: int = 0) -> "_OracleSession":
        calls = list(self.calls(task) if self.calls else task.golden_calls)
        response = task.golden_response
        if self.skill < 1.0:
            rng = random.Random(seed)
            calls = [c for c in calls if rng.random() < self.skill]
            response = response if rng.random() < self.skill else "I could not finish this."
        question = facts_question(task, calls) if self.ask else ""
        return _OracleSession(calls, response, self.fmt, self.delay_s, question)


def facts_question(task: Task, calls: list[GoldenCall]) -> str:
    """A question for the user's private facts that the calls need and the query does not give
    ("" when none): the golden calls know them, a model has to ask."""
    from tbhpc.env.users import parse_facts
    used = " ".join(str(v) for c in calls for v in c.parameters.values())
    keys = [k for k, v in parse_facts(task.user_context) if v and v in used and v not in task.query]
    if not keys:
        return ""
    return "To help you, could you tell me your " + ", ".join(keys[:-1]) + (" and " if len(keys) > 1 else "") + keys[-1] + "?"


class _OracleSession:
    def __init__(self, calls: list[GoldenCall], response: str, fmt: str, delay_s: float = 0.0, question: str = ""):
        self.calls, self.response, self.fmt, self.delay_s, self.i = calls, response, fmt, delay_s, 0
        self.question = question

    def complete(self, messages: list[dict], tools: list[dict]) -> Completion:
        if self.delay_s:
            time.sleep(self.delay_s)
        if self.question:
            question, self.question = self.question, ""
            return Completion(question)
        if self.i < len(self.calls):
            call = self.calls[self.i]
            self.i += 1
            return Completion(render_tool_call(call.tool, call.parameters, self.fmt))
        return Completion(f"{self.response or 'All done.'} <DONE>".strip())


@dataclass
class NoopPolicy:
    name: str = "noop"

    def session(self, task: Task, seed: int = 0) -> "NoopPolicy":
        return self

    def complete(self, messages: list[dict], tools: list[dict]) -> Completion:
        return Completion("<DONE>")
