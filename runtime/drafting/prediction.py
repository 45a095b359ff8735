"""PredictionDrafter: a request's predicted output (OpenAI's Predicted Outputs) proposed as free drafts, aligned to
what has been generated, with the generator's own drafter where the prediction offers nothing."""
from __future__ import annotations

import bisect
from typing import Sequence

from .base import Draft, Drafter
from .lookup import PromptLookupDrafter


class PredictionIndex:
    """Where every n-gram (orders 1..ORDER) of a fixed token sequence starts."""

    ORDER = 8

    def __init__(self, tokens: Sequence[int]):
        self.tokens = [int(t) for t in tokens]
        self.starts: dict[tuple, list[int]] = {}
        for order in range(1, self.ORDER + 1):
            for i in range(len(self.tokens) - order + 1):
                self.starts.setdefault(tuple(self.tokens[i:i + order]), []).append(i)

    def align(self, generated: Sequence[int], hint: int) -> tuple[int, int]:
        """(the prediction position the next token should be at, the n-gram order that placed it; 0: none).

        ``hint`` is where the last alignment expects it (that position plus the tokens generated since). With
        nothing generated yet, the start of the prediction. Else the longest tail of the generated text found in
        the prediction: its first occurrence ending at or after ``hint`` (a rejection moves on, not back), or
        else its last one; a tail of one token only where it ends exactly at ``hint`` (one token alone is weak
        evidence elsewhere)."""
        if not generated:
            return 0, self.ORDER
        for order in range(min(self.ORDER, len(generated)), 0, -1):
            starts = self.starts.get(tuple(int(t) for t in generated[-order:]))
            if not starts:
                continue
            i = bisect.bisect_left(starts, hint - order)
            end = (starts[i] if i < len(starts) else starts[-1]) + order
            if order == 1 and end != hint:
                continue
            return end, order
        return hint, 0


class PredictionDrafter(PromptLookupDrafter):
    """Drafts a request's predicted output where the generated text follows it, else asks ``fallback``.

    The prediction's tokens are proposals with q one-hot, as n-gram continuations: a wrong prediction costs
    time, never exactness. Proposals follow the prediction from where the generated text is aligned to it:
    after a fully accepted proposal, straight on; after a rejection, from a later matching run of the
    prediction (``PredictionIndex.align``). Their length is the copy rule of n-gram lookups: gamma at first,
    then as long as the run of agreement has proven, sized by the cost model from the target's pass costs
    (long runs make long passes worth it). Where the prediction offers nothing (the answer left it), the
    generator's own drafter proposes, so a prediction never makes drafting worse than without one."""

    name = "prediction"
    sizes_by_cost = True
    drafts_when_paused = True
    PAUSED = 4  # tokens to propose in a round where an auto gamma paused model drafting

    def __init__(self, prediction: Sequence[int], prompt_length: int, fallback: Drafter):
        super().__init__()
        self.index = PredictionIndex(prediction)
        self.prompt_length = prompt_length
        self.fallback = fallback
        self.lm, self.source, self.window = fallback.lm, fallback.source, fallback.window
        self._next, self._seen = 0, 0  # the prediction position expected next when this many tokens were generated

    def set_stop(self, stop) -> None:
        self.fallback.set_stop(stop)

    def set_costs(self, pass_costs, draft_cost, crowded=False) -> None:
        self.pass_costs = pass_costs
        self.fallback.set_costs(pass_costs, draft_cost, crowded)

    def sync(self, committed) -> None:
        self.fallback.sync(committed)

    def view(self, committed) -> list[int]:
        return self.fallback.view(committed)

    def unread(self, committed) -> int:
        return self.fallback.unread(committed)

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        self.observe(committed)
        limit = gamma if limit is None else limit
        want = gamma if gamma > 0 else min(self.PAUSED, limit)
        generated = committed[self.prompt_length:]
        self._next, order = self.index.align(generated, self._next + len(generated) - self._seen)
        self._seen = len(generated)
        tokens = self.index.tokens[self._next:self._next + self.length(want, limit)] if order and want > 0 else []
        if tokens:
            draft = self.draft(committed, tokens, want, sampling)
            return Draft(draft.tokens, draft.dists, draft.side, origin="prediction")
        self.end_run()
        if gamma < 1 and not self.fallback.drafts_when_paused:
            self.remember(committed, [], want)
            return Draft.empty()
        draft = self.fallback.propose(committed, gamma, pipeline, sampling, rng, limit=limit)
        self.remember(committed, draft.tokens, gamma)
        return draft
