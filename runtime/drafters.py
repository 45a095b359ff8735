"""Drafters: where candidate tokens come from.

Every drafter returns a Draft: the proposed tokens and, when sampling, the
distribution each was drawn from (after the full logits pipeline), so the
verifier sees exactly the q that was sampled.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import numpy as np

from .logits import Dist, LogitsPipeline
from .model import CausalLM


@dataclass(frozen=True)
class Draft:
    tokens: list[int]
    dists: list[Dist] | None  # when sampling: the distribution each token was drawn from, else None

    @staticmethod
    def empty() -> "Draft":
        return Draft([], None)


class Drafter(Protocol):
    name: str

    def propose(self, committed: Sequence[int], gamma: int, pipeline: LogitsPipeline,
                sampling: bool, rng: np.random.Generator) -> Draft: ...

    def sync(self, committed: Sequence[int]) -> None: ...


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    if n == 0:
        return 0
    diff = np.nonzero(np.asarray(a[:n]) != np.asarray(b[:n]))[0]
    return int(diff[0]) if diff.size else n


class NoDrafter:
    """Target-only decoding through the same loop: the baseline."""

    name = "none"

    def propose(self, committed, gamma, pipeline, sampling, rng) -> Draft:
        return Draft.empty()

    def sync(self, committed) -> None:
        pass


class ModelDrafter:
    """Drafts with the bundle's draft graph, keeping its own KV cache in step."""

    name = "model"

    def __init__(self, lm: CausalLM):
        self.lm = lm

    def sync(self, committed: Sequence[int]) -> None:
        """Roll back to the fed tokens still on the committed path.

        At most len(committed) - 1 are kept: the last committed token opens the
        next round. When every draft was accepted the cache lacks d_gamma (it was
        sampled but never fed), so the next round feeds [d_gamma, bonus].
        """
        self.lm.rollback(min(common_prefix(self.lm.tokens, committed), len(committed) - 1))

    def propose(self, committed, gamma, pipeline, sampling, rng) -> Draft:
        self.sync(committed)
        committed = list(committed)
        if self.lm.length + gamma + 1 > self.lm.capacity:
            gamma = max(0, self.lm.capacity - len(committed))
        feed = committed[self.lm.length:]
        tokens: list[int] = []
        dists = []
        for _ in range(gamma):
            logits = self.lm.forward_rows(feed, keep=1)
            if sampling:
                q = pipeline.row(logits[0], committed, tokens, inplace=True)
                tok = q.sample(rng)
                dists.append(q)
            else:
                tok = int(pipeline.greedy(logits, committed, tokens)[0])
            tokens.append(tok)
            feed = [tok]
        return Draft(tokens, dists if sampling else None)


class PromptLookupDrafter:
    """Drafts by n-gram match over prompt and generated text (no model, q one-hot)."""

    name = "prompt_lookup"

    def __init__(self, max_ngram: int = 3, min_ngram: int = 1):
        if not 1 <= min_ngram <= max_ngram:
            raise ValueError("need 1 <= min_ngram <= max_ngram")
        self.max_ngram, self.min_ngram = max_ngram, min_ngram

    def sync(self, committed) -> None:
        pass

    def propose(self, committed, gamma, pipeline, sampling, rng) -> Draft:
        tokens = self.lookup(committed, gamma)
        if not tokens:
            return Draft.empty()
        return Draft(tokens, [Dist.one_hot(t) for t in tokens] if sampling else None)

    def lookup(self, committed: Sequence[int], gamma: int) -> list[int]:
        """Tokens that followed the most recent earlier occurrence of the longest matching tail."""
        seq = np.asarray(committed, dtype=np.int64)
        if gamma < 1:
            return []
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            tail = seq[-n:]
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)
            hits = np.nonzero((windows == tail).all(axis=1))[0]
            if hits.size:
                start = int(hits[-1]) + n
                return [int(t) for t in seq[start:start + gamma]]
        return []
