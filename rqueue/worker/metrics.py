"""Prometheus metrics of a worker: counters of what it did, a histogram of
handler run times, and gauges of its queue read from Redis at scrape time.

Needs the ``metrics`` extra (prometheus-client).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import RQueueError

if TYPE_CHECKING:
    from ..protocols import AnyQueue

try:
    from prometheus_client import CollectorRegistry, Counter, Histogram, start_http_server
    from prometheus_client.core import GaugeMetricFamily
except ImportError:  # pragma: no cover - depends on the install
    # None marks the missing extra; WorkerMetrics checks it before any use.
    CollectorRegistry = None  # type: ignore[assignment,misc]

# WorkerStats counter -> (metric name, help)
COUNTERS: dict[str, tuple[str, str]] = {
    "fetched": ("rqueue_delivered_total", "Deliveries received by the worker."),
    "acked": ("rqueue_acked_total", "Acks confirmed by Redis."),
    "nacked": ("rqueue_nacked_total", "Handler failures offered again under the redelivery policy."),
    "redelivered": ("rqueue_redelivered_total", "Deliveries that were redeliveries (delivery count > 1)."),
    "dead_lettered": ("rqueue_dead_lettered_total", "Messages this worker dead-lettered (Reject or max_deliveries)."),
    "stale_skipped": (
        "rqueue_suppressed_duplicates_total",
        "Deliveries not run because the group may have settled them.",
    ),
    "timed_out": ("rqueue_timed_out_total", "Handlers that ran past their time limit (nacked, reason timeout)."),
    "late_settles": ("rqueue_late_settles_total", "Acks and nacks whose delivery had moved on."),
    "members_removed": ("rqueue_members_removed_total", "Silent members of the group this worker removed."),
    "reconnects": ("rqueue_reconnects_total", "Redis calls retried after a connection error."),
}

log = logging.getLogger("rqueue.worker")

READ_TIMEOUT = 2.0  # seconds a scrape waits for the queue gauges

# Seconds; handler run times from a millisecond to ten minutes.
HANDLER_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0, 120.0, 600.0)


class WorkerMetrics:
    """The metrics of one worker, registered in ``registry``."""

    def __init__(self, queue: AnyQueue, group: str, registry: Any = None) -> None:
        if CollectorRegistry is None:
            raise RQueueError("metrics need prometheus-client: pip install 'rqueue[metrics]'")
        self.registry = registry if registry is not None else CollectorRegistry()
        labels = ["queue", "group"]
        self._labels = {"queue": queue.name, "group": group}
        self._counters = {
            stat: Counter(name.removesuffix("_total"), help, labels, registry=self.registry)
            for stat, (name, help) in COUNTERS.items()
        }
        self.handler_seconds = Histogram(
            "rqueue_handler_seconds",
            "Run time of the handler.",
            labels,
            buckets=HANDLER_BUCKETS,
            registry=self.registry,
        ).labels(**self._labels)
        self.registry.register(_QueueCollector(queue, group))

    def count(self, deltas: Mapping[str, int]) -> None:
        """Adds worker counter deltas (names of WorkerStats fields)."""
        for stat, delta in deltas.items():
            counter = self._counters.get(stat)
            if counter is not None and delta > 0:
                counter.labels(**self._labels).inc(delta)

    def serve(self, port: int, addr: str = "127.0.0.1") -> None:
        """Serves /metrics over HTTP on ``addr:port`` (a daemon thread)."""
        start_http_server(port, addr=addr, registry=self.registry)


class _QueueCollector:
    """Queue gauges, read from Redis when Prometheus scrapes, and
    ``rqueue_queue_stats_up``: 1 when they could be read, 0 when not.

    The read runs in a thread of its own and is waited for up to
    :data:`READ_TIMEOUT`: a Redis that is down or does not answer must not
    fail or stall the scrape, which keeps serving the worker's counters
    (they matter most then). One read at a time: a scrape while the last
    read still waits for Redis does not start another."""

    def __init__(self, queue: AnyQueue, group: str) -> None:
        self.queue = queue
        self.group = group
        self._lock = threading.Lock()
        self._reading: _Read | None = None
        self._up = True  # as last logged

    def describe(self) -> Iterator[Any]:
        # Names only: registering the collector must not read Redis.
        return iter(self._families())

    def collect(self) -> Iterator[Any]:
        stats, why = self._read()
        up = stats is not None
        if up != self._up:
            self._up = up
            if up:
                log.info("queue gauges of %s/%s can be read again", self.queue.name, self.group)
            else:
                log.warning(
                    "queue gauges of %s/%s could not be read (%s); serving the worker's counters without them",
                    self.queue.name,
                    self.group,
                    why,
                )
        values = [self.queue.name, self.group]
        families = self._families()
        families[0].add_metric(values, 1 if up else 0)
        yield families[0]
        if stats is None:
            return
        readings = [stats.depth, stats.dead_letters]
        if self.group in [g.name for g in stats.groups]:  # not before the worker joins it
            g = stats.group(self.group)
            readings += [g.pending, g.in_flight, g.delayed, g.ack_floor]
        for family, value in zip(families[1:], readings, strict=False):
            family.add_metric(values, value)
            yield family

    def _families(self) -> list[Any]:
        labels = ["queue", "group"]
        return [
            GaugeMetricFamily(name, help, labels=labels)
            for name, help in (
                ("rqueue_queue_stats_up", "1 when the queue gauges could be read from Redis at this scrape, else 0."),
                ("rqueue_queue_depth", "Messages stored in the queue."),
                ("rqueue_queue_dead_letters", "Messages in the queue's dead-letter queue."),
                ("rqueue_group_pending", "Messages the group has not settled."),
                ("rqueue_group_in_flight", "Deliveries of the group not yet acked."),
                ("rqueue_group_delayed", "Messages of the group waiting for a delay."),
                ("rqueue_group_ack_floor", "Highest seq with every seq at or below it settled."),
            )
        ]

    def _read(self) -> tuple[Any, str]:
        """The queue's stats, or None and why not."""
        with self._lock:
            reading = self._reading
            if reading is None or reading.done.is_set():
                reading = self._reading = _Read(self.queue)
        if not reading.done.wait(READ_TIMEOUT):
            return None, f"Redis did not answer within {READ_TIMEOUT:g} s"
        return reading.stats, reading.why


class _Read:
    """One read of a queue's stats, in a daemon thread."""

    def __init__(self, queue: AnyQueue) -> None:
        self.stats: Any = None
        self.why = ""
        self.done = threading.Event()
        self._queue = queue
        threading.Thread(target=self._run, name="rqueue-metrics-read", daemon=True).start()

    def _run(self) -> None:
        try:
            self.stats = self._queue.stats()
        except Exception as exc:  # any failure leaves the gauges out, never the counters
            self.why = f"{type(exc).__name__}: {exc}"
        finally:
            self.done.set()
