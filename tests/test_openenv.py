"""OpenEnv both ways, on loopback: `tbhpc openenv-serve` (OpenEnv's own server classes, in
.venv-openenv) driven by tbhpc's episode loop through `tbhpc.openenv.remote`, and by OpenEnv's own
client classes. `make test` builds .venv-openenv and sets TBHPC_REQUIRE_OPENENV=1, so these fail,
never skip, when it is missing.

The misbehaving environments below are small WebSocket servers written here (real sockets): they
stand in for a broken third-party environment, which is what the error paths are about."""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import threading
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tbhpc.domains import get_domain
from tbhpc.env.episode import run_episode
from tbhpc.env.users import ScriptedUser
from tbhpc.openenv.launch import Launched, OpenEnvSpec
from tbhpc.openenv.remote import OpenEnvEnvironment
from tbhpc.policy.scripted import NoopPolicy, OraclePolicy

REPO = Path(__file__).resolve().parents[1]


def openenv_python() -> str:
    return os.environ.get("TBHPC_OPENENV_PYTHON") or str(REPO / ".venv-openenv" / "bin" / "python")


def require_openenv() -> None:
    if not Path(openenv_python()).exists():
        if os.environ.get("TBHPC_REQUIRE_OPENENV"):
            pytest.fail(f"TBHPC_REQUIRE_OPENENV is set but {openenv_python()} does not exist (make env-openenv)")
        pytest.skip("no OpenEnv environment (run `make env-openenv`)")


def start_server(*args: str) -> Launched:
    """`tbhpc openenv-serve ARGS` on a free port, once /health answers (stop() ends it by PID)."""
    require_openenv()
    return Launched(OpenEnvSpec(launch=shlex.join([openenv_python(), "-m", "tbhpc.cli", "openenv-serve", *args]) + " --port {port}"))


@pytest.fixture(scope="module")
def served():
    server = start_server("default", "--max-sessions", "32")
    yield server.url
    server.stop()


def _key(r):
    g = r.grade or {}
    return (r.status, r.reward, r.passed, r.finish_reason, r.tool_calls, r.tool_errors, r.user_turns,
            g.get("final_hash"), g.get("golden_hash"), g.get("state_match"), tuple(g.get("output_missing") or ()))


def test_every_task_gives_the_same_verdict_and_final_state_through_openenv(served, pack_tasks):
    """The whole bundled pack, oracle and noop, in process and through the OpenEnv server
    (8 sessions at a time): identical verdicts, final-state hashes and transcripts."""
    remote = OpenEnvEnvironment(served)

    def both(job):
        task, policy = job
        local = run_episode(task, get_domain(task.domain), policy, ScriptedUser())
        there = run_episode(task, remote, policy, ScriptedUser())
        return task.id, policy.name, local, there

    jobs = [(t, p) for t in pack_tasks for p in (OraclePolicy(), NoopPolicy())]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(both, jobs))
    diffs = [(tid, name, _key(a), _key(b)) for tid, name, a, b in results if _key(a) != _key(b)]
    assert not diffs, diffs[:3]
    for tid, name, a, b in results:
        assert a.messages == b.messages and a.tools == b.tools, (tid, name)
    verdicts = {name: sum(a.passed for _, n, a, _ in results if n == name) for name in ("oracle", "noop")}
    assert verdicts["oracle"] == len(pack_tasks) and verdicts["noop"] < len(pack_tasks) // 4, verdicts


def test_concurrent_sessions_writing_the_same_rows_stay_isolated(served, pack_tasks):
    """16 sessions on one task at once, half replaying its golden writes and half doing nothing:
    every writer passes with the golden hash, every idle one fails with the initial-state hash."""
    task = next(t for t in pack_tasks if len([c for c in t.golden_calls if get_domain(t.domain).tools[c.tool].mutates]) >= 2)
    remote = OpenEnvEnvironment(served)
    barrier = threading.Barrier(16)

    class Gated:
        """The oracle or noop, each first waiting until all 16 sessions are open."""
        def __init__(self, inner):
            self.inner, self.name = inner, inner.name

        def session(self, t, seed=0):
            s = self.inner.session(t, seed=seed)
            barrier.wait(timeout=60)
            return s

    with ThreadPoolExecutor(16) as pool:
        runs = list(pool.map(lambda i: run_episode(task, remote, Gated(OraclePolicy() if i % 2 else NoopPolicy()),
                                                   ScriptedUser()), range(16)))
    local_pass = run_episode(task, get_domain(task.domain), OraclePolicy(), ScriptedUser())
    local_noop = run_episode(task, get_domain(task.domain), NoopPolicy(), ScriptedUser())
    for i, r in enumerate(runs):
        want = local_pass if i % 2 else local_noop
        assert r.status == "ok" and r.passed == want.passed, (i, r.error)
        assert r.grade["final_hash"] == want.grade["final_hash"]


def test_openenvs_own_client_drives_the_server(served, pack_tasks):
    """OpenEnv's MCPToolClient (HTTP /mcp + /ws, in .venv-openenv): reset by task id, list the
    tools, replay the golden calls, talk to the user, finish; a second session does nothing."""
    task = next(t for t in pack_tasks if t.golden_calls and "- " in t.user_context)
    script = textwrap.dedent("""
        import json, sys
        from openenv.core.mcp_client import MCPToolClient
        task = json.loads(sys.argv[2])
        out = {}
        with MCPToolClient(base_url=sys.argv[1]).sync() as env:
            first = env.reset(task_id=task["id"])
            out["first"] = first.observation.model_dump()
            out["tools"] = [t.name for t in env.list_tools()]
            out["outputs"] = [env.call_tool(c["tool"], **c["parameters"]) for c in task["calls"]]
            out["reply"] = env.call_tool("submit_message", text="Could you confirm, shall I proceed?")
            out["finish"] = env.call_tool("finish", message=task["final"], reason="done")
            out["state"] = env.state().model_dump()
        with MCPToolClient(base_url=sys.argv[1]).sync() as env:
            env.reset(task_id=task["id"])
            out["noop"] = env.call_tool("finish", message="Nothing to do. <DONE>")
        print(json.dumps(out, default=str))
    """)
    payload = {"id": task.id, "final": task.golden_response + " <DONE>",
               "calls": [{"tool": c.tool, "parameters": dict(c.parameters)} for c in task.golden_calls]}
    p = subprocess.run([openenv_python(), "-c", script, served, json.dumps(payload)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["first"]["task_id"] == task.id and out["first"]["message"] == task.query
    assert out["tools"][-1] == "submit_message" and "finish" not in out["tools"]
    assert set(c.tool for c in task.golden_calls) <= set(out["tools"])
    assert all(o["error"] is None and o["done"] is False for o in out["outputs"])
    assert out["reply"]["result"]["reply"] == "Yes, please go ahead."
    fin = out["finish"]
    assert fin["done"] is True and fin["reward"] == 1.0 and fin["metadata"]["reward_type"] == "pass"
    assert fin["result"]["grade"]["final_hash"] == fin["result"]["grade"]["golden_hash"]
    noop = out["noop"]
    assert noop["done"] is True and noop["reward"] == 0.0 and noop["metadata"]["reward_type"] == "fail"
    assert noop["result"]["grade"]["state_match"] is False or noop["result"]["grade"]["output_missing"]


def test_a_thinkingbox_format_source_gives_the_same_verdicts_through_openenv(tmp_path, pack_tasks):
    """The MCP path: built-in tasks exported as a ThinkingBox data directory (servers are real
    `tbhpc mcp-serve` processes), run through tbhpc's MCP client here and through the OpenEnv
    server (whose MCP client runs on the SDK openenv pins): the same verdicts and final states."""
    pytest.importorskip("mcp")
    import yaml

    from tbhpc.env.registry import Environments
    from tbhpc.tb.dataset import TBDataset
    from tbhpc.mcp.export import write_dataset
    writes = lambda t: any(get_domain(t.domain).tools[c.tool].mutates for c in t.golden_calls)   # noqa: E731
    originals = [t for t in pack_tasks if t.split == "eval" and t.domain == "retail" and writes(t)][:3]
    root = write_dataset(originals, tmp_path / "tbdata")
    ids = yaml.safe_load((root / "testlist.yaml").read_text())
    tasks = TBDataset(root).tasks(ids)
    server = start_server(f"tb:{root}", "--servers", str(root / "servers.yaml"))
    envs = Environments(root / "servers.yaml")
    try:
        remote = OpenEnvEnvironment(server.url)
        for task in tasks:
            for policy in (OraclePolicy(), NoopPolicy()):
                here = run_episode(task, envs.for_task(task), policy, ScriptedUser())
                there = run_episode(task, remote, policy, ScriptedUser())
                assert here.status == there.status == "ok", (here.error, there.error)
                assert _key(here) == _key(there), (task.id, policy.name)
                assert here.passed == (policy.name == "oracle")
    finally:
        envs.close()
        server.stop()


def test_training_rollouts_run_on_an_openenv_environment(served, warm_dir, tasks_by_id):
    """The trainer's rank rollouts with `environment: openenv` (the real warm model, token-exact):
    the environment's tools reach the prompt and every episode is graded there, 0 or 1."""
    import yaml

    from helpers import warm_rank_rollouts
    from tbhpc.env.registry import Environments
    ids = yaml.safe_load((REPO / "jobs/pools/smoke.yaml").read_text())["tasks"][:2]
    envs = Environments(openenv=OpenEnvSpec(url=served))
    try:
        tok, rollouts = warm_rank_rollouts(warm_dir, ids, {i: tasks_by_id[i] for i in ids}, envs.for_task)
    finally:
        envs.close()
    assert rollouts and all(r.result.status == "ok" and r.episode.reward in (0.0, 1.0) for r in rollouts)
    for r in rollouts:
        task = tasks_by_id[r.episode.task_id]
        prompt = tok.decode(r.episode.tokens[r.episode.loss_mask == 0][:4000].tolist())
        assert all(name in prompt for name in get_domain(task.domain).scenario.tools)
        assert r.result.grade["final_hash"] and r.episode.loss_mask.sum() > 0


def test_a_campaign_on_a_launched_environment_records_what_the_local_one_does(tmp_path):
    """`environment: openenv` with `launch`: the worker starts `tbhpc openenv-serve` itself, stops it
    when done, and the DuckDB rows (a noisy oracle: passes and fails) equal the in-process campaign's."""
    import duckdb

    from tbhpc.campaign.config import CampaignConfig
    from tbhpc.campaign.runner import run_campaign
    require_openenv()
    common = dict(name="oe", limit=8, repeats=2, chunk_size=4, policy_opts={"skill": 0.6})
    launch = f"{openenv_python()} -m tbhpc.cli openenv-serve default --max-sessions 7 --port {{port}}"   # 7: this test's mark
    local = run_campaign(CampaignConfig(**common), tmp_path / "local")
    there = run_campaign(CampaignConfig(**common, environment="openenv", openenv={"launch": launch}), tmp_path / "remote")
    assert (there.planned, there.ok, there.system_errors) == (local.planned, local.ok, 0) == (16, 16, 0)
    q = ("SELECT task_id, attempt_index, reward, passed, status, finish_reason, tool_calls, final_hash, golden_hash "
         "FROM attempts ORDER BY task_id, attempt_index")
    rows = [duckdb.connect(str(tmp_path / r / "results.duckdb"), read_only=True).execute(q).fetchall() for r in ("local", "remote")]
    assert rows[0] == rows[1] and 0 < sum(r[3] for r in rows[0]) < 16
    left = subprocess.run(["pgrep", "-f", "openenv-serve default --max-sessions 7 --port"], capture_output=True, text=True).stdout.split()
    assert not left, f"the launched server outlived its campaign: {left}"


def test_the_task_api_lists_what_is_served_and_a_campaign_asking_for_more_is_one_line(served, pack_tasks, tmp_path):
    from tbhpc.campaign.config import CampaignConfig
    from tbhpc.campaign.runner import run_campaign
    from tbhpc.errors import UserError
    from tbhpc.openenv.remote import served_task_ids
    assert served_task_ids(served) == {t.id for t in pack_tasks}
    with urllib.request.urlopen(served + "/tbhpc/splits") as r:
        assert {s["name"] for s in json.loads(r.read())} == {"train", "eval", "all"}
    cfg = CampaignConfig(name="oe", pack="demo", limit=3, environment="openenv", openenv={"url": served})
    with pytest.raises(UserError, match=r"field 'openenv': 3 task\(s\) are not served by the environment at .* "
                                        r"\(first: demo_.*; it serves 612\)"):
        run_campaign(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_short_trl_grpo_loop_trains_through_the_server(served, pack_tasks, tmp_path):
    """TRL's GRPOTrainer with `environment_factory` (tbhpc.openenv.trl), 2 steps on CPU with the
    demo model: TRL's own tool loop calls the served tools and takes the server's verdicts."""
    pytest.importorskip("trl")
    import os as _os
    _os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer
    from trl.chat_template_utils import qwen3_template

    from tbhpc.openenv.trl import environment_factories, trl_dataset
    ids = [t.id for t in pack_tasks if t.domain == "retail" and t.golden_calls][:4]
    rows, tools = trl_dataset(served, ids)
    assert {r["environment"] for r in rows} == {"retail"} and rows[0]["prompt"][1]["content"] == pack_tasks[
        [t.id for t in pack_tasks].index(ids[0])].query
    factories = environment_factories(served, tools)
    probe = factories["retail"]()
    assert "get_order" in dir(probe) and "submit_message" in dir(probe) and "finish" not in dir(probe)
    probe.reset(task_id=ids[0])
    assert "O" in probe.get_order(order_id="O2001") and probe.get_reward() in (0.0, 1.0)
    tok = AutoTokenizer.from_pretrained(REPO / "models/demo-pack-warm")
    tok.response_template = qwen3_template         # the demo model's template speaks Qwen3's tool-call format
    model = AutoModelForCausalLM.from_pretrained(REPO / "models/demo-pack-warm", dtype=torch.float32)
    args = GRPOConfig(output_dir=str(tmp_path / "trl"), per_device_train_batch_size=4, num_generations=4,
                      max_completion_length=64, max_steps=2, learning_rate=1e-5, logging_steps=1, save_strategy="no",
                      report_to="none", use_cpu=True, bf16=False, fp16=False, max_tool_calling_iterations=3, seed=0)
    trainer = GRPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(rows), processing_class=tok,
                          environment_factory=factories)
    trainer.train()
    logged = [h for h in trainer.state.log_history if any(k.startswith("rewards/OpenEnv_retail") for k in h)]
    assert len(logged) == 2, trainer.state.log_history
    assert all(0.0 <= h["rewards/OpenEnv_retail/mean"] <= 1.0 for h in logged)


def test_a_training_run_on_a_launched_environment_reaches_the_in_process_weights(warm_dir, tmp_path):
    """`tbhpc train` with `environment: openenv` (the in-process generator, whose samples are a
    function of weights and seed): the environment gives the same observations and verdicts, so
    a step through OpenEnv ends at exactly the weights of a step in process."""
    from helpers import checkpoint_weights
    require_openenv()
    (tmp_path / "pool.yaml").write_text("tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n")
    small = [f"model={warm_dir}", f"pool={tmp_path / 'pool.yaml'}", "generator=local", "steps=1", "group_size=4",
             "groups_per_step=2", "max_draws=8", "max_tokens=48", "response_budget=160", "lr=1e-4",
             "microbatch_tokens=4096", "seed=3"]
    launch = f"openenv={{launch: '{openenv_python()} -m tbhpc.cli openenv-serve default --max-sessions 9 --port {{port}}'}}"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    runs = {}
    for name, extra in (("local", []), ("openenv", ["environment=openenv", launch])):
        p = subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", str(tmp_path / name), *small, *extra], cwd=REPO,
                           env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=900)
        assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
        runs[name] = checkpoint_weights(next((tmp_path / name / "exports").glob("step-000001")))
    left = subprocess.run(["pgrep", "-f", "openenv-serve default --max-sessions 9 --port"], capture_output=True, text=True).stdout.split()
    assert not left, f"the launched server outlived the trainer (which ends with os._exit): {left}"
    import numpy as np
    assert runs["local"].keys() == runs["openenv"].keys()
    assert all(np.array_equal(runs["local"][k], runs["openenv"][k]) for k in runs["local"]), "weights differ"
    warm = checkpoint_weights(Path(warm_dir))
    assert any(not np.array_equal(runs["local"][k], warm[k]) for k in warm if k in runs["local"]), "the step learned nothing"


def test_openenvs_deployment_entry_point_serves_the_pack(pack_tasks):
    """`uvicorn --factory tbhpc.openenv.server:app_from_env` (what a uv project or a Dockerfile runs,
    examples/openenv_env): a launched server that gives the in-process verdicts."""
    require_openenv()
    server = Launched(OpenEnvSpec(launch=f"env TBHPC_OPENENV_PACK=default TBHPC_OPENENV_MAX_SESSIONS=4 {openenv_python()} "
                                         "-m uvicorn --factory tbhpc.openenv.server:app_from_env --host 127.0.0.1 --port {port}"))
    try:
        remote = OpenEnvEnvironment(server.url)
        for task in pack_tasks[:20]:
            here = run_episode(task, get_domain(task.domain), OraclePolicy(), ScriptedUser())
            there = run_episode(task, remote, OraclePolicy(), ScriptedUser())
            assert _key(here) == _key(there), task.id
    finally:
        server.stop()
    assert server.proc.poll() is not None


def test_a_uv_launched_environment_project_gives_the_in_process_verdicts(pack_tasks, monkeypatch):
    """`openenv: {uv_project: examples/openenv_env}`: OpenEnv's uv launch (`uv run --isolated
    --project DIR -- uvicorn server.app:app`) of an environment project that serves the bundled
    pack; uv resolves the project's own environment (from the package index; cached after the first run)."""
    import shutil

    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    if shutil.which("uv") is None:
        if os.environ.get("TBHPC_REQUIRE_OPENENV"):
            pytest.fail("TBHPC_REQUIRE_OPENENV is set but uv is not installed (the test extra pins it)")
        pytest.skip("no uv (pip install -e '.[test]')")
    server = Launched(OpenEnvSpec(uv_project=str(REPO / "examples/openenv_env"), start_timeout_s=600))
    try:
        remote = OpenEnvEnvironment(server.url)
        for task in pack_tasks[:20]:
            for policy in (OraclePolicy(), NoopPolicy()):
                here = run_episode(task, get_domain(task.domain), policy, ScriptedUser())
                assert _key(here) == _key(run_episode(task, remote, policy, ScriptedUser())), (task.id, policy.name)
    finally:
        server.stop()
