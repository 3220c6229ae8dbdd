"""Which checks a ThinkingBox test-case file asks for, decided from its syntax alone.

Why recognise instead of run: the reference harness executes the file, and a test body calls
the file's own module-level helpers `validate_database(x)` and `validate_rubrics_yesno(x, judge)`.
tbhpc never runs task files (a campaign would otherwise run a data file's code on every node)
and grades those two checks natively, so it must be sure that what a file calls means exactly
what tbhpc grades. A helper is accepted only when its syntax shows the reference's semantics:

- `validate_database(x)`: fails exactly when `x.effects[S]["result_db_hash"]` differs from
  `x.effects[S]["golden_db_hash"]`, for each server S it names (a string, or a module constant
  bound once to a string). The hashes may first be bound to local names; what the failing branch
  does before its final `assert False` / `raise` (building a message) cannot change the verdict.
- `validate_rubrics_yesno(x, judge)`: asserts `judge.text_yesno(x.response, r)` for every `r` in
  `x.effects[S]["rubrics_yesno"]` (or `.get("rubrics_yesno", ...)`).

A file that defines neither calls tbhpc's own checks (the convention of `export-tb`; every
server is graded). Anything else makes the whole file ungradable (`UngradableFile`, naming file,
test and line): a body statement other than a check call, a check called with anything but the
test's own parameters, a helper that differs in any way (a `return`, another statement, another
key), or a check name bound some other way (import, assignment, class). A data-loading caller
may skip such a file and say why; it never grades it.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

from tbhpc.errors import PackError

DATABASE, RUBRICS = "validate_database", "validate_rubrics_yesno"
CHECKS = (DATABASE, RUBRICS)
_HASHES = {"result_db_hash": "result", "golden_db_hash": "golden"}


class UngradableFile(PackError):
    """A test-case file whose tests tbhpc cannot grade without running its code."""


@dataclass(frozen=True)
class FileChecks:
    servers: dict[str, tuple[str, ...] | None]   # check -> servers its helper reads (None: tbhpc's own, all servers)
    arity: dict[str, int]                         # check -> how many arguments a call passes


def file_checks(tree: ast.Module, path: Path) -> FileChecks:
    """The file's own definitions of the check names, each recognised or refused."""
    for node in tree.body:
        if (bad := _runs_code(node)) is not None:
            raise _refuse(path, node.lineno, f"the file runs code of its own when loaded ({bad}); the reference would "
                                             "run it before every test, and tbhpc never runs test files")
    consts = _string_constants(tree)
    servers: dict[str, tuple[str, ...] | None] = {DATABASE: None, RUBRICS: None}
    arity = {DATABASE: 1, RUBRICS: 2}
    defined: set[str] = set()
    for node in tree.body:
        for name, line in _bound_names(node):
            if name not in CHECKS:
                continue
            if not isinstance(node, ast.FunctionDef):
                raise _refuse(path, line, f"binds {name} by {type(node).__name__}: not the reference's helper; "
                                          "tbhpc never runs test files")
            if name in defined:
                raise _refuse(path, line, f"defines {name}() twice")
            defined.add(name)
            params = [a.arg for a in node.args.args]
            want = arity[name]
            if len(params) != want or node.args.vararg or node.args.kwarg or node.args.kwonlyargs:
                raise _refuse(path, line, f"{name}() must take exactly {want} plain parameter(s)")
            recognise = _database_servers if name == DATABASE else _rubric_servers
            found = recognise(node, params, consts)
            if isinstance(found, int):
                raise _refuse(path, found, f"the file's own {name}() is not the reference's "
                                           f"{'hash check' if name == DATABASE else 'yes/no rubric check'}, "
                                           "and tbhpc never runs test files, so it cannot grade by it")
            servers[name] = found
    return FileChecks(servers, arity)


def _runs_code(node: ast.stmt) -> str | None:
    """What a module-level statement would run when the file is loaded, beyond defining names (None: nothing)."""
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return None
    if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
        return None
    if isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value is not None:
        if isinstance(node, ast.AnnAssign) and not _plain_annotation(node.annotation):
            return "an annotation that is an expression"
        try:
            ast.literal_eval(node.value)
            return None
        except ValueError:
            return f"`{_code(node)}`"
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if node.decorator_list:
            return "a decorator"
        if node.args.defaults or any(d is not None for d in node.args.kw_defaults):
            return "default argument values"
        a = node.args
        notes = [arg.annotation for arg in a.posonlyargs + a.args + a.kwonlyargs + [a.vararg, a.kwarg] if arg] + [node.returns]
        if not all(_plain_annotation(n) for n in notes if n is not None):
            return "an annotation that is an expression"     # evaluated when the function is defined
        return None
    return f"`{_code(node)}`"


def _plain_annotation(node: ast.expr) -> bool:
    """A type written with names only (`TestContext`, `list[str]`, `str | None`): evaluating it runs nothing."""
    return all(isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Tuple, ast.List, ast.BinOp,
                              ast.BitOr, ast.expr_context)) for n in ast.walk(node))


def _code(node: ast.AST) -> str:
    line = ast.unparse(node).splitlines()[0]
    return line if len(line) <= 60 else line[:57] + "..."


def body_checks(fn: ast.FunctionDef | ast.AsyncFunctionDef, path: Path, checks: FileChecks) -> tuple[str, ...]:
    """The checks a test body calls, in order of first call. Anything else is refused."""
    params = [a.arg for a in fn.args.args]
    found: list[str] = []
    for stmt in fn.body[1:]:
        if isinstance(stmt, ast.Pass) or (isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
                                          and isinstance(stmt.value.value, str)):
            continue
        call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
        name = call.func.id if call is not None and isinstance(call.func, ast.Name) else None
        if name not in CHECKS:
            what = (f"calls {_callee(call)}()" if call is not None else f"has a statement of type {type(stmt).__name__}")
            raise UngradableFile(str(path), f"line {stmt.lineno}: the test body {what}; tbhpc never runs test files "
                                            f"and grades only {' and '.join(CHECKS)}", fn.name)
        want = params[:checks.arity[name]]
        given = [a.id if isinstance(a, ast.Name) else None for a in call.args]
        if call.keywords or given != want or len(want) < checks.arity[name]:
            shown = ast.unparse(call)
            raise UngradableFile(str(path), f"line {stmt.lineno}: {shown[:80]}: a check takes only the test's own "
                                            f"parameters ({name}({', '.join(params[:checks.arity[name]])}))", fn.name)
        if name not in found:
            found.append(name)
    if DATABASE not in found:
        raise UngradableFile(str(path), f"line {fn.lineno}: the test never calls {DATABASE} (nothing to grade)", fn.name)
    return tuple(found)


def _database_servers(fn: ast.FunctionDef, params: list[str], consts: dict[str, str]) -> tuple[str, ...] | int:
    """The servers whose result/golden hashes the helper compares, or the line that differs."""
    x = params[0]
    if (bad := _forbidden(fn)) is not None:
        return bad
    local: dict[str, tuple[str, str]] = {}
    servers: list[str] = []

    def read(node: ast.expr) -> tuple[str, str] | None:
        if isinstance(node, ast.Name):
            return local.get(node.id)
        if isinstance(node, ast.Subscript) and _literal(node.slice) in _HASHES:
            server = _effects_of(node.value, x, consts)
            return (server, _HASHES[_literal(node.slice)]) if server else None
        return None

    def compared(test: ast.expr, op: type) -> str | None:
        if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], op)):
            return None
        a, b = read(test.left), read(test.comparators[0])
        return a[0] if a and b and a[0] == b[0] and {a[1], b[1]} == {"result", "golden"} else None

    for stmt in _statements(fn):
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and (r := read(stmt.value)) and not isinstance(stmt.value, ast.Name)):
            local[stmt.targets[0].id] = r
        elif isinstance(stmt, ast.If) and not stmt.orelse and (s := compared(stmt.test, ast.NotEq)) and _fails(stmt.body):
            servers.append(s)
        elif isinstance(stmt, ast.Assert) and (s := compared(stmt.test, ast.Eq)):
            servers.append(s)
        else:
            return stmt.lineno
    return tuple(dict.fromkeys(servers)) if servers else fn.lineno


def _rubric_servers(fn: ast.FunctionDef, params: list[str], consts: dict[str, str]) -> tuple[str, ...] | int:
    """The server whose rubrics_yesno the helper asserts one by one with judge.text_yesno, or the line that differs."""
    x, judge = params
    if (bad := _forbidden(fn)) is not None:
        return bad
    stmts = _statements(fn)
    local: dict[str, str] = {}

    def rubrics_of(node: ast.expr) -> str | None:
        if isinstance(node, ast.Name):
            return local.get(node.id)
        if isinstance(node, ast.Subscript) and _literal(node.slice) == "rubrics_yesno":
            return _effects_of(node.value, x, consts)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get"
                and not node.keywords and 1 <= len(node.args) <= 2 and _literal(node.args[0]) == "rubrics_yesno"
                and all(isinstance(a, (ast.List, ast.Tuple, ast.Constant)) for a in node.args[1:])):
            return _effects_of(node.func.value, x, consts)
        return None

    servers: list[str] = []
    for stmt in stmts:
        if (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name)
                and (s := rubrics_of(stmt.value)) and not isinstance(stmt.value, ast.Name)):
            local[stmt.targets[0].id] = s
            continue
        if (isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name) and not stmt.orelse
                and (s := rubrics_of(stmt.iter)) and len(stmt.body) == 1 and isinstance(stmt.body[0], ast.Assert)):
            call = stmt.body[0].test
            if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr == "text_yesno"
                    and _is_name(call.func.value, judge) and not call.keywords and len(call.args) == 2
                    and isinstance(call.args[0], ast.Attribute) and call.args[0].attr == "response"
                    and _is_name(call.args[0].value, x) and _is_name(call.args[1], stmt.target.id)):
                servers.append(s)
                continue
        return stmt.lineno
    return tuple(dict.fromkeys(servers)) if servers else fn.lineno


def _effects_of(node: ast.expr, x: str, consts: dict[str, str]) -> str | None:
    """`x.effects[S]` -> S (a string literal or a module constant)."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) and node.value.attr == "effects" \
            and _is_name(node.value.value, x):
        key = node.slice
        if isinstance(key, ast.Name):
            return consts.get(key.id)
        value = _literal(key)
        return value if isinstance(value, str) else None
    return None


def _statements(fn: ast.FunctionDef) -> list[ast.stmt]:
    body = fn.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return body


def _fails(body: list[ast.stmt]) -> bool:
    last = body[-1] if body else None
    return (isinstance(last, ast.Raise) and last.exc is not None) or \
        (isinstance(last, ast.Assert) and isinstance(last.test, ast.Constant) and last.test.value is False)


def _forbidden(fn: ast.FunctionDef) -> int | None:
    """A statement that could end or divert the helper before its verdict (the line), if any."""
    for node in ast.walk(fn):
        if node is not fn and isinstance(node, (ast.Return, ast.Yield, ast.YieldFrom, ast.Try, ast.Global, ast.Nonlocal,
                                                ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.With, ast.While)):
            return node.lineno
    return None


def _string_constants(tree: ast.Module) -> dict[str, str]:
    """Module names bound exactly once, to a string literal."""
    counts: dict[str, int] = {}
    values: dict[str, str] = {}
    for node in tree.body:
        for name, _ in _bound_names(node):
            counts[name] = counts.get(name, 0) + 1
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) \
                and isinstance(_literal(node.value), str):
            values[node.targets[0].id] = _literal(node.value)
    return {k: v for k, v in values.items() if counts.get(k) == 1}


def _bound_names(node: ast.stmt) -> list[tuple[str, int]]:
    """Names a module-level statement binds (the file's statements are only these kinds: `_runs_code`)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [(node.name, node.lineno)]
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return [((a.asname or a.name).split(".")[0], node.lineno) for a in node.names]
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [(n.id, node.lineno) for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]


def _literal(node: ast.expr):
    return node.value if isinstance(node, ast.Constant) else None


def _is_name(node: ast.expr, name: str) -> bool:
    return isinstance(node, ast.Name) and node.id == name


def _callee(call: ast.Call) -> str:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ast.unparse(f)[:40]


def _refuse(path: Path, line: int, message: str) -> UngradableFile:
    return UngradableFile(str(path), f"line {line}: {message}")
