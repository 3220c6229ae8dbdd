"""`tbhpc openenv-serve PACK`: a pack's tasks as an OpenEnv environment, on OpenEnv's own server.

Why OpenEnv's classes (`Environment`, `HTTPEnvServer`, the MCP action and observation types)
rather than a look-alike: TRL's `environment_factory`, SkyRL, verifiers and OpenEnv's own
clients speak exactly that contract, and they then train and evaluate on tbhpc's domains and
database-state checks unchanged. The server runs in its own environment (`make env-openenv`):
openenv 0.10 pins the MCP SDK below the 2.x one tbhpc's tool-server path is written against.

Wire shape (production mode, as OpenEnv's ThinkingBox adapter): `/ws` carries reset / step /
state, `/mcp` carries tools/list and tools/call for the same session. `reset(task_id=ID)` (or
`test_uid`, or `seed` = an index into the pack) opens an isolated backend and returns the first
user message; `call_tool` runs a domain tool, `submit_message(text)` gets the simulated user's
reply, `finish()` ends with `done`, the reward (1 or 0) and `metadata.reward_type` pass / fail /
system_error; a system error has no reward. Each session (one WebSocket) owns one attempt.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

from openenv.core.env_server import (CallToolAction, CallToolObservation, Environment, HTTPEnvServer,
                                     ListToolsAction, ListToolsObservation, Observation, ServerMode, State, Tool,
                                     ToolError, ToolErrorType)

from tbhpc.env.judge import Judge
from tbhpc.env.registry import Environments
from tbhpc.env.users import UserSimulator
from tbhpc.errors import InfraError
from tbhpc.openenv.attempt import FINISH, SUBMIT, Attempt, Verdict
from tbhpc.tasks.schema import Task


class TaskObservation(Observation):
    """The reset observation: the task and what the agent is told (None fields: a failed reset)."""

    task_id: str | None = None
    domain: str | None = None
    system_prompt: str | None = None
    agent_prompt: str | None = None
    message: str | None = None
    max_agent_turns: int | None = None
    max_user_turns: int | None = None


class AttemptState(State):
    task_id: str | None = None
    status: str = "idle"               # idle | active | done
    record: dict[str, Any] = {}


@dataclass
class Served:
    """What every session shares: the pack, the environment resolver, the user and the judge."""

    tasks: list[Task]
    envs: Environments
    user: UserSimulator
    judge: Judge | None = None
    tool_timeout_s: float = 10.0
    by_id: dict[str, Task] = field(init=False)

    def __post_init__(self) -> None:
        self.by_id = {t.id: t for t in self.tasks}

    def pick(self, task_id: str | None, seed: int | None) -> Task:
        if task_id is not None:
            if task_id not in self.by_id:
                raise ValueError(f"unknown task_id {task_id!r} ({len(self.tasks)} tasks served)")
            return self.by_id[task_id]
        if seed is not None:
            return self.tasks[int(seed) % len(self.tasks)]
        raise ValueError("reset needs task_id (or test_uid, or seed: an index into the served tasks)")


class TaskEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True    # every session owns a private backend

    def __init__(self, served: Served):
        super().__init__()
        self.served = served
        self.attempt: Attempt | None = None
        self.episode_id: str | None = None
        self.steps = 0

    def reset(self, seed: int | None = None, episode_id: str | None = None, task_id: str | None = None,
              test_uid: str | None = None, agent_prompt: str | None = None, **_: Any) -> TaskObservation:
        self.close()
        task = self.served.pick(task_id or test_uid, seed)      # ValueError: the client's mistake, one line
        self.episode_id, self.steps = episode_id, 0
        try:
            self.attempt = Attempt.open(task, self.served.envs.for_task(task), self.served.user, self.served.judge,
                                        agent_prompt, self.served.tool_timeout_s)
        except InfraError as exc:
            v = Verdict("system_error", None, "reset_error", None, f"reset: {exc}"[:2000], exc.kind)
            return TaskObservation(task_id=task.id, domain=task.domain, done=True, reward=None, metadata=_meta(v))
        return TaskObservation(**self.attempt.first())

    def step(self, action: Any, timeout_s: float | None = None, **_: Any) -> Observation:
        if isinstance(action, ListToolsAction):
            tools = self.attempt.tools() if self.attempt else []
            return ListToolsObservation(tools=[Tool(**t) for t in tools])
        if not isinstance(action, CallToolAction):
            raise ValueError(f"unsupported action {type(action).__name__}: list_tools or call_tool")
        name, args = action.tool_name, dict(action.arguments or {})
        if self.attempt is None:
            return _tool_error(name, ToolErrorType.EXECUTION_ERROR, "no task: reset(task_id=...) first")
        self.steps += 1
        a = self.attempt
        if a.done:
            return _terminal(name, a.verdict)
        if name == FINISH:
            return _terminal(name, a.finish(args.get("message"), str(args.get("reason") or "harness")))
        if name == SUBMIT:
            text = args.get("text")
            if not isinstance(text, str):
                return _tool_error(name, ToolErrorType.INVALID_ARGS, "submit_message needs text (a string)")
            reply = a.submit(text)
            if a.done:
                return _terminal(name, a.verdict)
            return CallToolObservation(tool_name=name, result={"reply": reply}, metadata={"user_turns": a.user_turns})
        out = a.call(name, args)
        if a.done:
            return _terminal(name, a.verdict)
        return CallToolObservation(tool_name=name, result=out["output"], metadata={"ok": out["ok"], "end_turn": out["end_turn"]})

    # OpenEnv's task API (GET /list_environments, /tbhpc/splits; POST /tbhpc/tasks, /num_tasks, /task):
    # what a client may reset to. Split "all" lists every served task.
    def list_splits(self) -> list[str]:
        return sorted({t.split for t in self.served.tasks}) + ["all"]

    def list_tasks(self, split: str) -> list[dict]:
        return [{"task_id": t.id, "domain": t.domain, "split": t.split} for t in self._split(split)]

    def num_tasks(self, split: str) -> int:
        return len(self._split(split))

    def get_task(self, split: str, index: int) -> dict:
        return self.list_tasks(split)[index]        # IndexError: OpenEnv answers 400

    def _split(self, split: str) -> list[Task]:
        return [t for t in self.served.tasks if split in ("all", t.split)]

    @property
    def state(self) -> AttemptState:
        a = self.attempt
        return AttemptState(episode_id=self.episode_id, step_count=self.steps, task_id=a.task.id if a else None,
                            status="idle" if a is None else ("done" if a.done else "active"),
                            record=a.record() if a else {})

    def close(self) -> None:
        if self.attempt is not None:
            self.attempt.close()
            self.attempt = None


def _meta(v: Verdict) -> dict:
    return {"reward_type": v.verdict, "finish_reason": v.finish_reason, "system_error": v.verdict == "system_error",
            "error": v.error, "error_kind": v.error_kind}


def _terminal(name: str, v: Verdict) -> CallToolObservation:
    return CallToolObservation(tool_name=name, result=v.to_dict(), done=True, reward=v.reward, metadata=_meta(v))


def _tool_error(name: str, kind: ToolErrorType, message: str) -> CallToolObservation:
    return CallToolObservation(tool_name=name, result=None, error=ToolError(error_type=kind, message=message))


ENV_NAME = "tbhpc"


def make_app(served: Served, max_sessions: int = 64):
    """The FastAPI app: OpenEnv's HTTPEnvServer in production mode over TaskEnvironment sessions."""
    from fastapi import FastAPI
    app = FastAPI(title="tbhpc OpenEnv environment")
    server = HTTPEnvServer(functools.partial(TaskEnvironment, served), CallToolAction, CallToolObservation,
                           max_concurrent_envs=max_sessions, env_name=ENV_NAME, state_cls=AttemptState,
                           reset_observation_cls=TaskObservation)
    server.register_routes(app, mode=ServerMode.PRODUCTION)
    app.state.openenv_server = server
    return app


def serve_tasks(tasks: list[Task], servers: str | None, user: UserSimulator, judge: Judge | None,
                tool_timeout_s: float = 10.0, max_sessions: int = 64):
    """(app, its Environments) for `tasks`, after the MCP servers they need passed their preflight;
    close the Environments when the app stops."""
    from tbhpc.env.registry import preflight
    preflight(tasks, servers)
    envs = Environments(servers, announce=True)
    return make_app(Served(tasks, envs, user, judge, tool_timeout_s), max_sessions), envs


def app_from_env():
    """An app factory for OpenEnv's own deployments (`uv run ... uvicorn --factory
    tbhpc.openenv.server:app_from_env`, a Dockerfile): the pack from $TBHPC_OPENENV_PACK (default:
    the bundled one), MCP servers from $TBHPC_OPENENV_SERVERS, sessions from
    $TBHPC_OPENENV_MAX_SESSIONS; the scripted user and the keyword judge."""
    import os

    from tbhpc.env.judge import KeywordJudge
    from tbhpc.env.users import ScriptedUser
    from tbhpc.openenv.tasks import load_served_tasks
    tasks = load_served_tasks(os.environ.get("TBHPC_OPENENV_PACK") or "default")
    app, _ = serve_tasks(tasks, os.environ.get("TBHPC_OPENENV_SERVERS") or None, ScriptedUser(), KeywordJudge(),
                         max_sessions=int(os.environ.get("TBHPC_OPENENV_MAX_SESSIONS") or 64))
    return app
