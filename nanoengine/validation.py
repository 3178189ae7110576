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


def check_text(value: str, what: str) -> None:
    """A ValueError for text no tokenizer can read: a lone surrogate (valid JSON, not UTF-8)."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = short_repr(value[e.start : e.end])
        raise ValueError(
            f"{what} holds {bad} at index {e.start}, a lone surrogate that is not text: "
            "send valid UTF-8"
        ) from None


def first_line(error: Exception) -> str:
    """An exception in one short line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}"[:160]
