"""Vocabulary-wide arrays reused from one decoding round to the next (leased, never reference-counted)."""
from __future__ import annotations

import numpy as np

from ..arena import RoundPool


class Scratch:
    """Reusable vocabulary-wide arrays: float32 rows and weights, the nucleus search's intp keys, float64
    weights and masks. Fresh arrays of this size cost page faults on every allocation (more than the arithmetic
    on them). An array ``take`` hands out is the caller's until ``new_round`` (a distribution keeps its weights
    until its round's verification is over); ``give_back`` returns a call's own temporaries at once. The decode
    loop starts a round on it before each round; used without rounds it hands out fresh arrays once KEEP of a
    size are out. One Scratch per thread of work."""

    KEEP = 64  # arrays of one width and type kept (a round of gamma 8 with penalties takes about 30)

    def __init__(self):
        self._pool = RoundPool(self.KEEP)

    def take(self, width: int, dtype=np.float32) -> np.ndarray:
        return self._pool.take((int(width), np.dtype(dtype).str), lambda: np.empty(width, dtype=dtype))

    def give_back(self, *arrays: np.ndarray) -> None:
        self._pool.give_back(*arrays)

    def new_round(self) -> None:
        self._pool.new_round()
