"""What a session and the golden replay need from a domain, as a Protocol.

Why: `Domain` (env/domain.py) opens sessions (`LocalSession`), and a session replays the golden
calls (env/golden.py); if those named `Domain` itself, the three would import each other. They
name this view instead, which `Domain` satisfies by its shape, so the imports run one way:
domain -> local -> golden -> domain_view.
"""
from __future__ import annotations

from typing import Protocol

from tbhpc.env.db import Backend
from tbhpc.env.tools import ToolBox
from tbhpc.tasks.schema import Task


class DomainView(Protocol):
    name: str

    @property
    def tool_schemas(self) -> list[dict]: ...

    def backend(self, task: Task | None = None) -> Backend: ...

    def toolbox(self, backend: Backend, timeout_s: float = 10.0) -> ToolBox: ...

    def system_prompt(self, agent_prompt: str) -> str: ...

    def max_agent_turns(self, task: Task) -> int: ...
