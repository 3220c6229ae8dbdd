"""One SQL catalogue over every run under a folder: `tbhpc sql [ROOT] "SELECT ..."`.

Why: each run keeps its own `results.duckdb` (one writer per file, the merge). Comparing ten
policies should not mean attaching files by hand. The catalogue attaches every run database
under ROOT read-only, in an in-memory DuckDB, and defines union views with a `run` column (the
run's path relative to ROOT): `attempts`, `campaigns`, `tasks`, `plan`, `task_stats`, `blobs`,
`selections` and `train_steps` where runs have them. Runs of older schema versions join in with
NULL for the columns they lack (UNION ALL BY NAME). One more view reads inside the transcripts:
`tool_calls`, a row per tool call of every attempt (tbhpc's OpenAI-style messages and the
reference harness's imported ones alike), with its arguments, its output and the error it got.

Every query rescans ROOT, so a run added after the catalogue was opened is seen by the next
query. A run whose merge is writing at that moment holds DuckDB's write lock: the catalogue
retries its attach for `wait_s` (merges take seconds), then leaves that run out of the query and
says so (`Catalogue.skipped`), never blocking the writer.

Read-only for real, not by convention: each query gets a fresh in-memory connection that attaches
the runs (READ_ONLY), defines the views, then turns external access off (no file read or written,
no ATTACH, no extension installed) and locks its configuration, so the query cannot turn it back
on. Only queries run (SELECT and what DuckDB parses as one: DESCRIBE, SHOW, SUMMARIZE, PRAGMA, and
EXPLAIN); DETACH, CREATE, COPY, SET and the rest are refused before anything executes.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import duckdb

from tbhpc.errors import UserError
from tbhpc.store.health import check_every_block, damaged, find_damaged, is_busy, is_damage, open_results
from tbhpc.store.schema import task_stats_sql

QUERY_KINDS = ("SELECT", "EXPLAIN")
TABLES = ("attempts", "campaigns", "tasks", "plan", "blobs", "selections", "train_steps")
DB_NAME = "results.duckdb"

# A row per tool call, from both transcript formats: tbhpc's (assistant messages with OpenAI
# `tool_calls`, outputs in `tool` messages by `tool_call_id`) and an import's ("format":
# "thinkingbox": ToolCall / ParallelToolCall messages, outputs in ToolResponse by `id`). `message`
# is the call's position in the transcript's messages (system prompt excluded); `arguments` is
# JSON text; `output` is the first response with the call's id after it; `error` is the
# harness's mark on the call or the `error` field of a JSON-object output. Each transcript is
# parsed once, into the few fields read, and only messages that call or answer a tool go on:
# 100,000 transcripts of 29 messages take ~2 s and ~180 MiB (all messages as JSON values: 11 s, 1 GB).
TOOL_CALLS_SQL = """
WITH msg AS (
    SELECT * FROM (SELECT * EXCLUDE (l, m), m.*
    FROM (SELECT *, unnest(l) AS m, generate_subscripts(l, 1) - 1 AS message
          FROM (SELECT run, campaign, task_id, attempt_index, policy_id, status, passed,
                       coalesce(transcript->>'format' = 'thinkingbox', false) AS tb,
                       from_json(transcript->'messages', '[{"role": "VARCHAR", "T": "VARCHAR", "tool_calls": "JSON",
                           "tool_call_id": "VARCHAR", "id": "VARCHAR", "name": "VARCHAR", "arguments": "JSON",
                           "content": "VARCHAR", "metadata": "JSON"}]') AS l
                FROM attempts WHERE transcript LIKE '{%')))
    WHERE tool_calls IS NOT NULL OR role = 'tool' OR T IN ('ToolCall', 'ToolResponse')
), calls AS (
    SELECT run, campaign, task_id, attempt_index, policy_id, status, passed, message, tb,
           unnest(CASE WHEN NOT tb THEN from_json(tool_calls, '["JSON"]')
                       WHEN T = 'ToolCall' THEN [json_object('id', id, 'name', name, 'arguments', arguments, 'metadata', metadata)]
                       WHEN T = 'ParallelToolCall' THEN from_json(tool_calls, '["JSON"]') END) AS c
    FROM msg WHERE tool_calls IS NOT NULL OR T = 'ToolCall'
), outputs AS (
    SELECT run, campaign, task_id, attempt_index, policy_id, message,
           CASE WHEN tb THEN id ELSE tool_call_id END AS call_id, content AS output
    FROM msg WHERE CASE WHEN tb THEN T = 'ToolResponse' ELSE role = 'tool' END
), named AS (
    SELECT * EXCLUDE (c, tb), c->>'id' AS call_id,
           CASE WHEN tb THEN c->>'name' ELSE c->'function'->>'name' END AS tool,
           CASE WHEN tb THEN (c->'arguments')::VARCHAR ELSE c->'function'->>'arguments' END AS arguments,
           CASE WHEN tb THEN nullif(c->'metadata'->>'error', '') END AS call_error
    FROM calls
)
SELECT n.run, n.campaign, n.task_id, n.attempt_index, n.policy_id, n.status, n.passed, n.message, n.call_id,
       n.tool, n.arguments, o.output,
       coalesce(n.call_error, CASE WHEN json_valid(o.output) AND json_type(o.output) = 'OBJECT'
                                   THEN o.output->>'error' END) AS error
FROM named n ASOF LEFT JOIN outputs o
  ON o.run = n.run AND o.campaign = n.campaign AND o.task_id = n.task_id AND o.attempt_index = n.attempt_index
 AND o.policy_id IS NOT DISTINCT FROM n.policy_id AND o.call_id = n.call_id AND o.message > n.message
"""


def find_runs(root: Path) -> list[Path]:
    """Run databases under root (root itself may be a run), skipping hidden and quarantine folders."""
    root = Path(root)
    found = [p for p in root.rglob(DB_NAME) if not any(part.startswith(".") for part in p.relative_to(root).parts[:-1])]
    return sorted(found)


@dataclass
class Catalogue:
    root: Path
    wait_s: float = 10.0
    con: duckdb.DuckDBPyConnection | None = None
    attached: dict[Path, str] = field(default_factory=dict)      # database file -> alias (the last query's)
    skipped: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)
        if not self.root.exists():
            raise UserError(f"{self.root}: no such folder")

    def refresh(self) -> None:
        """A new connection: every run under root attached (read-only), the views, then locked."""
        self.close()
        self.con, self.attached, self.skipped = duckdb.connect(":memory:"), {}, []
        for db in find_runs(self.root):
            alias = f"r{len(self.attached)}"
            if self._attach(db, alias):
                self.attached[db] = alias
        self._views()
        self.con.execute("SET enable_external_access = false")
        self.con.execute("SET lock_configuration = true")

    def _attach(self, db: Path, alias: str) -> bool:
        """Attach one run's file; a busy one (a merge holds its lock) is waited for up to `wait_s`,
        a damaged one is left out at once, saying how to rebuild it."""
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                self.con.execute(f"ATTACH '{_esc(str(db))}' AS {alias} (READ_ONLY)")
                return True
            except duckdb.Error as exc:
                if is_busy(exc) and time.monotonic() < deadline:
                    time.sleep(0.2)
                    continue
                why = (str(damaged(db, exc)) if is_damage(exc) else
                       f"{self.name(db)}: being written (its merge held the lock for {self.wait_s:g} s)" if is_busy(exc) else
                       f"{self.name(db)}: {' '.join(str(exc).split())[:160]}")
                self.skipped.append(why)
                return False

    def name(self, db: Path) -> str:
        rel = db.parent.relative_to(self.root)
        return str(rel) if str(rel) != "." else self.root.name

    def _views(self) -> None:
        for table in TABLES:
            parts = []
            for db, alias in self.attached.items():
                has = self.con.execute("SELECT count(*) FROM duckdb_tables() WHERE database_name = ? AND table_name = ? "
                                       "UNION ALL SELECT count(*) FROM duckdb_views() WHERE database_name = ? AND view_name = ?",
                                       [alias, table, alias, table]).fetchall()
                if sum(r[0] for r in has):
                    # `run` is the catalogue's column (the run's folder); a table's own `run` (train_steps:
                    # the run's config name, the `campaign` of its attempt rows) is shown as `campaign`
                    own = self.con.execute("SELECT count(*) FROM duckdb_columns() WHERE database_name = ? AND "
                                           "table_name = ? AND column_name = 'run'", [alias, table]).fetchone()[0]
                    columns = "* RENAME (run AS campaign)" if own else "*"
                    parts.append(f"SELECT '{_esc(self.name(db))}' AS run, {columns} FROM {alias}.main.{table}")
            if parts:
                self.con.execute(f"CREATE OR REPLACE TEMP VIEW {table} AS " + " UNION ALL BY NAME ".join(parts))
        # views over the union views (a run's own task_stats would bind to those too), where the
        # runs have what they read: older schemas may lack `tasks` or `transcript`
        for view, sql in (("task_stats", task_stats_sql(per_run=True)), ("tool_calls", TOOL_CALLS_SQL)):
            try:
                self.con.execute(f"CREATE OR REPLACE TEMP VIEW {view} AS {sql}")
            except (duckdb.BinderException, duckdb.CatalogException):
                pass

    def sql(self, query: str):
        kinds = query_kinds(query)
        refused = [(k, text) for k, text in kinds if k not in QUERY_KINDS]
        if refused:
            kind, text = refused[0]
            raise UserError(f"sql: only queries run here (SELECT, DESCRIBE, SHOW, SUMMARIZE, EXPLAIN); "
                            f"{' '.join(text.split())[:60]!r} is a {kind} statement")
        self.refresh()
        if not self.attached:
            raise UserError(f"{self.root}: no run databases ({DB_NAME}) under it")
        try:
            return self.con.execute(query)
        except duckdb.Error as exc:
            if is_damage(exc):
                raise find_damaged(list(self.attached), exc) from None
            raise UserError(f"sql: {' '.join(str(exc).split())[:400]}") from None

    def close(self) -> None:
        if self.con is not None:
            self.con.close()
            self.con = None


def query_kinds(query: str) -> list[tuple[str, str]]:
    """(DuckDB's statement kind, its text) for each statement of `query` (parsed, not run); a parse
    error is the user's."""
    with duckdb.connect(":memory:") as con:
        try:
            statements = con.extract_statements(query)
        except duckdb.Error as exc:
            raise UserError(f"sql: {' '.join(str(exc).split())[:400]}") from None
    if not statements:
        raise UserError("sql: the query is empty")
    return [(s.type.name, s.query) for s in statements]


def _esc(text: str) -> str:
    return text.replace("'", "''")


_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


def export_parquet(db: Path, out: Path) -> list[Path]:
    """Every table (and the task_stats view) of one run as `OUT/<table>.parquet`."""
    con = open_results(db, read_only=True, files=True)   # it writes the Parquet files
    written = []
    try:
        names = [r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE schema_name = 'main' "
                                           "UNION SELECT view_name FROM duckdb_views() WHERE schema_name = 'main' "
                                           "AND NOT internal ORDER BY 1").fetchall()]
        check_every_block(con, db)      # a damaged file writes no half export
        out.mkdir(parents=True, exist_ok=True)
        for name in names:
            path = out / f"{_SAFE.sub('_', name)}.parquet"
            con.execute(f"COPY (SELECT * FROM main.\"{name}\") TO '{_esc(str(path))}' (FORMAT parquet, COMPRESSION zstd)")
            written.append(path)
    finally:
        con.close()
    return written
