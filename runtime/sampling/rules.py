"""What a lazily read row asks of the sampling rules that process it (RowRules, which LogitsPipeline is), and the
repetition penalty's arithmetic, written once for whole rows and for single scores."""
from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Protocol, Sequence

import numpy as np

if TYPE_CHECKING:
    from ..config import SamplingConfig
    from .dist import Dist


def penalize(values: np.ndarray, theta: float) -> np.ndarray:
    """Repetition penalty (as transformers): positive scores divided by ``theta``, negative ones multiplied, in
    ``values``' dtype (``theta`` a Python float)."""
    out = np.divide(values, theta)
    np.multiply(values, theta, out=out, where=values < 0)  # (three NumPy calls: each costs after a pass)
    return out


def penalized32(score: float, theta32: float) -> float:
    """One score penalized as ``penalize`` does it on a float32 row: ``theta32`` is the penalty rounded to
    float32, the product or quotient rounded to float32 (a float64 product or quotient of two float32 numbers
    rounds to float32 as float32 arithmetic does)."""
    return array("f", [score * theta32 if score < 0 else score / theta32])[0]


class RowRules(Protocol):
    """The rules a LazyRow settles its verdicts under (LogitsPipeline): what it reads of them and the counters
    it adds to."""

    config: SamplingConfig
    vocab_size: int
    processes: bool       # a processor (penalty, bad words, bias) changes some scores
    theta32: float        # the repetition penalty rounded to float32
    lazy_settled: int     # verdicts settled from a row's largest entries
    lazy_read: int        # ... and those that needed the whole row

    def lazy_rows(self) -> bool:
        """Whether rows under these rules are settled lazily at all."""

    def row(self, logits, base: Sequence[int], new: Sequence[int] = (), inplace: bool = False) -> Dist:
        """The whole row's distribution."""

    def read_top(self, drow, k: int, base: Sequence[int], new: Sequence[int], found=None):
        """(ids, processed scores, bound) of a row's largest entries, or None where they settle nothing."""

    def changes(self, row: np.ndarray, base: Sequence[int], new: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The ids the processors change in a row and their new scores."""

    def changed_ids(self, base: Sequence[int], new: Sequence[int]) -> tuple:
        """(context ids, new ids, banned ids) as sets."""
