"""Publish and ack rates of every queue over the last minutes, from the
overview's readings (a queue's last seq and its groups' ack counters), and
the small SVG chart of them. Readings are taken only while someone looks:
a gap shows as a gap."""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

from rqueue.overview import QueueSummary

WINDOW = 300.0  # seconds of history kept and charted
SAMPLES = 60  # readings kept per queue (at most one per WINDOW / SAMPLES seconds)
CHART_W, CHART_H = 120, 28  # the chart's size in px
MIN_SPAN = 60.0  # seconds the chart covers at least (a new dashboard fills it from the right)


@dataclass(frozen=True)
class Rate:
    at: float  # monotonic seconds, at the end of the interval
    published: float  # messages per second
    acked: float


class RateHistory:
    """Readings per queue; thread-safe (the app serves pages from a pool)."""

    def __init__(self, window: float = WINDOW, samples: int = SAMPLES) -> None:
        self.window = window
        self.spacing = window / samples
        self._readings: dict[str, deque[tuple[float, int, int]]] = {}
        self._lock = threading.Lock()
        self._samples = samples

    def record(self, now: float, summaries: list[QueueSummary]) -> None:
        with self._lock:
            seen = set()
            for s in summaries:
                seen.add(s.name)
                kept = self._readings.setdefault(s.name, deque(maxlen=self._samples))
                if len(kept) > 1 and now - kept[-2][0] < self.spacing:
                    kept.pop()  # the newest reading stands for its slot until the slot is over: rates stay current
                kept.append((now, s.last_seq, s.acked))
            for name in set(self._readings) - seen:
                del self._readings[name]  # deleted queue

    def rates(self, name: str, now: float) -> list[Rate]:
        """Rates between consecutive readings inside the window, oldest first."""
        with self._lock:
            kept = [r for r in self._readings.get(name, ()) if now - r[0] <= self.window]
        out = []
        for (t0, seq0, ack0), (t1, seq1, ack1) in zip(kept, kept[1:], strict=False):
            span = t1 - t0
            if span > 0:
                # a counter that went down (queue deleted and made again) shows as 0, not negative
                out.append(Rate(t1, max(0, seq1 - seq0) / span, max(0, ack1 - ack0) / span))
        return out


@dataclass(frozen=True)
class Chart:
    """Polyline points for the SVG, and the figures for its title."""

    published: str
    acked: str
    top: float  # messages per second at the top edge
    last_published: float | None
    last_acked: float | None


def chart(rates: list[Rate], now: float, window: float = WINDOW) -> Chart:
    """The chart of ``rates``: time runs left to right over the span the
    readings cover (at least MIN_SPAN, at most ``window``), ending now."""
    top = max([r.published for r in rates] + [r.acked for r in rates] + [1.0])
    span = max(MIN_SPAN, min(window, now - rates[0].at)) if rates else window

    def points(values: list[tuple[float, float]]) -> str:
        return " ".join(
            f"{CHART_W * (1 - min(span, now - at) / span):.1f},{CHART_H - 1 - (CHART_H - 2) * v / top:.1f}"
            for at, v in values
        )

    last = rates[-1] if rates else None
    return Chart(
        points([(r.at, r.published) for r in rates]),
        points([(r.at, r.acked) for r in rates]),
        top,
        None if last is None else last.published,
        None if last is None else last.acked,
    )
