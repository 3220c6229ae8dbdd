"""Task generation from templates with a fixed seed.

Why templates: the reference task set is private for training use, so tbhpc ships its own pack,
generated from code that a reader can audit. Each template instance draws its entities from a
seeded RNG, patches them into the domain (so tasks are independent of each other), and writes
the golden tool calls that solve it. Every generated task is checked by replaying its golden
calls: no call may fail, and a task whose golden state equals its initial state must carry an
output check or a rubric (doing nothing must not pass).

Splits: an instance goes wholly to `train` or `eval` by a hash of its instance id (~20% eval),
so the two splits are disjoint by id and by template instance.
"""
from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any, Callable

from tbhpc.tasks.schema import GoldenCall, Rubric, Task

FIRST = ["Ava", "Ben", "Chloe", "Dev", "Elena", "Farid", "Grace", "Hugo", "Ines", "Jonas", "Kira", "Liam",
         "Maya", "Nikhil", "Olga", "Pablo", "Quinn", "Rosa", "Sami", "Tara", "Umar", "Vera", "Wes", "Yara", "Zane"]
LAST = ["Abbott", "Baker", "Castillo", "Dube", "Eriksen", "Fischer", "Garcia", "Haddad", "Ito", "Jansen",
        "Kowalski", "Lindqvist", "Moreau", "Nakamura", "Okafor", "Petrov", "Quintero", "Rossi", "Singh",
        "Tanaka", "Usman", "Varga", "Weber", "Xu", "Young"]
STREETS = ["Maple Ave", "Harbor Rd", "Elm St", "Cedar Ln", "Birch Way", "Lake Dr", "Hill St", "Park Blvd"]
CITIES = ["Springfield", "Riverton", "Lakeside", "Fairview", "Greenville", "Brookfield"]

EVAL_SHARE = 0.2
RULES = """Rules: you only know the facts listed here; if asked anything else, say you don't know.
Do not invent data, do not change your goal, and repeat information when asked."""


@dataclass
class Draft:
    """What one template instance produces before it becomes a Task."""

    query: str
    persona: str
    facts: dict[str, str]
    patch: dict[str, list[dict]]
    calls: list[GoldenCall] = field(default_factory=list)
    response: str = ""
    output_contains: list[str] = field(default_factory=list)
    rubrics: list[Rubric] = field(default_factory=list)
    tags: list[str] = field(default_factory=list)

    def call(self, tool: str, **params: Any) -> "Draft":
        self.calls.append(GoldenCall(tool, {k: v for k, v in params.items() if v is not None}))
        return self

    def decline(self, question: str, keywords: tuple[str, ...], response: str, refusal: bool = False) -> "Draft":
        """The golden outcome is to change nothing: tag the task read-only and require the final
        message to say why (a rubric), so that doing nothing cannot pass."""
        self.tags += (["refusal"] if refusal else []) + ["read_only"]
        self.rubrics = [Rubric(question, tuple(keywords))]
        self.response = response
        return self

    def user_context(self) -> str:
        facts = "\n".join(f"- {k}: {v}" for k, v in self.facts.items())
        return f"{self.persona}\nFacts you know:\n{facts}\n{RULES}"


Template = Callable[["Gen"], Draft]


class Gen:
    """Seeded helpers shared by all templates of a domain: names, ids, dates, money."""

    def __init__(self, seed: int, domain: str, today: str, prefix: str):
        self.rng = random.Random(f"{seed}:{domain}")
        self.today = date.fromisoformat(today[:10])
        self.prefix = prefix
        self.counters: dict[str, int] = {}

    def new_id(self, kind: str, start: int = 1000) -> str:
        n = self.counters.get(kind, start) + 1
        self.counters[kind] = n
        return f"{kind}{n}"

    def person(self) -> tuple[str, str]:
        first, last = self.rng.choice(FIRST), self.rng.choice(LAST)
        return f"{first} {last}", f"{first}.{last}{self.rng.randint(1, 99)}@example.com".lower()

    def address(self) -> str:
        return f"{self.rng.randint(10, 999)} {self.rng.choice(STREETS)}, {self.rng.choice(CITIES)}"

    def days_ago(self, n: int) -> str:
        return (self.today - timedelta(days=n)).isoformat()

    def days_ahead(self, n: int) -> str:
        return (self.today + timedelta(days=n)).isoformat()

    def money(self, lo: float, hi: float) -> float:
        return round(self.rng.uniform(lo, hi), 2)

    def choice(self, seq):
        return self.rng.choice(seq)

    def randint(self, a: int, b: int) -> int:
        return self.rng.randint(a, b)

    def chance(self, p: float) -> bool:
        return self.rng.random() < p


def split_for(instance: str) -> str:
    h = int(hashlib.sha256(instance.encode()).hexdigest()[:8], 16) / 0xFFFFFFFF
    return "eval" if h < EVAL_SHARE else "train"


def generate(domain: str, templates: dict[str, tuple[Template, int]], seed: int, today: str, prefix: str) -> list[Task]:
    """Run each template `count` times; ids are `<domain>-<template>-<k>`."""
    gen = Gen(seed, domain, today, prefix)
    tasks = []
    for tname, (template, count) in templates.items():
        for k in range(count):
            d = template(gen)
            instance = f"{domain}/{tname}/{k:03d}"
            difficulty = "easy" if len(d.calls) <= 3 else "medium" if len(d.calls) <= 6 else "hard"
            tasks.append(Task(
                id=f"{domain}-{tname}-{k:03d}", domain=domain, query=d.query, user_context=d.user_context(),
                data_patch=d.patch, golden_calls=tuple(d.calls), split=split_for(instance),
                rubrics_yesno=tuple(d.rubrics), output_contains=tuple(d.output_contains),
                golden_response=d.response, tags=tuple([f"difficulty:{difficulty}", *d.tags]),
                template=tname, instance=instance))
    return tasks
