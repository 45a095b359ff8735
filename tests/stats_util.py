"""Goodness-of-fit helpers for the statistical tests."""
from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 0.001


def chi_square_p(counts: np.ndarray, probs: np.ndarray, min_expected: float = 5.0) -> float:
    """Chi-square goodness-of-fit p-value; cells with small expected counts are pooled.

    Any count in a cell of probability exactly 0 is an outright failure (p = 0).
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    if np.any(counts[probs <= 0] > 0):
        return 0.0
    keep = probs > 0
    counts, probs = counts[keep], probs[keep] / probs[keep].sum()
    expected = probs * n
    small = expected < min_expected
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
        if expected[-1] == 0:
            counts, expected = counts[:-1], expected[:-1]
    if counts.size < 2:
        return 1.0
    return float(stats.chisquare(counts, expected).pvalue)
