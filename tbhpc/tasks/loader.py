"""Declarative loading of task packs and scenarios (YAML, `safe_load` only: no code runs).

Why so strict: a pack feeds thousands of Slurm array tasks. A missing field or an unknown tool
must stop the user at load time with one line naming file, task and field, not surface as a
reward of 0 in a campaign.

A pack is a directory of `*.yaml` files, each `{domain: NAME, tasks: [...]}`, plus an optional
`eval_ids.txt` exclusion list (one task id per line).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable

import yaml

from tbhpc.argcheck import check_object
from tbhpc.errors import PackError, UserError
from tbhpc.tasks.schema import SPLITS, GoldenCall, ManualDoc, Rubric, Scenario, Task

_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available, else pure Python

TASK_FIELDS = {
    "id", "domain", "split", "template", "instance", "tags", "query", "user_context", "init",
    "golden", "rubrics_yesno", "output_contains", "max_user_turns", "backend",
}


def default_pack_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "data" / "packs" / "default"


# Bundled packs by name (`pack=demo`): the full pack for real models and the demo pack sized for the
# demo model. A path that exists always wins over a name.
BUNDLED_PACKS = {"full": "default", "default": "default", "demo": "demo"}


def resolve_pack(pack: "Path | str | None") -> Path:
    """A pack argument as a path: None is the full pack, a bundled name its directory."""
    if pack is None:
        return default_pack_dir()
    if isinstance(pack, str) and pack in BUNDLED_PACKS and not Path(pack).exists():
        return default_pack_dir().parent / BUNDLED_PACKS[pack]
    return Path(pack)


def read_yaml(path: Path) -> Any:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise PackError(str(path), f"cannot read: {exc.strerror or exc}") from None
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)  # safe loader: no Python objects, no code
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise PackError(str(path), f"malformed YAML{where}: {problem}") from None


def pack_files(pack: Path) -> list[Path]:
    pack = Path(pack)
    if pack.is_file():
        return [pack]
    if not pack.is_dir():
        raise PackError(str(pack), "no such pack file or directory")
    files = sorted(p for p in pack.glob("*.yaml"))
    if not files:
        raise PackError(str(pack), "pack directory holds no *.yaml files")
    return files


def load_pack(pack: Path | str | None = None) -> list[Task]:
    """Load every task of a pack (file or directory); ids must be unique across the pack."""
    pack = resolve_pack(pack)
    tasks: list[Task] = []
    seen: dict[str, str] = {}
    for path in pack_files(pack):
        for task in load_task_file(path):
            if task.id in seen:
                raise PackError(str(path), f"duplicate id (also in {seen[task.id]})", task.id, "id")
            seen[task.id] = str(path)
            tasks.append(task)
    return tasks


def read_id_list(path: Path | str) -> list[str]:
    """Task ids from a YAML list (a ThinkingBox test list), a pool file ({tasks: [...]}) or a text
    file with one id per line (blank lines and # comments ignored)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise UserError(f"{path}: cannot read task list: {exc.strerror or exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError:
        doc = None
    if isinstance(doc, dict) and isinstance(doc.get("tasks"), list):
        doc = doc["tasks"]
    if isinstance(doc, list) and all(isinstance(x, str) for x in doc):
        return doc
    return [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def load_exclusions(path: Path | str) -> set[str]:
    return set(read_id_list(path))


def load_task_file(path: Path) -> list[Task]:
    """Tasks of one pack file. Parsed once per process per file version (path, mtime, size):
    tasks are immutable records, and campaigns, workers and tests load the same pack often."""
    st = Path(path).stat() if Path(path).exists() else None
    if st is None:
        return list(_parse_task_file(path))
    return list(_cached_task_file(str(path), st.st_mtime_ns, st.st_size))


@lru_cache(maxsize=64)
def _cached_task_file(path: str, mtime_ns: int, size: int) -> tuple[Task, ...]:
    return _parse_task_file(Path(path))


def _parse_task_file(path: Path) -> tuple[Task, ...]:
    doc = read_yaml(path)
    file = str(path)
    if not isinstance(doc, dict) or not isinstance(doc.get("tasks"), list):
        raise PackError(file, "expected a mapping with a 'tasks' list")
    default_domain = doc.get("domain")
    return tuple(parse_task(raw, file, i, default_domain) for i, raw in enumerate(doc["tasks"]))


def parse_task(raw: Any, file: str, index: int, default_domain: str | None = None) -> Task:
    if not isinstance(raw, dict):
        raise PackError(file, "task entry must be a mapping", f"#{index}")
    tid = raw.get("id")
    if not isinstance(tid, str) or not tid.strip():
        raise PackError(file, "missing or empty string", f"#{index}", "id")
    r = _Reader(file, tid, raw)
    unknown = sorted(set(raw) - TASK_FIELDS)
    if unknown:
        raise PackError(file, f"unknown field(s) {', '.join(unknown)}", tid, unknown[0])
    domain = raw.get("domain", default_domain)
    if not isinstance(domain, str) or not domain:
        raise PackError(file, "missing or empty string", tid, "domain")
    split = r.get("split", str)
    if split not in SPLITS:
        raise PackError(file, f"must be one of {', '.join(SPLITS)}, got {split!r}", tid, "split")
    init = r.get("init", dict, default={})
    patch = init.get("data_patch") or {}
    if not isinstance(patch, dict):
        raise PackError(file, "expected a mapping table -> rows", tid, "init.data_patch")
    for table, rows in patch.items():
        if not isinstance(rows, list) or not all(isinstance(x, dict) for x in rows):
            raise PackError(file, "expected a list of row mappings", tid, f"init.data_patch.{table}")
        for j, row in enumerate(rows):
            if "id" not in row:
                raise PackError(file, "row has no 'id'", tid, f"init.data_patch.{table}[{j}]")
    golden = r.get("golden", dict)
    calls_raw = golden.get("tool_interactions")
    if not isinstance(calls_raw, list):
        raise PackError(file, "expected a list", tid, "golden.tool_interactions")
    calls = []
    for j, c in enumerate(calls_raw):
        where = f"golden.tool_interactions[{j}]"
        if not isinstance(c, dict) or not isinstance(c.get("tool"), str):
            raise PackError(file, "expected {tool: NAME, parameters: {...}}", tid, where)
        params = c.get("parameters", {}) or {}
        if not isinstance(params, dict):
            raise PackError(file, "expected a mapping", tid, where + ".parameters")
        calls.append(GoldenCall(c["tool"], params))
    rubrics = []
    for j, item in enumerate(r.get("rubrics_yesno", list, default=[])):
        if isinstance(item, str):
            rubrics.append(Rubric(item))
        elif isinstance(item, dict) and isinstance(item.get("question"), str):
            kws = item.get("keywords", []) or []
            if not isinstance(kws, list) or not all(isinstance(k, str) for k in kws):
                raise PackError(file, "expected a list of strings", tid, f"rubrics_yesno[{j}].keywords")
            rubrics.append(Rubric(item["question"], tuple(kws)))
        else:
            raise PackError(file, "expected a question string or {question, keywords}", tid, f"rubrics_yesno[{j}]")
    max_user_turns = r.get("max_user_turns", int, default=10)
    if max_user_turns < 0:
        raise PackError(file, "must be >= 0", tid, "max_user_turns")
    response = golden.get("response", "") or ""
    if not isinstance(response, str):
        raise PackError(file, "expected a string", tid, "golden.response")
    return Task(
        id=tid,
        domain=domain,
        query=r.get("query", str),
        user_context=r.get("user_context", str, default=""),
        data_patch={t: [dict(x) for x in rows] for t, rows in patch.items()},
        golden_calls=tuple(calls),
        split=split,
        rubrics_yesno=tuple(rubrics),
        output_contains=tuple(r.get_str_list("output_contains")),
        golden_response=response,
        max_user_turns=max_user_turns,
        tags=tuple(r.get_str_list("tags")),
        template=r.get("template", str, default=""),
        instance=r.get("instance", str, default=""),
        source_file=file,
        backend=r.get("backend", dict, default={}),
    )


class _Reader:
    """Typed field access that raises PackError naming file, task and field."""

    _NAMES = {str: "string", int: "integer", dict: "mapping", list: "list"}

    def __init__(self, file: str, tid: str, raw: dict):
        self.file, self.tid, self.raw = file, tid, raw

    def get(self, name: str, typ: type, default: Any = ...) -> Any:
        if name not in self.raw or self.raw[name] is None:
            if default is ...:
                raise PackError(self.file, "missing required field", self.tid, name)
            return default
        value = self.raw[name]
        if not isinstance(value, typ) or (typ is int and isinstance(value, bool)):
            got = type(value).__name__
            raise PackError(self.file, f"expected {self._NAMES[typ]}, got {got}", self.tid, name)
        return value

    def get_str_list(self, name: str) -> list[str]:
        value = self.get(name, list, default=[])
        if not all(isinstance(v, str) for v in value):
            raise PackError(self.file, "expected a list of strings", self.tid, name)
        return value


@dataclass(frozen=True)
class DomainCatalog:
    """What a pack is checked against: the domain's whitelisted tools and its tables."""

    tools: dict[str, dict]            # tool name -> JSON schema of its parameters
    tables: dict[str, frozenset[str]]  # table name -> column names
    read_only_tools: frozenset[str] = frozenset()


def validate_tasks(tasks: Iterable[Task], catalogs: dict[str, DomainCatalog], known: Iterable[str] = ()) -> None:
    """Check tools, parameter types and patched tables/columns against each domain's catalogue
    (`known`: every domain name there is, for the message; default: the catalogues')."""
    for t in tasks:
        cat = catalogs.get(t.domain)
        if cat is None:
            names = list(known) or sorted(catalogs)
            raise PackError(t.source_file, f"unknown domain {t.domain!r} (known: {', '.join(names)})", t.id, "domain")
        for table, rows in t.data_patch.items():
            if table not in cat.tables:
                raise PackError(t.source_file, f"unknown table {table!r}", t.id, f"init.data_patch.{table}")
            for j, row in enumerate(rows):
                bad = sorted(set(row) - cat.tables[table])
                if bad:
                    raise PackError(t.source_file, f"unknown column {bad[0]!r}", t.id, f"init.data_patch.{table}[{j}].{bad[0]}")
        for j, call in enumerate(t.golden_calls):
            where = f"golden.tool_interactions[{j}]"
            if call.tool not in cat.tools:
                raise PackError(t.source_file, f"unknown tool {call.tool!r}", t.id, where + ".tool")
            err = check_object(call.parameters, cat.tools[call.tool])
            if err:
                raise PackError(t.source_file, err, t.id, where + ".parameters")


def load_scenario(path: Path) -> Scenario:
    """Load one domain's scenario YAML: instructions, tool whitelist, policy manual, limits."""
    doc = read_yaml(path)
    file = str(path)
    if not isinstance(doc, dict):
        raise PackError(file, "expected a mapping")
    r = _Reader(file, doc.get("domain", "?"), doc)
    manual = []
    for j, d in enumerate(r.get("manual", list, default=[])):
        if not isinstance(d, dict) or not isinstance(d.get("name"), str) or not isinstance(d.get("text"), str):
            raise PackError(file, "expected {name, text}", None, f"manual[{j}]")
        manual.append(ManualDoc(d["name"], d["text"]))
    limits = r.get("limits", dict, default={})
    return Scenario(
        domain=r.get("domain", str),
        title=r.get("title", str),
        current_date=r.get("current_date", str),
        instructions=r.get("instructions", str),
        tools=tuple(r.get_str_list("tools")),
        manual=tuple(manual),
        max_user_turns=int(limits.get("max_user_turns", 10)),
        max_agent_turns=int(limits.get("max_agent_turns", 50)),
        agent_prompt=r.get("agent_prompt", str, default=""),
    )
