"""`tbhpc sql`: one catalogue over every run under a folder; `tbhpc export --parquet`."""
import json
import subprocess
import sys
import time

import duckdb
import pytest

from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.runner import run_campaign
from tbhpc.errors import UserError
from tbhpc.store.catalogue import Catalogue


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    run_campaign(CampaignConfig(name="a", split="eval", limit=6, repeats=2), root / "oracle")
    run_campaign(CampaignConfig(name="b", split="eval", limit=6, repeats=2, policy="noop"), root / "sweep" / "noop")
    return root


def test_union_views_carry_the_run_and_see_runs_added_later(runs, tmp_path):
    cat = Catalogue(runs)
    rows = cat.sql("SELECT run, count(*), sum(reward) FROM attempts GROUP BY run ORDER BY run").fetchall()
    assert rows == [("oracle", 12, 12.0), ("sweep/noop", 12, 0.0)]
    assert cat.sql("SELECT count(*) FROM campaigns").fetchone()[0] == 2
    stats = cat.sql("SELECT run, campaign, count(*), sum(n), sum(c) FROM task_stats GROUP BY ALL ORDER BY run").fetchall()
    assert stats == [("oracle", "a", 6, 12, 12), ("sweep/noop", "b", 6, 12, 0)]     # each run's own tasks only
    run_campaign(CampaignConfig(name="c", split="eval", limit=3, repeats=1), runs / "late")
    assert cat.sql("SELECT count(DISTINCT run) FROM attempts").fetchone()[0] == 3     # same catalogue, new run seen
    cat.close()


def test_a_training_run_s_steps_join_the_catalogue(tmp_path):
    """train_steps has a `run` column of its own (the config's name, the `campaign` of the run's
    attempt rows): in the catalogue it is `campaign`, and `run` is the folder, as in every view."""
    from tbhpc.store.run_dir import RunDir
    from tbhpc.train.record import record_step
    run_campaign(CampaignConfig(name="probe", split="eval", limit=2, repeats=1), tmp_path / "probe")
    train = RunDir(tmp_path / "grpo")
    train.path.mkdir()
    for step in (1, 2):
        record_step(train, {"run": "train", "step": step, "reward_mean": 0.25 * step}, log=False)
    cat = Catalogue(tmp_path)
    assert cat.sql("SELECT run, campaign, step, reward_mean FROM train_steps ORDER BY step").fetchall() == [
        ("grpo", "train", 1, 0.25), ("grpo", "train", 2, 0.5)]
    assert cat.sql("SELECT run, count(*) FROM attempts GROUP BY run").fetchall() == [("probe", 2)]
    cat.close()


def test_a_run_being_written_is_waited_for_then_left_out_and_said(runs, tmp_path):
    import shutil
    root = tmp_path / "root"
    shutil.copytree(runs / "oracle", root / "busy")
    shutil.copytree(runs / "sweep" / "noop", root / "free")
    holder = subprocess.Popen([sys.executable, "-c", "import duckdb, sys, time; c = duckdb.connect(sys.argv[1]); "
                               "c.execute('SELECT 1'); print('held', flush=True); time.sleep(6)",
                               str(root / "busy" / "results.duckdb")], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"          # a writer (like a merge) holds the file
    cat = Catalogue(root, wait_s=1.0)
    t0 = time.monotonic()
    assert cat.sql("SELECT DISTINCT run FROM attempts").fetchall() == [("free",)]
    assert 1.0 <= time.monotonic() - t0 < 5.0 and len(cat.skipped) == 1 and cat.skipped[0].startswith("busy:")
    holder.wait(timeout=30)
    assert sorted(r[0] for r in cat.sql("SELECT DISTINCT run FROM attempts").fetchall()) == ["busy", "free"]
    cat.close()


def test_runs_of_an_older_schema_join_with_nulls(runs, tmp_path):
    old = tmp_path / "old" / "results.duckdb"
    old.parent.mkdir()
    con = duckdb.connect(str(old))
    con.execute("CREATE TABLE attempts (campaign VARCHAR, task_id VARCHAR, attempt_index INTEGER, policy_id VARCHAR, "
                "reward DOUBLE, status VARCHAR)")
    con.execute("INSERT INTO attempts VALUES ('x', 't1', 0, 'p', 1.0, 'ok')")
    con.close()
    import shutil
    shutil.copytree(runs / "oracle", tmp_path / "new")
    cat = Catalogue(tmp_path)
    rows = cat.sql("SELECT run, count(*), count(transcript), count(env_degraded) FROM attempts GROUP BY run ORDER BY run").fetchall()
    assert rows == [("new", 12, 12, 0), ("old", 1, 0, 0)]
    with pytest.raises(UserError, match="sql: .*no_such_table"):
        cat.sql("SELECT * FROM no_such_table")
    cat.close()
    only_old = Catalogue(tmp_path / "old")          # no transcripts anywhere: no tool_calls view, the rest works
    assert only_old.sql("SELECT count(*) FROM attempts").fetchone()[0] == 1
    with pytest.raises(UserError, match="sql: .*tool_calls"):
        only_old.sql("SELECT * FROM tool_calls")
    only_old.close()


def test_tool_calls_reads_both_transcript_formats(runs, tmp_path):
    import shutil

    from tbhpc.store.import_tb import import_files
    from tbhpc.store.merge import merge
    from tbhpc.store.run_dir import RunDir
    from tbhpc.store.shards import write_shard
    from tbhpc.store.transcripts import compact
    root = tmp_path / "root"
    shutil.copytree(runs / "oracle", root / "oracle")
    # the reference harness's format: a parallel call (one marked failed by the harness), then a single one
    call = {"T": "ToolCall", "name": "get_order", "arguments": {"order_id": "O-1"}, "id": "c1", "metadata": {}}
    bad = {**call, "id": "c2", "name": "bad", "arguments": {}, "metadata": {"error": "unknown tool bad"}}
    messages = [{"T": "Text", "role": "user", "content": "Refund O-1", "metadata": {}},
                {"T": "ParallelToolCall", "tool_calls": [call, bad], "metadata": {}},
                {"T": "ToolResponse", "name": "get_order", "content": '{"status": "delivered"}', "id": "c1", "metadata": {}},
                {"T": "ToolCall", "name": "refund", "arguments": {"order_id": "O-1"}, "id": "c3", "metadata": {}},
                {"T": "ToolResponse", "name": "refund", "content": "refunded", "id": "c3", "metadata": {}}]
    results = tmp_path / "tb.jsonl"
    results.write_text(json.dumps({"uid": "r.py:t1", "messages": messages, "test_result": {"result": False}}) + "\n")
    import_files([results], root / "imported")
    # tbhpc's own format, where the backend answered a call with a business error
    run = RunDir(root / "own")
    run.create({"name": "own"}, "h", {"campaign": "own", "kind": "eval", "policy_id": "p"},
               [{"task_id": "t", "domain": "retail", "split": "eval", "n_golden_calls": 1, "tags": [], "template": "x", "repeats": 1}])
    own = [{"role": "user", "content": "cancel O-9"},
           {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1_0", "type": "function", "function": {
               "name": "cancel_order", "arguments": '{"order_id": "O-9"}'}}]},
           {"role": "tool", "tool_call_id": "call_1_0", "name": "cancel_order",
            "content": '{"error": "no such order", "tool": "cancel_order"}'}]
    write_shard(run.shards, [{"campaign": "own", "task_id": "t", "attempt_index": 0, "policy_id": "p", "domain": "retail",
                              "status": "ok", "passed": False, "reward": 0.0, "transcript": compact(own, [], "done", [], None)}])
    merge(run)

    cat = Catalogue(root)
    got = [(r[0], r[1], r[2], r[3], json.loads(r[4]), r[5], r[6]) for r in cat.sql(
        "SELECT run, message, call_id, tool, arguments, output, error FROM tool_calls WHERE run <> 'oracle' "
        "ORDER BY run, message, call_id").fetchall()]
    assert got == [("imported", 1, "c1", "get_order", {"order_id": "O-1"}, '{"status": "delivered"}', None),
                   ("imported", 1, "c2", "bad", {}, None, "unknown tool bad"),
                   ("imported", 3, "c3", "refund", {"order_id": "O-1"}, "refunded", None),
                   ("own", 1, "call_1_0", "cancel_order", {"order_id": "O-9"},
                    '{"error": "no such order", "tool": "cancel_order"}', "no such order")]
    # every call in the oracle's transcripts, each answered, none failed
    calls = sum(len(m.get("tool_calls") or []) for (t,) in cat.sql("SELECT transcript FROM attempts WHERE run = 'oracle'").fetchall()
                for m in json.loads(t)["messages"])
    assert calls > 0 and cat.sql("SELECT count(*), count(output), count(error) FROM tool_calls WHERE run = 'oracle'").fetchone() == (calls, calls, 0)
    cat.close()


def test_sql_and_export_from_the_command_line(runs, tmp_path):
    cli = [sys.executable, "-m", "tbhpc.cli"]
    out = subprocess.run(cli + ["sql", str(runs), "SELECT run, avg(reward) AS p FROM attempts GROUP BY run ORDER BY run",
                                "--format", "json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = {r["run"]: r["p"] for r in json.loads(out.stdout)}
    assert got["oracle"] == 1.0 and got["sweep/noop"] == 0.0
    csv_out = subprocess.run(cli + ["sql", str(runs), "SELECT count(*) AS n FROM attempts WHERE run = 'oracle'", "--format", "csv"],
                             capture_output=True, text=True, timeout=60)
    assert csv_out.stdout.splitlines() == ["n", "12"]
    exp = subprocess.run(cli + ["export", str(runs / "oracle"), "--parquet", str(tmp_path / "pq")], capture_output=True, text=True)
    assert exp.returncode == 0, exp.stderr
    con = duckdb.connect()
    assert con.execute(f"SELECT count(*), count(transcript) FROM read_parquet('{tmp_path / 'pq' / 'attempts.parquet'}')").fetchone() == (12, 12)
    assert con.execute(f"SELECT count(*) FROM read_parquet('{tmp_path / 'pq' / 'task_stats.parquet'}')").fetchone() == (6,)
    bad = subprocess.run(cli + ["sql", str(tmp_path / "nowhere"), "SELECT 1"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "no such folder" in bad.stderr


def _checksums(root):
    import hashlib
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


HOSTILE_SQL = {
    "detach then attach writable and drop": "DETACH r0; ATTACH '{db}' AS w; DROP TABLE w.main.attempts",
    "attach writable": "ATTACH '{db}' AS w",
    "copy over the run's config": "COPY (SELECT 1 AS x) TO '{run}/config.yaml'",
    "export the database": "EXPORT DATABASE '{run}/dump'",
    "create a table": "CREATE TABLE t AS SELECT 1",
    "turn external access back on": "SET enable_external_access = true",
    "a query then a write": "SELECT 1; COPY (SELECT 1) TO '{run}/x.csv'",
    "install an extension": "INSTALL httpfs",
    "read any file as text": "SELECT * FROM read_text('/etc/hostname')",
    "read any file as csv": "SELECT * FROM read_csv('/etc/passwd')",
    "list any folder": "SELECT * FROM glob('/etc/*')",
    "read a file beside the runs": "SELECT * FROM read_text('{run}/config.yaml')",
}


@pytest.mark.parametrize("name", sorted(HOSTILE_SQL))
def test_sql_cannot_change_or_read_anything_but_the_runs(runs, tmp_path, name):
    import shutil
    root = tmp_path / "root"
    shutil.copytree(runs / "oracle", root / "oracle")
    before = _checksums(root)
    query = HOSTILE_SQL[name].format(db=root / "oracle" / "results.duckdb", run=root / "oracle")
    out = subprocess.run([sys.executable, "-m", "tbhpc.cli", "sql", str(root), query], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and out.stderr.startswith("tbhpc: error: sql: "), out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert _checksums(root) == before            # nothing changed, nothing written
    ok = subprocess.run([sys.executable, "-m", "tbhpc.cli", "sql", str(root), "SELECT count(*) AS n FROM attempts",
                         "--format", "csv"], capture_output=True, text=True, timeout=60)
    assert ok.stdout.splitlines() == ["n", "12"]      # and the run still reads


def test_the_query_forms_that_read_still_run(runs):
    cat = Catalogue(runs)
    assert cat.sql("DESCRIBE attempts").fetchall()[0][0] == "run"
    assert ("attempts",) in cat.sql("SHOW TABLES").fetchall()
    assert cat.sql("SUMMARIZE SELECT reward FROM attempts").fetchall()[0][0] == "reward"
    assert cat.sql("FROM attempts SELECT count(*)").fetchone()[0] >= 24
    assert cat.sql("EXPLAIN SELECT 1").fetchall()[0][0] == "physical_plan"
    with pytest.raises(UserError, match="empty"):
        cat.sql("  ;")
    with pytest.raises(UserError, match="Parser Error"):
        cat.sql("SELEC 1")
    cat.close()
