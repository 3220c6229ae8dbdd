"""The run's token (serve/auth.py) and the middleware that demands it (vllm_ext/tbhpc_auth.py).

The middleware is driven here as the ASGI callable it is (what vLLM's app calls), in front of a
recording app; tests/test_vllm.py checks the same on a real vLLM server, route class by route class.
"""
import asyncio
import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from tbhpc.errors import UserError
from tbhpc.llm_client import ChatEndpoint
from tbhpc.policy.generation import ServerGenerator
from tbhpc.serve.auth import ensure_token, read_token, token_path
from tbhpc.serve.client import ServerClient
from tbhpc.serve.vllm_ext import tbhpc_auth


def test_the_token_file_is_private_and_made_once(tmp_path):
    run = tmp_path / "run"
    run.mkdir(mode=0o777)
    os.chmod(run, 0o777)                          # a umask-free shared directory: others lose write access
    path = ensure_token(run)
    assert path == token_path(run) and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert not run.stat().st_mode & stat.S_IWOTH
    token = read_token(path)
    assert len(token) >= 43                       # 32 random bytes, url-safe base64
    assert ensure_token(run) == path and read_token(path) == token      # a second run of the same dir keeps it
    assert not [p for p in run.iterdir() if p.name.startswith(".tmp")]


def test_racing_creators_agree_on_one_token(tmp_path):
    code = "import sys; from tbhpc.serve.auth import ensure_token, read_token; print(read_token(ensure_token(sys.argv[1])))"
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE, text=True)
             for _ in range(4)]
    tokens = {p.communicate(timeout=60)[0].strip() for p in procs}
    assert len(tokens) == 1 and tokens == {read_token(token_path(tmp_path))}


def test_a_token_file_others_can_read_is_refused_in_one_line(tmp_path):
    path = ensure_token(tmp_path)
    os.chmod(path, 0o644)
    with pytest.raises(UserError) as err:
        read_token(path)
    assert str(path) in str(err.value) and "0644" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(UserError, match="chmod 600"):
        ensure_token(tmp_path)                    # a server would not start on it either
    with pytest.raises(UserError, match="cannot read"):
        read_token(tmp_path / "missing.token")


def test_no_client_prints_the_token(tmp_path):
    token = read_token(ensure_token(tmp_path))
    for obj in (ServerClient("http://h:1", token), ServerGenerator("http://h:1", token=token),
                ChatEndpoint("http://h:1/v1", "m", api_key=token)):
        assert token not in repr(obj) and token not in str(obj)
    assert ServerClient.at("http://h:1/v1/", token_path(tmp_path)) == ServerClient("http://h:1", token)


# --- the middleware, as vLLM's app calls it ---------------------------------------------------------

def _call(mw, path, headers=(), kind="http", client=("10.1.2.3", 40000)):
    seen, sent = [], []

    async def app(scope, receive, send):     # the routes behind the middleware
        seen.append(scope["path"])

    mw.app = app

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request"}

    scope = {"type": kind, "path": path, "method": "POST" if kind == "http" else None, "client": client,
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers]}
    asyncio.run(mw(scope, receive, send))
    status = next((m["status"] for m in sent if m["type"] == "http.response.start"), None)
    closed = next((m["code"] for m in sent if m["type"] == "websocket.close"), None)
    return bool(seen), status, closed


@pytest.fixture
def guarded(tmp_path, monkeypatch):
    path = ensure_token(tmp_path)
    monkeypatch.setenv(tbhpc_auth.TOKEN_ENV, str(path))
    return tbhpc_auth.RequireRunToken(None), read_token(path)


ROUTES = ["/v1/models", "/v1/chat/completions", "/inference/v1/generate", "/collective_rpc", "/pause",
          "/resume", "/reset_prefix_cache", "/update_weight_version", "/weight_info", "/metrics", "/health/x"]


def test_every_route_but_health_needs_the_token(guarded):
    mw, token = guarded
    for route in ROUTES:
        assert _call(mw, route) == (False, 401, None), route
        assert _call(mw, route, [("Authorization", "Bearer " + token[:-1] + "x")]) == (False, 401, None), route
        assert _call(mw, route, [("Authorization", "Basic " + token)]) == (False, 401, None), route
        assert _call(mw, route, [("Authorization", "Bearer " + token)]) == (True, None, None), route
    assert _call(mw, "/health") == (True, None, None)
    assert _call(mw, "/v1/realtime", kind="websocket") == (False, None, 1008)
    assert _call(mw, "/v1/realtime", [("authorization", "bearer " + token)], kind="websocket") == (True, None, None)


def test_refusals_are_logged_with_the_peer_never_the_token_and_a_scan_cannot_flood_the_log(guarded, caplog, monkeypatch):
    mw, token = guarded
    with caplog.at_level(logging.WARNING, logger="vllm.tbhpc.auth"):
        _call(mw, "/collective_rpc\nFAKE LINE", [("Authorization", "Bearer " + token + "0")], client=("10.9.8.7", 5555))
        for _ in range(tbhpc_auth.LOG_BURST + 10):
            _call(mw, "/pause")
        monkeypatch.setattr(tbhpc_auth, "LOG_WINDOW_S", 0.0)     # the window ends: the count of the rest follows
        _call(mw, "/pause")
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("401 POST '/collective_rpc\\nFAKE LINE' from 10.9.8.7:5555")
    assert len(lines) == tbhpc_auth.LOG_BURST + 2
    assert "refused 11 more requests" in lines[-2]
    assert not any(token in line for line in lines)


def test_a_server_without_its_token_file_does_not_start(tmp_path, monkeypatch):
    monkeypatch.delenv(tbhpc_auth.TOKEN_ENV, raising=False)
    with pytest.raises(RuntimeError, match="TBHPC_TOKEN_FILE is not set"):
        tbhpc_auth.RequireRunToken(None)
    (tmp_path / "empty").write_text("")
    with pytest.raises(RuntimeError, match="holds no token"):
        tbhpc_auth.RequireRunToken(None, str(tmp_path / "empty"))


def test_the_leak_check_finds_a_token_in_logs_duckdb_and_hdf5(tmp_path):
    """tests/helpers.token_leaks, which the Slurm tests run over whole run directories, can fail."""
    import duckdb
    import h5py
    from helpers import token_leaks
    token = read_token(ensure_token(tmp_path))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.log").write_text("nothing here\n")
    con = duckdb.connect(str(tmp_path / "results.duckdb"))
    con.execute("CREATE TABLE t AS SELECT 'x' || range AS s FROM range(5000)")
    con.close()
    with h5py.File(tmp_path / "rollouts.h5", "w") as f:
        f.create_dataset("ids", data=[1, 2, 3], compression="gzip")
    assert token_leaks(tmp_path) == []
    (tmp_path / "logs" / "b.log").write_text(f"Authorization: Bearer {token}\n")
    con = duckdb.connect(str(tmp_path / "results.duckdb"))
    con.execute("INSERT INTO t VALUES (?)", [json.dumps({"api_key": token})])
    con.close()
    with h5py.File(tmp_path / "rollouts.h5", "a") as f:
        f.create_dataset("meta", data=[token.encode()], compression="gzip")
    assert sorted(token_leaks(tmp_path)) == sorted([str(tmp_path / "logs" / "b.log"), f"{tmp_path / 'results.duckdb'}: table t",
                                                    f"{tmp_path / 'rollouts.h5'}: meta"])


def test_a_server_outside_slurm_listens_on_loopback_unless_told(tmp_path):
    from tbhpc.launch.sbatch import render_serve
    from tbhpc.serve.command import vllm_argv
    from tbhpc.serve.config import ServeConfig
    argv = vllm_argv(ServeConfig(model="/m"), "/m", 8000)
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert "--api-key" not in argv and not any(read_token(ensure_token(tmp_path)) in a for a in argv)
    script = render_serve(str(tmp_path), str(tmp_path / "serve.yaml"), ServeConfig(model="/m").slurm, "/work")
    assert "host=0.0.0.0" in script and "server.token" not in script    # a Slurm job: other nodes reach it, with the token
