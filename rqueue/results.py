"""Plain result types returned by the client."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, init=False)
class PublishResult:
    """Confirmation of one publish, given after Redis applied it.

    Attributes:
        seq: the message's sequence number in its queue (for a duplicate, the
            seq of the first publish of that id).
        duplicate: True when the id was seen inside the de-duplication window
            and nothing new was stored.
        alternate: None, or the name of the queue that took the message
            because this queue had no group (``mandatory=True`` with the
            ``alternate`` setting); ``seq`` is then a seq of that queue.
        partition: None, or the partition of a partitioned queue that
            took the message; ``seq`` is then a seq of that partition.
    """

    seq: int
    duplicate: bool = False
    alternate: str | None = None  # the alternate queue that took it (mandatory publish, no group)
    partition: int | None = None  # the partition that took it (partitioned queues)

    def __init__(
        self, seq: int, duplicate: bool = False, alternate: str | None = None, partition: int | None = None
    ) -> None:
        # A frozen dataclass's own __init__ goes through object.__setattr__,
        # three times slower; a publish makes one of these per message.
        _set_seq(self, seq)
        _set_duplicate(self, duplicate)
        _set_alternate(self, alternate)
        _set_partition(self, partition)


# The slots' own setters, which frozen=True leaves alone.
_set_seq = PublishResult.seq.__set__  # type: ignore[attr-defined]
_set_duplicate = PublishResult.duplicate.__set__  # type: ignore[attr-defined]
_set_alternate = PublishResult.alternate.__set__  # type: ignore[attr-defined]
_set_partition = PublishResult.partition.__set__  # type: ignore[attr-defined]


@dataclass(frozen=True, slots=True)
class ConsumerStats:
    """One member of a group."""

    name: str
    held: int  # deliveries it holds now
    last_heartbeat_ms: int | None  # server time in ms of its last sign of life
    idle_ms: int | None = None  # ms since that sign of life, when the stats were read


@dataclass(frozen=True, slots=True)
class GroupStats:
    """One group's view of a queue. Counts are messages; times are ms."""

    name: str
    ack_floor: int  # every seq <= this is settled by the group
    cursor: int  # highest seq the group has read
    pending: int  # published and not yet settled by this group
    in_flight: int  # delivered and unacked
    expired_leases: int  # in flight with a lease already over (redelivered at next fetch)
    oldest_lease_age_ms: int | None
    ready: int  # waiting for redelivery now
    delayed: int  # waiting for a redelivery delay or a delayed publish
    acked: int
    nacked: int
    redelivered: int
    expired: int
    dead_lettered: int
    dropped: int
    consumers: list[ConsumerStats] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class QueueStats:
    """Figures of one queue; never counts deleted data."""

    name: str
    last_seq: int  # seq of the newest message ever published
    depth: int  # records stored now (retained until every group settles them)
    scheduled: int  # delayed publishes not yet due
    dead_letters: int  # records in the dead-letter queue
    groups: list[GroupStats] = field(default_factory=list)
    # A partitioned queue's figures are the sums over its partitions, listed here.
    partitions: list[QueueStats] = field(default_factory=list)

    def group(self, name: str) -> GroupStats:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)
