"""Exact field types of ThinkingBox result lines, checked before `import-tb` converts anything.

Why: the importer's fast path parses lines straight into typed columns, and its fallback reads
JSON values with Python's truthiness. Both would convert quietly: `"result": "yes"` would become
a pass, an integer uid a task id, `"many"` tokens 0, and -5 tokens would stay -5. A result file
is evidence; a value of the wrong type is a bug upstream that must not become a score. So by
default every line is checked against the reference's types, and the first wrong line is named
with its field and value (a Python scan, run only then). `--lenient` converts instead and says
how many lines needed it.

Where the check runs: inside the import's own read. The importer reads every small field as a
JSON leaf (`LEAF_COLUMNS`: one parse of the line, the leaves kept as their JSON text), so the
exactness of a line (`exact_leaves_sql`) costs string tests on short texts, and the values come
from the same leaves. A file those structures cannot hold (usage as one object, a test_result
that is a list) is checked by `count_inexact`, a scan of the fields as whole JSON values.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import duckdb

from tbhpc.store.sqltext import literal_list

TOKEN_FIELDS = ("input_tokens", "output_tokens", "input_tokens_details.cached_tokens",
                "output_tokens_details.reasoning_tokens")


def _types_in(expr: str, paths: list[str], allowed: list[tuple[str, ...]]) -> str:
    """Every one of `paths` in the object `expr` absent, null or of its allowed JSON types: one
    json_type call with a list of paths (one parse of the object, not one per field)."""
    want = "[" + ", ".join("[" + ", ".join(f"'{t}'" for t in a) + "]" for a in allowed) + "]"
    got = f"json_type({expr}, [{', '.join(repr(p) for p in paths)}])"
    return f"list_bool_and(list_transform(list_zip({got}, {want}), p -> p[1] IS NULL OR p[1] = 'NULL' OR list_contains(p[2], p[1])))"


def _scalar_in(expr: str, *allowed: str) -> str:
    return f"coalesce(json_type({expr}) IN ({', '.join(repr(a) for a in (*allowed, 'NULL'))}), true)"


_USAGE_ENTRY = ('[{"input_tokens": "JSON", "output_tokens": "JSON", "input_tokens_details": {"cached_tokens": "JSON"}, '
                '"output_tokens_details": {"reasoning_tokens": "JSON"}}]')


def _count_ok(v: str) -> str:
    """A non-negative integer below 2^63, null or absent (try_cast only: DuckDB evaluates both sides
    of an AND, and a cast of "yes" would fail)."""
    return f"({v} IS NULL OR json_type({v}) = 'NULL' OR coalesce({leaf_count(v)} >= 0, false))"


def _tokens_ok(usage: str) -> str:
    """Every usage entry an object and every token count in it a non-negative integer (or absent or
    null; a *_details that is not an object counts as absent, as the reference reads it). The
    entries are parsed once into structs of JSON values."""
    arr = f"(CASE json_type({usage}) WHEN 'OBJECT' THEN json_array({usage}) ELSE {usage} END)"
    entries = f"coalesce(list_bool_and(list_transform(json_extract({arr}, '$[*]'), e -> json_type(e) = 'OBJECT')), true)"
    counts = " AND ".join(_count_ok(f"e.{f}") for f in TOKEN_FIELDS)
    return f"({entries} AND coalesce(list_bool_and(list_transform(json_transform({arr}, '{_USAGE_ENTRY}'), e -> {counts})), true))"


_TEST_RESULT = [("BOOLEAN",), ("BOOLEAN",), ("VARCHAR",), ("VARCHAR",), ("UBIGINT", "BIGINT", "DOUBLE")]

# The small fields of a line, each leaf as its JSON text (JSON null and absent are both SQL NULL).
_J = "JSON"
LEAF_COLUMNS = {
    "uid": _J, "finish_reason": _J, "is_system_error": _J, "error": _J,
    "test_result": "STRUCT(result JSON, is_system_error JSON, reward JSON, error JSON, tb JSON)",
    "usage": ("STRUCT(input_tokens JSON, input_tokens_details STRUCT(cached_tokens JSON), output_tokens JSON, "
              "output_tokens_details STRUCT(reasoning_tokens JSON))[]"),
    "metadata": "STRUCT(scenario JSON, error JSON)"}
LEAF_TOKENS = {"in": "input_tokens", "cached": "input_tokens_details.cached_tokens", "out": "output_tokens",
               "reasoning": "output_tokens_details.reasoning_tokens"}


def leaf_count(leaf: str) -> str:
    """The token count in a JSON leaf, NULL unless an integer (a number with a fraction or an
    exponent is not one: the cast alone would round 1.5 to 2)."""
    return f"CASE WHEN json_type({leaf}) IN ('UBIGINT', 'BIGINT') THEN try_cast({leaf}::VARCHAR AS BIGINT) END"


def leaf_entries(usage: str) -> str:
    """The usage entries of `LEAF_COLUMNS` as structs: `entry` (the entry is not null), and per
    token field its count (`leaf_count`) and `given_*` (present, not null). Computed once per line,
    read by both the token sums and `exact_leaves_sql`."""
    fields = ", ".join(f"'{k}': {leaf_count('x.' + p)}, 'given_{k}': x.{p} IS NOT NULL" for k, p in LEAF_TOKENS.items())
    return f"list_transform({usage}, x -> {{'entry': x IS NOT NULL, {fields}}})"


def exact_leaves_sql(entries: str = "entries") -> str:
    """A boolean SQL expression over `LEAF_COLUMNS` and `entries` (`leaf_entries` of usage): the line
    has the reference's types (the same rules as `exact_sql` and `type_problem`). JSON texts are
    tested as strings: a string leaf starts with a quote, a boolean is `true` or `false`."""
    string = lambda leaf: f"coalesce(starts_with({leaf}, '\"'), true)"        # noqa: E731
    boolean = lambda leaf: f"coalesce({leaf} IN ('true', 'false'), true)"      # noqa: E731
    counts = " AND ".join(f"(NOT y.given_{k} OR coalesce(y.{k} >= 0, false))" for k in LEAF_TOKENS)
    return " AND ".join([
        "starts_with(uid, '\"') AND uid <> '\"\"'", boolean("is_system_error"), string("finish_reason"), string("error"),
        boolean("test_result.result"), boolean("test_result.is_system_error"), string("test_result.error"),
        string("test_result.tb"), "coalesce(isfinite(try_cast(test_result.reward::VARCHAR AS DOUBLE)), test_result.reward IS NULL)",
        string("metadata.scenario"), string("metadata.error"),
        f"coalesce(list_bool_and(list_transform({entries}, y -> y.entry AND {counts})), true)"])


def exact_sql() -> str:
    """A boolean SQL expression over the JSON columns uid, is_system_error, test_result, usage,
    metadata, finish_reason, error: the line has the reference's types."""
    tr, md = "test_result", "metadata"
    return " AND ".join([
        "json_type(uid) = 'VARCHAR' AND (uid ->> '$') <> ''",
        _scalar_in("is_system_error", "BOOLEAN"), _scalar_in("finish_reason", "VARCHAR"), _scalar_in("error", "VARCHAR"),
        f"({tr} IS NULL OR json_type({tr}) = 'NULL' OR (json_type({tr}) = 'OBJECT' AND "
        f"{_types_in(tr, ['$.result', '$.is_system_error', '$.error', '$.tb', '$.reward'], _TEST_RESULT)} AND "
        f"coalesce(isfinite(try_cast(({tr} -> '$.reward')::VARCHAR AS DOUBLE)), true)))",     # Infinity, NaN
        "(usage IS NULL OR json_type(usage) = 'NULL' OR (json_type(usage) IN ('ARRAY', 'OBJECT') AND "
        f"{_tokens_ok('usage')}))",
        f"({md} IS NULL OR json_type({md}) = 'NULL' OR (json_type({md}) = 'OBJECT' AND "
        f"{_types_in(md, ['$.scenario', '$.error'], [('VARCHAR',), ('VARCHAR',)])}))",
    ])


def count_inexact(files: list[Path], max_line_bytes: int) -> int | None:
    """Lines whose fields are not of the reference's types, from the fields as whole JSON values
    (for files `LEAF_COLUMNS` cannot hold); None when DuckDB cannot read them as JSON at all (the
    line-by-line scan then says why)."""
    cols = "{" + ", ".join(f"'{c}': 'JSON'" for c in ("uid", "is_system_error", "test_result", "usage", "metadata",
                                                        "finish_reason", "error")) + "}"
    scan = (f"read_json({literal_list(files)}, format='newline_delimited', columns={cols}, "
            f"maximum_object_size={max_line_bytes})")
    with duckdb.connect(":memory:") as con:
        con.execute("SET threads = 2")
        try:
            return int(con.execute(f"SELECT count(*) FILTER (WHERE NOT coalesce({exact_sql()}, false)) FROM {scan}").fetchone()[0])
        except duckdb.Error:
            return None


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def type_problem(obj: dict) -> str:
    """The first field of one parsed line that is not of the reference's type, as 'field X: ...'."""
    uid = obj.get("uid")
    if uid is None or uid == "":
        return "missing string field 'uid'"
    if not isinstance(uid, str):
        return f"field 'uid' must be a string, got {json.dumps(uid)}"
    for name in ("is_system_error",):
        if obj.get(name) is not None and not isinstance(obj[name], bool):
            return f"field {name!r} must be true, false or null, got {json.dumps(obj[name])}"
    for name in ("finish_reason", "error"):
        if obj.get(name) is not None and not isinstance(obj[name], str):
            return f"field {name!r} must be a string or null, got {json.dumps(obj[name])}"
    tr = obj.get("test_result")
    if tr is not None:
        if not isinstance(tr, dict):
            return "field 'test_result' must be an object"
        for name in ("result", "is_system_error"):
            if tr.get(name) is not None and not isinstance(tr[name], bool):
                return f"field 'test_result.{name}' must be true, false or null, got {json.dumps(tr[name])}"
        reward = tr.get("reward")
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward)):
            return f"field 'test_result.reward' must be a finite number or null, got {json.dumps(reward)}"
        for name in ("error", "tb"):
            if tr.get(name) is not None and not isinstance(tr[name], str):
                return f"field 'test_result.{name}' must be a string or null, got {json.dumps(tr[name])}"
    usage = obj.get("usage")
    if usage is not None:
        if not isinstance(usage, (list, dict)):
            return "field 'usage' must be a list of objects or an object"
        for i, entry in enumerate([usage] if isinstance(usage, dict) else usage):
            if not isinstance(entry, dict):
                return f"field 'usage[{i}]' must be an object, got {json.dumps(entry)}"
            for field in TOKEN_FIELDS:
                value: object = entry
                for part in field.split("."):
                    value = value.get(part) if isinstance(value, dict) else None
                if value is not None and (not _is_int(value) or not 0 <= value < 2**63):
                    return f"field 'usage[{i}].{field}' must be a non-negative integer, got {json.dumps(value)}"
    md = obj.get("metadata")
    if md is not None:
        if not isinstance(md, dict):
            return f"field 'metadata' must be an object, got {json.dumps(md)}"
        for name in ("scenario", "error"):
            if md.get(name) is not None and not isinstance(md[name], str):
                return f"field 'metadata.{name}' must be a string or null, got {json.dumps(md[name])}"
    return ""


def parsed_lines(files: list[Path]):
    """(file, line number, the parsed object or None, why it is not a JSON object or '') for
    every non-blank line of `files`."""
    for f in files:
        with open(f, encoding="utf-8") as fh:
            for no, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as exc:
                    yield f, no, None, f"not valid JSON ({exc.msg})"
                    continue
                yield f, no, obj, "" if isinstance(obj, dict) else "expected a JSON object"


def inexact_message(f: Path, no: int, problem: str) -> str:
    """The one-line error for a line that is not JSON or not of the reference's types."""
    return f"{f}: line {no}: {problem}" + ("" if "JSON" in problem else " (--lenient converts such values)")


def first_inexact_line(files: list[Path]) -> str:
    """`inexact_message` for the first line of a wrong type, '' if none (a line-by-line scan)."""
    for f, no, obj, problem in parsed_lines(files):
        if problem := problem or type_problem(obj):
            return inexact_message(f, no, problem)
    return ""


def count_inexact_python(files: list[Path]) -> int:
    """The same count as `count_inexact`, line by line (when DuckDB cannot read a file as JSON)."""
    return sum(1 for _, _, obj, problem in parsed_lines(files) if not problem and type_problem(obj))
