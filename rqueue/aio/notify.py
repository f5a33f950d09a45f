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

from ..clock import SYSTEM_CLOCK
from ..constants import IDLE_POLL_INTERVAL
from ..engine.notify import STEADY_SECONDS, SUBSCRIBE_TIMEOUT, reconnect_pause

log = logging.getLogger("rqueue.engine.notify")


class AsyncNotifier:
    """Waiters are futures woken all at once by any news (an announcement, a
    subscription, a :meth:`poke`); each then re-checks what it waits for.
    A poke is a plain call, as cheap as a worker's handler finishing
    needs."""

    def __init__(self, redis_client: Any) -> None:
        self._redis = redis_client
        self._waiters: set[asyncio.Future[None]] = set()
        self._generation: dict[str, int] = {}
        self._wanted: set[str] = set()
        self._subscribed: set[str] = set()
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self._refused = False

    def listens(self, channel: str) -> bool:
        """See :meth:`rqueue.engine.notify.Notifier.listens`."""
        return channel in self._wanted

    async def generation(self, channel: str) -> int:
        """A counter that changes when ``channel`` announces something."""
        if self._refused:
            return 0
        if channel not in self._wanted:
            self._wanted.add(channel)
            self._generation.setdefault(channel, 0)
            if self._task is None:
                self._task = asyncio.get_running_loop().create_task(self._run(), name="rqueue-notify")
            self.poke()
            await self._until(lambda: channel in self._subscribed or self._closed or self._refused, SUBSCRIBE_TIMEOUT)
        return self._generation.get(channel, 0)

    async def wait(self, channel: str, since: int, timeout: float, until: Callable[[], bool] | None = None) -> bool:
        """Waits until ``channel``'s generation differs from ``since`` (or
        ``until()`` is true after a :meth:`poke`); True if either happened."""
        return await self.wait_any({channel: since}, timeout, until)

    async def wait_any(self, since: dict[str, int], timeout: float, until: Callable[[], bool] | None = None) -> bool:
        """As :meth:`wait`, for the first of several channels (``since`` maps
        each to the generation read before fetching)."""
        if timeout <= 0:
            return False
        generation = self._generation

        def done() -> bool:
            if self._closed or (until is not None and until()):
                return True
            return any(generation.get(channel, 0) != gen for channel, gen in since.items())

        return await self._until(done, timeout)

    async def _until(self, done: Callable[[], bool], timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not done():
            left = deadline - loop.time()
            if left <= 0:
                return False
            waiter = loop.create_future()
            self._waiters.add(waiter)
            timer = loop.call_later(left, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiters.discard(waiter)
        return True

    def poke(self) -> None:
        """Wakes every waiter so that it re-checks what it waits for (from
        the loop's thread)."""
        waiters, self._waiters = self._waiters, set()
        for waiter in waiters:
            _wake(waiter)

    async def close(self) -> None:
        self._closed = True
        self.poke()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task
            self._task = None

    async def _run(self) -> None:
        pubsub: Any = None
        requested: set[str] = set()
        missed: set[str] = set()  # as rqueue.engine.notify: a resubscription counts as an announcement
        made_at = -STEADY_SECONDS
        broke = False
        while not self._closed:
            try:
                if pubsub is None:
                    pubsub = self._redis.pubsub()
                    requested = set()
                    self._subscribed = set()
                    made_at = SYSTEM_CLOCK.monotonic()
                    if broke:
                        missed |= self._wanted
                missing = self._wanted - requested
                if missing:
                    await pubsub.subscribe(*missing)
                    requested |= missing
                message = await pubsub.get_message(timeout=0.1)
                if message is None:
                    continue
                channel = message["channel"]
                channel = channel.decode() if isinstance(channel, bytes) else channel
                if message["type"] == "subscribe":
                    self._subscribed.add(channel)
                    if channel in missed:
                        missed.discard(channel)
                        self._generation[channel] = self._generation.get(channel, 0) + 1
                elif message["type"] == "message":
                    self._generation[channel] = self._generation.get(channel, 0) + 1
                self.poke()
            except asyncio.CancelledError:
                break
            except redis.exceptions.NoPermissionError as exc:
                log.warning(
                    "SUBSCRIBE refused (%s): idle consumers poll every %.1f s instead of being woken",
                    exc,
                    IDLE_POLL_INTERVAL,
                )
                self._refused = True
                self.poke()
                break
            except Exception as exc:  # the connection broke: wake everyone, then resubscribe
                log.debug("wake-up channel lost (%s); reconnecting", exc)
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        await pubsub.aclose()
                pubsub = None
                broke = True
                for ch in self._generation:
                    self._generation[ch] += 1
                self.poke()
                await asyncio.sleep(reconnect_pause(made_at, SYSTEM_CLOCK.monotonic()))
        if pubsub is not None:
            with contextlib.suppress(Exception):
                await pubsub.aclose()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
