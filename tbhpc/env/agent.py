"""What the episode loop asks of the agent: a policy opens one session per episode; a session
turns the message history (OpenAI chat format) plus the tool schemas into raw model text. The
policies (tbhpc/policy) implement it; the interface lives with the loop that drives it, so the
environments need no policy code.

Why sessions: scripted policies keep per-episode state (the oracle's position in the golden
trajectory) and model policies may keep a per-episode token buffer; a policy object itself is
shared by all episodes of a worker.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from tbhpc.llm_client import Usage
from tbhpc.tasks.schema import Task


@dataclass
class Completion:
    text: str                       # raw model output, reasoning and tool calls included
    usage: Usage = field(default_factory=Usage)
    finish_reason: str = ""         # set when the policy ends the episode itself: response_budget | context_limit


class PolicySession(Protocol):
    def complete(self, messages: list[dict], tools: list[dict]) -> Completion: ...


class Policy(Protocol):
    name: str

    def session(self, task: Task, seed: int = 0) -> PolicySession:
        """One episode. `seed` differs per attempt so repeats of a task sample differently."""
        ...
