"""What an episode talks to: an Environment hands out one EnvSession per attempt.

Why a seam here: the episode loop, the grader and every campaign above them must not care
whether the tools run in process (a private SQLite copy of a built-in domain, reset in tens of
microseconds) or in tool-server processes speaking MCP (ThinkingBox's own servers, or tbhpc's
domains served by `tbhpc mcp-serve`). Both give the same things: the instructions and turn cap
of the attempt, the tool schemas the agent sees, tool calls, the final-state check against the
golden state, and a close.

A HostedSession (an OpenEnv environment, `tbhpc.openenv.remote`) also hosts the simulated user
and the grader: the episode loop then sends the agent's messages to it and takes its verdict,
so the attempt is judged where its state lives.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from tbhpc.env.tools import ToolResult
from tbhpc.tasks.schema import Task


@dataclass(frozen=True)
class StateCheck:
    """The database half of the grade: the final state's hash against the golden replay's."""

    final_hash: str
    golden_hash: str
    diff: list[str] = field(default_factory=list)

    @property
    def match(self) -> bool:
        return self.final_hash == self.golden_hash


class EnvSession(Protocol):
    def system_prompt(self, agent_prompt: str) -> str: ...   # the agent prompt + the domain's instructions

    def max_agent_turns(self) -> int: ...

    def schemas(self) -> list[dict]: ...            # OpenAI tool schemas, whitelist order

    def parameter_schemas(self) -> dict[str, dict]: ...  # name -> JSON schema (the interpreter coerces against it)

    def call(self, name: str, arguments: Any) -> ToolResult: ...  # business errors are output; InfraError otherwise

    def check_state(self) -> StateCheck: ...

    def close(self) -> None: ...


class AttemptEnded(Exception):
    """A HostedSession's environment ended the attempt while the agent was talking to its user
    (its user stopped, or the user-turn cap it enforces was reached); the verdict is ready."""

    def __init__(self, finish_reason: str):
        super().__init__(finish_reason)
        self.finish_reason = finish_reason


@runtime_checkable
class HostedSession(Protocol):
    """A session whose environment plays the user and grades the attempt itself."""

    def reply(self, transcript: list[dict]) -> tuple[str, Any]: ...   # the user's answer; AttemptEnded when none comes

    def verdict(self, final_message: str, finish_reason: str) -> Any: ...   # a Grade; InfraError for a system error


class Environment(Protocol):
    name: str

    def open(self, task: Task, tool_timeout_s: float) -> EnvSession: ...
