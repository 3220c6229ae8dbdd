"""Campaigns: resumable, idempotent, exactly-once under kills, corrupt shards, system-error re-runs."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tbhpc.campaign.runner import run_campaign
from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.validate import validate
from tbhpc.errors import UserError
from tbhpc.store.merge import merge
from tbhpc.store.run_dir import RunDir
from tbhpc.store.shards import list_shards

from helpers import attempt_rows as rows


def cfg(**kw):
    base = dict(name="t", limit=12, repeats=2, chunk_size=4)
    return CampaignConfig(**{**base, **kw})


def test_run_resume_and_idempotence(tmp_path):
    res = run_campaign(cfg(), tmp_path / "run")
    assert (res.planned, res.executed, res.ok, res.missing) == (24, 24, 24, 0)
    before = rows(tmp_path / "run")
    assert len(before) == 24 and all(r[2] == 1.0 for r in before)
    again = run_campaign(cfg(workers=2, chunk_size=3), tmp_path / "run")  # execution fields may change
    assert again.executed == 0 and rows(tmp_path / "run") == before
    assert merge(RunDir(tmp_path / "run")).new_shards == 0
    run = RunDir(tmp_path / "run")
    assert (run.path / "config.yaml").exists() and len(run.config_hash()) == 16 and validate(run).ok
    log = (run.logs / "campaign.log").read_text().splitlines()
    assert len(log) == 2 and "executed 24 (24 ok" in log[0] and "already done 24, executed 0" in log[1]


def test_a_different_campaign_is_refused(tmp_path):
    run_campaign(cfg(limit=2), tmp_path / "run")
    with pytest.raises(UserError, match="field 'repeats' differs"):
        run_campaign(cfg(limit=2, repeats=3), tmp_path / "run")


def test_process_pool_gives_the_same_rows_as_one_process(tmp_path):
    noisy = {"skill": 0.7}
    run_campaign(cfg(policy_opts=noisy, limit=20), tmp_path / "a")
    run_campaign(cfg(policy_opts=noisy, limit=20, workers=2), tmp_path / "b")
    a, b = rows(tmp_path / "a"), rows(tmp_path / "b")
    assert a == b and {r[2] for r in a} == {0.0, 1.0}  # seeded per attempt: same outcomes anywhere


def test_episodes_in_flight_give_the_same_rows(tmp_path):
    noisy = {"skill": 0.7}
    run_campaign(cfg(policy_opts=noisy, limit=20), tmp_path / "a")
    run_campaign(cfg(policy_opts=noisy, limit=20, concurrency=5, chunk_size=10), tmp_path / "b")
    assert rows(tmp_path / "a") == rows(tmp_path / "b")
    with pytest.raises(UserError, match="'concurrency' must be >= 1"):
        cfg(concurrency=0)


def _cli(out: Path, *extra: str):
    return subprocess.Popen([sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(out), "name=k", "limit=20", "repeats=2",
                             "chunk_size=2", "policy_opts={delay_s: 0.02}", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)


def _wait_for_shards(run: Path, n: int, proc, timeout=60.0):
    end = time.time() + timeout
    while time.time() < end and proc.poll() is None:
        if len(list_shards(run / "shards")) >= n:
            return
        time.sleep(0.05)
    raise AssertionError(f"never saw {n} shards (exit {proc.poll()})")


def _workers(pid: int) -> list[int]:
    """Pool worker processes of `pid` (spawned via multiprocessing's spawn_main; not its resource tracker)."""
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True).stdout
    found = []
    for child in (int(x) for x in out.split()):
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except OSError:
            continue
        if b"spawn_main" in cmdline:
            found.append(child)
    return found


@pytest.mark.slow
def test_killing_a_worker_mid_run_loses_and_duplicates_nothing(tmp_path):
    run = tmp_path / "run"
    proc = _cli(run, "workers=2")
    _wait_for_shards(run, 2, proc)
    workers = _workers(proc.pid)
    assert workers, "no worker processes found"
    os.kill(workers[0], signal.SIGKILL)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode != 0 and "worker process died" in err, err
    partial = validate(RunDir(run))
    assert partial.missing and not partial.duplicates
    done = subprocess.run([sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(run), "name=k", "limit=20", "repeats=2",
                           "chunk_size=2", "policy_opts={delay_s: 0.02}"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    final = validate(RunDir(run))
    assert final.ok and final.found == final.expected == 40
    keys = [(r[0], r[1]) for r in rows(run)]
    assert len(keys) == len(set(keys)) == 40


@pytest.mark.slow
def test_killing_the_whole_campaign_then_rerunning_completes_exactly(tmp_path):
    run = tmp_path / "run"
    proc = _cli(run)
    _wait_for_shards(run, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)  # driver and everything it started, mid-chunk
    proc.wait()
    res = run_campaign(cfg(name="k", limit=20, repeats=2, chunk_size=2, policy_opts={"delay_s": 0.02}), run)
    assert res.already_done >= 6 and res.already_done + res.executed == 40 and res.missing == 0
    assert validate(RunDir(run)).ok


def test_corrupt_and_truncated_shards_are_quarantined_and_re_run(tmp_path):
    run = tmp_path / "run"
    run_campaign(cfg(), run)
    shards = list_shards(run / "shards")
    text = shards[0].read_text()
    shards[0].write_text(text[: len(text) // 2])  # truncated mid-line
    (run / "shards" / "shard-garbage.jsonl").write_text('{"campaign": "t", "task_id": null}\nnot json\n')
    (run / "results.duckdb").unlink()
    proc = subprocess.run([sys.executable, "-m", "tbhpc.cli", "merge", str(run)], capture_output=True, text=True)
    assert proc.returncode == 1
    assert shards[0].name in proc.stderr and "shard-garbage.jsonl" in proc.stderr and "corrupt" in proc.stderr
    assert (run / "shards" / "quarantine" / shards[0].name).exists()
    lost = validate(RunDir(run))
    assert len(lost.missing) == 4 and lost.found == 20  # the other shards still merged
    res = run_campaign(cfg(), run)
    assert res.executed == 4 and validate(RunDir(run)).ok


def test_system_errors_are_re_run_and_never_scored(tmp_path, stub_llm):
    state = {"up": False}
    server = stub_llm(lambda body: (200, "Done. <DONE>") if state["up"] else (400, {"error": "down"}))
    c = cfg(policy="openai", policy_opts={"base_url": server.url, "model": "m", "retries": 0}, limit=3)
    first = run_campaign(c, tmp_path / "run")
    assert first.system_errors == 6 and first.missing == 6
    assert {r[3] for r in rows(tmp_path / "run")} == {"system_error"} and {r[2] for r in rows(tmp_path / "run")} == {None}
    val = validate(RunDir(tmp_path / "run"))
    assert len(val.system_errors) == 6 and not val.ok
    state["up"] = True
    second = run_campaign(c, tmp_path / "run")
    assert second.executed == 6 and second.ok == 6 and second.missing == 0
    assert {r[3] for r in rows(tmp_path / "run")} == {"ok"} and validate(RunDir(tmp_path / "run")).ok


def test_task_lists_and_pools_select_tasks(tmp_path, pack_tasks):
    ids = [t.id for t in pack_tasks if t.split == "train"][:3]
    (tmp_path / "pool.yaml").write_text(json.dumps({"tasks": ids}))
    res = run_campaign(cfg(tasks=str(tmp_path / "pool.yaml"), limit=None, repeats=1), tmp_path / "run")
    assert res.planned == 3 and sorted(r[0] for r in rows(tmp_path / "run")) == sorted(ids)
    (tmp_path / "bad.txt").write_text("no-such-task\n")
    with pytest.raises(UserError, match="bad.txt: task id 'no-such-task'"):
        run_campaign(cfg(tasks=str(tmp_path / "bad.txt")), tmp_path / "run2")


def test_validate_against_an_external_task_list(tmp_path):
    run_campaign(cfg(limit=3, repeats=2), tmp_path / "run")
    planned = [r["task_id"] for r in RunDir(tmp_path / "run").plan()]
    (tmp_path / "ids.txt").write_text("\n".join(planned[:2] + ["extra-task"]) + "\n")
    val = validate(RunDir(tmp_path / "run"), planned[:2] + ["extra-task"], 3)
    assert val.expected == 9 and val.found == 6
    assert val.missing == sorted([(planned[0], 2), (planned[1], 2), ("extra-task", 0), ("extra-task", 1), ("extra-task", 2)])
    assert val.unexpected == [(planned[2], 0), (planned[2], 1)] and not val.duplicates
    proc = subprocess.run([sys.executable, "-m", "tbhpc.cli", "validate", str(tmp_path / "run"), "--tasks", str(tmp_path / "ids.txt"),
                           "--repeats", "3"], capture_output=True, text=True)
    assert proc.returncode == 1 and proc.stdout.startswith("6 attempt rows for 9 expected keys: 5 missing, 2 unexpected key(s)")
