"""Invalid packs fail with one line naming file, task and field; loading never runs code."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tbhpc.domains import catalogs
from tbhpc.errors import PackError
from tbhpc.tasks.loader import load_pack, validate_tasks

GOOD = {
    "id": "t-1", "domain": "retail", "split": "train", "query": "Cancel order O1 please",
    "user_context": "- email: sample.customer@example.com",
    "init": {"data_patch": {"orders": [{"id": "O1", "status": "placed"}]}},
    "golden": {"tool_interactions": [{"tool": "cancel_order", "parameters": {"order_id": "O1", "reason": "no_longer_needed"}}]},
}


def _write(tmp_path: Path, tasks, name="pack.yaml", raw: str | None = None) -> Path:
    p = tmp_path / name
    p.write_text(raw if raw is not None else yaml.safe_dump({"tasks": tasks}), encoding="utf-8")
    return p


def _error(path: Path) -> str:
    with pytest.raises(PackError) as exc:
        tasks = load_pack(path)
        validate_tasks(tasks, catalogs())
    msg = str(exc.value)
    assert "\n" not in msg
    return msg


def _variant(**changes):
    t = yaml.safe_load(yaml.safe_dump(GOOD))
    for k, v in changes.items():
        if v is None:
            t.pop(k)
        else:
            t[k] = v
    return t


def test_good_pack_loads_and_validates(tmp_path):
    validate_tasks(load_pack(_write(tmp_path, [GOOD])), catalogs())


def test_unknown_tool(tmp_path):
    t = _variant(golden={"tool_interactions": [{"tool": "drop_tables", "parameters": {}}]})
    msg = _error(_write(tmp_path, [t]))
    assert "pack.yaml" in msg and "task t-1" in msg and "golden.tool_interactions[0].tool" in msg and "drop_tables" in msg


def test_wrong_parameter_type(tmp_path):
    t = _variant(golden={"tool_interactions": [{"tool": "create_return", "parameters": {
        "order_id": "O1", "product_id": "P1", "quantity": "two", "reason": "defective", "resolution": "exchange"}}]})
    msg = _error(_write(tmp_path, [t]))
    assert "task t-1" in msg and "golden.tool_interactions[0].parameters" in msg and "quantity" in msg


def test_wrong_field_type_and_missing_field(tmp_path):
    assert "field max_user_turns" in _error(_write(tmp_path, [_variant(max_user_turns="ten")]))
    msg = _error(_write(tmp_path, [_variant(query=None)]))
    assert "task t-1" in msg and "field query" in msg and "missing" in msg
    assert "field split" in _error(_write(tmp_path, [_variant(split="test")]))


def test_duplicate_id_across_files(tmp_path):
    _write(tmp_path, [GOOD], "a.yaml")
    _write(tmp_path, [GOOD], "b.yaml")
    msg = _error(tmp_path)
    assert "b.yaml" in msg and "task t-1" in msg and "field id" in msg and "duplicate" in msg


def test_malformed_yaml_names_line(tmp_path):
    msg = _error(_write(tmp_path, None, raw="tasks:\n  - id: t-1\n    query: [unclosed\n"))
    assert "pack.yaml" in msg and "malformed YAML at line" in msg


def test_unknown_table_and_column(tmp_path):
    t = _variant(init={"data_patch": {"orderz": [{"id": "O1"}]}})
    assert "init.data_patch.orderz" in _error(_write(tmp_path, [t]))
    t = _variant(init={"data_patch": {"orders": [{"id": "O1", "colour": "red"}]}})
    assert "colour" in _error(_write(tmp_path, [t]))


def test_yaml_python_tags_are_not_executed(tmp_path):
    marker = tmp_path / "pwned"
    raw = f"tasks:\n  - !!python/object/apply:os.system ['touch {marker}']\n"
    msg = _error(_write(tmp_path, None, raw=raw))
    assert "malformed YAML" in msg and not marker.exists()


def test_cli_reports_one_line_and_exit_code(tmp_path):
    path = _write(tmp_path, [_variant(golden={"tool_interactions": [{"tool": "nope", "parameters": {}}]})])
    proc = subprocess.run([sys.executable, "-m", "tbhpc.cli", "tasks", "validate", str(path)], capture_output=True, text=True)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tbhpc: error: ") and "task t-1" in lines[0]


@pytest.mark.parametrize("command", [["tasks", "list"], ["tasks", "show", "t-1"],
                                     ["tasks", "export-tb", "--out", "OUT"], ["tasks", "validate"]])
def test_every_command_that_reads_a_pack_checks_it_as_validate_does(tmp_path, command):
    # a golden call to an unknown tool replays and plays alike, so the task would be scored a pass
    path = _write(tmp_path, [_variant(golden={"tool_interactions": [{"tool": "nope", "parameters": {}}]})])
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in command] + [str(path)]
    proc = subprocess.run([sys.executable, "-m", "tbhpc.cli", *argv], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "task t-1" in lines[0] and "nope" in lines[0], lines
    assert not (tmp_path / "out").exists()
    good = _write(tmp_path, [GOOD], name="good.yaml")
    ok = subprocess.run([sys.executable, "-m", "tbhpc.cli", *argv[:-1], str(good)], capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
