"""The reference (ortspec.reference) against transformers' own processors and warpers, bit for bit."""
from __future__ import annotations

import numpy as np
import pytest

from ortspec.config import SamplingConfig
from ortspec.reference import processed_scores, top_p_keep, warped_scores

torch = pytest.importorskip("torch")
lp = pytest.importorskip("transformers.generation.logits_process")

EOS = 2


def _row(rng, width, kind):
    """Random float32 logits: normal, fp16-rounded (many ties), or on a coarse grid (ties everywhere)."""
    x = rng.standard_normal(width).astype(np.float32) * np.float32(rng.uniform(0.5, 6))
    if kind == "fp16":
        x = x.astype(np.float16).astype(np.float32)
    elif kind == "grid":
        x = np.round(x * 2) / np.float32(2)
    x[rng.integers(0, width, 3)] = x.max()  # ties at the maximum
    return x


def _words(rng, width, context):
    """Bad words of every length: single tokens (EOS among them), words ending the context (longer than 17
    tokens too), duplicates, and words that do not match."""
    words = [(EOS,), (int(rng.integers(3, width)),)]
    for n in (2, 3, 19, 25):
        if len(context) >= n - 1:
            words.append(tuple(context[len(context) - n + 1:]) + (int(rng.integers(0, width)),))
    words.append(words[-1])  # the same word twice
    words.append(tuple(int(t) for t in rng.integers(0, width, 3)))
    return tuple(words)


def _transformers(config, context, row, eos=EOS, warp=True):
    procs = []
    if config.repetition_penalty != 1.0:
        procs.append(lp.RepetitionPenaltyLogitsProcessor(config.repetition_penalty))
    if config.bad_words_ids:
        procs.append(lp.NoBadWordsLogitsProcessor([list(w) for w in config.bad_words_ids], eos_token_id=eos))
    if warp:
        if config.temperature != 1.0:
            procs.append(lp.TemperatureLogitsWarper(config.temperature))
        if config.top_k:
            procs.append(lp.TopKLogitsWarper(config.top_k))
    ids = torch.tensor([context], dtype=torch.long)
    scores = torch.from_numpy(row.copy())[None]
    for p in procs:
        scores = p(ids, scores)
    return scores[0].numpy()


CASES = [(width, kind, seed) for width in (17, 300, 4099, 50_001) for kind in ("normal", "fp16", "grid")
         for seed in range(3)]


@pytest.mark.parametrize("width,kind,seed", CASES)
def test_processed_and_warped_scores_equal_transformers_bit_for_bit(width, kind, seed):
    rng = np.random.default_rng([width, seed, len(kind)])
    row = _row(rng, width, kind)
    context = [int(t) for t in rng.integers(0, width, int(rng.integers(1, 40)))]
    for theta in (1.0, 0.7, 1.05, 1.3):
        for words in ((), _words(rng, width, context)):
            for t, k in ((1.0, 0), (0.7, 20), (1.5, 300), (0.05, 1)):
                cfg = SamplingConfig(True, t, k, 1.0, theta, words)
                ours = processed_scores(row, context, cfg, (EOS,))
                theirs = _transformers(cfg, context, row, warp=False)
                assert np.array_equal(ours, theirs), (theta, words)
                ours = warped_scores(row, context, cfg, (EOS,))
                theirs = _transformers(cfg, context, row)
                assert np.array_equal(ours, theirs), (theta, words, t, k)


def _unsettled(scores, top_p, kept_ours, kept_theirs, ties=True):
    """Whether transformers' own result is unsettled at every token the two rules disagree on: the token ties
    another one's score (torch.sort, not asked to be stable, orders ties as it likes: seen on 17-entry rows), or
    its cumulative probability is within float32 rounding of the threshold (transformers sums float32
    probabilities: n terms within n * 2**-24 of the exact sum)."""
    x = scores.astype(np.float64)
    p = np.exp(x - x.max())
    p /= p.sum()
    ids = np.arange(scores.size)
    order = np.lexsort((ids, x))  # ascending, lower id first: transformers' order
    cum = np.cumsum(p[order])
    where = {int(t): c for t, c in zip(order, cum)}
    bound = 4 * scores.size * 2.0 ** -24
    tied = {float(v) for v, n in zip(*np.unique(scores, return_counts=True)) if n > 1} if ties else set()
    return all(float(scores[t]) in tied or abs(where[int(t)] - (1 - top_p)) < bound
               for t in np.flatnonzero(kept_ours != kept_theirs))


@pytest.mark.parametrize("width,kind,seed", CASES)
def test_top_p_keeps_what_transformers_keeps(width, kind, seed):
    rng = np.random.default_rng([width, seed, len(kind), 1])
    differ = 0
    for _ in range(6):
        scores = _row(rng, width, kind) / np.float32(rng.uniform(0.3, 2.0))
        for top_p in (0.1, 0.5, 0.8, 0.95, 0.999):
            ours = top_p_keep(scores, top_p)
            out = lp.TopPLogitsWarper(top_p)(None, torch.from_numpy(scores.copy())[None])[0].numpy()
            theirs = np.isfinite(out)
            if not np.array_equal(ours, theirs):
                assert _unsettled(scores, top_p, ours, theirs)
                differ += np.unique(scores).size == scores.size  # no tie in the row: float32 rounding decided
    assert differ <= 1  # ... which is rare


def test_top_p_ties_at_the_cut_keep_the_higher_ids():
    """Exact ties straddling the cut: ortspec's rule is transformers' with a stable sort (ascending, so the
    lower ids of a tie are removed first)."""
    rng = np.random.default_rng(5)
    for width in (6, 17, 300, 100_000):
        scores = np.round(rng.standard_normal(width).astype(np.float32) * 4) / np.float32(4)
        for top_p in (0.1, 0.5, 0.75, 0.9):
            t = torch.from_numpy(scores.copy())
            ascending, index = torch.sort(t, stable=True)
            cum = ascending.softmax(-1).cumsum(-1)
            drop = cum <= 1 - top_p
            drop[-1] = False
            stable = np.ones(width, dtype=bool)
            stable[index[drop].numpy()] = False
            ours = top_p_keep(scores, top_p)
            assert np.array_equal(ours, stable) or _unsettled(scores, top_p, ours, stable, ties=False), (width, top_p)
    scores = np.array([3.0, 1.0, 1.0, 1.0, 0.0, 1.0], dtype=np.float32)
    assert top_p_keep(scores, 0.75).tolist() == [True, False, False, True, False, True]


def test_greedy_with_a_penalty_is_decided_in_float32():
    """6.459722 / 1.1 rounds to 5.8724747 in float32: a tie that the lower id wins (in float64 it loses)."""
    row = np.array([6.459722, 5.8724747, -3.3], dtype=np.float32)
    cfg = SamplingConfig(repetition_penalty=1.1)
    ours = processed_scores(row, [0], cfg)
    assert ours[0] == ours[1] and int(np.argmax(ours)) == 0
    assert np.array_equal(ours, _transformers(cfg, [0], row, warp=False))


def test_an_eos_word_alone_is_not_banned_but_inside_a_longer_word_is():
    row = np.zeros(8, dtype=np.float32)
    cfg = SamplingConfig(bad_words_ids=((EOS,), (5, EOS)))
    assert np.isfinite(processed_scores(row, [1], cfg, (EOS,))[EOS])
    assert processed_scores(row, [1, 5], cfg, (EOS,))[EOS] == -np.inf
    assert processed_scores(row, [1], cfg)[EOS] == -np.inf  # no EOS given: banned as any word


def test_decoding_vocabulary_cuts_only_padding():
    """Ids past a narrower draft's width are cut (probability 0 for every drafter) only when no token has them;
    a draft narrower than the tokenizer's ids is refused for drafting, and the target alone keeps its width."""
    from types import SimpleNamespace as NS
    from ortspec.errors import IncompatibleModelsError
    from ortspec.generator import decoding_vocab
    bundle = NS(target=NS(output_vocab=160), draft=NS(output_vocab=150))
    codec = NS(id_count=lambda: 140)
    assert decoding_vocab(bundle, codec, True) == decoding_vocab(bundle, codec, False) == 150
    codec = NS(id_count=lambda: 155)
    with pytest.raises(IncompatibleModelsError, match="cannot propose every token"):
        decoding_vocab(bundle, codec, True)
    assert decoding_vocab(bundle, codec, False) == 160
    assert decoding_vocab(bundle, None, False) == 160
    assert decoding_vocab(NS(target=NS(output_vocab=160), draft=None), None, False) == 160
    assert decoding_vocab(NS(target=NS(output_vocab=150), draft=NS(output_vocab=160)), None, True) == 150


def test_the_generator_drops_an_end_of_sequence_word_as_transformers_does(ids_bundle):
    from ortspec import SpeculativeGenerator
    gen = SpeculativeGenerator.load(ids_bundle, drafter="none")
    stream = gen.stream(input_ids=[1, 5], bad_words_ids=[[2], [5, 2], [7]], eos_token_id=2, max_new_tokens=2)
    assert stream.request.sampling.bad_words_ids == ((5, 2), (7,))
    stream = gen.stream(input_ids=[1, 5], bad_words_ids=[[2], [7]], eos_token_id=[3], max_new_tokens=2)
    assert stream.request.sampling.bad_words_ids == ((2,), (7,))
