"""Transcripts: stored with every attempt, shared parts by reference, round-tripped exactly, shown."""
import json
import subprocess
import sys

import duckdb
import pytest

from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.runner import run_campaign
from tbhpc.errors import UserError
from tbhpc.store.attempts import read_attempt
from tbhpc.store.blobs import put_blob
from tbhpc.store.transcripts import compact, expand

EVERY_SHAPE = [
    {"role": "system", "content": "You are an agent.\n\nDomain rules: ünïcödé, quotes \" and \\ backslashes."},
    {"role": "user", "content": "I want a refund for order O1."},
    {"role": "assistant", "content": "", "reasoning": "Look the order up first.",
     "tool_calls": [{"id": "call_1_0", "type": "function", "function": {"name": "get_order", "arguments": "{\"order_id\": \"O1\"}"}},
                    {"id": "call_1_1", "type": "function", "function": {"name": "get_customer", "arguments": "{}"}}]},
    {"role": "tool", "tool_call_id": "call_1_0", "name": "get_order", "content": "{\"id\": \"O1\", \"total\": 12.5}"},
    {"role": "tool", "tool_call_id": "call_1_1", "name": "get_customer", "content": "{\"error\": \"missing customer_id\", \"tool\": \"get_customer\"}"},
    {"role": "assistant", "content": "Which email is on the account?"},
    {"role": "user", "content": "ann@example.com"},
    {"role": "assistant", "content": None, "tool_calls": [{"id": "call_3_0", "type": "function",
                                                           "function": {"name": "issue_refund", "arguments": "not json {"}}]},
    {"role": "tool", "tool_call_id": "call_3_0", "name": "issue_refund", "content": ""},
    {"role": "assistant", "content": "Refunded 12.50 USD. <DONE>"},
]
TOOLS = [{"type": "function", "function": {"name": "get_order", "description": "d", "parameters": {"type": "object"}}}]


@pytest.mark.parametrize("by_reference", [True, False])
def test_every_role_and_tool_call_shape_round_trips_exactly(tmp_path, by_reference):
    judge = [{"question": "Does it say refunded?", "yes": True}]
    blob_dir = tmp_path / "blobs" if by_reference else None
    text = compact(EVERY_SHAPE, TOOLS, "done", judge, blob_dir)
    blobs = {p.stem: p.read_text() for p in (tmp_path / "blobs").glob("*.json")} if by_reference else {}
    assert len(blobs) == (2 if by_reference else 0)
    assert ("You are an agent" in text) == (not by_reference)       # by reference: not copied into the row
    back = expand(text, blobs.get)
    assert back == {"messages": EVERY_SHAPE, "tools": TOOLS, "finish": "done", "judge": judge}
    assert put_blob(tmp_path / "b2", TOOLS) == put_blob(tmp_path / "b2", json.loads(json.dumps(TOOLS)))   # content-addressed


def test_a_campaign_stores_each_attempt_and_show_reads_it_back(tmp_path, tasks_by_id):
    from tbhpc.domains import get_domain
    from tbhpc.env.episode import run_episode
    from tbhpc.env.judge import KeywordJudge
    from tbhpc.env.users import ScriptedUser
    from tbhpc.policy.scripted import OraclePolicy
    cfg = CampaignConfig(name="t", split="eval", limit=10, repeats=2, policy_opts={"skill": 0.6, "ask": True})
    run_campaign(cfg, tmp_path / "run")
    db = tmp_path / "run" / "results.duckdb"
    con = duckdb.connect(str(db), read_only=True)
    n, with_tr, blobs = con.execute("SELECT count(*), count(transcript), (SELECT count(*) FROM blobs) FROM attempts").fetchone()
    task_id = con.execute("SELECT task_id FROM attempts WHERE NOT passed ORDER BY task_id LIMIT 1").fetchone()[0]
    con.close()
    assert n == with_tr == 20 and 1 <= blobs <= 2 * 5       # one system prompt and one tool list per domain
    row = read_attempt(db, task_id)
    assert row["passed"] is False                            # the default is the task's first failed attempt
    task = tasks_by_id[task_id]
    again = run_episode(task, get_domain(task.domain), OraclePolicy(skill=0.6, ask=True), ScriptedUser(), KeywordJudge(),
                        seed=_seed(task_id, row["attempt_index"]))
    assert row["transcript"]["messages"] == again.messages and row["transcript"]["tools"] == again.tools
    cli = [sys.executable, "-m", "tbhpc.cli", "show", str(tmp_path / "run"), task_id]
    text = subprocess.run(cli, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0 and f"task {task_id} attempt {row['attempt_index']}" in text.stdout
    assert "[USER] " + task.query in text.stdout and "reward=0.0" in text.stdout
    as_json = json.loads(subprocess.run(cli + ["--format", "json", "--attempt", "1"], capture_output=True, text=True).stdout)
    assert as_json["attempt_index"] == 1 and as_json["transcript"]["messages"][0]["role"] == "system"
    for args, what in (([str(tmp_path / "run"), "no-such-task"], "no attempt of task 'no-such-task'"),
                       ([str(tmp_path / "run"), task_id, "--attempt", "7"], "has attempts 0-1; no attempt 7")):
        bad = subprocess.run([sys.executable, "-m", "tbhpc.cli", "show", *args], capture_output=True, text=True)
        assert bad.returncode == 2 and what in bad.stderr and bad.stderr.count("\n") == 1


def _seed(task_id: str, index: int) -> int:
    from tbhpc.campaign.worker import attempt_seed
    return attempt_seed(0, task_id, index)


def test_read_attempt_of_a_run_without_transcripts_says_so(tmp_path):
    from tbhpc.store.run_dir import RunDir
    from tbhpc.store.merge import connect
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    con = connect(run)
    con.execute("INSERT INTO attempts (campaign, task_id, attempt_index, policy_id, status, passed) "
                "VALUES ('c', 't', 0, 'p', 'ok', true)")
    con.close()
    row = read_attempt(run.db, "t")
    assert row["transcript"] is None and row["attempt_index"] == 0
    with pytest.raises(UserError, match="no attempt of task 'u'"):
        read_attempt(run.db, "u")


def test_many_threads_writing_the_same_blob_at_once_all_succeed(tmp_path):
    """Episodes in flight share a process: their first attempts of a domain write the same blob
    together (a shared temporary name lost the race 16 times in 20 here)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor
    value = {"tools": ["x" * 2_000_000]}
    for trial in range(10):
        start = threading.Barrier(8)
        folder = tmp_path / str(trial)

        def write(_):
            start.wait()
            return put_blob(folder, value)
        with ThreadPoolExecutor(8) as pool:
            refs = set(pool.map(write, range(8)))
        assert len(refs) == 1 and [p.name for p in folder.iterdir()] == [f"{refs.pop()}.json"]
