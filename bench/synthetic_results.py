"""Synthetic results for the benchmarks: run directories of JSONL shards (tbhpc's own ingest) and
result files in the reference harness's `tb infer` format (`import-tb`), written by DuckDB so that
a million attempts take seconds to make. Shapes follow the real files: shard columns as the
campaign writes them, transcripts of a campaign's typical size, DecodeResult lines with the
reference's message types.
"""
from __future__ import annotations

from pathlib import Path

ROWS_PER_SHARD = 10_000
DOMAINS = ["retail", "insurance", "travel", "neobank", "consulting"]


def make_campaign(root: Path, tasks: int, repeats: int, transcripts: bool = False) -> Path:
    """A run directory with a plan and JSONL shards written by DuckDB (fast, realistic files);
    with `transcripts`, every attempt carries a ~2.9 KB transcript like a campaign's default."""
    import duckdb

    from tbhpc.store.run_dir import RunDir
    run = RunDir(root)
    plan = [{"task_id": f"task-{i:06d}", "domain": DOMAINS[i % 5], "split": "eval", "n_golden_calls": 3, "tags": [],
             "template": "synthetic", "repeats": repeats} for i in range(tasks)]
    run.create({"name": "bench"}, "synthetic", {"campaign": "bench", "kind": "eval", "policy_id": "synthetic",
                                               "config_hash": "synthetic", "config": {}, "source": "bench"}, plan)
    total = tasks * repeats
    con = duckdb.connect()
    for s, start in enumerate(range(0, total, ROWS_PER_SHARD)):
        stop = min(total, start + ROWS_PER_SHARD)
        # per-task success probability from a hash of the task; per-attempt draw from a hash of the key
        con.execute(f"""COPY (
            SELECT 'bench' AS campaign, printf('task-%06d', i // {repeats}) AS task_id, (i % {repeats})::INTEGER AS attempt_index,
                   'synthetic' AS policy_id, {DOMAINS!r}[(i // {repeats}) % 5 + 1] AS domain,
                   p AS passed, CASE WHEN p THEN 1.0 ELSE 0.0 END AS reward, 'ok' AS status, 'done' AS finish_reason,
                   (3 + i % 7)::INTEGER AS agent_turns, 1200 + i % 900 AS agent_in, 400 AS agent_cached, 250 + i % 300 AS agent_out,
                   'node1' AS host, TIMESTAMP '2026-01-01' + to_seconds(i) AS finished_at{_TRANSCRIPT if transcripts else ''}
            FROM (SELECT i, (hash(i) % 1000) < (hash(i // {repeats} + 7) % 1000) AS p FROM range({start}, {stop}) t(i))
        ) TO '{run.shards}/shard-{s:05d}.jsonl' (FORMAT json)""")
    con.close()
    return root


# a transcript document of ~2.9 KB (28 assistant turns and a user reply), different per attempt
_TRANSCRIPT = (""", '{"v":1,"system":"0123456789abcdef","tools":"fedcba9876543210","messages":[' || """
               """repeat('{"role":"assistant","content":"I will look up order ' || i || ' now and check the policy."},', 28) """
               """|| '{"role":"user","content":"ok"}],"finish":"done","judge":[]}' AS transcript""")

def make_reference_results(path: Path, lines: int, transcripts: bool = False) -> Path:
    """A `tb infer`-style result file (a DecodeResult per line) written by DuckDB: empty messages,
    or with `transcripts` a realistic conversation (~11.5 KB a line: two system messages, reasoning,
    parallel and single tool calls, tool outputs, user turns) and 14 tool definitions."""
    import duckdb
    messages = _REF_MESSAGES if transcripts else "[]::VARCHAR[]"
    tools = _REF_TOOLS if transcripts else "NULL"
    con = duckdb.connect()
    con.execute(f"""COPY (
        SELECT printf('sandbox_%s_group1.py:test_case_%06d', dom, i // 20) AS uid,
               CASE WHEN i % 7 = 0 THEN 'user_limit' ELSE 'done' END AS finish_reason, (i % 997 = 0) AS is_system_error,
               {{'result': ok, 'is_system_error': false,
                 'tb': CASE WHEN ok THEN '' ELSE 'AssertionError: orders.O-' || i || '.status: delivered != refunded' END,
                 'metadata': {{'judge_motivation': [{{'question': 'Did the agent confirm the refund?', 'answer': ok}}]}}}} AS test_result,
               [{{'input_tokens': 1200 + i % 900, 'input_tokens_details': {{'cached_tokens': 400}},
                  'output_tokens': 250 + i % 300, 'output_tokens_details': {{'reasoning_tokens': 100}}}}] AS usage,
               {{'scenario': 'sandbox_external_' || dom}} AS metadata, {messages} AS messages, {tools} AS tools
        FROM (SELECT i, {DOMAINS!r}[(i // 20) % 5 + 1] AS dom, (hash(i) % 1000) < (hash(i // 20 + 7) % 1000) AS ok
              FROM range({lines}) t(i))) TO '{path}' (FORMAT json)""")
    con.close()
    return path


def _text(role: str, content: str, tag: str = "") -> str:
    meta = f"json_object('tag', '{tag}')" if tag else "json_object()"
    return f"json_object('T', 'Text', 'role', '{role}', 'content', {content}, 'metadata', {meta})"


def _call(name: str, args: str, call_id: str) -> str:
    return f"json_object('T', 'ToolCall', 'name', '{name}', 'arguments', {args}, 'id', {call_id}, 'metadata', json_object())"


def _response(name: str, content: str, call_id: str) -> str:
    return f"json_object('T', 'ToolResponse', 'name', '{name}', 'content', {content}, 'id', {call_id}, 'metadata', json_object())"


_REF_MESSAGES = "json_array(" + ", ".join([
    _text("system", "'You are a customer support agent for ' || dom || '. ' || repeat('Follow the policy exactly and never invent data. ', 40)"),
    _text("system", "'Domain policy for ' || dom || ': ' || repeat('Refunds are allowed within 30 days of delivery when unused. ', 32)"),
    _text("user", "'Hi, I would like a refund for order O-' || i || '. ' || repeat('It arrived damaged. ', 1 + i % 5)"),
    _text("assistant", "'The user wants a refund; I need the order first. ' || repeat('Check eligibility. ', 3 + i % 4)", "think"),
    "json_object('T', 'ParallelToolCall', 'tool_calls', json_array("
    + _call("get_order", "json_object('order_id', 'O-' || i)", "'call_' || md5(i::VARCHAR)") + "), 'metadata', json_object())",
    _response("get_order", "json_object('order_id', 'O-' || i, 'status', 'delivered', 'items', [{'sku': 'SKU-' || (i % 1000), "
              "'qty': 1 + i % 3}], 'history', repeat('event; ', 20 + i % 30))::VARCHAR", "'call_' || md5(i::VARCHAR)"),
    _text("assistant", "'I found your order O-' || i || '. Could you confirm the item is unused? ' || repeat('Thanks. ', i % 6)"),
    _text("user", "'Yes, unused. ' || repeat('Please hurry. ', i % 4)"),
    _call("refund_order", "json_object('order_id', 'O-' || i, 'reason', 'damaged')", "'call_r' || i"),
    _response("refund_order", "json_object('ok', true, 'refund_id', 'R-' || i)::VARCHAR", "'call_r' || i"),
    _text("assistant", "'Your refund R-' || i || ' is on its way. <DONE>'")]) + ")"
_REF_TOOLS = ("(SELECT json_group_array(json_object('name', dom || '_tool_' || k, 'description', "
              "repeat('Does one thing in the ' || dom || ' backend. ', 6), 'input_schema', json_object('type', 'object', "
              "'properties', json_object('order_id', json_object('type', 'string'))))) FROM range(14) r(k))")
