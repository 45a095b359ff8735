"""What the decode loop may ask of a drafter (the Drafter base class), the Draft it returns, and target-only decoding."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

import numpy as np

from ..checks import is_int
from ..sampling import Dist, LogitsPipeline

if TYPE_CHECKING:
    from ..engine import CausalLM


@dataclass(frozen=True)
class Draft:
    """A proposal: the tokens and, when sampling, the distribution each was drawn from (after the full logits
    pipeline), so the verifier sees exactly the q that was sampled."""

    tokens: list[int]
    dists: list[Dist] | None  # when sampling: the distribution each token was drawn from, else None
    side: bool = False        # drafted by a source the draft-length controller does not plan (hybrid n-grams)
    origin: str = ""          # "prediction": taken from the request's predicted output

    @staticmethod
    def empty() -> "Draft":
        return Draft([], None)


class Drafter:
    """Where candidate tokens come from: everything the decode loop asks of a drafter, with the answers of a
    drafter that runs no model. A drafter changes only how many drafts pass, never the output distribution."""

    name = "none"
    #: the draft model this drafter runs (its cache follows the committed text), or None
    lm: CausalLM | None = None
    #: the model whose cache the draft model reads for committed text (a self-draft on its target's), or None
    source: CausalLM | None = None
    #: the context window the draft model reads (None: all of it)
    window: int | None = None
    #: asked to propose in rounds where an auto gamma paused model drafting (gamma 0): lookups may still pay
    drafts_when_paused = False
    #: sizes its proposals from the target's pass costs (``set_costs``): gets a controller that times them
    sizes_by_cost = False

    def propose(self, committed: Sequence[int], gamma: int, pipeline: LogitsPipeline, sampling: bool,
                rng: np.random.Generator, limit: int | None = None) -> Draft:
        """Up to ``gamma`` tokens to follow ``committed`` (more, up to ``limit`` >= gamma, when it has reason to
        draft more: a long copy of earlier text; ``limit`` is bounded by max_new_tokens and the context), each
        with the distribution it was drawn from when ``sampling``."""
        return Draft.empty()

    def sync(self, committed: Sequence[int]) -> None:
        """Roll the drafter's state back to what is still on the committed path."""

    def view(self, committed: Sequence[int]) -> list[int]:
        """The tokens of this context the draft model reads (its cache holds a prefix of them)."""
        return list(committed)

    def unread(self, committed: Sequence[int]) -> int:
        """Tokens of this context the draft model has yet to read (its next proposal feeds them first)."""
        return 0

    def set_stop(self, stop) -> None:
        """``stop``: a callable a model drafter asks before each draft step after its first (a draft that ends
        early where it says True: a scheduler with a request waiting for its first token), or None."""

    def set_costs(self, pass_costs: list[float] | None, draft_cost: float | None, crowded: bool = False) -> None:
        """The target's pass costs C_t(1..) and the draft step's cost as the request's controller knows them
        now (for drafters that size proposals by cost); ``crowded``: the pass costs are the request's part of
        a batched pass (engine.batch.Crowd)."""


class NoDrafter(Drafter):
    """Target-only decoding through the same loop: the baseline."""


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



def check_window(window):
    if window is not None and not is_int(window, 16):
        raise ValueError(f"draft_window must be an integer >= 16 or None, got {window!r}")
    return window

