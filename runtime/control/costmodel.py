"""Cost model of speculative decoding: pure functions.

A round drafts gamma tokens (cost gamma * C_d) and runs the target once over
gamma + 1 positions (cost C_t(gamma + 1)). With alpha_i the probability that
draft i is accepted given drafts 1..i-1 were, the round commits in expectation

    E[tokens](gamma) = 1 + sum_{i=1..gamma} prod_{j<=i} alpha_j

tokens, so the predicted speedup over target-only decoding (one token per
C_t(1)) is

    S(gamma) = E[tokens](gamma) * C_t(1) / (gamma * C_d + C_t(gamma + 1)).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np


def expected_tokens(alphas: Sequence[float], gamma: int) -> float:
    """Expected tokens committed by one round of ``gamma`` drafts."""
    if gamma < 0:
        raise ValueError("gamma must be >= 0")
    a = np.clip(np.asarray(list(alphas)[:gamma], dtype=np.float64), 0.0, 1.0)
    if a.size < gamma:  # positions never measured: assume the last known rate
        fill = a[-1] if a.size else 0.0
        a = np.concatenate([a, np.full(gamma - a.size, fill)])
    return float(1.0 + np.cumprod(a).sum())


def target_cost(costs: Sequence[float], k: int) -> float:
    """C_t(k) from a table costs[k-1]; beyond it, on from the last entry at the least-squares slope of the sizes
    from 2 up (of both entries, in a table of two). Long copies (passes of up to 61 positions) read it far past
    a table of 9, where a slope from the last two entries alone, each timed a few times, was off by 2x."""
    if k < 1:
        raise ValueError("k must be >= 1")
    if k <= len(costs):
        return float(costs[k - 1])
    if len(costs) == 1:
        return float(costs[0])
    xs = np.arange(2 if len(costs) > 2 else 1, len(costs) + 1, dtype=np.float64)
    ys = np.asarray(costs[int(xs[0]) - 1:], dtype=np.float64)
    slope = max(0.0, float(np.polyfit(xs, ys, 1)[0]))
    return float(costs[-1] + slope * (k - len(costs)))


def predicted_speedup(alphas: Sequence[float], gamma: int, draft_cost: float,
                      target_costs: Sequence[float]) -> float:
    """S(gamma): expected tokens per unit time relative to target-only decoding."""
    if gamma == 0:
        return 1.0
    cost = gamma * draft_cost + target_cost(target_costs, gamma + 1)
    return expected_tokens(alphas, gamma) * target_cost(target_costs, 1) / cost


def best_gamma(alphas: Sequence[float], draft_cost: float, target_costs: Sequence[float],
               max_gamma: int) -> tuple[int, float]:
    """The gamma in 0..max_gamma with the highest predicted speedup (0 = no drafting)."""
    best = (0, 1.0)
    for g in range(1, max_gamma + 1):
        s = predicted_speedup(alphas, g, draft_cost, target_costs)
        if s > best[1]:
            best = (g, s)
    return best
