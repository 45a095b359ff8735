"""One generation request as the decode loop reads it, and the lock that lets one request run a generator's models
at a time."""
from __future__ import annotations

from dataclasses import dataclass
import threading
from typing import Callable

from .config import SamplingConfig, SpeculationConfig
from .constrain import Constraint
from .errors import GeneratorBusyError


@dataclass(frozen=True)
class Request:
    """Everything a generation was asked, checked: the loop reads nothing else of the call."""

    prompt_ids: list[int]
    max_new_tokens: int
    sampling: SamplingConfig
    speculation: SpeculationConfig
    eos: frozenset
    seed: int | None
    strict: bool
    text: bool = True  # text deltas per round (a stream's events); generate() decodes once at the end
    # where a scheduler may run another request: None (a long prompt's chunks), a PassNeed (before a round's pass)
    pauses: bool = False
    # a scheduler's: a callable giving the batch its target passes ride with now (engine.batch.Crowd), or None
    crowd: Callable[[], object] | None = None
    # a scheduler's: a callable saying whether a request waits to start (a greedy draft then ends early), or None
    hurry: Callable[[], bool] | None = None
    constraint: Constraint | None = None  # structured output: the mask every row is read through
    logprobs: int | None = None  # log-probabilities of the tokens chosen, with this many alternatives
    prediction: tuple[int, ...] = ()  # the predicted output's token ids (OpenAI's Predicted Outputs): free drafts


BUSY_HERE = ("a stream on this generator is still open: finish or close() it first (a generator, and its "
             "siblings, run one generation at a time)")


class Busy:
    """Who runs a generator's models now (shared by a generator and its siblings: they share the target's cache).

    A thread waits while another thread's generation runs, as long as it takes or up to a timeout; a thread
    that asks again while its own stream is still open gets GeneratorBusyError at once (waiting would never
    end: the open stream resumes only on that same thread)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._owner: int | None = None  # the thread id of the running generation

    def acquire(self, timeout: float | None = None) -> None:
        me = threading.get_ident()
        with self._cond:
            if self._owner == me:
                raise GeneratorBusyError(BUSY_HERE)
            if not self._cond.wait_for(lambda: self._owner is None, timeout):
                raise GeneratorBusyError(f"the generator stayed busy for {timeout} s with another thread's "
                                         "generation; retry, or give a longer wait_timeout (None waits as long "
                                         "as it takes)")
            self._owner = me

    def release(self) -> None:
        with self._cond:
            self._owner = None
            self._cond.notify()
