"""The logits pipeline: raw logits -> processed scores -> the distribution sampled from.

One implementation serves target and draft, so that the draft probabilities handed to the verifier are exactly
the ones the draft sampled from. Order and semantics follow Hugging Face `generate`: repetition penalty and
banned words (processors), then temperature, top-k, top-p (warpers). ``row`` returns a ``Dist``: with top-k (or
a nucleus that is small) the largest entries are found through block maxima and the distribution is kept as
token ids with float64 probabilities; without truncation it is the float32 weights exp((s - max)/T) over the
vocabulary and their float64 total. Rows a pass hands out as ``Row`` (with their largest entries) are read
through those wherever they settle the result.
"""
from __future__ import annotations

import bisect
from itertools import accumulate
import math
import operator
from typing import Sequence

import numpy as np

from ..config import SamplingConfig, draft_sampling
from .dist import Dist
from .kernels import (BUCKETS, HIST_SHIFT, LAZY_TOP, LEAN_MAX, LOG2_E, SPARSE_MAX, NO_IDS, NO_SCORES, is_descending,
                      mass_reaching, restored_head, weights_total, array_head, block_sums, top_candidates, top_head)
from .dist import nucleus_is_wide
from .lazy import LazyRow
from .rules import read_lazily
from .rows import Row, Rows
from .processors import Processors
from .scratch import Scratch

class LogitsPipeline:
    """Applies a SamplingConfig row by row, each row with its own context.

    Row ``i`` of a block of logits is conditioned on ``base + new[:i]``: the
    committed tokens plus the draft tokens fed before that position. A block of
    fewer rows (a draft step's one row) ends where ``new`` ends: its last row
    is conditioned on ``base + new``.
    """

    def __init__(self, config: SamplingConfig, vocab_size: int, scratch: Scratch | None = None,
                 processors: Processors | None = None):
        self.config = config
        self.vocab_size = int(vocab_size)
        self.scratch = scratch or Scratch()
        self.lazy_settled = 0  # LazyRow verdicts settled from a row's largest entries
        self.lazy_read = 0     # ... and those that needed the whole row
        # bias, penalty, bans (and a mask): the scores they change, for whole rows, top entries and LazyRow
        self.processors = processors or Processors(config, self.vocab_size)
        self.processes = self.processors.active
        # rows read whole, not through their largest entries: a bias (or a constraint's mask) may move any entry
        self.whole_rows = bool(self.processors.bias_ids.size)

    @property
    def growing_context(self) -> bool:
        """Set by a decode loop whose context is one list that only grows between calls (Processors)."""
        return self.processors.growing_context

    @growing_context.setter
    def growing_context(self, value: bool) -> None:
        self.processors.growing_context = value

    # -- processors (greedy and sampling) ---------------------------------
    def scores(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """Processed scores [rows, vocab] in float32 (penalty + banned words), as transformers computes them: the
        logits as float32, the penalty's products and quotients rounded to float32."""
        rows = np.array(np.asarray(logits)[:, : self.vocab_size], dtype=np.float32)
        skip = max(0, len(new) - rows.shape[0] + 1)  # (the last row reads all of new)
        for i in range(rows.shape[0]):
            ids, values = self.changes(rows[i], base, new[:skip + i])
            rows[i, ids] = values
        if not np.all(np.isfinite(rows.max(axis=1))):
            raise ValueError("every token is banned at some position; remove entries from bad_words_ids")
        return rows

    def greedy(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = ()) -> np.ndarray:
        """Greedy choice per row: argmax of processed scores, lowest index on ties."""
        if isinstance(logits, Rows) and self.whole_rows:
            logits = logits.numpy()
        if isinstance(logits, Rows):  # rows a pass returns with their largest entries
            skip = max(0, len(new) - len(logits) + 1)  # (the last row reads all of new)
            return np.array([self._device_greedy(logits[i], base, new[:skip + i]) for i in range(len(logits))])
        if not self.processes:
            return np.argmax(logits[:, : self.vocab_size], axis=1)  # float32 -> float64 keeps the order
        return np.argmax(self.scores(logits, base, new), axis=1)

    def _device_greedy(self, drow, base: Sequence[int], new: Sequence[int]) -> int:
        found = self._device_top(drow, 1, base, new)
        if found is None or not math.isfinite(found[2]):
            return int(self.greedy(drow.numpy()[None], base, new)[0])
        return int(min(found[0]))  # the lowest id among the ties of the largest

    def changes(self, row: np.ndarray, base: Sequence[int], new: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The ids a row's processors change and their new scores (``Processors.changes``)."""
        return self.processors.changes(row, base, new)

    # -- rows a pass returns with their largest entries (Row: those entries and a bound on the rest) ----------
    TOP_MARGIN = 16  # entries read beyond the k a rule needs, for those the processors push down

    def top_entries(self) -> int:
        """How many of a row's largest entries this pipeline reads where a row offers them (``top``): enough
        for its top-k (or greedy) choice with the margin; 0 when it needs whole rows (no top-k, top-k beyond
        LEAN_MAX, or a penalty below 1, which can raise entries from anywhere)."""
        cfg = self.config
        if cfg.repetition_penalty < 1.0 or self.whole_rows:
            return 0
        if not cfg.do_sample:
            return 1 + self.TOP_MARGIN
        if cfg.top_k and cfg.top_k + self.TOP_MARGIN <= LEAN_MAX and cfg.top_k < self.vocab_size:
            return cfg.top_k + self.TOP_MARGIN
        if self.lazy_rows():
            return LAZY_TOP
        return 0

    # LazyRow settles penalized rows at vocabularies from this width: a penalty's bookkeeping on the host costs
    # about the same whatever the vocabulary, a whole row in proportion to it (speculating, penalty 1.1, no
    # top-k, host time per round: SmolLM2, 49,152 entries, 2.32 ms whole vs 2.76 lazily; Qwen2.5, 151,936,
    # 2.83 vs 2.22)
    LAZY_PENALTY_VOCAB = 100_000

    def lazy_rows(self) -> bool:
        """Whether verification settles this pipeline's rows with LazyRow: sampling without top-k (with or
        without top-p), without a repetition penalty or, from LAZY_PENALTY_VOCAB entries, with one above 1."""
        cfg = self.config
        theta = cfg.repetition_penalty
        return cfg.do_sample and not self.whole_rows and not (cfg.top_k and cfg.top_k < self.vocab_size) and \
            (theta == 1.0 or (theta > 1.0 and self.vocab_size >= self.LAZY_PENALTY_VOCAB))

    def norm_scale(self) -> float:
        """The scale of the normalizer a pass computes per row where its graph has one (1 / temperature): what
        LazyRow reads; 0 when these rules do not read it."""
        return 1.0 / self.config.temperature if self.lazy_rows() else 0.0

    def verify_row(self, logits, base: Sequence[int], new: Sequence[int] = (), last: bool = False):
        """A target row for verification: a LazyRow (verdicts, draws and residual draws settled from its normalizer
        and largest entries) where ``rules.read_lazily`` says so; else ``row`` (in place: a row is verified
        once)."""
        if read_lazily(logits, self, base, new, last):
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
        read = self.read_top(drow, k + self.TOP_MARGIN, base, new)
        if read is None:
            return None
        tok, val, bound = read
        if len(tok) < k:
            return None
        if not self.processes or is_descending(val):
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

    def read_top(self, drow, k: int, base: Sequence[int], new: Sequence[int], found=None):
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
        if self.processes:
            val = self.processors.processed(tok, val, base, new)
        return tok, val, float(bound)

    # -- warpers (sampling) -----------------------------------------------
    def row(self, logits: np.ndarray, base: Sequence[int], new: Sequence[int] = (), inplace: bool = False) -> Dist:
        """The distribution one row is sampled from (context ``base + new``). ``inplace`` lets the processors
        (penalty, banned words) write into ``logits`` instead of a copy: for rows used once."""
        cfg = self.config
        head = None  # (rows LazyRow may verify: the ids a draw takes first, from the raw row: Dist.head_ids)
        if isinstance(logits, Row) and self.whole_rows:
            logits, inplace = logits.numpy(), inplace and logits.on_host
        if isinstance(logits, Row):  # a row a pass returned with its largest entries
            if cfg.top_k and cfg.top_k < self.vocab_size:
                found = self._device_top(logits, cfg.top_k, base, new)
                if found is not None and math.isfinite(found[2]):
                    return self._sparse(found[0], found[1])
            if self.lazy_rows():
                drow, vocab = logits, self.vocab_size
                head = lambda: top_head(drow, vocab)  # noqa: E731 (read from its top entries when a draw needs it)
            # settings without top-k read the whole row (in place only where it is a host pass's own buffer)
            logits, inplace = logits.numpy(), inplace and logits.on_host
        raw = np.asarray(logits)
        scores = raw[: self.vocab_size]
        if scores.dtype != np.float32:
            scores, inplace = scores.astype(np.float32), True
        ids, values = self.changes(scores, base, new)
        if head is None and self.lazy_rows():
            # a host row: its head from the raw entries when a draw needs it (those the processors are about to
            # change in place kept aside: a whole row is mostly read for a verdict, not drawn from)
            vocab = self.vocab_size
            if ids.size and inplace:
                changed, was = ids, scores[ids]
                head = lambda: restored_head(raw, changed, was, vocab)  # noqa: E731
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
        total = weights_total(weights, blocks)
        if cfg.top_p < 1.0:
            got = self._nucleus(weights, total)
            # a wide nucleus (``wide_nucleus``, told from the total: LazyRow draws from none, see _draw_bounds) is
            # drawn without a head: a dense one in block order over the kept weights, none set aside first
            got.head = [] if head is not None and nucleus_is_wide(cfg.top_p, total) else head
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
        if not is_descending(val):  # (as the graph returns a row's largest entries, they already are the top-p order)
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

    def top_p_dist(self, ids: np.ndarray, probs: np.ndarray) -> Dist:
        """Keep the smallest set of tokens whose cumulative probability reaches top_p, then sort by id.

        Hugging Face's rule (drop tokens whose ascending cumulative probability is
        <= 1 - top_p, keep at least one; its stable ascending sort puts the lower id
        of a tie first): in descending order (highest id first on ties) a token is
        kept iff the mass strictly before it is < top_p.
        """
        order = np.lexsort((-ids, -probs))
        return self._nucleus_sorted(ids[order], probs[order])

    def _nucleus_sorted(self, ids: np.ndarray, probs: np.ndarray) -> Dist:
        """``top_p_dist`` on rows already in the top-p order: the kept prefix (underflowed zeros, a suffix there,
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
        self.scratch.give_back(keys, wide)  # (this call's own: free for the next row)
        j, mass_above = mass_reaching(hist[::-1], target)  # the first bucket, from the top, whose running sum reaches it
        cut = BUCKETS - 1 - j                               # its key, and the weights it holds: [low, high)
        low, high = np.array([cut << HIST_SHIFT, (cut + 1) << HIST_SHIFT], dtype=np.int32).view(np.float32)
        above = np.greater_equal(weights, high, out=self.scratch.take(weights.size, np.bool_))
        inside = np.greater_equal(weights, low, out=self.scratch.take(weights.size, np.bool_))
        band = np.flatnonzero(np.not_equal(inside, above, out=inside))
        order = band[np.lexsort((-band, -weights[band]))]
        before = mass_above + np.cumsum(weights[order], dtype=np.float64) - weights[order]
        kept = order[before < target]
        self.scratch.give_back(hist, inside)
        if np.count_nonzero(above) + kept.size <= SPARSE_MAX:
            ids = np.concatenate([np.flatnonzero(above), kept])
            self.scratch.give_back(above)
            return self._top_p_done(ids, weights[ids])
        out = np.multiply(weights, above, out=self.scratch.take(weights.size))  # (weights are finite, >= 0)
        self.scratch.give_back(above)
        out[kept] = weights[kept]
        return Dist(weights=out, total=mass_above + float(weights[kept].sum(dtype=np.float64)))

    @staticmethod
    def _top_p_done(ids: np.ndarray, weights: np.ndarray) -> Dist:
        order = np.argsort(ids)
        w = weights[order].astype(np.float64)
        return Dist(ids[order], w / w.sum())


def draft_pipeline(config: SamplingConfig, vocab_size: int, scratch: Scratch | None = None,
                   policy: str = "match") -> LogitsPipeline:
    """The pipeline a draft model samples with for a request under ``config``: the settings
    ``config.draft_sampling`` chooses for this vocabulary (its width rules are stated there). Exact whatever it
    chooses: the verifier sees the q each draft token was drawn from."""
    return LogitsPipeline(draft_sampling(config, policy, vocab_size), vocab_size, scratch)


def top_p_filter(probs: np.ndarray, top_p: float) -> np.ndarray:
    """Keep the smallest set of tokens whose cumulative probability reaches top_p (a dense vector)."""
    pipe = LogitsPipeline(SamplingConfig(do_sample=True, top_p=top_p), probs.shape[0])
    ids = np.flatnonzero(probs > 0)
    return pipe.top_p_dist(ids, probs[ids] / probs[ids].sum()).dense(probs.shape[0])
