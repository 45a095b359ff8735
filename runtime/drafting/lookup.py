"""PromptLookupDrafter: drafts by n-gram match over the prompt and generated text (no model, q one-hot)."""
from __future__ import annotations

import bisect
from typing import Sequence

from ..sampling import Dist
from .base import Draft, Drafter, common_prefix


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


class PromptLookupDrafter(Drafter):
    """Drafts by n-gram match over prompt and generated text (no model, q one-hot).

    A long copy drafts long: while the answer copies earlier text (every token of the last proposals
    accepted), the copy's run length bounds how far to trust it, and a proposal may grow past gamma up to
    ``limit`` (at most LONG_MAX), to the length the cost model predicts best from the target's pass costs
    (``pass_costs``, C_t(k) by k, when known) and the acceptance long proposals have had. The first rejection
    ends the run, so a wasted verify pass is never longer than the tokens the run had already proven.
    """

    name = "prompt_lookup"
    sizes_by_cost = True
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

    def set_costs(self, pass_costs, draft_cost, crowded=False) -> None:
        self.pass_costs = pass_costs  # (a lookup's own cost is nothing: the draft step's is not read)

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
        from ..control.costmodel import predicted_speedup
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

