"""A demo task as a *case*: one request, the reads that decide it, and the outcome of every branch.

Why every branch, not only the right one: the pack must not reward a constant behaviour (always
act, always refuse, always transfer, do nothing), and the only honest way to check that is to
play each behaviour on each instance and grade it with the real engine. A case therefore carries
all of its outcomes; the task written to the pack keeps the one the rules choose (its golden
calls and response) and names it in a `branch:` tag. `constant_tasks` turns the other outcomes
back into tasks whose golden trajectory is that behaviour, for the ceiling check
(tests/test_demo_pack.py, `tbhpc.demo.pack_checks.constant_ceilings`).

Branches are drawn first (evenly, from the template's own RNG) and the values are drawn to fit,
so each template's instances split about evenly between its outcomes.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable

from tbhpc.domains.gen import Gen
from tbhpc.tasks.schema import GoldenCall, Rubric, Task

USER_RULES = "Only these facts are yours; answer \"I don't know\" to anything else."


def call(tool: str, **params: Any) -> GoldenCall:
    return GoldenCall(tool, params)


@dataclass(frozen=True)
class Outcome:
    """What one behaviour does after the reads: its calls and its final message. A refusal
    changes nothing; its message must contain one of `keywords` (a keyword rubric)."""
    calls: tuple[GoldenCall, ...] = ()
    response: str = ""
    keywords: tuple[str, ...] = ()
    question: str = ""


def act(*calls: GoldenCall, response: str) -> Outcome:
    return Outcome(tuple(calls), response)


def refuse(question: str, keywords: tuple[str, ...], response: str) -> Outcome:
    return Outcome((), response, tuple(keywords), question)


@dataclass
class Case:
    query: str
    persona: str
    facts: dict[str, str]
    patch: dict[str, list[dict]]
    reads: tuple[GoldenCall, ...]
    ref: str                                  # the id the request is about (what a transfer names)
    branches: dict[str, Outcome]
    branch: str                               # the outcome the stated rules choose
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.branch not in self.branches:
            raise ValueError(f"branch {self.branch!r} not among {sorted(self.branches)}")
        self.branches.setdefault("transfer", act(call("transfer", ref=self.ref),
                                                 response="I have passed you to a colleague."))

    def user_context(self) -> str:
        facts = "\n".join(f"- {k}: {v}" for k, v in self.facts.items())
        return f"{self.persona}\nFacts you know:\n{facts}\n{USER_RULES}"

    def task(self, outcome: str, *, id: str, domain: str, template: str, instance: str, split: str) -> Task:
        o = self.branches[outcome]
        rubrics = (Rubric(o.question, o.keywords),) if o.keywords else ()
        tags = [f"branch:{self.branch}", *self.tags] + (["refusal", "read_only"] if o.keywords else [])
        return Task(id=id, domain=domain, query=self.query, user_context=self.user_context(), data_patch=self.patch,
                    golden_calls=self.reads + o.calls, split=split, rubrics_yesno=rubrics,
                    golden_response=o.response, tags=tuple(tags), template=template, instance=instance)


Template = Callable[[Gen], Case]


def constant_tasks(task: Task, case: Case) -> dict[str, Task]:
    """The task with its golden trajectory replaced by each behaviour's (for playing it with the
    oracle; grading stays against `task`): every branch; every action followed by every refusal's
    message (`act+refuse`: hedging, which passes both sides if a tool itself refuses the action or
    the action changes nothing); `noop`, the empty behaviour."""
    out = {}
    for name, o in case.branches.items():
        out[name] = dataclasses.replace(task, golden_calls=case.reads + o.calls, golden_response=o.response)
        for other, r in case.branches.items():
            if o.calls and r.keywords:
                out[f"{name}+{other}"] = dataclasses.replace(task, golden_calls=case.reads + o.calls,
                                                             golden_response=f"{o.response} {r.response}")
    out["noop"] = dataclasses.replace(task, golden_calls=(), golden_response="")
    return out
