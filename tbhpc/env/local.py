"""The in-process session of a built-in domain: a private SQLite copy and its ToolBox.

Why its own module: it is the fast path every built-in pack runs on (an episode costs
milliseconds); the MCP path in `tbhpc.mcp` must produce the same StateCheck for the same
final state, so both read the hash and diff from `tbhpc.env.state`.
"""
from __future__ import annotations

from typing import Any

from tbhpc.env.domain_view import DomainView
from tbhpc.env.golden import golden_state
from tbhpc.env.session import StateCheck
from tbhpc.env.state import canonical_state, diff_states, state_hash
from tbhpc.env.tools import ToolResult
from tbhpc.tasks.schema import Task


class LocalSession:
    def __init__(self, domain: DomainView, task: Task, tool_timeout_s: float):
        self.domain, self.task = domain, task
        self.backend = domain.backend(task)
        self.box = domain.toolbox(self.backend, tool_timeout_s)

    def system_prompt(self, agent_prompt: str) -> str:
        return self.domain.system_prompt(agent_prompt)

    def max_agent_turns(self) -> int:
        return self.domain.max_agent_turns(self.task)

    def schemas(self) -> list[dict]:
        return self.domain.tool_schemas

    def parameter_schemas(self) -> dict[str, dict]:
        return self.box.parameter_schemas()

    def call(self, name: str, arguments: Any) -> ToolResult:
        return self.box.call(name, arguments)

    def check_state(self) -> StateCheck:
        final = canonical_state(self.backend)
        golden, golden_hash = golden_state(self.domain, self.task)
        final_hash = state_hash(final)
        return StateCheck(final_hash, golden_hash, [] if final_hash == golden_hash else diff_states(final, golden))

    def close(self) -> None:
        self.backend.conn.close()
