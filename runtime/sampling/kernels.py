"""Array kernels of the sampling rules: block sums, top candidates, inverse-CDF draws, heads, the nucleus search's running sums.

Speed. A row is 32k-152k floats and a round touches up to 2 gamma + 1 rows, so no step may sort or
exponentiate in float64 over the whole vocabulary. A row of width W is viewed as [BLOCK_ROWS, W / BLOCK_ROWS]:
the largest entries are found through the maxima of its blocks (columns), sums go per block in float32 (BLAS)
then across blocks in float64, and a draw takes one uniform number (over blocks, then within one).
"""
from __future__ import annotations

import bisect
from itertools import accumulate, islice
import math
import operator

import numpy as np

BLOCK_ROWS = 32       # a row of width W is viewed as [32, W / 32]; a "block" is one column of it
SPARSE_MAX = 4096     # a nucleus of at most this many tokens is kept as ids + probabilities
LAZY_TOP = 64         # largest entries a row under settings without truncation brings for verification (LazyRow)
LEAN_MAX = 256        # a top-k row of at most this many candidates is finished in plain Python (a small Dist)
THIN_TOTAL = 2 * (LAZY_TOP - 1)  # a dense row of a larger total is thin (Dist._thin): its head holds at most half
LOG2_E = 1.4426950408889634  # 1 / ln 2
HIST_SHIFT = 16       # float32 bits >> 16: sign, exponent and 7 mantissa bits name a bucket of the nucleus search
BUCKETS = 128 * 128   # buckets of weights in [0, 1] (1.0's is 0x3F80), whole groups of GROUP for mass_reaching


NO_IDS, NO_SCORES = np.zeros(0, np.int64), np.zeros(0, np.float32)  # (read only)
_ONES = np.ones(BLOCK_ROWS, dtype=np.float32)  # block sums as a product with it (BLAS)
NO_IDS.flags.writeable = NO_SCORES.flags.writeable = _ONES.flags.writeable = False


def acceptance_probability(p_token: float, q_token: float) -> float:
    """min(1, p/q) computed in log space; a token q gives no mass is rejected."""
    if q_token <= 0.0 or p_token <= 0.0:
        return 0.0
    return min(1.0, math.exp(math.log(p_token) - math.log(q_token)))


def inverse_cdf_list(plist: list[float], u: float) -> int:
    """``inverse_cdf`` over a Python list (the same running sums, left to right, so the same draw for the same
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


def inverse_cdf(weights: np.ndarray, u: float) -> int:
    cdf = np.cumsum(weights)
    return min(int(np.searchsorted(cdf, u * cdf[-1], side="right")), weights.size - 1)



RESIDUAL_EPS = 1e-12   # below this mass the residual max(0, p - q) is numerical noise: p == q
HEAD_MIN = 2.0 ** -10  # a dense row without a head given: weights at least this (the largest is 1) drawn first


def draw_weights(weights: np.ndarray, total: float, u: float, head: list[int] | None = None,
                 blocks: np.ndarray | None = None) -> int:
    """Inverse-CDF draw from float32 ``weights`` (largest 1, sum ``total`` as ``weights_total`` gives it) for ``u``: first
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


def restored_head(raw: np.ndarray, ids: np.ndarray, was: np.ndarray, vocab: int) -> list[int]:
    """``array_head`` of a row whose entries ``ids`` were changed in place from ``was``."""
    row = raw.copy()
    row[ids] = was
    return array_head(row, vocab)


def top_head(row, vocab: int) -> list[int]:
    """``array_head`` of a row that brings its largest entries (``top``: the graph's TopK, or the device's)."""
    ids, values, _ = row.top(LAZY_TOP)
    return head_of(ids, values, row.width, vocab)


def head_of(ids, values, width: int, vocab: int) -> list[int]:
    """``array_head`` from a row's largest entries (at least LAZY_TOP of them where the row has more, descending)."""
    ids = ids.tolist() if isinstance(ids, np.ndarray) else ids
    values = values.tolist() if isinstance(values, np.ndarray) else values
    kth = values[LAZY_TOP - 1] if width > LAZY_TOP else -math.inf
    n = 0
    while n < len(values) and values[n] > kth:
        n += 1
    if is_descending(values[:n]) and all(t < vocab for t in ids[:n]):  # (no ties: already largest first)
        return ids[:n]
    return [t for _, t in sorted((-v, t) for t, v in zip(ids[:n], values[:n]) if t < vocab)]


def sample_weights(weights: np.ndarray, u: float, blocks: np.ndarray | None = None) -> int:
    """Inverse-CDF draw over float32 ``weights`` in block order: first a block by the block sums (``blocks``
    where the caller has them, as ``block_sums`` made them), then within it (-1 where no weight is positive)."""
    width = weights.size
    cols = width // BLOCK_ROWS
    if cols < 2:
        wide = weights.astype(np.float64)
        return inverse_cdf(wide, u) if wide.sum() > 0 else -1
    body = weights[:cols * BLOCK_ROWS].reshape(BLOCK_ROWS, cols)
    block = block_sums(weights) if blocks is None else blocks
    tail = weights[cols * BLOCK_ROWS:].astype(np.float64)
    cum = np.cumsum(block, dtype=np.float64)
    tail_sum = tail.sum()
    if not cum[-1] + tail_sum > 0:
        return -1
    x = u * (cum[-1] + tail_sum)
    if x >= cum[-1] and tail.size and tail_sum > 0:
        return cols * BLOCK_ROWS + inverse_cdf(tail, (x - cum[-1]) / tail_sum)
    j = min(int(np.searchsorted(cum, x, side="right")), cols - 1)
    while block[j] <= 0:  # rounding pushed x past the last block with mass
        j -= 1
    inside = body[:, j].astype(np.float64)
    r = (x - (cum[j - 1] if j else 0.0)) / inside.sum()
    return inverse_cdf(inside, min(max(r, 0.0), 1.0)) * cols + j


def block_sums(weights: np.ndarray) -> np.ndarray | None:
    """The float32 sums of a row's blocks (BLAS; the columns of its [BLOCK_ROWS, width / BLOCK_ROWS] view), which
    ``weights_total`` adds up and a draw in block order searches; None for a row narrower than two blocks."""
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


GROUP = 128  # buckets per group in mass_reaching


def mass_reaching(mass: np.ndarray, target: float) -> tuple[int, float]:
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


def heavy_prefix(tokens: list[int], plist: list[float], budget: float) -> tuple[list[int], list[float], float]:
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


def is_descending(values: list[float]) -> bool:
    """Whether scores are strictly descending (no ties): then they are in the top-p order (-score, -id) as they
    stand."""
    return all(map(operator.gt, values, islice(values, 1, None)))


def weights_total(weights: np.ndarray, blocks: np.ndarray | None = None) -> float:
    """Sum of float32 weights, accumulated per block in float32 (BLAS: ``block_sums``, or the ``blocks`` given)
    and across blocks in float64."""
    cols = weights.size // BLOCK_ROWS
    if cols < 2:
        return float(weights.sum(dtype=np.float64))
    block = block_sums(weights) if blocks is None else blocks
    total = float(block.sum(dtype=np.float64))
    return total + float(weights[cols * BLOCK_ROWS:].sum(dtype=np.float64)) if weights.size % BLOCK_ROWS else total


