"""Checking what a user passed in, and saying in one line what was wrong with it."""

import math
import numbers


def is_int(value: object) -> bool:
    """An integer of any integral type, but not a bool."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_real(value: object) -> bool:
    """A finite int or float (not a bool, not nan or inf)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)


def short_repr(value: object, limit: int = 60) -> str:
    """repr(value), cut to at most `limit` characters for a one-line message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def first_line(error: Exception) -> str:
    """An exception in one short line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:160]
