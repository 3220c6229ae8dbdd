"""Campaigns on a real Slurm cluster (slurm/local: Debian's slurmctld + 3 slurmd + slurmdbd).

`make test` starts the cluster (slurm/local/with-cluster.sh) and sets TBHPC_REQUIRE_SLURM=1, so
these tests fail, never skip, in CI; a plain `pytest` without a cluster skips them.
"""
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

from tbhpc.campaign.runner import run_campaign
from tbhpc.campaign.config import CampaignConfig
from tbhpc.campaign.validate import validate
from tbhpc.slurm_options import SlurmOptions
from tbhpc.launch.slurm import SlurmClient, SlurmExecutor
from tbhpc.store.run_dir import RunDir
from tbhpc.store.shards import list_shards

from helpers import attempt_rows as rows
from helpers import require_slurm

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", autouse=True)
def cluster():
    require_slurm()


def slurm_executor(**opts):
    base = dict(poll_seconds=0.5, array_parallelism=6, attempts_per_task=60)
    return SlurmExecutor(SlurmOptions(**{**base, **opts}), SlurmClient(), log=lambda *_: None)


def test_slurm_array_gives_the_same_rows_as_local(tmp_path):
    cfg = CampaignConfig(name="eq", split="eval", repeats=4, policy_opts={"skill": 0.8})
    local = run_campaign(cfg, tmp_path / "local")
    ex = slurm_executor()
    res = run_campaign(cfg, tmp_path / "slurm", executor=ex)
    assert res.missing == 0 and local.missing == 0 and res.planned == 134 * 4
    assert rows(tmp_path / "slurm") == rows(tmp_path / "local")
    assert ex.client.calls["sbatch"] == 1 and ex.client.calls["sacct"] == 0
    con = duckdb.connect(str(tmp_path / "slurm" / "results.duckdb"), read_only=True)
    nodes = {r[0] for r in con.execute("SELECT DISTINCT slurm_array_task_id FROM attempts").fetchall()}
    jobs = {r[0] for r in con.execute("SELECT DISTINCT slurm_array_job_id FROM attempts").fetchall()}
    con.close()
    assert len(nodes) == 9 and len(jobs) == 1  # 536 attempts in arrays tasks of 60


def test_a_thinkingbox_source_on_mcp_servers_runs_as_an_array_like_locally(tmp_path, pack_tasks):
    pytest.importorskip("mcp")
    from tbhpc.mcp.export import write_dataset
    picked = [t for t in pack_tasks if t.split == "eval" and t.domain in ("travel", "insurance")][::9][:6]
    root = write_dataset(picked, tmp_path / "tbdata")
    cfg = CampaignConfig(name="tb", pack=f"tb:{root}", tasks=str(root / "testlist.yaml"),
                         servers=str(root / "servers.yaml"), repeats=2, policy_opts={"skill": 0.8})
    local = run_campaign(cfg, tmp_path / "local")
    ex = slurm_executor(attempts_per_task=4)
    res = run_campaign(cfg, tmp_path / "slurm", executor=ex)
    assert res.missing == 0 and local.missing == 0 and res.planned == len(picked) * 2
    assert rows(tmp_path / "slurm") == rows(tmp_path / "local")
    assert {r[3] for r in rows(tmp_path / "slurm")} == {"ok"}
    con = duckdb.connect(str(tmp_path / "slurm" / "results.duckdb"), read_only=True)
    tasks = con.execute("SELECT count(DISTINCT slurm_array_task_id), count(DISTINCT domain) FROM attempts").fetchone()
    con.close()
    assert tasks == (3, 2)     # 12 attempts in array tasks of 4; domains are the scenarios


def _array_pids(run: Path) -> dict[str, int]:
    """{array task id: pid} of running array-task workers of this run (same host as the nodes)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            if b"tbhpc.launch.array_task" not in cmd or str(run).encode() not in cmd:
                continue
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
            found[env[b"SLURM_ARRAY_TASK_ID"].decode()] = int(proc.name)
        except (OSError, KeyError, ValueError):
            continue
    return found


def _eval_cli(run: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(run), "--executor", "slurm", "name=chaos", "limit=24",
         "repeats=2", "policy_opts={delay_s: 0.05}",
         "slurm={attempts_per_task: 8, flush_every: 2, poll_seconds: 0.5, array_parallelism: 6}", *extra],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait(predicate, timeout=90.0, every=0.2):
    end = time.time() + timeout
    while time.time() < end:
        value = predicate()
        if value:
            return value
        time.sleep(every)
    raise AssertionError("timed out waiting")


def test_kill_9_and_requeue_mid_chunk_complete_exactly_once(tmp_path):
    run = tmp_path / "run"
    proc = _eval_cli(run)
    # two array tasks running, each with at least one flushed shard: then they are mid-chunk
    def two_mid_chunk():
        pids = _array_pids(run)
        started = {n.split("-t")[1][:5] for n in (p.name for p in list_shards(run / "shards"))}
        busy = [t for t in pids if f"{int(t):05d}" in started]
        return (pids, busy) if len(busy) >= 2 else None
    pids, busy = _wait(two_mid_chunk)
    os.kill(pids[busy[0]], signal.SIGKILL)
    job = (run / "slurm" / "stage-001" / "jobs.json").read_text().split('"array": "')[1].split('"')[0]
    subprocess.run(["scontrol", "requeue", f"{job}_{busy[1]}"], check=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    val = validate(RunDir(run))
    assert val.ok and val.found == val.expected == 48
    keys = [(r[0], r[1]) for r in rows(run)]
    assert len(keys) == len(set(keys)) == 48
    requeued = (run / "logs" / "slurm" / f"tbhpc-chaos-{job}_{busy[1]}.out").read_text()
    assert "SIGTERM received" in requeued and re.search(r"[1-9]\d* already written", requeued)  # saved work skipped
    retried = "".join(p.read_text() for p in (run / "logs" / "slurm").glob(f"tbhpc-chaos-*_{busy[0]}.out"))
    assert len(re.findall(r"task \d+: \d+ keys", retried)) == 2 and re.search(r"[1-9]\d* already written", retried)


def test_mpi_mode_gives_the_same_rows_as_local(tmp_path):
    from tbhpc.launch.slurm import MPIExecutor
    cfg = CampaignConfig(name="mpi", split="eval", repeats=4, policy_opts={"skill": 0.8})
    run_campaign(cfg, tmp_path / "local")
    ex = MPIExecutor(SlurmOptions(poll_seconds=0.5, attempts_per_task=20, nodes=3, ntasks=6), SlurmClient(), log=lambda *_: None)
    res = run_campaign(cfg, tmp_path / "mpi", executor=ex)
    assert res.missing == 0 and rows(tmp_path / "mpi") == rows(tmp_path / "local")
    con = duckdb.connect(str(tmp_path / "mpi" / "results.duckdb"), read_only=True)
    hosts = con.execute("SELECT count(DISTINCT worker_pid), count(DISTINCT slurm_job_id) FROM attempts").fetchone()
    con.close()
    assert hosts[0] == 5 and hosts[1] == 1  # five worker ranks (rank 0 hands out chunks) in one allocation
    log = "".join(p.read_text() for p in (tmp_path / "mpi" / "logs" / "slurm").glob("*.out"))
    assert "handed out 27 chunks to 5 ranks" in log


def test_preemption_requeues_the_chunk_and_loses_nothing(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(run), "--executor", "slurm", "name=pre", "limit=12",
         "repeats=3", "policy_opts={delay_s: 0.25}", "slurm={attempts_per_task: 6, flush_every: 1, poll_seconds: 0.5, "
         "partition: batch, array_parallelism: 6}"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait(lambda: len(_array_pids(run)) == 6 and len(list_shards(run / "shards")) >= 3)
    high = subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", "-p", "high", "-N", "3", "-n", "6", "--wrap", "sleep 2"],
                          capture_output=True, text=True, check=True).stdout.strip()
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    val = validate(RunDir(run))
    assert val.ok and val.found == 36
    logs = "".join(p.read_text() for p in (run / "logs" / "slurm").glob("*.out"))
    assert "DUE TO PREEMPTION" in logs and "SIGTERM received" in logs and re.search(r"[1-9]\d* already written", logs)
    state = subprocess.run(["sacct", "-n", "-P", "-X", "-j", high, "-o", "State"], capture_output=True, text=True).stdout
    assert "COMPLETED" in state


def test_fair_share_charges_the_account_and_reorders_waiting_jobs(tmp_path):
    before = _usage("acct_a")
    # Slurm adds usage at its once-a-minute priority tick for jobs running then: the array tasks run
    # ~65 s (4 attempts of 5 completions x 3.2 s) so that at least one tick sees them
    cfg = CampaignConfig(name="fs", split="eval", limit=12, repeats=2, policy_opts={"delay_s": 3.2},
                         slurm={"account": "acct_a", "attempts_per_task": 4, "poll_seconds": 0.5})
    ex = slurm_executor(account="acct_a", attempts_per_task=4)
    run_campaign(cfg, tmp_path / "run", executor=ex)
    job = (tmp_path / "run" / "slurm" / "stage-001" / "jobs.json").read_text().split('"array": "')[1].split('"')[0]
    charged = _wait(lambda: subprocess.run(["sacct", "-n", "-P", "-X", "-j", job, "-o", "Account"], capture_output=True,
                                           text=True).stdout.split(), timeout=60)
    assert set(charged) == {"acct_a"}
    _wait(lambda: _usage("acct_a") > before, timeout=150, every=2)  # the campaign's CPU time reached fair-share
    assert _usage("acct_b") == 0
    # fill the cluster, then queue one job per account: acct_b's (no usage) must outrank acct_a's.
    # The blocker must be running first: with a core still free (another test's job ending), acct_b's
    # job -- first in priority order -- would start at once and leave sprio nothing to rank.
    _wait(lambda: not _queue(), timeout=360, every=1)   # other files' jobs (a serving job, make train) end first
    blocker, a, b = _sbatch("-A", "acct_a", "-N", "3", "-n", "6", "--wrap", "sleep 300"), "", ""
    try:
        _wait(lambda: _queue().get(blocker) == "RUNNING", timeout=60, every=0.5)
        a, b = _sbatch("-A", "acct_a", "--wrap", "true"), _sbatch("-A", "acct_b", "--wrap", "true")
        seen = []

        def fairshare():
            out = subprocess.run(["sprio", "-h", "-j", f"{a},{b}", "-o", "%i %F"], capture_output=True, text=True).stdout
            seen[:] = [out, _queue()]
            f = {i: float(v) for i, v in (line.split() for line in out.splitlines() if line.strip())}
            return f if len(f) == 2 and f[b] > f[a] else None
        try:
            f = _wait(fairshare, timeout=150, every=2)
        except AssertionError:
            raise AssertionError(f"acct_b's job never outranked acct_a's: sprio {seen[0]!r}, queue {seen[1]}, "
                                 f"usage a={_usage('acct_a')} b={_usage('acct_b')}") from None
        assert f[b] > f[a]
    finally:
        subprocess.run(["scancel", blocker, *filter(None, (a, b))], check=False)


def _queue() -> dict[str, str]:
    """Job id -> state of every job in the local cluster's queue."""
    out = subprocess.run(["squeue", "-h", "-o", "%i %T"], capture_output=True, text=True).stdout
    return dict(line.split(maxsplit=1) for line in out.splitlines() if line.strip())


def _usage(account: str) -> float:
    out = subprocess.run(["sshare", "-n", "-P", "-A", account, "-o", "RawUsage"], capture_output=True, text=True).stdout
    return float(out.split()[0]) if out.split() else 0.0


def _sbatch(*args: str) -> str:
    return subprocess.run(["sbatch", "--parsable", "-o", "/dev/null", *args], capture_output=True, text=True,
                          check=True).stdout.strip()


def test_a_job_that_can_never_start_is_reported_not_waited_on(tmp_path):
    from tbhpc.errors import InfraError
    from tbhpc.launch.slurm import MPIExecutor
    cfg = CampaignConfig(name="big", split="eval", limit=2, repeats=1)
    ex = MPIExecutor(SlurmOptions(nodes=3, ntasks=64, poll_seconds=0.5), SlurmClient(), log=lambda *_: None)
    with pytest.raises(InfraError, match="can never start"):
        run_campaign(cfg, tmp_path / "run", executor=ex)
    assert validate(RunDir(tmp_path / "run")).missing  # nothing lost: the campaign simply resumes later


def test_usr2_before_the_time_limit_flushes_and_requeues_the_task(tmp_path):
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "tbhpc.cli", "eval", "--out", str(run), "--executor", "slurm", "name=tl", "limit=8",
         "repeats=2", "policy_opts={delay_s: 0.1}", "slurm={attempts_per_task: 16, flush_every: 1, poll_seconds: 0.5}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait(lambda: _array_pids(run) and len(list_shards(run / "shards")) >= 3)
    job = (run / "slurm" / "stage-001" / "jobs.json").read_text().split('"array": "')[1].split('"')[0]
    # what Slurm does --signal seconds before the time limit: USR2 to the batch step
    subprocess.run(["scancel", "--signal=USR2", "--batch", f"{job}_0"], check=True)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert validate(RunDir(run)).ok
    log = (run / "logs" / "slurm" / f"tbhpc-tl-{job}_0.out").read_text()
    assert "SIGUSR2 received" in log and f"requeued {job}_0" in log and re.search(r"[1-9]\d* already written", log)


def test_submit_chains_array_merge_agg_and_status_is_one_batched_call(tmp_path):
    from tbhpc.launch.status import run_status
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, "-m", "tbhpc.cli", "submit", "eval", "--out", str(run), "name=sub", "limit=20",
                          "repeats=2", "slurm={attempts_per_task: 10, account: acct_a}"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "jobs array" in out.stdout and "merge" in out.stdout and "agg" in out.stdout
    agg_log = run / "logs" / "slurm"
    _wait(lambda: any(p.name.startswith("tbhpc-sub-agg") and "MICRO_AVG" in p.read_text() for p in agg_log.glob("*.out")),
          timeout=120, every=0.5)
    client = SlurmClient()
    status = run_status(RunDir(run), client)
    assert status[0]["attempts_done"] == status[0]["attempts_planned"] == 40 and status[0]["array_tasks"] == 4
    assert status[0]["failed_tasks"] == 0 and client.calls == {"squeue": 1, "sacct": 1}
    assert validate(RunDir(run)).ok  # the merge job merged everything
    cli = subprocess.run([sys.executable, "-m", "tbhpc.cli", "status", str(run)], capture_output=True, text=True)
    assert cli.returncode == 0 and "40/40" in cli.stdout
