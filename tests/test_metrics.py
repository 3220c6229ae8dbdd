"""Every metric against values computed by hand (comments show the arithmetic)."""
import numpy as np
import pytest
from scipy.stats import beta

from tbhpc.metrics.agg import Counts, compare, cost, summarise
from tbhpc.metrics.stats import (bootstrap_means, jeffreys_interval, ks_for, pass_at_k, pass_hat_k,
                                 pass_hat_k_reference, wilson_interval)


def test_pass_at_k_unbiased():
    # n=5, c=2, k=2: 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k([5], [2], 2)[0] == pytest.approx(0.7)
    # n=20, c=1, k=20: at least one success in all 20 -> 1; c=0 -> 0
    assert pass_at_k([20, 20], [1, 0], 20).tolist() == [1.0, 0.0]
    # n=10, c=3, k=5: 1 - C(7,5)/C(10,5) = 1 - 21/252
    assert pass_at_k([10], [3], 5)[0] == pytest.approx(1 - 21 / 252)
    # k=1 is the per-task rate
    assert pass_at_k([8, 4], [3, 1], 1).tolist() == pytest.approx([3 / 8, 1 / 4])


def test_pass_hat_k_both_forms():
    # unbiased: C(3,2)/C(5,2) = 3/10; reference: (3/5)^2 = 0.36
    assert pass_hat_k([5], [3], 2)[0] == pytest.approx(0.3)
    assert pass_hat_k_reference([5], [3], 2)[0] == pytest.approx(0.36)
    # 19/20 at k=20: unbiased 0 (20 fresh tries can't all pass if one of 20 failed), reference 0.95^20 = 0.358
    assert pass_hat_k([20], [19], 20)[0] == 0.0
    assert pass_hat_k_reference([20], [19], 20)[0] == pytest.approx(0.3585, abs=1e-4)
    assert pass_hat_k([20], [20], 20)[0] == 1.0
    assert pass_hat_k([4], [1], 2)[0] == 0.0


def test_large_n_does_not_overflow():
    assert pass_at_k([5000], [2500], 100)[0] == pytest.approx(1.0)
    assert 0 < pass_hat_k([5000], [4990], 100)[0] < 1


def test_intervals():
    lo, hi = jeffreys_interval(6, 12)
    assert (lo, hi) == pytest.approx((beta.ppf(0.025, 6.5, 6.5), beta.ppf(0.975, 6.5, 6.5)))
    assert jeffreys_interval(0, 10)[0] == 0.0 and jeffreys_interval(10, 10)[1] == 1.0
    # Wilson for 8/10 at 95%: centre (0.8 + z^2/20)/(1 + z^2/10), half-width z*sqrt(.016 + z^2/400)/(1 + z^2/10)
    assert wilson_interval(8, 10) == pytest.approx((0.490162, 0.943318), abs=1e-6)


def test_ks_for():
    assert ks_for(20) == [1, 5, 10, 20] and ks_for(4) == [1] and ks_for(100) == [1, 5, 10, 20, 50, 100]


def test_bootstrap_is_seeded_and_exact_on_constants():
    v = np.array([0.25] * 7)
    assert np.all(bootstrap_means(v, 200, seed=1) == 0.25)
    x = np.arange(10, dtype=float)
    a, b = bootstrap_means(x, 300, seed=5), bootstrap_means(x, 300, seed=5)
    assert np.array_equal(a, b) and a.shape == (300,) and 2 < a.mean() < 7


def _counts(rows, usage=None):
    ids, doms, n, c = zip(*rows)
    zero = {"input": 0, "cached": 0, "output": 0}
    return Counts("run", "camp", "pol", np.array(ids), np.array(doms), np.array(n), np.array(c), sum(n), 0,
                  usage or {"agent": dict(zero), "user": dict(zero), "judge": dict(zero)})


def test_summary_hand_computed():
    # four tasks, 4 runs each: c = 4, 2, 0, 3
    s = summarise(_counts([("a", "x", 4, 4), ("b", "x", 4, 2), ("c", "y", 4, 0), ("d", "y", 4, 3)]), bootstrap=200)
    assert s["pass@1"]["value"] == pytest.approx(9 / 16)
    assert s["k/k"]["count"] == 1 and s["k/k"]["value"] == pytest.approx(0.25)
    assert s[">=1"]["count"] == 3
    assert list(s["pass@k"]) == [1]  # only k <= min n = 4 from {1, 5, ...}
    dom = {d["domain"]: d for d in s["by_domain"]["domains"]}
    assert dom["x"]["pass_rate"] == pytest.approx(6 / 8) and dom["y"]["pass_rate"] == pytest.approx(3 / 8)
    assert s["by_domain"]["micro"]["pass_rate"] == pytest.approx(9 / 16)
    assert s["by_domain"]["macro"]["pass_rate"] == pytest.approx((6 / 8 + 3 / 8) / 2)
    assert dom["x"]["ci_lo"] == pytest.approx(wilson_interval(6, 8)[0])


def test_summary_with_twenty_repeats_matches_the_published_definitions():
    rows = [("t1", "d", 20, 20), ("t2", "d", 20, 19), ("t3", "d", 20, 0), ("t4", "d", 20, 10)]
    s = summarise(_counts(rows), bootstrap=0)
    assert s["pass@k"][20]["value"] == pytest.approx(3 / 4)           # tasks with >= 1 success
    assert s["pass^k"][20]["unbiased"]["value"] == pytest.approx(1 / 4)  # only the 20/20 task
    ref = (1 + 0.95 ** 20 + 0 + 0.5 ** 20) / 4
    assert s["pass^k"][20]["reference"]["value"] == pytest.approx(ref)
    assert s["k/k"]["count"] == 1


def test_task_shares_have_jeffreys_intervals_that_do_not_collapse_at_zero():
    # no task at 20/20 among 24: a bootstrap over tasks would say [0%, 0%]; Beta(0.5, 24.5) says up to ~10%
    s = summarise(_counts([(f"t{i}", "d", 20, i % 5) for i in range(24)]), bootstrap=200)
    assert s["k/k"]["count"] == 0 and s["k/k"]["lo"] == 0.0
    assert s["k/k"]["hi"] == pytest.approx(beta.ppf(0.975, 0.5, 24.5)) and s["k/k"]["hi"] > 0.05
    # >=1: 19 of 24 tasks (c = i % 5 > 0)
    assert s[">=1"]["count"] == 19 and s[">=1"]["value"] == pytest.approx(19 / 24)
    assert (s[">=1"]["lo"], s[">=1"]["hi"]) == pytest.approx(jeffreys_interval(19, 24))


def test_cost():
    usage = {"agent": {"input": 2_000_000, "cached": 500_000, "output": 100_000},
             "user": {"input": 1_000_000, "cached": 0, "output": 50_000},
             "judge": {"input": 0, "cached": 0, "output": 0}}
    prices = {"agent": {"input": 1.0, "cached": 0.1, "output": 4.0}, "user": {"input": 0.5, "output": 2.0}}
    out = cost(usage, prices, successes=10, reliable_tasks=4)
    agent = 1.5 * 1.0 + 0.5 * 0.1 + 0.1 * 4.0    # 1.95
    user = 1.0 * 0.5 + 0.05 * 2.0                 # 0.6
    assert out["by_role"]["agent"] == pytest.approx(agent) and out["by_role"]["user"] == pytest.approx(user)
    assert out["total"] == pytest.approx(agent + user)
    assert out["per_success"] == pytest.approx((agent + user) / 10)
    assert out["per_reliable_task"] == pytest.approx((agent + user) / 4)
    assert cost(usage, prices, 0, 0)["per_success"] is None


def test_paired_comparison():
    a = _counts([("t1", "d", 4, 1), ("t2", "d", 4, 2), ("t3", "d", 4, 4)])
    b = _counts([("t1", "d", 4, 3), ("t2", "d", 4, 2), ("t9", "d", 4, 0)])
    cmp = compare(a, b, bootstrap=300)
    assert cmp["shared_tasks"] == 2
    m = cmp["metrics"]["pass@1"]
    assert m["base"] == pytest.approx((1 / 4 + 2 / 4) / 2) and m["other"] == pytest.approx((3 / 4 + 2 / 4) / 2)
    assert m["delta"] == pytest.approx(0.25) and m["lo"] <= 0.25 <= m["hi"]
    same = compare(a, a, bootstrap=100)["metrics"]
    assert all(v["delta"] == 0 and v["lo"] == 0 and v["hi"] == 0 for v in same.values())
