"""Jeffreys bands against scipy, the published example, the tie rule and the gates."""
import numpy as np
import pytest
from scipy.stats import beta

from tbhpc.metrics.agg import Counts
from tbhpc.selection.bands import BANDS, BAND_NAMES, assign, band_masses, pick
from tbhpc.selection.pool import SelectConfig, select


def test_three_of_eight_is_hard_with_54_percent():
    idx, masses = assign(np.array([3]), np.array([8]))
    assert BAND_NAMES[idx[0]] == "hard"
    assert masses[0][1] == pytest.approx(0.540, abs=5e-4)
    assert masses[0][1] == pytest.approx(beta.cdf(0.40, 3.5, 5.5) - beta.cdf(0.08, 3.5, 5.5))


@pytest.mark.parametrize("n", [1, 3, 4, 8, 20, 64])
def test_band_masses_match_scipy_for_every_k(n):
    k = np.arange(n + 1)
    masses = band_masses(k, np.full_like(k, n))
    for i, kk in enumerate(k):
        post = beta(kk + 0.5, n - kk + 0.5)
        expected = [post.cdf(hi) - post.cdf(lo) for _, lo, hi in BANDS]
        assert masses[i] == pytest.approx(expected, abs=1e-12)
        assert BAND_NAMES[int(np.argmax(expected))] == BAND_NAMES[assign(np.array([kk]), np.array([n]))[0][0]]
    assert np.allclose(masses.sum(axis=1), 1.0)


def test_ties_go_to_the_earlier_band():
    assert pick(np.array([[0.1, 0.4, 0.4, 0.1, 0.0], [0.3, 0.0, 0.0, 0.0, 0.3]])).tolist() == [1, 0]


def _counts(rows):
    ids, n, c = zip(*rows)
    return Counts("probe", "probe", "p", np.array(ids), np.array(["d"] * len(ids)), np.array(n), np.array(c), 0, 0, {})


def test_gates_in_order():
    probe = _counts([("easy1", 8, 6), ("hard1", 8, 2), ("med1", 8, 4), ("zero", 8, 0), ("all", 8, 8),
                     ("few", 2, 1), ("bench", 8, 4)])
    sel = select(probe, SelectConfig(), excluded_ids={"bench"})
    assert sel.pool == ["easy1", "hard1", "med1"] and sel.excluded == 1
    reasons = {r["id"]: r["reason"] for r in sel.rows}
    assert reasons["few"] == "fewer than 3 clean runs" and reasons["zero"] == "band too_hard not kept"
    assert reasons["all"] == "band too_easy not kept" and "bench" not in reasons
    # band of every probed (non-excluded) task, from scipy: few (1/2) -> Beta(1.5, 1.5) is widest in `hard`
    expected = {}
    for _, n, c in [("e", 8, 6), ("h", 8, 2), ("m", 8, 4), ("z", 8, 0), ("a", 8, 8), ("f", 2, 1)]:
        post = beta(c + 0.5, n - c + 0.5)
        band = BAND_NAMES[int(np.argmax([post.cdf(hi) - post.cdf(lo) for _, lo, hi in BANDS]))]
        expected[band] = expected.get(band, 0) + 1
    assert sel.band_counts == {b: expected.get(b, 0) for b in BAND_NAMES}
    assert sel.band_counts["hard"] == 2

    ref = _counts([("easy1", 4, 1), ("hard1", 4, 0), ("med1", 3, 3)])
    sel = select(probe, SelectConfig(reference="ref"), excluded_ids={"bench"}, reference=ref)
    assert sel.pool == ["easy1"]  # hard1: 0 successes; med1: only 3 clean reference runs
    assert SelectConfig(keep=["medium"]).keep == ["medium"]
    with pytest.raises(Exception, match="unknown band"):
        SelectConfig(keep=["impossible"])
