"""Read ThinkingBox test-case files (Python modules) without ever running them.

Why `ast` and never import or exec: the reference harness executes these files to grade an
attempt. tbhpc needs only their declarations: the YAML in docstrings that start with `!` and
which of the two known checks a test body calls (`validate_database`, `validate_rubrics_yesno`),
which it grades natively. Executing data files inside campaign workers would let a task file
run code on every node of a cluster, so a file that would do anything else (`tb/checks.py` says
exactly what) is `UngradableFile` at load time, naming the file, the test and the line, instead of
being silently half-graded. Callers that load a whole checkout skip such files and say why.

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
from tbhpc.tb.checks import body_checks, file_checks

CONFIG_FIELDS = frozenset({"scenario", "query", "user_context", "max_user_sim_turns", "max_agent_sim_turns",
                           "bot_instructions", "history", "init", "format_query", "tags"})
UNSUPPORTED_FIELDS = ("history", "format_query")   # no benchmark task uses them; refused rather than ignored
_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class TestFunction:
    file: str                      # the file's name: the first half of the task id
    name: str
    line: int
    config: dict[str, Any]
    checks: tuple[str, ...]        # which checks the body calls, in order of first call
    servers: dict[str, tuple[str, ...] | None]   # check -> the servers the file's helper reads (None: every server)

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
    helpers = file_checks(tree, path)              # the whole file is gradable, or none of it
    bodies = {node.name: body_checks(node, path, helpers) for node in tree.body
              if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_test(node)}
    defaults: dict[str, Any] = {}
    tests: list[TestFunction] = []
    for node in tree.body:
        if _is_string(node):
            doc = _yaml_doc(node, path, None)
            if doc is not None:
                _check_keys(doc, path, None, node.lineno)
                defaults.update(doc)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in bodies:
            if only is not None and node.name not in only:
                continue
            doc = _yaml_doc(node.body[0], path, node.name)
            _check_keys(doc, path, node.name, node.body[0].lineno)
            config = {**defaults, **doc}
            if isinstance(defaults.get("tags"), list) and isinstance(doc.get("tags"), list):
                config["tags"] = defaults["tags"] + doc["tags"]
            checks = bodies[node.name]
            tests.append(TestFunction(path.name, node.name, node.lineno, config, checks,
                                      {c: helpers.servers[c] for c in checks}))
    return tests


def _is_test(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """A test is a function whose first statement is a `!` docstring (as the reference)."""
    return bool(fn.body) and _is_string(fn.body[0]) and fn.body[0].value.value.startswith("!")


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
