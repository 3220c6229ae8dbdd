"""The scaling model's arithmetic (tbhpc/plan/model.py): what each phase costs, how on- and
off-policy steps combine them, what shared compute does, and the campaign's waves."""
import dataclasses

import pytest

from tbhpc.plan.calibrate import fit_line
from tbhpc.plan.model import Campaign, Cluster, Workload, campaign_time, phases, step_time

W = Workload(groups=4, group_size=8, mixed_share=0.5, gen_tokens=100, tail_tokens=300, context_tokens=1000, turns=2,
             env_s_per_turn=0.5)
C = Cluster(trainer_nodes=2, ranks_per_node=1, train_tokens_per_s=1000, update_fixed_s=1.0, replicas=2,
            decode_tokens_per_s=320, stream_tokens_per_s=40, weights_gb=2, publish_gb_per_s=1, publish_fixed_s=0.5,
            sync_gb_per_s=2, sync_fixed_s=0.25)


def test_each_phase_follows_its_rule():
    # 8 draws (4 mixed groups at share 0.5) x 8 = 64 episodes; 6,400 generated tokens over 2 x 320 tokens/s
    rollout, update, publish, sync = phases(W, C)
    assert W.draws == 8 and W.episodes == 64 and W.trained_tokens == 32_000
    assert rollout == pytest.approx(10.0)                      # throughput-bound: the tail is 300/40 + 2 x 0.5 = 8.5
    assert update == pytest.approx(32_000 / (2 * 1000) + 1.0)
    assert publish == pytest.approx(2.5) and sync == pytest.approx(1.25)
    # 8 episodes in flight over 2 replicas, half saturation at 4 per replica: each makes half its peak
    starved = dataclasses.replace(C, in_flight=8, half_saturation=4)
    assert phases(W, starved)[0] == pytest.approx(6400 / 320)
    comm = dataclasses.replace(C, trainer_nodes=3, update_comm_s=0.5)
    assert phases(W, comm)[1] == pytest.approx(32_000 / 3000 + 1.0 + 2 * 0.5)
    slow_tail = dataclasses.replace(W, tail_tokens=800)          # one long episode no batching hides
    assert phases(slow_tail, C)[0] == pytest.approx(800 / 40 + 2 * 0.5)


def test_on_policy_adds_the_phases_and_off_policy_overlaps_them():
    on, off = step_time(W, C, 0), step_time(W, C, 1)
    assert on.step_s == pytest.approx(10 + 17 + 2.5 + 1.25)
    assert on.trainer_idle_s == pytest.approx(10 + 1.25) and on.server_idle_s == pytest.approx(17 + 2.5)
    assert off.step_s == pytest.approx(max(10 + 1.25, 17 + 2.5)) and off.trainer_idle_s == pytest.approx(0)
    assert off.server_idle_s == pytest.approx(off.step_s - 11.25)
    # trainer and server on the same cores: the model assumes the overlap buys nothing
    shared = dataclasses.replace(C, shared_compute=True)
    assert step_time(W, shared, 1).step_s == pytest.approx(on.step_s)


def test_ranks_beyond_the_cores_do_not_speed_the_update():
    three = dataclasses.replace(C, trainer_nodes=3, parallel_ranks=2)
    assert phases(W, three)[1] == pytest.approx(phases(W, C)[1])
    assert phases(W, dataclasses.replace(C, trainer_nodes=4))[1] < phases(W, C)[1]


def test_zero_variance_replacement_is_capped_by_max_draws():
    rare = dataclasses.replace(W, mixed_share=0.05, max_draws=12)
    assert rare.draws == 12 and rare.trained_tokens == 4 * 8 * 1000


def test_campaign_runs_in_waves_of_its_fair_share():
    c = campaign_time(Campaign(tasks=100, repeats=10, array_tasks=10, workers=5, attempt_s=2.0, start_s=1.0, slots=4,
                               queue_s=3.0, merge_s=7.0))
    assert c["per_array_task"] == 100 and c["waves"] == 3
    assert c["array_task_s"] == pytest.approx(1.0 + 20 * 2.0)
    assert c["total_s"] == pytest.approx(3 * (3.0 + 41.0) + 7.0)


def test_the_update_rate_is_fitted_with_a_non_negative_fixed_cost():
    slope, icpt = fit_line([(1000, 2.0), (2000, 3.0), (3000, 4.0)])
    assert slope == pytest.approx(1e-3) and icpt == pytest.approx(1.0)
    slope, icpt = fit_line([(1000, 3.0), (2000, 3.5), (3000, 3.6)][::-1] + [(4000, 1.0)])   # noise: no negative cost
    assert icpt >= 0 and slope > 0
