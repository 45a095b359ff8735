"""Drafters: where candidate tokens come from.

Every drafter returns a Draft: the proposed tokens and, when sampling, the
distribution each was drawn from (after the full logits pipeline), so the
verifier sees exactly the q that was sampled.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .logits import Dist, LogitsPipeline
from .model import CausalLM


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    dists: list[Dist] | None  # when sampling: the distribution each token was drawn from, else None
    side: bool = False        # drafted by a source the draft-length controller does not plan (hybrid n-grams)

    @staticmethod
    def empty() -> "Draft":
        return Draft([], None)


class Drafter(Protocol):
    name: str

    def propose(self, committed: Sequence[int], gamma: int, pipeline: LogitsPipeline,
                sampling: bool, rng: np.random.Generator, limit: int | None = None) -> Draft: ...
    # gamma: the tokens to draft; limit (>= gamma): the most a drafter may propose when it has reason to
    # draft more (a long copy of earlier text), bounded by max_new_tokens and the context

    def sync(self, committed: Sequence[int]) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the longest common prefix of two token sequences. Compared as Python lists, whole and then by
    bisection (C-level slice comparisons): a request's context meets the caches' tokens several times a round,
    and copying it into arrays each time cost ~45 us per 1,000 tokens."""
    n = min(len(a), len(b))
    a = a[:n] if isinstance(a, list) else [int(t) for t in a[:n]]
    b = b[:n] if isinstance(b, list) else [int(t) for t in b[:n]]
    if a == b:
        return n
    lo, hi = 0, n  # the first lo agree, the first hi do not
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class NoDrafter:
    """Target-only decoding through the same loop: the baseline."""

    name = "none"

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        return Draft.empty()

    def sync(self, committed) -> None:
        pass


def check_window(window):
    if window is not None and (isinstance(window, bool) or not isinstance(window, int) or window < 16):
        raise ValueError(f"draft_window must be an integer >= 16 or None, got {window!r}")
    return window


class ModelDrafter:
    """Drafts with the bundle's draft graph, keeping its own KV cache in step.

    With a ``window``, the draft model reads a long context as its first SINK tokens plus the most recent
    ``window`` or so (the start of that stretch moves in steps of half a window, so the draft re-reads at
    most one window per half window of new text): a long prompt then costs the draft a window's prefill, and
    its steps attend over a window instead of the whole context. What the draft sees changes only its
    acceptance, never the output.

    With a ``source`` (the target, for a self-draft of the same cache layout), the draft runs on the target's
    KV cache (``CausalLM.share_cache``): the positions the target holds carry the target's keys and values, and
    the draft feeds only what the target has not verified yet (the last committed token) and the tokens it
    drafts.
    """

    name = "model"
    SINK = 4  # leading tokens every view keeps (models lean on the first positions; dropping them hurts)

    def __init__(self, lm: CausalLM, window: int | None = None, source: CausalLM | None = None):
        self.lm, self.window = lm, check_window(window)
        # source: the target, when this draft reads the target's K/V for committed text (a self-draft with
        # the same cache layout; the window does not apply then)
        self.source = source
        if source is not None:
            lm.share_cache(source)

    def view(self, committed: Sequence[int]) -> list[int]:
        """The tokens the draft model reads for this context."""
        committed = list(committed)
        n, w = len(committed), self.window
        if w is None or self.source is not None or n <= w + self.SINK:
            return committed
        step = max(1, w // 2)
        start = max(self.SINK, ((n - w) // step) * step)
        return committed[:self.SINK] + committed[start:]

    def unread(self, committed: Sequence[int]) -> int:
        """Tokens of this context the draft model has yet to read (its next proposal feeds them first)."""
        seen = self.view(committed)
        return len(seen) - common_prefix(self.lm.tokens, seen)

    def sync(self, committed: Sequence[int]) -> None:
        """Roll back to the fed tokens still on the committed path (as the draft reads it).

        At most len(view) - 1 are kept: the last committed token opens the
        next round. When every draft was accepted the cache lacks d_gamma (it was
        sampled but never fed), so the next round feeds [d_gamma, bonus].
        """
        seen = self.view(committed)
        if self.source is not None:  # the shared cache: valid where the target holds the committed text
            self.lm.follow(min(common_prefix(self.source.tokens, seen), len(seen) - 1))
            return
        self.lm.rollback(min(common_prefix(self.lm.tokens, seen), len(seen) - 1))

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        self.sync(committed)
        seen = self.view(committed)  # (a copy: the caller's list is read, never changed)
        if self.lm.length + gamma + 1 > self.lm.capacity:
            gamma = max(0, self.lm.capacity - len(seen))
        feed = seen[self.lm.length:]
        tokens: list[int] = []
        dists = []
        for _ in range(gamma):
            logits = self.lm.forward_rows(feed, keep=1)
            if sampling:  # processors (repetition penalty) read the whole context, as the target's do
                q = pipeline.row(logits[0], committed, tokens, inplace=True)
                tok = q.sample(rng)
                dists.append(q)
            else:
                tok = int(pipeline.greedy(logits, committed, tokens)[0])
            logits = None  # its host buffer is free again: the next step writes into it, already bound
            tokens.append(tok)
            feed = [tok]
        return Draft(tokens, dists if sampling else None)


class Outcomes:
    """What became of a drafter's last proposal, read from the committed tokens of the next round."""

    def __init__(self):
        self._start, self._tokens, self._planned = -1, [], 0

    def proposed(self, committed: Sequence[int], tokens: list[int], planned: int) -> None:
        """Remember a proposal (``planned``: the gamma it was asked for; more tokens than that made it long)."""
        self._start, self._tokens, self._planned = len(committed), list(tokens), planned

    def read(self, committed: Sequence[int]) -> tuple[int, int, int] | None:
        """(tokens proposed, tokens accepted, gamma planned) of the last proposal, or None when there was none
        or ``committed`` does not continue its context (another request)."""
        start, tokens, planned = self._start, self._tokens, self._planned
        self._start, self._tokens = -1, []
        if start < 0 or not tokens or len(committed) <= start:
            return None
        return len(tokens), common_prefix(committed[start:start + len(tokens)], tokens), planned


class PromptLookupDrafter:
    """Drafts by n-gram match over prompt and generated text (no model, q one-hot).

    A long copy drafts long: while the answer copies earlier text (every token of the last proposals
    accepted), the copy's run length bounds how far to trust it, and a proposal may grow past gamma up to
    ``limit`` (at most LONG_MAX), to the length the cost model predicts best from the target's pass costs
    (``pass_costs``, C_t(k) by k, when known) and the acceptance long proposals have had. The first rejection
    ends the run, so a wasted verify pass is never longer than the tokens the run had already proven.
    """

    name = "prompt_lookup"
    LONG_MAX = 60        # longest proposal (a verify pass of LONG_MAX + 1 positions)
    DECAY = 0.1          # weight of the newest observation in the acceptance of long proposals

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram
        self.pass_costs: list[float] | None = None  # C_t(1..), set by the generator when a profile exists
        self.copy_alpha = 0.9    # per-token acceptance of long proposals (conditional), learned
        self._run = 0            # tokens committed in a row that proposals predicted
        self._outcomes = Outcomes()
        self._index = NgramIndex(min_ngram, max_ngram)

    def sync(self, committed) -> None:
        pass

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        self.observe(committed)
        tokens = self.lookup(committed, self.length(gamma, gamma if limit is None else limit))
        return self.draft(committed, tokens, gamma, sampling)

    def draft(self, committed, tokens: list[int], gamma: int, sampling: bool, side: bool = False) -> Draft:
        self.remember(committed, tokens, gamma)
        if not tokens:
            return Draft.empty()
        return Draft(tokens, [Dist.one_hot(t) for t in tokens] if sampling else None, side)

    def remember(self, committed: Sequence[int], tokens: list[int], gamma: int) -> None:
        """Note a proposal (this drafter's, or another source's in its place) to read its outcome next round."""
        self._outcomes.proposed(committed, tokens, gamma)

    def end_run(self) -> None:
        """The text stopped copying (another source drafted): the next lookup starts without a run."""
        self._run = 0

    def observe(self, committed: Sequence[int]) -> tuple[int, int, int] | None:
        """Read what became of the last proposal and update the copy run and the long proposals' acceptance."""
        outcome = self._outcomes.read(committed)
        if outcome is None:  # nothing proposed last round (no match) or a new request: no copy runs
            self._run = 0
            return None
        proposed, accepted, planned = outcome
        self._run = self._run + proposed + 1 if accepted == proposed else 0  # + the target's own next token
        if proposed > planned:
            for i in range(min(proposed, accepted + 1)):
                self.copy_alpha += self.DECAY * ((1.0 if i < accepted else 0.0) - self.copy_alpha)
        return outcome

    def length(self, gamma: int, limit: int) -> int:
        """Tokens to propose: gamma, or more while a copy runs (never past what the run has proven)."""
        cap = min(limit, self.LONG_MAX, max(gamma, self._run))
        if cap <= gamma or gamma < 1:
            return gamma
        if not self.pass_costs:
            return cap
        from .costmodel import predicted_speedup
        return max(range(gamma, cap + 1),
                   key=lambda n: predicted_speedup([self.copy_alpha] * n, n, 0.0, self.pass_costs))

    def lookup(self, committed: Sequence[int], gamma: int) -> list[int]:
        """Tokens that followed the most recent earlier occurrence of the longest matching tail (the latest one
        that is followed by ``gamma`` tokens, when there is one)."""
        return self.match(committed, gamma)[0]

    def match(self, committed: Sequence[int], gamma: int) -> tuple[list[int], int]:
        """(the continuation of up to ``gamma`` tokens, the n-gram order that matched; 0 when none did)."""
        if gamma < 1:
            return [], 0
        return self._index.match(committed, gamma)


class NgramIndex:
    """Where every n-gram (n in [lo, hi]) of a token sequence starts, kept up to date as the sequence grows
    (a request's context does, round after round), so that a lookup costs a few dictionary reads however
    long the context is. A sequence that is not an extension of the indexed one first drops the entries
    past the prefix they share."""

    def __init__(self, lo: int, hi: int):
        self.lo, self.hi = lo, hi
        self.seq: list[int] = []
        self.starts: dict[tuple, list[int]] = {}  # n-gram -> its start positions, ascending

    def update(self, committed: Sequence[int]) -> list[int]:
        seq, n = self.seq, len(self.seq)
        if len(committed) < n or list(committed[:n]) != seq:
            same = next((i for i, (a, b) in enumerate(zip(seq, committed)) if a != int(b)), min(n, len(committed)))
            if not same:
                self.starts = {}  # another text altogether
            else:  # drop the windows that reach past the shared prefix, latest first
                for order in range(self.lo, self.hi + 1):
                    for i in range(n - order, max(same - order + 1, 0) - 1, -1):
                        key = tuple(seq[i:i + order])
                        self.starts[key].pop()
                        if not self.starts[key]:
                            del self.starts[key]  # nothing kept for n-grams no longer in the text
            del seq[same:]
        for t in committed[len(seq):]:
            seq.append(int(t))
            end = len(seq)
            for order in range(self.lo, min(self.hi, end) + 1):
                self.starts.setdefault(tuple(seq[end - order:]), []).append(end - order)
        return seq

    def match(self, committed: Sequence[int], gamma: int) -> tuple[list[int], int]:
        """The tokens after the latest earlier occurrence of the longest tail of ``committed`` that recurs
        (of order hi down to lo; the latest occurrence followed by ``gamma`` tokens, when one is), and the
        order; ([], 0) when no tail recurs."""
        seq = self.update(committed)
        size = len(seq)
        for order in range(min(self.hi, size - 1), self.lo - 1, -1):
            starts = self.starts.get(tuple(seq[size - order:]), ())
            earlier = bisect.bisect_right(starts, size - 1 - order)  # every occurrence but the tail itself
            if earlier:
                full = bisect.bisect_right(starts, size - order - gamma, 0, earlier)
                start = (starts[full - 1] if full else starts[earlier - 1]) + order
                return seq[start:start + gamma], order
        return [], 0


class HybridDrafter:
    """n-gram proposals where the context offers a match, the draft model otherwise, chosen per round.

    The choice compares the speedups the cost model predicts for the two proposals, and for none at all, from
    the target's pass costs and the draft step (``pass_costs``, ``draft_cost``: timed in the request once it
    has run passes of two sizes, else a stored profile's) and the acceptance each source has had: per n-gram
    order for lookups (a longer matching tail is better evidence), and one for the model. A lookup costs
    nothing to make, a model draft gamma draft steps. When neither is predicted to pay the round drafts
    nothing, except that the model drafts once every PROBE_EVERY such rounds without a match (its acceptance
    is learned only from its own rounds). Without costs, a match of order >= 2 wins, else the model drafts.
    The model's cache catches up with the committed text in one pass when it drafts again. Which source
    drafts depends only on the committed tokens and past outcomes, so the output distribution is unchanged.
    """

    name = "hybrid"
    DECAY = 0.1
    PROBE_EVERY = 16
    PAUSED_LOOKUP = 4       # tokens a lookup may propose in a round without model drafts (gamma 0)
    drafts_when_paused = True  # asked with gamma 0 too (auto pausing the model): lookups may still pay

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None):
        self.model, self.ngram = model, lookup or PromptLookupDrafter()
        self.lm = model.lm
        self.draft_cost: float | None = None
        self.alpha_by_order = {1: 0.4, 2: 0.6, 3: 0.7}  # first-guess priors, learned per order
        self.alpha_model = 0.7
        self._source = None  # "model" or the n-gram order of the last proposal
        self.lookup_rounds = self.model_rounds = self.idle_rounds = 0
        self._idle = 0  # rounds in a row without a match in which the model was not predicted to pay

    @property
    def source(self):
        """The model drafter's source cache (the target, for a self-draft), or None."""
        return self.model.source

    @property
    def pass_costs(self):
        return self.ngram.pass_costs

    @pass_costs.setter
    def pass_costs(self, costs):
        self.ngram.pass_costs = costs

    def sync(self, committed) -> None:
        self.model.sync(committed)

    def view(self, committed) -> list[int]:
        return self.model.view(committed)

    def unread(self, committed) -> int:
        return self.model.unread(committed)

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        outcome = self.ngram.observe(committed)
        self._learn(outcome)
        if self._source == "model":
            self.ngram.end_run()  # a copy runs only through lookups
        limit = gamma if limit is None else limit
        paused = gamma < 1  # no model draft this round (auto paused it): a lookup only, where one pays
        want = min(self.PAUSED_LOOKUP, limit) if paused else gamma
        tokens, order = self.ngram.match(committed, self.ngram.length(want, limit)) if want > 0 else ([], 0)
        choice, n = self._choose(order, len(tokens), want, model=not paused)
        if choice == "lookup":
            self._source, self._idle = order, 0
            self.lookup_rounds += 1
            return self.ngram.draft(committed, tokens[:n], want, sampling, side=True)
        if choice is None and not tokens and not paused:
            self._idle += 1
            if self._idle >= self.PROBE_EVERY:
                choice, n = "model", gamma  # re-measure the model's acceptance now and then
        if choice is None:
            self._source = None
            if not paused:
                self.idle_rounds += 1
            self.ngram.remember(committed, [], want)
            return Draft.empty()
        self._source, self._idle = "model", 0
        self.model_rounds += 1
        draft = self.model.propose(committed, n, pipeline, sampling, rng)
        self.ngram.remember(committed, draft.tokens, n)  # model rounds are read back the same way
        return draft

    def _learn(self, outcome) -> None:
        if outcome is None or self._source is None:
            return
        proposed, accepted, _ = outcome
        for i in range(min(proposed, accepted + 1)):
            hit = 1.0 if i < accepted else 0.0
            if self._source == "model":
                self.alpha_model += self.DECAY * (hit - self.alpha_model)
            else:
                a = self.alpha_by_order[self._source]
                self.alpha_by_order[self._source] = a + self.DECAY * (hit - a)

    def _choose(self, order: int, n: int, gamma: int, model: bool = True) -> tuple[str | None, int]:
        """("lookup", tokens to propose of the n matched at this n-gram order; n = 0: no match), ("model", draft
        steps), or (None, 0): no draft, neither is predicted to pay (``model=False``: the model is not an
        option). With costs, each source proposes the length the cost model predicts best up to what it has
        (where a pass costs per token, fewer than gamma); a long copy (n > gamma) keeps its run's length."""
        costs, step = self.pass_costs, self.draft_cost
        if not costs or step is None:
            if n and order >= 2:
                return "lookup", n
            return ("model", gamma) if model else (None, 0)
        from .costmodel import best_gamma, predicted_speedup
        if n > gamma:
            lookup_n, lookup = n, predicted_speedup([self.ngram.copy_alpha] * n, n, 0.0, costs)
        else:
            lookup_n, lookup = best_gamma([self.alpha_by_order[order]] * n, 0.0, costs, n) if n else (0, 0.0)
        model_n, model = best_gamma([self.alpha_model] * gamma, step, costs, gamma) if model else (0, 0.0)
        if not lookup_n and not model_n:
            return None, 0
        return ("lookup", lookup_n) if lookup_n and lookup >= model else ("model", model_n)
