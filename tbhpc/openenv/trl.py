"""TRL's `environment_factory` on an OpenEnv environment (e.g. `tbhpc openenv-serve demo`).

Why here: a TRL user should train on tbhpc's domains and database-state checks without tbhpc's
trainer. TRL exposes an environment's public methods as tools (their type hints and docstrings
make the JSON schemas) and asks `get_reward()` once per rollout; the tools a task offers are only
known from the environment, so one class per domain is built at run time from `list_tools`, and
each dataset row names its domain (`environment`) and task (`task_id`).

What differs from tbhpc's own episode loop, by TRL's design: a turn without a tool call ends the
rollout, so the agent reaches the simulated user only through the `submit_message` tool, and the
grade reads the last message sent that way. A system error is a reward of None (TRL ignores it),
never a 0.
"""
from __future__ import annotations

import inspect
import json
from typing import Any, Callable

from tbhpc.openenv.attempt import FINISH, SUBMIT
from tbhpc.openenv.wire import Connection, OpenEnvError

JSON_TYPES = {"string": str, "integer": int, "number": float, "boolean": bool, "array": list, "object": dict}


def trl_dataset(url: str, task_ids: list[str]) -> tuple[list[dict], dict[str, list[dict]]]:
    """Rows for TRL (`prompt`: the system and first user message the environment gives, `task_id`,
    `environment`: the domain) and each domain's tool list."""
    rows, tools = [], {}
    for task_id in task_ids:
        conn = Connection(url)
        try:
            o = _obs(conn.request("reset", {"task_id": task_id}))
            if o["domain"] not in tools:
                tools[o["domain"]] = _obs(conn.request("step", {"type": "list_tools"}))["tools"]
        finally:
            conn.close()
        rows.append({"prompt": [{"role": "system", "content": o["system_prompt"]}, {"role": "user", "content": o["message"]}],
                     "task_id": task_id, "environment": o["domain"]})
    return rows, tools


def environment_factories(url: str, tools: dict[str, list[dict]], timeout_s: float = 120.0) -> dict[str, Callable]:
    """One environment class per domain: its tools as methods, `reset(**row)`, `get_reward()`."""
    def factory_for(domain: str, specs: list[dict]) -> Callable:
        methods = {s["name"]: _method(s) for s in specs if s["name"] != FINISH}
        cls = type(f"OpenEnv_{domain}", (_Session,), methods)
        return lambda: cls(url, timeout_s)
    return {d: factory_for(d, specs) for d, specs in tools.items()}


class _Session:
    """One rollout's attempt: a WebSocket session, reset to the row's task."""

    def __init__(self, url: str, timeout_s: float):
        self._url, self._timeout, self._conn = url, timeout_s, None

    def reset(self, **row: Any) -> None:
        self._close()
        self._conn = Connection(self._url, self._timeout)
        _obs(self._conn.request("reset", {"task_id": row["task_id"]}))

    def get_reward(self) -> float | None:
        try:
            data = self._conn.request("step", {"type": "call_tool", "tool_name": FINISH, "arguments": {"reason": "trl"}})
        except OpenEnvError:
            return None
        finally:
            self._close()
        meta = data.get("metadata") or {}
        reward = data.get("reward")
        if meta.get("reward_type") not in ("pass", "fail") or reward not in (0, 1):
            return None                      # a system error or a malformed verdict: never scored
        return float(reward)

    def _call(self, name: str, arguments: dict) -> str:
        data = self._conn.request("step", {"type": "call_tool", "tool_name": name,
                                           "arguments": {k: v for k, v in arguments.items() if v is not None}})
        o = _obs(data)
        if o.get("error"):
            return json.dumps({"error": o["error"].get("message"), "tool": name})
        result = o.get("result")
        if name == SUBMIT and isinstance(result, dict):
            return result.get("reply") or "(the conversation has ended)"
        return result if isinstance(result, str) else json.dumps(result)

    def _close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def _method(spec: dict) -> Callable:
    """A method whose signature and Google-style docstring carry the tool's JSON schema."""
    name, schema = spec["name"], spec.get("input_schema") or {}
    props, required = schema.get("properties", {}), set(schema.get("required", []))

    def method(self, **kwargs):
        return self._call(name, kwargs)

    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    notes = []
    for p in sorted(props, key=lambda p: p not in required):      # required first
        s = props[p]
        params.append(inspect.Parameter(p, inspect.Parameter.KEYWORD_ONLY, annotation=_python_type(s),
                                        default=inspect.Parameter.empty if p in required else None))
        enum = next((x["enum"] for x in [s, *s.get("anyOf", [])] if isinstance(x, dict) and "enum" in x), None)
        text = (s.get("description") or p).replace("\n", " ") + (f" (choices: {json.dumps(enum)})" if enum else "")
        notes.append(f"    {p}: {text}")
    method.__signature__ = inspect.Signature(params, return_annotation=str)
    method.__annotations__ = {p.name: p.annotation for p in params[1:]} | {"return": str}
    method.__doc__ = (spec.get("description") or name) + ("\n\nArgs:\n" + "\n".join(notes) if notes else "")
    method.__name__ = method.__qualname__ = name           # TRL calls a tool by its function's name
    return method


def _python_type(s: dict) -> type:
    kinds = [s.get("type")] + [x.get("type") for x in s.get("anyOf", []) if isinstance(x, dict)]
    return next((JSON_TYPES[k] for k in kinds if k in JSON_TYPES), str)


def _obs(data: dict) -> dict:
    o = data.get("observation")
    if not isinstance(o, dict):
        raise OpenEnvError(f"malformed observation: {str(data)[:200]}")
    return o
