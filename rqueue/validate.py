"""Checks of the arguments callers pass: whole numbers, durations, flags and
texts, each written once. Every check raises InvalidInput naming the
argument and the value it refused, and returns the value normalised.

A bool is never taken for a number (``True`` is an int in Python, and a
caller who passes it has mixed up two arguments).
"""

from __future__ import annotations

import math

from .constants import MAX_DELAY, MAX_REASON_LENGTH
from .errors import InvalidInput


def whole_number(what: str, value: object, low: int, high: int | None = None) -> int:
    """``value`` when it is an int from ``low`` to ``high`` (no upper bound
    when None)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise InvalidInput(f"{what} must be a whole number {bounds}, not {value!r}")
    return value


def optional_whole_number(what: str, value: object, low: int, high: int | None = None) -> int | None:
    """None, or ``value`` checked as :func:`whole_number`."""
    return None if value is None else whole_number(what, value, low, high)


def seconds(what: str, value: object, *, high: float | None = None, positive: bool = False) -> float:
    """``value`` when it is a finite duration in seconds: at least 0 (above 0
    with ``positive``) and at most ``high`` (no upper bound when None)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
        or (high is not None and value > high)
    ):
        if high is None:
            bounds = "> 0" if positive else ">= 0"
        elif positive:
            bounds = f"above 0, up to {high:.0f}"
        else:
            bounds = f"from 0 to {high:.0f}"
        raise InvalidInput(f"{what} must be a number of seconds {bounds}, not {value!r}")
    return value


def positive_seconds(what: str, value: object) -> float:
    """A duration above 0 and at most MAX_DELAY, the longest a script
    formats in whole milliseconds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_DELAY:
        raise InvalidInput(f"{what} must be a positive number of seconds up to {MAX_DELAY:.0f}, not {value!r}")
    return value


def delay_ms(delay: object) -> int:
    """A publish or nack delay in whole milliseconds; 0 for None."""
    if delay is None:
        return 0
    if isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay <= MAX_DELAY:
        raise InvalidInput(f"delay {delay!r} must be a number of seconds from 0 to {MAX_DELAY:.0f}")
    return int(round(delay * 1000))


def flag(what: str, value: object) -> bool:
    """``value`` when it is True or False (not merely truthy)."""
    if not isinstance(value, bool):
        raise InvalidInput(f"{what} must be True or False, not {value!r}")
    return value


def text(what: str, value: object, limit: int = MAX_REASON_LENGTH) -> str:
    """A str that encodes as UTF-8, cut to ``limit`` characters (an error or
    reason text kept in a header)."""
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a str, not {type(value).__name__}")
    value = value[:limit]
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} {value!r} cannot be encoded as UTF-8: {exc.reason}") from None
    return value
