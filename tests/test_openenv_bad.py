"""A misbehaving OpenEnv environment is a system error with its cause, never a 0; a wrong address
is one line before anything runs. The environment here is a small WebSocket server written in
this file (a real socket on loopback) that can be told to misbehave: it stands in for a broken
third-party environment, which cannot otherwise be had on demand."""
from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.runner import run_campaign
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.errors import UserError
from tbhpc.openenv.remote import OpenEnvEnvironment
from tbhpc.policy.scripted import NoopPolicy, OraclePolicy

from helpers import attempt_rows as rows

websockets_server = pytest.importorskip("websockets.sync.server")


class FakeEnv:
    """reset / list_tools / call_tool / submit_message / finish, with `mode` choosing how finish answers."""

    def __init__(self):
        self.mode = "good"
        self.server = websockets_server.serve(self.handle, "127.0.0.1", 0)
        self.url = f"http://127.0.0.1:{self.server.socket.getsockname()[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, ws):
        task = None
        for raw in ws:
            msg = json.loads(raw)
            if msg["type"] == "close":
                return
            if msg["type"] == "reset":
                task = msg["data"]["task_id"]
                out = {"observation": {"task_id": task, "system_prompt": "You help.", "message": "hi",
                                       "max_agent_turns": 5, "max_user_turns": 3}, "reward": None, "done": False}
                if self.mode == "no-prompt":
                    del out["observation"]["system_prompt"]
            elif msg["data"]["type"] == "list_tools":
                out = {"observation": {"tools": [{"name": "lookup", "description": "", "input_schema": {"type": "object", "properties": {}}}]}}
            elif msg["data"]["tool_name"] == "submit_message" and self.mode == "user-ends":
                out = {"observation": {"tool_name": "submit_message", "result": {}}, "done": True, "reward": 1.0,
                       "metadata": {"reward_type": "pass", "finish_reason": "user_done"}}
            elif msg["data"]["tool_name"] != "finish":
                out = {"observation": {"tool_name": msg["data"]["tool_name"], "result": {"reply": "ok"}}, "metadata": {"ok": True}}
            else:
                out = self.finish()
                if out is None:
                    return
                if isinstance(out, str):
                    ws.send(out)
                    continue
            ws.send(json.dumps({"type": "observation", "data": out}))

    def finish(self):
        fin = {"observation": {"tool_name": "finish", "result": {}}, "done": True}
        if self.mode == "good":
            return {**fin, "reward": 0.0, "metadata": {"reward_type": "fail"}}
        if self.mode == "half":
            return {**fin, "reward": 0.5, "metadata": {"reward_type": "pass"}}
        if self.mode == "system":
            return {**fin, "reward": 0.0, "metadata": {"reward_type": "system_error", "error": "evaluator: db down"}}
        if self.mode == "malformed":
            return {"observation": "not an object"}
        if self.mode == "not-json":
            return "<html>502 Bad Gateway</html>"
        if self.mode == "hang":
            time.sleep(3)
            return {**fin, "reward": 1.0, "metadata": {"reward_type": "pass"}}
        if self.mode == "drop":
            return None

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fake():
    f = FakeEnv()
    yield f
    f.close()


@pytest.mark.parametrize("mode, cause", [
    ("half", "reward 0.5 is outside {0, 1}"),
    ("system", "system error: evaluator: db down"),
    ("malformed", "malformed finish observation"),
    ("not-json", "reply is not JSON"),
    ("hang", "no reply to step within 1 s"),
    ("drop", "step failed"),
])
def test_a_misbehaving_environment_is_a_system_error_with_its_cause(fake, pack_tasks, mode, cause):
    fake.mode = mode
    r = run_episode(pack_tasks[0], OpenEnvEnvironment(fake.url, timeout_s=1.0), NoopPolicy(), ScriptedUser())
    assert (r.status, r.reward, r.passed, r.finish_reason) == ("system_error", None, None, "system_error")
    assert r.error_kind == "openenv" and cause in r.error, r.error


def test_a_well_behaved_foreign_verdict_is_taken_as_given(fake, pack_tasks):
    r = run_episode(pack_tasks[0], OpenEnvEnvironment(fake.url), NoopPolicy(), ScriptedUser())
    assert (r.status, r.reward, r.passed) == ("ok", 0.0, False)
    assert r.messages[0]["content"] == "You help." and [t["function"]["name"] for t in r.tools] == ["lookup"]


def test_a_refused_connection_is_a_system_error_in_an_episode_and_one_line_in_a_campaign(tmp_path, pack_tasks):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # closed again: nothing listens there
    url = f"http://127.0.0.1:{port}"
    r = run_episode(pack_tasks[0], OpenEnvEnvironment(url), OraclePolicy(), ScriptedUser())
    assert r.status == "system_error" and r.reward is None and "cannot connect" in r.error
    cfg = CampaignConfig(name="oe", limit=2, environment="openenv", openenv={"url": url})
    with pytest.raises(UserError, match=r"field 'openenv': the environment cannot run task .*cannot connect"):
        run_campaign(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists(), "a campaign that cannot start writes nothing"


def test_system_errors_are_re_run_when_the_environment_recovers(fake, tmp_path):
    fake.mode = "half"
    cfg = CampaignConfig(name="oe", limit=3, repeats=2, chunk_size=2, environment="openenv", openenv={"url": fake.url})
    first = run_campaign(cfg, tmp_path / "run")
    assert first.system_errors == 6 and first.missing == 6
    assert {r[3] for r in rows(tmp_path / "run")} == {"system_error"} and {r[2] for r in rows(tmp_path / "run")} == {None}
    fake.mode = "good"
    second = run_campaign(cfg, tmp_path / "run")
    assert second.executed == 6 and second.ok == 6 and second.missing == 0
    assert {r[3] for r in rows(tmp_path / "run")} == {"ok"} and {r[2] for r in rows(tmp_path / "run")} == {0.0}


@pytest.mark.parametrize("fields, message", [
    ({"environment": "openenv"}, "give exactly one of url, launch, uv_project (got none)"),
    ({"environment": "openenv", "openenv": {"url": "ftp://x"}}, "not an http(s):// or ws(s):// URL"),
    ({"environment": "openenv", "openenv": {"launch": "serve --port 8000"}}, "launch must contain {port}"),
    ({"environment": "openenv", "openenv": {"url": "http://h:1", "timeout_s": 0}}, "timeout_s must be a number > 0"),
    ({"environment": "openenv", "openenv": {"url": "http://h:1", "retries": 2}}, "unknown field 'retries'"),
    ({"openenv": {"url": "http://h:1"}}, "field 'openenv' is set but field 'environment' is local"),
    ({"environment": "gym"}, "field 'environment' must be local or openenv"),
])
def test_bad_environment_settings_are_one_line(fields, message):
    with pytest.raises(UserError) as exc:
        CampaignConfig(name="oe", **fields)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    assert str(exc.value).startswith("campaign config")


def test_a_launch_that_dies_is_one_line_with_its_output(tmp_path, pack_tasks):
    cfg = CampaignConfig(name="oe", limit=1, environment="openenv",
                         openenv={"launch": "sh -c 'echo no such environment >&2; exit 3' {port}"})
    with pytest.raises(UserError, match=r"exited with status 3 before answering: no such environment"):
        run_campaign(cfg, tmp_path / "run")


def test_a_uv_project_without_uv_is_one_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))          # no uv on PATH
    cfg = CampaignConfig(name="oe", limit=1, environment="openenv", openenv={"uv_project": str(tmp_path)})
    assert cfg.openenv_spec.command(8000)[:5] == ["uv", "run", "--isolated", "--project", str(tmp_path)]
    with pytest.raises(UserError, match=r"field 'openenv': cannot start 'uv': No such file or directory"):
        run_campaign(cfg, tmp_path / "run")


@pytest.mark.parametrize("args, message", [
    (["default"], "openenv-serve needs the openenv package"),       # this environment has no openenv: one line
    (["no-such-pack"], "no-such-pack"),                             # checked before anything else
    (["default", "--max-sessions", "0"], "argument --max-sessions: expected an integer within [1, inf], got 0"),
    (["default", "--port", "70000"], "argument --port: expected an integer within [1, 65535], got 70000"),
    (["default", "--port", "0"], "argument --port: expected an integer within [1, 65535], got 0"),
    (["default", "--host", ""], "argument --host: expected a host name or address, got ''"),
    (["default", "--tool-timeout", "nan"], "argument --tool-timeout: expected a number > 0"),
    (["default", "--tool-timeout", "0"], "argument --tool-timeout: expected a number > 0"),
    (["default", "--user-url", "localhost:8000/v1"], "argument --user-url: expected an http(s)://host[:port]/... URL"),
    (["", "--port", "8000"], "argument pack: expected a pack, got an empty string"),
    (["default", "--host", "no-such-host.invalid"], "--host/--port: cannot listen on no-such-host.invalid:8000"),
])
def test_openenv_serve_refuses_in_one_line(args, message):
    import subprocess
    import sys
    p = subprocess.run([sys.executable, "-m", "tbhpc.cli", "openenv-serve", *args], capture_output=True, text=True, timeout=60)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1, p.stderr
    assert lines[0].startswith(("tbhpc: error:", "tbhpc openenv-serve: error:")), p.stderr     # a flag: argparse's line
    if message:
        assert message in lines[0]


def test_an_environment_that_ends_the_attempt_at_a_user_turn_gives_its_verdict(fake, pack_tasks):
    from tbhpc.env.agent import Completion

    class Chatty:
        name = "chatty"

        def session(self, task, seed=0):
            class S:
                def complete(self, messages, tools):
                    return Completion("Is there anything else I can do?")
            return S()

    fake.mode = "user-ends"
    r = run_episode(pack_tasks[0], OpenEnvEnvironment(fake.url), Chatty(), ScriptedUser())
    assert (r.status, r.reward, r.passed, r.finish_reason, r.user_turns) == ("ok", 1.0, True, "env_done", 0), r.error


def test_an_environment_without_the_reset_fields_is_one_line_before_a_campaign(fake, tmp_path):
    fake.mode = "no-prompt"         # a reset observation without system_prompt (another environment's shape)
    cfg = CampaignConfig(name="oe", limit=2, environment="openenv", openenv={"url": fake.url})
    with pytest.raises(UserError, match=r"field 'openenv': the environment cannot run task .*reset observation has no system_prompt"):
        run_campaign(cfg, tmp_path / "run")
