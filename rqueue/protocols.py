"""The small interfaces the layers depend on instead of each other's
classes: what a queue needs of its client (QueueContext), and what a plain
and a partitioned queue, or their consumers, share (AnyQueue, AnyConsumer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .clock import Clock
    from .connection.open import RedisClient
    from .delivery import Delivery, DeliveryRef, HeartbeatResult
    from .engine.commands import GroupCall
    from .engine.keys import LogLayout, QueueKeys
    from .engine.notify import Notifier
    from .engine.scripts import Scripts
    from .errors import NotMember, RQueueError
    from .randomness import Randomness
    from .results import DeadLetter, Message, Progress, PublishResult, QueueStats, ReplayResult
    from .settings import Settings
    from .statewatch import StateWatch


class QueueContext(Protocol):
    """What queues, consumers and dead-letter operations need of the client
    that made them (rqueue.Client is one)."""

    redis: RedisClient
    scripts: Scripts
    clock: Clock
    randomness: Randomness
    notifier: Notifier
    prefix: str
    cluster: bool
    dlq_prefix: str
    dlq_suffix: str
    log_layout: LogLayout
    durable_replicas: int
    durable_timeout: float
    failover_timeout: float
    durable_state: dict[str, Any]

    def idempotent(self, call: Callable[[], Any]) -> Any: ...
    def resolved_settings(self, queue: str) -> Settings: ...
    def dead_letter_name(self, queue: str) -> str: ...
    def register(self, name: str, again: bool = False) -> None: ...
    def forget(self, name: str) -> None: ...
    def state_watch(self, name: str, keys: QueueKeys) -> StateWatch: ...
    def queue(self, name: str, partitions: int | None = None) -> AnyQueue: ...
    def node_for(self, key: str) -> tuple[Any, str]: ...
    def refresh_topology(self) -> None: ...
    def partitioned_now(self, root: str, text: str) -> Any: ...
    def layout(self, root: str) -> Any: ...
    def grow_partitions(self, name: str, partitions: int) -> Any: ...


class QueueLike(Protocol):
    """What consumers, publishing and dead-letter operations need of the
    one queue (or partition) they work on (rqueue.Queue is one)."""

    name: str
    root: str
    partition: int | None
    keys: QueueKeys
    client: QueueContext

    @property
    def dead_letter_queue(self) -> QueueLike: ...
    def settings(self) -> Settings: ...
    def group_keys(self, group: str, settings: Settings) -> list[str]: ...
    def group_call(self, group: str, settings: Settings | None = None, consumer: str = "") -> GroupCall: ...
    def peek(self, n: int = 10, after: int = 0) -> list[Message]: ...


class AnyConsumer(Protocol):
    """What a consumer of a plain queue and of a partitioned queue share."""

    @property
    def group(self) -> str: ...
    @property
    def name(self) -> str: ...
    def settings(self) -> Settings: ...
    def fetch(self, n: int = 1, timeout: float = 0.0) -> list[Delivery]: ...
    def ack(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool = False) -> None: ...
    def ack_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]: ...
    def ack_and_fetch(
        self, acks: Iterable[DeliveryRef], n: int
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]: ...
    def nack(self, delivery: DeliveryRef, delay: float | None = None, error: str = "") -> str: ...
    def reject(self, delivery: DeliveryRef, requeue: bool = False, reason: str = "") -> None: ...
    def term(self, delivery: DeliveryRef, reason: str = "") -> None: ...
    def in_progress(self, deliveries: DeliveryRef | Iterable[DeliveryRef]) -> int: ...
    def heartbeat(self, running: Iterable[DeliveryRef], timeout: float, sync: bool = False) -> HeartbeatResult: ...
    def rejoin(self, removal: NotMember | None = None) -> None: ...
    def join_marks(self) -> tuple[int, ...]: ...
    def rejoined_since(self, marks: Sequence[int]) -> Callable[[Delivery], bool] | None: ...
    def removed_by(self, removal: NotMember) -> Callable[[Delivery], bool]: ...
    def close(self) -> int: ...


class AnyQueue(Protocol):
    """What a plain queue and a partitioned queue share: what
    :meth:`rqueue.Client.queue` returns."""

    @property
    def name(self) -> str: ...
    @property
    def dead_letter_queue(self) -> AnyQueue: ...
    def settings(self) -> Settings: ...
    def publish(
        self,
        payload: bytes,
        headers: Mapping[str, str] | None = None,
        id: str | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        *,
        priority: int = 0,
        ttl: float | None = None,
        key: str | None = None,
    ) -> PublishResult: ...
    def publish_many(
        self,
        payloads: Sequence[bytes],
        headers: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None,
        ids: Sequence[str | None] | None = None,
        delay: float | None = None,
        mandatory: bool = False,
        durable: bool = False,
        *,
        priority: int | Sequence[int] | None = None,
        ttl: float | None = None,
    ) -> list[PublishResult]: ...
    def consumer(
        self, group: str, name: str | None = None, prefetch: int | None = None, liveness: float | None = None
    ) -> AnyConsumer: ...
    def groups(self) -> list[str]: ...
    def stats(self) -> QueueStats: ...
    def peek(self, n: int = 10, after: int = 0) -> list[Message]: ...
    def peek_group(self, group: str, n: int = 10) -> list[Message]: ...
    def purge(self, group: str | None = None, progress: Progress | None = None) -> dict[str, int]: ...
    def pause(self, group: str | None = None, mode: str = "hold") -> bool: ...
    def resume(self, group: str | None = None) -> bool: ...
    def delete(self, force: bool = False) -> int: ...
    def events(self, count: int = 100) -> list[dict[str, str]]: ...
    def events_after(self, last_id: str, count: int = 100) -> list[dict[str, str]]: ...
    def dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
    ) -> list[DeadLetter]: ...
    def replay_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        dry_run: bool = False,
        progress: Progress | None = None,
    ) -> ReplayResult: ...
    def purge_dead_letters(
        self,
        group: str | None = None,
        reason: str | None = None,
        seq_from: int | None = None,
        seq_to: int | None = None,
        limit: int | None = None,
        progress: Progress | None = None,
        *,
        dead_lettered_to: int | None = None,
    ) -> int: ...
