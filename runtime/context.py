"""What a request's decode loop works with, declared: the generator's models, drafter and settings (DecodeContext),
and what a generator shares with its siblings over the same target (Shared)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .constrain import Vocabulary
from .control import ProfileMemory
from .drafting import Drafter, PromptLookupDrafter
from .engine import CausalLM
from .request import Busy
from .sampling import Scratch
from .text import TextCodec


@dataclass
class Shared:
    """What a generator and its siblings share: they run over the same target, one generation at a time
    (``busy``), reuse the same vocabulary-wide arrays (``scratch``; calls hold the lock) and the grammar
    engine's view of the tokenizer (``vocabulary``, made at the first structured request)."""

    busy: Busy = field(default_factory=Busy)
    scratch: Scratch = field(default_factory=Scratch)
    vocabulary: Vocabulary | None = None


@dataclass(frozen=True)
class DecodeContext:
    """Everything a request's DecodeLoop reads of the generator running it (made per request by
    ``SpeculativeGenerator.context``); the loop reads nothing else of it."""

    target: CausalLM
    drafter: Drafter                  # the generator's drafter (a prediction wraps it for one request)
    vocab_size: int                   # the ids decoding chooses among
    codec: TextCodec | None           # text deltas per round, where the request asks for text
    scratch: Scratch                  # vocabulary-wide arrays reused across rounds
    memory: ProfileMemory             # the stored profile and what the last auto request learned
    profile: Callable[[], dict | None]  # this machine's calibrated step costs (measured once)
    sampled_verify: Callable          # the sampled verification rule (verify.verify_dists)
    draft_sampling: str               # what the draft samples from (config.draft_sampling)
    forced_drafts: bool               # tokens a constraint forces go out as free drafts
    guess: PromptLookupDrafter        # free one-token guesses for rounds without drafts (bitwise passes)
    record_min_mass: bool             # sum_x min(p, q) of every verified position into Stats
    draft_error: str | None           # why the draft model could not be loaded, or None
    lazy_prefill: int                 # unfed prompt tokens from which the first round runs without drafts
