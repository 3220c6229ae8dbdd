"""The trainer for real: `tbhpc train` with the in-process generator on the tiny warm start
(`make warmstart`: fine-tuned on oracle episodes of the smoke pool, so groups are mixed), then
the same run on the local Slurm cluster over 3 ranks, preempted with USR2 after step 1: it
checkpoints, requeues itself, resumes and must reach the weights of the uninterrupted run.

Why the in-process generator here: its samples are a function of (weights, seed), so two runs
can be compared weight for weight. The vLLM server is not deterministic across requests
(batching changes the arithmetic); the server path is tested by `make train` (test_make_train).
"""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import numpy as np
import pytest

from helpers import checkpoint_weights, train_rows

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]
SMALL = ["generator=local", "steps=2", "group_size=4", "groups_per_step=2", "max_draws=8", "max_tokens=48",
         "response_budget=160", "lr=1e-4", "microbatch_tokens=4096", "seed=3", "exclude=[tbhpc/data/packs/default/eval_ids.txt]"]
# the smoke-pool tasks the warm start solves about a third of the time: most groups of 4 are mixed
POOL = "tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n"


def _train(run: Path, *overrides: str, timeout=900) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    return subprocess.run([sys.executable, "-m", "tbhpc.cli", "train", str(run), *overrides], cwd=REPO, env={
        **env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=timeout)


def _weights(export: Path) -> dict:
    return checkpoint_weights(export)


@pytest.fixture(scope="module")
def pool(tmp_path_factory):
    path = tmp_path_factory.mktemp("pool") / "pool.yaml"
    path.write_text(POOL)
    return f"pool={path}"


@pytest.fixture(scope="module")
def uninterrupted(warm_dir, pool, tmp_path_factory):
    """Started through the Python API (`tbhpc train` in a subprocess, what `_train` runs)."""
    from tbhpc import api
    run = tmp_path_factory.mktemp("train-local") / "run"
    log = run.parent / "train.log"
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS")}
    started = api.train(out=run, executor="local", log=log, env={**env, "OMP_NUM_THREADS": "1"},
                        overrides=[f"model={warm_dir}", pool, *SMALL, "tensorboard=true", "export_eval=jobs/eval.yaml",
                                   "export_eval_overrides=[tasks=jobs/pools/smoke.yaml, limit=2, repeats=2, workers=1]"])
    code = started.wait()
    out = log.read_text()
    assert code == 0, out[-6000:]
    return run, out


def test_local_run_trains_records_and_publishes(uninterrupted, warm_dir):
    run, out = uninterrupted
    assert "step    1 [base]" in out and "step    2 [step-000001]" in out
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    steps = con.execute("SELECT step, policy_version, kept, drawn, loss_tokens, grad_norm, mismatch FROM train_steps "
                        "ORDER BY step").fetchall()
    rows = con.execute("SELECT train_step, policy_version, policy_id, task_id, attempt_index, reward, status FROM attempts "
                       "WHERE campaign = 'train'").fetchall()
    con.close()
    assert [s[:2] for s in steps] == [(1, "base"), (2, "step-000001")]
    # which draws come out mixed depends on sampling (and so on the CPU's float arithmetic): at least
    # one step must have trained; a step without a mixed group must not have touched the weights
    assert any(s[2] >= 1 for s in steps), steps
    assert all((s[2] >= 1) == (s[4] > 0) == (s[5] > 0) for s in steps), steps
    assert all(s[6] < 1e-4 for s in steps if s[2]), steps      # trainer vs generator logprobs, same weights, fp32
    # every rollout row: the step that used it and the weights that sampled it (always the previous step's)
    assert rows and all(v == ("base" if t == 1 else f"step-{t - 1:06d}") == p for t, v, p, *_ in rows)
    assert all(st == "ok" and r in (0.0, 1.0) for *_, r, st in rows)
    # the published checkpoints carry fingerprints; the last step is exported as an HF directory
    for step in (1, 2):
        marker = json.loads((run / "checkpoints" / f"step-{step:06d}.ready").read_text())
        assert marker["fingerprint"]["logprobs"]
    w0, w2 = _weights(Path(warm_dir)), _weights(run / "exports" / "step-000002")
    assert max(np.abs(w2[k] - w0[k]).max() for k in w0) > 1e-5                      # the weights moved
    # buffers: group-centred advantages sum to zero within every kept group
    import h5py
    with h5py.File(run / "buffers" / "step-000001.h5") as f:
        g, adv = f["episodes/group"][:], f["episodes/advantage"][:]
    for gid in np.unique(g):
        assert abs(adv[g == gid].sum()) < 1e-5


def test_report_plots_the_curves_and_tensorboard_has_the_scalars(uninterrupted):
    run, _ = uninterrupted
    res = subprocess.run([sys.executable, "-m", "tbhpc.cli", "report", str(run)], cwd=REPO, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    md = (run / "report" / "report.md").read_text()
    assert "# Training report: train" in md and "| 2 | step-000001 |" in md and "train_curves.png" in md
    assert (run / "report" / "train_curves.png").stat().st_size > 10_000
    assert "![train_timeline](train_timeline.png)" in md and (run / "report" / "train_timeline.png").stat().st_size > 5_000
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(run / "tensorboard"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/reward_mean")] == [1, 2]
    assert {"train/loss", "train/grad_norm", "train/mismatch", "train/update_s"} <= set(acc.Tags()["scalars"])


def test_the_export_is_evaluated_by_a_campaign_when_asked(uninterrupted):
    """export_eval: the trainer starts an eval campaign on the export and goes on (detached here,
    a submitted pipeline under Slurm)."""
    run, out = uninterrupted
    assert "train: evaluating step-000002 in" in out
    log = run / "logs" / "eval-step-000002.log"
    deadline = time.monotonic() + 300
    while "still to run" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, log.read_text() if log.exists() else "no eval log"
        time.sleep(1)
    assert "4 planned, 0 already done, 4 executed (4 ok, 0 system errors), 0 still to run" in log.read_text()
    con = duckdb.connect(str(run / "evals" / "step-000002" / "results.duckdb"), read_only=True)
    pid = con.execute("SELECT DISTINCT policy_id FROM attempts").fetchall()
    con.close()
    assert len(pid) == 1 and "step-000002" in pid[0][0]       # the policy id names the export


def test_a_resumed_run_with_other_hyperparameters_is_refused(uninterrupted, warm_dir, pool):
    run, _ = uninterrupted
    res = _train(run, f"model={warm_dir}", pool, *SMALL, "clip_high=0.28")
    assert res.returncode == 2 and "holds a different training run (field 'clip_high' differs)" in res.stderr


def test_preempted_slurm_run_requeues_and_reaches_the_same_weights(uninterrupted, warm_dir, pool, tmp_path):
    """3 ranks under Slurm, USR2 once step 1's rollouts are recorded (what Slurm sends before a time
    limit): the ranks stop after step 1 or during step 2's rollouts, rank 0 requeues the job, the
    restart resumes from the DeepSpeed checkpoint and redraws step 2 identically. checkpoint_every 2:
    step 1 is saved because the signal came, not because of the schedule. Same kept groups,
    same rewards, the same weights up to summation order."""
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        if os.environ.get("TBHPC_REQUIRE_SLURM"):
            pytest.fail("TBHPC_REQUIRE_SLURM is set but no cluster is configured (SLURM_CONF)")
        pytest.skip("no Slurm cluster (run `make slurm-up` and source its env.sh)")
    ref, _ = uninterrupted
    run = tmp_path / "run"
    sub = subprocess.run([sys.executable, "-m", "tbhpc.cli", "submit", "train", "--out", str(run), f"model={warm_dir}",
                          pool, *SMALL, "nodes=3", "checkpoint_every=2",
                          "slurm={cpus_per_task: 1, mem: null, time: '00:30:00'}"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert sub.returncode == 0, sub.stderr
    job = json.loads(json.dumps(__import__("yaml").safe_load((run / "slurm" / "train-jobs.yaml").read_text())))["train"]
    # Step 1's buffers exist once its rollouts are agreed done: from then on the signal is acted on
    # after step 1 at the earliest, and step 2's update is ~15 s away (a CI run once sent it 4 s
    # into step 2's rollouts and the run finished without seeing it).
    deadline = time.monotonic() + 600
    while not list((run / "buffers").glob("step-000001.*h5")):
        assert time.monotonic() < deadline, "step 1's rollouts never ended"
        assert _state(job), f"the job ended before step 1; see {run}/logs/slurm"
        time.sleep(0.5)
    timeline = _signal_until_acknowledged(job, run)
    deadline = time.monotonic() + 900
    while _state(job):
        assert time.monotonic() < deadline, "the requeued job did not finish"
        time.sleep(2)
    log = _slurm_log(run)
    assert "requeued job" in log and "resumed from the DeepSpeed checkpoint of step" in log, (timeline, log[-3000:])
    assert "stopped during the rollouts of step 2" in log or "stopped after step 1" in log, (timeline, log[-3000:])
    assert (run / "exports" / "step-000002").exists(), log[-3000:]
    # the same groups with the same rewards as the uninterrupted 1-rank run
    assert train_rows(run) == train_rows(ref)
    a, b = _weights(ref / "exports" / "step-000002"), _weights(run / "exports" / "step-000002")
    w0 = _weights(Path(warm_dir))
    moved = max(np.abs(a[k] - w0[k]).max() for k in a)
    diff = max(np.abs(a[k] - b[k]).max() for k in a)
    # Compared as whole updates: Adam divides each gradient element by its own magnitude, so an
    # element whose gradient is a near-cancelling sum (a rare token's embedding, ~eps) can move by a
    # visible fraction of lr under another summation order (a CI run: one element 0.11 lr apart).
    # A lost optimiser state or a step applied twice changes the whole update, not one element.
    update = np.sqrt(sum(float(((a[k] - w0[k]) ** 2).sum()) for k in a))
    apart = np.sqrt(sum(float(((a[k] - b[k]) ** 2).sum()) for k in a))
    from helpers import MACHINE_NOTES
    MACHINE_NOTES.append(f"preemption test: weights moved {moved:.2e} in 2 steps; requeued 3-rank run vs "
                         f"uninterrupted 1-rank run: max |dw| {diff:.2e}, |dw| / |update| {apart / update:.1e}")
    assert moved > 1e-5 and apart < update * 1e-2, (moved, diff, update, apart)


def _signal_until_acknowledged(job: str, run: Path, every_s: float = 3.0) -> list[str]:
    """scancel --signal=USR2, again every `every_s` until a rank logs it got one (a handler that is
    already stopping ignores repeats) or the job ends; returns the timeline for failure messages."""
    timeline, deadline = [], time.monotonic() + 300
    while _state(job):
        assert time.monotonic() < deadline, timeline + ["no rank said it got the signal in 300 s"]
        timeline.append(f"{time.strftime('%H:%M:%S')} USR2 sent")
        subprocess.run(["scancel", "--signal=USR2", job], capture_output=True)     # the job may just have ended
        sent = time.monotonic()
        while time.monotonic() - sent < every_s:
            acknowledged = [line for line in _slurm_log(run).splitlines() if "got SIGUSR2" in line]
            if acknowledged:
                return timeline + acknowledged
            time.sleep(0.2)
    return timeline + ["the job ended before any rank got the signal"]


def _slurm_log(run: Path) -> str:
    return "".join(p.read_text() for p in (run / "logs" / "slurm").glob("*.out"))


def _state(job: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job, "-o", "%T"], capture_output=True, text=True).stdout.strip()
