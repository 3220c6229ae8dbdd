"""Read ThinkingBox test-case files (Python modules) without ever running them.

Why `ast` and never import or exec: the reference harness executes these files to grade an
attempt. tbhpc needs only their declarations: the YAML in docstrings that start with `!` and
which of the two known checks a test body calls (`validate_database`, `validate_rubrics_yesno`),
which it grades natively. Executing data files inside campaign workers would let a task file
run code on every node of a cluster, so a body that does anything else is refused at load time, naming the file,
the test and the line, instead of being silently half-graded.

Format (as the reference): a module-level string starting with `!` is YAML defaults (e.g.
`scenario: NAME`); each test is a function whose first statement is such a string; the test's
config is the defaults updated by its own keys (`tags` lists concatenate).
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tbhpc.errors import PackError

CONFIG_FIELDS = frozenset({"scenario", "query", "user_context", "max_user_sim_turns", "max_agent_sim_turns",
                           "bot_instructions", "history", "init", "format_query", "tags"})
UNSUPPORTED_FIELDS = ("history", "format_query")   # no benchmark task uses them; refused rather than ignored
CHECKS = ("validate_database", "validate_rubrics_yesno")
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class TestFunction:
    file: str                      # the file's name: the first half of the task id
    name: str
    line: int
    config: dict[str, Any]
    checks: tuple[str, ...]        # which of CHECKS the body calls, in order of first call

    @property
    def id(self) -> str:
        return f"{self.file}:{self.name}"


def parse_test_file(path: Path | str, only: set[str] | None = None) -> list[TestFunction]:
    """Every test of the file (or only the named ones), in file order."""
    path = Path(path)
    try:
        code = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise PackError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        tree = ast.parse(code, filename=str(path))
    except SyntaxError as exc:
        raise PackError(str(path), f"line {exc.lineno}: not valid Python: {exc.msg}") from None
    defaults: dict[str, Any] = {}
    tests: list[TestFunction] = []
    for node in tree.body:
        if _is_string(node):
            doc = _yaml_doc(node, path, None)
            if doc is not None:
                _check_keys(doc, path, None, node.lineno)
                defaults.update(doc)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body and _is_string(node.body[0]):
            doc = _yaml_doc(node.body[0], path, node.name)
            if doc is None or (only is not None and node.name not in only):
                continue
            _check_keys(doc, path, node.name, node.body[0].lineno)
            config = {**defaults, **doc}
            if isinstance(defaults.get("tags"), list) and isinstance(doc.get("tags"), list):
                config["tags"] = defaults["tags"] + doc["tags"]
            tests.append(TestFunction(path.name, node.name, node.lineno, config, _checks(node, path)))
    return tests


def _is_string(node: ast.stmt) -> bool:
    return isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)


def _yaml_doc(node: ast.Expr, path: Path, test: str | None) -> dict | None:
    text = node.value.value
    if not text.startswith("!"):
        return None
    try:
        doc = yaml.load(textwrap.dedent(text[1:]), Loader=_SAFE_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = node.lineno + (mark.line if mark else 0)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PackError(str(path), f"line {line}: malformed YAML docstring: {problem}", test) from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise PackError(str(path), f"line {node.lineno}: a '!' docstring must be a YAML mapping", test)
    return doc


def _check_keys(doc: dict, path: Path, test: str | None, line: int) -> None:
    for key in doc:
        if key not in CONFIG_FIELDS:
            raise PackError(str(path), f"line {line}: unknown key {key!r} (allowed: {', '.join(sorted(CONFIG_FIELDS))})",
                            test, str(key))
        if key in UNSUPPORTED_FIELDS and doc[key] is not None:
            raise PackError(str(path), f"line {line}: {key!r} is not supported by tbhpc (no benchmark task uses it)",
                            test, key)


def _checks(fn: ast.FunctionDef | ast.AsyncFunctionDef, path: Path) -> tuple[str, ...]:
    """The checks the body calls. Anything else in the body would need the file to run: refused."""
    found: list[str] = []
    for stmt in fn.body[1:]:
        if isinstance(stmt, ast.Pass) or _is_string(stmt):
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        name = _call_name(call) if isinstance(call, ast.Call) else None
        if name not in CHECKS:
            what = f"calls {name}()" if name else f"has a statement of type {type(stmt).__name__}"
            raise PackError(str(path), f"line {stmt.lineno}: the test body {what}; tbhpc never runs test files and "
                            f"grades only {' and '.join(CHECKS)}", fn.name)
        if name not in found:
            found.append(name)
    if "validate_database" not in found:
        raise PackError(str(path), f"line {fn.lineno}: the test never calls validate_database (nothing to grade)", fn.name)
    return tuple(found)


def _call_name(call: ast.Call) -> str | None:
    f = call.func
    if isinstance(f, ast.Name):
        return f.id
    if isinstance(f, ast.Attribute):
        return f.attr
    return None
