"""ModelDrafter: drafts with the bundle's draft graph, its KV cache kept in step with the committed text."""
from __future__ import annotations

from typing import Sequence

from ..engine import CausalLM, PassOptions
from .base import Draft, Drafter, check_window, common_prefix


class ModelDrafter(Drafter):
    """Drafts with the bundle's draft graph, keeping its own KV cache in step.

    With a ``window``, the draft model reads a long context as its first SINK tokens plus the most recent
    ``window`` or so (the start of that stretch moves in steps of half a window, so the draft re-reads at
    most one window per half window of new text): a long prompt then costs the draft a window's prefill, and
    its steps attend over a window instead of the whole context. What the draft sees changes only its
    acceptance, never the output.

    With a ``source`` (the target, for a self-draft of the same cache layout), the draft runs on the target's
    KV cache (``CausalLM.share_cache``): the positions the target holds carry the target's keys and values, and
    the draft feeds only what the target has not verified yet (the last committed token) and the tokens it
    drafts.
    """

    name = "model"
    SINK = 4  # leading tokens every view keeps (models lean on the first positions; dropping them hurts)
    stop = None  # asked before each step after the first: a draft ends early where it says True (set_stop)

    def __init__(self, lm: CausalLM, window: int | None = None, source: CausalLM | None = None):
        self.lm, self.window = lm, check_window(window)
        # source: the target, when this draft reads the target's K/V for committed text (a self-draft with
        # the same cache layout; the window does not apply then)
        self.source = source
        if source is not None:
            lm.share_cache(source)

    def set_stop(self, stop) -> None:
        self.stop = stop

    def view(self, committed: Sequence[int]) -> list[int]:
        """The tokens the draft model reads for this context."""
        committed = list(committed)
        n, w = len(committed), self.window
        if w is None or self.source is not None or n <= w + self.SINK:
            return committed
        step = max(1, w // 2)
        start = max(self.SINK, ((n - w) // step) * step)
        return committed[:self.SINK] + committed[start:]

    def unread(self, committed: Sequence[int]) -> int:
        """Tokens of this context the draft model has yet to read (its next proposal feeds them first)."""
        seen = self.view(committed)
        return len(seen) - common_prefix(self.lm.tokens, seen)

    def sync(self, committed: Sequence[int]) -> None:
        """Roll back to the fed tokens still on the committed path (as the draft reads it).

        At most len(view) - 1 are kept: the last committed token opens the
        next round. When every draft was accepted the cache lacks d_gamma (it was
        sampled but never fed), so the next round feeds [d_gamma, bonus].
        """
        seen = self.view(committed)
        if self.source is not None:  # the shared cache: valid where the target holds the committed text
            self.lm.follow(min(common_prefix(self.source.tokens, seen), len(seen) - 1))
            return
        self.lm.rollback(min(common_prefix(self.lm.tokens, seen), len(seen) - 1))

    def propose(self, committed, gamma, pipeline, sampling, rng, limit=None) -> Draft:
        self.sync(committed)
        seen = self.view(committed)  # (a copy: the caller's list is read, never changed)
        if self.lm.length + gamma + 1 > self.lm.capacity:
            gamma = max(0, self.lm.capacity - len(seen))
        feed = seen[self.lm.length:]
        tokens: list[int] = []
        dists = []
        options = PassOptions.for_rules(pipeline)  # what the pipeline reads of each row
        for step in range(gamma):
            if step and self.stop is not None and self.stop():
                break
            logits = self.lm.forward_rows(feed, keep=1, options=options)
            if sampling:  # processors (repetition penalty) read the whole context, as the target's do
                q = pipeline.row(logits[0], committed, tokens, inplace=True)
                tok = q.sample(rng)
                dists.append(q)
            else:
                tok = int(pipeline.greedy(logits, committed, tokens)[0])
                self.lm.release_rows()  # only its token is read: the next step writes the same buffer, bound
            tokens.append(tok)
            feed = [tok]
        return Draft(tokens, dists if sampling else None)

