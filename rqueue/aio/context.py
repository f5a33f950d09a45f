"""What the queues and consumers of an asyncio client need of the client
and of their queue (rqueue.aio.Client and rqueue.aio.Queue are ones), as
rqueue.protocols does for the sync classes."""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import asyncio

    from ..clock import Clock
    from ..engine.async_commands import AsyncGroupCall
    from ..engine.async_scripts import AsyncScripts
    from ..engine.keys import LogLayout, QueueKeys
    from ..placement import Layout
    from ..randomness import Randomness
    from ..settings import Settings
    from ..statewatch import StateWatch
    from .notify import AsyncNotifier
    from .settings import AsyncSettings


class AsyncContext(Protocol):
    redis: Any
    scripts: AsyncScripts
    clock: Clock
    randomness: Randomness
    prefix: str
    dlq_prefix: str
    dlq_suffix: str
    log_layout: LogLayout
    settings: AsyncSettings
    notifier: AsyncNotifier

    cluster: bool
    durable_replicas: int
    durable_timeout: float
    failover_timeout: float
    durable_state: dict[str, Any]

    def dead_letter_name(self, queue: str) -> str: ...
    def forget(self, name: str) -> None: ...
    def learn_partitions(self, root: str, layout: Layout) -> None: ...
    def state_watch(self, name: str, keys: QueueKeys) -> StateWatch: ...
    def queue(self, name: str) -> Any: ...
    async def partitioned_now(self, root: str, text: str) -> Layout: ...
    async def node_for(self, key: str) -> tuple[Any, str]: ...
    async def refresh_topology(self) -> None: ...
    async def register(self, name: str, again: bool = False) -> None: ...
    def event_writer(self, keys: QueueKeys) -> Callable[[dict[str, str]], None]: ...
    def in_background(
        self, work: Coroutine[Any, Any, Any], failed: Callable[[BaseException], None]
    ) -> asyncio.Task[Any]: ...
    async def background_done(self) -> None: ...


class AsyncQueueLike(Protocol):
    name: str
    root: str
    keys: QueueKeys
    partition: int | None

    @property
    def client(self) -> AsyncContext: ...

    async def settings(self) -> Settings: ...
    async def check_plain(self) -> None: ...
    def group_call(self, group: str, settings: Settings | None = None, consumer: str = "") -> AsyncGroupCall: ...
