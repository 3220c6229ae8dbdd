"""Tools: typed functions over a backend, exposed to the model with JSON-schema parameters.

Why a registry with explicit parameter specs (not signature introspection): the schema is the
contract the model sees *and* what the interpreter coerces string arguments against, so it is
written down once, next to the function. Unknown or extra arguments are rejected.

Error contract:
- `ToolError` (a business rule, a missing record, a bad argument) -> tool output
  `{"error": ..., "tool": name}` that the agent sees; the backend is rolled back to the state
  before the call (a savepoint), so a failed call never half-writes.
- any other exception inside a tool, or running past the time budget -> `BackendError` /
  `ToolTimeout`: a system error of the episode, never a 0.
"""
from __future__ import annotations

import json
import sqlite3
import time
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Callable

from tbhpc.argcheck import check_object
from tbhpc.env.db import Backend
from tbhpc.errors import BackendError, ToolTimeout


class ToolError(Exception):
    """A business-level failure reported to the agent as tool output."""


def require(db: Backend, table: str, row_id: Any, what: str) -> dict:
    """The row, or a ToolError the agent reads ("order O9 not found")."""
    row = db.get(table, row_id)
    if row is None:
        raise ToolError(f"{what} {row_id} not found")
    return row


def find_by_email(db: Backend, table: str, email: str, what: str) -> dict:
    rows = db.select(table, email=email.strip().lower())
    if not rows:
        raise ToolError(f"no {what} with email {email}")
    return rows[0]


@dataclass(frozen=True)
class Param:
    """One tool parameter. Optional parameters become `anyOf [T, null]` like the reference."""

    type: str
    description: str
    required: bool = True
    enum: tuple | None = None
    items: dict | None = None
    max_length: int | None = None
    minimum: float | None = None

    def schema(self) -> dict:
        s: dict[str, Any] = {"type": self.type}
        if self.enum is not None:
            s["enum"] = list(self.enum)
        if self.items is not None:
            s["items"] = self.items
        if self.type == "string":
            s["maxLength"] = self.max_length or 2000
        if self.minimum is not None:
            s["minimum"] = self.minimum
        if not self.required:
            s = {"anyOf": [s, {"type": "null"}]}
        s["description"] = self.description
        return s


def P(type: str, description: str, **kw: Any) -> Param:
    return Param(type, description, **kw)


def opt(type: str, description: str, **kw: Any) -> Param:
    return Param(type, description, required=False, **kw)


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: dict[str, Param]
    fn: Callable[..., Any]
    mutates: bool = True
    end_turn: bool = False

    @cached_property
    def parameters(self) -> dict:
        return {
            "type": "object",
            "properties": {k: p.schema() for k, p in self.params.items()},
            "required": [k for k, p in self.params.items() if p.required],
            "additionalProperties": False,
        }

    @cached_property
    def openai_schema(self) -> dict:
        return {"type": "function", "function": {
            "name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass
class ToolRegistry:
    """Collects tools of one toolset; domains combine registries and whitelist names."""

    tools: dict[str, Tool] = field(default_factory=dict)

    def tool(self, description: str, /, mutates: bool = True, end_turn: bool = False, **params: Param):
        def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
            name = fn.__name__
            if name in self.tools:
                raise ValueError(f"tool {name} registered twice")
            self.tools[name] = Tool(name, description, params, fn, mutates, end_turn)
            return fn
        return deco

    def merged(self, *others: "ToolRegistry") -> "ToolRegistry":
        out = ToolRegistry(dict(self.tools))
        for o in others:
            for name, t in o.tools.items():
                if name in out.tools:
                    raise ValueError(f"tool {name} defined in two toolsets")
                out.tools[name] = t
        return out


@dataclass
class ToolResult:
    name: str
    output: str                  # what the agent sees (JSON text)
    ok: bool
    end_turn: bool = False
    seconds: float = 0.0


class ToolBox:
    """The tools one episode may call, bound to that episode's backend."""

    def __init__(self, backend: Backend, tools: dict[str, Tool], timeout_s: float = 10.0):
        self.backend = backend
        self.tools = tools
        self.timeout_s = timeout_s
        self._deadline = 0.0
        backend.conn.set_progress_handler(self._over_time, 2000)

    def _over_time(self) -> int:
        return 1 if self._deadline and time.monotonic() > self._deadline else 0

    def schemas(self) -> list[dict]:
        return [t.openai_schema for t in self.tools.values()]

    def parameter_schemas(self) -> dict[str, dict]:
        return {name: t.parameters for name, t in self.tools.items()}

    def call(self, name: str, arguments: Any) -> ToolResult:
        start = time.monotonic()
        tool = self.tools.get(name)
        if tool is None:
            return self._error(name, f"unknown tool {str(name)[:80]!r}", start)
        problem = check_object(arguments, tool.parameters)
        if problem:
            return self._error(name, f"invalid arguments: {problem}", start)
        args = {k: v for k, v in arguments.items() if v is not None}
        conn = self.backend.conn
        conn.execute("SAVEPOINT tool_call")
        self._deadline = start + self.timeout_s
        try:
            value = tool.fn(self.backend, **args)
        except ToolError as exc:
            conn.execute("ROLLBACK TO tool_call")
            conn.execute("RELEASE tool_call")
            return self._error(name, str(exc), start, tool.end_turn)
        except sqlite3.OperationalError as exc:
            self._rollback_quietly()
            if "interrupted" in str(exc):
                raise ToolTimeout(f"tool {name} ran past {self.timeout_s:.1f}s") from exc
            raise BackendError(f"tool {name} failed in the backend", exc) from exc
        except Exception as exc:  # a bug in a tool or a broken backend: a system error
            self._rollback_quietly()
            raise BackendError(f"tool {name} raised", exc) from exc
        finally:
            self._deadline = 0.0
        conn.execute("RELEASE tool_call")
        if time.monotonic() - start > self.timeout_s:
            raise ToolTimeout(f"tool {name} ran past {self.timeout_s:.1f}s")
        output = json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)
        return ToolResult(name, output, True, tool.end_turn, time.monotonic() - start)

    def _rollback_quietly(self) -> None:
        try:
            self.backend.conn.execute("ROLLBACK TO tool_call")
            self.backend.conn.execute("RELEASE tool_call")
        except sqlite3.Error:
            pass

    @staticmethod
    def _error(name: str, message: str, start: float, end_turn: bool = False) -> ToolResult:
        return error_result(name, message, start, end_turn)


def error_result(name: str, message: str, start: float, end_turn: bool = False) -> ToolResult:
    """A business error as the agent sees it (the reference's `{"error", "tool"}` text)."""
    out = json.dumps({"error": message, "tool": str(name)[:80]}, ensure_ascii=False)
    return ToolResult(str(name), out, False, end_turn, time.monotonic() - start)
