"""The errors after which a worker sends a Redis call again, and the loop
that does so for up to ``reconnect_timeout``."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import redis
from tenacity import RetryCallState, Retrying, retry_if_exception_type, stop_after_delay, wait_exponential_jitter

from ..connection.cluster import CLUSTER_NOT_RUN
from ..errors import ConnectionLost, OutOfMemory
from .stats import Tally

log = logging.getLogger("rqueue.worker")

P = ParamSpec("P")
T = TypeVar("T")

# Errors after which the same call may succeed once Redis is back.
# On a cluster also the errors of a failover (and of a slot map that cannot
# be read meanwhile): the worker's calls are safe to send again, since it
# hands back what a lost fetch claimed and an applied ack is recognised.
# A server over maxmemory refuses a call before it writes anything: the
# worker waits for memory to be freed rather than dying.
# ConnectionLost and OutOfMemory are those errors as the engine raises
# them; the driver's own classes cover calls that do not pass through it.
TRANSIENT: tuple[type[BaseException], ...] = (
    ConnectionLost,
    OutOfMemory,
    redis.ConnectionError,
    redis.TimeoutError,
    redis.BusyLoadingError,
    ConnectionError,
    OSError,
    *CLUSTER_NOT_RUN,
    redis.exceptions.RedisClusterException,
    redis.exceptions.OutOfMemoryError,
)


class Reconnector:
    """Sends a call again after a :data:`TRANSIENT` error, with exponential
    backoff, for up to ``timeout`` seconds from the first attempt; then
    raises the last error. Any other error is raised at once. Each retry
    counts in ``reconnects`` and sets :attr:`resync`."""

    def __init__(self, timeout: float, tally: Tally) -> None:
        self.timeout = timeout
        self._tally = tally
        #: A call was retried, so a fetch may have been applied without its
        #: reply reaching the worker. The dispatcher clears it once it has
        #: handed back what such a fetch claimed.
        self.resync = False

    def __call__(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call(*args, **kwargs)``, retried as the class says."""
        # The first attempt goes straight through: building a tenacity
        # Retrying per call costs more CPU than the Redis call itself.
        started = time.monotonic()
        try:
            return call(*args, **kwargs)
        except TRANSIENT as exc:
            first: BaseException | None = exc

        def attempt() -> T:
            # tenacity sees the failed first attempt, so its waits, counts
            # and log lines are those of a call without the fast path.
            nonlocal first
            if first is not None:
                failed, first = first, None
                raise failed
            return call(*args, **kwargs)

        def before_sleep(state: RetryCallState) -> None:
            self._tally.count(reconnects=1)
            self.resync = True
            failed = state.outcome.exception() if state.outcome is not None else None
            log.warning("Redis call failed (%s); retrying", failed)

        retrying = Retrying(
            retry=retry_if_exception_type(TRANSIENT),
            wait=wait_exponential_jitter(multiplier=0.05, max=2.0, jitter=0.05),
            # the limit counts from the first attempt
            stop=stop_after_delay(max(0.0, self.timeout - (time.monotonic() - started))),
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)
