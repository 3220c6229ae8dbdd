"""`tbhpc mcp-serve --domain NAME`: a built-in domain as a stdio MCP tool server.

Why: any MCP client can then use tbhpc's domains, and tbhpc's own MCP client path (the one that
runs ThinkingBox servers) is tested end to end against real server processes in CI.

It keeps the ThinkingBox server contract. Besides the domain's tools:
- `__reserved__init(config)`: a fresh private copy of the seed state with `config.data_patch`
  applied; remembers `golden_test_case` and `rubrics_yesno`; returns `{}` (or `{"error": ...}`).
  `sources` is accepted and ignored: a built-in domain searches its own policy manual.
- `__reserved__geteffects()`: `result_db_hash`, `golden_db_hash` (the golden calls replayed on
  a fresh copy), `diff` (readable lines, empty when equal), `rubrics_yesno`.
- `__reserved__teardown()`: drops the state; returns `{}`.
Because `init` resets everything, one process may serve attempt after attempt (a warm pool can
reuse it: `reuse: true` in the servers file). Business errors are tool output
(`{"error": ..., "tool": ...}`, flagged `is_error`); a broken backend is an MCP error, which
the client turns into a system error.
"""
from __future__ import annotations

import json
from typing import Any

from tbhpc.env.domain import Domain
from tbhpc.env.golden import golden_state
from tbhpc.env.state import canonical_state, diff_states, state_hash
from tbhpc.errors import TbhpcError
from tbhpc.tasks.schema import GoldenCall, Task

INIT, EFFECTS, TEARDOWN = "__reserved__init", "__reserved__geteffects", "__reserved__teardown"
RESERVED = (INIT, EFFECTS, TEARDOWN)


class DomainServer:
    """The server's logic, free of MCP: tools listed, calls answered as (text, is_error)."""

    def __init__(self, domain: Domain, tool_timeout_s: float = 10.0):
        self.domain, self.timeout = domain, tool_timeout_s
        self.backend = self.box = None
        self.task: Task | None = None
        self.rubrics: list = []

    def tools(self) -> list[dict]:
        out = [{"name": t.name, "description": t.description, "input_schema": t.parameters}
               for t in self.domain.all_tools.values()]
        out.append({"name": INIT, "description": "Reset the state: seed data + config.data_patch; remember the golden calls.",
                    "input_schema": {"type": "object", "properties": {"config": {"type": "object"}}, "required": ["config"]}})
        for name, what in ((EFFECTS, "The final state's hash, the golden state's hash and their diff."),
                           (TEARDOWN, "Drop the state.")):
            out.append({"name": name, "description": what, "input_schema": {"type": "object", "properties": {}}})
        return out

    def call(self, name: str, arguments: dict[str, Any] | None) -> tuple[str, bool]:
        args = arguments or {}
        if name == INIT:
            return self._init(args.get("config"))
        if name == EFFECTS:
            return self._effects()
        if name == TEARDOWN:
            self._drop()
            return "{}", False
        if self.box is None:
            return _error(name, "the server holds no state: call __reserved__init first"), True
        result = self.box.call(name, args)   # InfraError propagates: an MCP error, a system error for the client
        return result.output, not result.ok

    def _init(self, config: Any) -> tuple[str, bool]:
        if not isinstance(config, dict):
            return _error(INIT, "config must be an object"), True
        patch = config.get("data_patch") or {}
        calls = (config.get("golden_test_case") or {}).get("tool_interactions") or []
        try:
            if not isinstance(patch, dict) or not isinstance(calls, list):
                raise ValueError("data_patch must map table -> rows and golden_test_case.tool_interactions be a list")
            golden = tuple(GoldenCall(c["tool"], dict(c.get("parameters") or {})) for c in calls)
            self._drop()
            task = Task("mcp", self.domain.name, "", "", patch, golden, "eval")
            self.backend = self.domain.backend(task)
            self.box = self.domain.toolbox(self.backend, self.timeout)
        except (TbhpcError, ValueError, KeyError, TypeError) as exc:
            self._drop()
            return _error(INIT, f"bad init config: {exc}"), True
        self.task, self.rubrics = task, list(config.get("rubrics_yesno") or [])
        return "{}", False

    def _effects(self) -> tuple[str, bool]:
        if self.backend is None or self.task is None:
            return _error(EFFECTS, "the server holds no state: call __reserved__init first"), True
        final = canonical_state(self.backend)
        golden, golden_hash = golden_state(self.domain, self.task)
        final_hash = state_hash(final)
        diff = [] if final_hash == golden_hash else diff_states(final, golden)
        return json.dumps({"result_db_hash": final_hash, "golden_db_hash": golden_hash, "diff": diff,
                           "rubrics_yesno": self.rubrics}), False

    def _drop(self) -> None:
        if self.backend is not None:
            self.backend.conn.close()
        self.backend = self.box = self.task = None


def _error(tool: str, message: str) -> str:
    return json.dumps({"error": message, "tool": tool})


def serve(domain_name: str) -> None:
    """Run the server on stdin/stdout until the client closes stdin."""
    import anyio
    import mcp_types as types
    from mcp.server.lowlevel import Server
    from mcp.server.stdio import stdio_server

    from tbhpc.domains import get_domain

    logic = DomainServer(get_domain(domain_name))
    listed = types.ListToolsResult(tools=[types.Tool(**t) for t in logic.tools()])

    async def list_tools(ctx, params) -> types.ListToolsResult:
        return listed

    async def call_tool(ctx, params) -> types.CallToolResult:
        text, is_error = logic.call(params.name, params.arguments)
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error)

    server = Server(f"tbhpc-{domain_name}", on_list_tools=list_tools, on_call_tool=call_tool)

    async def main() -> None:
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    anyio.run(main)
