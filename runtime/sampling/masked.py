"""Rows under a token mask (structured output): disallowed tokens get probability 0, target and draft alike."""
from __future__ import annotations

from typing import Sequence

import numpy as np

from .pipeline import LogitsPipeline
from .processors import MaskedProcessors


class TokenMask:
    """What a masked pipeline asks of a constraint: the tokens allowed after a context."""

    def allowed(self, base: Sequence[int], new: Sequence[int]) -> np.ndarray | None:
        """A bool array over the vocabulary: True where a token may follow ``base + new``; None where the
        context is off the constraint (after a draft token it does not allow: such rows are never read)."""
        raise NotImplementedError


class MaskedPipeline(LogitsPipeline):
    """A pipeline whose rows are masked before the warpers: the mask is a logits processor in transformers'
    order (after repetition penalty and banned words, before temperature, top-k and top-p; MaskedProcessors),
    so a disallowed token has probability 0 and greedy decoding never picks it. Rows are read whole (a row's
    largest entries settle nothing once most of the vocabulary may be masked)."""

    def __init__(self, pipe: LogitsPipeline, mask: TokenMask):
        super().__init__(pipe.config, pipe.vocab_size, pipe.scratch,
                         MaskedProcessors(pipe.config, pipe.vocab_size, mask))
        self.mask = mask
        self.whole_rows = True
