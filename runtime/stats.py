"""Goodness-of-fit statistics without SciPy: pooled chi-square test and a TV bound."""
from __future__ import annotations

import math

import numpy as np


def gammaincc(a: float, x: float) -> float:
    """Regularized upper incomplete gamma Q(a, x), by series (x < a + 1) or continued fraction."""
    if x <= 0:
        return 1.0
    log_pre = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - total * math.exp(log_pre))
    # Lentz's continued fraction for Q
    tiny = 1e-300
    b = x + 1 - a
    c, d = 1 / tiny, 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return min(1.0, math.exp(log_pre) * h)


def chi2_sf(statistic: float, dof: int) -> float:
    """P(X >= statistic) for X ~ chi-square(dof)."""
    if dof <= 0:
        return 1.0
    return gammaincc(dof / 2.0, statistic / 2.0)


def pooled_chi_square(counts, probs, min_expected: float = 5.0) -> tuple[float, int, float]:
    """(p-value, cells, TV) of a chi-square goodness-of-fit test on pooled cells.

    Cells with expected count < min_expected are pooled into one; the total
    variation distance is measured on the same pooled cells, so that
    ``tv_sampling_bound(cells, n)`` applies to it. A count in a cell of
    probability 0 is an outright rejection (p = 0).
    """
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    n = counts.sum()
    if n == 0:
        return 1.0, 0, 0.0
    if np.any(counts[probs <= 0] > 0):
        return 0.0, int(probs.size), float(counts[probs <= 0].sum() / n)
    keep = probs > 0
    counts, probs = counts[keep], probs[keep] / probs[keep].sum()
    expected = probs * n
    small = expected < min_expected
    if small.any():
        counts = np.append(counts[~small], counts[small].sum())
        expected = np.append(expected[~small], expected[small].sum())
    tv = float(0.5 * np.abs(counts - expected).sum() / n)
    if counts.size < 2:
        return 1.0, int(counts.size), tv
    stat = float(((counts - expected) ** 2 / expected).sum())
    return chi2_sf(stat, counts.size - 1), int(counts.size), tv


def total_variation(counts, probs) -> float:
    counts = np.asarray(counts, dtype=np.float64).ravel()
    probs = np.asarray(probs, dtype=np.float64).ravel()
    return float(0.5 * np.abs(counts / counts.sum() - probs / probs.sum()).sum())


def tv_sampling_bound(cells: int, samples: int, delta: float = 1e-3) -> float:
    """TV between an empirical and the true distribution stays below this with probability 1 - delta.

    E[TV] <= sqrt(cells / samples) / 2, and TV concentrates within sqrt(ln(1/delta) / (2 samples))
    of its mean (bounded differences).
    """
    return 0.5 * math.sqrt(cells / samples) + math.sqrt(math.log(1 / delta) / (2 * samples))
