"""The command line, run as a user runs it (subprocesses), with the JSON contracts scripts rely on."""
import json
import subprocess
import sys


def tbhpc(*args, check=True):
    proc = subprocess.run([sys.executable, "-m", "tbhpc.cli", *args], capture_output=True, text=True, timeout=120)
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


def test_tasks_list_json():
    rows = json.loads(tbhpc("tasks", "list", "--format", "json").stdout)
    assert len(rows) >= 600
    assert {"id", "domain", "split", "n_golden_calls"} <= set(rows[0])
    evals = json.loads(tbhpc("tasks", "list", "--format", "json", "--split", "eval", "--domain", "travel").stdout)
    assert evals and all(r["split"] == "eval" and r["domain"] == "travel" for r in evals)


def test_tasks_show_and_validate():
    shown = json.loads(tbhpc("tasks", "show", "travel-add_bags-000", "--format", "json").stdout)
    assert shown["id"] == "travel-add_bags-000" and shown["golden"]["tool_interactions"]
    assert tbhpc("tasks", "validate").stdout.startswith("OK: ")
    missing = tbhpc("tasks", "show", "no-such-task", check=False)
    assert missing.returncode == 2 and "no-such-task" in missing.stderr


def test_episode_json_and_text():
    out = json.loads(tbhpc("episode", "--task", "insurance-theft_claim-000", "--policy", "oracle", "--format", "json").stdout)
    assert {"task_id", "reward", "status", "finish_reason"} <= set(out)
    assert out["reward"] == 1.0 and out["status"] == "ok" and out["finish_reason"] == "done"
    text = tbhpc("episode", "--task", "insurance-theft_claim-000", "--policy", "noop").stdout
    assert "reward=0.0" in text and "diff: claims[" in text


def test_unknown_policy_is_a_one_line_error():
    proc = tbhpc("episode", "--task", "insurance-theft_claim-000", "--policy", "gpt5", check=False)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "unknown policy" in proc.stderr


def test_demo_summarises_both_policies(pack_tasks):
    n = sum(t.split == "eval" for t in pack_tasks)
    out = tbhpc("demo", "--config", "jobs/demo.yaml", "split=eval").stdout
    assert "ALL" in out and f"{n}/{n} (100%)" in out and f"0/{n} (0%)" in out
    bad = tbhpc("demo", "splitt=eval", check=False)
    assert bad.returncode == 2 and "unknown field 'splitt'" in bad.stderr
