"""What the queues and consumers of an asyncio client need of the client
and of their queue (rqueue.aio.Client and rqueue.aio.Queue are ones), as
rqueue.protocols does for the sync classes."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from ..clock import Clock
    from ..engine.async_commands import AsyncGroupCall
    from ..engine.async_scripts import AsyncScripts
    from ..engine.keys import QueueKeys
    from ..randomness import Randomness
    from ..settings import Settings
    from .notify import AsyncNotifier
    from .settings import AsyncSettings


class AsyncContext(Protocol):
    redis: Any
    scripts: AsyncScripts
    clock: Clock
    randomness: Randomness
    prefix: str
    cluster: bool
    dlq_prefix: str
    dlq_suffix: str
    settings: AsyncSettings
    notifier: AsyncNotifier

    def dead_letter_name(self, queue: str) -> str: ...
    async def register(self, name: str) -> None: ...


class AsyncQueueLike(Protocol):
    name: str
    keys: QueueKeys
    client: AsyncContext

    async def settings(self) -> Settings: ...
    async def check_plain(self) -> None: ...
    def group_call(self, group: str, settings: Settings | None = None, consumer: str = "") -> AsyncGroupCall: ...
