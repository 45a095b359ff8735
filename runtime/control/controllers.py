"""Choosing gamma per round: a fixed count, or "auto" from the cost model.

The auto controller keeps exponentially weighted per-position acceptance
estimates and per-call cost estimates measured online from the models' own
run times (C_d per draft step, C_t(k) per target pass of k tokens), and picks
the gamma with the highest predicted speedup. Positions it has not drafted
lately are assumed a little worse than the deepest one it has (conditional
acceptance falls with depth), so it does not reach for long drafts on faith;
positions known only from earlier requests move with the deepest one this
request has reached (a prior that makes long drafts look poor is re-tested
once shorter ones pass better than it said).
When no gamma predicts a gain (and the first position has been seen often
enough to trust that: a neutral guess is not evidence) it decodes
target-only for a while, then probes
with one draft token (the cheapest way to re-measure acceptance) and returns to
the model's choice only if that pays. It only chooses how many tokens to draft,
so it never changes the output distribution.

One bad measurement must not decide for good: a pass size's cost that has
only come from the stored profile is read through a smoothness prior (no
jump from one size to the next above a few times the profile's typical step),
every EXPLORE_EVERY rounds a draft length whose pass it has not timed lately
is tried once if it is predicted to be competitive, and ``drift`` reports how
far the costs timed online have moved from the profile, so the generator can
store the new ones (a re-calibration that costs nothing). A request hands the
next one of its generator the pass sizes it timed (with their age) and its mean
acceptance per position, pooled with what it started from.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Callable

from ..config import SpeculationConfig
from .costmodel import best_gamma, predicted_speedup


@dataclass(frozen=True)
class Lessons:
    """What a controller that plans learned in one request, for the next (``ProfileMemory.learn`` reads it)."""

    rounds: int                 # rounds it learned from
    settled: bool               # enough of them (EXPLORE_EVERY) to correct the stored profile
    acceptance: dict            # the next request's starting acceptance (``carried_acceptance``)
    timings: dict               # the pass sizes it timed (``carried_timings``)
    timed_sizes: int            # how many pass sizes it timed
    worst_drift: float | None   # the timed/profile cost ratio farthest from 1 (``worst_drift``)
    shape_drift: tuple[float, int] | None  # how far the timed costs' shape is from the profile's
    learned_profile: Callable[[], dict]    # costs for a stored profile (computed when asked)
    times_draft: bool           # a draft model's steps were timed (not n-gram lookups)


class Controller:
    """What the decode loop asks of a gamma controller: ``choose`` before each round, ``update`` after it; and
    what a request keeps of it (``plans``: it chose gamma; ``lessons``: what it learned, to be kept)."""

    plans = False         # chooses gamma (what it learns may be kept for the next request)
    reads_masses = False  # learns acceptance from sum_x min(p, q) when sampling
    rounds = 0            # rounds it has learned from
    draft_cost: float | None = None  # the draft step's cost as timed online (or the profile's)
    crowd = None  # the batch the request's passes ride with now (engine.batch.Crowd, set each round), or None

    def choose(self) -> int:
        """The number of tokens to draft this round (0: none)."""
        raise NotImplementedError

    def update(self, gamma: int, accepted: int, side: bool = False, prefill: bool = False, masses=None,
               shared: bool = False) -> None:
        """A round is over: ``gamma`` drafted (0 when the drafts were free guesses or none), ``accepted`` of them
        passed; ``side``: drafted by a source this controller does not plan; ``prefill``: a model read a prompt
        in the round (its times are no step cost); ``masses``: sum_x min(p, q) per verified position;
        ``shared``: its target pass rode a batch (its time is a part of that pass, no pass of its own)."""

    def live_costs(self) -> list[float] | None:
        """The target's pass costs C_t(1..) for a drafter that sizes its proposals by cost (None: unknown)."""
        return None

    def lessons(self) -> Lessons | None:
        """What the next request may keep of this one (None: nothing, as for a gamma that was not chosen)."""
        return None


class FixedController(Controller):
    """The same gamma every round; learns nothing."""

    def __init__(self, gamma: int):
        self.gamma = gamma

    def choose(self) -> int:
        return self.gamma


class AutoController(Controller):
    DECAY = 0.15        # weight of the newest observation
    PAUSE_ROUNDS = 16   # target-only rounds before probing again
    DEEPER = 0.9        # an unmeasured position: this times the acceptance of the one before it
    EXPLORE_EVERY = 24  # rounds between tries of a draft length whose pass was not timed lately
    STALE = 96          # a pass size not timed for this many rounds may be tried again ...
    COMPETITIVE = 0.9   # ... when its predicted speedup is at least this share of the best
    MAX_JUMP = 3.0      # a profile-only cost may exceed the size before it by this many typical steps
    EVIDENCE = 8        # observations of the first position before a pause is trusted (a prior counts as many)
    POOL = 64           # observations per position a carried acceptance counts as, at most (it follows the pair)
    FOLLOW = True       # positions known only from earlier requests move with the deepest one observed now
    plans = True        # chooses gamma (what it learns may be kept for the next request)
    reads_masses = True  # learns acceptance from sum_x min(p, q) when sampling

    def __init__(self, max_gamma: int, profile: dict | None, target, draft_lm):
        self.max_gamma = max_gamma
        prof = profile or {}
        self.alphas = list(prof.get("alphas") or [0.7] * max_gamma)[:max_gamma]
        self.alphas += [self.alphas[-1]] * (max_gamma - len(self.alphas))
        # positions whose acceptance has been observed (by this controller or an earlier request)
        self.measured = (list(prof.get("measured") or []) + [False] * max_gamma)[:max_gamma]
        # observations of the first position behind its estimate: a neutral guess has none, so two early
        # rejections cannot pause drafting on their own
        self.evidence = self.EVIDENCE if self.measured[0] else 0
        # what the acceptance was carried in as, with how many observations stand behind each position (a stored
        # prior: EVIDENCE per measured position), and this request's observations (the next request's prior
        # pools them: a request's mean, not the end of its exponential average, which is its last few rounds)
        self._prior = list(self.alphas)
        counts = list(prof.get("counts") or [])
        self._prior_n = [min(int(counts[i]), self.POOL) if i < len(counts) else self.EVIDENCE if self.measured[i] else 0
                         for i in range(max_gamma)]
        self._sums, self._seen = [0.0] * max_gamma, [0] * max_gamma
        self.draft_cost = prof.get("draft_cost")
        self.target_costs = list(prof.get("target_costs") or [])
        self.target, self.draft_lm = target, draft_lm
        self.profile_costs = list(self.target_costs)
        steps = sorted(abs(b - a) for a, b in zip(self.profile_costs, self.profile_costs[1:]))
        self._typical_step = steps[len(steps) // 2] if steps else None  # the profile's median step
        self.timed_at: dict[int, int] = {}   # pass size -> round of its latest online timing
        self.timed_count: dict[int, int] = {}
        self.rounds = 0
        self.paused = 0
        self._probe = self._probing = False
        self._explored = 0
        self._warm = False  # the first pass includes the prompt prefill: not a cost sample
        # pass sizes an earlier request of this generator timed: (cost, rounds since, times timed). They stay
        # timed here (not read at the profile's value, which a slower day makes look cheap, so that every
        # request would try each once) and age on, so exploration re-times them as it would within one request.
        for k, (cost, age, count) in sorted((prof.get("timed") or {}).items()):
            while len(self.target_costs) < k:
                self.target_costs.append(self.target_costs[-1] if self.target_costs else cost)
            self.target_costs[k - 1] = cost
            self.timed_at[k], self.timed_count[k] = -int(age), int(count)
        self._mark()

    def _mark(self) -> None:
        self._t = self.target.run_time_s
        self._d = self.draft_lm.run_time_s if self.draft_lm is not None else 0.0

    def choose(self) -> int:
        crowd = self._crowd_costs()
        if crowd and self.draft_cost is not None and \
                best_gamma([1.0] * self.max_gamma, self.draft_cost, crowd, self.max_gamma)[0] == 0:
            # in this batch not even a draft accepted every time would pay: no draft, and no probe either (it
            # would measure nothing that could change this; the request drafts again once the batch thins)
            return 0
        if self.paused > 0:
            self.paused -= 1
            return 0
        if self._probe:  # the pause is over: one draft token re-measures the first position
            self._probe, self._probing = False, True
            return 1
        if not self.target_costs or self.draft_cost is None:
            return 1 if len(self.target_costs) < 2 else min(len(self.target_costs) - 1, self.max_gamma)
        costs = crowd or self.costs()
        gamma, speedup = best_gamma(self.alphas, self.draft_cost, costs, self.max_gamma)
        if gamma == 0:
            if self.evidence < self.EVIDENCE:
                return 1  # too little seen to stop drafting: keep measuring with the cheapest draft
            self.paused = self.PAUSE_ROUNDS
            self._probe = True
            return 0
        if self.rounds - self._explored >= self.EXPLORE_EVERY:
            self._explored = self.rounds
            stale = [g for g in range(1, self.max_gamma + 1) if g != gamma
                     and self.rounds - self.timed_at.get(g + 1, -self.STALE) >= self.STALE
                     and predicted_speedup(self.alphas, g, self.draft_cost, costs) >= self.COMPETITIVE * speedup]
            if stale:
                return max(stale, key=lambda g: predicted_speedup(self.alphas, g, self.draft_cost, costs))
        return gamma

    def _time_pass(self, k: int, t_time: float) -> None:
        while len(self.target_costs) < k:
            self.target_costs.append(t_time if not self.target_costs else max(self.target_costs[-1], t_time))
        # the first timing of a size replaces the profile's value; later ones are averaged in
        weight = self.DECAY if k in self.timed_at else 1.0
        self.target_costs[k - 1] += weight * (t_time - self.target_costs[k - 1])
        self.timed_at[k] = self.rounds
        self.timed_count[k] = self.timed_count.get(k, 0) + 1

    def live_costs(self) -> list[float] | None:
        """C_t(k) for a drafter that sizes its proposals by cost: the request's part of a batched pass in a
        crowd; else ``costs()`` once at least two pass sizes have been timed online, the profile's before that
        (None without a profile)."""
        return self._crowd_costs() or (self.costs() if len(self.timed_at) >= 2 else (list(self.profile_costs) or None))

    def _crowd_costs(self) -> list[float] | None:
        """The request's part of a batched pass by its size, in a batch (None alone)."""
        return list(self.crowd.pass_costs) if self.crowd is not None and self.crowd.pass_costs else None

    def costs(self) -> list[float]:
        """C_t(k) as decisions read it. Timed sizes as timed. A size known only from the profile is read
        no higher than (a) the size before it plus MAX_JUMP times the profile's median step, and (b) the
        line through the two nearest timed sizes below it: one bad calibration cannot hide a size for good
        (exploration then times it)."""
        return self._smoothed(list(self.target_costs), 1.0)

    def _smoothed(self, out: list[float], scale: float) -> list[float]:
        jump = None if self._typical_step is None else self.MAX_JUMP * scale * self._typical_step
        for k in range(2, len(out) + 1):
            if k in self.timed_at:
                continue
            if jump is not None and out[k - 1] > out[k - 2] + jump:
                out[k - 1] = out[k - 2] + jump
            below = sorted(j for j in self.timed_at if j < k)[-2:]
            if len(below) == 2:
                (j1, j2) = below
                slope = max(0.0, (out[j2 - 1] - out[j1 - 1]) / (j2 - j1))
                out[k - 1] = min(out[k - 1], out[j2 - 1] + slope * (k - j2))
        return out

    def drift(self) -> float | None:
        """Median ratio of the pass costs timed online to the profile's, over the sizes timed; None before
        any (or without a profile)."""
        ratios = sorted(self._ratios().values())
        return ratios[len(ratios) // 2] if ratios else None

    def worst_drift(self) -> float | None:
        """The timed/profile cost ratio farthest from 1 among sizes timed at least 3 times (one bad size)."""
        ratios = [r for k, r in self._ratios().items() if self.timed_count.get(k, 0) >= 3]
        return max(ratios, key=lambda r: max(r, 1 / r)) if ratios else None

    def shape_drift(self) -> tuple[float, int] | None:
        """How far the shape of the costs timed online is from the profile's: each timed size's cost over that
        of a reference size (the size from 2 up timed most, at least 3 times), divided by the same ratio in the
        profile; the median of those, as a factor >= 1, and the reference size. None with fewer than two other
        sizes timed. Load slows every size alike, so a shape that moved says the profile was wrong, not that
        the machine is busy now."""
        sizes = [k for k in self.timed_at if k >= 2 and k <= len(self.profile_costs) and self.profile_costs[k - 1] > 0]
        if not sizes:
            return None
        ref = max(sizes, key=lambda k: (self.timed_count.get(k, 0), -k))
        others = [k for k in sizes if k != ref]
        if self.timed_count.get(ref, 0) < 3 or len(others) < 2:
            return None
        mid = median((self.target_costs[k - 1] / self.target_costs[ref - 1]) /
                     (self.profile_costs[k - 1] / self.profile_costs[ref - 1]) for k in others)
        return max(mid, 1 / mid), ref

    def _ratios(self) -> dict[int, float]:
        return {k: self.target_costs[k - 1] / self.profile_costs[k - 1] for k in self.timed_at
                if k <= len(self.profile_costs) and self.profile_costs[k - 1] > 0}

    def learned_profile(self) -> dict:
        """Costs for a stored profile: timed sizes as timed; a size between two timed ones on the line through
        them, one above the largest on the line through the two largest (never falling); any other scaled by
        the drift of the nearest timed size and read through the same prior as decisions. Untimed sizes
        follow the timings, not the profile's shape, so a profile taken under load (flat, say) is repaired."""
        ratios = self._ratios()
        cost = self.target_costs
        base = [c if k in self.timed_at or not ratios else c * ratios[min(ratios, key=lambda j: (abs(j - k), j))]
                for k, c in enumerate(cost, start=1)]
        out = self._smoothed(base, self.drift() or 1.0)
        timed = sorted(k for k in self.timed_at if k <= len(cost))
        for k in set(range(1, len(cost) + 1)) - set(timed):
            below, above = [j for j in timed if j < k], [j for j in timed if j > k]
            if below and above:
                j1, j2 = below[-1], above[0]
                out[k - 1] = cost[j1 - 1] + (cost[j2 - 1] - cost[j1 - 1]) * (k - j1) / (j2 - j1)
            elif len(below) >= 2:
                j1, j2 = below[-2:]
                out[k - 1] = cost[j2 - 1] + max(0.0, (cost[j2 - 1] - cost[j1 - 1]) / (j2 - j1)) * (k - j2)
        return {"target_costs": out, "draft_cost": self.draft_cost}

    def update(self, gamma: int, accepted: int, side: bool = False, prefill: bool = False, masses=None,
               shared: bool = False) -> None:
        """Learn from a round: its target pass time (not a ``shared`` one's: a batch's costs come with its crowd),
        and (unless the draft came from a ``side`` source the controller does not plan, such as the hybrid
        drafter's lookups) the draft step and acceptance. The first round, and one where a model read a prompt
        (``prefill``), time no step. ``masses`` (sampling): sum_x min(p, q) of each verified position, the
        probability that it is accepted: learned in place of the accept/reject outcome, which has the same mean
        and far more noise."""
        t_time = self.target.run_time_s - self._t
        d_time = (self.draft_lm.run_time_s - self._d) if self.draft_lm is not None else 0.0
        self._mark()
        if not self._warm or prefill:
            self._warm = True
            return
        self.rounds += 1
        k = gamma + 1
        if gamma > self.max_gamma:
            return  # a long copy's proposal: beyond the sizes planned here
        if not shared:
            self._time_pass(k, t_time)
        if side:
            return
        if gamma:
            step = d_time / gamma
            self.draft_cost = step if self.draft_cost is None else self.draft_cost + self.DECAY * (step - self.draft_cost)
        weight = 0.5 if self._probing else self.DECAY  # a probe is rare: let it count
        self._probing = False
        for i in range(min(gamma, accepted + 1, self.max_gamma)):  # a long copy may run past max_gamma
            hit = masses[i] if masses and i < len(masses) else 1.0 if i < accepted else 0.0
            self.alphas[i] += weight * (hit - self.alphas[i])
            self.measured[i] = True
            self._sums[i] += hit
            self._seen[i] += 1
        if gamma:
            self.evidence += 1
        if gamma:  # positions never proposed: a little worse than the one before; observed ones keep theirs
            for j in range(gamma, self.max_gamma):
                if not self.measured[j]:
                    self.alphas[j] = self.DEEPER * self.alphas[j - 1]
        if self.FOLLOW:
            self._follow()

    def _follow(self) -> None:
        """Positions known only from the prior, past the deepest one this request has observed, move with it:
        the prior's value shifted by how far that position's estimate moved from its prior. A request's drafts
        agree better or worse at every depth together; without this, a prior that makes long drafts look poor
        is never re-measured (only drafting that deep measures those positions)."""
        seen = [i for i, n in enumerate(self._seen) if n]
        if not seen:
            return
        d = seen[-1]
        shift = self.alphas[d] - self._prior[d]
        for j in range(d + 1, self.max_gamma):
            if self.measured[j] and not self._seen[j]:
                self.alphas[j] = min(max(self._prior[j] + shift, 0.0), 1.0)

    def carried_acceptance(self) -> dict:
        """The next request's starting acceptance: per position, the mean of what this request observed pooled
        with the prior it started from (weighted by observations, at most POOL); a position never observed
        keeps its current estimate."""
        alphas, counts = [], []
        for i, (prior, n0, total, n) in enumerate(zip(self._prior, self._prior_n, self._sums, self._seen)):
            alphas.append((prior * n0 + total) / (n0 + n) if n0 + n else self.alphas[i])
            counts.append(min(n0 + n, self.POOL))
        return {"alphas": [round(a, 3) for a in alphas], "measured": list(self.measured), "counts": counts}

    def carried_timings(self) -> dict:
        """The pass sizes timed, for the next request of the same kind of pass: {size: (cost, rounds since its
        latest timing, times timed)}, and the draft step."""
        timed = {k: (self.target_costs[k - 1], self.rounds - at, self.timed_count[k])
                 for k, at in self.timed_at.items() if k <= len(self.target_costs)}
        return {"timed": timed, "draft_cost": self.draft_cost}


    def lessons(self) -> Lessons | None:
        if not self.plans:
            return None
        return Lessons(self.rounds, self.rounds >= self.EXPLORE_EVERY, self.carried_acceptance(),
                       self.carried_timings(), len(self.timed_at), self.worst_drift(), self.shape_drift(),
                       self.learned_profile, self.draft_lm is not None)


class TimedFixedController(AutoController):
    """A fixed gamma, with the pass costs, draft step and acceptance timed online as auto times them: for
    drafters that choose their proposals by cost (the hybrid's source, a long copy's length). Nothing it
    learns is stored."""

    plans = False

    def __init__(self, gamma: int, profile: dict | None, target, draft_lm):
        super().__init__(min(8, max(gamma, 1)), profile, target, draft_lm)
        self.gamma = gamma

    def choose(self) -> int:
        return self.gamma


def planning_costs(profile: dict | None, bitwise: bool, row_tile: int = 32) -> list[float]:
    """A profile's target pass costs C_t(1..) as decisions read them: with bitwise passes a pass of
    row_tile * k + 1 positions runs with one more, so C_t(1) is C_t(2) (and with a tile of 2, C_t(3) is C_t(4),
    and so on)."""
    costs = list((profile or {}).get("target_costs") or [])
    if bitwise:
        for size in range(1, len(costs)):  # (size = index + 1; the last size has no larger one to read)
            if size % row_tile == 1:
                costs[size - 1] = costs[size]
    return costs


def acceptance_mode(sampling) -> str:
    """Which acceptance a request's drafts have: greedy matching and sampled acceptance differ widely."""
    return "sampled" if sampling.do_sample else "greedy"


def make_controller(speculation: SpeculationConfig, generator, mode: str = "greedy", drafter=None):
    """The request's gamma controller. auto starts from the acceptance this generator's last auto request of
    the same mode learned, else the one stored in the bundle's profile, else a neutral guess."""
    auto = speculation.num_draft_tokens == "auto"
    drafter = generator.drafter if drafter is None else drafter  # (the request's: a prediction wraps the generator's)
    if not auto and not drafter.sizes_by_cost:
        return FixedController(int(speculation.num_draft_tokens))
    lm, memory = drafter.lm, generator.memory
    profile = dict((generator.profile() if auto else memory.stored()) or {})  # auto calibrates once
    if lm is None:
        profile["draft_cost"] = 0.0  # n-gram lookup costs next to nothing
    profile["target_costs"] = planning_costs(profile, speculation.bitwise, generator.target.row_tile)
    prior = memory.acceptance_prior.get(mode) or stored_acceptance(profile).get(mode)
    profile.update(prior or {})
    timings = memory.timing_prior.get(bool(speculation.bitwise))
    if timings:  # what the generator's last auto request of the same pass kind timed (C_t(1) differs by kind)
        profile["timed"] = timings["timed"]
        if lm is not None and timings["draft_cost"] is not None:
            profile["draft_cost"] = timings["draft_cost"]
    if not auto:  # a drafter that sizes its proposals by cost gets the costs timed online
        return TimedFixedController(int(speculation.num_draft_tokens), profile, generator.target, lm)
    return AutoController(min(8, speculation.max_draft_tokens), profile, generator.target, lm)


def stored_acceptance(profile: dict | None) -> dict:
    """A profile's per-mode acceptance ({mode: {"alphas", "measured"}}), leaving out what is damaged (a
    hand-edited profile): such an entry is as good as none."""
    stored = (profile or {}).get("acceptance")
    out = {}
    for mode, prior in (stored.items() if isinstance(stored, dict) else ()):
        try:
            alphas = [min(max(float(a), 0.0), 1.0) for a in prior["alphas"]]
            measured = [bool(m) for m in prior["measured"]]
        except (TypeError, KeyError, ValueError):
            continue
        if alphas:
            out[mode] = {"alphas": alphas, "measured": measured}
    return out
