"""Exact cases of the verification rules, from one-hot and hand-built distributions."""
import numpy as np
import pytest

from ortspec.verify import Uniforms, acceptance_probability, greedy_verify, residual, sample, sampled_verify


class FixedRng:
    """Stands in for np.random.Generator: random() returns the given values in order."""

    def __init__(self, *values):
        self.values = list(values)

    def random(self):
        return self.values.pop(0)


def onehot(i, n=5):
    v = np.zeros(n)
    v[i] = 1.0
    return v


def test_accept_all_then_bonus():
    drafts = [1, 3]
    q = np.stack([onehot(1), onehot(3)])
    p = np.stack([onehot(1), onehot(3), onehot(4)])
    v = sampled_verify(drafts, q, p, np.random.default_rng(0))
    assert (v.accepted, v.next_token, v.bonus) == (2, 4, True)


def test_reject_first_samples_residual():
    q = np.stack([onehot(1), onehot(2)])
    p = np.stack([onehot(0), onehot(2), onehot(4)])
    v = sampled_verify([1, 2], q, p, np.random.default_rng(0))
    # p(1) = 0: rejected at once; residual max(0, p - q) = one-hot(0); d2 discarded
    assert (v.accepted, v.next_token, v.bonus) == (0, 0, False)


def test_reject_second_keeps_first():
    q = np.stack([onehot(1), onehot(2)])
    p = np.stack([onehot(1), onehot(3), onehot(4)])
    v = sampled_verify([1, 2], q, p, np.random.default_rng(0))
    assert (v.accepted, v.next_token) == (1, 3)


def test_partial_acceptance_uses_ratio():
    q = np.array([[0.0, 0.8, 0.2, 0.0, 0.0]])
    p = np.array([[0.0, 0.4, 0.2, 0.4, 0.0], onehot(4)])
    # accept probability p/q = 0.5: u = 0.49 accepts, u = 0.51 rejects
    assert sampled_verify([1], q, p, FixedRng(0.49, 0.0)).accepted == 1
    v = sampled_verify([1], q, p, FixedRng(0.51, 0.7))
    # residual max(0, p - q) = [0, 0, 0, 0.4, 0] -> token 3 whatever u is
    assert (v.accepted, v.next_token) == (0, 3)


def test_draft_token_with_zero_q_is_rejected_without_nan():
    q = np.array([[0.0, 1.0, 0.0, 0.0, 0.0]])
    p = np.array([[0.2, 0.2, 0.2, 0.2, 0.2], onehot(4)])
    with np.errstate(all="raise"):
        assert acceptance_probability(0.2, 0.0) == 0.0
        v = sampled_verify([0], q, p, FixedRng(0.0, 0.0))
    assert v.accepted == 0


def test_residual_sum_zero_falls_back_to_p():
    p = np.array([0.5, 0.5, 0.0])
    with np.errstate(all="raise"):
        r = residual(p, p.copy())
    assert np.array_equal(r, p)
    assert np.isfinite(residual(p, p + 1e-17)).all()


def test_mass_outside_draft_support_reaches_residual():
    # q is a top-2 truncation: token 2 has p = 0.2 but q = 0
    p = np.array([0.5, 0.3, 0.2])
    q = np.array([0.6, 0.4, 0.0])
    r = residual(p, q)
    assert np.allclose(r, [0.0, 0.0, 1.0])
    v = sampled_verify([0], q[None], np.stack([p, p]), FixedRng(0.99, 0.5))
    assert (v.accepted, v.next_token) == (0, 2)


def test_acceptance_probability_is_min_one_ratio():
    assert acceptance_probability(0.9, 0.3) == 1.0
    assert acceptance_probability(0.3, 0.9) == pytest.approx(1 / 3)
    assert acceptance_probability(0.0, 0.9) == 0.0


def test_sample_never_returns_zero_probability_ids():
    probs = np.array([0.0, 0.25, 0.0, 0.75, 0.0])
    rng = np.random.default_rng(1)
    draws = {sample(probs, rng) for _ in range(2000)}
    assert draws == {1, 3}


def test_shapes_are_checked():
    with pytest.raises(ValueError, match="rows"):
        sampled_verify([1, 2], np.zeros((2, 5)), np.zeros((2, 5)), np.random.default_rng(0))


def test_greedy_verify():
    assert greedy_verify([4, 2, 7], [4, 2, 7, 9]) == greedy_verify([4, 2, 7], [4, 2, 7, 9])
    v = greedy_verify([4, 2, 7], [4, 2, 7, 9])
    assert (v.accepted, v.next_token, v.bonus) == (3, 9, True)
    v = greedy_verify([4, 2, 7], [4, 5, 7, 9])
    assert (v.accepted, v.next_token, v.bonus) == (1, 5, False)
    v = greedy_verify([], [6])
    assert (v.accepted, v.next_token, v.bonus) == (0, 6, True)


@pytest.mark.parametrize("seed", [0, 1, 2**40 + 3])
def test_uniforms_are_the_generators_own_numbers(seed):
    """The decode loop's uniform numbers come in blocks: the same numbers, in the same order, as the generator's
    own one-at-a-time draws (across several blocks, and where a caller asks for an array)."""
    plain, blocked = np.random.default_rng(seed), Uniforms(np.random.default_rng(seed))
    n = 3 * Uniforms.BLOCK + 7
    assert [blocked.random() for _ in range(n)] == [plain.random() for _ in range(n)]
    assert np.array_equal(blocked.random((2, 3)), np.array([plain.random() for _ in range(6)]).reshape(2, 3))
    assert blocked.random() == plain.random()
    assert 0 <= blocked.integers(0, 10) < 10  # other methods: the generator's own
