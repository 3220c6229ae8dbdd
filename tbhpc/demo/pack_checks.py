"""What the demo pack pays a policy that ignores the tools' values (`constant_ceilings`: every
constant behaviour played by the oracle and graded by the real engine) and what one episode costs
the demo model in tokens (`oracle_episode_tokens`).

Why here and not beside the pack's generator (domains/demo/pack.py): both play episodes with a
policy (the scripted oracle) or tokenize them for training, which sit above the domains; the
generator itself needs neither.
"""
from __future__ import annotations

import statistics
from collections import defaultdict

from tbhpc.domains import get_domain
from tbhpc.domains.demo.cases import constant_tasks
from tbhpc.domains.demo.pack import Instance
from tbhpc.env.episode import run_episode
from tbhpc.env.judge import KeywordJudge
from tbhpc.env.users import ScriptedUser
from tbhpc.policy.scripted import OraclePolicy
from tbhpc.tasks.schema import Task


class _Playing:
    """The oracle playing a behaviour's trajectory (from `constant_tasks`) on the real task."""

    def __init__(self, scripts: dict[str, Task]):
        self.scripts, self.oracle, self.name = scripts, OraclePolicy(), "constant"

    def session(self, task: Task, seed: int = 0):
        return self.oracle.session(self.scripts[task.id], seed)


def constant_ceilings(instances: list[Instance]) -> dict[str, dict[str, float]]:
    """Pass rate of every constant behaviour (each branch, `transfer`, `noop`) per template
    (`domain/template`), graded by the real engine: what a policy that ignores the tools'
    values would score."""
    passed: dict[str, dict[str, list[bool]]] = defaultdict(lambda: defaultdict(list))
    for inst in instances:
        t = inst.task
        for behaviour, script in constant_tasks(t, inst.case).items():
            r = run_episode(t, get_domain(t.domain), _Playing({t.id: script}), ScriptedUser(), KeywordJudge())
            passed[f"{t.domain}/{t.template}"][behaviour].append(bool(r.passed))
    return {k: {b: sum(v) / len(v) for b, v in per.items()} for k, per in passed.items()}


def oracle_episode_tokens(tokenizer, tasks: list[Task]) -> dict[str, float]:
    """Median and maximum length in tokens of the oracle's whole episodes (prompt, tool outputs,
    the agent's turns) with `tokenizer`'s chat template: the cost of one episode to the model."""
    from tbhpc.train.sft import oracle_examples     # torch and transformers: only when asked
    lengths = [len(e.tokens) for e in oracle_examples(tokenizer, tasks)]
    return {"episodes": len(lengths), "median": float(statistics.median(lengths)), "max": float(max(lengths))}
