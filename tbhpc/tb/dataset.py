"""A ThinkingBox data checkout as a task source: scenarios + test lists + test files -> Tasks.

Why convert to tbhpc's own `Task`: probe, eval, select, agg and the trainer's pool all speak
`Task` and task ids; a ThinkingBox task differs only in where its tools live (MCP servers named
by the scenario) and how its initial state is set (`__reserved__init` with a per-server config),
so that goes into `Task.backend` and everything above the backend stays unchanged.

Layout (as `thinkingbox-data`): `ROOT/dataset/scenario/<name>.yaml`, `ROOT/dataset/test_case/**.py`;
ROOT may also be the `dataset/` folder itself. A task id is `"<file name>:<test name>"`; a bare
file name is found directly under `test_case/` or under the folder named by one of its
`_`-separated prefixes, longest first (`external_booking_v1_group1.py` ->
`test_case/external_booking_v1/`). A checkout also holds test files that are not ThinkingBox
checks (tau-bench ports whose bodies are plain asserts): loading everything skips each such file
and keeps its reason (`skipped`), `strict=True` makes it an error, and a test list that names a
task in such a file is an error naming the task and the file's reason. A server's init config is the scenario's `world_state[server]`
merged recursively with the test's `init[server]` (dicts by key, lists concatenate, else the
test wins): `merge_init`.
"""
from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tbhpc.errors import PackError, UserError
from tbhpc.tasks.loader import read_yaml
from tbhpc.tasks.schema import GoldenCall, Rubric, Task
from tbhpc.tb.checks import DATABASE, RUBRICS, UngradableFile
from tbhpc.tb.testfile import TestFunction, parse_test_file

BACKEND_KIND = "tb-mcp"
SOURCE_PREFIX = "tb:"
_SCENARIO_FIELDS = {"world_state", "tools", "bot_instructions", "tags", "fixtures", "metadata"}
_TOOL_FIELDS = {"name", "override_description", "override_arg_description", "direct_response", "is_end_turn"}


@dataclass(frozen=True)
class ScenarioTool:
    name: str
    description: str | None = None                 # override_description
    arg_descriptions: tuple[tuple[str, str], ...] = ()   # override_arg_description
    end_turn: bool = False


@dataclass(frozen=True)
class TBScenario:
    name: str
    file: str
    world_state: dict[str, Any]
    tools: tuple[ScenarioTool, ...]
    bot_instructions: str

    def system_prompt(self, agent_prompt: str) -> str:
        return f"{agent_prompt.strip()}\n\n{self.bot_instructions.strip()}\n"


def merge_init(a: Any, b: Any) -> Any:
    """The reference's recursive merge: dicts by key, lists concatenate, otherwise b wins."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = copy.deepcopy(a)
        for k, v in b.items():
            out[k] = merge_init(out[k], v) if k in out else copy.deepcopy(v)
        return out
    if isinstance(a, list) and isinstance(b, list):
        return copy.deepcopy(a) + copy.deepcopy(b)
    return copy.deepcopy(b)


def is_tb_source(pack: str | None) -> bool:
    return bool(pack) and str(pack).startswith(SOURCE_PREFIX)


class TBDataset:
    def __init__(self, root: Path | str, strict: bool = False):
        root = Path(str(root).removeprefix(SOURCE_PREFIX)).expanduser().resolve()
        base = root / "dataset" if (root / "dataset" / "scenario").is_dir() else root
        if not (base / "scenario").is_dir() or not (base / "test_case").is_dir():
            raise UserError(f"{root}: not a ThinkingBox data directory (expected dataset/scenario/ and dataset/test_case/)")
        self.root, self.base, self.strict = root, base, strict
        self._scenarios: dict[str, TBScenario] = {}
        self.skipped: dict[str, str] = {}          # file (relative to test_case/) -> why tbhpc cannot grade it

    @property
    def source(self) -> str:
        return SOURCE_PREFIX + str(self.root)

    def scenario(self, name: str) -> TBScenario:
        if name not in self._scenarios:
            self._scenarios[name] = _load_scenario(self.base / "scenario" / f"{name}.yaml", name)
        return self._scenarios[name]

    def testfile_path(self, filename: str) -> Path:
        folder = self.base / "test_case"
        if (folder / filename).is_file():
            return folder / filename
        parts = filename.split("_")
        for k in range(len(parts) - 1, 0, -1):
            path = folder / "_".join(parts[:k]) / filename
            if path.is_file():
                return path
        raise UserError(f"{self.base / 'test_case'}: no test-case file {filename!r} (nor under a prefix folder)")

    def digest(self) -> str:
        """A campaign's identity covers the source's content: every scenario and test-case file."""
        h = hashlib.sha256()
        for p in sorted((self.base / "scenario").glob("*.yaml")) + self.all_files:
            h.update(str(p.relative_to(self.base)).encode())
            h.update(p.read_bytes())
        return h.hexdigest()[:16]

    @cached_property
    def all_files(self) -> list[Path]:
        return sorted((self.base / "test_case").rglob("*.py"))

    def tasks(self, ids: list[str] | None = None) -> list[Task]:
        """The named tasks in list order (every test of every file when `ids` is None)."""
        if ids is None:
            return [self.to_task(fn, p) for p in self.all_files for fn in self._parse_or_skip(p)]
        wanted: dict[str, list[str]] = {}
        for tid in ids:
            file, sep, name = tid.partition(":")
            if not sep or not file or not name or ":" in name:
                raise UserError(f"task id {tid!r}: expected '<file name>:<test name>'")
            wanted.setdefault(file, []).append(name)
        found: dict[str, Task] = {}
        for file, names in wanted.items():
            path = self.testfile_path(file)
            try:
                parsed = parse_test_file(path, only=set(names))
            except UngradableFile as exc:
                raise UserError(f"task {file}:{names[0]} is in a file tbhpc cannot grade (it never runs test files): "
                                f"{exc}") from None
            for fn in parsed:
                found[fn.id] = self.to_task(fn, path)
        missing = [t for t in ids if t not in found]
        if missing:
            raise UserError(f"task {missing[0]!r} is not a test in {self.base / 'test_case'} ({len(missing)} unknown)")
        return [found[t] for t in dict.fromkeys(ids)]

    def _parse_or_skip(self, path: Path) -> list[TestFunction]:
        try:
            return parse_test_file(path)
        except UngradableFile as exc:
            if self.strict:
                raise
            self.skipped[str(path.relative_to(self.base / "test_case"))] = \
                (f"task {exc.task}: " if exc.task else "") + exc.detail
            return []

    def to_task(self, fn: TestFunction, path: Path) -> Task:
        cfg, where = fn.config, str(path)
        name = cfg.get("scenario")
        if not isinstance(name, str) or not name:
            raise PackError(where, "no scenario (set `scenario:` in the module's '!' docstring or the test's)", fn.name, "scenario")
        scenario = self.scenario(name)
        if not isinstance(cfg.get("query"), str):
            raise PackError(where, "missing or not a string", fn.name, "query")
        init = cfg.get("init") or {}
        if not isinstance(init, dict) or not all(isinstance(v, dict) or v is None for v in init.values()):
            raise PackError(where, "expected a mapping server -> init config", fn.name, "init")
        merged = merge_init(scenario.world_state, {k: v or {} for k, v in init.items()})
        for check, servers in fn.servers.items():
            unknown = [s for s in servers or () if s not in merged]
            if unknown:
                raise PackError(where, f"the file's {check}() reads server {unknown[0]!r}, which scenario {name} does not "
                                f"run (it runs: {', '.join(merged) or 'none'})", fn.name)
        graded = fn.servers.get(DATABASE)
        rubric_servers = fn.servers.get(RUBRICS) or tuple(merged)
        calls: list[GoldenCall] = []
        rubrics: list[Rubric] = []
        for server, conf in merged.items():
            conf = conf or {}
            golden = (conf.get("golden_test_case") or {}).get("tool_interactions") or []
            for j, c in enumerate(golden):
                if not isinstance(c, dict) or not isinstance(c.get("tool"), str) or not isinstance(c.get("parameters") or {}, dict):
                    raise PackError(where, "expected {tool: NAME, parameters: {...}}", fn.name,
                                    f"init.{server}.golden_test_case.tool_interactions[{j}]")
                calls.append(GoldenCall(c["tool"], dict(c.get("parameters") or {})))
            for j, r in enumerate((conf.get("rubrics_yesno") or []) if server in rubric_servers else []):
                if isinstance(r, str):
                    rubrics.append(Rubric(r))
                elif isinstance(r, dict) and isinstance(r.get("question"), str):
                    rubrics.append(Rubric(r["question"], tuple(r.get("keywords") or ())))
                else:
                    raise PackError(where, "expected a question string", fn.name, f"init.{server}.rubrics_yesno[{j}]")
        if rubrics and RUBRICS not in fn.checks:
            rubrics = []   # the reference grades rubrics only when the body asks for them
        user_turns = cfg.get("max_user_sim_turns")
        agent_turns = cfg.get("max_agent_sim_turns")
        for key, value in (("max_user_sim_turns", user_turns), ("max_agent_sim_turns", agent_turns)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise PackError(where, "must be a whole number >= 0", fn.name, key)
        tags = cfg.get("tags")
        labels = tags.get("labels", []) if isinstance(tags, dict) else tags or []
        return Task(
            id=fn.id, domain=name, query=cfg["query"], user_context=str(cfg.get("user_context") or ""),
            data_patch={}, golden_calls=tuple(calls), split="eval", rubrics_yesno=tuple(rubrics),
            max_user_turns=10 if user_turns is None else user_turns, tags=tuple(str(x) for x in labels),
            template=fn.file.removesuffix(".py"), source_file=where,
            backend={"kind": BACKEND_KIND, "source": self.source, "scenario": name,
                     "init": {k: v or {} for k, v in init.items()}, "max_agent_turns": agent_turns,
                     **({"graded_servers": list(graded)} if graded else {})},
        )


def _load_scenario(path: Path, name: str) -> TBScenario:
    if not path.is_file():
        raise UserError(f"{path}: scenario {name!r} not found")
    doc = read_yaml(path)
    if not isinstance(doc, dict):
        raise PackError(str(path), "a scenario must be a YAML mapping")
    unknown = sorted(set(doc) - _SCENARIO_FIELDS)
    if unknown:
        raise PackError(str(path), f"unknown field(s) {', '.join(unknown)}", None, unknown[0])
    if doc.get("fixtures"):
        raise PackError(str(path), "fixtures are not supported by tbhpc (no benchmark scenario uses them)", None, "fixtures")
    world = doc.get("world_state") or {}
    if not isinstance(world, dict):
        raise PackError(str(path), "expected a mapping server -> init config", None, "world_state")
    tools = []
    for j, t in enumerate(doc.get("tools") or []):
        if isinstance(t, str):
            t = {"name": t}
        if not isinstance(t, dict) or not isinstance(t.get("name"), str):
            raise PackError(str(path), "expected {name: TOOL, ...}", None, f"tools[{j}]")
        bad = sorted(set(t) - _TOOL_FIELDS)
        if bad:
            raise PackError(str(path), f"unknown field(s) {', '.join(bad)}", None, f"tools[{j}].{bad[0]}")
        if t.get("direct_response"):
            raise PackError(str(path), "direct_response tools are not supported by tbhpc", None, f"tools[{j}]")
        args = t.get("override_arg_description") or {}
        if not isinstance(args, dict):
            raise PackError(str(path), "expected a mapping argument -> description", None, f"tools[{j}].override_arg_description")
        tools.append(ScenarioTool(t["name"], t.get("override_description"),
                                  tuple((str(k), str(v)) for k, v in args.items()), bool(t.get("is_end_turn"))))
    if not tools:
        raise PackError(str(path), "a scenario must whitelist at least one tool", None, "tools")
    return TBScenario(name, str(path), {k: v or {} for k, v in world.items()}, tuple(tools),
                      str(doc.get("bot_instructions") or ""))
