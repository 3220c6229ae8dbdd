"""The Python API (tbhpc.api) without Slurm: the same campaign through the local executor and
through submitit's own LocalExecutor and DebugExecutor (real subprocesses / in-process, real
DuckDB files) gives the same attempt keys and rewards; select, agg, results and show read back
what the CLI reads; bad input is one line and writes nothing. Slurm: test_slurm_submitit.py."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from helpers import attempt_rows as rows
from tbhpc import api
from tbhpc.errors import UserError

submitit = pytest.importorskip("submitit")
pytestmark = pytest.mark.slow

SMALL = dict(tasks="jobs/pools/smoke.yaml", limit=4, repeats=2, chunk_size=2, policy_opts={"skill": 0.7})


def test_the_local_and_submitit_executors_give_the_same_attempts(tmp_path):
    local = api.probe(out=tmp_path / "local", **SMALL)
    assert (local.planned, local.done, local.missing, local.kind) == (8, 8, 0, "probe") and local.complete
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    ex.update_parameters(timeout_min=10)
    sub = api.probe(out=tmp_path / "sub", executor=ex, **SMALL)
    assert len(sub.jobs) == 4 and sub.complete                 # one array of the campaign's 4 chunks
    assert rows(tmp_path / "sub") == rows(tmp_path / "local")
    assert sub.config_hash == local.config_hash
    debug = api.probe(out=tmp_path / "debug", executor=submitit.DebugExecutor(folder=tmp_path / "dbg"), **SMALL)
    assert rows(tmp_path / "debug") == rows(tmp_path / "local") and debug.complete


def test_wait_false_returns_handles_and_a_resubmission_runs_only_what_is_missing(tmp_path):
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    ex.update_parameters(timeout_min=10)
    started = api.probe(out=tmp_path / "run", executor=ex, wait=False, **SMALL)
    assert len(started.jobs) == 4 and started.planned == 8
    done = started.wait()
    assert done.complete and done.done == 8
    again = api.probe(out=tmp_path / "run", executor=ex, wait=False, **SMALL)
    assert again.jobs == [] and again.complete                  # nothing left: nothing submitted
    assert rows(tmp_path / "run") == rows(_local(tmp_path))


def _local(tmp_path: Path) -> Path:
    api.probe(out=tmp_path / "local", **SMALL)
    return tmp_path / "local"


def test_select_agg_results_and_show_read_what_the_cli_reads(tmp_path):
    probe = api.probe(out=tmp_path / "probe", **SMALL)
    sel = api.select(probe, out=tmp_path / "pool.yaml", min_clean_runs=2)
    cli = subprocess.run([sys.executable, "-m", "tbhpc.cli", "select", str(probe.path), "--out", str(tmp_path / "cli.yaml"),
                          "--min-clean-runs", "2"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert (tmp_path / "pool.yaml").read_text().replace("pool: pool", "pool: cli") == (tmp_path / "cli.yaml").read_text()
    assert set(sel.pool) <= {r[0] for r in rows(probe.path)}
    summary = api.agg(probe, bootstrap=0)
    passed = sum(r[2] for r in rows(probe.path))
    assert (summary["attempts"], summary["successes"], summary["tasks"]) == (8, passed, 4)
    rel = api.results(probe)
    assert sorted(rel.filter("status = 'ok'").project("task_id, attempt_index, reward").fetchall()) == \
        [(t, i, r) for t, i, r, _ in rows(probe.path)]
    task = rows(probe.path)[0][0]
    text = api.show(probe, task, 0)
    assert text.startswith(f"{probe.path} · probe · policy ") and task in subprocess.run(
        [sys.executable, "-m", "tbhpc.cli", "show", str(probe.path), task, "--attempt", "0"],
        capture_output=True, text=True).stdout
    other = api.evaluate(out=tmp_path / "eval", **SMALL)
    assert api.compare(other, probe, bootstrap=0)["shared_tasks"] == 4


def test_bad_input_is_one_line_and_writes_nothing(tmp_path):
    ex = submitit.LocalExecutor(folder=tmp_path / "submitit")
    ex.folder = None                                            # a submitit executor without a folder
    with pytest.raises(UserError) as err:
        api.probe(out=tmp_path / "a", executor=ex, **SMALL)
    assert str(err.value) == "submitit executor: no folder (give one: submitit.AutoExecutor(folder='logs/submitit'))"
    with pytest.raises(UserError) as err:
        api.probe(out=tmp_path / "b", repeets=2)
    assert str(err.value) == ("argument repeets=2: unknown field 'repeets'; did you mean 'repeats'? "
                              "(every field: tbhpc fields campaign)")
    with pytest.raises(UserError) as err:
        api.probe(out=tmp_path / "c", overrides=["limt=3"])
    assert str(err.value).startswith("override 'limt=3': unknown field 'limt'; did you mean 'limit'")
    with pytest.raises(UserError, match="only a submitit executor returns before its jobs end"):
        api.probe(out=tmp_path / "d", wait=False, **SMALL)
    with pytest.raises(UserError, match="expected 'local', 'slurm', 'mpi' or a submitit executor, got int"):
        api.probe(out=tmp_path / "e", executor=3, **SMALL)
    with pytest.raises(UserError, match="slurm.container: a submitit executor writes its own scripts"):
        api.probe(out=tmp_path / "f", executor=submitit.LocalExecutor(folder=tmp_path / "submitit"),
                  slurm={"container": {"runtime": "apptainer", "image": "/images/t.sif"}}, **SMALL)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["submitit"]
    api.evaluate(out=tmp_path / "eval", **SMALL)
    before = sorted(p.name for p in (tmp_path / "eval").rglob("*"))
    with pytest.raises(UserError) as err:
        api.probe(out=tmp_path / "eval", **SMALL)               # a run directory of another kind
    assert str(err.value) == (f"{tmp_path / 'eval'}: holds a different campaign (kind eval, not probe); "
                              "use a new --out directory")
    assert sorted(p.name for p in (tmp_path / "eval").rglob("*")) == before


def test_the_example_script_runs_the_recipe(tmp_path):
    out = subprocess.run([sys.executable, "examples/recipe.py", "--out", str(tmp_path / "ex"), "--local", "--limit", "6"],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("probe: 24/24 attempts, config ") and lines[1].startswith("pool: ")
    assert lines[2].startswith("base: pass@1 ") and lines[3].startswith("better: pass@1 ")
    assert lines[4] == "compare: 6 shared tasks"


def test_train_from_python_renders_the_cli_jobs_and_refuses_bad_input(tmp_path):
    run = tmp_path / "train"
    dry = api.train("jobs/train.yaml", out=run, executor="slurm", dry_run=True, nodes=3)
    cli = subprocess.run([sys.executable, "-m", "tbhpc.cli", "submit", "train", "--out", str(run), "--config",
                          "jobs/train.yaml", "--dry-run", "nodes=3"], capture_output=True, text=True)
    assert cli.returncode == 0, cli.stderr
    assert dry.scripts == cli.stdout and "# ---- serve.sbatch ----" in dry.scripts and not run.exists()
    with pytest.raises(UserError) as err:
        api.train("jobs/train.yaml", out=run, executor="slurm", group_sise=4)
    assert str(err.value).startswith("argument group_sise=4: unknown field 'group_sise'; did you mean 'group_size' or ")
    assert str(err.value).endswith("(every field: tbhpc fields train)")
    with pytest.raises(UserError, match="train: executor must be 'local' or 'slurm'"):
        api.train("jobs/train.yaml", out=run, executor="submitit")
    assert not run.exists()
