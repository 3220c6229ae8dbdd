"""Exact field types of ThinkingBox result lines, checked before `import-tb` converts anything.

Why: the importer's fast path parses lines straight into typed columns, and its fallback reads
JSON values with Python's truthiness. Both convert quietly: `"result": "yes"` became a pass, an
integer uid a task id, `"many"` tokens 0, and -5 tokens stayed -5. A result file is evidence; a
value of the wrong type is a bug upstream that must not become a score. So by default every
line is checked against the reference's types in one SQL scan of the small fields only (the
conversation is skipped), and the first wrong line is named with its field and value (a Python
scan, run only then). `--lenient` converts instead and says how many lines needed it.
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
    """A non-negative integer, null or absent: json_type says UBIGINT for every integer >= 0 and BIGINT
    only below 0 (no cast: DuckDB evaluates both sides of an AND, and a cast of "yes" would fail)."""
    return f"coalesce(json_type({v}) IN ('UBIGINT', 'NULL'), true)"


def _tokens_ok(usage: str) -> str:
    """Every usage entry an object and every token count in it a non-negative integer (or absent or
    null; a *_details that is not an object counts as absent, as the reference reads it). The
    entries are parsed once into structs of JSON values."""
    arr = f"(CASE json_type({usage}) WHEN 'OBJECT' THEN json_array({usage}) ELSE {usage} END)"
    entries = f"coalesce(list_bool_and(list_transform(json_extract({arr}, '$[*]'), e -> json_type(e) = 'OBJECT')), true)"
    counts = " AND ".join(_count_ok(f"e.{f}") for f in TOKEN_FIELDS)
    return f"({entries} AND coalesce(list_bool_and(list_transform(json_transform({arr}, '{_USAGE_ENTRY}'), e -> {counts})), true))"


_TEST_RESULT = [("BOOLEAN",), ("BOOLEAN",), ("VARCHAR",), ("VARCHAR",), ("UBIGINT", "BIGINT", "DOUBLE")]


def exact_sql() -> str:
    """A boolean SQL expression over the JSON columns uid, is_system_error, test_result, usage,
    metadata, finish_reason, error: the line has the reference's types."""
    tr, md = "test_result", "metadata"
    return " AND ".join([
        "json_type(uid) = 'VARCHAR' AND (uid ->> '$') <> ''",
        _scalar_in("is_system_error", "BOOLEAN"), _scalar_in("finish_reason", "VARCHAR"), _scalar_in("error", "VARCHAR"),
        f"({tr} IS NULL OR json_type({tr}) = 'NULL' OR (json_type({tr}) = 'OBJECT' AND "
        f"{_types_in(tr, ['$.result', '$.is_system_error', '$.error', '$.tb', '$.reward'], _TEST_RESULT)}))",
        "(usage IS NULL OR json_type(usage) = 'NULL' OR (json_type(usage) IN ('ARRAY', 'OBJECT') AND "
        f"{_tokens_ok('usage')}))",
        f"({md} IS NULL OR json_type({md}) = 'NULL' OR (json_type({md}) = 'OBJECT' AND "
        f"{_types_in(md, ['$.scenario', '$.error'], [('VARCHAR',), ('VARCHAR',)])}))",
    ])


def count_inexact(files: list[Path], max_line_bytes: int) -> int | None:
    """Lines whose fields are not of the reference's types; None when DuckDB cannot read them
    as JSON at all (the line-by-line scan then says why)."""
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
                if value is not None and (not _is_int(value) or value < 0):
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


def first_inexact_line(files: list[Path]) -> str:
    """'FILE: line N: field ...' for the first line of a wrong type (a line-by-line scan)."""
    for f, no, obj, problem in parsed_lines(files):
        if problem := problem or type_problem(obj):
            return f"{f}: line {no}: {problem}"
    return ""


def count_inexact_python(files: list[Path]) -> int:
    """The same count as `count_inexact`, line by line (when DuckDB cannot read a file as JSON)."""
    return sum(1 for _, _, obj, problem in parsed_lines(files) if not problem and type_problem(obj))
