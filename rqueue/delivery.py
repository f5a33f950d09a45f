"""Deliveries: one hand-over of one message to one consumer, and the
interface a delivery settles itself through."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple, Protocol

from .ids import delivery_tag

if TYPE_CHECKING:
    from .errors import RQueueError

# The header of a replayed dead letter's deliveries: how many deliveries it
# had before it was dead-lettered and replayed.
REPLAYED_HEADER = "x-rq-replayed-deliveries"
# A message's time to live in ms after its publish (publish(ttl=), docs/lifecycle.md).
TTL_HEADER = "x-rq-ttl"


class DeliveryOwner(Protocol):
    """What a delivery needs of the consumer that fetched it."""

    def ack(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool = False) -> None: ...
    def nack(self, delivery: DeliveryRef, delay: float | None = None, error: str = "") -> str: ...
    def reject(self, delivery: DeliveryRef, requeue: bool = False, reason: str = "") -> None: ...
    def term(self, delivery: DeliveryRef, reason: str = "") -> None: ...
    def in_progress(self, deliveries: DeliveryRef | Iterable[DeliveryRef]) -> int: ...


class Delivery:
    """One hand-over of one message to one consumer.

    Attributes:
        seq: the message's sequence number in its queue.
        data: the payload (bytes).
        headers: str to str.
        delivery_count: 1 on the first delivery, persisted across crashes.
        published_ms: server time of the publish, ms since the epoch.
        deadline_ms: server time at which the lease runs out.
        token: the random word of the fetch that made it (a tag names its
            delivery only with it).
        tag: ``<seq>.<delivery_count>.<token>``: exactly this hand-over.
        replayed: the message was dead-lettered and replayed: its
            delivery_count started again (max_deliveries counts from the
            replay) and the header ``x-rq-replayed-deliveries`` says how
            many deliveries came before the replay.
        epoch: how many losses of Redis state its consumer had seen when
            it was made (a delivery from before a loss cannot be settled).
    """

    __slots__ = (
        "seq",
        "data",
        "headers",
        "delivery_count",
        "published_ms",
        "deadline_ms",
        "consumer",
        "token",
        "_tag",
        "replayed",
        "epoch",
    )

    def __init__(
        self,
        consumer: DeliveryOwner,
        seq: int,
        delivery_count: int,
        data: bytes,
        headers: dict[str, str],
        published_ms: int,
        deadline_ms: int,
        token: str,
        replayed: bool = False,
        epoch: int = 0,
    ) -> None:
        self.consumer = consumer
        self.seq = seq
        self.delivery_count = delivery_count
        self.data = data
        self.headers = headers
        self.published_ms = published_ms
        self.deadline_ms = deadline_ms
        self.token = token
        self._tag: str | None = delivery_tag(seq, delivery_count, token)
        self.replayed = replayed
        self.epoch = epoch

    @property
    def tag(self) -> str:
        """``<seq>.<delivery_count>.<token>``: exactly this hand-over."""
        tag = self._tag
        if tag is None:
            # A fetch leaves it unmade: most deliveries are acked by seq,
            # count and token, never named by text.
            self._tag = tag = delivery_tag(self.seq, self.delivery_count, self.token)
        return tag

    @property
    def redelivered(self) -> bool:
        """The message was delivered before (to this group): a later
        delivery, or a replayed dead letter."""
        return self.delivery_count > 1 or self.replayed

    def ack(self, multiple: bool = False) -> None:
        """Settles the message for the group (with ``multiple``, also every
        earlier delivery this consumer holds)."""
        self.consumer.ack(self, multiple=multiple)

    def nack(self, delay: float | None = None, error: str = "") -> str:
        """Offers the message again (see :meth:`Consumer.nack`)."""
        return self.consumer.nack(self, delay=delay, error=error)

    nak = nack

    def reject(self, requeue: bool = False, reason: str = "") -> None:
        """Dead-letters the message now, or with ``requeue`` offers it again at once."""
        self.consumer.reject(self, requeue=requeue, reason=reason)

    def term(self, reason: str = "") -> None:
        """Dead-letters the message now, recording ``reason``."""
        self.consumer.term(self, reason)

    def in_progress(self) -> int:
        """Extends the lease by ack_wait; returns the new deadline (server ms)."""
        return self.consumer.in_progress(self)

    def __repr__(self) -> str:
        return f"Delivery(tag={self.tag!r}, data={self.data[:40]!r})"


DeliveryRef = Delivery | str


class HeartbeatResult(NamedTuple):
    """What one heartbeat did."""

    statuses: list[RQueueError | None]  # per delivery: None = lease extended
    removed: int  # silent members removed
    returned: int  # their deliveries offered again
    dead_lettered: int  # their deliveries that had reached max_deliveries
    handed_back: int  # (sync) deliveries held in Redis that the caller did not know
