"""Awaiting a Redis call for at most some seconds.

``asyncio.wait_for`` on Python 3.11 waits, after its timeout, until the
cancelled call has ended. redis-py's asyncio connection can miss a
cancellation that lands while it sets up a new connection (the HELLO
reply's read goes on until ``socket_timeout``), so a call cut off after one
second could hold its caller for the 30 s socket timeout. :func:`within`
gives a cancelled call CANCEL_GRACE seconds to end and then leaves it to
end on its own, kept referenced here until it does."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, TypeVar

log = logging.getLogger("rqueue.worker")

T = TypeVar("T")

CANCEL_GRACE = 0.1  # seconds a cancelled call gets to end before it is left running

_left_running: set[asyncio.Future[Any]] = set()  # referenced until they end, so the loop does not drop them


async def within(seconds: float, call: Awaitable[T]) -> T:
    """``await call``, for at most ``seconds``: raises TimeoutError then,
    the call cancelled. Cancelling the caller cancels the call. Either way
    the caller waits no more than CANCEL_GRACE for the call to end."""
    task = asyncio.ensure_future(call)
    try:
        await asyncio.wait({task}, timeout=seconds)
    except asyncio.CancelledError:
        await _end(task)
        raise
    if not task.done():
        await _end(task)
        if not task.done() or task.cancelled():
            raise TimeoutError
    return task.result()  # a call that ended in the grace with a reply or an error gives that


async def _end(task: asyncio.Future[Any]) -> None:
    task.cancel()
    await asyncio.wait({task}, timeout=CANCEL_GRACE)
    if task.done():
        return
    log.warning("a Redis call went on %g s after it was cancelled; it is left to end on its own", CANCEL_GRACE)
    _left_running.add(task)
    task.add_done_callback(_forget)


def _forget(task: asyncio.Future[Any]) -> None:
    _left_running.discard(task)
    if not task.cancelled():
        task.exception()  # retrieved: its caller has moved on
