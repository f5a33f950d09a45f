"""What one dashboard holds between requests: its client, the latest
overview (shared by every viewer for a second, so that many open pages cost
Redis one overview read a second) and the rate history."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import rqueue
from rqueue.overview import QueueSummary

from .rates import RateHistory

OVERVIEW_TTL = 1.0  # seconds an overview reading is shared


@dataclass(frozen=True)
class Reading:
    at: float  # monotonic seconds
    queues: list[QueueSummary]


class Overviews:
    def __init__(self, client: rqueue.Client, ttl: float = OVERVIEW_TTL) -> None:
        self.client = client
        self.ttl = ttl
        self.history = RateHistory()
        self._latest: Reading | None = None
        self._lock = threading.Lock()

    def read(self, fresh: bool = False) -> Reading:
        """The latest reading, read again when older than the ttl or when ``fresh``."""
        with self._lock:  # one reader at a time; the others take its reading
            latest = self._latest
            now = time.monotonic()
            if fresh or latest is None or now - latest.at >= self.ttl:
                latest = Reading(now, self.client.overview())
                self.history.record(now, latest.queues)
                self._latest = latest
            return latest

    def has(self, name: str) -> bool:
        """Whether queue ``name`` exists (read again before saying no: it may be new)."""
        return any(q.name == name for q in self.read().queues) or any(
            q.name == name for q in self.read(fresh=True).queues
        )
