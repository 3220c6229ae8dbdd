"""SQL literals for the store's statements, rendered in Python.

Why not DuckDB's `?` parameters: the Python client imports pandas on the first parameterised
call (to recognise data frames), which costs ~0.5 s and ~50 MiB in every short-lived command
that merges or imports results. The store's values are plain strings, numbers and paths, so it
renders them as literals instead; this module is the one place that knows how.
"""
from __future__ import annotations

from pathlib import Path


def literal(value) -> str:
    """A SQL literal for None, bool, int, float, str or Path."""
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        if value != value or value in (float("inf"), float("-inf")):
            return f"'{value}'::DOUBLE"
        return repr(value)
    if isinstance(value, (str, Path)):
        text = str(value)
        if "\x00" in text:
            raise ValueError("a SQL string literal cannot hold a NUL character")
        return "'" + text.replace("'", "''") + "'"
    raise TypeError(f"no SQL literal for {type(value).__name__}")


def literal_list(values) -> str:
    """A SQL list literal, e.g. of file names for read_json."""
    return "[" + ", ".join(literal(v) for v in values) + "]"
