"""The figures of every queue at once, as Client.overview() returns them:
cheaper than QueueStats (plain reads pipelined over all queues, no script
per group) and enough for a list of queues with rates."""

from __future__ import annotations

from dataclasses import dataclass, field

from .engine.store import LevelFigures


@dataclass(frozen=True, slots=True)
class QueueSummary:
    """One queue's (or one partition's) counts. A partitioned queue's are
    the sums over ``partitions``, listed in order."""

    name: str
    last_seq: int = 0  # seq of the newest message ever published (summed over partitions)
    depth: int = 0  # records stored now
    in_flight: int = 0  # deliveries held by consumers, over every group
    delayed: int = 0  # waiting for a redelivery delay or a delayed publish, over every group
    scheduled: int = 0  # delayed publishes not yet due
    dead_letters: int = 0  # records in its dead-letter queue
    acked: int = 0  # acks ever counted, over every group (a rate is its change over time)
    groups: int = 0  # groups (distinct names over the partitions)
    consumers: int = 0  # members over every group (of a partitioned queue: over every partition)
    error: str | None = None  # why the queue cannot be read (its figures are then zero)
    partition: int | None = None
    partitions: list[QueueSummary] = field(default_factory=list)


def summarize(name: str, figures: LevelFigures, partition: int | None = None) -> QueueSummary:
    """The summary of one queue or partition from the figures read for it."""
    groups = figures.groups
    return QueueSummary(
        name,
        last_seq=figures.last_seq,
        depth=figures.depth,
        in_flight=sum(g.in_flight for g in groups),
        delayed=sum(g.delayed for g in groups),
        scheduled=figures.scheduled,
        dead_letters=figures.dead_letters,
        acked=sum(g.acked for g in groups),
        groups=len(groups),
        consumers=sum(g.consumers for g in groups),
        partition=partition,
    )


def add_up(name: str, parts: list[LevelFigures]) -> QueueSummary:
    """The summary of a partitioned queue: its partitions' sums, and each of them."""
    each = [summarize(name, f, i) for i, f in enumerate(parts)]
    return QueueSummary(
        name,
        last_seq=sum(p.last_seq for p in each),
        depth=sum(p.depth for p in each),
        in_flight=sum(p.in_flight for p in each),
        delayed=sum(p.delayed for p in each),
        scheduled=sum(p.scheduled for p in each),
        dead_letters=sum(p.dead_letters for p in each),
        acked=sum(p.acked for p in each),
        groups=len({g.name for f in parts for g in f.groups}),
        consumers=sum(p.consumers for p in each),
        partitions=each,
    )
