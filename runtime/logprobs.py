"""Log-probabilities of the tokens chosen, each under the processed target distribution of its position."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .config import SamplingConfig
from .reference import distribution, processed_scores, softmax

MAX_TOP = 20  # alternatives per token, as OpenAI allows


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability and the ``top`` most likely tokens of its position, most likely
    first (ties: the lower id first), as (id, log-probability)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_logprobs(value) -> int | None:
    """``logprobs`` as generate takes it: None (off), or how many alternatives to report (0..MAX_TOP)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOP:
        raise ValueError(f"logprobs must be None or an integer in 0..{MAX_TOP} (alternatives per token), "
                         f"got {value!r}")
    return value


def token_logprob(row: np.ndarray, context: Sequence[int], config: SamplingConfig, token: int, top: int,
                  allowed: np.ndarray | None = None) -> TokenLogprob:
    """The log-probability of ``token`` at a position whose raw logits are ``row`` (context ``context``): under
    the distribution sampling draws from (processors, a constraint's mask, temperature, top-k, top-p), or under
    the softmax of the processed scores when greedy (the distribution greedy takes the argmax of). Read from
    the plain reference on the whole row."""
    logits = np.array(row, dtype=np.float32)
    if allowed is not None:  # (a mask before the penalty is the mask after it: -inf either way)
        logits[~allowed[:logits.size]] = -np.inf
    probs = distribution(logits, context, config) if config.do_sample else \
        softmax(processed_scores(logits, context, config))
    with np.errstate(divide="ignore"):
        logp = np.log(probs)
    best: tuple = ()
    if top:
        k = min(top, logp.size)
        ids = np.argpartition(-logp, k - 1)[:k]
        ids = ids[np.lexsort((ids, -logp[ids]))]
        best = tuple((int(i), float(logp[i])) for i in ids)
    return TokenLogprob(int(token), float(logp[token]), best)
