"""An OpenEnv environment as a tbhpc Environment: campaigns and training run on it unchanged.

Why through the Environment seam: planning, shards, exactly-once resume, the DuckDB results,
re-runs of system errors and the interpreter of model output all sit above it, so an attempt on
an OpenEnv environment is recorded exactly like one in process. The session is a HostedSession:
the environment plays the user (`submit_message`) and grades (`finish`), so the episode loop
sends it the agent's messages and takes its verdict instead of grading here.

What the environment must speak: the shape of OpenEnv's ThinkingBox adapter as `tbhpc
openenv-serve` serves it (reset by `task_id`; MCP tools; `submit_message(text)`; a hidden
`finish(message, reason)` whose terminal observation carries `done`, the reward and
`metadata.reward_type`). Anything else (a refused connection, a timeout, a malformed
observation, a reward outside {0, 1}) is a system error with its cause, never a 0.
"""
from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any

from tbhpc.env.episode import AGENT_PROMPT
from tbhpc.env.grade import Grade
from tbhpc.env.session import AttemptEnded, StateCheck
from tbhpc.env.tools import ToolResult
from tbhpc.errors import UserError
from tbhpc.llm_client import Usage
from tbhpc.openenv.attempt import FINISH, SUBMIT
from tbhpc.openenv.wire import Connection, OpenEnvError
from tbhpc.tasks.schema import Task

UNLIMITED = sys.maxsize
ENDED_REASONS = ("user_limit", "done", "agent_limit", "end_turn_tool")   # kept as the environment says; others: env_done


@dataclass
class OpenEnvEnvironment:
    url: str
    agent_prompt: str = AGENT_PROMPT
    timeout_s: float = 120.0            # one reply (a tool call, the user's answer, the grade)
    connect_timeout_s: float = 10.0

    @property
    def name(self) -> str:
        return f"openenv:{self.url}"

    def open(self, task: Task, tool_timeout_s: float = 10.0) -> "OpenEnvSession":
        return OpenEnvSession(self, task)


class OpenEnvSession:
    def __init__(self, env: OpenEnvEnvironment, task: Task):
        self.env, self.task = env, task
        self.conn = Connection(env.url, env.timeout_s, env.connect_timeout_s)
        self.ended: dict | None = None          # the terminal observation, once the environment ended the attempt
        try:
            first = self._observation(self.conn.request("reset", {"task_id": task.id, "agent_prompt": env.agent_prompt}), "reset")
            if first["done"]:
                raise OpenEnvError(f"OpenEnv environment {env.url}: reset of {task.id} failed: "
                                   f"{first['metadata'].get('error') or first['metadata'].get('reward_type') or 'done at reset'}")
            self.first = first["observation"]
            self.listed = self._tools()
        except BaseException:
            self.conn.close()
            raise
        self.degraded = ""

    # -- EnvSession -----------------------------------------------------------------------------
    def system_prompt(self, agent_prompt: str) -> str:
        if agent_prompt != self.env.agent_prompt:
            raise UserError("the OpenEnv environment composes the system prompt from the agent prompt given at reset: "
                            "build OpenEnvEnvironment with the episode's agent_prompt")
        text = self.first.get("system_prompt")
        if not isinstance(text, str):
            raise OpenEnvError(f"OpenEnv environment {self.env.url}: reset observation has no system_prompt")
        return text

    def max_agent_turns(self) -> int:
        n = self.first.get("max_agent_turns")
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise OpenEnvError(f"OpenEnv environment {self.env.url}: reset observation has max_agent_turns {n!r}")
        return UNLIMITED if n is None else n

    def schemas(self) -> list[dict]:
        return [{"type": "function", "function": {"name": t["name"], "description": t.get("description", ""),
                                                  "parameters": t.get("input_schema") or {}}} for t in self.listed]

    def parameter_schemas(self) -> dict[str, dict]:
        return {t["name"]: t.get("input_schema") or {} for t in self.listed}

    def call(self, name: str, arguments: Any) -> ToolResult:
        obs = self._step(name, arguments if isinstance(arguments, dict) else {"arguments": arguments})
        meta, o = obs["metadata"], obs["observation"]
        if o.get("error"):
            err = o["error"]
            return ToolResult(name, json.dumps({"error": err.get("message", str(err)), "tool": name}), False)
        result = o.get("result")
        out = result if isinstance(result, str) else json.dumps(result, ensure_ascii=False)
        return ToolResult(name, out, bool(meta.get("ok", True)), bool(meta.get("end_turn", False)))

    def check_state(self) -> StateCheck:
        raise OpenEnvError("an OpenEnv attempt is graded by its environment (verdict), not by a local state check")

    def close(self) -> None:
        self.conn.close()

    # -- HostedSession --------------------------------------------------------------------------
    def reply(self, transcript: list[dict]) -> tuple[str, Usage]:
        last = next((m.get("content") or "" for m in reversed(transcript) if m["role"] == "assistant"), "")
        obs = self._step(SUBMIT, {"text": last})
        if obs["done"]:                 # graded (a system error raised in _step)
            reason = obs["metadata"].get("finish_reason")
            raise AttemptEnded(reason if reason in ENDED_REASONS else "env_done")
        result = obs["observation"].get("result")
        if not isinstance(result, dict) or not isinstance(result.get("reply"), str):
            raise OpenEnvError(f"OpenEnv environment {self.env.url}: submit_message observation has no reply: {str(result)[:200]}")
        return result["reply"], Usage()

    def verdict(self, final_message: str, finish_reason: str) -> Grade:
        obs = self.ended or self._step(FINISH, {"message": final_message, "reason": finish_reason}, final=True)
        return _grade(obs, self.env.url)

    # -- the wire -------------------------------------------------------------------------------
    def _tools(self) -> list[dict]:
        o = self._observation(self.conn.request("step", {"type": "list_tools"}), "list_tools")["observation"]
        tools = o.get("tools")
        if not isinstance(tools, list) or not all(isinstance(t, dict) and isinstance(t.get("name"), str) for t in tools):
            raise OpenEnvError(f"OpenEnv environment {self.env.url}: malformed list_tools observation: {str(o)[:200]}")
        return [t for t in tools if t["name"] not in (SUBMIT, FINISH)]

    def _step(self, name: str, arguments: dict, final: bool = False) -> dict:
        if self.ended is not None:
            _grade(self.ended, self.env.url)     # a system error raises; a graded end cannot take more calls
            raise OpenEnvError(f"OpenEnv environment {self.env.url}: the attempt already ended ({self.ended['metadata'].get('finish_reason')})")
        obs = self._observation(self.conn.request("step", {"type": "call_tool", "tool_name": name, "arguments": arguments}), name)
        if obs["done"]:
            self.ended = obs
            if not final:
                _grade(obs, self.env.url)        # a system error raises here, with its cause
        return obs

    def _observation(self, data: dict, what: str) -> dict:
        o = data.get("observation")
        if not isinstance(o, dict):
            raise OpenEnvError(f"OpenEnv environment {self.env.url}: malformed {what} observation: {str(data)[:200]}")
        meta = data.get("metadata") if isinstance(data.get("metadata"), dict) else o.get("metadata") or {}
        return {"observation": o, "done": bool(data.get("done", False)), "reward": data.get("reward"), "metadata": meta}


def _grade(obs: dict, url: str) -> Grade:
    """The terminal observation as a Grade; a system error or a malformed verdict raises."""
    meta, reward = obs["metadata"], obs["reward"]
    kind = meta.get("reward_type")
    if kind == "system_error" or meta.get("system_error"):
        raise OpenEnvError(f"OpenEnv environment {url}: system error: {meta.get('error') or 'no cause given'}")
    if not obs["done"]:
        raise OpenEnvError(f"OpenEnv environment {url}: finish did not end the attempt (done is false)")
    if isinstance(reward, bool) or reward not in (0, 1, 0.0, 1.0):
        raise OpenEnvError(f"OpenEnv environment {url}: reward {reward!r} is outside {{0, 1}}")
    if kind not in (None, "pass", "fail") or (kind == "pass") != (reward == 1):
        raise OpenEnvError(f"OpenEnv environment {url}: reward_type {kind!r} does not match reward {reward!r}")
    g = (obs["observation"].get("result") or {}).get("grade") if isinstance(obs["observation"].get("result"), dict) else None
    passed = reward == 1
    if isinstance(g, dict):       # a tbhpc server reports the whole grade: hashes, diff, message checks
        return Grade(float(reward), passed, bool(g.get("state_match", passed)), str(g.get("final_hash", "")),
                     str(g.get("golden_hash", "")), list(g.get("diff") or []), list(g.get("output_missing") or []),
                     list(g.get("rubrics") or []))
    return Grade(float(reward), passed, passed, "", "")


def served_task_ids(url: str, timeout_s: float = 30.0) -> set[str] | None:
    """The task ids an environment offers through OpenEnv's task API (split "all"), or None when it
    has no task API (it may still serve the tasks: only a reset can tell)."""
    import urllib.error
    import urllib.request
    base = url.rstrip("/")
    if base.startswith("ws"):
        base = "http" + base[2:]
    base = base.removesuffix("/ws")
    try:
        with urllib.request.urlopen(base + "/list_environments", timeout=timeout_s) as r:
            names = json.loads(r.read())
        req = urllib.request.Request(f"{base}/{names[0]}/tasks", data=json.dumps({"split": "all"}).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=timeout_s) as r:
            tasks = json.loads(r.read())["tasks"]
        return {t["task_id"] for t in tasks}
    except urllib.error.HTTPError:       # it answers, without (this) task API
        return None
    except urllib.error.URLError as exc:
        raise OpenEnvError(f"OpenEnv environment {url}: cannot connect", exc.reason if isinstance(exc.reason, BaseException) else exc) from None
    except (OSError, ValueError, KeyError, IndexError, TypeError) as exc:
        raise OpenEnvError(f"OpenEnv environment {url}: malformed task list", exc) from None
