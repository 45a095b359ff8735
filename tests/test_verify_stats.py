"""Single-position statistics: the committed token is distributed as p, for any q.

200k seeded draws per (p, q) pair; chi-square at alpha = 0.001. The negative
control runs the same test on a verifier that resamples from p instead of the
residual and must reject.
"""
import numpy as np
import pytest

from ortspec import exactness, verify
from ortspec.sampling import Dist
from stats_util import ALPHA, chi_square_p


def wrong_verify(draft_tokens, draft_probs, target_probs, rng, small=None):
    """The classic bug (resample from p, not max(0, p - q)) on dense arrays, for the negative control."""
    return exactness.wrong_verify(draft_tokens, [Dist.from_probs(q, small) for q in draft_probs],
                                  lambda i: Dist.from_probs(target_probs[i], small), rng)


def sampled_verify(draft_tokens, draft_probs, target_probs, rng, small=None):
    """verify.sampled_verify over Dists of either form: small (Python lists, what top-k rows are) or arrays."""
    return verify.verify_dists(draft_tokens, [Dist.from_probs(q, small) for q in draft_probs],
                               lambda i: Dist.from_probs(target_probs[i], small), rng)

N = 200_000

PAIRS = {
    "overlapping": (np.array([0.1, 0.4, 0.3, 0.2, 0.0]), np.array([0.3, 0.3, 0.1, 0.1, 0.2])),
    "disjoint": (np.array([0.6, 0.4, 0.0, 0.0, 0.0]), np.array([0.0, 0.0, 0.5, 0.3, 0.2])),
    "draft_top_k": (np.array([0.35, 0.25, 0.2, 0.15, 0.05]), np.array([0.55, 0.45, 0.0, 0.0, 0.0])),
    "sharp_vs_flat": (np.array([0.9, 0.05, 0.03, 0.02, 0.0]), np.full(5, 0.2)),
}


def run(verifier, p, q, seed=0, **kw):
    rng = np.random.default_rng(seed)
    target = np.stack([p, np.full_like(p, 1 / p.size)])
    counts = np.zeros(p.size, dtype=np.int64)
    accepted = 0
    for _ in range(N):
        d = verify.sample(q, rng)
        v = verifier([d], q[None], target, rng, **kw)
        first = d if v.accepted else v.next_token
        counts[first] += 1
        accepted += v.accepted
    return counts, accepted / N


@pytest.mark.parametrize("small", [True, False], ids=["lists", "arrays"])
@pytest.mark.parametrize("name", list(PAIRS))
def test_first_token_distributed_as_target(name, small):
    p, q = PAIRS[name]
    counts, rate = run(sampled_verify, p, q, small=small)
    assert chi_square_p(counts, p) > ALPHA, counts
    expected_rate = np.minimum(p, q).sum()
    sigma = np.sqrt(expected_rate * (1 - expected_rate) / N)
    assert abs(rate - expected_rate) <= 4.5 * sigma + 1e-12


@pytest.mark.parametrize("small", [True, False], ids=["lists", "arrays"])
@pytest.mark.parametrize("name", ["overlapping", "draft_top_k", "sharp_vs_flat"])
def test_negative_control_rejects_resampling_from_p(name, small):
    p, q = PAIRS[name]
    counts, _ = run(wrong_verify, p, q, small=small)
    assert chi_square_p(counts, p) < ALPHA
