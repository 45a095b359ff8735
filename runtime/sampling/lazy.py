"""LazyRow: a target row verified from its normalizer and largest entries, read whole only where they do not settle it."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple, Sequence

import numpy as np

from .dist import Dist, TargetDist, drawn_head_first
from .kernels import (LAZY_TOP, RESIDUAL_EPS, LOG2_E, is_descending, head_of, heavy_prefix, acceptance_probability)
from .processors import penalized32

if TYPE_CHECKING:
    from .rules import RowRules

class RowBounds(NamedTuple):
    """What a LazyRow knows of its row from the largest entries and the normalizer (``LazyRow._bounds``)."""

    scores: dict           # processed scores of the tokens read
    top: float             # the largest processed score
    inv_t: float           # 1 / temperature
    z_lo: float            # the total's lower bound ...
    z_hi: float            # ... and upper bound (finite)
    kept: object           # the nucleus (top-p), or None
    bound: float           # every entry not read scores at most this


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


class LazyRow(TargetDist):
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

    def __init__(self, pipe: "RowRules", row, base: Sequence[int], new: Sequence[int]):
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
        if not self.pipe.lazy_rows():
            return self.NEVER
        read = self._bounds()
        if read is not None and not drawn_head_first(self.pipe.config.top_p, read.z_hi):
            return self.NEVER  # (the total's upper bound, finite)
        return read

    def _lazy_draw(self, u: float) -> int | None:
        read = self._draw_bounds()
        if read is None or read is self.NEVER:
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
            self._hd = head_of(*self._hd, self.pipe.vocab_size) if self._hd else []
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
        if read is None or read is self.NEVER:
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

    NEVER = object()  # what an attempt returns when no bounds could settle it (it needs the whole row)

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
            lean = heavy_prefix(other.tokens, other.plist, self.MASS_WIDTH / 4)
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
            norm = self.row.norm()
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
        read = pipe.read_top(self.row, 0, self.base, self.new, found=found)
        if read is None:
            return None
        tok, val, bound = read
        top = max(val, default=-math.inf)
        if not (math.isfinite(top) and top > bound and m >= top):  # the largest processed score is among those read
            return None
        scores = dict(zip(tok, val))  # processed scores of the tokens read (weights are bounded when asked for)
        # the graph's sum covers the raw row over its width: take out columns past the vocabulary and put the
        # processors' changes in (float64 on the host, exact to ~1e-15)
        width = self.row.width
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
        return RowBounds(scores, top, inv_t, lo, hi, kept, bound)

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
        if not self.pipe.processes and is_descending(values):
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
        token is then its weight over that sum (``LogitsPipeline.top_p_dist`` renormalizes the kept probabilities; the
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
        return self.pipe.processors.changed_ids(self.base, self.new)

    def _changed_mass(self, m: float, inv_t: float) -> tuple[float, float]:
        """What the processors change in the normalizer (reference ``m``): the raw terms of the ids they change,
        and those less the processed terms (float64)."""
        row = self.row.numpy()
        ids, new_values = self.pipe.processors.changes(row[:self.pipe.vocab_size], self.base, self.new)
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
            t32 = self.pipe.processors.theta32
            for t, r in zip(miss, self.row.numpy()[miss].tolist()):
                if t in banned:
                    r = -math.inf
                elif t in seen or t in new:  # penalized as a float32 row is
                    r = penalized32(r, t32)
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


