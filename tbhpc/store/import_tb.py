"""`tbhpc import-tb`: load result files of the reference ThinkingBox harness (`tb infer` JSONL, one
DecodeResult per line) into a tbhpc run directory, so every metric works on them too.

Mapping: uid -> task_id; attempt_index = order of the uid's rows across the files; status =
system_error when `is_system_error` or `test_result.is_system_error` is true, or there is no
test result or no (or a null) `test_result.result`;
passed = `test_result.result`; reward = `test_result.reward`, else 1/0 by passed; usage[] summed
into agent tokens (input, cached, output, reasoning); domain = `metadata.scenario`, else the file
part of the uid; error = metadata.error, test_result.error or error; diff = the failed test's
traceback tail (validate_database puts the state diff there); transcript = `messages` with the
system messages and `tools` by reference in `blobs`, plus the judge's verdicts (see
tbhpc.store.tb_transcripts).

Why SQL, not Python: real result files carry whole transcripts (`messages`) and run to
gigabytes. DuckDB's JSON reader streams them with only the named fields materialised, so an
import costs about what reading the file costs, in bounded memory (a Python object per line
costs many times that in both). The result is written into a database file beside
the run and moved in only when everything checked out: a bad line stops the import with its
line number (found by a line-by-line scan, only then) and the run directory is never created.
Two readers: typed (the reference's structure, each small field a JSON leaf, so one parse gives
both the values and whether every one has the reference's type: tbhpc.store.tb_types) and, when
a file does not fit that structure (usage as one object) or --lenient converts values of other
types, lenient (JSON values, Python's truthiness), about half as fast. The typed read runs in
parallel and keeps file order through a Parquet stage (`_staged`), because attempt indexes are
each uid's lines in file order. A file with conversations, or one whose valid JSON DuckDB
refuses (a lone surrogate escape), is first streamed through Python into a reduced copy
(tbhpc.store.tb_transcripts), which the same SQL imports on one thread.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import duckdb

from tbhpc.errors import InfraError, UserError
from tbhpc.store.health import open_results
from tbhpc.store.merge import WRITE_CONFIG, MergeReport, insert_campaign, insert_rows
from tbhpc.store.run_dir import RunDir
from tbhpc.store.schema import DDL, ROLES, SHARD_COLUMNS
from tbhpc.store.sqltext import literal, literal_list
from tbhpc.store.tb_transcripts import write_reduced
from tbhpc.store.tb_types import (LEAF_COLUMNS, LEAF_TOKENS, count_inexact, count_inexact_python, exact_leaves_sql,
                                  first_inexact_line, leaf_entries, parsed_lines)

MEMORY_LIMIT = "128MB"     # DuckDB's own budget; spills to the temp directory beyond it
STAGED_MEMORY_LIMIT = "256MB"  # the budget of the staged read (`_staged`)
BAD = "!malformed"         # shard value of a row that failed the field checks (never lands: the import stops)
MAX_LINE_BYTES = 16 << 20  # the longest result line read (DuckDB's JSON buffers are sized from it)

# A file the typed read's structures cannot hold (usage as one object, a test_result that is a
# list), or one with values of other types under --lenient, is read as whole JSON values and
# converted with Python's truthiness instead (the lenient path, ~2x slower).
_LENIENT = {"uid": "VARCHAR", "finish_reason": "VARCHAR", "is_system_error": "JSON", "test_result": "JSON",
            "usage": "JSON", "metadata": "JSON", "error": "VARCHAR"}
# a line has a conversation when `messages` is a non-empty list (a string test: no JSON function per row)
_HAS_MESSAGES = "coalesce(starts_with(messages::VARCHAR, '[') AND messages::VARCHAR <> '[]', false)"
INEXACT = "!inexact"       # shard value of a row whose fields are not of the reference's types (strict: stops the import)


@dataclass
class ImportReport(MergeReport):
    reader: str = "typed"      # typed: the reference's field types; lenient: JSON values, Python truthiness
    tasks: int = 0             # distinct uids
    system_errors: int = 0     # lines that are system errors (each line is its own attempt: nothing else can be wrong)
    coerced: int = 0           # lines whose values were converted (only with lenient=True)


def _truthy(expr: str) -> str:
    """Python truthiness of a JSON value (null, false, 0, "" and empty containers are false)."""
    return (f"coalesce(CASE json_type({expr}) WHEN 'BOOLEAN' THEN ({expr})::BOOLEAN WHEN 'NULL' THEN false "
            f"WHEN 'VARCHAR' THEN ({expr} ->> '$') <> '' WHEN 'ARRAY' THEN ({expr})::VARCHAR <> '[]' "
            f"WHEN 'OBJECT' THEN ({expr})::VARCHAR <> '{{}}' "
            f"ELSE try_cast({expr} ->> '$' AS DOUBLE) <> 0 END, false)")    # an absent field is false too


def _read(files: list[Path], columns: dict[str, str], numbered: bool = True) -> str:
    """The named fields of every line, with its position (`numbered`: the scan then runs on one
    thread; unnumbered reads exist only for bench/results_scale.py's floors)."""
    names = literal_list(files)
    cols = "{" + ", ".join(f"'{k}': '{v}'" for k, v in columns.items()) + "}"
    scan = f"read_json({names}, format='newline_delimited', columns={cols}, maximum_object_size={MAX_LINE_BYTES})"
    return f"SELECT ordinality AS line_order, * FROM {scan} WITH ORDINALITY" if numbered else f"SELECT 0 AS line_order, * FROM {scan}"


def _tokens(usage: str) -> str:
    """The four token sums over the usage entries, a negative count taken as 0 (the lenient read)."""
    return ", ".join(f"coalesce(list_sum(list_transform({usage}, x -> greatest(coalesce(x.{path}, 0), 0))), 0) AS t_{k}"
                     for k, path in LEAF_TOKENS.items())


def _transcript(reduced: bool) -> tuple[dict[str, str], str]:
    """The column read and the expression for `transcript`: the finished document in a reduced copy
    (tb_transcripts.write_reduced), else a placeholder on lines with a conversation."""
    if reduced:
        return {"transcript": "JSON"}, "transcript::VARCHAR"
    return {"messages": "JSON"}, f"CASE WHEN {_HAS_MESSAGES} THEN '' END"


def _typed(files: list[Path], reduced: bool = False, numbered: bool = True) -> str:
    """Per line: task_id, finish_reason, sys, ok_result, reward_value, t_*, scenario, err, bad_fields,
    inexact, tb (the failed test's traceback) and transcript, from the fields' JSON leaves
    (tb_types.LEAF_COLUMNS): the values of an exact line, and whether it is exact, from one parse."""
    column, transcript = _transcript(reduced)
    text = lambda leaf: f"({leaf} ->> '$')"      # noqa: E731  the string in a JSON string leaf
    true = lambda leaf: f"coalesce({leaf} = 'true', false)"      # noqa: E731
    return f"""
        SELECT line_order, {text('uid')} AS task_id, {text('finish_reason')} AS finish_reason,
               ({true('is_system_error')} OR {true('test_result.is_system_error')} OR test_result.result IS NULL) AS sys,
               {true('test_result.result')} AS ok_result, try_cast(test_result.reward::VARCHAR AS DOUBLE) AS reward_value,
               {', '.join(f"coalesce(list_sum(list_transform(entries, y -> y.{k})), 0) AS t_{k}" for k in LEAF_TOKENS)},
               {text('metadata.scenario')} AS scenario,
               coalesce(nullif({text('metadata.error')}, ''), nullif({text('test_result.error')}, ''), nullif({text('error')}, '')) AS err,
               false AS bad_fields, NOT coalesce({exact_leaves_sql()}, false) AS inexact, {text('test_result.tb')} AS tb,
               {transcript} AS transcript
        FROM (SELECT *, {leaf_entries('usage')} AS entries FROM ({_read(files, {**LEAF_COLUMNS, **column}, numbered)}))"""


def _lenient(files: list[Path], reduced: bool = False) -> str:
    """The same columns from JSON values, each parsed once (json_transform)."""
    column, transcript = _transcript(reduced)
    tr = '{"result": "JSON", "is_system_error": "JSON", "reward": "JSON", "error": "VARCHAR", "tb": "VARCHAR"}'
    usage = ('[{"input_tokens": "BIGINT", "input_tokens_details": {"cached_tokens": "BIGINT"}, "output_tokens": "BIGINT", '
             '"output_tokens_details": {"reasoning_tokens": "BIGINT"}}]')
    return f"""
        SELECT line_order, task_id, finish_reason,
               ({_truthy('is_system_error')} OR {_truthy('tr.is_system_error')} OR tr_type IS DISTINCT FROM 'OBJECT'
                OR tr.result IS NULL) AS sys,
               {_truthy('tr.result')} AS ok_result, try_cast(tr.reward ->> '$' AS DOUBLE) AS reward_value, {_tokens('us')},
               md.scenario AS scenario, coalesce(nullif(md.error, ''), nullif(tr.error, ''), nullif(top_error, '')) AS err,
               (tr_type NOT IN ('OBJECT', 'NULL') OR us_type NOT IN ('ARRAY', 'OBJECT', 'NULL')) AS bad_fields,
               false AS inexact, tr.tb AS tb, {transcript} AS transcript
        FROM (SELECT line_order, uid AS task_id, finish_reason, is_system_error, error AS top_error, {next(iter(column))},
                     json_type(test_result) AS tr_type,
                     json_transform(test_result, '{tr}') AS tr, json_type(usage) AS us_type,
                     json_transform(CASE json_type(usage) WHEN 'OBJECT' THEN json_array(usage) ELSE usage END, '{usage}') AS us,
                     json_transform(metadata, '{{"scenario": "VARCHAR", "error": "VARCHAR"}}') AS md
              FROM ({_read(files, {**_LENIENT, **column})}))"""


def attempt_index(order: str) -> str:
    """A line's place among its uid's lines (0, 1, ...), lines ordered by the column `order`."""
    return f"row_number() OVER (PARTITION BY task_id ORDER BY {order}) - 1"


NUMBERED = attempt_index("line_order")


def _select(lines: str, campaign: str, policy_id: str, index: str = NUMBERED) -> str:
    """Attempt rows (and `bad` and `inexact` flags) from the per-line columns of `_typed` or
    `_lenient`; `index`: the attempt_index (by default the line's place among its uid's lines
    from `line_order`; "attempt" when the lines come with it, `_staged`; "0" for
    bench/results_scale.py's floors)."""
    file_part = "split_part(task_id, ':', 1)"
    tokens = ", ".join(f"t_{k} AS agent_{k}" if r == "agent" else f"0 AS {r}_{k}" for r in ROLES for k in LEAF_TOKENS)
    return f"""
    SELECT {literal(campaign)} AS campaign, task_id,
           ({index})::INTEGER AS attempt_index,
           {literal(policy_id)} AS policy_id,
           coalesce(nullif(scenario, ''), CASE WHEN suffix({file_part}, '.py') THEN {file_part}[:-4] ELSE {file_part} END) AS domain,
           CASE WHEN sys THEN NULL ELSE coalesce(reward_value, CASE WHEN ok_result THEN 1.0 ELSE 0.0 END) END AS reward,
           CASE WHEN sys THEN NULL ELSE ok_result END AS passed,
           CASE WHEN sys THEN 'system_error' ELSE 'ok' END AS status,
           finish_reason, left(err, 2000) AS error, CASE WHEN sys THEN 'imported' END AS error_kind, {tokens},
           CASE WHEN NOT sys AND NOT ok_result AND coalesce(tb, '') <> '' THEN to_json([right(tb, 2000)])::VARCHAR END AS diff,
           transcript,
           (coalesce(task_id, '') = '' OR bad_fields) AS bad, inexact
    FROM ({lines})"""


def first_bad_line(files: list[Path]) -> str:
    """The first line that is not a valid result, as 'FILE: line N: why' (a line-by-line scan)."""
    for f, no, obj, problem in parsed_lines(files):
        if not problem and (not isinstance(obj.get("uid"), str) or not obj["uid"]):
            problem = "missing string field 'uid'"
        elif not problem and obj.get("test_result") is not None and not isinstance(obj["test_result"], dict):
            problem = "field 'test_result' must be an object"
        elif not problem and not isinstance(obj.get("usage") or [], (list, dict)):
            problem = "field 'usage' must be a list of objects or an object"
        if problem:
            return f"{f}: line {no}: {problem}"
    return ""


def import_files(files: list[Path], out: Path, campaign: str | None = None, policy_id: str = "thinkingbox",
                 lenient: bool = False) -> tuple[RunDir, MergeReport]:
    """`lenient`: convert values of the wrong type (Python truthiness, numbers from strings,
    negative token counts to 0) and count the lines that needed it; by default such a line stops
    the import, named (tbhpc.store.tb_types)."""
    run = RunDir(out)
    if Path(out).exists() and not Path(out).is_dir():
        raise UserError(f"--out {out}: is a file, not a folder")
    if run.exists() or Path(out).exists() and any(Path(out).iterdir()):
        raise UserError(f"{out}: already exists; import into a new --out")
    for f in files:
        if not Path(f).is_file():
            raise UserError(f"{f}: cannot read: no such file")
    campaign = campaign or Path(files[0]).stem
    created = not Path(out).exists()
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".tmp-import-", dir=Path(out).parent))
    try:
        db = work / "results.duckdb"
        con = open_results(db, read_only=False, config=WRITE_CONFIG)
        try:
            con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
            con.execute(f"SET temp_directory = {literal(str(work / 'spill'))}")
            con.execute("SET preserve_insertion_order = true")
            con.execute("SET enable_progress_bar = false")
            con.execute(DDL)
            blobs: dict[str, str] = {}
            if _first_has_messages(files):     # a file with conversations: straight to the reduced copy
                reader, coerced, blobs = _import_reduced(con, files, work, campaign, policy_id, lenient)
            else:
                try:
                    reader, coerced = _insert(con, files, work, campaign, policy_id, lenient)
                    _check_rows(con, files)
                    # conversations further down a file that began without: the reduced copy instead
                    redo = bool(con.execute("SELECT count(transcript) FROM attempts").fetchone()[0])
                except _Unreadable:             # valid JSON that DuckDB refuses (a lone surrogate escape)
                    redo = True
                if redo:
                    con.execute("DROP TABLE attempts")
                    con.execute(DDL)
                    reader, coerced, blobs = _import_reduced(con, files, work, campaign, policy_id, lenient)
            _check_rows(con, files)
            insert_rows(con, "blobs", [{"ref": r, "content": c} for r, c in blobs.items()],
                        {"ref": "VARCHAR", "content": "VARCHAR"})
            rows, tasks, system_errors = con.execute("SELECT count(*), count(DISTINCT task_id), "
                                                     "count(*) FILTER (WHERE status = 'system_error') FROM attempts").fetchone()
            meta = {"campaign": campaign, "kind": "eval", "policy_id": policy_id, "config_hash": None, "pack_hash": None,
                    "config": {"imported_from": [str(f) for f in files]}, "source": "thinkingbox",
                    "created_at": datetime.now(timezone.utc).isoformat(sep=" ")[:26]}
            _write_plan(con, work / "plan.jsonl")
            insert_campaign(con, meta)
            con.execute("CHECKPOINT")
        finally:
            con.close()
        run.create({"imported_from": [str(f) for f in files]}, "imported", meta, work / "plan.jsonl")
        os.replace(db, run.db)
    except BaseException:
        if created and run.path.exists():
            shutil.rmtree(run.path, ignore_errors=True)      # half-created: leave nothing behind
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return run, ImportReport(rows=rows, reader=reader, tasks=tasks, system_errors=system_errors, coerced=coerced)


def _write_plan(con, path: Path) -> None:
    """The run's plan (a task per uid, its lines as repeats) and the `tasks` and `plan` rows a
    merge would load from it, from one pass over the attempts; plan.jsonl is written by DuckDB
    (a Python dict per task is slow at tens of thousands of tasks)."""
    con.execute("CREATE TEMP TABLE per_task AS SELECT campaign, task_id, policy_id, any_value(domain) AS domain, "
                "count(*)::INTEGER AS repeats FROM attempts GROUP BY campaign, task_id, policy_id")
    con.execute("INSERT INTO tasks SELECT campaign, task_id, domain, NULL, NULL, []::VARCHAR[], NULL FROM per_task")
    con.execute("INSERT INTO plan SELECT campaign, task_id, policy_id, repeats FROM per_task")
    con.execute(f"COPY (SELECT task_id, domain, NULL::VARCHAR AS split, NULL::INTEGER AS n_golden_calls, "
                f"[]::VARCHAR[] AS tags, NULL::VARCHAR AS template, repeats FROM per_task ORDER BY task_id) "
                f"TO {literal(str(path))} (FORMAT json)")
    con.execute("DROP TABLE per_task")


def _import_reduced(con, files: list[Path], work: Path, campaign: str, policy_id: str,
                    lenient: bool) -> tuple[str, int, dict[str, str]]:
    """Write the reduced copy of `files` (tbhpc.store.tb_transcripts; unless `lenient`, it stops at
    the first line of a wrong type) and import it; returns the reader used, the lines converted
    and the transcripts' blobs."""
    reduced = work / "reduced.jsonl"
    blobs = write_reduced(files, reduced, exact=not lenient)
    return *_insert(con, files, work, campaign, policy_id, lenient, [reduced]), blobs


class _Unreadable(UserError):
    """Python's json reads every line but DuckDB's reader refuses one: the reduced copy (written by
    Python, with lone surrogates replaced) is imported instead."""


def _check_rows(con, files: list[Path]) -> None:
    if con.execute(f"SELECT count(*) FROM attempts WHERE shard = '{BAD}'").fetchone()[0]:
        raise UserError(first_bad_line(files) or f"{files[0]}: a row without a uid or with malformed fields")
    if not con.execute("SELECT count(*) FROM attempts").fetchone()[0]:
        raise UserError(f"{files[0]}: no result rows")


def _first_has_messages(files: list[Path]) -> bool:
    """Whether the first result line has a conversation (a cheap guess that saves a wasted pass)."""
    with open(files[0], encoding="utf-8") as fh:
        for line in fh:
            if line.strip():
                try:
                    first = json.loads(line)
                except json.JSONDecodeError:
                    return False
                return isinstance(first, dict) and isinstance(first.get("messages"), list) and bool(first["messages"])
    return False


def _output_columns() -> set[str]:
    return {"campaign", "task_id", "attempt_index", "policy_id", "domain", "reward", "passed", "status", "finish_reason",
            "error", "error_kind", "diff", "transcript", *(f"{r}_{k}" for r in ROLES for k in ("in", "cached", "out", "reasoning"))}


def _insert(con, files: list[Path], work: Path, campaign: str, policy_id: str, lenient: bool,
            reduced: list[Path] | None = None) -> tuple[str, int]:
    """One pass into `attempts` from `files`, or from their `reduced` copy when given: typed when
    every line has the reference's types, else (with `lenient`, or when the typed structures cannot
    hold a line) lenient. Returns the reader and the lines converted. Unless `lenient`, a line of
    a wrong type stops the import, named; a row failing the field checks is marked in the shard
    column (the caller stops the import). Errors name the original files."""
    names = ", ".join(c for c in SHARD_COLUMNS if c in _output_columns())
    # Transcripts are kilobytes per row, and DuckDB holds 2,048 rows per vector and ~32 MiB of read
    # buffers per thread: on one thread, a 1 GB file of them stays within the memory limit.
    con.execute(f"SET threads = {1 if reduced else 2}")
    source = reduced or files

    def write(lines: str, index: str = NUMBERED) -> None:
        con.execute(f"INSERT INTO attempts ({names}, shard) SELECT {names}, CASE WHEN inexact THEN '{INEXACT}' "
                    f"WHEN bad THEN '{BAD}' ELSE 'import' END FROM ({_select(lines, campaign, policy_id, index)})")

    try:
        if reduced:
            write(_typed(source, True))
        else:       # the lines in file order from a parallel read (a Parquet stage), numbered from it
            lines = _staged(source, work / "lines.parquet")
            con.execute("SET preserve_insertion_order = false")     # the rows carry their attempt index
            try:
                write(lines, "attempt")
            finally:
                con.execute("SET preserve_insertion_order = true")
        inexact = con.execute(f"SELECT count(*) FROM attempts WHERE shard = '{INEXACT}'").fetchone()[0]
        if not inexact:
            return "typed", 0
    except duckdb.Error as exc:     # a line the typed structures cannot hold, or not JSON to DuckDB
        _raise_infra(exc, files)
        inexact = count_inexact(source, MAX_LINE_BYTES)
    con.execute("DELETE FROM attempts")
    if inexact != 0:
        problem = first_inexact_line(files)
        if problem and (not lenient or "not valid JSON" in problem or "expected a JSON object" in problem):
            raise UserError(problem)
        if inexact and not problem and not lenient:     # the SQL and the Python rules disagree: say so, never guess
            raise InfraError(f"{files[0]}: {inexact} line(s) of a wrong type by the SQL check, none by the line scan")
    coerced = (inexact if inexact is not None else count_inexact_python(files)) if lenient else 0
    try:
        write(_lenient(source, bool(reduced)))
        return "lenient", coerced
    except duckdb.Error as exc:
        _raise_infra(exc, files)
        con.execute("DELETE FROM attempts")
        if problem := first_bad_line(files):
            raise UserError(problem) from None
        why = (f"{files[0]}: DuckDB could not read the results ({' '.join(str(exc).split())[:200]}; "
               f"lines longer than {MAX_LINE_BYTES >> 20} MiB are not read)")
        raise (UserError if reduced else _Unreadable)(why) from None


def _staged(files: list[Path], stage: Path) -> str:
    """The typed lines of `files` from a parallel read, written in file order to a Parquet file,
    with `attempt`: each line's place among its uid's lines (a window over the file's row numbers
    and task_id column alone, joined back). Why: a numbered read (WITH ORDINALITY) runs the read
    and every column's expression on one thread, and its window carries every column. Parquet,
    not a temporary table: a table holds every line in memory and slows past its budget; the file
    holds none (it sits on disk, in the work directory). The ordered write needs
    STAGED_MEMORY_LIMIT (below ~250 MB DuckDB writes it on one thread), so it runs in a database
    of its own, closed before the insert: DuckDB keeps what a query allocated after the limit is
    lowered, and the insert would otherwise peak on top of it."""
    with duckdb.connect(config={"memory_limit": STAGED_MEMORY_LIMIT, "threads": 2, "preserve_insertion_order": True,
                                "temp_directory": str(stage.parent / "spill-stage")}) as stager:
        stager.execute(f"COPY (SELECT * EXCLUDE (line_order) FROM ({_typed(files, numbered=False)})) TO {literal(str(stage))} "
                       "(FORMAT parquet, COMPRESSION uncompressed)")
    rows = f"read_parquet({literal(str(stage))}, file_row_number=true)"
    return (f"SELECT n.attempt, s.* EXCLUDE (file_row_number) FROM {rows} s JOIN (SELECT file_row_number AS r, "
            f"{attempt_index('file_row_number')} AS attempt FROM {rows}) n "
            f"ON s.file_row_number = n.r")


def _raise_infra(exc: duckdb.Error, files: list[Path]) -> None:
    if isinstance(exc, (duckdb.OutOfMemoryException, duckdb.IOException)):
        raise InfraError(f"import of {files[0]} stopped (memory limit {MEMORY_LIMIT}; nothing was written)", exc) from None
