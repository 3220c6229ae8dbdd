"""Difficulty bands from the Jeffreys posterior of a task's success rate.

With k successes in n clean probes the posterior is Beta(k + 1/2, n - k + 1/2). Its mass in each
band [lo, hi) is I_hi - I_lo (regularised incomplete beta); the task's difficulty is the band with
the most mass, ties going to the earlier band. Example: 3 of 8 -> Beta(3.5, 5.5), 54.0% in `hard`.
"""
from __future__ import annotations

import numpy as np

BANDS: tuple[tuple[str, float, float], ...] = (
    ("too_hard", 0.00, 0.08),
    ("hard", 0.08, 0.40),
    ("medium", 0.40, 0.60),
    ("easy", 0.60, 0.90),
    ("too_easy", 0.90, 1.00),
)
BAND_NAMES = tuple(b[0] for b in BANDS)
DEFAULT_KEEP = ("hard", "medium", "easy")


def band_masses(k: np.ndarray, n: np.ndarray) -> np.ndarray:
    """Tasks x bands matrix of posterior mass (rows sum to 1)."""
    a = np.asarray(k, dtype=np.float64)[:, None] + 0.5
    b = np.asarray(n, dtype=np.float64)[:, None] - np.asarray(k, dtype=np.float64)[:, None] + 0.5
    from scipy.special import betainc   # here: the band names are read by every CLI start, scipy costs 0.15 s
    edges = np.array([lo for _, lo, _ in BANDS] + [BANDS[-1][2]])
    cdf = betainc(a, b, edges[None, :])
    return np.diff(cdf, axis=1)


def pick(masses: np.ndarray) -> np.ndarray:
    """Band index per row: the largest mass; np.argmax returns the first maximum, so ties go to
    the earlier band."""
    return np.asarray(masses).argmax(axis=1)


def assign(k: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(band index per task, masses)."""
    masses = band_masses(k, n)
    return pick(masses), masses
