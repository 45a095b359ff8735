"""Log-probabilities of the tokens chosen, each under the processed target distribution of its position."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from .checks import is_int
from .config import SamplingConfig
from .reference import distribution, processed_scores, softmax

MAX_TOP = 20  # alternatives per token, as OpenAI allows


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability and the ``top`` most likely tokens of its position, most likely
    first (ties, such as the tokens of probability 0 that fill the list past a short nucleus: the larger raw
    logit first, then the lower id), as (id, log-probability)."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


def check_logprobs(value) -> int | None:
    """``logprobs`` as generate takes it: None (off), or how many alternatives to report (0..MAX_TOP)."""
    if value is None:
        return None
    if not is_int(value, 0, MAX_TOP):
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
        best = tuple((int(i), float(logp[i])) for i in _most_likely(logp, np.asarray(row, dtype=np.float32), top))
    return TokenLogprob(int(token), float(logp[token]), best)


def _most_likely(logp: np.ndarray, raw: np.ndarray, k: int) -> np.ndarray:
    """The ``k`` ids of largest ``logp``, most likely first. Among equal values - above all the tokens of
    probability 0 past top-k, top-p or a constraint, which a short nucleus leaves to fill the list - the model's
    own order: the larger raw logit first, then the lower id."""
    k = min(k, logp.size)
    kth = np.partition(logp, logp.size - k)[logp.size - k]
    above, tied = np.nonzero(logp > kth)[0], np.nonzero(logp == kth)[0]
    need = k - above.size
    if tied.size > need:  # the ties that make the list: by raw logit, the lowest ids at an equal one
        r = raw[tied]
        cut = np.partition(r, tied.size - need)[tied.size - need]
        over = tied[r > cut]
        tied = np.concatenate([over, tied[r == cut][:need - over.size]])
    ids = np.concatenate([above, tied])
    return ids[np.lexsort((ids, -raw[ids], -logp[ids]))]
