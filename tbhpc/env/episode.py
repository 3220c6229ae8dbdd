"""The episode loop: one task attempt from a fresh backend to a graded result record.

Protocol (as the reference harness):
- messages start with one system message (agent prompt + domain instructions); turn 0 sends
  the task's `query` verbatim as the user message;
- agent turn: model text -> interpreter -> tool calls run sequentially, their outputs appended,
  the model called again; visible text without tool calls ends the agent turn;
- the episode ends when the final visible text ends with `<DONE>` (`done`), an end-turn tool is
  called (`end_turn_tool`), the simulated user has replied `max_user_turns` times and the agent
  still has not finished (`user_limit`, still graded), the agent-turn cap is hit
  (`agent_limit`, still graded), or the policy stops itself (`response_budget`: the episode's
  generated-token budget is spent; `context_limit`: the history no longer fits; both graded);
- any `InfraError` (backend, tool timeout, policy/user/judge endpoint) makes the attempt a
  `system_error` with its cause: never a reward of 0, always eligible for re-run.
"""
from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass, field
from typing import Any

from tbhpc.env.grade import Grade, grade
from tbhpc.env.judge import Judge
from tbhpc.env.session import AttemptEnded, EnvSession, Environment, HostedSession
from tbhpc.env.users import UserSimulator
from tbhpc.errors import InfraError
from tbhpc.interpret import interpret
from tbhpc.llm_client import Usage
from tbhpc.env.agent import Policy
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
    finish_reason: str               # done | end_turn_tool | user_limit | agent_limit | response_budget | context_limit | env_done | system_error
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
    degraded: str = ""               # what the environment lacked (e.g. no_policy_search); "" when complete
    grade: dict[str, Any] | None = None
    messages: list[dict] = field(default_factory=list)
    tools: list[dict] = field(default_factory=list)     # the tool schemas the agent was shown

    def to_dict(self, with_messages: bool = True) -> dict:
        d = dict(self.__dict__)
        if not with_messages:
            d.pop("messages")
            d.pop("tools")
        return d


@dataclass
class EpisodeConfig:
    max_agent_turns: int | None = None   # None: the scenario's cap
    tool_timeout_s: float = 10.0
    agent_prompt: str = AGENT_PROMPT


def run_episode(task: Task, env: Environment, policy: Policy, user: UserSimulator,
                judge: Judge | None = None, config: EpisodeConfig | None = None, seed: int = 0) -> EpisodeResult:
    cfg = config or EpisodeConfig()
    start = time.monotonic()
    usage = {"agent": Usage(), "user": Usage(), "judge": Usage()}
    res = EpisodeResult(task.id, task.domain, policy.name, "ok", None, None, "", host=socket.gethostname())
    messages = [{"role": "user", "content": task.query}]
    res.messages = messages
    session = None
    try:
        session = env.open(task, cfg.tool_timeout_s)
        messages.insert(0, {"role": "system", "content": session.system_prompt(cfg.agent_prompt)})
        res.degraded = getattr(session, "degraded", "")
        hosted = isinstance(session, HostedSession)    # the environment plays the user and grades
        turns = _Turns(task, policy.session(task, seed=seed), session if hosted else user.session(task), session,
                       messages, res, usage, cfg.max_agent_turns or session.max_agent_turns())
        res.tools = turns.tools
        res.finish_reason = turns.run()
        res.final_message = _final_message(messages)
        g: Grade = (session.verdict(res.final_message, res.finish_reason) if hosted else
                    grade(task, session.check_state(), res.final_message, judge, usage["judge"]))
        res.reward, res.passed, res.grade = g.reward, g.passed, g.to_dict()
    except InfraError as exc:
        res.status, res.finish_reason = "system_error", "system_error"
        res.error, res.error_kind = str(exc)[:2000], exc.kind
        res.reward = res.passed = None
    finally:
        if session is not None:
            session.close()
        res.usage = {k: dict(v.__dict__) for k, v in usage.items()}
        res.wall_s = round(time.monotonic() - start, 6)
    return res


@dataclass
class _Turns:
    """The alternation of agent turns and simulated-user turns; returns the finish reason."""

    task: Task
    agent: Any
    human: Any
    box: EnvSession
    messages: list[dict]
    res: EpisodeResult
    usage: dict[str, Usage]
    max_agent_turns: int

    def __post_init__(self) -> None:
        self.tools, self.schemas = self.box.schemas(), self.box.parameter_schemas()

    def run(self) -> str:
        while True:
            finish = self.agent_turn()
            if finish:
                return finish
            if (self.messages[-1].get("content") or "").rstrip().endswith(DONE_MARKER):
                return "done"
            if self.res.user_turns >= self.task.max_user_turns:
                return "user_limit"
            try:
                text, u = self.human.reply(self.messages)
            except AttemptEnded as end:     # a hosting environment ended it (its user stopped, its cap)
                return end.finish_reason
            self.usage["user"].add(u)
            self.res.user_turns += 1
            self.messages.append({"role": "user", "content": text})

    def agent_turn(self) -> str | None:
        """Model calls until visible text without tool calls; a finish reason if the episode ends."""
        while True:
            if self.res.agent_turns >= self.max_agent_turns:
                return "agent_limit"
            completion = self.agent.complete(self.messages, self.tools)
            self.usage["agent"].add(completion.usage)
            if completion.finish_reason:
                return completion.finish_reason
            self.res.agent_turns += 1
            parsed = interpret(completion.text, self.schemas)
            msg: dict[str, Any] = {"role": "assistant", "content": parsed.text}
            if parsed.reasoning:
                msg["reasoning"] = parsed.reasoning
            self.messages.append(msg)
            if not parsed.tool_calls:
                return None
            ids = [f"call_{self.res.agent_turns}_{i}" for i in range(len(parsed.tool_calls))]
            msg["tool_calls"] = [{"id": cid, "type": "function", "function": {
                "name": c.name, "arguments": json.dumps(c.arguments, ensure_ascii=False)}}
                for cid, c in zip(ids, parsed.tool_calls)]
            for cid, call in zip(ids, parsed.tool_calls):
                if self.run_call(cid, call):
                    return "end_turn_tool"

    def run_call(self, call_id: str, call) -> bool:
        """Run one call (sequentially, as the reference); True when it was an end-turn tool."""
        self.res.tool_calls += 1
        if call.error:  # unparseable: the interpreter's message goes back to the model
            out, ok, end = json.dumps({"error": call.error, "tool": call.name}), False, False
        else:
            result = self.box.call(call.name, call.arguments)
            out, ok, end = result.output, result.ok, result.end_turn
        self.res.tool_errors += 0 if ok else 1
        self.messages.append({"role": "tool", "tool_call_id": call_id, "name": call.name, "content": out})
        return end


def _final_message(messages: list[dict]) -> str:
    for m in reversed(messages):
        if m["role"] == "assistant" and (m.get("content") or "").strip():
            return m["content"]
    return ""
