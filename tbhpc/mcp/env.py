"""A ThinkingBox scenario on its MCP tool servers, as an Environment for the episode loop.

Per attempt (`MCPEnvironment.open`): one server per server named in the merged init config,
from the worker's pools; the union of their tools filtered to the scenario's whitelist (in
whitelist order, description overrides applied); `__reserved__init(config)` on each (success is
exactly `{}`). Tool calls go to the server that offers the tool; unknown names are answered like
the in-process ToolBox answers them. `check_state` asks every server for
`__reserved__geteffects()`: the attempt's state matches when every graded server's result hash
equals its golden hash (the servers the file's `validate_database` reads; every server when the
file has no helper of its own). `close` tears down and hands each process back to its pool.
"""
from __future__ import annotations

import copy
import hashlib
import json
import sys
import time
from typing import Any

from tbhpc.env.session import StateCheck
from tbhpc.env.tools import ToolResult, error_result
from tbhpc.errors import UserError
from tbhpc.mcp.client import ServerConnection, ServerPool, ToolServerError, sdk_field
from tbhpc.mcp.serve import EFFECTS, INIT, TEARDOWN
from tbhpc.tasks.schema import Task
from tbhpc.tb.dataset import TBScenario, merge_init

UNLIMITED_AGENT_TURNS = sys.maxsize    # the reference's default for max_agent_sim_turns


class MCPEnvironment:
    def __init__(self, scenario: TBScenario, pools: dict[str, ServerPool], strip_sources: bool = False):
        self.scenario, self.pools = scenario, pools
        self.name = scenario.name
        self.strip_sources = strip_sources     # the policy-search backend is down: run without `sources`
        self.end_turn = frozenset(st.name for st in scenario.tools if st.end_turn)

    def system_prompt(self, agent_prompt: str) -> str:
        return self.scenario.system_prompt(agent_prompt)

    def max_agent_turns(self, task: Task) -> int:
        n = task.backend.get("max_agent_turns")
        return UNLIMITED_AGENT_TURNS if n is None else int(n)

    def init_configs(self, task: Task) -> dict[str, dict]:
        merged = merge_init(self.scenario.world_state, task.backend.get("init") or {})
        missing = [s for s in merged if s not in self.pools]
        if missing:
            raise UserError(f"task {task.id}: scenario {self.name} needs tool server {missing[0]!r}, "
                            f"which the servers file does not define (it has: {', '.join(sorted(self.pools)) or 'none'})")
        return merged

    def open(self, task: Task, tool_timeout_s: float = 10.0) -> "MCPSession":
        return MCPSession(self, task, tool_timeout_s)

    def check(self, task: Task) -> None:
        """The servers this task needs are defined and start, offer every whitelisted tool, and
        accept this task's real `__reserved__init` (a server installed without its seed tables
        starts and lists its tools, and fails only here)."""
        MCPSession(self, task, 10.0).close()


class MCPSession:
    def __init__(self, env: MCPEnvironment, task: Task, tool_timeout_s: float):
        self.env, self.task, self.timeout = env, task, tool_timeout_s
        self.conns: dict[str, ServerConnection] = {}
        self.healthy = True
        self.degraded = ""
        configs = env.init_configs(task)
        if env.strip_sources and any((c or {}).get("sources") for c in configs.values()):
            configs = {s: {k: v for k, v in (c or {}).items() if k != "sources"} for s, c in configs.items()}
            self.degraded = "no_policy_search"
        try:
            for server in configs:
                self.conns[server] = env.pools[server].acquire()
            self.tools = self._visible_tools()
            for server, config in configs.items():
                text, is_error = self.conns[server].call(INIT, {"config": config}, max(tool_timeout_s, 60.0))
                if is_error or _json(text) != {}:
                    raise ToolServerError(f"tool server {server}: {INIT} did not return {{}}: {text[:300]}")
        except BaseException:
            self.healthy = False
            self.close()
            raise

    def _visible_tools(self) -> dict[str, tuple[str, dict]]:
        """Whitelisted name -> (server, OpenAI schema), in whitelist order."""
        offered: dict[str, tuple[str, Any]] = {}
        for server, conn in self.conns.items():
            pool = self.env.pools[server]
            if pool.tools is None:
                pool.tools = conn.list_tools()
            for tool in pool.tools:
                offered.setdefault(tool.name, (server, tool))
        visible: dict[str, tuple[str, dict]] = {}
        for st in self.env.scenario.tools:
            if st.name not in offered:
                raise UserError(f"{self.env.scenario.file}: tool {st.name!r} is whitelisted but none of the scenario's "
                                f"servers ({', '.join(self.conns)}) offers it")
            server, tool = offered[st.name]
            params = plain_schema(sdk_field(tool, "input_schema", "inputSchema") or {"type": "object", "properties": {}})
            for arg, text in st.arg_descriptions:
                if isinstance(params.get("properties", {}).get(arg), dict):
                    params["properties"][arg]["description"] = text
            visible[st.name] = (server, {"type": "function", "function": {
                "name": st.name, "description": st.description or tool.description or "", "parameters": params}})
        return visible

    def system_prompt(self, agent_prompt: str) -> str:
        return self.env.system_prompt(agent_prompt)

    def max_agent_turns(self) -> int:
        return self.env.max_agent_turns(self.task)

    def schemas(self) -> list[dict]:
        return [schema for _, schema in self.tools.values()]

    def parameter_schemas(self) -> dict[str, dict]:
        return {name: schema["function"]["parameters"] for name, (_, schema) in self.tools.items()}

    def call(self, name: str, arguments: Any) -> ToolResult:
        start = time.monotonic()
        if name not in self.tools:
            return error_result(name, f"unknown tool {str(name)[:80]!r}", start)
        if not isinstance(arguments, dict):
            return error_result(name, "invalid arguments: expected an object", start)
        server, _ = self.tools[name]
        try:
            text, is_error = self.conns[server].call(name, arguments, self.timeout)
        except ToolServerError:
            self.healthy = False
            raise
        ok = not is_error and not _is_error_output(text)
        return ToolResult(name, text, ok, name in self.env.end_turn, time.monotonic() - start)

    def check_state(self) -> StateCheck:
        finals, goldens, diff = [], [], []
        graded = self.task.backend.get("graded_servers") or list(self.conns)
        for server, conn in self.conns.items():
            if server not in graded:
                continue
            text, is_error = conn.call(EFFECTS, {}, max(self.timeout, 60.0))
            effects = _json(text)
            if is_error or not isinstance(effects, dict) or not {"result_db_hash", "golden_db_hash"} <= set(effects):
                self.healthy = False
                raise ToolServerError(f"tool server {server}: {EFFECTS} gave no result/golden hashes: {text[:300]}")
            finals.append((server, str(effects["result_db_hash"])))
            goldens.append((server, str(effects["golden_db_hash"])))
            prefix = f"{server}: " if len(graded) > 1 else ""
            diff += [prefix + (d if isinstance(d, str) else json.dumps(d, sort_keys=True, default=str))
                     for d in _diff_items(effects.get("diff"))]
        if len(finals) == 1:
            return StateCheck(finals[0][1], goldens[0][1], diff[:21])
        return StateCheck(_combined(finals), _combined(goldens), diff[:21])

    def close(self) -> None:
        for server, conn in self.conns.items():
            healthy = self.healthy and conn.alive
            if healthy:
                try:
                    conn.call(TEARDOWN, {}, 30.0)
                except ToolServerError:
                    healthy = False
            self.env.pools[server].release(conn, healthy)
        self.conns = {}


def plain_schema(schema: dict) -> dict:
    """A tool's input schema as the agent should see it (what the reference proxy does): every
    `$ref` into `$defs` inlined, `$defs` dropped, and pydantic's `title` keywords stripped (a
    property that happens to be *named* title is kept)."""
    defs = schema.get("$defs") or schema.get("definitions") or {}

    def walk(node: Any, seen: tuple = ()) -> Any:
        if isinstance(node, list):
            return [walk(x, seen) for x in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.split("/")[-1] in defs:
            rest = {k: v for k, v in node.items() if k != "$ref"}
            if ref in seen:               # a recursive type: shown as "anything" below the first level
                return walk(rest, seen)
            return walk({**defs[ref.split("/")[-1]], **rest}, seen + (ref,))
        out = {}
        for key, value in node.items():
            if key in ("$defs", "definitions", "title"):
                continue
            if key == "properties" and isinstance(value, dict):
                out[key] = {name: walk(sub, seen) for name, sub in value.items()}
            else:
                out[key] = walk(value, seen)
        return out

    return walk(copy.deepcopy(schema))


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return None


def _is_error_output(text: str) -> bool:
    """The reference servers report tool exceptions as `{"error": ..., "tool": ...}` text."""
    doc = _json(text)
    return isinstance(doc, dict) and "error" in doc and set(doc) <= {"error", "tool"}


def _diff_items(diff: Any) -> list:
    if not diff:
        return []
    if isinstance(diff, list):
        return diff
    if isinstance(diff, dict):
        return [{k: v} for k, v in diff.items()]
    return [diff]


def _combined(pairs: list[tuple[str, str]]) -> str:
    text = "\n".join(f"{s}={h}" for s, h in sorted(pairs))
    return hashlib.sha256(text.encode()).hexdigest()

