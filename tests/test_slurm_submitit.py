"""The Python API's submitit executor on the real local Slurm cluster (`make test` starts it and
sets TBHPC_REQUIRE_SLURM=1: these tests fail, never skip, in CI): submitit's own AutoExecutor
submits the campaign's chunks as one array job; the rows equal the local executor's; array tasks
cancelled, requeued by `scontrol` and sent USR2 (submitit's checkpoint/requeue protocol) mid-chunk,
then a resubmission: every attempt exactly once. (The example script: test_api.py.)"""
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


def _executor(tmp_path, parallelism: int = 6):
    ex = submitit.AutoExecutor(folder=tmp_path / "submitit", cluster="slurm")
    ex.update_parameters(timeout_min=10, slurm_partition="batch", slurm_array_parallelism=parallelism)
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


def test_a_submitit_probe_gives_the_same_rows_as_the_local_executor(tmp_path):
    probe = dict(CHUNKED, split="train", policy_opts={"skill": 0.7})
    local = api.probe(out=tmp_path / "local", **probe)
    sub = api.probe(out=tmp_path / "sub", executor=_executor(tmp_path, parallelism=3), **probe)
    assert local.complete and sub.complete and sub.planned == 24 and sub.kind == "probe"
    assert rows(tmp_path / "sub") == rows(tmp_path / "local")
    assert len({r[2] for r in rows(tmp_path / "sub")}) == 2                                # passes and failures
    assert len(sub.jobs) == 4 and len({j.job_id.split("_")[0] for j in sub.jobs}) == 1       # one array job
    array = sub.jobs[0].job_id.split("_")[0]
    assert "#SBATCH --array=0-3%3" in (tmp_path / "submitit" / f"{array}_submission.sh").read_text()   # parallelism kept
    jobs = json.loads((tmp_path / "sub" / "slurm" / "stage-001" / "jobs.json").read_text())
    assert jobs == {"submitit": sub.jobs[0].job_id.split("_")[0], "tasks": 4}               # `tbhpc status` follows it
    status = subprocess.run([sys.executable, "-m", "tbhpc.cli", "status", str(tmp_path / "sub")], capture_output=True,
                            text=True)
    assert status.returncode == 0 and "24/24" in status.stdout


def test_cancel_requeue_and_usr2_mid_chunk_then_a_resubmission_complete_exactly_once(tmp_path):
    """One submission, three array tasks hit mid-chunk: 0 by `scontrol requeue` (SIGTERM, which
    submitit ignores, then SIGKILL; the requeued task skips what was saved), 1 cancelled (its rest
    stays pending), 2 by USR2 (what Slurm sends before the time limit: submitit's checkpoint()
    saves, then requeues). A resubmission runs only the cancelled rest."""
    run = tmp_path / "run"
    started = api.evaluate(out=run, executor=_executor(tmp_path), wait=False, policy_opts={"delay_s": 0.8}, **CHUNKED)
    saved = _wait(lambda: len(_task_keys(run, 0)) >= 2 and _task_keys(run, 1) and _task_keys(run, 2)
                  and set(_task_keys(run, 0)))
    job = {i: started.jobs[i].job_id for i in range(3)}
    subprocess.run(["scontrol", "requeue", job[0]], check=True)
    started.jobs[1].cancel()
    subprocess.run(["scancel", "--signal=USR2", job[2]], check=True)
    first = started.wait()
    assert 0 < first.missing < 6, first                            # only the rest of the cancelled chunk
    for index in (0, 2):
        keys = _task_keys(run, index)
        assert len(keys) == len(set(keys)) == 6                    # finished, nothing done twice
    assert saved <= set(_task_keys(run, 0))
    logs = {i: "".join(p.read_text(errors="replace") for p in (tmp_path / "submitit").glob(f"{job[i]}_*_log.out"))
            for i in (0, 2)}
    assert logs[0].count("Starting with JobEnvironment") >= 2, logs[0][-2000:]          # it really ran twice
    assert "Calling checkpoint method" in logs[2] and "Requeued job" in logs[2], logs[2][-2000:]
    again = api.evaluate(out=run, executor=_executor(tmp_path), policy_opts={"delay_s": 0.8}, **CHUNKED)
    assert again.complete and again.done == 24
    stage2 = (run / "slurm" / "stage-002" / "chunks.jsonl").read_text().splitlines()
    assert sum(len(json.loads(line)) for line in stage2) == first.missing    # the resubmission ran only those
    keys = [(r[0], r[1]) for r in rows(run)]
    assert len(keys) == len(set(keys)) == 24 and validate(RunDir(run)).ok
