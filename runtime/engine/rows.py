"""Rows a decoding pass hands out: left on the device (DeviceRows), or on the host beside the graph's TopK (TopRows)."""
from __future__ import annotations

from dataclasses import dataclass
import math
from typing import Callable

import numpy as np

from ..sampling.rows import Row, Rows
from .slots import HostSlot


class Columns:
    """Which token id each logits column holds: the same id, or (a vocab-subset draft) its id ranges in order."""

    def __init__(self, ranges: list[tuple[int, int]] | None, output_vocab: int):
        self.ranges, self.output_vocab = ranges, output_vocab
        self.identity = ranges is None  # column j is token id j
        self._ids = None  # token id of each column (built on first use)

    def token_ids(self, cols: np.ndarray) -> np.ndarray:
        """Token ids of logits columns."""
        if self.ranges is None:
            return cols
        if self._ids is None:
            self._ids = np.concatenate([np.arange(lo, hi) for lo, hi in self.ranges])
        return self._ids[cols]

    def widen(self, logits: np.ndarray) -> np.ndarray:
        """Rows of the graph's width as rows over the whole vocabulary: the ids a subset leaves out get -inf
        (probability 0)."""
        if self.ranges is None:
            return logits
        full = np.full((logits.shape[0], self.output_vocab), -np.inf, dtype=np.float32)
        col = 0
        for lo, hi in self.ranges:
            full[:, lo:hi] = logits[:, col:col + hi - lo]
            col += hi - lo
        return full


class RowCounts:
    """Rows a model's passes handed out: read through their largest entries, and copied whole from a device."""

    def __init__(self):
        self.read = self.copied = 0


@dataclass(frozen=True)
class RowReading:
    """What a pass's rows read besides the pass's own buffers, handed to them by the model that ran it."""

    columns: Columns
    width: int                        # the graph's logits columns
    output_vocab: int                 # the ids a row covers once widened
    norm_block: int | None            # the block of the graph's per-row normalizer, None without one
    device_top: Callable | None       # (value, k) -> (values, columns): a TopK run on the device (timed)
    counts: RowCounts


class _Rows(Rows):
    """Consecutive logits rows of one pass: ``rows[i]`` is a PassRow, ``rows[a:b]`` a view of fewer rows."""

    start: int
    stop: int

    def __len__(self) -> int:
        return self.stop - self.start

    def __getitem__(self, i):
        n = len(self)
        if isinstance(i, slice):
            a, b, step = i.indices(n)
            if step != 1:
                raise IndexError(f"{type(self).__name__} slices take consecutive rows")
            return self if (a, b) == (0, n) else self._view(self.start + a, self.start + max(a, b))
        i = int(i) + (n if int(i) < 0 else 0)
        if not 0 <= i < n:
            raise IndexError(f"row {i} of {n}")
        return PassRow(self, i)

    def _view(self, start: int, stop: int) -> "_Rows":
        raise NotImplementedError

    #: ``numpy()`` is the pass's own host buffer
    on_host = False

    def row_top(self, i: int, k: int) -> tuple:
        """``top`` of row ``i`` (ids, values, bound)."""
        ids, values, bound = self.top(k)
        return ids[i], values[i], float(bound[i])

    def row_spread(self, i: int) -> tuple[float, float] | None:
        return None

    def row_norm(self, i: int) -> tuple[float, float, int] | None:
        return None


class DeviceRows(_Rows):
    """Logits rows left on the device where the graph wrote them (an OrtValue [1, rows, width]).

    The sampling rules read only the largest entries of a row in most settings (greedy, top-k): ``top(K)`` hands
    them the graph's own TopK of the pass (copied to the host with it) or, for graphs without one or a larger
    K, runs a TopK graph on the device, and brings back K ids, their values, and a bound that every other entry
    is at most (the K-th largest value). ``numpy()`` copies the rows in full, for the settings (and the rare
    rows) that need more. Indexing gives a PassRow; slicing a view of fewer rows sharing the same results.
    """

    def __init__(self, reading: RowReading, value, start: int = 0, stop: int | None = None,
                 shared: dict | None = None, top: tuple | None = None):
        self.reading, self.value = reading, value
        self.start = start
        self.stop = value.shape()[1] if stop is None else stop
        self._shared = shared if shared is not None else {"top": {}, "host": None}
        if top is not None:  # the graph's own TopK of these rows: (values, columns, K), already on the host
            values, cols, k = top
            self._shared["top"][k] = _top_entries(reading, values, cols, k)
            reading.counts.read += values.shape[0]

    def _view(self, start: int, stop: int) -> "DeviceRows":
        return DeviceRows(self.reading, self.value, start, stop, self._shared)

    def numpy(self) -> np.ndarray:
        """The rows as float32 [rows, vocab] on the host (copied once, then shared by every view)."""
        host = self._shared["host"]
        if host is None:
            host = self.value.numpy()[0].astype(np.float32)
            host = self.reading.columns.widen(host)
            self._shared["host"] = host
            self.reading.counts.copied += host.shape[0]
        return host[self.start:self.stop]

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids [rows, K] and float32 values [rows, K] of each row's K largest entries (K = min(k, width)),
        and per row a bound that every entry not returned is at most (-inf when nothing is left out)."""
        width = self.value.shape()[2]
        k = min(int(k), width)
        found = self._shared["top"].get(k)
        if found is None:  # the graph's TopK found at least as many: they serve (more entries than asked is fine)
            found = next((f for have, f in self._shared["top"].items() if have >= k), None)
        if found is None:
            values, cols = self.reading.device_top(self.value, k)
            found = self._shared["top"][k] = (self.reading.columns.token_ids(cols), values, _bound(values, k, width))
            self.reading.counts.read += values.shape[0]
        ids, values, bound = found
        return ids[self.start:self.stop], values[self.start:self.stop], bound[self.start:self.stop]


def _top_entries(reading: RowReading, values: np.ndarray, cols: np.ndarray, k: int) -> tuple:
    """(token ids, values, bound) of rows' K largest entries as a TopK returned them (columns of the graph's
    width)."""
    return reading.columns.token_ids(cols), values, _bound(values, k, reading.width)


def _bound(values: np.ndarray, k: int, width: int) -> np.ndarray:
    """What every entry left out of rows' K largest ``values`` is at most: the K-th, or -inf when none is."""
    return values[:, -1] if k < width else np.full(values.shape[0], -np.inf, dtype=np.float32)


class TopRows(_Rows):
    """Logits rows on the host beside the graph's TopK of each (the K largest entries, descending, and a bound
    every other entry is at most): the sampling rules read a row's top entries (``top``) where they settle it,
    and the whole row (``numpy``) where they do not. The same interface as DeviceRows. It holds a pass's host
    slot (flat arrays) and touches NumPy only when asked for: right after a pass every NumPy call is slow."""

    on_host = True

    def __init__(self, reading: RowReading, slot: HostSlot, rows: int, k: int, norm_scale: float = 0.0,
                 start: int = 0, stop: int | None = None):
        self.reading, self.k, self.rows = reading, k, rows
        self.logits, self.values, self.cols = slot.logits, slot.top_values, slot.top_cols  # (leased for the round)
        # each row's sum exp((logit - max) * scale) at the scale the pass ran with (None: not computed)
        self.norms = slot.norms if reading.norm_block is not None and norm_scale > 0 else None
        self.scale = norm_scale
        self.start, self.stop = start, rows if stop is None else stop
        reading.counts.read += self.stop - self.start

    def _view(self, start: int, stop: int) -> "TopRows":
        rows = TopRows.__new__(TopRows)
        rows.__dict__.update(self.__dict__)
        rows.start, rows.stop = start, stop
        return rows

    def numpy(self) -> np.ndarray:
        width = self.reading.width
        host = self.logits[:self.rows * width].reshape(self.rows, width)[self.start:self.stop]
        return self.reading.columns.widen(host if host.dtype == np.float32 else host.astype(np.float32))

    def top(self, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Token ids, values and bound of each row's largest entries: the graph's K of them when K >= ``k``
        (more than asked for is fine), else the ``k`` largest found on the host."""
        if min(int(k), self.reading.output_vocab) > self.k:
            rows = self.numpy()
            ids = np.argsort(-rows, axis=1, kind="stable")[:, :k]
            values = np.take_along_axis(rows, ids, axis=1)
            return ids, values, _bound(values, k, rows.shape[1])
        n, k = self.rows, self.k
        ids, values, bound = _top_entries(self.reading, self.values[:n * k].reshape(n, k),
                                          self.cols[:n * k].reshape(n, k), k)
        return ids[self.start:self.stop], values[self.start:self.stop], bound[self.start:self.stop]

    def row_norm(self, i: int) -> tuple[float, float, int] | None:
        """(scale, normalizer, block) of row ``i``: sum_j exp((logit_j - max) * scale) as the graph computed it in
        float32 (in blocks of ``block`` entries, then over the blocks), None where the pass did not compute it."""
        if self.norms is None:
            return None
        return self.scale, float(self.norms[self.start + i]), self.reading.norm_block

    def row_spread(self, i: int) -> tuple[float, float] | None:
        """Row ``i``'s largest entry and the bound on those not read (None when every entry is read)."""
        if self.k >= self.reading.width:
            return None
        j = (self.start + i) * self.k
        return float(self.values[j]), float(self.values[j + self.k - 1])

    def row_top(self, i: int, k: int) -> tuple[list, list, float]:
        """``top`` of one row as Python lists (what the sampling rules read, without NumPy calls)."""
        if min(int(k), self.reading.output_vocab) > self.k:
            ids, values, bound = self.top(k)
            return ids[i].tolist(), values[i].tolist(), float(bound[i])
        j, k = (self.start + i) * self.k, self.k
        values = self.values[j:j + k].tolist()
        cols = self.cols[j:j + k]
        columns = self.reading.columns
        ids = cols.tolist() if columns.identity else columns.token_ids(cols).tolist()
        return ids, values, values[-1] if k < self.reading.width else -math.inf


class PassRow(Row):
    """One row of DeviceRows or TopRows (what ``rows[i]`` of a host array would be)."""

    def __init__(self, rows: "DeviceRows | TopRows", i: int):
        self.rows, self.i = rows, i

    def top(self, k: int) -> tuple:
        return self.rows.row_top(self.i, k)

    def numpy(self) -> np.ndarray:
        return self.rows.numpy()[self.i]

    @property
    def width(self) -> int:
        """The row's width (what ``numpy()`` would hold)."""
        return self.rows.reading.output_vocab

    def spread(self) -> tuple[float, float] | None:
        """(largest entry, bound on the entries not read) of this row where its pass returned top entries."""
        return self.rows.row_spread(self.i)

    def norm(self) -> tuple[float, float, int] | None:
        """(scale, normalizer, block) of this row where its pass computed one (TopRows.row_norm), else None."""
        return self.rows.row_norm(self.i)

    @property
    def on_host(self) -> bool:
        """Whether ``numpy()`` is the pass's own host buffer (a row used once may be processed in it)."""
        return self.rows.on_host

