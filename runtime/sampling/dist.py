"""Distributions a row is sampled from (Dist: sparse ids + probabilities, or dense weights), the residual
max(0, p - q), and what verification asks of a target row's distribution (TargetDist: a Dist, or a LazyRow)."""
from __future__ import annotations

import bisect
import math
from typing import Protocol

import numpy as np

from .kernels import (LAZY_TOP, LEAN_MAX, RESIDUAL_EPS, THIN_TOTAL, inverse_cdf, weights_total,
                      block_sums, draw_weights, head_first, head_first_lists, inverse_cdf_list, min_mass_lists,
                      sample_weights, acceptance_probability)


# -- how a row is drawn from: the one rule Dist's draws, LazyRow's bounds and the pipeline's reading all follow --
WIDE = 1.01  # a nucleus whose mass (top_p times the total) is above WIDE * LAZY_TOP is wide


def nucleus_is_wide(top_p: float, total: float) -> bool:
    """Whether a nucleus of top_p times a row's total (or a bound on it; weights at most 1) is wide: more mass
    than the LAZY_TOP entries a pass returns can hold, with WIDE's margin."""
    return top_p * total > WIDE * LAZY_TOP


def is_thin(total: float) -> bool:
    """Whether a dense row (no truncation) of this total (weights at most 1) is thin: its largest LAZY_TOP - 1
    weights hold at most half of it."""
    return total > THIN_TOTAL


def drawn_head_first(top_p: float, total: float) -> bool:
    """Whether draws from a row of this total (or an upper bound on it) take its head first (``Dist.head_ids``):
    neither a wide nucleus (top-p) nor a thin dense row (no top-p; drawn in block order, its residual by
    rejection, where further uniform numbers come). A property of the row alone, so every path that draws from
    it — the whole row (Dist), its bounds (LazyRow) — keeps one way from uniform numbers to tokens."""
    return not nucleus_is_wide(top_p, total) if top_p < 1.0 else not is_thin(total)


class TargetDist(Protocol):
    """What verification (``verify.verify_dists``) and the loop ask of a target row's distribution p: a Dist, or
    a LazyRow that answers from bounds where they settle the answer and from its Dist otherwise — the same
    answer either way."""

    __slots__ = ()

    def dist(self) -> Dist:
        """The distribution itself."""

    def prob(self, token: int) -> float:
        """p(token)."""

    def accepts(self, token: int, q: float, u: float) -> bool:
        """Whether a draft ``token`` drawn with probability ``q`` passes for the uniform number ``u``:
        u < min(1, p / q)."""

    def draw(self, u: float, more=None) -> int:
        """A token drawn from p by the uniform number ``u`` (``more()`` gives another where one is needed)."""

    def sample(self, rng: np.random.Generator) -> int:
        """A token drawn from p with ``rng``."""

    def residual(self, draft: Dist, u: float, more=None) -> int:
        """A token drawn from normalize(max(0, p - q)) (q: ``draft``) by ``u``."""

    def min_mass(self, other: Dist) -> float:
        """sum_x min(p(x), q(x)): the probability that a draft from ``other`` is accepted."""


class Dist(TargetDist):
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
        self.blocks = blocks  # a dense row's block sums as ``weights_total`` made them (``block_sums``), or None

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
            return int(ids[inverse_cdf(probs, u)])
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
        """A thin dense row (``is_thin``; ``drawn_head_first`` is false for it). Given further uniform numbers, such a
        row is drawn from in block order throughout (no head first: a draw would rarely end in it) and its
        residual by rejection."""
        return self.tokens is None and self._ids is None and is_thin(self.total)

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
            return draw_weights(weights, weights_total(weights, blocks), u, head, blocks)
        finally:
            weights[ids] = was
    width = max(x.weights.size if not x.sparse else int(x.ids.max()) + 1 for x in (target, draft))
    r = residual(target.dense(width), draft.dense(width))
    cdf = np.cumsum(r)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), r.shape[0] - 1)


