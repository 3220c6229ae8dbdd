"""Task and scenario records, compatible in spirit with the ThinkingBox format.

Why dataclasses and not dicts: every later stage (episodes, campaigns, training) reads the same
fields, and a typo should fail at load time, not deep inside a Slurm array task.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SPLITS = ("train", "eval")


@dataclass(frozen=True)
class GoldenCall:
    """One `{tool, parameters}` step of the reference trajectory."""

    tool: str
    parameters: dict[str, Any]

    def to_dict(self) -> dict:
        return {"tool": self.tool, "parameters": dict(self.parameters)}


@dataclass(frozen=True)
class Rubric:
    """A yes/no question about the agent's final message.

    `keywords` is optional and only used by the offline keyword judge: the answer is yes when the
    final message contains any of them (case-insensitive). An LLM judge sees only the question.
    """

    question: str
    keywords: tuple[str, ...] = ()

    def to_dict(self) -> dict | str:
        return {"question": self.question, "keywords": list(self.keywords)} if self.keywords else self.question


@dataclass(frozen=True)
class Task:
    id: str
    domain: str
    query: str
    user_context: str
    data_patch: dict[str, list[dict[str, Any]]]
    golden_calls: tuple[GoldenCall, ...]
    split: str
    rubrics_yesno: tuple[Rubric, ...] = ()
    output_contains: tuple[str, ...] = ()
    golden_response: str = ""
    max_user_turns: int = 10
    tags: tuple[str, ...] = ()
    template: str = ""
    instance: str = ""
    source_file: str = ""
    backend: dict[str, Any] = field(default_factory=dict)   # {} = the built-in domain; else e.g. a ThinkingBox task's MCP servers (tbhpc.tb)

    @property
    def n_golden_calls(self) -> int:
        return len(self.golden_calls)

    def to_dict(self) -> dict:
        """The YAML form written into packs (field order fixed for byte-stable files)."""
        out: dict[str, Any] = {
            "id": self.id,
            "domain": self.domain,
            "split": self.split,
            "template": self.template,
            "instance": self.instance,
            "tags": list(self.tags),
            "query": self.query,
            "user_context": self.user_context,
            "init": {"data_patch": {t: [dict(r) for r in rows] for t, rows in self.data_patch.items()}},
            "golden": {
                "tool_interactions": [c.to_dict() for c in self.golden_calls],
                "response": self.golden_response,
            },
        }
        if self.rubrics_yesno:
            out["rubrics_yesno"] = [r.to_dict() for r in self.rubrics_yesno]
        if self.output_contains:
            out["output_contains"] = list(self.output_contains)
        if self.max_user_turns != 10:
            out["max_user_turns"] = self.max_user_turns
        if self.backend:
            out["backend"] = self.backend
        return out


@dataclass(frozen=True)
class ManualDoc:
    name: str
    text: str


@dataclass(frozen=True)
class Scenario:
    """One per domain: what the agent may call, what it is told, what it must look up."""

    domain: str
    title: str
    current_date: str
    instructions: str
    tools: tuple[str, ...]
    manual: tuple[ManualDoc, ...]
    max_user_turns: int = 10
    max_agent_turns: int = 50
    extra: dict = field(default_factory=dict)
    agent_prompt: str = ""          # replaces the generic agent prompt (the demo pack's compact domains state their own)

    def system_prompt(self, agent_prompt: str) -> str:
        return f"{(self.agent_prompt or agent_prompt).strip()}\n\n{self.instructions.strip()}\n"
