"""A pack `tbhpc tasks validate` refuses is refused, before anything is written, by every command
that would run its tasks (tbhpc/tasks/checked.py): never scored, never a traceback."""
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tbhpc.domains.pack import render_domain_file
from tbhpc.tasks.loader import load_pack

CLI = [sys.executable, "-m", "tbhpc.cli"]


def _break(doc: dict, how: str) -> str:
    task = doc["tasks"][0]
    if how == "unknown tool":
        task["golden"]["tool_interactions"][0]["tool"] = "find_customer_by_mail"
        return "unknown tool 'find_customer_by_mail'"
    if how == "parameter of the wrong type":
        task["golden"]["tool_interactions"][1]["parameters"]["order_id"] = 2001
        return "order_id"
    if how == "unknown domain":
        doc["domain"] = "retial"
        return "unknown domain 'retial' (known: retail, insurance"
    if how == "unknown column":
        task["init"]["data_patch"]["customers"][0]["nickname"] = "Ellie"
        return "unknown column 'nickname'"
    raise AssertionError(how)


@pytest.fixture(scope="module")
def good_tasks():
    return [t for t in load_pack(None) if t.domain == "retail" and t.template == "order_status"][:3]


HOW = ("unknown tool", "parameter of the wrong type", "unknown domain", "unknown column")


@pytest.mark.parametrize("how", HOW)
@pytest.mark.parametrize("command", ("eval", "probe", "episode", "validate"))
def test_a_broken_task_is_refused_before_anything_runs(tmp_path: Path, good_tasks, how, command):
    doc = yaml.safe_load(render_domain_file("retail", good_tasks))
    for t in doc["tasks"]:
        t["split"] = "train"
    expected = _break(doc, how)
    pack = tmp_path / "pack.yaml"
    pack.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    out = tmp_path / "run"
    args = {"eval": ["eval", "--out", str(out), f"pack={pack}", "split=train"],
            "probe": ["probe", "--out", str(out), f"pack={pack}", "split=train", "repeats=1"],
            "episode": ["episode", "--task", doc["tasks"][0]["id"], "--pack", str(pack), "--policy", "oracle"],
            "validate": ["tasks", "validate", str(pack)]}[command]
    r = subprocess.run(CLI + args, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr, r.stderr
    assert str(pack) in r.stderr and expected in r.stderr and doc["tasks"][0]["id"] in r.stderr, r.stderr
    assert not out.exists()                                   # no run directory, nothing scored


def test_the_same_pack_unbroken_runs(tmp_path: Path, good_tasks):
    pack = tmp_path / "pack.yaml"
    pack.write_text(render_domain_file("retail", good_tasks), encoding="utf-8")
    r = subprocess.run(CLI + ["eval", "--out", str(tmp_path / "run"), f"pack={pack}", "split=all", "repeats=1", "workers=1"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "run" / "results.duckdb").exists()
