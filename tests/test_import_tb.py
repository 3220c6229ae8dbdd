"""Importing reference-harness results (`tb infer` JSONL) so every metric works on them."""
import json
import subprocess
import sys

import pytest

from tbhpc.campaign.validate import validate
from tbhpc.errors import UserError
from tbhpc.metrics.agg import load_counts, summarise
from tbhpc.store.import_tb import import_files
from tbhpc.store.run_dir import RunDir


def decode_result(uid, ok=True, system_error=False, test_error=False, scenario=True, cached=0):
    row = {"uid": uid, "finish_reason": "done", "is_system_error": system_error,
           "test_result": {"result": ok, "is_system_error": test_error},
           "usage": [{"input_tokens": 1000, "input_tokens_details": {"cached_tokens": cached},
                      "output_tokens": 200, "output_tokens_details": {"reasoning_tokens": 150}},
                     {"input_tokens": 1500, "output_tokens": 100}],
           "metadata": {"scenario": "sandbox_external_retail"} if scenario else {}}
    if system_error:
        row["metadata"]["error"] = "LLM 504 after retries"
    return row


@pytest.fixture
def sample(tmp_path):
    a = "sandbox_external_retail_group1.py:test_case_ST002_001"
    b = "sandbox_consulting_group1.py:test_case_C9"
    rows = [decode_result(a, True, cached=800), decode_result(a, False), decode_result(a, True),
            decode_result(b, True, scenario=False), decode_result(b, True, scenario=False),
            decode_result(b, None, system_error=True, scenario=False)]
    f1, f2 = tmp_path / "run1.jsonl", tmp_path / "run2.jsonl"
    f1.write_text("".join(json.dumps(r) + "\n" for r in rows[:4]))
    f2.write_text("\n".join(json.dumps(r) for r in rows[4:]) + "\n\n")
    return f1, f2, a, b


def test_import_maps_fields(sample, tmp_path):
    f1, f2, a, b = sample
    run, rep = import_files([f1, f2], tmp_path / "imported")
    assert rep.rows == 6 and not rep.quarantined and rep.reader == "typed"
    counts = load_counts(run)
    by = dict(zip(counts.task_ids.tolist(), zip(counts.domains.tolist(), counts.n.tolist(), counts.c.tolist())))
    assert by[a] == ("sandbox_external_retail", 3, 2)
    assert by[b] == ("sandbox_consulting_group1", 2, 2)  # no scenario: the file part of the uid
    assert counts.system_errors == 1
    assert counts.usage["agent"] == {"input": 6 * 2500, "cached": 800, "output": 6 * 300}
    val = validate(run)
    assert val.expected == 6 and len(val.system_errors) == 1 and not val.missing
    assert (rep.tasks, rep.system_errors) == (2, 1)      # what `tbhpc import-tb` prints, without a validation pass


def test_imported_runs_aggregate_and_refuse_when_incomplete(sample, tmp_path):
    f1, f2, a, b = sample
    imported = subprocess.run([sys.executable, "-m", "tbhpc.cli", "import-tb", str(f1), str(f2), "--out", str(tmp_path / "imp")],
                              capture_output=True, text=True)
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout == f"{tmp_path / 'imp'}: imported 6 attempt rows for 2 tasks (typed read); 1 system error(s)\n"
    cli = [sys.executable, "-m", "tbhpc.cli", "agg", str(tmp_path / "imp"), "--format", "json"]
    refused = subprocess.run(cli, capture_output=True, text=True)
    assert refused.returncode == 2 and "incomplete (1 system-error key(s))" in refused.stderr
    ok = subprocess.run(cli + ["--allow-incomplete"], capture_output=True, text=True)
    s = json.loads(ok.stdout)["summary"]
    assert s["pass@1"]["value"] == pytest.approx(4 / 5) and s["system_errors"] == 1
    assert summarise(load_counts(RunDir(tmp_path / "imp")), bootstrap=0)["k/k"]["count"] == 1


def test_bad_lines_stop_the_import_before_anything_is_written(tmp_path):
    f = tmp_path / "bad.jsonl"
    f.write_text(json.dumps(decode_result("x.py:t")) + "\n{broken\n")
    with pytest.raises(UserError, match=r"bad.jsonl: line 2: not valid JSON"):
        import_files([f], tmp_path / "out")
    assert not (tmp_path / "out").exists()
    f.write_text(json.dumps({"test_result": {"result": True}}) + "\n")
    with pytest.raises(UserError, match="line 1: missing string field 'uid'"):
        import_files([f], tmp_path / "out")


def test_select_works_on_imported_probes(sample, tmp_path):
    from tbhpc.cli import main
    f1, f2, a, b = sample
    import_files([f1, f2], tmp_path / "imp")
    excl = tmp_path / "bench_ids.txt"
    excl.write_text(b + "\n")
    assert main(["select", str(tmp_path / "imp"), "--out", str(tmp_path / "pool.yaml"), "--min-clean-runs", "2",
                 "--exclude", str(excl)]) == 0
    import yaml
    pool = yaml.safe_load((tmp_path / "pool.yaml").read_text())
    assert pool["tasks"] == [a]  # 2/3 clean successes -> easy; b is excluded by id


def test_fields_map_like_the_reference_reads_them(tmp_path):
    f = tmp_path / "r.jsonl"
    rows = [{"uid": "a.py:t1", "test_result": {"result": True, "reward": 0.25}, "usage": {"input_tokens": 7, "output_tokens": 3}},
            {"uid": "a.py:t1", "test_result": {"result": False, "error": "db differs"}, "usage": None},
            {"uid": "a.py:t1", "is_system_error": True, "metadata": {"error": "timeout"}},
            {"uid": "b.py:t2", "test_result": {"is_system_error": True, "result": False}, "finish_reason": "length"}]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run, rep = import_files([f], tmp_path / "imp")
    import duckdb
    con = duckdb.connect(str(run.db), read_only=True)
    got = con.execute("SELECT task_id, attempt_index, domain, reward, passed, status, error, agent_in, agent_out, "
                      "finish_reason FROM attempts ORDER BY task_id, attempt_index").fetchall()
    assert got == [("a.py:t1", 0, "a", 0.25, True, "ok", None, 7, 3, None),
                   ("a.py:t1", 1, "a", 0.0, False, "ok", "db differs", 0, 0, None),
                   ("a.py:t1", 2, "a", None, None, "system_error", "timeout", 0, 0, None),
                   ("b.py:t2", 0, "b", None, None, "system_error", None, 0, 0, "length")]
    assert rep.rows == 4 and [p["repeats"] for p in run.plan()] == [3, 1]
    assert rep.reader == "lenient"         # usage as one object: not the reference's list


@pytest.mark.parametrize("line, why", [
    ({"uid": "", "test_result": {"result": True}}, "missing string field 'uid'"),
    ({"uid": "a.py:t", "test_result": [True]}, "field 'test_result' must be an object"),
    ({"uid": "a.py:t", "test_result": {"result": True}, "usage": 12}, "field 'usage' must be a list of objects or an object"),
])
def test_malformed_fields_are_named_with_their_line(tmp_path, line, why):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(decode_result("x.py:t")) + "\n\n" + json.dumps(line) + "\n")
    with pytest.raises(UserError, match=f"r.jsonl: line 3: {why}"):
        import_files([f], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_bad_line_400000_stops_the_import_and_leaves_nothing(tmp_path):
    f = tmp_path / "big.jsonl"
    good = json.dumps(decode_result("sandbox_retail.py:test_x"))
    with open(f, "w") as fh:
        for i in range(1, 400_003):
            fh.write('{"uid": "half a line\n' if i == 400_000 else good + "\n")
    with pytest.raises(UserError, match=r"big.jsonl: line 400000: not valid JSON"):
        import_files([f], tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["big.jsonl"]      # no run, no temp database


def test_attempts_are_numbered_in_file_order_across_parallel_read_batches(tmp_path, monkeypatch):
    """The typed read runs in parallel and keeps file order only through its Parquet stage: 300,000
    lines, every uid's lines spread over the whole file (uid = line % 997), each carrying its own
    line number, read in ~1 MiB batches on 2 threads. Each uid's attempts must come out in line
    order, 0, 1, 2, ... (this fails if the stage is written without preserve_insertion_order)."""
    import duckdb

    import tbhpc.store.import_tb as imp
    monkeypatch.setattr(imp, "MAX_LINE_BYTES", 1 << 20)     # small read buffers: many batches
    f = tmp_path / "r.jsonl"
    duckdb.execute(f"""COPY (SELECT 's.py:t' || (i % 997) AS uid, 'line ' || i AS error,
                                   {{'result': i % 3 = 0, 'tb': 'AssertionError: ' || repeat('x', i % 50)}} AS test_result,
                                   [{{'input_tokens': i}}] AS usage
                            FROM range(300000) t(i)) TO '{f}' (FORMAT json)""")
    run, rep = import_files([f], tmp_path / "imp")
    assert rep.reader == "typed" and rep.rows == 300_000
    con = duckdb.connect(str(run.db), read_only=True)
    misplaced = con.execute("""SELECT count(*) FROM (SELECT attempt_index, agent_in,
                                   row_number() OVER (PARTITION BY task_id ORDER BY agent_in) - 1 AS by_line FROM attempts)
                               WHERE attempt_index <> by_line""").fetchone()[0]
    errors_match = con.execute("SELECT bool_and(error = 'line ' || agent_in) FROM attempts").fetchone()[0]
    assert misplaced == 0 and errors_match


@pytest.mark.parametrize("usage, reader", [([{"input_tokens": 3}], "typed"), ({"input_tokens": 3}, "lenient")])
def test_a_null_result_is_a_system_error_on_either_reader(tmp_path, usage, reader):
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps({"uid": "a.py:t", "test_result": {"result": None}, "usage": usage}) + "\n" +
                 json.dumps({"uid": "a.py:t", "test_result": {"result": True}, "usage": usage}) + "\n")
    run, rep = import_files([f], tmp_path / "imp")
    import duckdb
    got = duckdb.connect(str(run.db), read_only=True).execute(
        "SELECT attempt_index, status, passed, agent_in FROM attempts ORDER BY 1").fetchall()
    assert rep.reader == reader and got == [(0, "system_error", None, 3), (1, "ok", True, 3)]


def reference_conversation(query: str, answer: str) -> list[dict]:
    """A reference-harness conversation with every message type (thinkingbox.common.chat_types)."""
    call = {"T": "ToolCall", "name": "get_order", "arguments": {"order_id": "O-1", "full": True}, "id": "call_1",
            "metadata": {}}
    return [{"T": "Text", "role": "system", "content": "You are a support agent.", "metadata": {}},
            {"T": "Text", "role": "system", "content": "Retail policy: refunds within 30 days.", "metadata": {}},
            {"T": "Text", "role": "user", "content": query, "metadata": {}},
            {"T": "Text", "role": "assistant", "content": "I should look the order up.", "metadata": {"tag": "think"}},
            {"T": "ParallelToolCall", "tool_calls": [call, {**call, "id": "call_2", "name": "bad", "arguments": {},
                                                            "metadata": {"error": "unknown tool bad"}}], "metadata": {}},
            {"T": "ToolResponse", "name": "get_order", "content": '{"status": "delivered"}', "id": "call_1", "metadata": {}},
            {"T": "ToolCall", "name": "refund", "arguments": {"order_id": "O-1"}, "id": "call_3", "metadata": {}},
            {"T": "ToolResponse", "name": "refund", "content": "refunded", "id": "call_3",
             "metadata": {"direct_response": "Your refund is on its way."}},
            {"T": "Text", "role": "assistant", "content": "", "metadata": {"is_dummy": True}},
            {"T": "Text", "role": "assistant", "content": answer, "metadata": {}}]


@pytest.mark.parametrize("usage, reader", [([{"input_tokens": 3}], "typed"), ({"input_tokens": 3}, "lenient")])
@pytest.mark.parametrize("first_has_messages", [True, False])
def test_reference_conversations_become_transcripts_shown_by_show(tmp_path, usage, reader, first_has_messages):
    import duckdb

    from tbhpc.store.attempts import read_attempt
    tools = [{"name": "get_order", "description": "Look an order up", "input_schema": {"type": "object"}}]
    judged = {"judge_motivation": [{"question": "Did it confirm the refund?", "answer": False, "motivation": "no"}]}
    rows = [{"uid": "r.py:t1", "messages": reference_conversation("Refund O-1", "Done <DONE>"), "tools": tools,
             "test_result": {"result": True}, "usage": usage},
            {"uid": "r.py:t1", "messages": reference_conversation("Refund O-1 please", "Sorry"), "tools": tools,
             "finish_reason": "user_limit", "usage": usage,
             "test_result": {"result": False, "metadata": judged,
                             "tb": "Traceback ...\nAssertionError: orders.O-1.status: 'delivered' != 'refunded'"}},
            {"uid": "r.py:t2", "messages": [], "test_result": {"result": True}, "usage": usage}]
    if not first_has_messages:          # conversations only further down: found by the SQL pass
        rows = rows[2:] + rows[:2]
    f = tmp_path / "r.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    run, rep = import_files([f], tmp_path / "imp")
    assert rep.reader == reader
    con = duckdb.connect(str(run.db), read_only=True)
    assert con.execute("SELECT count(*) FROM blobs").fetchone()[0] == 2      # one system prompt, one tool list
    con.close()
    failed = read_attempt(run.db, "r.py:t1")            # the default: the first failed attempt
    assert failed["attempt_index"] == 1 and failed["finish_reason"] == "user_limit"
    assert json.loads(failed["diff"]) == ["Traceback ...\nAssertionError: orders.O-1.status: 'delivered' != 'refunded'"]
    tr = failed["transcript"]
    assert tr["finish"] == "user_limit"
    assert tr["judge"] == [{"question": "Did it confirm the refund?", "yes": False, "motivation": "no"}]
    assert tr["tools"] == [{"type": "function", "function": {"name": "get_order", "description": "Look an order up",
                                                             "parameters": {"type": "object"}}}]
    m = tr["messages"]
    assert [x["role"] for x in m] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant", "assistant"]
    assert m[0]["content"] == "You are a support agent.\n\nRetail policy: refunds within 30 days."
    assert m[1]["content"] == "Refund O-1 please"
    assert m[2]["reasoning"] == "I should look the order up."
    assert [(c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in m[2]["tool_calls"]] == \
        [("call_1", "get_order", {"order_id": "O-1", "full": True}), ("call_2", "bad", {})]
    assert m[2]["tool_calls"][1]["error"] == "unknown tool bad"
    assert m[3] == {"role": "tool", "tool_call_id": "call_1", "name": "get_order", "content": '{"status": "delivered"}'}
    assert m[6]["content"] == "Your refund is on its way." and m[7]["content"] == "Sorry"
    assert read_attempt(run.db, "r.py:t1", 0)["transcript"]["messages"][-1]["content"] == "Done <DONE>"
    assert read_attempt(run.db, "r.py:t2")["transcript"] is None          # no messages: no transcript
    shown = subprocess.run([sys.executable, "-m", "tbhpc.cli", "show", str(run.path), "r.py:t1"],
                           capture_output=True, text=True)
    assert shown.returncode == 0, shown.stderr
    for text in ("[USER] Refund O-1 please", "[ASSISTANT reasoning] I should look the order up.",
                 '[ASSISTANT -> get_order] {"order_id": "O-1", "full": true}', "[TOOL refund] refunded",
                 "rubric NO : Did it confirm the refund?", "'delivered' != 'refunded'"):
        assert text in shown.stdout, text


def test_a_lone_surrogate_in_a_conversation_does_not_stop_the_import(tmp_path):
    from tbhpc.store.attempts import read_attempt
    row = {"uid": "r.py:t", "test_result": {"result": True}, "usage": [{"input_tokens": 1}],
           "messages": [{"T": "Text", "role": "user", "content": "odd \ud800 text é", "metadata": {}}]}
    f = tmp_path / "r.jsonl"
    f.write_text(json.dumps(row) + "\n")          # ensure_ascii: the surrogate is an escape in the file
    run, _ = import_files([f], tmp_path / "imp")
    assert read_attempt(run.db, "r.py:t")["transcript"]["messages"][0]["content"] == "odd ? text é"


def test_a_line_duckdb_refuses_but_python_reads_is_imported_through_the_reduced_copy(tmp_path):
    import duckdb
    rows = [{"uid": "r.py:t", "test_result": {"result": True}, "usage": [{"input_tokens": 1}]},
            {"uid": "r.py:t", "test_result": {"result": False}, "error": "x \ud800 y"}]
    f = tmp_path / "r.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))       # DuckDB: "no low surrogate in string"
    run, rep = import_files([f], tmp_path / "imp")
    got = duckdb.connect(str(run.db), read_only=True).execute(
        "SELECT attempt_index, passed, error FROM attempts ORDER BY 1").fetchall()
    assert rep.rows == 2 and got == [(0, True, None), (1, False, "x ? y")]


def test_the_sql_type_checks_count_what_the_python_check_counts(tmp_path):
    """Both SQL checks find exactly the lines that type_problem (Python, the line-by-line reference
    of the rules) finds: the import's own marks (the typed read's JSON leaves), wherever the typed
    structures hold the file, and count_inexact (whole JSON values, the fallback) on every file.
    300 files of 30 lines, each line a valid one with 0-2 fields replaced by a value of another
    type (seeded)."""
    import random

    import duckdb

    from tbhpc.store.import_tb import MAX_LINE_BYTES, _typed
    from tbhpc.store.tb_types import count_inexact, count_inexact_python
    good = {"uid": "s.py:t", "finish_reason": "stop", "is_system_error": False, "error": None,
            "test_result": {"result": True, "is_system_error": False, "reward": 0.5, "error": "", "tb": "trace"},
            "usage": [{"input_tokens": 3, "input_tokens_details": {"cached_tokens": 1}, "output_tokens": 2,
                       "output_tokens_details": {"reasoning_tokens": 0}}],
            "metadata": {"scenario": "s", "error": None}}
    paths = [("uid",), ("finish_reason",), ("is_system_error",), ("error",), ("test_result",), ("test_result", "result"),
             ("test_result", "is_system_error"), ("test_result", "reward"), ("test_result", "tb"), ("usage",),
             ("usage", 0), ("usage", 0, "input_tokens"), ("usage", 0, "output_tokens_details", "reasoning_tokens"),
             ("usage", 0, "input_tokens_details"), ("metadata",), ("metadata", "scenario")]
    values = [None, True, 0, 7, -5, 2.5, 1e3, 2**63, 2**70, float("inf"), float("nan"), "", "yes", "1", [], [1], {},
              {"a": 1}, [None]]
    rng = random.Random(42)
    seen = {True: 0, False: 0}
    marked = {True: 0, False: 0}          # files the typed read holds, by whether they have inexact lines
    for n in range(300):
        lines = []
        for i in range(30):
            line = json.loads(json.dumps(good))
            line["uid"] = f"s.py:t{i % 7}"
            if rng.random() < 0.3 if n % 2 else rng.random() < 0.02:
                for _ in range(rng.randint(1, 2)):
                    *parent, last = rng.choice(paths)
                    node = line
                    for key in parent:
                        node = node[key] if isinstance(node, dict) and key in node or isinstance(node, list) and node else None
                        if node is None:
                            break
                    if isinstance(node, dict) or isinstance(node, list) and node and last == 0:
                        node[last] = rng.choice(values)
            if n % 5 == 0 and rng.random() < 0.5:
                line["usage"] = line["usage"][0] if isinstance(line["usage"], list) and line["usage"] else line["usage"]
            lines.append(json.dumps(line))
        f = tmp_path / f"r{n}.jsonl"
        f.write_text("\n".join(lines) + "\n")
        counted = count_inexact([f], MAX_LINE_BYTES)      # every line is JSON: the SQL must run, no Python fallback
        assert counted is not None and counted == count_inexact_python([f]), f
        seen[counted == 0] += 1
        try:
            leaves = duckdb.sql(f"SELECT count(*) FILTER (WHERE inexact) FROM ({_typed([f])})").fetchone()[0]
        except duckdb.Error:
            continue                                    # usage as one object, a list test_result, ...: the fallback's
        assert leaves == counted, f
        marked[counted == 0] += 1
    assert seen[True] > 20 and seen[False] > 20, seen
    assert marked[True] > 20 and marked[False] > 20, marked
