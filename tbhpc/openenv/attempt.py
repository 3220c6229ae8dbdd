"""One task attempt driven from outside: what `tbhpc openenv-serve` holds for each session.

Why its own module, free of OpenEnv: the attempt is tbhpc's episode turned inside out (the agent
lives in the client; the backend, the simulated user and the grader stay here), and it must
grade exactly as `run_episode` does, so it reuses the same Environment, UserSimulator and
`grade`. The OpenEnv server (`tbhpc.openenv.server`) only translates actions and observations.

The shape follows OpenEnv's ThinkingBox adapter: the domain's tools, plus two control tools:
`submit_message(text)` (the agent's message to the simulated user, whose reply comes back) and
`finish(message, reason)`, hidden from the tool list, which ends the attempt with the verdict.
Reaching the task's user-turn cap with a submitted message ends it too (`user_limit`, graded).
A failure of the infrastructure (a backend, a tool server, the user or judge endpoint) latches:
the attempt ends as a `system_error` with its cause, never as a reward of 0.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

from tbhpc.env.episode import AGENT_PROMPT
from tbhpc.env.grade import grade
from tbhpc.env.judge import Judge
from tbhpc.env.session import EnvSession, Environment
from tbhpc.env.users import UserSimulator
from tbhpc.errors import InfraError
from tbhpc.llm_client import Usage
from tbhpc.tasks.schema import Task

SUBMIT, FINISH = "submit_message", "finish"
SUBMIT_TOOL = {"name": SUBMIT, "description": "Send a message to the customer and get their reply.",
               "input_schema": {"type": "object", "properties": {"text": {"type": "string", "description": "Your message."}},
                                "required": ["text"]}}


@dataclass
class Verdict:
    """How the attempt ended. `reward` is 1.0 or 0.0 for pass or fail and None for a system error."""

    verdict: str                      # pass | fail | system_error
    reward: float | None
    finish_reason: str
    grade: dict[str, Any] | None = None
    error: str = ""
    error_kind: str = ""

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Attempt:
    task: Task
    session: EnvSession
    user: Any                                  # a UserSession
    judge: Judge | None
    agent_prompt: str
    messages: list[dict] = field(default_factory=list)
    user_turns: int = 0
    tool_calls: int = 0
    verdict: Verdict | None = None

    @classmethod
    def open(cls, task: Task, env: Environment, user: UserSimulator, judge: Judge | None,
             agent_prompt: str | None = None, tool_timeout_s: float = 10.0) -> "Attempt":
        """A fresh isolated backend for `task`; InfraError when it cannot be opened."""
        session = env.open(task, tool_timeout_s)
        a = cls(task, session, user.session(task), judge, agent_prompt or AGENT_PROMPT)
        a.messages = [{"role": "system", "content": session.system_prompt(a.agent_prompt)},
                      {"role": "user", "content": task.query}]
        return a

    @property
    def done(self) -> bool:
        return self.verdict is not None

    def first(self) -> dict:
        """What the agent starts from: the task, its instructions, its first message, its limits."""
        return {"task_id": self.task.id, "domain": self.task.domain, "system_prompt": self.messages[0]["content"],
                "agent_prompt": self.agent_prompt, "message": self.task.query,
                "max_agent_turns": self.session.max_agent_turns(), "max_user_turns": self.task.max_user_turns}

    def tools(self) -> list[dict]:
        """The domain's tools as MCP tools (name, description, input_schema), then submit_message."""
        out = [{"name": s["function"]["name"], "description": s["function"].get("description", ""),
                "input_schema": s["function"].get("parameters") or {"type": "object", "properties": {}}}
               for s in self.session.schemas()]
        return out + [SUBMIT_TOOL]

    def call(self, name: str, arguments: dict) -> dict:
        """One domain tool call: {output, ok, end_turn}. A business error is output (ok false)."""
        self.tool_calls += 1
        try:
            r = self.session.call(name, arguments)
        except InfraError as exc:
            self._fail(exc, "tool_call")
            return {"output": "", "ok": False, "end_turn": False}
        self.messages.append({"role": "tool", "name": name, "arguments": arguments, "content": r.output})
        return {"output": r.output, "ok": r.ok, "end_turn": r.end_turn}

    def submit(self, text: str) -> str | None:
        """The agent's message to the user: the user's reply, or None when the attempt ended."""
        self.messages.append({"role": "assistant", "content": text})
        if self.user_turns >= self.task.max_user_turns:
            self.finish(None, "user_limit")
            return None
        try:
            reply, _ = self.user.reply(self.messages)
        except InfraError as exc:
            self._fail(exc, "user_simulator")
            return None
        self.user_turns += 1
        self.messages.append({"role": "user", "content": reply})
        return reply

    def finish(self, message: str | None = None, reason: str = "harness") -> Verdict:
        """Grade once: the final state against the golden replay and the final message's checks.
        `message` is the agent's final message when it was not submitted (it asks nothing)."""
        if self.verdict is not None:
            return self.verdict
        last = next((m["content"] for m in reversed(self.messages)
                     if m["role"] == "assistant" and (m.get("content") or "").strip()), "")
        final = last if message is None else message
        if message is not None and message != last:
            self.messages.append({"role": "assistant", "content": message})
        try:
            g = grade(self.task, self.session.check_state(), final, self.judge, Usage())
        except InfraError as exc:
            return self._fail(exc, "grade")
        self.verdict = Verdict("pass" if g.passed else "fail", g.reward, reason, g.to_dict())
        return self.verdict

    def record(self) -> dict:
        """The attempt's record (OpenEnv `state`): task, counters, verdict, transcript."""
        return {"task_id": self.task.id, "status": "done" if self.done else "active", "user_turns": self.user_turns,
                "tool_calls": self.tool_calls, "verdict": self.verdict.to_dict() if self.verdict else None,
                "messages": json.loads(json.dumps(self.messages, default=str))}

    def close(self) -> None:
        self.session.close()

    def _fail(self, exc: InfraError, stage: str) -> Verdict:
        if self.verdict is None:      # the first failure is the cause
            self.verdict = Verdict("system_error", None, "system_error", None, f"{stage}: {exc}"[:2000], exc.kind)
        return self.verdict
