"""The fast sampling path (Dist rows, block search, lazy verification) against the plain reference.

The reference is ``ortspec.reference`` (the whole-row pipeline, transformers' order and dtypes); the fast path must give the same support and the same probabilities up to float32 rounding, on peaked and
flat rows, large and small vocabularies. Sampling from dense rows and the dense residual get large-sample
chi-square tests, each with a negative control.
"""
from __future__ import annotations

import numpy as np
import pytest

from ortspec import exactness, verify
from ortspec.config import DENSE_DRAFT_VOCAB, DRAFT_TOP_K, DRAFT_WIDE_TOP_K, SamplingConfig, draft_sampling
from ortspec.sampling.kernels import GROUP, mass_reaching, weights_total
from ortspec.sampling import (Dist, LogitsPipeline, block_sums, draft_pipeline,
                            sample_weights, top_candidates)
from ortspec.reference import distribution
from stats_util import ALPHA, chi_square_p


def reference(cfg: SamplingConfig, row: np.ndarray, context: list[int], vocab: int) -> np.ndarray:
    """The specification of record (``ortspec.reference``) over the vocabulary's columns."""
    return distribution(row[:vocab], context, cfg)


def rows_of(kind: str, vocab: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "peaked":
        rows = rng.standard_normal((n, vocab)) * 2.5
        rows[:, rng.integers(0, vocab, 8)] += 12
    elif kind == "flat":
        rows = rng.standard_normal((n, vocab)) * 0.3
    else:  # ties: few distinct values
        rows = np.round(rng.standard_normal((n, vocab)) * 2) / 2
    return rows.astype(np.float32)


SETTINGS = [
    dict(temperature=0.7),
    dict(top_k=20),
    dict(top_k=50, temperature=1.3),
    dict(top_p=0.9),
    dict(top_p=0.5, temperature=0.8),
    dict(temperature=0.7, top_p=0.8, top_k=20, repetition_penalty=1.05),
    dict(repetition_penalty=0.8, top_p=0.95),
    dict(repetition_penalty=1.3, top_k=2000),
    dict(bad_words_ids=((5,), (7, 9)), top_k=40, temperature=0.9),
]


@pytest.mark.parametrize("vocab", [300, 20_000, 151_936])
@pytest.mark.parametrize("kind", ["peaked", "flat", "ties"])
@pytest.mark.parametrize("settings", SETTINGS, ids=[str(s) for s in SETTINGS])
def test_fast_rows_equal_the_reference(vocab, kind, settings):
    cfg = SamplingConfig(do_sample=True, **settings)
    pipe = LogitsPipeline(cfg, vocab)
    rows = rows_of(kind, vocab + 7, 2)  # wider logits (padding) are cut to the vocabulary
    base = [int(t) for t in np.random.default_rng(1).integers(0, vocab, 300)] + [7]
    for i, row in enumerate(rows):
        new = [9][:i]
        ours = pipe.row(row, base, new).dense(vocab)
        ref = reference(cfg, row, base + new, vocab)
        assert np.array_equal(ours > 0, ref > 0), (np.count_nonzero(ours), np.count_nonzero(ref))
        assert np.allclose(ours, ref, rtol=2e-5, atol=1e-10), np.abs(ours - ref).max()


@pytest.mark.parametrize("top_p", [0.3, 0.9, 0.999])
def test_large_nucleus_cuts_ties_by_id(top_p):
    """A flat row of a few tied levels: the nucleus search's cut falls inside a tie, which keeps the highest ids
    first, as the reference does (transformers' stable ascending sort removes the lower ids of a tie first); a
    uniform row keeps the last ceil(top_p * V) ids (up to rounding of the sum)."""
    vocab = 151_936
    cfg = SamplingConfig(do_sample=True, top_p=top_p)
    pipe = LogitsPipeline(cfg, vocab)
    rng = np.random.default_rng(3)
    levels = rng.integers(0, 3, vocab).astype(np.float32) * np.float32(0.25)
    ours = pipe.row(levels, []).dense(vocab)
    ref = reference(cfg, levels, [], vocab)
    assert np.array_equal(ours > 0, ref > 0) and np.allclose(ours, ref, rtol=2e-5, atol=1e-12)
    uniform = pipe.row(np.zeros(vocab, np.float32), []).dense(vocab)
    kept = np.flatnonzero(uniform)
    assert kept[-1] == vocab - 1 and kept.size == vocab - kept[0]  # a suffix of the ids
    assert abs(kept.size - np.ceil(top_p * vocab)) <= 1


def test_the_two_level_search_finds_the_bucket_a_running_sum_reaches():
    """``mass_reaching`` (group sums, then the running sums inside one group) gives the index and the sum before it
    that one running sum over all the buckets gives: random masses with empty stretches, a single nonzero
    bucket, whole groups read reversed (as the nucleus search reads its buckets: no padded copy), targets of 0,
    inside the total, at the end of a group, and past the total (the last index)."""
    rng = np.random.default_rng(8)
    for trial in range(600):
        n = int(rng.integers(1, 20_000))
        mass = rng.random(n) * (rng.random(n) < rng.random())
        if trial % 10 == 0:
            mass[:] = 0.0
            mass[rng.integers(0, n)] = 1.0
        total = mass.sum()
        upto = np.cumsum(mass)
        edge = float(upto[min(n, GROUP) - 1]) * 0.999999
        if trial % 7 == 0:  # whole groups (no padded copy), read from a reversed view as the nucleus search does
            mass = mass[:max(GROUP, n - n % GROUP)][::-1] if n >= GROUP else mass
            n, total = mass.size, mass.sum()
            upto = np.cumsum(mass)
        edge = float(upto[min(n, GROUP) - 1]) * 0.999999
        for target in (0.0, total * rng.random(), total * 0.9, edge, total * 1.1):
            j = min(int(np.searchsorted(upto, target, side="left")), n - 1)
            got, before = mass_reaching(mass, target)
            assert got == j, (trial, n, target)
            assert abs(before - (float(upto[j - 1]) if j else 0.0)) <= 1e-12 * max(total, 1.0)
    # a group whose sum (pairwise) reaches the target while its running sums (one by one) never do: 1 + 2**-53
    # rounds back to 1 at each step; the answer is then the one running sum's (here: none reaches it)
    mass = np.zeros(2 * GROUP)
    mass[0], mass[1:GROUP] = 1.0, 2.0 ** -53
    target = 1.0 + 1e-14
    assert mass[:GROUP].reshape(1, -1).sum(axis=1)[0] >= target > np.cumsum(mass)[-1]
    assert mass_reaching(mass, target) == (2 * GROUP - 1, 1.0)


@pytest.mark.parametrize("k", [1, 5, 20, 64, 500, 5000])
def test_top_candidates_hold_the_top_k_with_ties(k):
    for kind in ("peaked", "flat", "ties"):
        row = rows_of(kind, 151_936 + 5, 1, seed=k)[0]
        cand = top_candidates(row, k)
        kth = np.sort(row)[-k]
        assert set(np.flatnonzero(row >= kth)) <= set(cand.tolist())
        assert np.all(row[cand] >= row[cand].min()) and cand.size < row.size


def test_sample_weights_is_exact_over_blocks_and_tail():
    rng = np.random.default_rng(0)
    w = np.zeros(1000, dtype=np.float32)  # 7 blocks of 128 rows plus a tail of 104
    hot = [3, 130, 555, 900, 999]
    w[hot] = [0.3, 0.1, 0.25, 0.05, 0.3]
    draws = np.bincount([sample_weights(w, rng.random()) for _ in range(100_000)], minlength=1000)
    assert set(np.flatnonzero(draws)) <= set(hot)
    assert chi_square_p(draws[hot], w[hot] / w.sum()) > ALPHA


def test_draws_over_the_block_sums_a_row_was_made_with_are_the_draws_without_them():
    """A dense row keeps the block sums its total was made from (``Dist.blocks``): a draw that sets no head entry
    aside searches them instead of summing the row again, and a residual draw writes the residual's weights into
    p's row in place (put back after the draw) instead of copying the row. The same token as from the row
    summed whole and from a copy, for every u: rows of the pipeline (flat, peaked, tied; a penalty) and rows
    whose sums are exact (multiples of 2**-10), with and without a head, drafts below p on the heaviest ids and
    above it on light ones; the row is left as it was, bit for bit."""
    vocab = 151_936
    rng = np.random.default_rng(5)
    rows = []
    for kind, settings in (("flat", dict(temperature=0.7)), ("peaked", dict(temperature=1.0)),
                           ("ties", dict(temperature=1.0, repetition_penalty=1.3))):
        pipe = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, **settings), vocab)
        rows.append(pipe.row(rows_of(kind, vocab, 1, seed=11)[0], list(range(0, 3000, 7))))
    exact = rng.integers(0, 64, vocab).astype(np.float32) / np.float32(1024)
    exact[rng.choice(vocab, 12, replace=False)] = np.float32(1.0)
    rows.append(Dist(weights=exact, total=weights_total(exact), blocks=block_sums(exact)))
    for p in rows:
        assert p.blocks is not None and not p.sparse
        kept = p.weights.copy()
        bare = Dist(weights=p.weights, total=p.total)  # the same weights, no block sums: summed whole
        order = np.argsort(-kept, kind="stable")
        heads = (None, [], order[:63].tolist(), rng.choice(vocab, 40, replace=False).tolist())
        drafts = [Dist(tokens=sorted(order[:5].tolist()), plist=[0.2] * 5),  # on the heaviest: most of p
                  Dist(tokens=sorted(rng.choice(order[-3000:], 60, replace=False).tolist()), plist=[1 / 60] * 60),
                  Dist(tokens=sorted(order[-5:].tolist() + [int(order[0])]), plist=[1 / 6] * 6)]
        for u in np.concatenate([rng.random(200), [0.0, 0.5, 1.0 - 2.0 ** -53]]):
            for head in heads:
                p.head, bare.head = head, head
                assert p.draw(u) == bare.draw(u), (u, head)
                for q in drafts:
                    assert verify.residual_draw(p, q, u) == _residual_on_a_copy(bare, q, u), (u, q.tokens[:3])
        assert np.array_equal(p.weights.view(np.uint32), kept.view(np.uint32))  # put back after each draw


def test_residual_draws_over_kept_block_sums_follow_the_residual():
    """A dense row with its block sums (a row as ``LogitsPipeline.row`` makes it, sums that round) and a draft
    below p on some of its ids and above it on others: 100k residual draws follow normalize(max(0, p - q))
    (chi-square), with and without a head; the row is left as it was. Negative control: draws from p itself are
    rejected."""
    vocab = 4096
    pipe = LogitsPipeline(SamplingConfig(do_sample=True, top_k=0, temperature=1.0), vocab)
    p = pipe.row(rows_of("peaked", vocab, 1, seed=21)[0] * np.float32(0.4), [])
    assert p.blocks is not None
    kept = p.weights.copy()
    probs = p.dense(vocab)
    order = np.argsort(-probs, kind="stable")
    ids = np.sort(np.concatenate([order[:6], order[200:230]]))
    q = Dist(tokens=ids.tolist(), plist=(np.ones(ids.size) / ids.size).tolist())
    r = np.maximum(probs - q.dense(vocab), 0.0)
    assert 0.05 < r.sum() < 0.95 and np.any(probs[ids] > q.dense(vocab)[ids])
    support = np.flatnonzero(r > 1e-6)
    u = np.random.default_rng(3).random(100_000)
    for head in (None, order[:63].tolist()):
        p.head = head
        draws = np.bincount([verify.residual_draw(p, q, x) for x in u], minlength=vocab)
        assert draws[r == 0].sum() == 0
        assert chi_square_p(draws[support], r[support] / r[support].sum()) > ALPHA
    assert np.array_equal(p.weights.view(np.uint32), kept.view(np.uint32))
    wrong = np.bincount([p.draw(x) for x in u[:50_000]], minlength=vocab)
    assert chi_square_p(wrong[support], r[support] / r[support].sum()) < ALPHA


def _residual_on_a_copy(target: Dist, draft: Dist, u: float) -> int:
    """The residual draw as the definition reads: p's weights copied, q's ids lowered, summed whole."""
    p_there = target.probs_of(draft.ids)
    overlap = np.minimum(p_there, draft.probs / draft.probs.sum())
    if 1.0 - overlap.sum() <= verify.RESIDUAL_EPS:
        return target.draw(u)
    w = target.weights.copy()
    w[draft.ids] = ((p_there - overlap) * target.total).astype(np.float32)
    return Dist(weights=w, total=float(weights_total(w)), head=target.head_ids()).draw(u)


def _first_token_counts(p: Dist, q: Dist, verifier, n: int, vocab: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(vocab, dtype=np.int64)
    bonus = Dist.one_hot(0)
    for _ in range(n):
        d = q.sample(rng)
        v = verifier([d], [q], lambda i: p if i == 0 else bonus, rng)
        counts[d if v.accepted else v.next_token] += 1
    return counts


@pytest.fixture(scope="module")
def dense_pair():
    """A dense target row (temperature only, vocab 20000) and the draft's capped top-k row of a perturbed one."""
    vocab = 20_000
    target_row = rows_of("peaked", vocab, 1, seed=5)[0]
    draft_row = target_row + np.random.default_rng(6).standard_normal(vocab).astype(np.float32)
    cfg = SamplingConfig(do_sample=True, temperature=1.0)
    p = LogitsPipeline(cfg, vocab).row(target_row, [])
    q = LogitsPipeline(draft_sampling(cfg), vocab).row(draft_row, [])
    assert not p.sparse and q.sparse and q.ids.size == DRAFT_WIDE_TOP_K  # (no top-p: the wide draft)
    return p, q, vocab


def test_the_draft_reads_wider_where_the_target_has_no_top_p():
    """The draft's top-k: the target's where it is smaller, else DRAFT_TOP_K under a top-p nucleus and
    DRAFT_WIDE_TOP_K without one (p then reaches past any draft's top 64), and none (a dense q) where the target
    keeps its whole vocabulary under a repetition penalty (DRAFT_WIDE_TOP_K again on a vocabulary above
    DENSE_DRAFT_VOCAB); the other settings pass through."""
    def cap(**kw):
        return draft_sampling(SamplingConfig(do_sample=True, **kw)).top_k
    assert DRAFT_TOP_K < DRAFT_WIDE_TOP_K
    assert cap() == cap(top_k=0) == cap(top_k=100_000) == DRAFT_WIDE_TOP_K
    assert cap(top_k=100) == 100 and cap(top_k=20) == 20 and cap(top_k=20, top_p=0.8) == 20
    assert cap(top_p=0.9) == cap(top_k=100, top_p=0.9) == cap(top_p=0.9, repetition_penalty=1.1) == DRAFT_TOP_K
    assert cap(repetition_penalty=1.1) == cap(repetition_penalty=0.9, temperature=0.7) == 0
    assert cap(repetition_penalty=1.1, top_k=100) == 100
    # the untruncated q only on vocabularies where a whole row is cheap; above that the wide top-k
    penalized = SamplingConfig(do_sample=True, repetition_penalty=1.1)
    assert draft_sampling(penalized, vocab_size=49_152).top_k == draft_sampling(penalized, vocab_size=16).top_k == 0
    assert draft_sampling(penalized, vocab_size=DENSE_DRAFT_VOCAB).top_k == 0
    assert draft_sampling(penalized, vocab_size=151_936).top_k == DRAFT_WIDE_TOP_K
    assert draft_pipeline(penalized, 151_936).config.top_k == DRAFT_WIDE_TOP_K
    assert draft_pipeline(penalized, 49_152).config.top_k == 0
    assert draft_sampling(SamplingConfig(do_sample=True, top_p=0.9), vocab_size=151_936).top_k == DRAFT_TOP_K
    for policy in ("match", "temperature"):
        d = draft_sampling(SamplingConfig(do_sample=True, temperature=0.7, top_p=0.9, repetition_penalty=1.05),
                           policy)
        assert (d.top_k, d.temperature, d.repetition_penalty) == (DRAFT_TOP_K, 0.7, 1.05)
        assert d.top_p == (0.9 if policy == "match" else 1.0)
        assert draft_sampling(SamplingConfig(do_sample=True, repetition_penalty=1.1), policy).top_k == 0


def test_dense_target_sparse_draft_commits_the_target_distribution(dense_pair):
    p, q, vocab = dense_pair
    counts = _first_token_counts(p, q, verify.verify_dists, 60_000, vocab)
    exact = p.dense(vocab)
    assert 0.05 < 1 - p.min_mass(q) < 0.95  # the residual carries real mass, much of it outside q's support
    assert chi_square_p(counts, exact) > ALPHA


def test_dense_negative_control_is_caught(dense_pair):
    p, q, vocab = dense_pair
    counts = _first_token_counts(p, q, exactness.wrong_verify, 60_000, vocab)
    assert chi_square_p(counts, p.dense(vocab)) < ALPHA


def test_a_truncated_draft_still_commits_the_target_distribution():
    """The verifier sees the q a draft token was drawn from, truncated or not: the first committed token is
    distributed as p (and a dense p's residual reaches the tokens q left out)."""
    vocab = 20_000
    cfg = SamplingConfig(do_sample=True, temperature=1.0, top_k=0)
    target_row = rows_of("peaked", vocab, 1, seed=5)[0]
    draft_row = target_row + np.random.default_rng(9).standard_normal(vocab).astype(np.float32)
    p = LogitsPipeline(cfg, vocab).row(target_row, [])
    q = draft_pipeline(cfg, vocab).row(draft_row, [])
    assert q.small and len(q.tokens) <= DRAFT_WIDE_TOP_K  # (the wide draft's cap: the target has no top-p)
    counts = _first_token_counts(p, q, verify.verify_dists, 60_000, vocab, seed=3)
    assert chi_square_p(counts, p.dense(vocab)) > ALPHA
    wrong = _first_token_counts(p, q, exactness.wrong_verify, 60_000, vocab, seed=3)  # negative control
    assert chi_square_p(wrong, p.dense(vocab)) < ALPHA


def test_lazy_verification_computes_rows_only_up_to_the_rejection():
    asked = []
    p_rows = [Dist.one_hot(1), Dist.one_hot(2), Dist.one_hot(3), Dist.one_hot(4)]

    def target(i):
        asked.append(i)
        return p_rows[i]
    v = verify.verify_dists([1, 9, 3], [Dist.one_hot(1), Dist.one_hot(9), Dist.one_hot(3)], target,
                            np.random.default_rng(0))
    assert (v.accepted, v.next_token) == (1, 2) and asked == [0, 1]
