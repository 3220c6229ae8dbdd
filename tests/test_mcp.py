"""ThinkingBox-format tasks on real stdio MCP server processes (`tbhpc mcp-serve`), end to end.

The fixtures are written here: built-in tasks exported as a ThinkingBox data directory (scenario
YAML, test-case .py files, a servers file). Every server is a real subprocess speaking MCP over
stdin/stdout; nothing is faked.
"""
import dataclasses
import os
import signal
import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest
import yaml

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.judge import KeywordJudge
from tbhpc.env.registry import Environments
from tbhpc.env.users import ScriptedUser
from tbhpc.errors import UserError
from tbhpc.mcp.client import ServerConnection, ServerSpec
from tbhpc.policy.scripted import OraclePolicy
from tbhpc.tb.dataset import TBDataset
from tbhpc.mcp.export import write_dataset

pytest.importorskip("mcp")


def _pick(pack_tasks):
    by_domain: dict[str, list] = {}
    for t in pack_tasks:
        if t.split == "eval" and t.domain in ("retail", "neobank") and not t.rubrics_yesno:
            by_domain.setdefault(t.domain, []).append(t)
    mutating = [t for t in by_domain["retail"] if len(t.golden_calls) >= 3][:3]
    return mutating + by_domain["neobank"][:3] + [next(t for t in pack_tasks if t.rubrics_yesno)]


@pytest.fixture(scope="module")
def tb(tmp_path_factory, pack_tasks):
    originals = _pick(pack_tasks)
    root = write_dataset(originals, tmp_path_factory.mktemp("tbdata"))
    ids = yaml.safe_load((root / "testlist.yaml").read_text())
    tasks = TBDataset(root).tasks(ids)
    envs = Environments(root / "servers.yaml")
    yield root, originals, tasks, envs
    envs.close()


def test_oracle_passes_through_real_servers_with_the_in_process_hashes(tb):
    root, originals, tasks, envs = tb
    for orig, task in zip(originals, tasks):
        if orig.rubrics_yesno:
            continue
        mcp = run_episode(task, envs.for_task(task), OraclePolicy(), ScriptedUser(), KeywordJudge())
        local = run_episode(orig, get_domain(orig.domain), OraclePolicy(), ScriptedUser(), KeywordJudge())
        assert (mcp.status, mcp.reward, mcp.finish_reason) == ("ok", 1.0, "done"), (task.id, mcp.error)
        assert mcp.grade["final_hash"] == local.grade["final_hash"] and mcp.tool_calls == local.tool_calls
        assert [m.get("content") for m in mcp.messages if m["role"] == "tool"] == \
               [m.get("content") for m in local.messages if m["role"] == "tool"]
    started = {name: p.started for name, p in envs._pools.items() if p.started}
    assert set(started) == {"retail", "neobank"}           # a pool starts processes only when its server is used
    assert all(n <= 2 for n in started.values()), started   # reuse: true -> one process serves attempt after attempt


def test_a_sabotaged_trajectory_fails_with_the_same_diff_as_in_process(tb):
    root, originals, tasks, envs = tb
    orig, task = originals[0], tasks[0]
    drop_last = OraclePolicy(calls=lambda t: list(t.golden_calls[:-1]))
    mcp = run_episode(task, envs.for_task(task), drop_last, ScriptedUser(), KeywordJudge())
    local = run_episode(orig, get_domain(orig.domain), drop_last, ScriptedUser(), KeywordJudge())
    assert mcp.status == "ok" and mcp.reward == 0.0 and not mcp.grade["state_match"]
    assert mcp.grade["diff"] and mcp.grade["diff"] == local.grade["diff"]
    assert mcp.grade["golden_hash"] == local.grade["golden_hash"]


def test_an_end_turn_tool_ends_the_episode_as_in_process(tb):
    """The scenario's `is_end_turn` (written by export-tb for the domain's transfer_to_human)."""
    from tbhpc.tasks.schema import GoldenCall
    root, originals, tasks, envs = tb
    orig, task = originals[0], tasks[0]
    customer = next(iter(orig.data_patch["customers"]))["id"]
    handoff = OraclePolicy(calls=lambda t: [GoldenCall("transfer_to_human", {
        "customer_id": customer, "reason": "customer_request", "summary": "wants a person"})])
    mcp = run_episode(task, envs.for_task(task), handoff, ScriptedUser(), KeywordJudge())
    local = run_episode(orig, get_domain(orig.domain), handoff, ScriptedUser(), KeywordJudge())
    assert mcp.finish_reason == local.finish_reason == "end_turn_tool"
    assert mcp.grade["final_hash"] == local.grade["final_hash"] and mcp.reward == local.reward == 0.0


def test_rubrics_are_judged_natively_on_the_final_message(tb):
    root, originals, tasks, envs = tb
    orig, task = originals[-1], tasks[-1]
    assert task.rubrics_yesno and task.golden_response == ""   # the format has no golden answer
    answered = dataclasses.replace(task, golden_response=orig.golden_response)
    good = run_episode(answered, envs.for_task(task), OraclePolicy(), ScriptedUser(), KeywordJudge())
    bare = run_episode(task, envs.for_task(task), OraclePolicy(), ScriptedUser(), KeywordJudge())
    assert good.reward == 1.0 and all(r["yes"] for r in good.grade["rubrics"])
    assert bare.reward == 0.0 and bare.grade["state_match"] and not all(r["yes"] for r in bare.grade["rubrics"])


def _servers(tmp_path: Path, name: str, command: list[str], **extra) -> Path:
    path = tmp_path / "servers.yaml"
    path.write_text(yaml.safe_dump({"servers": {name: {"command": command, **extra}}}))
    return path


def test_a_server_that_fails_or_hangs_is_a_system_error_never_a_zero(tb, tmp_path):
    root, originals, tasks, envs = tb
    task = tasks[0]
    crash = _servers(tmp_path, "retail", [sys.executable, "-c", "import sys; sys.stderr.write('boom: no licence\\n'); sys.exit(3)"])
    res = run_episode(task, Environments(crash).for_task(task), OraclePolicy(), ScriptedUser())
    assert (res.status, res.reward, res.error_kind) == ("system_error", None, "tool_server")
    assert res.error == "tool server retail: exited with status 3 before it was ready (stderr: boom: no licence)"
    hang = _servers(tmp_path, "retail", [sys.executable, "-c", "import time; time.sleep(30)"], startup_timeout_s=1.5)
    res = run_episode(task, Environments(hang).for_task(task), OraclePolicy(), ScriptedUser())
    assert res.status == "system_error" and "not ready after 2s" in res.error


def test_missing_servers_and_unoffered_tools_are_user_errors(tb, tmp_path):
    root, originals, tasks, envs = tb
    other = _servers(tmp_path, "travel", [sys.executable, "-m", "tbhpc.cli", "mcp-serve", "--domain", "travel"])
    with pytest.raises(UserError, match="needs tool server 'retail', which the servers file does not define"):
        run_episode(tasks[0], Environments(other).for_task(tasks[0]), OraclePolicy(), ScriptedUser())
    wrong = _servers(tmp_path, "retail", [sys.executable, "-m", "tbhpc.cli", "mcp-serve", "--domain", "travel"])
    with pytest.raises(UserError, match="is whitelisted but none of the scenario's servers"):
        run_episode(tasks[0], Environments(wrong).for_task(tasks[0]), OraclePolicy(), ScriptedUser())
    with pytest.raises(UserError, match="servers=FILE"):
        Environments(None).for_task(tasks[0])


def test_mcp_serve_speaks_the_reserved_protocol_to_any_client(pack_tasks):
    conn = ServerConnection(ServerSpec("neobank", sys.executable, ("-m", "tbhpc.cli", "mcp-serve", "--domain", "neobank")))
    try:
        conn.wait_ready()
        names = {t.name for t in conn.list_tools()}
        assert {"__reserved__init", "__reserved__geteffects", "__reserved__teardown"} <= names
        assert set(get_domain("neobank").all_tools) <= names
        text, err = conn.call("get_customer", {"customer_id": "x"}, 10)
        assert err and "call __reserved__init first" in text
        text, err = conn.call("__reserved__init", {"config": {"data_patch": {"no_such_table": [{"id": 1}]}}}, 10)
        assert err and "bad init config" in text
        task = next(t for t in pack_tasks if t.domain == "neobank" and t.data_patch)
        config = {"data_patch": task.data_patch, "sources": [{"name": "ignored.md", "snippets": ["x"]}],
                  "golden_test_case": {"tool_interactions": [c.to_dict() for c in task.golden_calls]}}
        assert conn.call("__reserved__init", {"config": config}, 10) == ("{}", False)
        effects = json.loads(conn.call("__reserved__geteffects", {}, 10)[0])
        assert set(effects) >= {"result_db_hash", "golden_db_hash", "diff"}
        assert conn.call("__reserved__teardown", {}, 10) == ("{}", False)
    finally:
        conn.close()


def test_eval_and_probe_campaigns_run_a_tb_source_and_select_accepts_it(tb, tmp_path):
    root, originals, tasks, envs = tb
    common = [f"pack=tb:{root}", f"tasks={root / 'testlist.yaml'}", f"servers={root / 'servers.yaml'}"]
    cli = [sys.executable, "-m", "tbhpc.cli"]
    out = subprocess.run(cli + ["probe", "--out", str(tmp_path / "probe"), *common, "repeats=4", "workers=2",
                                "policy_opts={skill: 0.7}"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    con = duckdb.connect(str(tmp_path / "probe" / "results.duckdb"), read_only=True)
    rows = con.execute("SELECT count(*), count(*) FILTER (WHERE status = 'ok') FROM attempts").fetchone()
    domains = {r[0] for r in con.execute("SELECT DISTINCT domain FROM attempts").fetchall()}
    con.close()
    assert rows == (len(tasks) * 4, len(tasks) * 4)
    assert domains == {"tbhpc_retail", "tbhpc_neobank", "tbhpc_consulting"}   # domain = scenario, as the reference
    sel = subprocess.run(cli + ["select", str(tmp_path / "probe"), "--out", str(tmp_path / "pool.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert sel.returncode == 0, sel.stderr[-2000:]
    pool = yaml.safe_load((tmp_path / "pool.yaml").read_text())
    assert set(pool["tasks"]) <= {t.id for t in tasks}
    bad = subprocess.run(cli + ["eval", "--out", str(tmp_path / "e"), f"pack=tb:{root}", f"tasks={root / 'testlist.yaml'}"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "servers=FILE" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "e").exists()     # refused before anything was written


def test_training_rollouts_and_the_pool_guard_take_tb_tasks_unchanged(tmp_path, warm_dir, tasks_by_id):
    """The trainer's rank rollouts on MCP-served tasks (the real warm model, token-exact), and the
    benchmark-exclusion guard reading a ThinkingBox test list."""
    from helpers import warm_rank_rollouts
    from tbhpc.train.draw import load_pool
    smoke = yaml.safe_load((Path(__file__).resolve().parents[1] / "jobs/pools/smoke.yaml").read_text())["tasks"][:2]
    root = write_dataset([tasks_by_id[i] for i in smoke], tmp_path / "tbdata")
    ids = yaml.safe_load((root / "testlist.yaml").read_text())
    (tmp_path / "pool.yaml").write_text(yaml.safe_dump({"tasks": ids}))
    with pytest.raises(UserError, match=r"2 task\(s\) of the exclusion list .*testlist.yaml are in the pool \('tbhpc_"):
        load_pool(tmp_path / "pool.yaml", [str(root / "testlist.yaml")])
    assert load_pool(tmp_path / "pool.yaml", []) == ids
    envs = Environments(root / "servers.yaml")
    tasks = {t.id: t for t in TBDataset(root).tasks(ids)}
    try:
        tok, rollouts = warm_rank_rollouts(warm_dir, ids, tasks, envs.for_task)
    finally:
        envs.close()
    assert rollouts and all(r.result.status == "ok" and r.episode.reward in (0.0, 1.0) for r in rollouts)
    for r in rollouts:
        task = tasks[r.episode.task_id]
        prompt = tok.decode(r.episode.tokens[r.episode.loss_mask == 0][:4000].tolist())
        whitelisted = get_domain(task.domain.removeprefix("tbhpc_")).scenario.tools
        assert all(name in prompt for name in whitelisted)       # the servers' tool schemas reached the prompt
        assert r.episode.loss_mask.sum() > 0 and len(r.episode.tokens) == len(r.episode.logprobs)


def test_a_missing_policy_search_backend_is_said_once_and_recorded_per_attempt(tb, tmp_path):
    root, originals, tasks, envs = tb
    data = tmp_path / "data"
    import shutil
    shutil.copytree(root / "dataset", data / "dataset")
    scenario = data / "dataset/scenario/tbhpc_retail.yaml"
    doc = yaml.safe_load(scenario.read_text())
    doc["world_state"]["retail"]["sources"] = [{"name": "returns.md", "snippets": ["Returns within 30 days."]}]
    scenario.write_text(yaml.safe_dump(doc))
    servers = yaml.safe_load((root / "servers.yaml").read_text())
    servers["search"] = {"check": "http://127.0.0.1:9/health"}        # nothing listens on the discard port
    (data / "servers.yaml").write_text(yaml.safe_dump(servers))
    ids = [t.id for t in tasks if t.domain in ("tbhpc_retail", "tbhpc_neobank")]
    (data / "list.yaml").write_text(yaml.safe_dump(ids))
    out = subprocess.run([sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(tmp_path / "run"), f"pack=tb:{data}",
                          f"tasks={data / 'list.yaml'}", f"servers={data / 'servers.yaml'}", "workers=2"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stderr.count("does not answer: attempts run without policy search") == 1
    assert "attempt(s) of 3 task(s) ran with env_degraded = 'no_policy_search'" in out.stderr
    con = duckdb.connect(str(tmp_path / "run" / "results.duckdb"), read_only=True)
    got = dict(con.execute("SELECT domain, list(DISTINCT coalesce(env_degraded, '-')) FROM attempts GROUP BY 1").fetchall())
    passed = con.execute("SELECT bool_and(passed) FROM attempts").fetchone()[0]
    con.close()
    assert got == {"tbhpc_retail": ["no_policy_search"], "tbhpc_neobank": ["-"]}   # only tasks whose init had sources
    assert passed


def test_export_tb_then_validate_with_servers_from_the_command_line(tmp_path):
    cli = [sys.executable, "-m", "tbhpc.cli", "tasks"]
    out = subprocess.run(cli + ["export-tb", "--out", str(tmp_path / "x"), "--domain", "insurance", "--split", "eval"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "wrote 26 tasks" in out.stdout, out.stderr
    ok = subprocess.run(cli + ["validate", f"tb:{tmp_path / 'x'}", "--servers", str(tmp_path / "x" / "servers.yaml")],
                        capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and ok.stdout.startswith("OK: 26 tasks in 1 scenario(s)"), ok.stderr
    servers = tmp_path / "x" / "servers.yaml"
    servers.write_text(servers.read_text().replace("--domain\n    - insurance", "--domain\n    - retail"))
    bad = subprocess.run(cli + ["validate", f"tb:{tmp_path / 'x'}", "--servers", str(servers)],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "is whitelisted but none of the scenario's servers (insurance) offers it" in bad.stderr


class _KillServersMidEpisode:
    """The oracle, except that before its second completion it SIGKILLs this process's tool servers
    started since `spared` was taken (what a crashing server looks like from the client: the pipe
    closes mid-episode); other tests' servers are left alone."""

    name = "oracle-that-kills"

    def __init__(self):
        self.spared = set(_server_pids())

    def session(self, task, seed=0):
        inner = OraclePolicy().session(task, seed)
        calls = iter(range(1000))
        killer = self

        class S:
            def complete(self, messages, tools):
                if next(calls) == 1:
                    for pid in set(_server_pids()) - killer.spared:
                        os.kill(pid, signal.SIGKILL)
                return inner.complete(messages, tools)
        return S()


def _server_pids() -> list[int]:
    """This process's tool servers (each runs under a `sh` of ours that reports its exit status)."""
    me, parent, cmds = os.getpid(), {}, {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmds[int(stat.parent.name)] = (stat.parent / "cmdline").read_bytes()
        except OSError:
            continue
        parent[int(stat.parent.name)] = int(fields[1])
    return [pid for pid, cmd in cmds.items() if b"mcp-serve" in cmd and not cmd.startswith(b"/bin/sh\0")
            and me in (parent.get(pid), parent.get(parent.get(pid)))]


def test_a_server_that_dies_mid_episode_is_a_system_error_and_the_next_attempt_recovers(tb):
    root, originals, tasks, envs = tb
    task = next(t for t in tasks if len(t.golden_calls) >= 3)
    killer = _KillServersMidEpisode()
    fresh = Environments(root / "servers.yaml")
    try:
        dead = run_episode(task, fresh.for_task(task), killer, ScriptedUser(), KeywordJudge())
        assert (dead.status, dead.reward, dead.error_kind) == ("system_error", None, "tool_server"), dead.error
        again = run_episode(task, fresh.for_task(task), OraclePolicy(), ScriptedUser(), KeywordJudge())
        assert (again.status, again.reward) == ("ok", 1.0), again.error     # a dead process is never handed out again
    finally:
        fresh.close()
