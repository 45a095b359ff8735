"""Host buffers a pass writes its outputs into (logits, top entries, normalizers), leased per decoding round."""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..arena import RoundPool
from .session import ort


@dataclass(eq=False)
class HostSlot:
    """The host arrays of one pass's outputs, flat: logits (rows x the graph's width, in the graph's dtype), the
    graph's top values (float32) and top columns (int64), rows x k of each, and each row's normalizer
    (float32). Their addresses are kept for binding (reading ``ctypes.data`` costs a little on every pass).
    ``serial`` names a kept slot (a pass bound to the same serial with the same shapes need not bind again);
    None for a one-off slot."""

    logits: np.ndarray
    top_values: np.ndarray
    top_cols: np.ndarray
    norms: np.ndarray
    serial: int | None = None
    logits_at: int = field(init=False)
    values_at: int = field(init=False)
    cols_at: int = field(init=False)
    norms_at: int = field(init=False)

    bound: dict = field(init=False, default_factory=dict)

    def __post_init__(self):
        self.logits_at, self.values_at = self.logits.ctypes.data, self.top_values.ctypes.data
        self.cols_at, self.norms_at = self.top_cols.ctypes.data, self.norms.ctypes.data

    def outputs(self, rows: int, width: int, k: int) -> tuple:
        """onnxruntime values over this slot's host arrays for a pass of ``rows`` rows of ``width`` logits and
        ``k`` top entries each — logits [1, rows, width], top values and columns [1, rows, k], normalizers
        [1, rows] — made once per shape (binding a made value costs a fraction of binding an address)."""
        key = (rows, width, k)
        made = self.bound.get(key)
        if made is None:
            value = ort.OrtValue.ortvalue_from_numpy
            made = self.bound[key] = (
                value(self.logits[:rows * width].reshape(1, rows, width)),
                value(self.top_values[:rows * k].reshape(1, rows, k)) if k else None,
                value(self.top_cols[:rows * k].reshape(1, rows, k)) if k else None,
                value(self.norms[:rows].reshape(1, rows)))
        return made


def new_slot(dtype, size: int, top: int, rows: int, serial: int | None = None) -> HostSlot:
    """A slot of ``size`` logits entries, ``top`` top entries and ``rows`` normalizers."""
    return HostSlot(np.empty(size, dtype=dtype), np.empty(top, np.float32), np.empty(top, np.int64),
                    np.empty(max(rows, 1), np.float32), serial)


class HostSlots:
    """Slots for one model's decoding passes, leased until the model's next round (``new_round``): rows a pass
    hands out are read in place (no copy) for as long as the round reads them, whatever else refers to them.

    A pass of ``rows`` rows takes a slot of the next power of two of rows (at most MAX_ROWS; one row per draft
    step, a few per verification), so a draft's steps in a round hold a row each, not a whole buffer each. A
    larger pass, or one that asks for more than MAX_TOP top entries per row, gets a one-off slot. A slot taken
    again is usually the one the model's last pass wrote (bound already, and its pages touched)."""

    MAX_ROWS = 64   # rows of the largest kept slot
    MAX_TOP = 272   # top entries per row a kept slot holds (the pipelines read at most 256 + 16)
    KEEP = 24       # slots kept per size (a round of gamma 16 takes one per draft step)

    def __init__(self, width: int, dtype):
        self.width, self.dtype = int(width), dtype
        self._pool = RoundPool(self.KEEP)
        self._serials = 0

    def take(self, rows: int, k: int) -> HostSlot:
        """A slot for a pass of ``rows`` rows with ``k`` top entries each, the caller's until the next round."""
        if rows > self.MAX_ROWS or k > self.MAX_TOP:
            return self.one_off(rows, k)
        size = 1 << max(0, int(rows) - 1).bit_length()
        return self._pool.take(size, lambda: self._make(size))

    def one_off(self, rows: int, k: int, logits: bool = True) -> HostSlot:
        """A slot of exactly this size that no later pass writes (``logits`` False: top entries only)."""
        return new_slot(self.dtype, rows * self.width if logits else 0, rows * max(k, 1), rows)

    def _make(self, size: int) -> HostSlot:
        self._serials += 1
        return new_slot(self.dtype, size * self.width, size * self.MAX_TOP, size, self._serials)

    def give_back(self, slot: HostSlot | None) -> None:
        """The rows written into ``slot`` are not read any more: the next pass may write it."""
        if slot is not None:
            self._pool.give_back(slot)

    def new_round(self) -> None:
        self._pool.new_round()

    @property
    def leased(self) -> int:
        return self._pool.leased
