"""The logits pipeline: raw logits -> processed scores -> the distribution sampled from.

One implementation serves target and draft, so that the draft probabilities
handed to the verifier are exactly the ones the draft sampled from. Order and
semantics follow Hugging Face `generate`: repetition penalty and banned words
(processors), then temperature, top-k, top-p (warpers).

Speed. A row is 32k-152k floats and a round touches up to 2 gamma + 1 rows,
so no step may sort or exponentiate in float64 over the whole vocabulary.
``row`` returns a ``Dist``: with top-k (or a nucleus that is small) the
largest entries are found through the maxima of 32-entry blocks (the k-th
largest block maximum bounds the k-th largest entry from below, so only k
blocks are searched) and the distribution is kept as token ids with float64
probabilities; without truncation it is the float32 weights exp((s - max)/T)
over the vocabulary and their float64 total. Sampling from either takes one
uniform number (inverse CDF over ids, or over blocks then within one).
"""
from __future__ import annotations

from array import array
import bisect
from itertools import accumulate, islice
import math
import operator
import sys
from typing import Sequence

import numpy as np

from .config import SamplingConfig, draft_sampling

BLOCK_ROWS = 32       # a row of width W is viewed as [32, W / 32]; a "block" is one column of it
SPARSE_MAX = 4096     # a nucleus of at most this many tokens is kept as ids + probabilities
LAZY_TOP = 64         # largest entries a row under settings without truncation brings for verification (LazyRow)
LEAN_MAX = 256        # a top-k row of at most this many candidates is finished in plain Python (a small Dist)
THIN_TOTAL = 2 * (LAZY_TOP - 1)  # a dense row of a larger total is thin (Dist._thin): its head holds at most half
LOG2_E = 1.4426950408889634  # 1 / ln 2
HIST_SHIFT = 16       # float32 bits >> 16: sign, exponent and 7 mantissa bits name a bucket of the nucleus search
BUCKETS = 128 * 128   # buckets of weights in [0, 1] (1.0's is 0x3F80), whole groups of GROUP for _reaching


_NO_IDS, _NO_SCORES = np.zeros(0, np.int64), np.zeros(0, np.float32)  # (read only)
_ONES = np.ones(BLOCK_ROWS, dtype=np.float32)  # block sums as a product with it (BLAS)
_NO_IDS.flags.writeable = _NO_SCORES.flags.writeable = _ONES.flags.writeable = False


class Dist:
    """One row's distribution, in one of three forms:

    - small (``tokens``, ``plist``): Python lists, ids ascending, float probabilities summing to 1 — a top-k
      row or a small nucleus. Everything a round asks of it (a token's probability, a draw, sum min(p, q))
      is plain Python: right after a model pass the CPU caches hold nothing of NumPy's or the interpreter's
      code, and each NumPy call then costs tens of microseconds whatever its size;
    - sparse arrays (``ids`` ascending, float64 ``probs``), for larger supports;
    - dense (float32 ``weights`` over the vocabulary, probability = weight / ``total``).

    ``ids``/``probs`` of a small Dist are made on first use (for checks and the rare large-support paths).
    """

    __slots__ = ("_ids", "_probs", "tokens", "plist", "weights", "total", "head", "blocks")

    def __init__(self, ids: np.ndarray | None = None, probs: np.ndarray | None = None,
                 weights: np.ndarray | None = None, total: float = 1.0, *,
                 tokens: list[int] | None = None, plist: list[float] | None = None, head=None, blocks=None):
        self._ids, self._probs = ids, probs
        self.tokens, self.plist = tokens, plist
        self.weights, self.total = weights, total
        self.head = head  # the ids drawn first (``head_ids``): a list, a function that makes it, or None
        self.blocks = blocks  # a dense row's block sums as ``_total`` made them (``block_sums``), or None

    @staticmethod
    def from_probs(probs: np.ndarray, small: bool | None = None) -> "Dist":
        """A sparse Dist of a probability vector's nonzero entries (need not be exactly normalized): a small one
        (lists) when ``small`` or, by default, when there are at most LEAN_MAX of them; else arrays."""
        probs = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(probs > 0)
        if small if small is not None else ids.size <= LEAN_MAX:
            kept = probs[ids].tolist()
            total = math.fsum(kept)
            return Dist(tokens=ids.tolist(), plist=[x / total for x in kept])
        return Dist(ids, probs[ids])

    @staticmethod
    def one_hot(token: int) -> "Dist":
        return Dist(tokens=[int(token)], plist=[1.0])

    @property
    def small(self) -> bool:
        return self.tokens is not None

    @property
    def sparse(self) -> bool:
        return self.tokens is not None or self._ids is not None

    @property
    def ids(self) -> np.ndarray | None:
        if self._ids is None and self.tokens is not None:
            self._ids = np.array(self.tokens, dtype=np.int64)
        return self._ids

    @property
    def probs(self) -> np.ndarray | None:
        if self._probs is None and self.plist is not None:
            self._probs = np.array(self.plist, dtype=np.float64)
        return self._probs

    def prob(self, token: int) -> float:
        if self.tokens is not None:
            i = bisect.bisect_left(self.tokens, token)
            return self.plist[i] if i < len(self.tokens) and self.tokens[i] == token else 0.0
        if self._ids is not None:
            i = int(np.searchsorted(self._ids, token))
            return float(self._probs[i]) if i < self._ids.size and self._ids[i] == token else 0.0
        return float(self.weights[token]) / self.total if 0 <= token < self.weights.size else 0.0

    def probs_of(self, tokens: np.ndarray) -> np.ndarray:
        """Probabilities of several tokens (float64)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        if self.sparse:
            ids, probs = self.ids, self.probs
            i = np.minimum(np.searchsorted(ids, tokens), max(ids.size - 1, 0))
            hit = ids[i] == tokens if ids.size else np.zeros(tokens.size, bool)
            return np.where(hit, probs[i] if ids.size else 0.0, 0.0)
        return self.weights[tokens].astype(np.float64) / self.total

    def dense(self, vocab: int) -> np.ndarray:
        """The distribution as a float64 vector of width ``vocab``."""
        out = np.zeros(vocab)
        if self.sparse:
            out[self.ids] = self.probs / self.probs.sum()
        else:
            out[:self.weights.size] = self.weights / self.total
        return out

    def sample(self, rng: np.random.Generator) -> int:
        """One draw by inverse CDF (one uniform number)."""
        return self.draw(rng.random())

    def draw(self, u: float, more=None) -> int:
        """The draw for the uniform number ``u``: inverse CDF over the head (``head_ids``) in its order, then the rest
        of the support: by id (sparse), or in block order (dense: ``draw_weights``); without a head, over ids
        ascending (sparse) or the heavy weights first (dense). (``more``, a source of further uniform numbers, is
        for rows that draw by rejection: thin dense rows, ``_thin``.)"""
        if more is not None and self._thin():
            return sample_weights(self.weights, u, self.blocks)
        head = self.head_ids()
        if self.tokens is not None:
            tokens, plist = (self.tokens, self.plist) if head is None else head_first_lists(self.tokens, self.plist, head)
            return tokens[inverse_cdf_list(plist, u)]
        if self._ids is not None:
            ids, probs = (self._ids, self._probs) if head is None else head_first(self._ids, self._probs, head)
            return int(ids[_inverse_cdf(probs, u)])
        return draw_weights(self.weights, self.total, u, head, self.blocks)

    def head_ids(self) -> list[int] | None:
        """A row's head, where its pipeline verifies with LazyRow (no top-k): the ids whose raw logit is above the
        row's LAZY_TOP-th largest, largest first (``array_head``, ``top_head``). A draw and a residual draw take
        them first, in that order: they are the entries a pass returns with its rows, so LazyRow knows them
        (and bounds on their weights, or on their probabilities in a top-p nucleus) without the rest of the
        row, and in a peaked row the first few hold nearly all of its mass. Empty for a wide nucleus (LazyRow draws
        from none: ``LogitsPipeline.row``). None for other rows."""
        if callable(self.head):
            self.head = self.head()
        return self.head

    def residual(self, draft: "Dist", u: float, more=None) -> int:
        """The draw from normalize(max(0, p - q)) for the uniform number ``u`` (``residual_draw``); by rejection
        where further uniform numbers come (``more``) and the row is thin (``_thin``)."""
        if more is not None and draft.small and self._thin():
            return self._thin_residual(draft, u, more)
        return residual_draw(self, draft, u)

    def normalized(self) -> dict:
        """A small distribution as {token: probability / their sum} (q as the residual takes it)."""
        total = math.fsum(self.plist)
        return {t: x / total for t, x in zip(self.tokens, self.plist)}

    def _thin(self) -> bool:
        """A dense row whose total is above THIN_TOTAL: its largest LAZY_TOP - 1 weights (each at most 1) hold at
        most half of it. Given further uniform numbers, such a row is drawn from in block order throughout (no
        head first: a draw would rarely end in it) and its residual by rejection. A property of the row alone, so
        LazyRow settles no draw of one from its head (``_draw_bounds``): each row keeps one way from uniform
        numbers to tokens."""
        return self.tokens is None and self._ids is None and self.total > THIN_TOTAL

    THIN_TRIALS = 16

    def _thin_residual(self, draft: "Dist", u: float, more) -> int:
        """normalize(max(0, p - q)) by rejection: a token drawn from p (block order) is kept at once outside q's
        support and with probability max(0, 1 - q / p) inside it (q normalized, as residual_draw takes it); the
        tokens kept are distributed as the residual. After THIN_TRIALS rejections, residual_draw with a fresh
        uniform number (the same distribution)."""
        q = draft.normalized()
        w = self.weights
        ids = [t for t in q if 0 <= t < w.size]
        p = dict(zip(ids, self.probs_of(ids).tolist())) if ids else {}
        if 1.0 - math.fsum(min(p.get(t, 0.0), x) for t, x in q.items()) <= RESIDUAL_EPS:
            return self.draw(u, more)  # the residual is noise: p is drawn from (as residual_draw does)
        for _ in range(self.THIN_TRIALS):
            x = sample_weights(w, u, self.blocks)
            qx = q.get(x)
            if qx is None or (p[x] > 0.0 and more() < 1.0 - qx / p[x]):
                return x
            u = more()
        return residual_draw(self, draft, more())

    def dist(self) -> "Dist":
        return self

    def accepts(self, token: int, q: float, u: float) -> bool:
        """Whether a draft ``token`` drawn with probability ``q`` passes for the uniform number ``u``."""
        return u < acceptance_probability(self.prob(token), q)

    def min_mass(self, other: "Dist") -> float:
        """sum_x min(self(x), other(x)): the probability that a draft from ``other`` is accepted here."""
        if self.tokens is not None and other.tokens is not None:
            return min_mass_lists(self.tokens, self.plist, other.tokens, other.plist)
        small, big = (other, self) if other.sparse else (self, other)
        if not small.sparse:
            v = max(self.weights.size, other.weights.size)
            return float(np.minimum(self.dense(v), other.dense(v)).sum())
        norm = small.probs / small.probs.sum()
        return float(np.minimum(norm, big.probs_of(small.ids)).sum())


def acceptance_probability(p_token: float, q_token: float) -> float:
    """min(1, p/q) computed in log space; a token q gives no mass is rejected."""
    if q_token <= 0.0 or p_token <= 0.0:
        return 0.0
    return min(1.0, math.exp(math.log(p_token) - math.log(q_token)))


def inverse_cdf_list(plist: list[float], u: float) -> int:
    """``_inverse_cdf`` over a Python list (the same running sums, left to right, so the same draw for the same
    numbers): the first index whose running sum exceeds u times the total."""
    sums = list(accumulate(plist))
    return min(bisect.bisect_right(sums, u * sums[-1]), len(sums) - 1)


def min_mass_lists(tokens: list[int], plist: list[float], other_tokens: list[int], other_plist: list[float]) -> float:
    """sum_x min(p(x), q(x)) of two small distributions (each normalized to 1)."""
    there = dict(zip(tokens, plist))
    return math.fsum(min(q, there[t]) for t, q in zip(other_tokens, other_plist) if t in there)


def head_first(ids: np.ndarray, probs: np.ndarray, head: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """A sparse distribution (``ids`` ascending) in draw order: the ``head`` ids it holds, in the head's order,
    then the others ascending."""
    if not head:
        return ids, probs
    h = np.asarray(head, dtype=ids.dtype)
    pos = np.minimum(np.searchsorted(ids, h), ids.size - 1)
    first = pos[ids[pos] == h]
    if first.size == ids.size:
        return ids[first], probs[first]
    rest = np.ones(ids.size, dtype=bool)
    rest[first] = False
    order = np.concatenate([first, np.flatnonzero(rest)])
    return ids[order], probs[order]


def head_first_lists(tokens: list[int], plist: list[float], head: list[int]) -> tuple[list[int], list[float]]:
    """``head_first`` of a small distribution (lists)."""
    there = dict(zip(tokens, plist))
    first = [t for t in head if t in there]
    if len(first) < len(tokens):
        taken = set(first)
        first += [t for t in tokens if t not in taken]
    return first, [there[t] for t in first]


def _inverse_cdf(weights: np.ndarray, u: float) -> int:
    cdf = np.cumsum(weights)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), weights.size - 1)


RESIDUAL_EPS = 1e-12   # below this mass the residual max(0, p - q) is numerical noise: p == q
HEAD_MIN = 2.0 ** -10  # a dense row without a head given: weights at least this (the largest is 1) drawn first


def residual(target_probs: np.ndarray, draft_probs: np.ndarray) -> np.ndarray:
    """normalize(max(0, p - q)); falls back to p when p and q coincide."""
    r = np.maximum(target_probs - draft_probs, 0.0)
    total = r.sum()
    if total <= RESIDUAL_EPS:
        return target_probs
    return r / total


def residual_draw(target: Dist, draft: Dist, u: float) -> int:
    """One draw from normalize(max(0, p - q)) for the uniform number ``u``; from p when p and q coincide (the
    residual's mass below RESIDUAL_EPS)."""
    head = target.head_ids()  # (ids drawn first, where the target's rows have a head: over the union too)
    if target.small and draft.small:  # plain Python over the union of two small supports
        there = dict(zip(draft.tokens, draft.plist))
        mass = dict(zip(target.tokens, target.plist))
        ids = sorted(set(mass) | set(there))
        r = [max(mass.get(t, 0.0) - there.get(t, 0.0), 0.0) for t in ids]
        if math.fsum(r) <= RESIDUAL_EPS:
            return target.draw(u)
        if head is not None:
            ids, r = head_first_lists(ids, r, head)
        return ids[inverse_cdf_list(r, u)]
    if target.sparse and draft.sparse:
        ids = np.union1d(target.ids, draft.ids)
        r = np.maximum(target.probs_of(ids) - draft.probs_of(ids), 0.0)
        if r.sum() <= RESIDUAL_EPS:
            return target.draw(u)
        if head is not None:
            ids, r = head_first(ids, r, head)
        cdf = np.cumsum(r)
        return int(ids[min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), ids.size - 1)])
    if not target.sparse and draft.sparse:  # the usual dense case: q lives on a few ids, p everywhere
        p_there = target.probs_of(draft.ids)
        overlap = np.minimum(p_there, draft.probs / draft.probs.sum())
        if 1.0 - overlap.sum() <= RESIDUAL_EPS:
            return target.draw(u)
        # the residual's weights: p's with q's ids lowered, in place (put back after the draw; no copy of the row)
        weights, ids = target.weights, draft.ids
        was = weights[ids]
        weights[ids] = ((p_there - overlap) * target.total).astype(np.float32)
        try:
            blocks = block_sums(weights)
            return draw_weights(weights, _total(weights, blocks), u, head, blocks)
        finally:
            weights[ids] = was
    width = max(x.weights.size if not x.sparse else int(x.ids.max()) + 1 for x in (target, draft))
    r = residual(target.dense(width), draft.dense(width))
    cdf = np.cumsum(r)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), r.shape[0] - 1)



def draw_weights(weights: np.ndarray, total: float, u: float, head: list[int] | None = None,
                 blocks: np.ndarray | None = None) -> int:
    """Inverse-CDF draw from float32 ``weights`` (largest 1, sum ``total`` as ``_total`` gives it) for ``u``: first
    over the ``head`` ids in the order given (float64 running sums), then, past them, over the rest in block
    order (``sample_weights``). The head of a row verified under settings LazyRow serves (``Dist.head_ids``) is
    the entries a pass returns with it, at most LAZY_TOP - 1: where they hold most of the row's mass, LazyRow
    draws from them without the rest of the row. Without a head: the weights >= HEAD_MIN by id, and a row with
    more than LEAN_MAX of them (a flat one) in block order throughout. ``blocks``: the weights' block sums
    (``block_sums``) where the caller has them, searched instead of summing the row again when no head entry
    is set aside (a row without heavy weights; past a head, the row is summed again with the head at 0)."""
    if head is None:
        heavy = np.flatnonzero(weights >= HEAD_MIN)
        if heavy.size > LEAN_MAX:
            return sample_weights(weights, u, blocks)
        head = heavy.tolist()
    if not head:
        return sample_weights(weights, u, blocks)
    x, acc, last = u * total, 0.0, -1
    for i, w in zip(head, weights[head].tolist()):
        if w > 0.0:
            acc += w
            last = i
            if acc > x:
                return i
    if not total > acc:  # (rounding: the head holds the whole total)
        return last if last >= 0 else sample_weights(weights, u)
    kept = weights[head]  # the rest: the head's weights set to 0 for the draw, then put back (no copy of the row)
    weights[head] = 0
    try:
        got = sample_weights(weights, min((x - acc) / (total - acc), 1.0 - 2.0 ** -53))
    finally:
        weights[head] = kept
    return got if got >= 0 else last  # (no mass outside the head: the total's rounding again)


def array_head(scores: np.ndarray, vocab: int) -> list[int]:
    """The ids below ``vocab`` whose entry is above the LAZY_TOP-th largest of ``scores`` (of its whole width, as
    a pass's TopK reads a row; every finite entry where the row holds no more than LAZY_TOP), largest entry
    first, lowest id first on ties."""
    if scores.size <= LAZY_TOP:
        found = np.flatnonzero(scores[:vocab] > -np.inf)
    else:
        cand = top_candidates(scores, LAZY_TOP)
        values = scores[cand]
        kth = np.partition(values, values.size - LAZY_TOP)[values.size - LAZY_TOP]
        found = cand[(values > kth) & (cand < vocab)]
    return found[np.lexsort((found, -scores[found]))].tolist()


def _restored_head(raw: np.ndarray, ids: np.ndarray, was: np.ndarray, vocab: int) -> list[int]:
    """``array_head`` of a row whose entries ``ids`` were changed in place from ``was``."""
    row = raw.copy()
    row[ids] = was
    return array_head(row, vocab)


def top_head(row, vocab: int) -> list[int]:
    """``array_head`` of a row that brings its largest entries (``top``: the graph's TopK, or the device's)."""
    ids, values, _ = row.top(LAZY_TOP)
    return _head_of(ids, values, row.width if hasattr(row, "width") else row.numpy().shape[0], vocab)


def _head_of(ids, values, width: int, vocab: int) -> list[int]:
    """``array_head`` from a row's largest entries (at least LAZY_TOP of them where the row has more, descending)."""
    ids = ids.tolist() if isinstance(ids, np.ndarray) else ids
    values = values.tolist() if isinstance(values, np.ndarray) else values
    kth = values[LAZY_TOP - 1] if width > LAZY_TOP else -math.inf
    n = 0
    while n < len(values) and values[n] > kth:
        n += 1
    if _descending(values[:n]) and all(t < vocab for t in ids[:n]):  # (no ties: already largest first)
        return ids[:n]
    return [t for _, t in sorted((-v, t) for t, v in zip(ids[:n], values[:n]) if t < vocab)]


def sample_weights(weights: np.ndarray, u: float, blocks: np.ndarray | None = None) -> int:
    """Inverse-CDF draw over float32 ``weights`` in block order: first a block by the block sums (``blocks``
    where the caller has them, as ``block_sums`` made them), then within it (-1 where no weight is positive)."""
    width = weights.size
    cols = width // BLOCK_ROWS
    if cols < 2:
        wide = weights.astype(np.float64)
        return _inverse_cdf(wide, u) if wide.sum() > 0 else -1
    body = weights[:cols * BLOCK_ROWS].reshape(BLOCK_ROWS, cols)
    block = block_sums(weights) if blocks is None else blocks
    tail = weights[cols * BLOCK_ROWS:].astype(np.float64)
    cum = np.cumsum(block, dtype=np.float64)
    tail_sum = tail.sum()
    if not cum[-1] + tail_sum > 0:
        return -1
    x = u * (cum[-1] + tail_sum)
    if x >= cum[-1] and tail.size and tail_sum > 0:
        return cols * BLOCK_ROWS + _inverse_cdf(tail, (x - cum[-1]) / tail_sum)
    j = min(int(np.searchsorted(cum, x, side="right")), cols - 1)
    while block[j] <= 0:  # rounding pushed x past the last block with mass
        j -= 1
    inside = body[:, j].astype(np.float64)
    r = (x - (cum[j - 1] if j else 0.0)) / inside.sum()
    return _inverse_cdf(inside, min(max(r, 0.0), 1.0)) * cols + j


def block_sums(weights: np.ndarray) -> np.ndarray | None:
    """The float32 sums of a row's blocks (BLAS; the columns of its [BLOCK_ROWS, width / BLOCK_ROWS] view), which
    ``_total`` adds up and a draw in block order searches; None for a row narrower than two blocks."""
    cols = weights.size // BLOCK_ROWS
    if cols < 2:
        return None
    return _ONES @ weights[:cols * BLOCK_ROWS].reshape(BLOCK_ROWS, cols)


def top_candidates(scores: np.ndarray, k: int) -> np.ndarray:
    """Indices of every entry >= a bound that the k-th largest entry reaches: a superset of the top k (ties
    included), found by searching only the k blocks with the largest maxima."""
    width = scores.size
    cols = width // BLOCK_ROWS
    if k >= cols:
        if k >= width:
            return np.arange(width)
        kth = np.partition(scores, width - k)[width - k]
        return np.flatnonzero(scores >= kth)
    body = scores[:cols * BLOCK_ROWS].reshape(BLOCK_ROWS, cols)
    maxima = body.max(axis=0)
    bound = np.partition(maxima, cols - k)[cols - k]  # k distinct entries reach it: the k-th largest does too
    blocks = np.flatnonzero(maxima >= bound)
    sub = body[:, blocks]
    rows, which = np.nonzero(sub >= bound)
    found = rows * cols + blocks[which]
    tail = np.flatnonzero(scores[cols * BLOCK_ROWS:] >= bound) + cols * BLOCK_ROWS
    return np.concatenate([found, tail]) if tail.size else found


class Scratch:
    """A few reusable vocabulary-wide arrays (float32 rows; the nucleus search's intp keys, float64 weights and
    mask). Fresh arrays of this size cost page faults on every allocation (more than the arithmetic on them);
    one is handed out again only when nothing refers to it any more (a returned Dist keeps its weights
    referenced). One Scratch per thread of work."""

    KEEP = 8

    def __init__(self):
        self._arrays: list[np.ndarray] = []

    def take(self, width: int, dtype=np.float32) -> np.ndarray:
        for arr in self._arrays:  # (a plain loop: enumerate's reused tuple would hold one more reference)
            if sys.getrefcount(arr) <= 3 and arr.size == width and arr.dtype == dtype:  # the list, this loop, the call
                return arr
        arr = np.empty(width, dtype=dtype)
        if len(self._arrays) < self.KEEP:
            self._arrays.append(arr)
        return arr


class LogitsPipeline:
    """Applies a SamplingConfig row by row, each row with its own context.

    Row ``i`` of a block of logits is conditioned on ``base + new[:i]``: the
    committed tokens plus the draft tokens fed before that position.
    """

    def __init__(self, config: SamplingConfig, vocab_size: int, scratch: Scratch | None = None):
        self.config = config
        self.vocab_size = int(vocab_size)
        self.scratch = scratch or Scratch()
        self.lazy_settled = 0  # LazyRow verdicts settled from a row's largest entries
        self.lazy_read = 0     # ... and those that needed the whole row
        single = [w[0] for w in config.bad_words_ids if len(w) == 1]
        self._banned = np.array(sorted(set(single)), dtype=np.int64)
        self._banned = self._banned[self._banned < self.vocab_size]
        self._multi = [w for w in config.bad_words_ids if len(w) > 1]
        self._reach = max((len(w) - 1 for w in self._multi), default=0)  # context tokens a longer word matches
        self._seen_of: list[int] = []     # the context whose distinct tokens are cached (repetition penalty)
        self._seen_base = None            # ... and the list object it was last read from
        # Set by a decode loop whose context is one list that only grows (appended to) between calls: the same
        # object is then taken to extend what was read from it without comparing its prefix again (right after
        # a pass, comparing a few hundred tokens cost ~0.1 ms per row)
        self.growing_context = False
        self._seen: set[int] = set()
        self._seen_order: list[int] = []  # the same ids in the order first seen (the array is made when asked for)
        self._seen_array = np.zeros(0, dtype=np.int64)
        self._theta32 = float(np.float32(config.repetition_penalty))  # the penalty as float32 rows meet it
        self.processes = config.repetition_penalty != 1.0 or bool(config.bad_words_ids)  # processors change scores

    # -- processors (greedy and sampling) ---------------------------------
    def scores(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """Processed scores [rows, vocab] in float32 (penalty + banned words), as transformers computes them: the
        logits as float32, the penalty's products and quotients rounded to float32."""
        rows = np.array(np.asarray(logits)[:, : self.vocab_size], dtype=np.float32)
        for i in range(rows.shape[0]):
            ids, values = self._changes(rows[i], base, new[:i])
            rows[i, ids] = values
        if not np.all(np.isfinite(rows.max(axis=1))):
            raise ValueError("every token is banned at some position; remove entries from bad_words_ids")
        return rows

    def greedy(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """Greedy choice per row: argmax of processed scores, lowest index on ties."""
        if hasattr(logits, "top"):  # DeviceRows
            return np.array([self._device_greedy(logits[i], base, new[:i]) for i in range(len(logits))])
        if not self.processes:
            return np.argmax(logits[:, : self.vocab_size], axis=1)  # float32 -> float64 keeps the order
        return np.argmax(self.scores(logits, base, new), axis=1)

    def _device_greedy(self, drow, base: Sequence[int], new: Sequence[int]) -> int:
        found = self._device_top(drow, 1, base, new)
        if found is None or not math.isfinite(found[2]):
            return int(self.greedy(drow.numpy()[None], base, new)[0])
        return int(min(found[0]))  # the lowest id among the ties of the largest

    def _update_seen(self, base: Sequence[int]) -> None:
        """Keep the distinct ids of ``base`` (inside the vocabulary) cached. A context that extends the last one
        (as a request's does, round after round) only adds its new tokens to the cached set."""
        n = len(self._seen_of)
        same = self.growing_context and base is self._seen_base and len(base) >= n
        if not same and (len(base) < n or list(base[:n]) != self._seen_of):
            self._seen_of, self._seen, self._seen_order, n = [], set(), [], 0
            self._seen_array = np.zeros(0, dtype=np.int64)
        self._seen_base = base
        if len(base) > n:
            fresh = [int(t) for t in base[n:]]
            self._seen_of.extend(fresh)
            added = [t for t in dict.fromkeys(fresh) if t not in self._seen and 0 <= t < self.vocab_size]
            if added:  # appended (the whole set is not rebuilt each round)
                self._seen.update(added)
                self._seen_order.extend(added)

    def _seen_ids(self) -> np.ndarray:
        """The cached distinct ids as an int64 array (extended from the list only when rows are read whole: the
        paths that read a row's largest entries need just the set)."""
        have, order = self._seen_array.size, self._seen_order
        if have != len(order):
            self._seen_array = np.concatenate([self._seen_array, np.asarray(order[have:], dtype=np.int64)])
        return self._seen_array

    def _seen_tokens(self, base: Sequence[int], new: Sequence[int]) -> np.ndarray:
        """Distinct ids of base + new inside the vocabulary."""
        self._update_seen(base)
        extra = [t for t in dict.fromkeys(int(t) for t in new) if t not in self._seen and 0 <= t < self.vocab_size]
        ids = self._seen_ids()
        return np.concatenate([ids, np.asarray(extra, dtype=np.int64)]) if extra else ids

    def _changes(self, row: np.ndarray, base: Sequence[int], new: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The ids a row's processors change and their new scores (penalized, or -inf when banned)."""
        if not self.processes:
            return _NO_IDS, _NO_SCORES
        seen = self._seen_tokens(base, new) if self.config.repetition_penalty != 1.0 else np.zeros(0, np.int64)
        values = self._penalize(row[seen])
        if not self.config.bad_words_ids:
            return seen, values
        banned = self._banned_now(base, new)
        if seen.size and banned.size:  # a banned id is -inf, penalized or not (each id changed once)
            keep = ~np.isin(seen, banned)
            seen, values = seen[keep], values[keep]
        return np.concatenate([seen, banned]), np.concatenate([values, np.full(banned.size, -np.inf, row.dtype)])

    def _penalize(self, values: np.ndarray) -> np.ndarray:
        """Repetition penalty (as transformers): positive scores divided by it, negative ones multiplied."""
        theta = self.config.repetition_penalty  # (a Python float: the products and quotients in values' dtype)
        out = np.divide(values, theta)
        np.multiply(values, theta, out=out, where=values < 0)  # (three NumPy calls: each costs after a pass)
        return out

    def changed_ids(self, base: Sequence[int], new: Sequence[int]) -> tuple:
        """(the context's distinct ids, the new ones, the banned ones) as sets (empty where no processor reads
        them): every id the processors may change at this position is in one of them."""
        seen = fresh = banned = ()
        if self.config.repetition_penalty != 1.0:
            self._update_seen(base)
            seen, fresh = self._seen, {int(t) for t in new}
        if self.config.bad_words_ids:
            banned = set(self._banned_list(base, new))
        return seen, fresh, banned

    def _banned_now(self, base: Sequence[int], new: Sequence[int]) -> np.ndarray:
        return np.asarray(self._banned_list(base, new), dtype=np.int64)

    def _banned_list(self, base: Sequence[int], new: Sequence[int]) -> list[int]:
        """Ids banned at this position, each once: single-token bad words, and the last token of each longer bad
        word whose other tokens end the context, as transformers matches them (the whole word, and only in a
        context at least as long as the word)."""
        banned = self._banned.tolist()
        if self._multi:
            reach, length = self._reach, len(base) + len(new)
            context = [int(t) for t in new[-reach:]]
            if len(context) < reach:
                context = [int(t) for t in base[len(context) - reach:]] + context
            extra = []
            for word in self._multi:
                n = len(word) - 1
                if word[-1] < self.vocab_size and length > n and context[len(context) - n:] == list(word[:-1]):
                    extra.append(word[-1])
            if extra:
                banned = list(dict.fromkeys(banned + extra))  # (a token two words ban is banned once)
        return banned

    # -- rows left on the device (DeviceRow: the largest entries and a bound on the rest) ------------------
    TOP_MARGIN = 16  # entries read beyond the k a rule needs, for those the processors push down

    def top_entries(self) -> int:
        """How many of a row's largest entries this pipeline reads where a row offers them (``top``): enough
        for its top-k (or greedy) choice with the margin; 0 when it needs whole rows (no top-k, top-k beyond
        LEAN_MAX, or a penalty below 1, which can raise entries from anywhere)."""
        cfg = self.config
        if cfg.repetition_penalty < 1.0:
            return 0
        if not cfg.do_sample:
            return 1 + self.TOP_MARGIN
        if cfg.top_k and cfg.top_k + self.TOP_MARGIN <= LEAN_MAX and cfg.top_k < self.vocab_size:
            return cfg.top_k + self.TOP_MARGIN
        if self._lazy_rows():
            return LAZY_TOP
        return 0

    # LazyRow settles penalized rows at vocabularies from this width: a penalty's bookkeeping on the host costs
    # about the same whatever the vocabulary, a whole row in proportion to it (speculating, penalty 1.1, no
    # top-k, host time per round: SmolLM2, 49,152 entries, 2.32 ms whole vs 2.76 lazily; Qwen2.5, 151,936,
    # 2.83 vs 2.22)
    LAZY_PENALTY_VOCAB = 100_000

    def _lazy_rows(self) -> bool:
        """Whether verification settles this pipeline's rows with LazyRow: sampling without top-k (with or
        without top-p), without a repetition penalty or, from LAZY_PENALTY_VOCAB entries, with one above 1."""
        cfg = self.config
        theta = cfg.repetition_penalty
        return cfg.do_sample and not (cfg.top_k and cfg.top_k < self.vocab_size) and \
            (theta == 1.0 or (theta > 1.0 and self.vocab_size >= self.LAZY_PENALTY_VOCAB))

    def norm_scale(self) -> float:
        """The scale of the normalizer a pass computes per row where its graph has one (1 / temperature): what
        LazyRow reads; 0 when these rules do not read it."""
        return 1.0 / self.config.temperature if self._lazy_rows() else 0.0

    def verify_row(self, logits, base: Sequence[int], new: Sequence[int] = (), last: bool = False):
        """A target row for verification: a LazyRow where the row comes with its largest entries and the settings
        have no top-k (verdicts, draws and residual draws settled from its normalizer and largest entries), unless
        those entries hold at most half of its mass (``thin_head``) and it is the ``last`` (only drawn from) or
        penalized (whose bookkeeping then buys little: a flat row's verdicts are rarely settled, its draws
        seldom), or its top-p nucleus is wide (``wide_nucleus``); else ``row`` (in place: a row is verified
        once)."""
        if hasattr(logits, "top") and self._lazy_rows() and not wide_nucleus(logits, self, base, new) and \
                not ((last or self.config.repetition_penalty != 1.0) and thin_head(logits, self)):
            return LazyRow(self, logits, base, new)
        return self.row(logits, base, new, inplace=True)

    def verify_rows(self, rows, base: Sequence[int], tokens: Sequence[int]):
        """What verification reads of a pass's rows (``verify_dists``' target_dist): row ``i`` (i <= len(tokens))
        as ``verify_row`` gives it for the context ``base + tokens[:i]``, the last one only drawn from."""
        n = len(tokens)
        return lambda i: self.verify_row(rows[i], base, tokens[:i], last=i == n)

    def _device_top(self, drow, k: int, base: Sequence[int], new: Sequence[int]):
        """The processed scores of a row's largest entries, read from ``drow.top`` (a row whose largest entries
        the graph or the device found), when they decide its top ``k`` exactly: (ids, scores, kth) as lists,
        every id whose score is >= kth, the k-th largest; None when the row must be read in full (a processor
        may raise scores, or the entries read do not settle the k-th largest). Scores are processed with
        float32 rounding, as the host path (and transformers) does. Plain Python on a few dozen numbers: right after a model pass each NumPy call would cost more than all of it.

        Processors only lower scores (penalty >= 1, bans), so an entry that was not read scores at most the
        bound the device returns; when the k-th largest processed score read is above that bound, the entries
        read at or above it are exactly those the full row would keep.
        """
        read = self._read_top(drow, k + self.TOP_MARGIN, base, new)
        if read is None:
            return None
        tok, val, bound = read
        if len(tok) < k:
            return None
        if not self.processes or _descending(val):
            kth = val[k - 1]  # no processor moved an entry out of the descending order the row gave them
            n = k
            while n < len(val) and val[n] >= kth:
                n += 1
            return (tok[:n], val[:n], kth) if kth > bound else None
        # processors moved entries: one sort into the top-p order (descending score, highest id first on ties),
        # which finds the k-th largest and leaves the kept entries as ``_sparse`` takes them without sorting again
        order = sorted(zip(map(operator.neg, val), map(operator.neg, tok)))
        kth = -order[k - 1][0]
        if not kth > bound:
            return None
        n = k
        while n < len(order) and -order[n][0] >= kth:
            n += 1
        return [-t for _, t in order[:n]], [-v for v, _ in order[:n]], kth

    def _read_top(self, drow, k: int, base: Sequence[int], new: Sequence[int], found=None):
        """(ids, processed scores, bound) of the ``k`` largest entries ``drow.top`` returns (or of ``found``, what
        it returned), as Python lists (ids inside the vocabulary; banned ones at -inf), and the bound every entry
        not read is at most, processed or not; None with a penalty below 1 (it raises entries from anywhere)."""
        if self.config.repetition_penalty < 1.0:
            return None
        ids, vals, bound = found or drow.top(k)  # arrays or lists (read, never changed)
        tok = ids.tolist() if isinstance(ids, np.ndarray) else ids
        val = vals.tolist() if isinstance(vals, np.ndarray) else vals
        if tok and max(tok) >= self.vocab_size:  # padding columns of a wider graph
            inside = [j for j, t in enumerate(tok) if t < self.vocab_size]
            tok, val = [tok[j] for j in inside], [val[j] for j in inside]
        theta = self.config.repetition_penalty
        if theta != 1.0:
            self._update_seen(base)
            hits = self._seen.intersection(tok)  # (one C-level pass: most entries read are not in the context)
            if new:
                hits.update({int(t) for t in new}.intersection(tok))
            if hits:
                val = list(val)  # (the lists read are not changed)
                # float32 products and quotients, as NumPy makes them on float32 rows (rounded through ``one``:
                # a float64 product or quotient of two float32 numbers rounds to float32 as float32 arithmetic does)
                one, by = array("f", [0.0]), self._theta32
                for j, t in enumerate(tok):
                    if t in hits:
                        one[0] = val[j] * by if val[j] < 0 else val[j] / by
                        val[j] = one[0]
        if self.config.bad_words_ids:
            banned = set(self._banned_list(base, new))
            val = [-math.inf if t in banned else v for t, v in zip(tok, val)]
        return tok, val, float(bound)

    # -- warpers (sampling) -----------------------------------------------
    def row(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = (), inplace: bool = False) -> Dist:
        """The distribution one row is sampled from (context ``base + new``). ``inplace`` lets the processors
        (penalty, banned words) write into ``logits`` instead of a copy: for rows used once."""
        cfg = self.config
        head = None  # (rows LazyRow may verify: the ids a draw takes first, from the raw row: Dist.head_ids)
        if hasattr(logits, "top"):  # a DeviceRow
            if cfg.top_k and cfg.top_k < self.vocab_size:
                found = self._device_top(logits, cfg.top_k, base, new)
                if found is not None and math.isfinite(found[2]):
                    return self._sparse(found[0], found[1])
            if self._lazy_rows():
                drow, vocab = logits, self.vocab_size
                head = lambda: top_head(drow, vocab)  # noqa: E731 (read from its top entries when a draw needs it)
            # settings without top-k read the whole row (in place only where it is a host pass's own buffer)
            logits, inplace = logits.numpy(), inplace and getattr(logits, "on_host", False)
        raw = np.asarray(logits)
        scores = raw[: self.vocab_size]
        if scores.dtype != np.float32:
            scores, inplace = scores.astype(np.float32), True
        ids, values = self._changes(scores, base, new)
        if head is None and self._lazy_rows():
            # a host row: its head from the raw entries when a draw needs it (those the processors are about to
            # change in place kept aside: a whole row is mostly read for a verdict, not drawn from)
            vocab = self.vocab_size
            if ids.size and inplace:
                changed, was = ids, scores[ids]
                head = lambda: _restored_head(raw, changed, was, vocab)  # noqa: E731
            else:
                head = lambda: array_head(raw, vocab)  # noqa: E731
        if ids.size:
            if not inplace:
                copy = self.scratch.take(scores.size)
                np.copyto(copy, scores)
                scores = copy
            scores[ids] = values
        if cfg.top_k and cfg.top_k < self.vocab_size:
            cand = top_candidates(scores, cfg.top_k)
            vals = scores[cand]
            if cand.size > cfg.top_k:  # keep every entry >= the k-th largest (ties kept, as transformers)
                kth = np.partition(vals, cand.size - cfg.top_k)[cand.size - cfg.top_k]
                cand, vals = cand[vals >= kth], vals[vals >= kth]
            if not np.isfinite(vals.max()):
                raise ValueError("every token is banned at some position; remove entries from bad_words_ids")
            return self._sparse(cand, vals)
        top = float(scores.max())
        if not np.isfinite(top):
            raise ValueError("every token is banned at some position; remove entries from bad_words_ids")
        weights = np.subtract(scores, np.float32(top), out=self.scratch.take(scores.size))
        weights *= np.float32(LOG2_E / cfg.temperature)
        np.exp2(weights, out=weights)  # exp((s - max) / T); NumPy's float32 exp2 is nearly twice as fast as exp
        blocks = block_sums(weights)
        total = _total(weights, blocks)
        if cfg.top_p < 1.0:
            got = self._nucleus(weights, total)
            # a wide nucleus (``wide_nucleus``, told from the total: LazyRow draws from none, see _draw_bounds) is
            # drawn without a head: a dense one in block order over the kept weights, none set aside first
            got.head = [] if head is not None and _wide(cfg.top_p, total) else head
            return got
        return Dist(weights=weights, total=total, head=head, blocks=blocks)

    def probs(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """The distributions actually sampled from, as dense float64 rows [rows, vocab] (for checks)."""
        return np.stack([self.row(logits[i], base, new[:i]).dense(self.vocab_size) for i in range(len(logits))])

    def _sparse(self, ids, scores) -> Dist:
        """Softmax at the temperature over candidate ``ids`` (every other id has probability 0), then top-p.
        Computed in the top-p order (descending score, highest id first on ties), so the same candidates give
        the same bits however they were found (the host and device paths). Up to LEAN_MAX candidates in plain
        Python (a small Dist), more with NumPy."""
        if len(ids) > LEAN_MAX:
            ids, scores = np.asarray(ids), np.asarray(scores)
            order = np.lexsort((-ids, -scores))
            x = scores[order].astype(np.float64) / self.config.temperature
            e = np.exp(x - x[0])
            return self._nucleus_sorted(ids[order], e / e.sum())
        tok = ids.tolist() if isinstance(ids, np.ndarray) else ids
        val = scores.tolist() if isinstance(scores, np.ndarray) else scores
        if not _descending(val):  # (as the graph returns a row's largest entries, they already are the top-p order)
            order = sorted(zip(map(operator.neg, val), map(operator.neg, tok)))  # the top-p order (-score, -id)
            val, tok = [-v for v, _ in order], [-t for _, t in order]
        temperature = self.config.temperature
        top = val[0] / temperature
        e = [math.exp(v / temperature - top) for v in val]
        total = math.fsum(e)
        probs = [x / total for x in e]
        n = len(probs)
        while n > 1 and probs[n - 1] == 0.0:  # underflowed: the tail of the order
            n -= 1
        if self.config.top_p < 1.0 and n > 1:
            # kept while the mass strictly before a token is < top_p: through the first running sum >= top_p
            # (the running sums of the mass, added left to right)
            n = min(bisect.bisect_left(list(accumulate(probs[:n - 1])), self.config.top_p) + 1, n)
        if n < len(probs):
            total = math.fsum(probs[:n])
            probs = [x / total for x in probs[:n]]
        by_id = sorted(range(n), key=tok.__getitem__)
        return Dist(tokens=[tok[i] for i in by_id], plist=[probs[i] for i in by_id])

    def _top_p(self, ids: np.ndarray, probs: np.ndarray) -> Dist:
        """Keep the smallest set of tokens whose cumulative probability reaches top_p, then sort by id.

        Hugging Face's rule (drop tokens whose ascending cumulative probability is
        <= 1 - top_p, keep at least one; its stable ascending sort puts the lower id
        of a tie first): in descending order (highest id first on ties) a token is
        kept iff the mass strictly before it is < top_p.
        """
        order = np.lexsort((-ids, -probs))
        return self._nucleus_sorted(ids[order], probs[order])

    def _nucleus_sorted(self, ids: np.ndarray, probs: np.ndarray) -> Dist:
        """``_top_p`` on rows already in the top-p order: the kept prefix (underflowed zeros, a suffix there,
        dropped), renormalized, sorted by id."""
        n = int(np.count_nonzero(probs))
        if self.config.top_p < 1.0:
            n = min(n, 1 + int(np.searchsorted(np.cumsum(probs[:-1]), self.config.top_p, side="left")))
        kept = probs[:n]
        order = np.argsort(ids[:n])
        return Dist(ids[:n][order], (kept / kept.sum())[order])

    def _nucleus(self, weights: np.ndarray, total: float) -> Dist:
        """Top-p over dense weights, by threshold, over a histogram of the weights: the bit patterns of float32
        numbers >= 0 are ordered as their values, so their top bits name buckets of ever larger weights (1/128 of
        an octave each). One pass finds each bucket's mass; the bucket where the mass in descending order reaches
        the target is the only one sorted exactly: above it every token is kept, below it none. (The weights are
        at most 1, the largest: their buckets are below BUCKETS.)"""
        target = self.config.top_p * total
        # intp keys and float64 weights (np.add.at's fast path: other types, or bincount, cost 1.6-60x as much),
        # written into reused arrays (fresh ones of this size cost more in page faults than the histogram itself)
        keys = np.right_shift(weights.view(np.int32), HIST_SHIFT, out=self.scratch.take(weights.size, np.intp))
        wide = self.scratch.take(weights.size, np.float64)
        np.copyto(wide, weights)
        hist = self.scratch.take(BUCKETS, np.float64)
        hist.fill(0.0)
        np.add.at(hist, keys, wide)  # (one by one in id order, as bincount adds them)
        keys = wide = None  # (free for the next row)
        j, mass_above = _reaching(hist[::-1], target)  # the first bucket, from the top, whose running sum reaches it
        cut = BUCKETS - 1 - j                               # its key, and the weights it holds: [low, high)
        low, high = np.array([cut << HIST_SHIFT, (cut + 1) << HIST_SHIFT], dtype=np.int32).view(np.float32)
        above = np.greater_equal(weights, high, out=self.scratch.take(weights.size, np.bool_))
        inside = np.greater_equal(weights, low, out=self.scratch.take(weights.size, np.bool_))
        band = np.flatnonzero(np.not_equal(inside, above, out=inside))
        order = band[np.lexsort((-band, -weights[band]))]
        before = mass_above + np.cumsum(weights[order], dtype=np.float64) - weights[order]
        kept = order[before < target]
        if np.count_nonzero(above) + kept.size <= SPARSE_MAX:
            ids = np.concatenate([np.flatnonzero(above), kept])
            return self._top_p_done(ids, weights[ids])
        out = np.multiply(weights, above, out=self.scratch.take(weights.size))  # (weights are finite, >= 0)
        out[kept] = weights[kept]
        return Dist(weights=out, total=mass_above + float(weights[kept].sum(dtype=np.float64)))

    @staticmethod
    def _top_p_done(ids: np.ndarray, weights: np.ndarray) -> Dist:
        order = np.argsort(ids)
        w = weights[order].astype(np.float64)
        return Dist(ids[order], w / w.sum())


GROUP = 128  # buckets per group in _reaching


def _reaching(mass: np.ndarray, target: float) -> tuple[int, float]:
    """The first index where the running sum of ``mass`` (float64, >= 0) reaches ``target`` (the last index when
    none does), and the sum before it. In two levels: sums of groups of GROUP, their running sums, then the
    running sums inside the one group that reaches it (NumPy's cumsum over the 16k buckets of a nucleus search
    cost ~50 us: each addition waits for the one before). ``mass`` of whole groups is read as it is (no padded
    copy)."""
    n = mass.size
    padded = mass
    if n % GROUP:
        padded = np.zeros(-(-n // GROUP) * GROUP)
        padded[:n] = mass
    groups = np.cumsum(padded.reshape(-1, GROUP).sum(axis=1))
    g = int(np.searchsorted(groups, target, side="left"))
    if g < groups.size:
        before = float(groups[g - 1]) if g else 0.0
        inside = before + np.cumsum(padded[g * GROUP:(g + 1) * GROUP])
        i = int(np.searchsorted(inside, target, side="left"))
        if i < GROUP and g * GROUP + i < n:
            return g * GROUP + i, float(inside[i - 1]) if i else before
    # no group reaches it, or the group's sum and its running sums rounded apart: all of them in one level
    upto = np.cumsum(mass)
    j = min(int(np.searchsorted(upto, target, side="left")), n - 1)
    return j, float(upto[j - 1]) if j else 0.0


def draft_pipeline(config: SamplingConfig, vocab_size: int, scratch: Scratch | None = None,
                   policy: str = "match") -> LogitsPipeline:
    """The pipeline a draft model samples with for a request under ``config``: the settings
    ``config.draft_sampling`` chooses for this vocabulary (its width rules are stated there). Exact whatever it
    chooses: the verifier sees the q each draft token was drawn from."""
    return LogitsPipeline(draft_sampling(config, policy, vocab_size), vocab_size, scratch)


def thin_head(row, pipe: "LogitsPipeline") -> bool:
    """Whether a dense row's head (the entries read but the last: each weighs at most the largest, 1) holds at
    most half of its mass, told from the graph's normalizer: a draw from it then needs the whole row more often
    than not. (A penalty lowers some weights, so the raw normalizer is a rough guide there: this only chooses
    where the row is computed, never what is drawn.)"""
    if pipe.config.top_p < 1.0:
        return False
    norm = row.norm() if hasattr(row, "norm") else None
    return norm is not None and norm[1] > THIN_TOTAL


WIDE = 1.01  # a nucleus whose mass (top_p times the total) is above WIDE * LAZY_TOP is wide (wide_nucleus)


def _wide(top_p: float, total: float) -> bool:
    """Whether a nucleus of top_p times a row's total (or a bound on it; weights at most 1) is wide: more mass
    than the LAZY_TOP entries a pass returns can hold, with WIDE's margin."""
    return top_p * total > WIDE * LAZY_TOP


def wide_nucleus(row, pipe: "LogitsPipeline", base: Sequence[int] = (), new: Sequence[int] = ()) -> bool:
    """Whether a top-p row's nucleus must reach past its largest entries read (LAZY_TOP of them), told from the
    graph's normalizer: each weight is at most the largest one's, 1, so those entries hold at most LAZY_TOP of
    the total, and where top_p of the total is more, the nucleus keeps tokens not read. LazyRow could settle
    only verdicts on such a row (LazyRow._nucleus), and flat rows like these rarely accept a draft: the residual
    draw then reads the row whole anyway, so it is read whole at once. For rows as wide as the vocabulary (the
    normalizer is then the host's total, within 1e-5). Where processors change the row (context ``base +
    new``), they only lower scores (a penalty above 1, bans): every weight of an id they leave alone is at least
    its raw one (the largest processed score is at most the raw largest), and each one they change loses at most
    its raw weight, at most 1, so the host's total is at least the normalizer less the number of ids they may
    change. Which path reads a row never changes what it gives: this only chooses where it is computed."""
    cfg = pipe.config
    if cfg.top_p >= 1.0 or cfg.repetition_penalty < 1.0 or not hasattr(row, "norm"):
        return False
    norm = row.norm()
    if norm is None or getattr(row, "width", None) != pipe.vocab_size:
        return False
    scale, z_graph, _ = norm
    if abs(scale * cfg.temperature - 1.0) > 1e-9 or not _wide(cfg.top_p, z_graph):
        return False
    if pipe.processes:
        z_graph -= sum(map(len, pipe.changed_ids(base, new)))  # (an id in two of the sets counted twice: less)
    return _wide(cfg.top_p, z_graph)


def _pick(lo: list[float], hi: list[float], x_lo: float, x_hi: float) -> int | None:
    """The index an inverse CDF picks (the first whose running sum exceeds x) when every entry i is only known
    to lie in [lo[i], hi[i]] and x in [x_lo, x_hi]: None unless the same index is picked whatever they are."""
    return _pick_pairs(zip(lo, hi), x_lo, x_hi)


def _pick_pairs(bounds, x_lo: float, x_hi: float) -> int | None:
    """``_pick`` over (lo, hi) pairs from an iterable (made as the walk goes: it stops where it is settled)."""
    low = high = before = 0.0
    for i, (a, b) in enumerate(bounds):
        low, high = low + a, high + b
        if low * (1 - 1e-12) > x_hi * (1 + 1e-12):
            return i if before * (1 + 1e-12) <= x_lo * (1 - 1e-12) else None
        before = high
    return None


class LazyRow:
    """A target row under settings without truncation, in verification. The verdict on a draft x needs only
    min(1, p(x) / q(x)), and p(x) = weight(x) / total needs the whole row only for the total; the graph computed
    each row's normalizer (sum_j exp((logit_j - max) / T), in float32: ``logits_norm``) in the pass. From it, the
    row's largest entries (its TopK) and the processors' changes (penalized and banned ids, on the host), p(x) is
    known to lie between two numbers; when the acceptance probabilities of both are above the uniform number
    drawn (or both at or below it), the verdict is the one the whole row gives, and the row is never
    exponentiated. Else (a uniform number at the edge, a row the bounds do not cover) ``dist()`` computes the
    distribution as ``LogitsPipeline.row`` does, and the verdict comes from it: the same verdict either way.

    The bounds are rigorous with room to spare, for the float32 results of both computations:
    - the host's weights exp2(float32(float32(s - max) * c)) within a relative W_SLACK + W_SLACK_Y |y| of
      2**y (y their exponent; the float32 roundings and exp2's error are below 1.3e-7 |y| and 2.4e-7) and
      TINY (float32 underflow: weights below 2**-126 are denormals or 0); its total (32-entry float32 block
      sums) within Z_SLACK of the sum of its weights;
    - the graph's normalizer: each term exp(float32(float32(l - max) * float32(1 / T))) within 4 ulp + 3 ulp
      |y| of the true one (so within 124 ulp of the whole sum: a term's |y| above 40 weighs under 1e-16), and
      a sum of n positive float32 numbers, in any order, within (n - 1) ulp of the exact one: (block - 1) +
      (width / block - 1) ulp for the graph's two-level sum;
    - the acceptance probability within a relative P_SLACK (its log and exp).
    """

    __slots__ = ("pipe", "row", "base", "new", "_dist", "_read", "_coarse", "_hd")
    W_SLACK, W_SLACK_Y, TINY, Z_SLACK, P_SLACK = 1e-5, 1e-6, 2.0 ** -99, 1e-5, 1e-9
    ULP = 2.0 ** -24
    MASS_WIDTH = 1e-3  # sum min(p, q) is taken from the bounds when they hold it this tightly (statistics only)

    def __init__(self, pipe: "LogitsPipeline", row, base: Sequence[int], new: Sequence[int]):
        self.pipe, self.row, self.base, self.new = pipe, row, base, new
        self._dist: Dist | None = None
        self._read = None  # (processed scores of the tokens read, max score, 1/T, the total's lower and upper bound,
        #                   the nucleus, the bound on entries not read)
        self._coarse = False  # the processors' changes to entries not read are bounded, not summed
        self._hd = ()  # the row's head (Dist.head_ids), from its largest entries: ``_head``

    def dist(self) -> Dist:
        """The row's distribution, as ``LogitsPipeline.row`` gives it (computed once)."""
        if self._dist is None:
            self._dist = self.pipe.row(self.row, self.base, self.new, inplace=True)
        return self._dist

    def prob(self, token: int) -> float:
        return self.dist().prob(token)

    def sample(self, rng: np.random.Generator) -> int:
        return self.draw(rng.random())

    def draw(self, u: float, more=None) -> int:
        """``Dist.draw`` of the row's distribution for ``u``, from the bounds where they settle it."""
        got = self._settle(lambda: self._lazy_draw(u))
        return self.dist().draw(u, more) if got is None else got

    def residual(self, draft: Dist, u: float, more=None) -> int:
        """``Dist.residual`` of the row's distribution for ``u``, from the bounds where they settle it."""
        got = self._settle(lambda: self._lazy_residual(draft, u) if draft.small else None)
        return self.dist().residual(draft, u, more) if got is None else got

    def _draw_bounds(self):
        """The bounds a draw reads (``_bounds``), NEVER where its pipeline's rows have no head (a draw takes them in
        another order: ``Dist.head_ids``), its nucleus may be wide by the row's total (``row`` draws those without
        one) or, without top-p, the row may be thin (``Dist._thin``: drawn without one where verification hands
        further uniform numbers), None where the row gives none."""
        if not self.pipe._lazy_rows():
            return self.NEVER
        read = self._bounds()
        top_p = self.pipe.config.top_p
        if isinstance(read, tuple) and (_wide(top_p, read[4]) if top_p < 1.0 else read[4] > THIN_TOTAL):
            return self.NEVER  # (read[4]: the total's upper bound, finite)
        return read

    def _lazy_draw(self, u: float) -> int | None:
        read = self._draw_bounds()
        if not isinstance(read, tuple):
            return read
        scores, top, inv_t, z_lo, z_hi, kept, bound = read
        if kept is not None:  # a nucleus: inverse CDF over p = weight / the kept weights' sum (summing to 1), the
            # head first: settled where it lands there, else None
            ids, lo, hi = self._head_p(kept, scores, top, inv_t)
            i = _pick(lo, hi, u * (1 - 1e-9), u * (1 + 1e-9))
            return None if i is None else ids[i]
        return self._pick_head({}, top, inv_t, scores, u * z_lo, u * z_hi)

    def _head(self) -> list[int]:
        """The row's head (``Dist.head_ids``), from the largest entries read."""
        if isinstance(self._hd, tuple):
            self._hd = _head_of(*self._hd, self.pipe.vocab_size) if self._hd else []
        return self._hd

    def _head_p(self, kept, scores: dict, top: float, inv_t: float) -> tuple[list, list, list]:
        """The head's ids and bounds of their p in a nucleus, as ``_p_bounds`` gives them: 0 outside one settled
        among the entries read; between 0 and the upper bound outside the tokens one that reaches past them is
        known to keep (a penalized token the head holds may score below the bound)."""
        nucleus, s_lo, s_hi, whole = kept
        ids, lo, hi = self._head(), [], []
        for t in ids:
            s = scores[t]
            inside = t in nucleus
            if (whole and not inside) or s == -math.inf:
                lo.append(0.0)
                hi.append(0.0)
                continue
            a, b = self._w_bounds(s, top, inv_t)
            lo.append(a / s_hi if inside else 0.0)
            hi.append(b / s_lo)
        return ids, lo, hi

    def _pick_head(self, changed: dict, top: float, inv_t: float, scores: dict, x_lo: float, x_hi: float):
        """``_pick`` over the head ``draw_weights`` draws first (``Dist.head_ids``, in its order), the weights
        bounded as it goes (``changed``: bounds that replace some weights): the token, or None where the bounds
        do not settle it or the draw reaches past the head (then it needs the whole row)."""
        if x_lo > (LAZY_TOP - 1) * (1 + self.W_SLACK + 1e-6):
            return None  # past any mass the head can hold (each weight is at most the largest, 1): a flat row
        w_bounds, head = self._w_bounds, self._head()
        bounds = (changed.get(t) or (w_bounds(scores[t], top, inv_t) if scores[t] > -math.inf else (0.0, 0.0))
                  for t in head)
        i = _pick_pairs(bounds, x_lo, x_hi)
        return None if i is None else head[i]

    def _lazy_residual(self, draft: Dist, u: float) -> int | None:
        """``verify.residual_draw`` for a small q, from the bounds (None where they do not settle it)."""
        read = self._draw_bounds()
        if not isinstance(read, tuple):
            return read
        scores, top, inv_t, z_lo, z_hi, kept, bound = read
        if kept is not None:  # a nucleus: r = max(p - q, 0), the head first; its sum R = 1 - sum_x min(p, q)
            p = self._p_bounds(draft.tokens)  # (the kept sum of a large nucleus in float32 blocks: 1e-5 of room)
            if p is None:
                return None
            m_lo = math.fsum(min(a, q) for (a, _), q in zip(p, draft.plist))
            m_hi = math.fsum(min(b, q) for (_, b), q in zip(p, draft.plist))
            r_lo, r_hi = (1.0 - m_hi) * (1 - 1e-5) - 1e-12, (1.0 - m_lo) * (1 + 1e-5) + 1e-12
            if r_hi <= RESIDUAL_EPS:
                return self._lazy_draw(u)
            if not r_lo > RESIDUAL_EPS:
                return None
            q = dict(zip(draft.tokens, draft.plist))
            ids, lo, hi = self._head_p(kept, scores, top, inv_t)
            lo = [max(a - q.get(t, 0.0), 0.0) * (1 - 1e-6) for t, a in zip(ids, lo)]
            hi = [max(b - q.get(t, 0.0), 0.0) * (1 + 1e-6) + 1e-15 * b for t, b in zip(ids, hi)]
            i = _pick(lo, hi, u * r_lo, u * r_hi)
            return None if i is None else ids[i]
        # dense p: q's tokens get weights (p - min(p, q')) * total (q' = q normalized), float32
        if u * (z_lo - len(draft.tokens) * 1.001) > (LAZY_TOP - 1) * 1.001:
            return self.NEVER  # the draw lands past the head whatever q takes out (each weight is at most 1)
        p = self._p_bounds(draft.tokens)  # (also reads the row's scores of q's tokens)
        q_sum = math.fsum(draft.plist)
        qn = [x / q_sum for x in draft.plist]
        overlap_lo = math.fsum(min(a, q) for (a, _), q in zip(p, qn))
        overlap_hi = math.fsum(min(b, q) for (_, b), q in zip(p, qn))
        if not 1.0 - overlap_hi * (1 + 1e-12) > RESIDUAL_EPS:  # the residual may be noise: p drawn from instead
            return self._lazy_draw(u) if 1.0 - overlap_lo * (1 - 1e-12) <= RESIDUAL_EPS else None
        changed, w_s, r_s = {}, [0.0, 0.0], [0.0, 0.0]
        for t, q in zip(draft.tokens, qn):
            s = scores.get(t)
            w = self._w_bounds(s, top, inv_t) if s is not None and s > -math.inf else (0.0, 0.0)
            r = (max(0.0, w[0] - q * z_hi) * (1 - 1e-6), max(0.0, w[1] - q * z_lo) * (1 + 1e-6) + self.TINY)
            changed[t] = r
            w_s[0] += w[0]
            w_s[1] += w[1]
            r_s[0] += r[0]
            r_s[1] += r[1]
        e = 33 * self.ULP  # a 32-entry float32 block sum's error, and then some
        total_lo = (z_lo / (1 + e) - w_s[1] + r_s[0]) * (1 - e)
        total_hi = (z_hi / (1 - e) - w_s[0] + r_s[1]) * (1 + e)
        if not total_lo > 0:
            return None
        return self._pick_head(changed, top, inv_t, scores, u * total_lo, u * total_hi)

    def accepts(self, token: int, q: float, u: float) -> bool:
        got = self._settle(lambda: self._lazy_accepts(token, q, u))
        return self.dist().accepts(token, q, u) if got is None else got

    NEVER = -1  # what an attempt returns when no bounds could settle it (it needs the whole row)

    def _settle(self, attempt):
        """``attempt()`` from the bounds, once more from exact ones where it did not settle and the bounds were
        coarse (``_refine``); None when the whole row must decide."""
        if self._dist is None:
            got = attempt()
            if got is None and self._refine():
                got = attempt()
            if got is not None and got is not self.NEVER:
                self.pipe.lazy_settled += 1
                return got
        self.pipe.lazy_read += 1
        return None

    def _lazy_accepts(self, token: int, q: float, u: float) -> bool | None:
        bounds = self._p_bounds([token])
        if bounds is None:
            return None
        lo, hi = (acceptance_probability(p, q) for p in bounds[0])
        if u < lo * (1.0 - self.P_SLACK) or u >= hi * (1.0 + self.P_SLACK):
            return u < lo * (1.0 - self.P_SLACK)
        return None

    def min_mass(self, other: Dist) -> float:
        """sum_x min(p(x), q(x)) (statistics: the midpoint of its bounds when they are MASS_WIDTH apart or less).
        First without q's lightest tokens, together at most MASS_WIDTH / 4 of it (they add between 0 and their q:
        p is not read there; most of a draft's 64 tokens carry almost none of its mass), then with all of them."""
        if self._dist is None and other.small:
            lean = _heavy(other.tokens, other.plist, self.MASS_WIDTH / 4)
            for tokens, plist, tail in (lean, (other.tokens, other.plist, 0.0)):
                for _ in range(2):
                    bounds = self._p_bounds(tokens)
                    if bounds is not None:
                        lo = math.fsum(min(b[0], q) for b, q in zip(bounds, plist))
                        hi = math.fsum(min(b[1], q) for b, q in zip(bounds, plist)) + tail
                        if hi - lo <= self.MASS_WIDTH:
                            return 0.5 * (lo + hi)
                    if bounds is None or not self._refine():
                        break
        return self.dist().min_mass(other)

    def _bounds(self):
        """Read the row's largest entries and normalizer once: None when they do not bound it (then the whole
        row is read)."""
        if self._read is None:
            self._read = False
            norm = self.row.norm() if hasattr(self.row, "norm") else None
            if norm is not None:
                self._read = self._from_norm(*norm) or False
        return self._read or None

    def _refine(self) -> bool:
        """Where the bounds took the processors' changes to entries not read as a range, sum them exactly (one
        NumPy pass over the changed ids) and bound again: True when that was done."""
        if not (self._coarse and self._read):
            return False
        self._coarse = False
        self._read = self._from_norm(*self.row.norm(), exact=True) or False
        return True

    def _from_norm(self, scale: float, z_graph: float, block: int, exact: bool = False):
        pipe = self.pipe
        inv_t = 1.0 / pipe.config.temperature
        if not (math.isfinite(z_graph) and z_graph >= 1.0 and abs(scale - inv_t) <= 1e-12 * inv_t):
            return None
        found = self.row.top(LAZY_TOP)
        values = found[1]
        if not len(values):
            return None
        m = float(values[0])  # the largest logit of the graph's row: the normalizer's reference
        raw_read = dict(zip(*(x.tolist() if isinstance(x, np.ndarray) else list(x) for x in found[:2]))) \
            if pipe.processes and not exact else None  # (the raw scores, as read before processing)
        read = pipe._read_top(self.row, 0, self.base, self.new, found=found)
        if read is None:
            return None
        tok, val, bound = read
        top = max(val, default=-math.inf)
        if not (math.isfinite(top) and top > bound and m >= top):  # the largest processed score is among those read
            return None
        scores = dict(zip(tok, val))  # processed scores of the tokens read (weights are bounded when asked for)
        # the graph's sum covers the raw row over its width: take out columns past the vocabulary and put the
        # processors' changes in (float64 on the host, exact to ~1e-15)
        width = self.row.width if hasattr(self.row, "width") else self.row.numpy().shape[0]
        self._hd = (found[0], values, width)  # (the head: made from them when a draw first needs it)
        extra = changed = changed_raw = unread = 0.0
        if width > pipe.vocab_size:
            row = self.row.numpy()
            extra = float(np.exp((row[pipe.vocab_size:].astype(np.float64) - m) * inv_t).sum())
        if pipe.processes:
            if exact:
                changed_raw, changed = self._changed_mass(m, inv_t)
            else:  # the changes among the entries read; each other changed id lowers the sum by 0 to its raw term
                changed_raw, changed, unread = self._changed_read(raw_read, scores, m, inv_t, bound)
                self._coarse = unread > 0
        z_bounds = (z_graph, block, width, m, top, inv_t, extra)
        lo, hi = self._z_bounds(*z_bounds, changed_raw, changed, unread)
        if not (lo > 0 and math.isfinite(hi)):
            return None
        kept = None
        if pipe.config.top_p < 1.0:
            order = self._top_p_order(scores, bound)
            kept = self._nucleus(order, top, inv_t, lo, hi, bound)
            if kept is None and self._coarse:  # bounds from the exact changes may settle the cut (the entries read
                self._coarse = False          # and their order stay as they are)
                changed_raw, changed = self._changed_mass(m, inv_t)
                lo, hi = self._z_bounds(*z_bounds, changed_raw, changed, 0.0)
                if not (lo > 0 and math.isfinite(hi)):
                    return None
                kept = self._nucleus(order, top, inv_t, lo, hi, bound)
            if kept is None:
                return None
        return scores, top, inv_t, lo, hi, kept, bound

    def _z_bounds(self, z_graph: float, block: int, width: int, m: float, top: float, inv_t: float, extra: float,
                  changed_raw: float, changed: float, unread: float) -> tuple[float, float]:
        """Bounds of the host's total from the graph's normalizer ``z_graph`` (reference ``m``, summed in blocks
        of ``block`` over ``width`` columns): less the columns past the vocabulary (``extra``) and the processors'
        changes (``changed``, of raw terms ``changed_raw``; ``unread``: at most this much more among ids not read),
        moved to the host's reference ``top``, with every rounding allowance of the class docstring."""
        u = self.ULP
        delta = ((block - 1) + (-(-width // block) - 1) + 124) * u * 1.01 + width * 2e-16
        slack = 1e-12 * (extra + 2 * changed_raw + unread)
        shift = self._shift(m, top, inv_t)
        lo = (z_graph / (1 + delta) - extra - changed - unread - slack) * shift * (1 - 1e-12)
        hi = (z_graph / (1 - delta) - extra - changed + slack) * shift * (1 + 1e-12)
        host = self.Z_SLACK + self.W_SLACK + self.W_SLACK_Y * 40 + 32 * u
        return lo * (1 - host) - width * self.TINY, hi * (1 + host) + width * self.TINY

    def _top_p_order(self, scores: dict, bound: float) -> tuple[list, list, int]:
        """The tokens read that score above ``bound`` in the top-p order (score, then id, both descending): (their scores, their
        ids, how many)."""
        values = list(scores.values())
        if not self.pipe.processes and _descending(values):
            # the raw entries in the strictly descending order read: already the top-p order
            toks, n = list(scores), len(values)
            while n and values[n - 1] <= bound:
                n -= 1
            return values, toks, n
        items = sorted((-v, -t) for t, v in scores.items() if v > bound)
        return [-v for v, _ in items], [-t for _, t in items], len(items)

    def _nucleus(self, order: tuple, top: float, inv_t: float, z_lo: float, z_hi: float, bound: float):
        """Top-p over the tokens read (``order``, as ``_top_p_order`` gives them): (the kept ones, bounds of the
        kept weights' sum, True) when the bounds settle the cut among them (the mass before a token, in the top-p
        order, decidedly below top_p, or the mass through it decidedly at or above). The probability of a kept
        token is then its weight over that sum (``LogitsPipeline._top_p`` renormalizes the kept probabilities; the
        total cancels). Only tokens scoring above ``bound`` are in their final order (a token not read, or
        penalized, is at most it).

        Where the nucleus decidedly reaches past every token read above ``bound``: (those tokens, bounds of
        the kept sum, False). They are all kept, and so is at least one token scoring at most ``bound``; the
        last one kept is such a token, so the kept sum S, the first running sum to reach top_p times the total,
        lies in [top_p * total, top_p * total + the weight at ``bound``]. A token's p is then its weight over S
        if it is kept and 0 if not: between 0 and its weight over the lower bound of S for tokens outside the
        set (whether they are kept is not known). None where the cut is not settled."""
        values, toks, n = order
        rest = self._w_bounds(bound, top, inv_t)[1] if bound > -math.inf else 0.0
        top_p = self.pipe.config.top_p
        w_bounds = self._w_bounds
        c_lo = c_hi = 0.0
        for j in range(n):  # (weights bounded as the cut is searched: it comes early in most rows)
            w_lo, w_hi = w_bounds(values[j], top, inv_t)
            c_lo, c_hi = c_lo + w_lo, c_hi + w_hi
            if c_hi * (1 + 1e-12) / z_lo < top_p:
                continue  # the next token is kept
            if c_lo * (1 - 1e-12) / z_hi < top_p:
                return None  # the cut is not settled here
            after = max(w_bounds(values[j + 1], top, inv_t)[1] if j + 1 < n else 0.0, rest)
            if not after < w_lo:
                return None  # the order at the cut is not settled (weights within each other's bounds)
            return set(toks[:j + 1]), c_lo * (1 - 1e-12), c_hi * (1 + 1e-12), True
        if not n:
            return None
        # (the host sums up to a vocabulary of terms in float64 for the cut and for S: 1e-9 covers their rounding)
        return set(toks[:n]), top_p * z_lo * (1 - 1e-9), (top_p * z_hi + rest) * (1 + 1e-9), False

    @staticmethod
    def _shift(m: float, top: float, inv_t: float) -> float:
        """The factor from the graph's reference (the raw row's largest logit ``m``) to the host's (the largest
        processed score ``top``)."""
        return math.exp((m - top) * inv_t)

    def _changed_read(self, raw: dict, scores: dict, m: float, inv_t: float, bound: float):
        """The processors' changes to the normalizer (reference ``m``) among the entries read (their raw terms,
        and those less the processed terms), and a bound on the changes to the others: at most the raw term at
        ``bound`` for each other id the penalty or a ban may change. Plain Python."""
        seen, new, banned = self._changed_ids()
        raw_sum = change = 0.0
        hits = 0
        for t, s in scores.items():
            if t in seen or t in new or t in banned:
                hits += 1
                r = math.exp((raw[t] - m) * inv_t)
                raw_sum += r
                change += r - (math.exp((s - m) * inv_t) if s > -math.inf else 0.0)
        others = len(seen) + len(new) + len(banned) - hits  # (an id in two of them counted twice: more room)
        return raw_sum, change, others * math.exp((bound - m) * inv_t) if others and bound > -math.inf else 0.0

    def _changed_ids(self) -> tuple:
        return self.pipe.changed_ids(self.base, self.new)

    def _changed_mass(self, m: float, inv_t: float) -> tuple[float, float]:
        """What the processors change in the normalizer (reference ``m``): the raw terms of the ids they change,
        and those less the processed terms (float64)."""
        row = self.row.numpy()
        ids, new_values = self.pipe._changes(row[:self.pipe.vocab_size], self.base, self.new)
        if not ids.size:  # (each id once)
            return 0.0, 0.0
        raw = float(np.exp((row[ids].astype(np.float64) - m) * inv_t).sum())
        return raw, raw - float(np.exp((new_values.astype(np.float64) - m) * inv_t).sum())

    def _p_bounds(self, tokens: Sequence[int]) -> list[tuple[float, float]] | None:
        """Bounds of p(t) for each token (as the whole row's distribution gives it), None where unbounded."""
        read = self._bounds()
        if read is None:
            return None
        scores, top, inv_t, z_lo, z_hi, kept, _ = read
        whole = True
        if kept is not None:  # a nucleus: p = weight / the kept weights' sum, 0 outside it (or, outside one that
            kept, z_lo, z_hi, whole = kept  # reaches past the tokens read, 0 or that: LazyRow._nucleus)
        vocab = self.pipe.vocab_size
        miss = [t for t in tokens if t not in scores and 0 <= t < vocab]
        if miss:  # tokens below the largest entries: their raw scores from the row, processed here
            seen, new, banned = self._changed_ids()
            t32 = self.pipe._theta32
            for t, r in zip(miss, self.row.numpy()[miss].tolist()):
                if t in banned:
                    r = -math.inf
                elif t in seen or t in new:  # penalized as a float32 row is
                    r = array("f", [r * t32 if r < 0 else r / t32])[0]
                scores[t] = r
        out = []
        for t in tokens:
            s = scores.get(t)
            if s is None or s == -math.inf or (kept is not None and whole and t not in kept):
                out.append((0.0, 0.0))  # outside the vocabulary or the nucleus, or banned: exactly 0 there too
                continue
            w_lo, w_hi = self._w_bounds(s, top, inv_t)
            out.append((w_lo / z_hi if kept is None or t in kept else 0.0, w_hi / z_lo))
        return out

    def _w_bounds(self, score: float, top: float, inv_t: float) -> tuple[float, float]:
        """Bounds of the host's weight of a processed score (not banned)."""
        y = (score - top) * inv_t * LOG2_E
        w = 2.0 ** y if y > -1100 else 0.0
        d = self.W_SLACK + self.W_SLACK_Y * abs(y)
        return max(0.0, w * (1.0 - d) - self.TINY), w * (1.0 + d) + self.TINY


def _heavy(tokens: list[int], plist: list[float], budget: float) -> tuple[list[int], list[float], float]:
    """The tokens of a small distribution without its lightest ones, which together hold at most ``budget``
    (tokens, probabilities, and the mass left out)."""
    order = sorted(range(len(plist)), key=plist.__getitem__)
    tail = 0.0
    for n, j in enumerate(order):
        if tail + plist[j] > budget:
            keep = order[n:]
            return [tokens[j] for j in keep], [plist[j] for j in keep], tail
        tail += plist[j]
    return [], [], tail


def _descending(values: list[float]) -> bool:
    """Whether scores are strictly descending (no ties): then they are in the top-p order (-score, -id) as they
    stand."""
    return all(map(operator.gt, values, islice(values, 1, None)))


def _total(weights: np.ndarray, blocks: np.ndarray | None = None) -> float:
    """Sum of float32 weights, accumulated per block in float32 (BLAS: ``block_sums``, or the ``blocks`` given)
    and across blocks in float64."""
    cols = weights.size // BLOCK_ROWS
    if cols < 2:
        return float(weights.sum(dtype=np.float64))
    block = block_sums(weights) if blocks is None else blocks
    total = float(block.sum(dtype=np.float64))
    return total + float(weights[cols * BLOCK_ROWS:].sum(dtype=np.float64)) if weights.size % BLOCK_ROWS else total


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of tokens whose cumulative probability reaches top_p (a dense vector)."""
    pipe = LogitsPipeline(SamplingConfig(do_sample=True, top_p=top_p), probs.shape[0])
    ids = np.flatnonzero(probs > 0)
    return pipe._top_p(ids, probs[ids] / probs[ids].sum()).dense(probs.shape[0])
