"""The curriculum in a real training run (the in-process generator on the tiny warm start): the pool
refreshes when its groups stop being informative, tasks of the candidate list are drawn after a
refresh, and a run stopped by a signal and resumed from its DeepSpeed checkpoint draws exactly what
the uninterrupted run drew (the curriculum's state is in the checkpoint)."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
POOL = ["consulting-access_request-000", "consulting-leave_balance-001"]   # the first: never solved by the tiny warm start
CANDIDATES = [f"consulting-leave_balance-00{i}" for i in (3, 4, 5, 6)]
ARGS = ["generator=local", "steps=4", "group_size=4", "groups_per_step=1", "max_draws=3", "max_tokens=32",
        "response_budget=96", "lr=1e-4", "microbatch_tokens=4096", "seed=5",
        "refresh_below=1.0", "refresh_window=1", "refresh_size=2"]   # any step without a mixed group: 2 candidates join


def _cmd(run: Path, warm_dir, files: dict) -> list[str]:
    return [sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", f"pool={files['pool']}",
            f"refresh_pool={files['candidates']}", *ARGS]


def _env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_JOB_ID")}
    return {**env, "OMP_NUM_THREADS": "1"}


def _rows(run: Path) -> tuple[list, list]:
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    try:
        attempts = con.execute("SELECT train_step, task_id, attempt_index, reward FROM attempts ORDER BY 1, 3").fetchall()
        steps = con.execute("SELECT step, pool_version, pool_size, drawn, kept FROM train_steps ORDER BY 1").fetchall()
        return attempts, steps
    finally:
        con.close()


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("curriculum")
    (d / "pool.yaml").write_text("tasks: [" + ", ".join(POOL) + "]\n")
    (d / "candidates.txt").write_text("".join(t + "\n" for t in CANDIDATES))
    return {"pool": d / "pool.yaml", "candidates": d / "candidates.txt"}


@pytest.fixture(scope="module")
def reference(warm_dir, files, tmp_path_factory):
    run = tmp_path_factory.mktemp("ref") / "run"
    res = subprocess.run(_cmd(run, warm_dir, files), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    return run, res.stdout + res.stderr


def test_an_uninformative_pool_is_refreshed_from_the_candidates(reference):
    run, log = reference
    attempts, steps = _rows(run)
    refreshes = (run / "logs" / "curriculum.jsonl").read_text().splitlines()
    assert refreshes and "train: curriculum: mixed share" in log
    versions = [s[1] for s in steps]
    assert versions[0] == 0 and versions == sorted(versions) and versions[-1] >= 1, steps
    drawn_after = {t for step, t, *_ in attempts if versions[step - 1] > 0}
    assert drawn_after & set(CANDIDATES), (steps, drawn_after)          # candidates were drawn once they joined
    assert {t for _, t, *_ in attempts} <= set(POOL) | set(CANDIDATES)
    for step, version, size, drawn, kept in steps:
        assert size >= 1 and drawn >= 1


def test_a_stopped_and_resumed_run_draws_what_the_uninterrupted_one_drew(reference, warm_dir, files, tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(_cmd(run, warm_dir, files), cwd=REPO, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    steps_log = run / "logs" / "train_steps.jsonl"
    deadline = time.monotonic() + 600
    while not (steps_log.exists() and len(steps_log.read_text().splitlines()) >= 2):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()[-4000:] if proc.poll() else "slow"
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out = proc.communicate(timeout=600)[0]
    assert proc.returncode == 3, out[-4000:]
    assert len(_rows(run)[1]) < 4
    res = subprocess.run(_cmd(run, warm_dir, files), cwd=REPO, env=_env(), capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    assert "resumed from the DeepSpeed checkpoint of step" in res.stdout + res.stderr
    assert _rows(run) == _rows(reference[0])
