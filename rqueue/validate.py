"""Checks of the arguments callers pass: whole numbers, durations, flags and
texts, each written once. Every check raises InvalidInput naming the
argument and the value it refused, and returns the value normalised.

A bool is never taken for a number (``True`` is an int in Python, and a
caller who passes it has mixed up two arguments).

Durations are bounded by MAX_DURATION (10 years) so that nothing is
accepted that the scripts or the worker's waits cannot represent. The real
limits, tightest first:

- Lua writes a number it concatenates with ``%.14g``: only below 10^14 is
  that digits. publish.lua stores an id's expiry as ``"<seq>:<now +
  window>"`` (ms) and matches it with ``%d+``, so now (about 1.8 x 10^12 ms
  in 2025) plus dedup_window must stay below 10^14 ms: about 3,100 years
  today, less as time passes. Beyond, an id is never found again (a window
  of 2 x 10^11 s silently de-duplicates nothing).
- A number handed to ``redis.call`` is written with ``%.17g`` by Redis 7.0
  (and fakeredis): integers only below 10^17. Beyond, the id key's PX is
  refused ("value is not an integer", 10^14 s), and a liveness or ack_wait
  stored in the group hash reads back as ``1e+17``.
- Deadlines and due times are doubles: whole milliseconds are exact up to
  2^53 (about 285,000 years); a redelivery with jitter 1 waits up to twice
  its cap.
- The worker waits with ``threading`` timeouts of at most
  ``threading.TIMEOUT_MAX`` (about 292 years on Linux).

A fixed bound far inside all of them, for any server clock before the year
5000 and any test clock, is simpler to state than one that depends on the
server's time; no broker offers delays or windows of more than 10 years.
"""

from __future__ import annotations

import re

from .constants import MAX_DURATION, MAX_REASON_LENGTH
from .errors import InvalidInput, InvalidSetting, show

# The largest max_payload: a message goes to Redis as one argument, and
# Redis refuses an argument over proto-max-bulk-len (512 MiB by default);
# the rest is left for the record's own fields and headers.
MAX_PAYLOAD_LIMIT = 500 * 1024 * 1024


def is_whole_number_text(raw: str) -> bool:
    """Whether ``raw`` is a whole number int() reads: ASCII digits only
    (str.isdigit also takes "²", which int() refuses), and not so many that
    int() refuses them (over 4,300)."""
    return raw.isascii() and raw.isdigit() and len(raw) <= 40


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


def limit_text(high: float = MAX_DURATION) -> str:
    """How an error names the longest duration ``high`` (seconds)."""
    if high == MAX_DURATION:
        return f"{MAX_DURATION:.0f} s (10 years)"
    return f"{high:g} s"


def seconds(what: str, value: object, *, high: float = MAX_DURATION, positive: bool = False) -> float:
    """``value`` when it is a duration in seconds: at least 0 (above 0 with
    ``positive``) and at most ``high``. Compared without converting to
    float, so an int too large for one is refused rather than raising
    OverflowError; NaN fails every comparison."""
    if (
        not isinstance(value, bool)
        and isinstance(value, (int, float))
        and value <= high
        and (value > 0 or (value == 0 and not positive))
    ):
        return value
    low = "above 0" if positive else ">= 0"
    raise InvalidInput(f"{what} must be a number of seconds {low}, not {show(value)} (the limit is {limit_text(high)})")


def positive_seconds(what: str, value: object) -> float:
    """A duration above 0 and at most MAX_DURATION."""
    if not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value <= MAX_DURATION:
        return value
    raise InvalidInput(f"{what} must be a positive number of seconds, not {show(value)} (the limit is {limit_text()})")


def durable_options(failover_timeout: float, durable_replicas: int, durable_timeout: float) -> None:
    """Checks connect()'s failover and durable-publish options (either client's)."""
    seconds("failover_timeout", failover_timeout, high=3600, positive=True)
    seconds("durable_timeout", durable_timeout, high=3600, positive=True)
    whole_number("durable_replicas", durable_replicas, 0, 100)


def delay_ms(delay: object) -> int:
    """A publish or nack delay in whole milliseconds; 0 for None."""
    if delay is None:
        return 0
    if not isinstance(delay, bool) and isinstance(delay, (int, float)) and 0 <= delay <= MAX_DURATION:
        return int(round(delay * 1000))
    raise InvalidInput(f"delay {show(delay)} must be a number of seconds from 0 to {limit_text()}")


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


def payload_limit(setting: str, value: int) -> int:
    """``value`` (a whole number of bytes >= 1) when no larger than
    MAX_PAYLOAD_LIMIT: a larger limit would accept payloads that Redis
    refuses."""
    if value > MAX_PAYLOAD_LIMIT:
        raise InvalidSetting(
            setting,
            value,
            f"is over {MAX_PAYLOAD_LIMIT} bytes (500 MiB): a message must fit in one Redis argument "
            "(proto-max-bulk-len, 512 MiB by default)",
        )
    return value


PAUSE_MODES = ("refuse", "hold")


def pause_mode(value: object) -> str:
    """A queue's way of pausing: "refuse" (publishes raise QueuePaused) or
    "hold" (publishes are stored, no group hands them out until resume)."""
    if value not in PAUSE_MODES:
        raise InvalidInput(f"mode={value!r}: a queue pauses with mode 'refuse' or 'hold'")
    return str(value)


MAX_PRIORITY = 9  # priorities are 0 (the default, none) to 9, higher first


def priorities(value: object, count: int) -> list[int]:
    """One priority per message from ``value``: None (all 0), one whole
    number from 0 to MAX_PRIORITY for all, or a sequence of one per message."""
    if value is None:
        return [0] * count
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise InvalidInput(f"priority has {len(value)} entries for {count} payloads")
        return [whole_number("priority", v, 0, MAX_PRIORITY) for v in value]
    return [whole_number("priority", value, 0, MAX_PRIORITY)] * count


MAX_ORDERING_KEY = 128  # characters of an ordering key
# What an ordering key may hold: no space (fetch.lua keeps "<key> <seq>"),
# nothing a script would have to escape.
_ORDERING_KEY = re.compile(r"[A-Za-z0-9_.:@/+=\-]{1," + str(MAX_ORDERING_KEY) + "}")


def ordering_key(value: object) -> str | None:
    """An ordering key (docs/flow-control.md): None, or 1 to
    MAX_ORDERING_KEY of A-Z a-z 0-9 _ . : @ / + = -."""
    if value is None:
        return None
    if not isinstance(value, str) or not _ORDERING_KEY.fullmatch(value):
        raise InvalidInput(
            f"key={value!r}: an ordering key is 1 to {MAX_ORDERING_KEY} of A-Z a-z 0-9 _ . : @ / + = - (or None)"
        )
    return value


def ordering_keys(value: object, count: int) -> list[str | None]:
    """One ordering key per message from ``value``: None (none), one key
    for all, or a sequence of one per message (None: that one has none)."""
    if value is None or isinstance(value, str):
        return [ordering_key(value)] * count
    if isinstance(value, (list, tuple)):
        if len(value) != count:
            raise InvalidInput(f"key has {len(value)} entries for {count} payloads")
        return [ordering_key(v) for v in value]
    raise InvalidInput(f"key={value!r}: one ordering key (a str) for all, or a list of one per message")
