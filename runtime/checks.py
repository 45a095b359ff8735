"""Checks of option values shared by every entry point: whole numbers and finite numbers in a range (a bool is neither)."""
from __future__ import annotations

import math


def is_int(value, low: int | None = None, high: int | None = None) -> bool:
    """Whether ``value`` is an int (not a bool) in [low, high] (an open end where None)."""
    return not isinstance(value, bool) and isinstance(value, int) and (low is None or value >= low) \
        and (high is None or value <= high)


def is_number(value, low: float | None = None, high: float | None = None) -> bool:
    """Whether ``value`` is a finite int or float (not a bool) in [low, high] (an open end where None)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value) \
        and (low is None or value >= low) and (high is None or value <= high)
