"""A worker's counters, and the one place that adds to them."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .metrics import WorkerMetrics


@dataclass
class WorkerStats:
    """Counters of one worker since it started."""

    fetched: int = 0  # deliveries received
    handled: int = 0  # handler invocations
    acked: int = 0  # acks confirmed by Redis
    nacked: int = 0  # handler raised: offered again under the redelivery policy
    rejected: int = 0  # handler raised rqueue.Reject: dead-lettered at once
    dead_lettered: int = 0  # messages this worker dead-lettered: Reject, or a nack past max_deliveries
    redelivered: int = 0  # deliveries with a delivery count above 1
    stale_skipped: int = 0  # deliveries no longer held when their turn came: not run
    late_settles: int = 0  # acks/nacks whose delivery had moved on (reported, not raised)
    timed_out: int = 0  # handlers that ran past their time limit: nacked with the reason timeout
    leases_lost: int = 0  # running or waiting deliveries whose lease could not be extended
    members_removed: int = 0  # silent members of the group this worker removed
    reconnects: int = 0  # Redis calls retried after a connection error

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def total(cls, parts: Iterable[WorkerStats]) -> WorkerStats:
        """The counters of ``parts`` added up."""
        total = cls()
        for part in parts:
            for f in dataclasses.fields(cls):
                setattr(total, f.name, getattr(total, f.name) + getattr(part, f.name))
        return total


class Tally:
    """Adds to a worker's :class:`WorkerStats` (from any thread) and to its
    metrics, when it has them."""

    def __init__(self, stats: WorkerStats, metrics: WorkerMetrics | None = None) -> None:
        self.stats = stats
        self.metrics = metrics
        self._lock = threading.Lock()

    def count(self, **deltas: int) -> None:
        """Adds ``deltas`` (WorkerStats field names) to the counters."""
        with self._lock:
            for key, delta in deltas.items():
                setattr(self.stats, key, getattr(self.stats, key) + delta)
        if self.metrics is not None:
            self.metrics.count(deltas)

    def handled(self) -> None:
        """Counts one handler invocation."""
        # No generic count() per message: with a quick handler this
        # bookkeeping is most of a handler thread's work.
        with self._lock:
            self.stats.handled += 1
        if self.metrics is not None:
            self.metrics.count({"handled": 1})
