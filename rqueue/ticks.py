"""When a recurring schedule's ticks fall: every N milliseconds since the
epoch, or the times a cron expression names in a time zone.

Ticks are instants in ms since the epoch, computed from the definition
alone, so every process that runs a scheduler computes the same ticks and a
tick names the same publish everywhere. Cron expressions are read by
croniter; the rules rqueue adds are its own: five fields or an ``@`` alias,
and a daylight-saving change handled as cron does it (docs/schedules.md):

- a local time the clock skips (spring forward) fires at the first instant
  after the gap, as croniter gives it;
- a local time the clock shows twice (fall back) fires twice when the
  expression's minute or hour field starts with ``*`` (it names times by
  elapsed time), and once, at its first occurrence, otherwise (a job at a
  fixed time of day runs once a day).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import cached_property
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterError, croniter

from . import validate as check
from .errors import InvalidInput

MAX_CRON_LENGTH = 200  # characters: an expression longer than this is a mistake
# What the @ aliases stand for (Vixie cron's); @reboot has no tick.
CRON_ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}


def zone(name: object) -> ZoneInfo:
    """The time zone named ``name`` (an IANA name such as "Europe/Berlin")."""
    if not isinstance(name, str) or not name:
        raise InvalidInput(f"timezone must be an IANA time zone name such as 'Europe/Berlin', not {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise InvalidInput(
            f"timezone {name!r} is not a known time zone (an IANA name such as 'Europe/Berlin'; "
            "where the system has no time zone database, install the tzdata package)"
        ) from None


def cron_expression(expression: object) -> str:
    """``expression`` with an alias replaced by its five fields, when it is
    a cron expression croniter reads and that names at least one time."""
    if not isinstance(expression, str) or not expression.strip():
        raise InvalidInput(f"cron must be a cron expression such as '*/5 * * * *', not {expression!r}")
    if len(expression) > MAX_CRON_LENGTH:
        raise InvalidInput(f"cron expression of {len(expression)} characters is over the limit of {MAX_CRON_LENGTH}")
    text = " ".join(expression.split())
    text = CRON_ALIASES.get(text.lower(), text)
    if text.startswith("@"):
        raise InvalidInput(f"cron {expression!r}: unknown alias (known: {', '.join(CRON_ALIASES)})")
    if len(text.split(" ")) != 5:
        raise InvalidInput(
            f"cron {expression!r} must have 5 fields (minute hour day-of-month month day-of-week), "
            f"not {len(text.split(' '))}; for intervals below a minute use every="
        )
    if not croniter.is_valid(text, strict=True):
        raise InvalidInput(f"cron {expression!r} is not a valid cron expression, or names a day that never comes")
    try:
        croniter(text, datetime(2000, 1, 1, tzinfo=UTC)).get_next(datetime)
    except CroniterError:
        raise InvalidInput(f"cron {expression!r} names no time in 50 years") from None
    return text


@dataclass(frozen=True)
class Timing:
    """When a schedule's ticks fall: every ``every_ms`` since the epoch, or
    at the times ``cron`` names in ``timezone``."""

    every_ms: int | None = None
    cron: str | None = None
    timezone: str = "UTC"

    @cached_property
    def version(self) -> str:
        """Names the tick sequence: two timings with the same version have
        the same ticks."""
        text = f"every {self.every_ms}" if self.every_ms is not None else f"cron {self.cron} {self.timezone}"
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        if self.every_ms is not None:
            return f"every {self.every_ms / 1000:g} s"
        return f"cron {self.cron!r} ({self.timezone})"

    def after(self, t_ms: int) -> int:
        """The first tick strictly after ``t_ms``."""
        if self.every_ms is not None:
            return (t_ms // self.every_ms + 1) * self.every_ms
        return next(self._cron_ticks(t_ms))

    def latest(self, now_ms: int) -> int:
        """The last tick at or before ``now_ms``."""
        if self.every_ms is not None:
            return now_ms // self.every_ms * self.every_ms
        it, tz = self._iterator(now_ms + 1)  # prev is strictly before its start
        while True:
            tick: datetime = it.get_prev(datetime)
            if not self._repeated(tick, tz):
                return _ms(tick)

    def between(self, after_ms: int, now_ms: int, limit: int) -> list[int]:
        """Up to ``limit`` ticks t with ``after_ms`` < t <= ``now_ms``, in order."""
        out: list[int] = []
        if self.every_ms is not None:
            t = self.after(after_ms)
            while t <= now_ms and len(out) < limit:
                out.append(t)
                t += self.every_ms
            return out
        for t in self._cron_ticks(after_ms):
            if t > now_ms or len(out) >= limit:
                break
            out.append(t)
        return out

    def _cron_ticks(self, after_ms: int) -> Iterator[int]:
        it, tz = self._iterator(after_ms)
        while True:
            tick: datetime = it.get_next(datetime)
            if not self._repeated(tick, tz):
                yield _ms(tick)

    def _iterator(self, start_ms: int) -> tuple[croniter, ZoneInfo]:
        assert self.cron is not None
        tz = ZoneInfo(self.timezone)
        return croniter(self.cron, _local(start_ms, tz)), tz

    @cached_property
    def _fixed_time(self) -> bool:
        """Whether the expression names fixed times of day (neither its
        minute nor its hour field starts with ``*``)."""
        minute, hour = (self.cron or "* *").split(" ")[:2]
        return not minute.startswith("*") and not hour.startswith("*")

    def _repeated(self, tick: datetime, tz: ZoneInfo) -> bool:
        """Whether ``tick`` is the second showing of a local time a fall-back
        repeats, in an expression of fixed times (which fire once)."""
        if not self._fixed_time:
            return False
        first = tick.replace(tzinfo=None).replace(tzinfo=tz, fold=0)
        return first.timestamp() < tick.timestamp()


def _local(t_ms: int, tz: ZoneInfo) -> datetime:
    return datetime.fromtimestamp(t_ms / 1000, tz=UTC).astimezone(tz)


def _ms(tick: datetime) -> int:
    return round(tick.timestamp() * 1000)


def timing(every: object = None, cron: object = None, timezone: object = None) -> Timing:
    """A checked Timing: exactly one of ``every`` (seconds, at least 1 ms;
    ticks at its multiples since the epoch) and ``cron`` (a five-field
    expression or an alias, in ``timezone``, UTC by default). Raises
    InvalidInput naming what is wrong."""
    if (every is None) == (cron is None):
        raise InvalidInput(
            "a schedule needs exactly one of every= (seconds) and cron= (an expression), not both or none"
        )
    if every is not None:
        if timezone is not None:
            raise InvalidInput(
                "timezone applies to cron schedules only: every= ticks at multiples of its interval since the epoch"
            )
        seconds = check.seconds("every", every, positive=True)
        every_ms = round(seconds * 1000)
        if every_ms < 1:
            raise InvalidInput(f"every must be at least 0.001 s (1 ms), not {every!r}")
        return Timing(every_ms=every_ms, timezone="")
    zone_name = "UTC" if timezone is None else timezone
    zone(zone_name)
    assert isinstance(zone_name, str)
    return Timing(cron=cron_expression(cron), timezone=zone_name)
