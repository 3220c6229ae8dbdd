"""Estimators and intervals, vectorised over tasks.

Per task, n = clean runs (system errors excluded) and c = successes among them.
- pass@k (unbiased): 1 - C(n-c, k) / C(n, k)        probability that >= 1 of k fresh tries passes
- pass^k (unbiased): C(c, k) / C(n, k)               probability that all k fresh tries pass
- pass^k (reference): (c / n)^k                      the reference harness's biased form, for comparison
- k/k: c == n (the published "20/20")
Products are used instead of binomials so that n in the thousands cannot overflow.
"""
from __future__ import annotations

import numpy as np
from scipy.special import betaincinv, ndtri  # scipy.special only: scipy.stats costs ~0.8 s to import

DEFAULT_KS = (1, 5, 10, 20, 50, 100)


def pass_at_k(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    n, c = np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64)
    fail_all = np.ones(n.shape, dtype=np.float64)
    for j in range(k):  # C(n-c, k)/C(n, k) = prod_j (n-c-j)/(n-j)
        fail_all *= np.clip(n - c - j, 0, None) / np.maximum(n - j, 1)
    return 1.0 - fail_all


def pass_hat_k(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    n, c = np.asarray(n, dtype=np.int64), np.asarray(c, dtype=np.int64)
    out = np.ones(n.shape, dtype=np.float64)
    for j in range(k):  # C(c, k)/C(n, k) = prod_j (c-j)/(n-j)
        out *= np.clip(c - j, 0, None) / np.maximum(n - j, 1)
    return out


def pass_hat_k_reference(n: np.ndarray, c: np.ndarray, k: int) -> np.ndarray:
    n, c = np.asarray(n, dtype=np.float64), np.asarray(c, dtype=np.float64)
    return (c / np.maximum(n, 1)) ** k


def ks_for(n_min: int, ks: tuple[int, ...] = DEFAULT_KS) -> list[int]:
    """The standard k values that every task supports (k <= min n), plus n itself if uniform."""
    out = [k for k in ks if k <= n_min]
    return out


def jeffreys_interval(c: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """Equal-tailed Jeffreys interval, Beta(c+1/2, n-c+1/2); 0 and 1 at the boundaries."""
    if n == 0:
        return (0.0, 1.0)
    a = (1 - level) / 2
    lo = 0.0 if c == 0 else float(betaincinv(c + 0.5, n - c + 0.5, a))
    hi = 1.0 if c == n else float(betaincinv(c + 0.5, n - c + 0.5, 1 - a))
    return lo, hi


def wilson_interval(c: int, n: int, level: float = 0.95) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    z = float(ndtri(1 - (1 - level) / 2))
    p = c / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap_means(values: np.ndarray, b: int = 1000, seed: int = 0, chunk: int = 50) -> np.ndarray:
    """`b` bootstrap replicates of the mean over tasks (rows of `values`, which may be 2-D:
    tasks x metrics). Each replicate resamples tasks with replacement; it is applied as a count
    vector (how often each task was drawn) times `values`, so memory stays O(chunk x tasks)
    however many metrics are bootstrapped together."""
    values = np.asarray(values, dtype=np.float64)
    t = values.shape[0]
    rng = np.random.default_rng(seed)
    flat = values.reshape(t, -1)
    out = []
    for start in range(0, b, chunk):
        m = min(chunk, b - start)
        draws = rng.integers(0, t, size=(m, t)) + (np.arange(m) * t)[:, None]
        weights = np.bincount(draws.ravel(), minlength=m * t).reshape(m, t).astype(np.float64)
        out.append(weights @ flat / t)
    res = np.concatenate(out, axis=0)
    return res.reshape((b,) + values.shape[1:])


def percentile_interval(replicates: np.ndarray, level: float = 0.95) -> tuple[np.ndarray, np.ndarray]:
    a = (1 - level) / 2 * 100
    return np.percentile(replicates, a, axis=0), np.percentile(replicates, 100 - a, axis=0)
