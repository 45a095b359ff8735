"""The logits pipeline: raw logits -> processed scores -> probabilities.

One implementation serves target and draft, so that the draft probabilities
handed to the verifier are exactly the ones the draft sampled from. Order and
semantics follow Hugging Face `generate`: repetition penalty and banned words
(processors), then temperature, top-k, top-p (warpers). All math is float64.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .config import SamplingConfig

# How many candidates top-p inspects before falling back to a full sort.
_TOP_P_PARTIAL = 256


class LogitsPipeline:
    """Applies a SamplingConfig row by row, each row with its own context.

    Row ``i`` of a block of logits is conditioned on ``base + new[:i]``: the
    committed tokens plus the draft tokens fed before that position.
    """

    def __init__(self, config: SamplingConfig, vocab_size: int):
        self.config = config
        self.vocab_size = int(vocab_size)
        single = [w[0] for w in config.bad_words_ids if len(w) == 1]
        self._banned = np.array(sorted(set(single)), dtype=np.int64)
        self._banned = self._banned[self._banned < self.vocab_size]
        self._multi = [w for w in config.bad_words_ids if len(w) > 1]

    # -- processors (greedy and sampling) ---------------------------------
    def scores(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """Processed scores [rows, vocab] in float64 (penalty + banned words)."""
        rows = np.asarray(logits, dtype=np.float64)[:, : self.vocab_size].copy()
        cfg = self.config
        base_arr = np.asarray(base, dtype=np.int64)
        if cfg.repetition_penalty != 1.0:
            seen = np.unique(base_arr)
            for i in range(rows.shape[0]):
                ids = seen if i == 0 else np.union1d(seen, np.asarray(new[:i], dtype=np.int64))
                ids = ids[ids < self.vocab_size]
                picked = rows[i, ids]
                rows[i, ids] = np.where(picked < 0, picked * cfg.repetition_penalty,
                                        picked / cfg.repetition_penalty)
        if self._banned.size:
            rows[:, self._banned] = -np.inf
        if self._multi:
            for i in range(rows.shape[0]):
                context = list(base_arr[-16:]) + list(new[:i])  # enough for any short ban
                for word in self._multi:
                    prefix = list(word[:-1])
                    if word[-1] < self.vocab_size and context[len(context) - len(prefix):] == prefix:
                        rows[i, word[-1]] = -np.inf
        if not np.all(np.isfinite(rows.max(axis=1))):
            raise ValueError("every token is banned at some position; remove entries from bad_words_ids")
        return rows

    def greedy(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """Greedy choice per row: argmax of processed scores, lowest index on ties."""
        if self.config.repetition_penalty == 1.0 and not self.config.bad_words_ids:
            return np.argmax(logits[:, : self.vocab_size], axis=1)  # float32 -> float64 keeps the order
        return np.argmax(self.scores(logits, base, new), axis=1)

    # -- warpers (sampling) -----------------------------------------------
    def probs(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """The distributions actually sampled from, [rows, vocab] float64."""
        rows = self.scores(logits, base, new)
        cfg = self.config
        if cfg.temperature != 1.0:
            rows /= cfg.temperature
        if cfg.top_k and cfg.top_k < self.vocab_size:
            kth = np.partition(rows, -cfg.top_k, axis=1)[:, -cfg.top_k][:, None]
            rows[rows < kth] = -np.inf
        probs = softmax(rows)
        if cfg.top_p < 1.0:
            for i in range(probs.shape[0]):
                probs[i] = top_p_filter(probs[i], cfg.top_p)
        return probs


def softmax(scores: np.ndarray) -> np.ndarray:
    """Row-wise softmax in float64; -inf entries get probability exactly 0."""
    shifted = scores - scores.max(axis=1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=1, keepdims=True)


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of tokens whose cumulative probability reaches top_p.

    Equivalent to Hugging Face's rule (drop tokens whose ascending cumulative
    probability is <= 1 - top_p, keep at least one): in descending order a
    token is kept iff the mass strictly before it is < top_p.
    """
    n = probs.shape[0]
    m = min(_TOP_P_PARTIAL, n)
    cand = np.argpartition(-probs, m - 1)[:m] if m < n else np.arange(n)
    order = cand[np.argsort(-probs[cand], kind="stable")]
    before = np.cumsum(probs[order]) - probs[order]
    if m < n and before[-1] + probs[order[-1]] < top_p:  # nucleus larger than the candidates
        order = np.argsort(-probs, kind="stable")
        before = np.cumsum(probs[order]) - probs[order]
    keep = order[before < top_p]
    if keep.size == 0:
        keep = order[:1]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum()
