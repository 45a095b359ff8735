"""HybridDrafter: n-gram proposals where the context offers a match, the draft model otherwise, chosen per round."""
from __future__ import annotations

from .base import Draft, Drafter
from .lookup import PromptLookupDrafter
from .model import ModelDrafter


class HybridDrafter(Drafter):
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
    sizes_by_cost = True

    def __init__(self, model: ModelDrafter, lookup: PromptLookupDrafter | None = None):
        self.model, self.ngram = model, lookup or PromptLookupDrafter()
        self.lm = model.lm
        self.draft_cost: float | None = None
        self.crowded = False  # the pass costs are a batch's (set_costs)
        self.alpha_by_order = {1: 0.4, 2: 0.6, 3: 0.7}  # first-guess priors, learned per order
        self.alpha_model = 0.7
        self._last_kind = None  # what made the last proposal: "model", or the n-gram order of a lookup
        self.lookup_rounds = self.model_rounds = self.idle_rounds = 0
        self._idle = 0  # rounds in a row without a match in which the model was not predicted to pay

    @property
    def source(self):
        """The model drafter's source cache (the target, for a self-draft), or None."""
        return self.model.source

    @property
    def window(self):
        return self.model.window

    @property
    def pass_costs(self):
        """The target's pass costs C_t(1..) the choice reads (the lookups' too)."""
        return self.ngram.pass_costs

    @pass_costs.setter
    def pass_costs(self, costs):
        self.ngram.pass_costs = costs

    def set_stop(self, stop) -> None:
        self.model.set_stop(stop)

    def set_costs(self, pass_costs, draft_cost, crowded=False) -> None:
        self.pass_costs, self.draft_cost, self.crowded = pass_costs, draft_cost, crowded

    def sync(self, committed) -> None:
        self.model.sync(committed)

    def view(self, committed) -> list[int]:
        return self.model.view(committed)

    def unread(self, committed) -> int:
        return self.model.unread(committed)

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        outcome = self.ngram.observe(committed)
        self._learn(outcome)
        if self._last_kind == "model":
            self.ngram.end_run()  # a copy runs only through lookups
        limit = gamma if limit is None else limit
        paused = gamma < 1  # no model draft this round (auto paused it): a lookup only, where one pays
        want = min(self.PAUSED_LOOKUP, limit) if paused else gamma
        tokens, order = self.ngram.match(committed, self.ngram.length(want, limit)) if want > 0 else ([], 0)
        choice, n = self._choose(order, len(tokens), want, model=not paused)
        if choice == "lookup":
            self._last_kind, self._idle = order, 0
            self.lookup_rounds += 1
            return self.ngram.draft(committed, tokens[:n], want, sampling, side=True)
        if choice is None and not tokens and not paused:
            self._idle += 1
            if self._idle >= self.PROBE_EVERY and self._may_pay(gamma):
                choice, n = "model", gamma  # re-measure the model's acceptance now and then
        if choice is None:
            self._last_kind = None
            if not paused:
                self.idle_rounds += 1
            self.ngram.remember(committed, [], want)
            return Draft.empty()
        self._last_kind, self._idle = "model", 0
        self.model_rounds += 1
        draft = self.model.propose(committed, n, pipeline, sampling, rng)
        self.ngram.remember(committed, draft.tokens, n)  # model rounds are read back the same way
        return draft

    def _may_pay(self, gamma: int) -> bool:
        """Whether a model draft could pay at all: in a batch of requests (``crowded``: pass costs each little
        more than a share of one, against a draft step that every request waits for), one accepted every
        time must, else a probe of its acceptance measures nothing that could change the choice. Alone it
        always may: the draft step's cost is re-timed only in the model's own rounds, and one timed on a busy
        moment (a profile measured while another program ran) would otherwise keep the model out for good."""
        step, costs = self.draft_cost, self.pass_costs
        if not self.crowded or step is None or not costs:
            return True
        from ..control.costmodel import best_gamma
        return best_gamma([1.0] * gamma, step, costs, gamma)[0] > 0

    def _learn(self, outcome) -> None:
        if outcome is None or self._last_kind is None:
            return
        proposed, accepted, _ = outcome
        for i in range(min(proposed, accepted + 1)):
            hit = 1.0 if i < accepted else 0.0
            if self._last_kind == "model":
                self.alpha_model += self.DECAY * (hit - self.alpha_model)
            else:
                a = self.alpha_by_order[self._last_kind]
                self.alpha_by_order[self._last_kind] = a + self.DECAY * (hit - a)

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
        from ..control.costmodel import best_gamma, predicted_speedup
        if n > gamma:
            lookup_n, lookup = n, predicted_speedup([self.ngram.copy_alpha] * n, n, 0.0, costs)
        else:
            lookup_n, lookup = best_gamma([self.alpha_by_order[order]] * n, 0.0, costs, n) if n else (0, 0.0)
        model_n, model = best_gamma([self.alpha_model] * gamma, step, costs, gamma) if model else (0, 0.0)
        if not lookup_n and not model_n:
            return None, 0
        return ("lookup", lookup_n) if lookup_n and lookup >= model else ("model", model_n)
