"""Wake-ups for idle consumers. With the setting wait_in_redis, an idle
consumer of one queue on one server waits in Redis: XREAD BLOCK on the
queue's wake stream, pipelined with its next fetch (commands.wait_then_fetch,
lua/includes/wake.lua). The rest (the setting off, a cluster, a partitioned
queue's consumers and workers, the scheduler) wait here on a pub/sub
channel per queue, on which publish.lua announces new
messages: a waiting fetch sleeps until an announcement, the next due time,
or its timeout, whichever is first. Polling stays as the safety net, so a
lost announcement only delays, never loses, a message."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable

import redis

from ..clock import SYSTEM_CLOCK
from ..connection.open import RedisClient
from ..constants import IDLE_POLL_INTERVAL
from . import commands
from .keys import QueueKeys

log = logging.getLogger("rqueue.engine.notify")

SUBSCRIBE_TIMEOUT = 1.0  # seconds to wait for a subscription to be confirmed
FIRST_RECONNECT_PAUSE = 0.05  # seconds before the first attempt after a connection that held broke
RECONNECT_PAUSE = 0.5  # seconds between the attempts after that
# Seconds a connection must have lasted for its break to get the short
# pause: one that breaks again sooner (a flapping proxy) is tried every
# RECONNECT_PAUSE, so its waiters are not woken 20 times a second.
STEADY_SECONDS = 2.0


def reconnect_pause(made_at: float, now: float) -> float:
    """How long the notifier waits before subscribing again, after a
    connection made at ``made_at`` broke at ``now`` (monotonic seconds)."""
    return FIRST_RECONNECT_PAUSE if now - made_at >= STEADY_SECONDS else RECONNECT_PAUSE


def wake_waiters(r: RedisClient, keys: QueueKeys) -> None:
    """Ends the waits of the consumers blocked on the queue's wake stream
    at once, as a publish would: a stopping worker's own wait among them.
    Each of them fetches once more."""
    r.xadd(keys.wakes, {"seq": "0"}, maxlen=1, approximate=False)


def newest_wake(r: RedisClient, keys: QueueKeys) -> str | None:
    """The id of the queue's wake stream's newest entry; None when there is
    none, or Redis did not say (a damaged key, an ACL without XREVRANGE)."""
    try:
        return commands.newest_wake_id(r.xrevrange(keys.wakes, count=1))
    except (redis.RedisError, OSError):
        return None


class Notifier:
    """One pub/sub connection per client, shared by all its consumers."""

    def __init__(self, redis_client: RedisClient) -> None:
        self._redis = redis_client
        self._cond = threading.Condition()
        self._generation: dict[str, int] = {}
        self._wanted: set[str] = set()
        self._subscribed: set[str] = set()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._refused = False  # SUBSCRIBE not permitted (ACL): poll instead

    def listens(self, channel: str) -> bool:
        """True when ``channel`` is subscribed (or asked for): reading its
        :meth:`generation` then costs nothing more."""
        return channel in self._wanted

    def generation(self, channel: str) -> int:
        """A counter that changes when ``channel`` announces something.
        Read it before fetching, wait on it after an empty fetch."""
        with self._cond:
            if self._refused:
                return 0
            if channel not in self._wanted:
                self._wanted.add(channel)
                self._generation.setdefault(channel, 0)
                self._start()
                self._cond.wait_for(
                    lambda: channel in self._subscribed or self._closed or self._refused, SUBSCRIBE_TIMEOUT
                )
            return self._generation[channel]

    def wait(self, channel: str, since: int, timeout: float, until: Callable[[], bool] | None = None) -> bool:
        """Waits until ``channel``'s generation differs from ``since`` (or
        ``until()`` is true after a :meth:`poke`); True if either happened."""
        return self.wait_any({channel: since}, timeout, until)

    def wait_any(self, since: dict[str, int], timeout: float, until: Callable[[], bool] | None = None) -> bool:
        """As :meth:`wait`, for the first of several channels (``since`` maps
        each to the generation read before fetching)."""
        if timeout <= 0:
            return False

        def done() -> bool:
            if self._closed or (until is not None and until()):
                return True
            return any(self._generation.get(channel, 0) != gen for channel, gen in since.items())

        with self._cond:
            return self._cond.wait_for(done, timeout)

    def poke(self) -> None:
        """Wakes every waiter so that it re-checks its ``until`` condition."""
        with self._cond:
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(2)

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="rqueue-notify", daemon=True)
            self._thread.start()
        self._cond.notify_all()

    def _run(self) -> None:
        pubsub = None
        # Channels whose subscription broke: what was announced on them until
        # they are subscribed again is missed, so their resubscription counts
        # as an announcement (the waiters fetch once more).
        missed: set[str] = set()
        requested: set[str] = set()
        made_at = -STEADY_SECONDS  # (the first connection's first break gets the short pause)
        broke = False
        while not self._closed:
            try:
                if pubsub is None:
                    pubsub = self._redis.pubsub()  # type: ignore[no-untyped-call]  # unannotated in redis-py
                    requested = set()
                    self._subscribed = set()
                    made_at = SYSTEM_CLOCK.monotonic()
                    if broke:
                        # (a channel first asked for while the connection was down counts too)
                        with self._cond:
                            missed |= self._wanted
                with self._cond:
                    missing = self._wanted - requested
                if missing:
                    pubsub.subscribe(*missing)
                    requested |= missing
                message = pubsub.get_message(timeout=0.1)
                if message is None:
                    continue
                channel = message["channel"].decode()
                with self._cond:
                    if message["type"] == "subscribe":
                        self._subscribed.add(channel)
                        if channel in missed:
                            missed.discard(channel)
                            self._generation[channel] = self._generation.get(channel, 0) + 1
                    elif message["type"] == "message":
                        self._generation[channel] = self._generation.get(channel, 0) + 1
                    self._cond.notify_all()
            except redis.exceptions.NoPermissionError as exc:
                log.warning(
                    "SUBSCRIBE refused (%s): idle consumers poll every %.1f s instead of being woken; "
                    "grant the channels &<prefix>:* (docs/ACL.md)",
                    exc,
                    IDLE_POLL_INTERVAL,
                )
                with self._cond:
                    self._refused = True
                    self._cond.notify_all()
                return
            except Exception as exc:  # the connection broke: wake everyone, then resubscribe
                log.debug("wake-up channel lost (%s); reconnecting", exc)
                if pubsub is not None:
                    with contextlib.suppress(Exception):
                        pubsub.close()
                pubsub = None
                broke = True
                pause = reconnect_pause(made_at, SYSTEM_CLOCK.monotonic())
                with self._cond:
                    for ch in self._generation:
                        self._generation[ch] += 1
                    self._cond.notify_all()
                    # (a poke, which wakes the waiters on this condition, does
                    # not shorten the pause: only a close does)
                    self._cond.wait_for(lambda: self._closed, pause)
        if pubsub is not None:
            with contextlib.suppress(Exception):
                pubsub.close()
