"""What a generator keeps between requests: the stored profile (step costs, acceptance) and the last controller's priors."""
from __future__ import annotations

from pathlib import Path

from .calibrate import load_profile, measure, save_profile
from .controllers import Lessons, stored_acceptance


class ProfileMemory:
    """The calibrated profile of one bundle on this machine (``ortspec-profile.json`` in the bundle: step costs
    C_t(k) and C_d, and per-mode acceptance), read or measured once, and corrected from what auto controllers
    time (``learn``); and, in memory only, the last auto request's acceptance per mode ("greedy", "sampled")
    and the pass sizes it timed per kind of pass (bitwise or not), the next request's starting point."""

    # costs timed online this much below the stored profile replace it (above it they may be a busy machine's:
    # load only ever slows passes, so slower timings are not stored)
    DRIFT = 1.25
    MOVED = 0.05  # a per-position acceptance this far from the stored one is stored again

    def __init__(self, root: Path, provider: str, data: dict | None = None, read: bool = False):
        self.root, self.provider = root, provider
        self.data = data    # the profile, once read or measured
        self._read = read   # the stored profile was looked for
        # the last auto controller's per-position acceptance, per mode: a request is too short to learn from a
        # neutral guess, and this pair's drafts agree about as well next time (also kept in the stored profile)
        self.acceptance_prior: dict = {}
        # the pass sizes it timed, per kind of pass (bitwise or not: C_t(1) is a pass of two positions or of
        # one): kept only in memory, since they are this process's view of the machine now
        self.timing_prior: dict = {}

    def sibling(self) -> "ProfileMemory":
        """A memory for another generator over the same models: the same profile, priors of its own."""
        return ProfileMemory(self.root, self.provider, self.data, self._read)

    def measured(self, target, draft_lm) -> dict:
        """The profile, measured on these models (and stored) when none is stored for this machine."""
        if self.data is None:
            self.data = load_profile(self.root, self.provider)
            if self.data is None:
                self.data = measure(target, draft_lm)
                save_profile(self.root, self.provider, self.data)
        return self.data

    def stored(self) -> dict | None:
        """The profile stored for this machine, if any (never measures)."""
        if self.data is None and not self._read:
            self.data, self._read = load_profile(self.root, self.provider), True
        return self.data

    def store(self, profile: dict) -> None:
        self.data = profile
        save_profile(self.root, self.provider, profile)

    def learn(self, lessons: Lessons | None, mode: str, bitwise: bool) -> None:
        """Keep what an auto controller learned (its ``lessons``): its acceptance and pass timings for the next
        request (the acceptance also in the stored profile, once a request measured enough of it), and store the pass costs it timed when they are
        well below the profile's (the profile was measured on a busy machine, or the machine got faster): a
        re-calibration for free. Timings above the profile's are not stored (they may say only that the machine
        is busy now), except for their shape: when the sizes' costs relative to each other contradict the
        profile's, the timed shape is stored at the profile's level."""
        if lessons is None:
            return  # a fixed gamma's timings and acceptance are not kept
        if lessons.rounds:
            self.acceptance_prior[mode] = carried = lessons.acceptance
            self.timing_prior[bool(bitwise)] = lessons.timings
            seen = {"alphas": carried["alphas"], "measured": carried["measured"]}
            if lessons.settled and self.data is not None:
                stored = stored_acceptance(self.data)
                old = stored.get(mode, {}).get("alphas", [])
                if len(old) != len(seen["alphas"]) or max(abs(a - b) for a, b in zip(old, seen["alphas"])) > self.MOVED:
                    self.store(dict(self.data, acceptance={**stored, mode: seen}))
        if self.data is None or lessons.timed_sizes < 2 or not lessons.settled:
            return  # nothing to correct, or too little evidence
        drift = lessons.worst_drift
        faster = drift is not None and drift < 1 / self.DRIFT
        shape = lessons.shape_drift
        if not faster and (shape is None or shape[0] <= self.DRIFT):
            return
        learned = lessons.learned_profile()
        costs = learned["target_costs"]
        old = list(self.data.get("target_costs") or [])
        if faster:
            stored = dict(self.data, relearned_from_drift=round(drift, 3))
        else:  # only the shape is wrong: the timed shape at the profile's level (slower timings may be load)
            ref = shape[1]
            costs = [c * old[ref - 1] / costs[ref - 1] for c in costs] if ref <= len(old) else costs
            stored = dict(self.data, reshaped_by=round(shape[0], 3))
        # C_t(1) stays as measured (bitwise decoding times two-position passes in its place), and only a model
        # drafter's timings say anything about the draft's step (only when faster: a slower one may be load)
        stored["target_costs"] = old[:1] + costs[1:]
        if faster and lessons.times_draft and learned["draft_cost"] is not None:
            stored["draft_cost"] = learned["draft_cost"]
        self.store(stored)
