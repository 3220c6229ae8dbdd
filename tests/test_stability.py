"""The stability tools of the trainer (tbhpc/train/stability.py): overlong shaping and filtering,
the variance floor on groups, and the collapse guard, alone and in a real training run (the
tiny warm start, the in-process generator, DeepSpeed on one CPU rank)."""
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import duckdb
import numpy as np
import pytest

from helpers import checkpoint_weights

from tbhpc.errors import UserError
from tbhpc.rollout.buffer import Episode
from tbhpc.rollout.collect import Rollout
from tbhpc.train.config import TrainConfig
from tbhpc.train.grpo import is_informative
from tbhpc.train.loop import Trainer
from tbhpc.train.stability import CollapseGuard, RolloutHealth, overlong_penalty, shaped_rewards

REPO = Path(__file__).resolve().parents[1]


def _rollout(reward: float, generated: int, finish: str = "done", lp: float = -0.5) -> Rollout:
    mask = np.array([0] * 5 + [1] * generated)
    ep = Episode(np.arange(len(mask)), mask, np.where(mask == 1, lp, 0.0), group=0, reward=reward, finish_reason=finish)
    return Rollout(result=None, episode=ep, versions=[], reruns=0)


def test_the_soft_overlong_penalty_ramps_over_the_buffer():
    assert overlong_penalty(100, budget=256, buffer=64) == 0.0
    assert overlong_penalty(192, 256, 64) == 0.0                 # the buffer starts after budget - buffer
    assert overlong_penalty(224, 256, 64) == pytest.approx(-0.5)
    assert overlong_penalty(256, 256, 64, penalty=0.4) == pytest.approx(-0.4)
    assert overlong_penalty(300, 256, 64) == -1.0                # never below -penalty
    assert overlong_penalty(256, 256, 0) == 0.0                  # buffer 0: off


def test_shaping_changes_what_the_advantage_sees_not_the_grade():
    rs = [_rollout(1.0, 50), _rollout(0.0, 50), _rollout(0.0, 256, "response_budget"), _rollout(1.0, 240)]
    assert shaped_rewards(rs, 256, 64, 1.0) == pytest.approx([1.0, 0.0, -1.0, 0.25])
    assert [r.episode.reward for r in rs] == [1.0, 0.0, 0.0, 1.0]
    # all failed, one rambled to the budget: shaped, the group has a signal (do not ramble)
    flat = [_rollout(0.0, 40), _rollout(0.0, 256, "response_budget")]
    assert not is_informative([r.episode.reward for r in flat]) and is_informative(shaped_rewards(flat, 256, 64, 1.0))


def test_the_variance_floor_drops_one_of_eight_groups():
    one_of_eight, two_of_eight = [1] + [0] * 7, [1, 1] + [0] * 6
    assert is_informative(one_of_eight) and is_informative(one_of_eight, min_std=0.0)
    assert not is_informative(one_of_eight, min_std=0.35) and not is_informative([0] + [1] * 7, min_std=0.35)
    assert is_informative(two_of_eight, min_std=0.35)
    assert not is_informative([1] * 8, min_std=0.0)


def test_the_overlong_filter_keeps_a_cut_off_episode_in_the_baseline_but_out_of_the_loss():
    rs = [_rollout(1.0, 30), _rollout(0.0, 30), _rollout(0.0, 256, "response_budget"), _rollout(1.0, 30)]
    group = SimpleNamespace(index=7, rollouts=rs, rewards=[r.episode.reward for r in rs])
    for on, want, n_filtered in ((False, [0.5, -0.5, -0.5, 0.5], 0), (True, [0.5, -0.5, 0.5], 1)):
        eps, adv, filtered = Trainer._advantages(SimpleNamespace(cfg=TrainConfig(overlong_filter=on)), [group])
        assert adv == pytest.approx(want) and filtered == n_filtered      # the baseline is 0.5 either way
        assert [e.finish_reason == "response_budget" for e in eps].count(True) == (0 if on else 1)


def test_rollout_health_is_mean_length_and_sampled_entropy():
    h = RolloutHealth.of([_rollout(1.0, 10, lp=-1.0), _rollout(0.0, 30, "response_budget", lp=-2.0)])
    assert (h.episodes, h.generated, h.overlong) == (2, 40, 1)
    assert h.length == 20 and h.entropy == pytest.approx((10 * 1.0 + 30 * 2.0) / 40)
    assert RolloutHealth.from_list(h.as_list()) == h


def test_the_guard_trips_on_a_length_or_entropy_runaway_after_its_reference():
    g = CollapseGuard(length_factor=2.0, entropy_factor=1.5, window=3)
    for length, ent in ((50, 1.0), (60, 1.2), (55, 0.9)):      # the reference: medians 55 tokens, entropy 1.0
        assert g.check(RolloutHealth(10, length * 10, ent * length * 10)) == ""
    assert g.reference() == (55, pytest.approx(1.0))
    assert g.check(RolloutHealth(10, 1000, 1000)) == ""                             # 100 tokens, entropy 1.0
    assert "mean response 120 tokens > 2 x the reference 55" in g.check(RolloutHealth(10, 1200, 1200))
    assert "entropy 1.6000 > 1.5 x the reference 1.0000" in g.check(RolloutHealth(10, 500, 800))
    assert g.check(RolloutHealth(10, 500, 100)) == ""         # entropy falling to a fifth: sharpening, not a runaway
    fixed = CollapseGuard(length_factor=2.0, window=2, fixed=[10, 0.5])
    assert fixed.check(RolloutHealth(1, 500, 1)) == "" and fixed.check(RolloutHealth(1, 500, 1)) == ""   # never judged
    assert fixed.reference() == (10, 0.5) and "> 2 x the reference 10" in fixed.check(RolloutHealth(1, 21, 1))
    again = CollapseGuard(2.0, 1.5, 3)
    again.restore(g.state())
    assert again.reference() == g.reference()
    assert not CollapseGuard().active


def test_stability_config_errors_name_the_field():
    for bad, field in ((dict(guard_length=1.0), "guard_length"), (dict(guard_entropy=-2), "guard_entropy"),
                       (dict(guard_action="pause"), "guard_action"), (dict(overlong_buffer=9000), "overlong_buffer"),
                       (dict(min_group_std=float("nan")), "min_group_std"), (dict(guard_lr_factor=0.0), "guard_lr_factor"),
                       (dict(guard_window=1), "guard_window"), (dict(guard_reference=[50]), "guard_reference"),
                       (dict(guard_reference=[50, -1]), "guard_reference"), (dict(max_seconds=-5), "max_seconds"),
                       (dict(max_seconds=float("inf")), "max_seconds")):
        with pytest.raises(UserError, match=field):
            TrainConfig(**bad)
    with pytest.raises(UserError, match="max_staleness 0"):
        TrainConfig(guard_length=2.0, max_staleness=1, keep_published=2)
    with pytest.raises(UserError, match="checkpoint_every 1"):
        TrainConfig(guard_entropy=1.5, checkpoint_every=2)


# ---- in a real run ---------------------------------------------------------------------------------
GUARDED = ["generator=local", "steps=6", "group_size=4", "groups_per_step=1", "max_draws=6", "max_tokens=48",
           "response_budget=160", "lr=1e-4", "microbatch_tokens=4096", "seed=3", "keep_published=10",
           # a given reference of 1-token episodes: every step after the first two trips (the real path, forced)
           "guard_length=2", "guard_reference=[1, 0.001]", "guard_window=2", "guard_max_rollbacks=1", "guard_lr_factor=0.5",
           "overlong_filter=true", "overlong_buffer=32"]


def _weights(export: Path) -> dict:
    return checkpoint_weights(export)


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_the_guard_rolls_back_then_stops_and_a_resume_stays_stopped(warm_dir, tmp_path):
    """Steps 1-2 make the reference; step 3's rollouts trip the guard: rollback to step 1's
    weights (republished as step 3), lr halved; step 4 trips again with no rollbacks left: stop,
    step 4 exported with those weights. The same command then resumes to nothing."""
    pool = tmp_path / "pool.yaml"
    pool.write_text("tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n")
    run = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                                                 "SLURM_JOB_ID")}, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", f"pool={pool}", *GUARDED]
    res = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-4000:]
    out = res.stdout + res.stderr
    assert "collapse guard at step 3" in out and "rollback 1/1 to the weights of step 1, lr now 5e-05" in out, out[-3000:]
    assert "collapse guard at step 4" in out and "stopping with the weights of step 3" in out, out[-3000:]
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    steps = con.execute("SELECT step, guard, lr, loss_tokens, gen_tokens > 0, entropy > 0, filtered FROM train_steps "
                        "ORDER BY step").fetchall()
    over = con.execute("SELECT count(*) FROM attempts WHERE finish_reason = 'response_budget'").fetchone()[0]
    con.close()
    assert [s[:3] for s in steps] == [(1, "", 1e-4), (2, "", 1e-4), (3, "rollback", 5e-5), (4, "stop", 5e-5)]
    assert steps[0][3] > 0 and steps[2][3] == 0 and steps[3][3] == 0            # no update on a tripped step
    assert all(s[4] and s[5] for s in steps)
    assert sum(s[6] for s in steps) <= over
    ck = run / "checkpoints"
    w1, w2 = _weights(ck / "step-000001"), _weights(ck / "step-000002")
    assert not _same(w1, w2)                                         # step 2 updated
    assert _same(_weights(ck / "step-000003"), w1)                   # the rollback republished step 1's weights
    assert _same(_weights(run / "exports" / "step-000004"), w1)      # and the stop kept them
    again = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "stopped by the collapse guard at step 4" in again.stdout + again.stderr


@pytest.mark.slow
def test_max_seconds_ends_the_run_after_the_step_that_spends_it_and_a_larger_budget_resumes(warm_dir, tmp_path):
    """A 1-second budget: step 1 spends it, so the run ends there (checkpointed and exported,
    though 3 steps were planned); the same command does nothing more; without the budget (an
    execution field, like steps) the run resumes from step 1's checkpoint to step 3."""
    pool = tmp_path / "pool.yaml"
    pool.write_text("tasks: [consulting-leave_balance-001, consulting-leave_balance-002]\n")
    run = tmp_path / "run"
    env = {**{k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS",
                                                                 "SLURM_JOB_ID")}, "OMP_NUM_THREADS": "1"}
    base = [sys.executable, "-m", "tbhpc.cli", "train", str(run), f"model={warm_dir}", f"pool={pool}", "generator=local",
            "steps=3", "group_size=4", "groups_per_step=1", "max_draws=6", "max_tokens=48", "response_budget=160",
            "lr=1e-4", "microbatch_tokens=4096", "seed=3"]
    res = subprocess.run([*base, "max_seconds=1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    out = res.stdout + res.stderr
    assert res.returncode == 0, out[-4000:]
    assert "time budget 1 s reached at step 1" in out and "time budget of 1 s spent after step 1" in out, out[-3000:]
    assert (run / "exports" / "step-000001" / "config.json").exists() and not (run / "checkpoints" / "step-000002").exists()
    again = subprocess.run([*base, "max_seconds=1"], cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0 and "spent its time budget (1 s) at step 1" in again.stdout + again.stderr
    more = subprocess.run(base, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert more.returncode == 0, (more.stdout + more.stderr)[-3000:]
    con = duckdb.connect(str(run / "results.duckdb"), read_only=True)
    steps = [r[0] for r in con.execute("SELECT step FROM train_steps ORDER BY step").fetchall()]
    con.close()
    assert steps == [1, 2, 3] and (run / "exports" / "step-000003" / "config.json").exists()
