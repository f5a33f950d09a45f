"""Wake-ups for idle consumers of an asyncio client, as
rqueue.engine.notify.Notifier does for the sync ones: one pub/sub
connection per client, read by one task; a waiting fetch sleeps until an
announcement on its queue's channel, the next due time or its timeout.
Polling stays the safety net."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any

import redis

from ..constants import IDLE_POLL_INTERVAL
from ..engine.notify import RECONNECT_PAUSE, SUBSCRIBE_TIMEOUT

log = logging.getLogger("rqueue.engine.notify")


class AsyncNotifier:
    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        self._cond = asyncio.Condition()
        self._generation: dict[str, int] = {}
        self._wanted: set[str] = set()
        self._subscribed: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._refused = False

    async def generation(self, channel: str) -> int:
        """A counter that changes when ``channel`` announces something."""
        if self._refused:
            return 0
        async with self._cond:
            if channel not in self._wanted:
                self._wanted.add(channel)
                self._generation.setdefault(channel, 0)
                if self._task is None:
                    self._task = asyncio.get_running_loop().create_task(self._run(), name="rqueue-notify")
                self._cond.notify_all()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self._cond.wait_for(lambda: channel in self._subscribed or self._closed or self._refused),
                        SUBSCRIBE_TIMEOUT,
                    )
            return self._generation.get(channel, 0)

    async def wait(self, channel: str, since: int, timeout: float, until: Callable[[], bool] | None = None) -> bool:
        """Waits until ``channel``'s generation differs from ``since`` (or
        ``until()`` is true after a :meth:`poke`); True if either happened."""
        if timeout <= 0:
            return False

        def done() -> bool:
            if self._closed or (until is not None and until()):
                return True
            return self._generation.get(channel, 0) != since

        async with self._cond:
            try:
                return await asyncio.wait_for(self._cond.wait_for(done), timeout)
            except TimeoutError:
                return False

    def poke(self) -> None:
        """Wakes every waiter so that it re-checks its ``until`` condition
        (from the loop's thread)."""
        asyncio.get_running_loop().create_task(self._notify())

    async def _notify(self) -> None:
        async with self._cond:
            self._cond.notify_all()

    async def close(self) -> None:
        self._closed = True
        await self._notify()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    async def _run(self) -> None:
        pubsub: Any = None
        requested: set[str] = set()
        while not self._closed:
            try:
                if pubsub is None:
                    pubsub = self._redis.pubsub()
                    requested = set()
                    self._subscribed = set()
                missing = self._wanted - requested
                if missing:
                    await pubsub.subscribe(*missing)
                    requested |= missing
                message = await pubsub.get_message(timeout=0.1)
                if message is None:
                    continue
                channel = message["channel"]
                channel = channel.decode() if isinstance(channel, bytes) else channel
                async with self._cond:
                    if message["type"] == "subscribe":
                        self._subscribed.add(channel)
                    elif message["type"] == "message":
                        self._generation[channel] = self._generation.get(channel, 0) + 1
                    self._cond.notify_all()
            except asyncio.CancelledError:
                break
            except redis.exceptions.NoPermissionError as exc:
                log.warning(
                    "SUBSCRIBE refused (%s): idle consumers poll every %.1f s instead of being woken",
                    exc,
                    IDLE_POLL_INTERVAL,
                )
                self._refused = True
                await self._notify()
                break
            except Exception as exc:  # the connection broke: wake everyone, then resubscribe
                log.debug("wake-up channel lost (%s); reconnecting", exc)
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                pubsub = None
                async with self._cond:
                    for ch in self._generation:
                        self._generation[ch] += 1
                    self._cond.notify_all()
                await asyncio.sleep(RECONNECT_PAUSE)
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()
