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


def test_quick_demo_runs_the_pipeline_and_resumes(tmp_path):
    args = ("demo", "--config", "jobs/demo.yaml", "quick=true", f"out={tmp_path / 'demo'}", "probe_repeats=3", "eval_repeats=2", "workers=1", "limit=60")
    out = tbhpc(*args).stdout
    assert "1. probe" in out and "pool" in out and "MICRO_AVG" in out and "paired bootstrap" in out
    for f in ("pool.yaml", "pool.manifest.json", "report/report.html", "probe-report/bands.png", "eval-oracle/results.duckdb"):
        assert (tmp_path / "demo" / f).exists(), f
    shards = sorted(p.name for p in (tmp_path / "demo").rglob("shards/*.jsonl"))
    again = tbhpc(*args).stdout  # every step resumes from its run directory: nothing new runs
    assert "demo finished" in again and sorted(p.name for p in (tmp_path / "demo").rglob("shards/*.jsonl")) == shards
    bad = tbhpc("demo", "skill=2", check=False)
    assert bad.returncode == 2 and "skill" in bad.stderr
    bad = tbhpc("demo", "model=gpt5", check=False)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "'model' must be one of tiny, smollm2" in bad.stderr


def test_warmstart_recipes_name_only_real_options():
    from tbhpc.cli import build_parser
    from tbhpc.train.sft import RECIPES
    args = vars(build_parser().parse_args(["warmstart", "--recipe", "demo", "--out", "x"]))
    for name, recipe in RECIPES.items():
        assert set(recipe) - {"phases"} <= set(args), name
    assert RECIPES["demo"]["split"] == "train" and RECIPES["demo"]["size"] == "demo"


def test_building_the_parser_imports_nothing_heavy():
    # every command builds every subparser: the campaign runner, DuckDB, scipy and torch load
    # with the command that uses them (they made `tbhpc --help` 0.5 s and 92 MiB)
    code = ("import sys; from tbhpc.cli import build_parser; build_parser(); "
            "print(sorted(m for m in ('scipy', 'duckdb', 'torch', 'tbhpc.campaign.runner', 'tbhpc.metrics.agg') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "[]", out.stdout
