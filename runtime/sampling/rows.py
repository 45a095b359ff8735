"""What a model pass hands the sampling rules: the Row and Rows interfaces (a row's largest entries, bounds, all of it)."""
from __future__ import annotations

import numpy as np


class Row:
    """One logits row that brings its largest entries beside the whole row (a pass's TopK, or the device's).

    A plain float32 array is a row too; a Row is what a decoding pass hands out instead, so that the rules
    settle most rows from their largest entries without reading all of them. Subclasses give ``top``,
    ``numpy`` and ``width``; a row whose pass computed more says so through ``spread`` and ``norm``.
    """

    #: ``numpy()`` is the pass's own host buffer (a row read once may be processed in it)
    on_host = False

    def top(self, k: int) -> tuple:
        """(ids, values, bound): the row's ``k`` largest entries (token ids, descending values; more than ``k``
        is fine) and a bound that every entry not returned is at most (-inf when none is left out)."""
        raise NotImplementedError

    def numpy(self) -> np.ndarray:
        """The whole row as float32 (token ids as columns)."""
        raise NotImplementedError

    @property
    def width(self) -> int:
        """How many entries ``numpy()`` holds."""
        raise NotImplementedError

    def spread(self) -> tuple[float, float] | None:
        """(largest entry, bound on the entries not read) where the pass returned top entries, else None."""
        return None

    def norm(self) -> tuple[float, float, int] | None:
        """(scale, normalizer, block): sum_j exp((logit_j - max) * scale) as the pass computed it in float32 (in
        blocks of ``block`` entries), None where it did not."""
        return None


class Rows:
    """Consecutive rows of one pass: ``rows[i]`` is a Row, ``rows[a:b]`` a view of fewer rows, ``top(k)`` the
    largest entries of each (arrays [rows, k]), ``numpy()`` all of them as float32 [rows, width]."""

    def __len__(self) -> int:
        raise NotImplementedError

    def __getitem__(self, i):
        raise NotImplementedError

    def top(self, k: int) -> tuple:
        raise NotImplementedError

    def numpy(self) -> np.ndarray:
        raise NotImplementedError

    def copy(self) -> np.ndarray:
        """The rows as a float32 array of the caller's own."""
        return np.array(self.numpy(), dtype=np.float32)
