"""Plain value types the client returns: publish confirmations, stats,
messages seen without claiming them, dead letters and replay results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple


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
    # The queue's incarnation when it took the message (None: not known), so
    # that result() does not take a later message's result for this one's
    # once Redis lost the queue's state and its seqs were given out again.
    incarnation: str | None = field(default=None, compare=False, repr=False)

    def __init__(
        self,
        seq: int,
        duplicate: bool = False,
        alternate: str | None = None,
        partition: int | None = None,
        incarnation: str | None = None,
    ) -> None:
        # A frozen dataclass's own __init__ goes through object.__setattr__,
        # three times slower; a publish makes one of these per message.
        _set_seq(self, seq)
        _set_duplicate(self, duplicate)
        _set_alternate(self, alternate)
        _set_partition(self, partition)
        _set_incarnation(self, incarnation)


# The slots' own setters (member descriptors), which frozen=True leaves alone.
_set_seq = PublishResult.__dict__["seq"].__set__
_set_duplicate = PublishResult.__dict__["duplicate"].__set__
_set_alternate = PublishResult.__dict__["alternate"].__set__
_set_partition = PublishResult.__dict__["partition"].__set__
_set_incarnation = PublishResult.__dict__["incarnation"].__set__


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
    paused: bool = False  # its fetches hand out nothing until resumed (docs/flow-control.md)
    # Ordering keys (docs/flow-control.md): keys that may hand out a message
    # now, and keys with deliveries out (at key_concurrency, or below it).
    keys_ready: int = 0
    keys_busy: int = 0


@dataclass(frozen=True, slots=True)
class PartitionPlacement:
    """Where one partition of a partitioned queue lives."""

    partition: int
    hash_tag: str  # "{<queue>/<i>}" or "{<queue>/<i>~<salt>}"
    slot: int  # its Redis Cluster slot
    node: str  # host:port of the primary serving the slot; "" on a single server


@dataclass(frozen=True, slots=True)
class PlacementReport:
    """Where every partition of a queue lives (`rqueue rebalance`)."""

    queue: str
    partitions: int
    placement: list[PartitionPlacement]
    per_node: dict[str, int]  # primary -> how many of the queue's partitions it serves (every primary listed)
    balanced: bool  # no primary serves two partitions more than another


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
    # A partitioned queue's partitions: where each one lives (rqueue/placement.py).
    placement: list[PartitionPlacement] = field(default_factory=list)
    paused: str = ""  # "" running, "refuse" or "hold" (docs/flow-control.md)

    def group(self, name: str) -> GroupStats:
        for g in self.groups:
            if g.name == name:
                return g
        raise KeyError(name)


Progress = Callable[[int], None]  # called with how many more were handled


class Message:
    """A stored message seen without claiming it (peek, dead-letter listing)."""

    __slots__ = ("seq", "data", "headers", "published_ms")

    def __init__(self, seq: int, data: bytes, headers: dict[str, str], published_ms: int) -> None:
        self.seq = seq
        self.data = data
        self.headers = headers
        self.published_ms = published_ms

    def __repr__(self) -> str:
        return f"Message(seq={self.seq}, data={self.data[:40]!r}, headers={self.headers!r})"


@dataclass(frozen=True)
class DeadLetter:
    """One message in a dead-letter queue. Times are server ms since the epoch."""

    dlq_seq: int  # its seq in the dead-letter queue
    queue: str  # the queue it was dead-lettered from
    group: str  # the group that dead-lettered it
    seq: int  # its seq in that queue
    reason: str  # max-deliveries, rejected, terminated, corrupted-record, ...
    deliveries: int  # deliveries it had
    first_delivery_ms: int | None
    last_delivery_ms: int | None
    published_ms: int | None  # when it was first published
    dead_lettered_ms: int
    error: str  # the last error text, "" when none
    data: bytes
    headers: dict[str, str]  # its own headers, without the x-rq-* ones
    partition: int | None = None  # the partition of a partitioned queue it came from

    @classmethod
    def from_message(cls, m: Message) -> DeadLetter:
        h = m.headers

        def num(name: str) -> int | None:
            value = h.get(name, "")
            return int(value) if value.isdigit() else None

        return cls(
            dlq_seq=m.seq,
            queue=h.get("x-rq-queue", ""),
            group=h.get("x-rq-group", ""),
            seq=num("x-rq-seq") or 0,
            reason=h.get("x-rq-reason", ""),
            deliveries=num("x-rq-deliveries") or 0,
            first_delivery_ms=num("x-rq-first-delivery"),
            last_delivery_ms=num("x-rq-last-delivery"),
            published_ms=num("x-rq-published"),
            dead_lettered_ms=m.published_ms,
            error=h.get("x-rq-error", ""),
            data=m.data,
            headers={k: v for k, v in h.items() if not k.startswith("x-rq-")},
        )


@dataclass
class ReplayResult:
    """What a replay did (or, with dry_run, would do)."""

    selected: int = 0
    replayed: int = 0
    missing: int = 0  # gone before their turn (replayed or purged by someone else)
    skipped: int = 0  # left alone: another queue's or incarnation's, corrupted, or already open
    dry_run: bool = False
    by_group: dict[str, int] = field(default_factory=dict)

    def plus(self, other: ReplayResult) -> ReplayResult:
        """The two results together (of two partitions of one queue)."""
        by_group = dict(self.by_group)
        for g, n in other.by_group.items():
            by_group[g] = by_group.get(g, 0) + n
        return ReplayResult(
            self.selected + other.selected,
            self.replayed + other.replayed,
            self.missing + other.missing,
            self.skipped + other.skipped,
            self.dry_run,
            by_group,
        )


class GroupReset(NamedTuple):
    """What a group reset did (``Queue.reset_group``)."""

    group: str
    previous: int  # the ack floor before
    floor: int  # the ack floor now: the group is handed the seqs above it
    cancelled: int  # deliveries taken back from its consumers
    partition: int | None = None  # the partition (a partitioned queue's reset: one per partition)


class Trimmed(NamedTuple):
    """One trim step of retention (``Queue.trim``)."""

    retained: bool  # the queue is in retention mode: trim steps delete its settled records
    trimmed: int  # records at or below this seq are deleted
    passed: int  # seqs this step deleted


class MessageState(Enum):
    """Where one message stands (``Queue.status``): overall, or in one group."""

    UNKNOWN = "unknown"  # no such seq, or an id outside the de-duplication window
    PUBLISHED = "published"  # stored; in a group: not read by it yet
    DELAYED = "delayed"  # a delayed publish, or a delayed redelivery, not yet due
    IN_FLIGHT = "in-flight"  # a consumer of the group holds it
    WAITING = "waiting"  # a redelivery due now
    ACKED = "acked"  # settled by the group, and no dead letter or drop of it in the events read
    DEAD_LETTERED = "dead-lettered"  # moved to the dead-letter queue (reason)
    DROPPED = "dropped"  # dropped by dead_letter=None (reason)
    SETTLED = "settled"  # overall only: every group settled it (or the queue's retention deleted it)


class GroupMessageStatus(NamedTuple):
    """One group's view of a message."""

    state: MessageState
    consumer: str | None  # who holds it (IN_FLIGHT)
    deliveries: int  # deliveries made so far (IN_FLIGHT, WAITING, DELAYED redeliveries)
    reason: str | None  # DEAD_LETTERED, DROPPED


@dataclass(frozen=True)
class MessageStatus:
    """What became of one message (``Queue.status``)."""

    seq: int | None  # None when unknown
    state: MessageState  # UNKNOWN, PUBLISHED, DELAYED or SETTLED
    published_ms: int | None  # None once the record is deleted
    not_before_ms: int | None  # a delayed publish not yet due
    groups: dict[str, GroupMessageStatus] = field(default_factory=dict)
