"""Whole-sequence statistics on a vocab-16 pair: speculative output ~ exact target-only distribution.

Every continuation of 3 tokens gets its exact target-only probability from
the target graph; 12,000 seeded speculative generations per setting (each run
for gamma + 1 tokens, so that full rounds of gamma drafts happen) are compared
with it by a pooled chi-square test at alpha = 0.001. The negative control
injects a verifier that resamples from p instead of the residual.
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from ortspec import SpeculativeGenerator
from ortspec.config import SamplingConfig
from ortspec.sampling import LogitsPipeline
from stats_util import ALPHA, chi_square_p, sample_prefixes, worker_pool

V, K, N = 16, 3, 12_000
PROMPT = [1, 5, 9, 5]
WORKERS = 2

SETTINGS = [
    ("model", 1, dict(temperature=0.7)),
    ("model", 3, dict(top_k=5)),
    ("model", 5, dict(top_p=0.8, temperature=1.2)),
    ("model", 3, dict(repetition_penalty=1.5, top_k=8)),
    ("model", "auto", dict(temperature=0.9, top_k=10)),
    ("model", 3, dict(temperature=1.1, logit_bias={3: 1.5, 5: -2.0, 9: 0.75})),  # rows read whole
]


@pytest.fixture(scope="module")
def pool():
    with worker_pool(WORKERS) as ex:
        yield ex


def exact_distribution(bundle, sampling: dict, prompt: list[int] = PROMPT) -> np.ndarray:
    """P(x1, x2, x3 | prompt) under target-only sampling, shape [V, V, V], from the target graph."""
    gen = SpeculativeGenerator.load(bundle, drafter="none", threads=1)
    pipe = LogitsPipeline(SamplingConfig(do_sample=True, **sampling), gen.vocab_size)
    probs = np.zeros((V, V, V))
    for x1, x2 in itertools.product(range(V), range(V)):
        rows = gen.target.reference_logits(prompt + [x1, x2])[-3:]
        p = pipe.probs(rows, prompt, [x1, x2])
        probs[x1, x2] = p[0, x1] * p[1, x2] * p[2]
    return probs


def sample_counts(pool, bundle, drafter, gamma, sampling, wrong=False, prompt=PROMPT, max_new=None, n=N):
    chunks = np.array_split(np.arange(n), WORKERS * 4)
    max_new = max_new or (K + 3 if gamma == "auto" else max(K, gamma + 1))
    jobs = [dict(bundle=str(bundle), drafter=drafter, k=K, prompt=prompt, max_new_tokens=max_new,
                 gamma=gamma, sampling=sampling, seeds=[int(s) for s in c], wrong=wrong) for c in chunks]
    counts, drafted, accepted = np.zeros((V,) * K, dtype=np.int64), 0, 0
    for c, d, a in pool.map(sample_prefixes, jobs):
        counts += c
        drafted += d
        accepted += a
    return counts, drafted, accepted


@pytest.mark.parametrize("drafter,gamma,sampling", SETTINGS,
                         ids=[f"{d}-g{g}-{'-'.join(f'{k}{v}' for k, v in s.items())}" for d, g, s in SETTINGS])
def test_sequences_follow_target_distribution(pool, small_bundle, drafter, gamma, sampling):
    counts, drafted, accepted = sample_counts(pool, small_bundle, drafter, gamma, sampling)
    assert counts.sum() == N
    assert accepted >= 500 and drafted - accepted >= 500, "the test needs many accepts and many rejects"
    p = chi_square_p(counts, exact_distribution(small_bundle, sampling))
    assert p > ALPHA, f"p-value {p:.2e}"


@pytest.mark.parametrize("drafter,gamma,sampling", [SETTINGS[0]], ids=["model"])
def test_negative_control_wrong_verifier_is_caught(pool, small_bundle, drafter, gamma, sampling):
    counts, _, _ = sample_counts(pool, small_bundle, drafter, gamma, sampling, wrong=True)
    assert chi_square_p(counts, exact_distribution(small_bundle, sampling)) < ALPHA


# A prompt that repeats itself, so that lookups match (its tail 5 9 5 occurred before): the hybrid drafter
# then switches between lookups and the model, and prompt lookup at gamma 1 proposes 2 tokens after a round
# whose proposal was accepted whole (a copy run), all within the 3 tokens counted. Temperature 2 flattens p,
# so lookup guesses get intermediate p(d).
REPEATING = [1, 5, 9, 5, 9, 5]
LOOKUP_SETTINGS = [("hybrid", 3, dict(temperature=1.2, top_k=8)), ("prompt_lookup", 1, dict(temperature=2.0))]


@pytest.mark.parametrize("drafter,gamma,sampling", LOOKUP_SETTINGS, ids=["hybrid", "lookup-copy-run"])
def test_lookup_driven_sequences_follow_target_distribution(pool, small_bundle, drafter, gamma, sampling):
    counts, drafted, accepted = sample_counts(pool, small_bundle, drafter, gamma, sampling, prompt=REPEATING,
                                              max_new=5)  # room for proposals longer than gamma
    assert accepted >= 500 and drafted - accepted >= 500
    exact = exact_distribution(small_bundle, sampling, REPEATING)
    assert chi_square_p(counts, exact) > ALPHA
    wrong, _, _ = sample_counts(pool, small_bundle, drafter, gamma, sampling, wrong=True, prompt=REPEATING,
                                max_new=5, n=N // 2)  # negative control
    assert chi_square_p(wrong, exact) < ALPHA


def test_vocab_subset_draft_follows_target_distribution(pool, small_subset_bundle):
    """q = 0 on ids 10..15: those tokens can only come from the residual, which must restore p exactly."""
    sampling = dict(temperature=1.3)
    counts, drafted, accepted = sample_counts(pool, small_subset_bundle, "model", 3, sampling)
    assert accepted >= 500 and drafted - accepted >= 500
    exact = exact_distribution(small_subset_bundle, sampling)
    assert exact[10:].sum() > 0.05  # the excluded ids carry real mass under the target
    assert chi_square_p(counts, exact) > ALPHA
    wrong, _, _ = sample_counts(pool, small_subset_bundle, "model", 3, sampling, wrong=True)
    assert chi_square_p(wrong, exact) < ALPHA


def test_self_draft_reading_the_targets_cache_follows_target_distribution(pool, small_self_bundle):
    """The first token is the target's, then every draft runs over keys and values the target computed
    (adopted, not fed): the counted tokens 2 and 3 come from such rounds."""
    prompt = [1, 5, 9, 5, 3, 12, 7, 7]
    gen = SpeculativeGenerator.load(small_self_bundle)
    assert gen.drafter.source is gen.target
    sampling = dict(temperature=1.3)
    counts, drafted, accepted = sample_counts(pool, small_self_bundle, "model", 2, sampling, prompt=prompt)
    assert accepted >= 500 and drafted - accepted >= 500
    exact = exact_distribution(small_self_bundle, sampling, prompt)
    assert chi_square_p(counts, exact) > ALPHA
    wrong, _, _ = sample_counts(pool, small_self_bundle, "model", 2, sampling, wrong=True, prompt=prompt, n=N // 2)
    assert chi_square_p(wrong, exact) < ALPHA  # negative control
