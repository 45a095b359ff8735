"""The specification of record: how one row of logits becomes the token chosen or the distribution sampled from.

Plain NumPy over the whole row, no fast path. It follows transformers' ``generate`` in its order and dtypes:
the logits as float32; a logit bias (added in float32, as transformers' sequence bias of one-token
sequences); repetition penalty (a context token's positive score divided by the penalty, a negative
one multiplied, in float32); bad words (each word's last token to -inf where the context ends with the rest of
the word, the whole word matched, in a context at least as long as the word; a word that is one end-of-sequence
id alone is dropped); greedy takes the
first index of the largest processed score. Sampling goes on with temperature (scores divided by it, float32),
top-k (every score below the k-th largest to -inf; ties at the k-th kept) and top-p.

Top-p is the one step where transformers' result rests on float32 rounding of a cumulative sum: it sorts the
scores ascending (a stable sort: the lower id of a tie first), takes a float32 softmax and cumulative sum, and
removes the tokens whose cumulative probability is <= 1 - top_p, keeping at least one. The rule here is that
rule in exact terms, computed in float64: in descending order of score, the higher id of a tie first, a token
is kept iff the probability mass strictly before it is below top_p (the first token always). The two agree
except where the mass before a token is within float32 rounding of top_p.

The distribution is the float64 softmax of the warped float32 scores. Every fast path in ``ortspec.sampling``
and the decoding loop is tested against these functions.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .config import SamplingConfig


def processed_scores(logits: np.ndarray, context: Sequence[int], config: SamplingConfig,
                     eos_token_ids: Sequence[int] = ()) -> np.ndarray:
    """The row's scores after the processors (float32): what greedy decoding takes the argmax of."""
    scores = np.array(logits, dtype=np.float32)
    vocab = scores.size
    for token, bias in config.logit_bias:  # (transformers' SequenceBias of one-token sequences: before the penalty)
        if token < vocab:
            scores[token] += np.float32(bias)
    if config.repetition_penalty != 1.0:
        seen = np.unique(np.asarray([t for t in context if 0 <= t < vocab], dtype=np.int64))
        got = scores[seen]
        theta = np.float32(config.repetition_penalty)
        scores[seen] = np.where(got < 0, got * theta, got / theta)
    for word in config.bad_words_ids:
        if len(word) == 1 and word[0] in eos_token_ids:
            continue
        prefix = list(word[:-1])  # (transformers matches a longer word only in a context at least as long as it)
        ends = not prefix or (len(context) >= len(word) and list(context[len(context) - len(prefix):]) == prefix)
        if ends and word[-1] < vocab:
            scores[word[-1]] = -np.inf
    return scores


def warped_scores(logits: np.ndarray, context: Sequence[int], config: SamplingConfig,
                  eos_token_ids: Sequence[int] = ()) -> np.ndarray:
    """Processed scores, then temperature and top-k (float32; removed tokens at -inf), before top-p."""
    scores = processed_scores(logits, context, config, eos_token_ids)
    scores = scores / np.float32(config.temperature)
    if config.top_k:
        k = min(config.top_k, scores.size)
        kth = np.sort(scores)[scores.size - k]
        scores[scores < kth] = -np.inf
    return scores


def top_p_keep(scores: np.ndarray, top_p: float) -> np.ndarray:
    """The tokens top-p keeps (a boolean mask), by the rule in this module's docstring."""
    keep = np.isfinite(scores)
    if top_p >= 1.0:
        return keep
    ids = np.arange(scores.size)
    order = np.lexsort((-ids, -scores.astype(np.float64)))  # descending score, the higher id of a tie first
    probs = softmax(scores)[order]
    before = np.cumsum(probs) - probs
    kept = before < top_p
    kept[0] = True
    out = np.zeros(scores.size, dtype=bool)
    out[order[kept]] = True
    return out & keep


def softmax(scores: np.ndarray) -> np.ndarray:
    """float64 softmax of float32 scores (-inf entries get 0)."""
    x = scores.astype(np.float64)
    top = x.max()
    if not np.isfinite(top):
        raise ValueError("every token is removed: no distribution to sample from")
    e = np.exp(x - top)
    return e / e.sum()


def distribution(logits: np.ndarray, context: Sequence[int], config: SamplingConfig,
                 eos_token_ids: Sequence[int] = ()) -> np.ndarray:
    """The distribution sampling draws from (float64, over the row's width)."""
    scores = warped_scores(logits, context, config, eos_token_ids)
    keep = top_p_keep(scores, config.top_p)
    return softmax(np.where(keep, scores, np.float32(-np.inf)))


def greedy_token(logits: np.ndarray, context: Sequence[int], config: SamplingConfig,
                 eos_token_ids: Sequence[int] = ()) -> int:
    """The token greedy decoding chooses: the first index of the largest processed score."""
    return int(np.argmax(processed_scores(logits, context, config, eos_token_ids)))
