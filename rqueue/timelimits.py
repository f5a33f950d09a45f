"""Handler time limits: the per-message limit (the ``x-rq-time-limit``
header or the worker's ``time_limit``) and the cancellation a handler checks
to stop cooperatively (:func:`cancellation`). Both workers use it
(docs/worker.md, "Time limits")."""

from __future__ import annotations

import contextvars
import logging
import math
import threading

from .errors import TimeLimitExceeded

__all__ = ["TIME_LIMIT_HEADER", "Cancellation", "cancellation", "time_limit_for"]

log = logging.getLogger("rqueue.worker")

#: The header that sets one message's time limit, seconds (overrides the worker's).
TIME_LIMIT_HEADER = "x-rq-time-limit"


class Cancellation:
    """Whether the handler's time is up. A worker gives each run of a
    handler one (read it with :func:`rqueue.cancellation`); once the time
    limit passes it is set, the message is already nacked with the reason
    ``timeout``, and whatever the handler returns is discarded.

    Attributes:
        limit: the time limit of this run, seconds (None: no limit).
    """

    __slots__ = ("limit", "_event")

    def __init__(self, limit: float | None = None) -> None:
        self.limit = limit
        self._event = threading.Event()

    @property
    def cancelled(self) -> bool:
        """True once the time limit has passed."""
        return self._event.is_set()

    def check(self) -> None:
        """Raises :class:`rqueue.TimeLimitExceeded` once the time limit has passed."""
        if self._event.is_set():
            raise TimeLimitExceeded(self.limit)

    def wait(self, timeout: float | None = None) -> bool:
        """Sleeps up to ``timeout`` seconds, or until cancelled; returns
        :attr:`cancelled`. A handler that waits should wait on this."""
        return self._event.wait(timeout)

    def cancel(self) -> None:
        """Sets the cancellation (the worker calls it at the time limit)."""
        self._event.set()


class _Never(Cancellation):
    """The cancellation of every run without a time limit, and outside a
    handler: runs share it rather than each making an Event, so nothing may
    cancel it."""

    __slots__ = ()

    def cancel(self) -> None:
        """Does nothing: a run without a time limit is never cancelled."""


_NEVER = _Never()
_current: contextvars.ContextVar[Cancellation] = contextvars.ContextVar("rqueue.timelimits", default=_NEVER)


def cancellation() -> Cancellation:
    """The cancellation of the handler run that calls it (a context
    variable: it follows a coroutine handler, and ``asyncio.to_thread``).
    Outside a handler, one that is never cancelled."""
    return _current.get()


def enter(c: Cancellation) -> contextvars.Token[Cancellation]:
    """Makes ``c`` the current cancellation (the worker, around a handler)."""
    return _current.set(c)


def leave(token: contextvars.Token[Cancellation]) -> None:
    _current.reset(token)


def for_limit(limit: float | None) -> Cancellation:
    """The cancellation of a run with time limit ``limit`` (None: no limit)."""
    return _NEVER if limit is None else Cancellation(limit)


def time_limit_for(headers: dict[str, str], default: float | None) -> float | None:
    """The time limit of a message: its ``x-rq-time-limit`` header (seconds,
    positive and finite), else ``default``. A header that does not parse is
    logged and ignored: the message still runs, under the worker's limit."""
    raw = headers.get(TIME_LIMIT_HEADER)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not (value > 0 and math.isfinite(value)):
        log.warning("ignoring %s %r: not a positive number of seconds", TIME_LIMIT_HEADER, raw[:40])
        return default
    return value
