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
_INT = ("UBIGINT", "BIGINT")


def _bool_or_null(expr: str, path: str = "$") -> str:
    return f"coalesce(json_type({expr}, '{path}') IN ('BOOLEAN', 'NULL'), true)"


def _str_or_null(expr: str, path: str = "$") -> str:
    return f"coalesce(json_type({expr}, '{path}') IN ('VARCHAR', 'NULL'), true)"


def _tokens_ok(usage: str) -> str:
    """Every token count of every usage entry a non-negative integer (or absent/null)."""
    arr = f"(CASE json_type({usage}) WHEN 'OBJECT' THEN json_array({usage}) ELSE {usage} END)"
    checks = []
    for field in TOKEN_FIELDS:
        values = f"json_extract({arr}, '$[*].{field}')"
        checks.append(f"coalesce(list_bool_and(list_transform({values}, v -> json_type(v) = 'NULL' OR "
                      f"(json_type(v) IN ('UBIGINT', 'BIGINT') AND v::BIGINT >= 0))), true)")
    entries = f"coalesce(list_bool_and(list_transform(json_extract({arr}, '$[*]'), e -> json_type(e) = 'OBJECT')), true)"
    return f"({entries} AND {' AND '.join(checks)})"


def exact_sql() -> str:
    """A boolean SQL expression over the JSON columns uid, is_system_error, test_result, usage,
    metadata, finish_reason, error: the line has the reference's types."""
    tr = "test_result"
    return " AND ".join([
        "json_type(uid) = 'VARCHAR' AND (uid ->> '$') <> ''",
        _bool_or_null("is_system_error"), _str_or_null("finish_reason"), _str_or_null("error"),
        f"({tr} IS NULL OR json_type({tr}) = 'NULL' OR (json_type({tr}) = 'OBJECT' AND {_bool_or_null(tr, '$.result')} "
        f"AND {_bool_or_null(tr, '$.is_system_error')} AND {_str_or_null(tr, '$.error')} AND {_str_or_null(tr, '$.tb')} "
        f"AND coalesce(json_type({tr}, '$.reward') IN ('UBIGINT', 'BIGINT', 'DOUBLE', 'NULL'), true)))",
        "(usage IS NULL OR json_type(usage) = 'NULL' OR (json_type(usage) IN ('ARRAY', 'OBJECT') AND "
        f"{_tokens_ok('usage')}))",
        "(metadata IS NULL OR json_type(metadata) = 'NULL' OR (json_type(metadata) = 'OBJECT' AND "
        f"{_str_or_null('metadata', '$.scenario')} AND {_str_or_null('metadata', '$.error')}))",
    ])


# The reference's types as json_group_structure names them: a leaf is the set of type names a field
# may have over the whole file (JSON null never changes a structure); "NULL" alone: only nulls seen.
_BOOL, _STR = {"BOOLEAN"}, {"VARCHAR"}
_COUNT = {"UBIGINT"}                           # a negative count makes it BIGINT, a fraction DOUBLE


class Loose(dict):
    """An object whose fields are checked when it is one; any other value counts as absent (the
    reference reads `usage[].*_tokens_details.*` that way, and so does `type_problem`)."""


_USAGE_ENTRY = {"input_tokens": _COUNT, "output_tokens": _COUNT, "input_tokens_details": Loose(cached_tokens=_COUNT),
                "output_tokens_details": Loose(reasoning_tokens=_COUNT)}
EXACT_STRUCTURE = {
    "is_system_error": _BOOL, "finish_reason": _STR, "error": _STR,
    "test_result": {"result": _BOOL, "is_system_error": _BOOL, "reward": {"UBIGINT", "BIGINT", "DOUBLE"},
                    "error": _STR, "tb": _STR},
    "usage": [_USAGE_ENTRY],
    "metadata": {"scenario": _STR, "error": _STR},
}


def fits(have, want) -> bool:
    """Whether a json_group_structure value `have` (parsed) admits only the types `want` allows."""
    if have is None or have == "NULL":
        return True
    if isinstance(want, set):
        return isinstance(have, str) and have in want
    if isinstance(want, Loose) and not isinstance(have, dict):
        return have != "JSON"          # scalars or lists only (JSON: an object mixed with something else)
    if isinstance(want, dict):
        return isinstance(have, dict) and all(fits(have.get(k), w) for k, w in want.items())
    return isinstance(have, list) and all(fits(h, want[0]) for h in have)


def file_structure(files: list[Path], max_line_bytes: int) -> tuple[int, dict] | None:
    """(lines without a non-empty string uid, {field: its json_group_structure over all lines,
    parsed}) from one aggregate scan; None when DuckDB cannot read the files as JSON."""
    fields = ("uid", *EXACT_STRUCTURE)
    cols = "{" + ", ".join(f"'{c}': 'JSON'" for c in fields) + "}"
    scan = (f"read_json({literal_list(files)}, format='newline_delimited', columns={cols}, "
            f"maximum_object_size={max_line_bytes})")
    aggs = ", ".join(f"json_group_structure({c})" for c in EXACT_STRUCTURE)
    with duckdb.connect(":memory:") as con:
        con.execute("SET threads = 2")
        try:
            bad_uid, *structures = con.execute(
                f"SELECT count(*) FILTER (WHERE json_type(uid) IS DISTINCT FROM 'VARCHAR' OR (uid ->> '$') = ''), "
                f"{aggs} FROM {scan}").fetchone()
        except duckdb.Error:
            return None
    return int(bad_uid), {k: json.loads(v) if v is not None else None for k, v in zip(EXACT_STRUCTURE, structures)}


def all_exact(files: list[Path], max_line_bytes: int) -> bool | None:
    """Whether every line has the reference's types, from the type structure of each field across
    all lines (file_structure: a JSON parse per field and line, where `count_inexact` checks each
    line field by field, ~20 parses). False says only that some line may not (an object and
    another value in one place across lines also gives False): `count_inexact` then counts them
    exactly. None: DuckDB cannot read the files as JSON."""
    got = file_structure(files, max_line_bytes)
    if got is None:
        return None
    bad_uid, structures = got
    if bad_uid:
        return False
    for name, want in EXACT_STRUCTURE.items():
        have = structures[name]
        if name == "usage" and isinstance(have, dict):       # usage as one object on every line
            have = [have]
        if not fits(have, want):
            return False
    return True


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
