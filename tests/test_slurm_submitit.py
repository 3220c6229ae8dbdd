"""The Python API's submitit executor on the real local Slurm cluster (`make test` starts it and
sets TBHPC_REQUIRE_SLURM=1: these tests fail, never skip, in CI): submitit's own AutoExecutor
submits the campaign's chunks as one array job; the rows equal the local executor's; a cancelled
array task and an `scontrol requeue` mid-chunk end exactly once; USR2 goes through submitit's
checkpoint/requeue protocol. (The example script: test_api.py.)"""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from helpers import attempt_rows as rows
from helpers import require_slurm
from tbhpc import api
from tbhpc.campaign.validate import validate
from tbhpc.store.run_dir import RunDir
from tbhpc.store.shards import list_shards

submitit = pytest.importorskip("submitit")
pytestmark = pytest.mark.slow

CHUNKED = dict(name="sub", split="eval", limit=12, repeats=2, chunk_size=6)     # 24 attempts, 4 array tasks


@pytest.fixture(scope="module", autouse=True)
def cluster():
    require_slurm()


def _executor(tmp_path, **extra):
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(timeout_min=10, slurm_partition="batch", slurm_array_parallelism=6, **extra)
    return ex


def _wait(predicate, timeout=120.0, every=0.2):
    end = time.time() + timeout
    while time.time() < end:
        if value := predicate():
            return value
        time.sleep(every)
    raise AssertionError("timed out waiting")


def _task_keys(run, task: int) -> list:
    """Every key written by array task `task` of stage 1, shard by shard (a key twice = done twice)."""
    keys = []
    for p in list_shards(run / "shards"):
        if p.name.startswith(f"shard-s001-t{task:05d}-"):
            keys += [(r["task_id"], r["attempt_index"]) for r in map(json.loads, p.read_text().splitlines())]
    return keys


def test_a_submitit_array_gives_the_same_rows_as_the_local_executor(tmp_path):
    local = api.evaluate(out=tmp_path / "local", policy_opts={"skill": 0.7}, **CHUNKED)
    sub = api.evaluate(out=tmp_path / "sub", executor=_executor(tmp_path), policy_opts={"skill": 0.7}, **CHUNKED)
    assert local.complete and sub.complete and sub.planned == 24
    assert rows(tmp_path / "sub") == rows(tmp_path / "local")
    assert len(sub.jobs) == 4 and len({j.job_id.split("_")[0] for j in sub.jobs}) == 1       # one array job
    jobs = json.loads((tmp_path / "sub" / "slurm" / "stage-001" / "jobs.json").read_text())
    assert jobs == {"submitit": sub.jobs[0].job_id.split("_")[0], "tasks": 4}               # `tbhpc status` follows it
    status = subprocess.run([sys.executable, "-m", "tbhpc.cli", "status", str(tmp_path / "sub")], capture_output=True,
                            text=True)
    assert status.returncode == 0 and "24/24" in status.stdout


def test_a_cancelled_array_task_and_a_resubmission_complete_exactly_once(tmp_path):
    run = tmp_path / "run"
    started = api.evaluate(out=run, executor=_executor(tmp_path), wait=False, policy_opts={"delay_s": 0.4}, **CHUNKED)
    _wait(lambda: _task_keys(run, 1))                              # task 1 is mid-chunk: one attempt saved
    started.jobs[1].cancel()
    first = started.wait()
    assert 0 < first.missing < 6                                   # only the rest of the cancelled chunk
    again = api.evaluate(out=run, executor=_executor(tmp_path), policy_opts={"delay_s": 0.4}, **CHUNKED)
    assert again.complete and again.done == 24
    stage2 = (run / "slurm" / "stage-002" / "chunks.jsonl").read_text().splitlines()
    assert sum(len(json.loads(line)) for line in stage2) == first.missing    # the resubmission ran only those
    keys = [(r[0], r[1]) for r in rows(run)]
    assert len(keys) == len(set(keys)) == 24 and validate(RunDir(run)).ok


def test_scontrol_requeue_mid_chunk_resumes_without_redoing_saved_attempts(tmp_path):
    run = tmp_path / "run"
    started = api.evaluate(out=run, executor=_executor(tmp_path), wait=False, policy_opts={"delay_s": 0.4}, **CHUNKED)
    saved = _wait(lambda: len(_task_keys(run, 0)) >= 2 and _task_keys(run, 0))
    subprocess.run(["scontrol", "requeue", started.jobs[0].job_id], check=True)
    done = started.wait()
    assert done.complete and validate(RunDir(run)).ok
    keys = _task_keys(run, 0)
    assert len(keys) == len(set(keys)) == 6 and set(saved) <= set(keys)       # the requeued run skipped what was saved
    log = "".join(p.read_text(errors="replace") for p in (tmp_path / "submitit").glob(f"{started.jobs[0].job_id}_*_log.out"))
    assert log.count("Starting with JobEnvironment") >= 2, log[-2000:]           # it really ran twice


def test_usr2_goes_through_submitits_checkpoint_and_requeue(tmp_path):
    run = tmp_path / "run"
    started = api.evaluate(out=run, executor=_executor(tmp_path), wait=False, policy_opts={"delay_s": 0.4}, **CHUNKED)
    _wait(lambda: len(_task_keys(run, 2)) >= 1)
    # what Slurm does `--signal` seconds before the time limit (submitit asks for USR2@90)
    subprocess.run(["scancel", "--signal=USR2", started.jobs[2].job_id], check=True)
    done = started.wait()
    assert done.complete
    keys = _task_keys(run, 2)
    assert len(keys) == len(set(keys)) == 6
    log = "".join(p.read_text(errors="replace") for p in (tmp_path / "submitit").glob(f"{started.jobs[2].job_id}_*_log.out"))
    assert "Calling checkpoint method" in log and "Requeued job" in log, log[-2000:]
