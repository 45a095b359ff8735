"""Verification of a drafted block: pure NumPy, no I/O, RNG passed in.

Sampling (Leviathan et al. / Chen et al.): accept d_i with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection sample from
normalize(max(0, p_j - q_j)); if every draft passes, sample a bonus token from
p_{gamma+1}. The committed tokens are then distributed exactly as target-only
sampling. Greedy: accept d_i iff it is the target's argmax.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .sampling import RESIDUAL_EPS, Dist, TargetDist, acceptance_probability, residual, residual_draw

__all__ = ["RESIDUAL_EPS", "Dist", "Verdict", "Uniforms", "acceptance_probability", "residual", "residual_draw",
           "sample", "sampled_verify", "verify_dists", "greedy_verify"]


class Uniforms:
    """A seeded NumPy generator's uniform numbers, drawn from it in blocks: ``random()`` returns the very numbers,
    in the same order, that the generator's own ``random()`` calls would (a block of doubles is the same stream as
    as many single draws), without a NumPy call each time — right after a model pass one costs tens of
    microseconds. Other Generator methods (a custom drafter's) are the generator's own, drawing from its state
    after the numbers already taken into the block."""

    BLOCK = 256

    def __init__(self, rng: np.random.Generator):
        self.rng = rng
        self._block: list[float] = []
        self._next = 0

    def random(self, size=None):
        if size is not None:
            return np.array([self.random() for _ in range(int(np.prod(size)))]).reshape(size)
        if self._next == len(self._block):
            self._block, self._next = self.rng.random(self.BLOCK).tolist(), 0
        self._next += 1
        return self._block[self._next - 1]

    def __getattr__(self, name):
        return getattr(self.rng, name)


@dataclass(frozen=True)
class Verdict:
    """Outcome of one round: how many drafts passed and the token that follows."""

    accepted: int
    next_token: int
    bonus: bool  # True when every draft passed and next_token came from p_{gamma+1}


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability vector (need not be exactly normalized)."""
    cdf = np.cumsum(probs)
    idx = int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"))
    return min(idx, probs.shape[0] - 1)


def sampled_verify(draft_tokens: Sequence[int], draft_probs: np.ndarray,
                   target_probs: np.ndarray, rng: np.random.Generator) -> Verdict:
    """Verify ``gamma`` drafted tokens against ``gamma + 1`` target distributions (dense arrays).

    draft_probs[i] is the distribution d_i was sampled from; target_probs[i] is
    the target's distribution at the same position (conditioned on d_1..d_i-1).
    Both have the same width; ids a model cannot produce carry probability 0.
    """
    gamma = len(draft_tokens)
    if target_probs.shape[0] != gamma + 1 or draft_probs.shape[0] != gamma:
        raise ValueError(f"need {gamma} draft rows and {gamma + 1} target rows, got "
                         f"{draft_probs.shape[0]} and {target_probs.shape[0]}")
    return verify_dists(draft_tokens, [Dist.from_probs(q) for q in draft_probs],
                        lambda i: Dist.from_probs(target_probs[i]), rng)


def verify_dists(draft_tokens: Sequence[int], draft_dists: Sequence[Dist],
                 target_dist: Callable[[int], TargetDist], rng: np.random.Generator,
                 min_mass: list | None = None) -> Verdict:
    """The same rules over ``Dist`` rows; ``target_dist(i)`` is asked for row i only when the verdict needs it
    (rows after the first rejection are never computed); it may return a row that settles a draft's acceptance
    without its whole distribution (a ``TargetDist`` such as ``LazyRow``: ``accepts`` gives the verdict the
    whole distribution would, ``dist()`` computes it when a draw needs it). With ``min_mass``, sum_x min(p_i, q_i)
    of every verified position is appended to it (the acceptance probability there, for statistics)."""
    gamma = len(draft_tokens)
    for i, tok in enumerate(draft_tokens):
        target, draft = target_dist(i), draft_dists[i]
        if min_mass is not None:
            min_mass.append(target.min_mass(draft))
        if not target.accepts(tok, draft.prob(tok), rng.random()):
            return Verdict(i, target.residual(draft, rng.random(), rng.random), False)
    return Verdict(gamma, target_dist(gamma).draw(rng.random(), rng.random), True)


def greedy_verify(draft_tokens: Sequence[int], target_choices: Sequence[int]) -> Verdict:
    """Accept the longest prefix of drafts equal to the target's greedy choices."""
    gamma = len(draft_tokens)
    for i, tok in enumerate(draft_tokens):
        if int(tok) != int(target_choices[i]):
            return Verdict(i, int(target_choices[i]), False)
    return Verdict(gamma, int(target_choices[gamma]), True)
