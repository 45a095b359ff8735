"""The logits processors — logit bias, repetition penalty, banned words (and, for structured output, a token
mask) — and the context's seen-set the penalty reads: one implementation that whole rows (LogitsPipeline), a
row's largest entries (``LogitsPipeline.read_top``) and single scores (LazyRow) all go through.

Order and arithmetic as transformers': the bias first (its SequenceBias of one-token sequences), then the
penalty on the context's distinct ids (positive scores divided by theta, negative ones multiplied, rounded to
float32 on float32 rows), then bans (-inf, penalized or not).
"""
from __future__ import annotations

from array import array
from typing import Sequence

import numpy as np

from ..config import SamplingConfig
from .kernels import NO_IDS, NO_SCORES


def penalize(values: np.ndarray, theta: float) -> np.ndarray:
    """Repetition penalty (as transformers): positive scores divided by ``theta``, negative ones multiplied, in
    ``values``' dtype (``theta`` a Python float)."""
    out = np.divide(values, theta)
    np.multiply(values, theta, out=out, where=values < 0)  # (three NumPy calls: each costs after a pass)
    return out


def penalized32(score: float, theta32: float) -> float:
    """One score penalized as ``penalize`` does it on a float32 row: ``theta32`` is the penalty rounded to
    float32, the product or quotient rounded to float32 (a float64 product or quotient of two float32 numbers
    rounds to float32 as float32 arithmetic does)."""
    return array("f", [score * theta32 if score < 0 else score / theta32])[0]


class Processors:
    """A SamplingConfig's processors over a vocabulary of ``vocab_size`` ids, with the distinct ids of the
    context they last read (the penalty's seen-set, extended as the context grows)."""

    def __init__(self, config: SamplingConfig, vocab_size: int):
        self.config = config
        self.vocab_size = int(vocab_size)
        self.theta = config.repetition_penalty
        self.theta32 = float(np.float32(config.repetition_penalty))  # the penalty as float32 rows meet it
        single = [w[0] for w in config.bad_words_ids if len(w) == 1]
        banned = np.array(sorted(set(single)), dtype=np.int64)
        self.banned_always = banned[banned < self.vocab_size]
        self.multi = [w for w in config.bad_words_ids if len(w) > 1]
        self.reach = max((len(w) - 1 for w in self.multi), default=0)  # context tokens a longer word matches
        bias = [(t, b) for t, b in config.logit_bias if t < self.vocab_size]
        self.bias_ids = np.array([t for t, _ in bias], dtype=np.int64)
        self.bias_values = np.array([b for _, b in bias], dtype=np.float32)
        # whether any processor changes some score (a subclass that masks rows says so too)
        self.active = self.theta != 1.0 or bool(config.bad_words_ids) or bool(bias)
        # Set by a decode loop whose context is one list that only grows (appended to) between calls: the same
        # object is then taken to extend what was read from it without comparing its prefix again (right after
        # a pass, comparing a few hundred tokens cost ~0.1 ms per row)
        self.growing_context = False
        self._seen_of: list[int] = []     # the context whose distinct tokens are cached
        self._seen_base = None            # ... and the list object it was last read from
        self.seen: set[int] = set()       # its distinct ids inside the vocabulary
        self._seen_order: list[int] = []  # the same ids in the order first seen (the array is made when asked for)
        self._seen_array = np.zeros(0, dtype=np.int64)

    # -- the context's distinct ids ------------------------------------------
    def update_seen(self, base: Sequence[int]) -> None:
        """Keep the distinct ids of ``base`` (inside the vocabulary) in ``seen``. A context that extends the last
        one (as a request's does, round after round) only adds its new tokens to the set."""
        n = len(self._seen_of)
        same = self.growing_context and base is self._seen_base and len(base) >= n
        if not same and (len(base) < n or list(base[:n]) != self._seen_of):
            self._seen_of, self.seen, self._seen_order, n = [], set(), [], 0
            self._seen_array = np.zeros(0, dtype=np.int64)
        self._seen_base = base
        if len(base) > n:
            fresh = [int(t) for t in base[n:]]
            self._seen_of.extend(fresh)
            added = [t for t in dict.fromkeys(fresh) if t not in self.seen and 0 <= t < self.vocab_size]
            if added:  # appended (the whole set is not rebuilt each round)
                self.seen.update(added)
                self._seen_order.extend(added)

    def _seen_ids(self) -> np.ndarray:
        """The distinct ids as an int64 array (extended from the list only when rows are read whole: the paths
        that read a row's largest entries need just the set)."""
        have, order = self._seen_array.size, self._seen_order
        if have != len(order):
            self._seen_array = np.concatenate([self._seen_array, np.asarray(order[have:], dtype=np.int64)])
        return self._seen_array

    def seen_tokens(self, base: Sequence[int], new: Sequence[int]) -> np.ndarray:
        """Distinct ids of base + new inside the vocabulary."""
        self.update_seen(base)
        extra = [t for t in dict.fromkeys(int(t) for t in new) if t not in self.seen and 0 <= t < self.vocab_size]
        ids = self._seen_ids()
        return np.concatenate([ids, np.asarray(extra, dtype=np.int64)]) if extra else ids

    # -- what changes ----------------------------------------------------------
    def changes(self, row: np.ndarray, base: Sequence[int], new: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The ids the processors change in a row (context ``base + new``) and their new scores (biased,
        penalized, or -inf when banned), each id once."""
        if not self.active:
            return NO_IDS, NO_SCORES
        seen = self.seen_tokens(base, new) if self.theta != 1.0 else np.zeros(0, np.int64)
        if self.bias_ids.size:  # the bias first (as transformers' SequenceBias), then the penalty where it reads
            ids = np.union1d(seen, self.bias_ids)
            values = row[ids].astype(row.dtype)
            values[np.searchsorted(ids, self.bias_ids)] += self.bias_values.astype(row.dtype)
            if seen.size:
                at = np.isin(ids, seen)
                values[at] = penalize(values[at], self.theta)
            seen = ids
        else:
            values = penalize(row[seen], self.theta)
        if not self.config.bad_words_ids:
            return seen, values
        banned = np.asarray(self.banned(base, new), dtype=np.int64)
        if seen.size and banned.size:  # a banned id is -inf, penalized or not (each id changed once)
            keep = ~np.isin(seen, banned)
            seen, values = seen[keep], values[keep]
        return np.concatenate([seen, banned]), np.concatenate([values, np.full(banned.size, -np.inf, row.dtype)])

    def changed_ids(self, base: Sequence[int], new: Sequence[int]) -> tuple:
        """(the context's distinct ids, the new ones, the banned ones) as sets (empty where no processor reads
        them): every id the processors may change at this position is in one of them."""
        seen = fresh = banned = ()
        if self.theta != 1.0:
            self.update_seen(base)
            seen, fresh = self.seen, {int(t) for t in new}
        if self.config.bad_words_ids:
            banned = set(self.banned(base, new))
        return seen, fresh, banned

    def banned(self, base: Sequence[int], new: Sequence[int]) -> list[int]:
        """Ids banned at this position, each once: single-token bad words, and the last token of each longer bad
        word whose other tokens end the context, as transformers matches them (the whole word, and only in a
        context at least as long as the word)."""
        banned = self.banned_always.tolist()
        if self.multi:
            reach, length = self.reach, len(base) + len(new)
            context = [int(t) for t in new[-reach:]]
            if len(context) < reach:
                context = [int(t) for t in base[len(context) - reach:]] + context
            extra = []
            for word in self.multi:
                n = len(word) - 1
                if word[-1] < self.vocab_size and length > n and context[len(context) - n:] == list(word[:-1]):
                    extra.append(word[-1])
            if extra:
                banned = list(dict.fromkeys(banned + extra))  # (a token two words ban is banned once)
        return banned

    def processed(self, tok: list[int], val: list[float], base: Sequence[int], new: Sequence[int]) -> list[float]:
        """The scores ``val`` of the ids ``tok`` (raw float32 values, as Python floats) after the penalty and
        bans, with float32 rounding as on a float32 row (``val`` itself is not changed). Not for a bias, which
        any entry of the row may receive: rows under one are read whole."""
        if self.theta != 1.0:
            self.update_seen(base)
            hits = self.seen.intersection(tok)  # (one C-level pass: most entries read are not in the context)
            if new:
                hits.update({int(t) for t in new}.intersection(tok))
            if hits:
                val = [penalized32(v, self.theta32) if t in hits else v for t, v in zip(tok, val)]
        if self.config.bad_words_ids:
            banned = set(self.banned(base, new))
            val = [-np.inf if t in banned else v for t, v in zip(tok, val)]
        return val


class MaskedProcessors(Processors):
    """Processors followed by a token mask (structured output): a disallowed token scores -inf, penalized or
    not, after the penalty and bans, before the warpers (transformers' order for a logits processor)."""

    def __init__(self, config: SamplingConfig, vocab_size: int, mask):
        super().__init__(config, vocab_size)
        self.mask = mask  # a TokenMask: allowed(base, new) -> bool array over the vocabulary, or None
        self.active = True

    def changes(self, row: np.ndarray, base: Sequence[int], new: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        ids, values = super().changes(row, base, new)
        allowed = self.mask.allowed(base, new)
        if allowed is None:
            return ids, values
        if ids.size:  # a masked id is -inf, penalized or not (each id changed once)
            keep = allowed[ids]
            ids, values = ids[keep], values[keep]
        banned = np.flatnonzero(~allowed[:self.vocab_size])
        return np.concatenate([ids, banned]), np.concatenate([values, np.full(banned.size, -np.inf, row.dtype)])
