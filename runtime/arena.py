"""Buffers leased for a decoding round: reuse that is correct by construction, whatever the interpreter."""
from __future__ import annotations

from typing import Callable, Hashable


class RoundPool:
    """Large buffers (host logits, vocabulary-wide rows) made on demand and handed out again only after the
    pool's owner starts a new round.

    ``take`` leases a buffer until the next ``new_round``: nothing taken in a round is handed out again within
    it, so whatever still refers to a buffer (a distribution drawn from later, a row verified later) reads what
    was written. The owner calls ``new_round`` only where nothing from the round before is read any more (the
    decode loop, at the start of each round). ``give_back`` returns a buffer early, for one that the caller
    knows nothing else refers to (a call's own temporaries). At most ``keep`` buffers per key are kept; past
    them ``take`` makes one-off buffers that are never handed out again. Fresh buffers of this size cost more
    in page faults than the arithmetic done on them, so reuse matters; correctness never rests on it.
    """

    def __init__(self, keep: int):
        self.keep = keep
        self._free: dict[Hashable, list] = {}
        self._made: dict[Hashable, int] = {}
        self._taken: list[tuple[Hashable, object]] = []

    def take(self, key: Hashable, make: Callable[[], object]):
        """A buffer for ``key`` (made by ``make`` when none is free), the caller's until the next round."""
        free = self._free.get(key)
        if free:
            item = free.pop()  # the most recently returned first: often the one bound or touched last
        elif self._made.get(key, 0) < self.keep:
            item = make()
            self._made[key] = self._made.get(key, 0) + 1
        else:
            return make()  # one-off: never kept, never handed out again
        self._taken.append((key, item))
        return item

    def give_back(self, *items) -> None:
        """Return buffers taken in this round that nothing refers to any more (one-off buffers are ignored)."""
        for item in items:
            for j in range(len(self._taken) - 1, -1, -1):
                if self._taken[j][1] is item:
                    key, _ = self._taken.pop(j)
                    self._free.setdefault(key, []).append(item)
                    break

    def new_round(self) -> None:
        """Everything taken so far may be handed out again (nothing from the round before is read any more)."""
        for key, item in self._taken:
            self._free.setdefault(key, []).append(item)
        self._taken.clear()

    @property
    def leased(self) -> int:
        """Buffers taken since the last ``new_round`` and not given back (kept ones only)."""
        return len(self._taken)
