"""What a generation returns: Stats (what it did, where its time went), Event (tokens committed together), Result."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Stats:
    """What one generation did and where its time went."""

    rounds: int = 0
    drafted: int = 0
    accepted: int = 0
    new_tokens: int = 0
    proposed_at: list = field(default_factory=list)   # per draft position: rounds that proposed it
    reached_at: list = field(default_factory=list)    # per draft position: rounds that verified it (all before passed)
    accepted_at: list = field(default_factory=list)   # per draft position: rounds that accepted it
    # per draft position (sampling), where the generator's ``record_min_mass`` or an auto gamma asks for it:
    min_mass_at: list = field(default_factory=list)   # the sum of sum_x min(p, q) ...
    verified_at: list = field(default_factory=list)   # ... over this many verified positions
    round_times_s: list = field(default_factory=list)
    round_tokens: list = field(default_factory=list)
    round_gammas: list = field(default_factory=list)
    # per round: (positions of its target pass, the target's run time, the draft model's run time), or None for a
    # round that also read a prompt (the first; one where the draft caught up with a long prompt): no step cost
    round_passes: list = field(default_factory=list)
    target_time_s: float = 0.0
    draft_time_s: float = 0.0
    overhead_time_s: float = 0.0
    total_time_s: float = 0.0
    first_token_s: float = 0.0    # time to the first committed token (prefill included)
    draft_disabled: bool = False  # the drafter failed (or never loaded): the target alone decoded the rest
    draft_error: str | None = None  # ... and why
    forced: int = 0               # drafts a constraint forced (structured output), proposed without a draft step
    forced_accepted: int = 0      # ... and those the target accepted
    constraint_time_s: float = 0.0  # spent in the constraint's matcher (moving it, making masks)
    prediction_accepted: int = 0  # tokens of the request's predicted output proposed and accepted ...
    prediction_rejected: int = 0  # ... and proposed and rejected (verified, then thrown away)
    cached_tokens: int = 0        # prompt tokens the target's cache already held (an earlier request's), not fed

    @property
    def acceptance_rate(self) -> float:
        """Accepted / proposed draft tokens."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def per_position_acceptance(self) -> list[float]:
        """P(draft i accepted | drafts 1..i-1 were), i = 1..gamma: the alphas of the cost model."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted_at, self.reached_at)]

    @property
    def per_position_min_mass(self) -> list[float]:
        """Mean sum_x min(p_i, q_i) over the rounds that verified position i: its expected acceptance (recorded
        when sampling with ``SpeculativeGenerator.record_min_mass`` on, as bench runs, or an auto gamma; else
        empty)."""
        return [m / n if n else 0.0 for m, n in zip(self.min_mass_at, self.verified_at)]

    @property
    def tokens_per_round(self) -> float:
        return self.new_tokens / self.rounds if self.rounds else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.total_time_s if self.total_time_s > 0 else 0.0

    def record(self, gamma: int, verdict_accepted: int, committed: int, seconds: float) -> None:
        self.rounds += 1
        self.drafted += gamma
        self.accepted += verdict_accepted
        self.new_tokens += committed
        while len(self.proposed_at) < gamma:
            self.proposed_at.append(0)
            self.reached_at.append(0)
            self.accepted_at.append(0)
        for i in range(gamma):
            self.proposed_at[i] += 1
            self.reached_at[i] += i <= verdict_accepted
            self.accepted_at[i] += i < verdict_accepted
        self.round_times_s.append(seconds)
        self.round_tokens.append(committed)
        self.round_gammas.append(gamma)

    def record_min_mass(self, masses: list[float]) -> None:
        for i, m in enumerate(masses):
            if i == len(self.min_mass_at):
                self.min_mass_at.append(0.0)
                self.verified_at.append(0)
            self.min_mass_at[i] += m
            self.verified_at[i] += 1

    def to_dict(self) -> dict:
        return {
            "rounds": self.rounds, "drafted": self.drafted, "accepted": self.accepted,
            "new_tokens": self.new_tokens, "acceptance_rate": self.acceptance_rate,
            "per_position_acceptance": self.per_position_acceptance,
            "per_position_min_mass": self.per_position_min_mass,
            "tokens_per_round": self.tokens_per_round, "tokens_per_s": self.tokens_per_s,
            "target_time_s": self.target_time_s, "draft_time_s": self.draft_time_s,
            "overhead_time_s": self.overhead_time_s, "total_time_s": self.total_time_s,
            "first_token_s": self.first_token_s,
            "draft_disabled": self.draft_disabled, "draft_error": self.draft_error,
            "forced": self.forced, "forced_accepted": self.forced_accepted,
            "constraint_time_s": self.constraint_time_s,
            "prediction_accepted": self.prediction_accepted, "prediction_rejected": self.prediction_rejected,
        }


@dataclass(frozen=True)
class Event:
    """Tokens committed together: kind is accepted | corrected | bonus | target."""

    token_ids: list[int]
    text: str
    kind: str
    logprobs: list | None = None  # one TokenLogprob per token, where the request asked for them


@dataclass(frozen=True)
class Result:
    token_ids: list[int]
    text: str | None
    stats: Stats
    finish_reason: str  # "eos" | "length"
    logprobs: list | None = None  # one TokenLogprob per token, where the request asked for them

    def to_dict(self) -> dict:
        out = {"token_ids": self.token_ids, "text": self.text, "finish_reason": self.finish_reason,
               "stats": self.stats.to_dict()}
        if self.logprobs is not None:
            out["logprobs"] = [{"token_id": t.token_id, "logprob": t.logprob, "top": [list(x) for x in t.top]}
                               for t in self.logprobs]
        return out

