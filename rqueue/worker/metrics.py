"""Prometheus metrics of a worker: counters of what it did, a histogram of
handler run times, and gauges of its queue read from Redis at scrape time.

Needs the ``metrics`` extra (prometheus-client).
"""

from __future__ import annotations

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
    "late_settles": ("rqueue_late_settles_total", "Acks and nacks whose delivery had moved on."),
    "members_removed": ("rqueue_members_removed_total", "Silent members of the group this worker removed."),
    "reconnects": ("rqueue_reconnects_total", "Redis calls retried after a connection error."),
}

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
    """Queue gauges, read from Redis when Prometheus scrapes."""

    def __init__(self, queue: AnyQueue, group: str) -> None:
        self.queue = queue
        self.group = group

    def collect(self) -> Iterator[Any]:
        labels = ["queue", "group"]
        values = [self.queue.name, self.group]
        try:
            stats = self.queue.stats()
            g = stats.group(self.group)
        except (RQueueError, KeyError, OSError):
            return  # an unreachable Redis must not break the scrape
        for name, help, value in (
            ("rqueue_queue_depth", "Messages stored in the queue.", stats.depth),
            ("rqueue_queue_dead_letters", "Messages in the queue's dead-letter queue.", stats.dead_letters),
            ("rqueue_group_pending", "Messages the group has not settled.", g.pending),
            ("rqueue_group_in_flight", "Deliveries of the group not yet acked.", g.in_flight),
            ("rqueue_group_delayed", "Messages of the group waiting for a delay.", g.delayed),
            ("rqueue_group_ack_floor", "Highest seq with every seq at or below it settled.", g.ack_floor),
        ):
            family = GaugeMetricFamily(name, help, labels=labels)
            family.add_metric(values, value)
            yield family
