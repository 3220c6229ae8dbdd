"""The episode loop: one task attempt from a fresh backend to a graded result record.

Protocol (as the reference harness):
- messages start with one system message (agent prompt + domain instructions); turn 0 sends
  the task's `query` verbatim as the user message;
- agent turn: model text -> interpreter -> tool calls run sequentially, their outputs appended,
  the model called again; visible text without tool calls ends the agent turn;
- the episode ends when the final visible text ends with `<DONE>` (`done`), an end-turn tool is
  called (`end_turn_tool`), the simulated user has replied `max_user_turns` times and the agent
  still has not finished (`user_limit`, still graded), or the agent-turn cap is hit
  (`agent_limit`, still graded);
- any `InfraError` (backend, tool timeout, policy/user/judge endpoint) makes the attempt a
  `system_error` with its cause: never a reward of 0, always eligible for re-run.
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from tbhpc.env.domain import Domain
from tbhpc.env.grade import Grade, grade
from tbhpc.env.judge import Judge
from tbhpc.env.state import canonical_state
from tbhpc.env.users import UserSimulator
from tbhpc.errors import InfraError
from tbhpc.interpret import interpret
from tbhpc.llm_client import Usage
from tbhpc.policy.base import Policy
from tbhpc.tasks.schema import Task

DONE_MARKER = "<DONE>"
AGENT_PROMPT = f"""You are an AI agent that helps customers by using the tools you are given.
Follow the domain instructions and the policy manual; look up policies with the search tool
before acting on anything the manual governs. Ask the customer for information you need.
When the customer's request is fully handled, send a final message that asks nothing and ends
with {DONE_MARKER}. Never append {DONE_MARKER} to a message that asks the customer anything."""


@dataclass
class EpisodeResult:
    task_id: str
    domain: str
    policy: str
    status: str                      # ok | system_error
    reward: float | None             # None for a system error
    passed: bool | None
    finish_reason: str               # done | end_turn_tool | user_limit | agent_limit | system_error
    agent_turns: int = 0
    user_turns: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    usage: dict[str, dict] = field(default_factory=dict)
    wall_s: float = 0.0
    host: str = ""
    error: str = ""
    error_kind: str = ""
    final_message: str = ""
    grade: dict[str, Any] | None = None
    messages: list[dict] = field(default_factory=list)

    def to_dict(self, with_messages: bool = True) -> dict:
        d = dict(self.__dict__)
        if not with_messages:
            d.pop("messages")
        return d


@dataclass
class EpisodeConfig:
    max_agent_turns: int | None = None   # None: the scenario's cap
    tool_timeout_s: float = 10.0
    agent_prompt: str = AGENT_PROMPT


def run_episode(task: Task, domain: Domain, policy: Policy, user: UserSimulator,
                judge: Judge | None = None, config: EpisodeConfig | None = None) -> EpisodeResult:
    cfg = config or EpisodeConfig()
    start = time.monotonic()
    usage = {"agent": Usage(), "user": Usage(), "judge": Usage()}
    res = EpisodeResult(task.id, task.domain, policy.name, "ok", None, None, "", host=socket.gethostname())
    messages = [{"role": "system", "content": domain.scenario.system_prompt(cfg.agent_prompt)},
                {"role": "user", "content": task.query}]
    res.messages = messages
    backend = None
    try:
        backend = domain.backend(task)
        box = domain.toolbox(backend, cfg.tool_timeout_s)
        tools, schemas = box.schemas(), box.parameter_schemas()
        agent = policy.session(task)
        human = user.session(task)
        max_agent = cfg.max_agent_turns or domain.scenario.max_agent_turns
        res.finish_reason = _loop(task, agent, human, box, tools, schemas, messages, res, usage, max_agent)
        res.final_message = _final_message(messages)
        g: Grade = grade(domain, task, canonical_state(backend), res.final_message, judge, usage["judge"])
        res.reward, res.passed, res.grade = g.reward, g.passed, g.to_dict()
    except InfraError as exc:
        res.status, res.finish_reason = "system_error", "system_error"
        res.error, res.error_kind = str(exc)[:2000], exc.kind
        res.reward = res.passed = None
    finally:
        if backend is not None:
            backend.conn.close()
        res.usage = {k: dict(v.__dict__) for k, v in usage.items()}
        res.wall_s = round(time.monotonic() - start, 6)
    return res


def _loop(task, agent, human, box, tools, schemas, messages, res, usage, max_agent) -> str:
    while True:
        # ---- agent turn: model calls until visible text without tool calls ----
        while True:
            if res.agent_turns >= max_agent:
                return "agent_limit"
            completion = agent.complete(messages, tools)
            usage["agent"].add(completion.usage)
            res.agent_turns += 1
            parsed = interpret(completion.text, schemas)
            msg: dict[str, Any] = {"role": "assistant", "content": parsed.text}
            if parsed.reasoning:
                msg["reasoning"] = parsed.reasoning
            if not parsed.tool_calls:
                messages.append(msg)
                break
            msg["tool_calls"] = [{"id": f"call_{res.agent_turns}_{i}", "type": "function",
                                  "function": {"name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                                 for i, c in enumerate(parsed.tool_calls)]
            messages.append(msg)
            ended = False
            for i, call in enumerate(parsed.tool_calls):
                res.tool_calls += 1
                if call.error:
                    out = json.dumps({"error": call.error, "tool": call.name})
                    ok = False
                else:
                    result = box.call(call.name, call.arguments)
                    out, ok, ended = result.output, result.ok, ended or result.end_turn
                res.tool_errors += 0 if ok else 1
                messages.append({"role": "tool", "tool_call_id": f"call_{res.agent_turns}_{i}",
                                 "name": call.name, "content": out})
                if ended:
                    return "end_turn_tool"
        # ---- end checks on the agent's visible text ----
        if (messages[-1].get("content") or "").rstrip().endswith(DONE_MARKER):
            return "done"
        if res.user_turns >= task.max_user_turns:
            return "user_limit"
        text, u = human.reply(messages)
        usage["user"].add(u)
        res.user_turns += 1
        messages.append({"role": "user", "content": text})


def _final_message(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m["role"] == "assistant" and (m.get("content") or "").strip():
            return m["content"]
    return ""
