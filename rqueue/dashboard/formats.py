"""How times, durations and rates read on a page."""

from __future__ import annotations

import time


def when(ms: int | None) -> str:
    """A server time in ms since the epoch as "2026-11-26 05:40:38 UTC"."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ms / 1000))


def duration(ms: int | float | None) -> str:
    """A span in ms as "850 ms", "12.5 s", "4 min 5 s", "3 h 2 min", "2 d 3 h"."""
    if ms is None:
        return "-"
    if ms < 1000:
        return f"{ms:.0f} ms"
    s = ms / 1000
    if s < 60:
        return f"{s:.1f} s"
    m, s = divmod(int(s), 60)
    if m < 60:
        return f"{m} min {s} s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h} h {m} min"
    d, h = divmod(h, 24)
    return f"{d} d {h} h"


def ago(ms: int | None, now_ms: int) -> str:
    """How long before ``now_ms`` a time was: "3 min 4 s ago"."""
    if ms is None:
        return "-"
    return "in the future" if ms > now_ms + 1000 else f"{duration(max(0, now_ms - ms))} ago"


def rate(per_second: float | None) -> str:
    if per_second is None:
        return "-"
    return f"{per_second:.0f}" if per_second >= 10 else f"{per_second:.1f}"
