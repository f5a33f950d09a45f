"""The asyncio worker's Redis calls, sent again after a transient error for
up to ``reconnect_timeout``: rqueue.worker.reconnect.Reconnector's rules
and bookkeeping (one outage, its deadline, its log lines), with awaits. A
call Redis leaves unanswered is cut off by a timeout of the await
(cutoff.within, which does not wait on a call that misses its
cancellation), where the threaded worker needs a watchdog thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, ParamSpec, TypeVar

from ..errors import ConnectionLost
from ..worker.reconnect import FIRST_PAUSE, LONGEST_PAUSE, STOP_PATIENCE, TRANSIENT, Reconnector
from .cutoff import within

log = logging.getLogger("rqueue.worker")

P = ParamSpec("P")
T = TypeVar("T")


class AsyncReconnector(Reconnector):
    """A :class:`~rqueue.worker.reconnect.Reconnector` whose calls are
    awaited (:meth:`call`, :meth:`call_once`). :meth:`cut_off_soon`, on a
    stop at once, ends every call still under way STOP_PATIENCE later."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._attempting: set[asyncio.Task[Any]] = set()  # tasks awaiting an attempt now
        self._cut: set[asyncio.Task[Any]] = set()  # of those, the ones cut off
        self._stopped_now = asyncio.Event()  # set by cut_off_soon: ends a pause between attempts

    def cut_off_soon(self) -> None:
        """Cuts off, STOP_PATIENCE from now, the calls then under way (they
        raise ConnectionLost), and ends a pause before a retry at once.
        Call it on the loop."""
        self._stopped_now.set()

        def cut() -> None:
            for task in list(self._attempting):
                self._cut.add(task)
                task.cancel()

        asyncio.get_running_loop().call_later(STOP_PATIENCE, cut)

    def attempting(self, task: asyncio.Task[Any]) -> bool:
        """Whether ``task`` awaits an attempt of a Redis call now."""
        return task in self._attempting

    def _limit(self, started: float) -> float:
        """Seconds the attempt sent now may take: until the outage (or the
        call, outside one) has lasted ``timeout``; STOP_PATIENCE after a
        stop at once."""
        if self._hard_stop.is_set():
            return STOP_PATIENCE
        outage = self._outage
        begun = min(started, outage) if outage is not None else started
        return max(0.001, begun + self.timeout - time.monotonic())

    async def _attempt(self, started: float, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        limit = self._limit(started)
        task = asyncio.current_task()
        assert task is not None
        self._attempting.add(task)
        try:
            return await within(limit, call(*args, **kwargs))
        except TimeoutError:
            # The reply may still come on the connection, which redis-py
            # drops on the cancelled read: the call may or may not have run.
            log.warning("cut off a Redis call unanswered for %.1f s", limit)
            raise ConnectionLost(f"no answer within {limit:.1f} s", applied=None) from None
        except asyncio.CancelledError:
            if task not in self._cut:
                raise
            self._cut.discard(task)
            task.uncancel()
            log.warning("cut off a Redis call under way %g s after a stop at once", STOP_PATIENCE)
            raise ConnectionLost("cut off: the worker is stopping at once", applied=None) from None
        finally:
            self._attempting.discard(task)

    async def call(self, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``await call(*args, **kwargs)``, retried as the class says."""
        started = time.monotonic()
        try:
            result = await self._attempt(started, call, *args, **kwargs)
        except TRANSIENT as exc:
            error: BaseException = exc
        else:
            if self._outage is not None:
                self._back()
            return result
        pause = FIRST_PAUSE
        while True:
            deadline = self._failed(started)
            if self._hard_stop.is_set():
                log.warning("not retrying %s: the worker is stopping at once (%s)", _name(call), error)
                raise error
            left = deadline - time.monotonic()
            if left <= 0:
                self._give_up(error)
                raise error
            self.resync = True
            self._tally.count(reconnects=1)
            # The pause ends early at a stop at once, as the threaded one's wait does.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped_now.wait(), min(pause * (0.5 + self._randomness.unit()), left))
            pause = min(pause * 2, LONGEST_PAUSE)
            if self._hard_stop.is_set():
                continue  # said and raised above
            try:
                result = await self._attempt(started, call, *args, **kwargs)
            except TRANSIENT as exc:
                error = exc
                continue
            self._back()
            return result

    async def call_once(self, call: Callable[P, Awaitable[T]], *args: P.args, **kwargs: P.kwargs) -> T:
        """``await call(*args, **kwargs)`` sent once (a heartbeat, a
        hand-back that the leave repeats anyway), cut off as the class says."""
        started = time.monotonic()
        try:
            result = await self._attempt(started, call, *args, **kwargs)
        except TRANSIENT:
            self._failed(started)
            raise
        if self._outage is not None:
            self._back()
        return result


def _name(call: Callable[..., object]) -> str:
    return getattr(call, "__name__", type(call).__name__)
