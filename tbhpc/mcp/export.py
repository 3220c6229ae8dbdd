"""Write built-in tasks as a ThinkingBox data directory served by `tbhpc mcp-serve`.

Why: it makes the MCP path runnable anywhere (tests, benchmarks, a user checking their set-up)
with no outside data: the same tasks, once in process and once through real MCP servers, must
grade the same. The renderers are pure functions of the tasks (golden-testable); `write_dataset`
lays the files out as `thinkingbox-data` does:

    OUT/dataset/scenario/tbhpc_<domain>.yaml
    OUT/dataset/test_case/tbhpc_<domain>/tbhpc_<domain>_group1.py
    OUT/servers.yaml          (one `tbhpc mcp-serve --domain D` server per domain, reuse: true)
    OUT/testlist.yaml
"""
from __future__ import annotations

import sys
from pathlib import Path

import yaml

from tbhpc.domains import get_domain
from tbhpc.tasks.schema import Task

PREFIX = "tbhpc_"


def scenario_name(domain: str) -> str:
    return f"{PREFIX}{domain}"


def render_scenario(domain: str) -> str:
    dom = get_domain(domain)
    sc = dom.scenario
    doc = {"world_state": {domain: {"sources": None}},
           "tools": [{"name": n, **({"is_end_turn": True} if dom.tools[n].end_turn else {})} for n in sc.tools],
           "bot_instructions": sc.instructions}
    return _dump(doc)


def render_test_file(domain: str, tasks: list[Task]) -> str:
    lines = ['"""!', f"scenario: {scenario_name(domain)}", '"""', ""]
    for t in tasks:
        init = {"data_patch": t.data_patch,
                "golden_test_case": {"tool_interactions": [c.to_dict() for c in t.golden_calls]}}
        if t.rubrics_yesno:
            init["rubrics_yesno"] = [r.to_dict() for r in t.rubrics_yesno]
        doc = {"query": t.query, "user_context": t.user_context, "init": {domain: init}}
        body = _dump(doc).replace("\\", "\\\\").replace('"""', '\\"\\"\\"')
        lines += ["", f"def {function_name(t)}(x, judge):", '    """!']
        lines += ["    " + ln if ln else "" for ln in body.splitlines()]
        lines += ['    """', "    validate_database(x)"]
        if t.rubrics_yesno:
            lines.append("    validate_rubrics_yesno(x, judge)")
        lines.append("")
    return "\n".join(lines)


def render_servers(domains: list[str], python: str | None = None) -> str:
    servers = {d: {"type": "mcp-process", "command": ["{python}", "-m", "tbhpc.cli", "mcp-serve", "--domain", d],
                   "reuse": True, "spare": 1} for d in domains}
    return _dump({"python": python or sys.executable, "servers": servers})


def function_name(task: Task) -> str:
    return "test_" + "".join(ch if ch.isalnum() else "_" for ch in task.id)


def file_name(domain: str) -> str:
    return f"{scenario_name(domain)}_group1.py"


def task_id(task: Task) -> str:
    return f"{file_name(task.domain)}:{function_name(task)}"


def write_dataset(tasks: list[Task], out: Path | str) -> Path:
    out = Path(out)
    domains = sorted({t.domain for t in tasks})
    for d in domains:
        (out / "dataset" / "scenario").mkdir(parents=True, exist_ok=True)
        (out / "dataset" / "scenario" / f"{scenario_name(d)}.yaml").write_text(render_scenario(d), encoding="utf-8")
        folder = out / "dataset" / "test_case" / scenario_name(d)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / file_name(d)).write_text(render_test_file(d, [t for t in tasks if t.domain == d]), encoding="utf-8")
    (out / "servers.yaml").write_text(render_servers(domains), encoding="utf-8")
    (out / "testlist.yaml").write_text(_dump([task_id(t) for t in tasks]), encoding="utf-8")
    return out


def _dump(doc) -> str:
    return yaml.safe_dump(doc, sort_keys=False, allow_unicode=True, width=100_000, default_flow_style=False)
