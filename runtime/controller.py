"""Choosing gamma per round: a fixed count, or "auto" from the cost model.

The auto controller keeps exponentially weighted per-position acceptance
estimates and per-call cost estimates measured online from the models' own
run times (C_d per draft step, C_t(k) per target pass of k tokens), and picks
the gamma with the highest predicted speedup. Positions it has not drafted
lately are assumed a little worse than the deepest one it has (conditional
acceptance falls with depth), so it does not reach for long drafts on faith.
When no gamma predicts a gain it decodes target-only for a while, then probes
with one draft token (the cheapest way to re-measure acceptance) and returns to
the model's choice only if that pays. It only chooses how many tokens to draft,
so it never changes the output distribution.
"""
from __future__ import annotations

from .config import SpeculationConfig
from .costmodel import best_gamma


class FixedController:
    def __init__(self, gamma: int):
        self.gamma = gamma

    def choose(self) -> int:
        return self.gamma

    def update(self, gamma: int, accepted: int) -> None:
        pass


class AutoController:
    DECAY = 0.15        # weight of the newest observation
    PAUSE_ROUNDS = 16   # target-only rounds before probing again
    DEEPER = 0.9        # an unmeasured position: this times the acceptance of the one before it

    def __init__(self, max_gamma: int, profile: dict | None, target, draft_lm):
        self.max_gamma = max_gamma
        prof = profile or {}
        self.alphas = list(prof.get("alphas") or [0.7] * max_gamma)[:max_gamma]
        self.alphas += [self.alphas[-1]] * (max_gamma - len(self.alphas))
        self.draft_cost = prof.get("draft_cost")
        self.target_costs = list(prof.get("target_costs") or [])
        self.target, self.draft_lm = target, draft_lm
        self.paused = 0
        self._probe = self._probing = False
        self._warm = False  # the first pass includes the prompt prefill: not a cost sample
        self._mark()

    def _mark(self) -> None:
        self._t = self.target.run_time_s
        self._d = self.draft_lm.run_time_s if self.draft_lm is not None else 0.0

    def choose(self) -> int:
        if self.paused > 0:
            self.paused -= 1
            return 0
        if self._probe:  # the pause is over: one draft token re-measures the first position
            self._probe, self._probing = False, True
            return 1
        if not self.target_costs or self.draft_cost is None:
            return 1 if len(self.target_costs) < 2 else min(len(self.target_costs) - 1, self.max_gamma)
        gamma, speedup = best_gamma(self.alphas, self.draft_cost, self.target_costs, self.max_gamma)
        if gamma == 0:
            self.paused = self.PAUSE_ROUNDS
            self._probe = True
        return gamma

    def update(self, gamma: int, accepted: int) -> None:
        t_time = self.target.run_time_s - self._t
        d_time = (self.draft_lm.run_time_s - self._d) if self.draft_lm is not None else 0.0
        self._mark()
        if not self._warm:
            self._warm = True
            return
        k = gamma + 1
        while len(self.target_costs) < k:
            self.target_costs.append(t_time if not self.target_costs else max(self.target_costs[-1], t_time))
        self.target_costs[k - 1] += self.DECAY * (t_time - self.target_costs[k - 1])
        if gamma:
            step = d_time / gamma
            self.draft_cost = step if self.draft_cost is None else self.draft_cost + self.DECAY * (step - self.draft_cost)
        weight = 0.5 if self._probing else self.DECAY  # a probe is rare: let it count
        self._probing = False
        for i in range(min(gamma, accepted + 1)):
            hit = 1.0 if i < accepted else 0.0
            self.alphas[i] += weight * (hit - self.alphas[i])
        if gamma:  # positions not proposed this round: a little worse than the one before
            for j in range(gamma, self.max_gamma):
                self.alphas[j] = self.DEEPER * self.alphas[j - 1]


def make_controller(speculation: SpeculationConfig, generator):
    if speculation.num_draft_tokens == "auto":
        lm = getattr(generator.drafter, "lm", None)
        profile = dict(generator.profile())
        if lm is None:
            profile["draft_cost"] = 0.0  # n-gram lookup costs next to nothing
        costs = list(profile.get("target_costs") or [])
        if speculation.bitwise and len(costs) >= 2:
            costs[0] = costs[1]  # bitwise target-only steps are passes of two positions
        profile["target_costs"] = costs
        return AutoController(min(8, speculation.max_draft_tokens), profile, generator.target, lm)
    return FixedController(int(speculation.num_draft_tokens))
