"""The errors after which a worker sends a Redis call again, and the
:class:`Reconnector` that does so for up to ``reconnect_timeout``, cuts off
calls that Redis leaves unanswered that long, and gives up at once on a stop
that must not wait."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, ParamSpec, TypeVar

from tenacity import RetryCallState, Retrying, retry_if_exception_type

from ..connection.open import shut_connections
from ..errors import ConnectionLost, OutOfMemory
from ..randomness import Randomness
from .stats import Tally

if TYPE_CHECKING:
    from ..protocols import QueueContext

log = logging.getLogger("rqueue.worker")

P = ParamSpec("P")
T = TypeVar("T")

# Errors after which the same call may succeed once Redis is back. The engine
# translates every error of the driver (rqueue.engine.commands.translate):
# a broken or timed-out connection, a server still loading its data and a
# cluster's failover are ConnectionLost; a server over maxmemory refuses a
# call before it writes anything (OutOfMemory), and the worker waits for
# memory to be freed rather than dying. The worker's calls are safe to send
# again: it hands back what a lost fetch claimed and an applied ack is
# recognised.
TRANSIENT: tuple[type[BaseException], ...] = (ConnectionLost, OutOfMemory)

FIRST_PAUSE = 0.05  # seconds before the first retry; doubled each time
LONGEST_PAUSE = 2.0  # seconds between retries at most
WATCH_INTERVAL = 0.2  # seconds between the watchdog's looks at the calls under way
STOP_PATIENCE = 0.5  # seconds a call may still take once the worker must stop at once


class Reconnector:
    """Sends a worker's Redis calls, and again after a :data:`TRANSIENT`
    error, with exponential backoff, until ``timeout`` seconds have passed
    since Redis last answered (the outage began when the first call that
    failed in it was sent); then raises the last error. Any other error is
    raised at once. Each retry counts in ``reconnects`` and sets
    :attr:`resync`. A log line says when reconnecting starts, when Redis is
    back and when the worker gives up.

    A call that Redis does not answer (a paused or overloaded server that
    accepts connections, a half-open socket) would hold its thread for the
    socket timeout. While :meth:`watch` runs, a watchdog thread cuts off
    (``cut_off``: shuts down the client's connections) any call under way past
    that limit, and, once ``hard_stop`` is set, any call under way for more
    than :data:`STOP_PATIENCE`: nothing is retried after a hard stop.
    """

    def __init__(
        self,
        timeout: float,
        tally: Tally,
        *,
        hard_stop: threading.Event | None = None,
        cut_off: Callable[[], None] | None = None,
        randomness: Randomness | None = None,
    ) -> None:
        self.timeout = timeout
        self._tally = tally
        self._hard_stop = hard_stop if hard_stop is not None else threading.Event()
        self._cut_off = cut_off
        self._randomness = randomness if randomness is not None else Randomness()
        #: A call was retried, so a fetch may have been applied without its
        #: reply reaching the worker. The dispatcher clears it once it has
        #: handed back what such a fetch claimed.
        self.resync = False
        # thread id -> when its call under way was first sent (monotonic)
        self._under_way: dict[int, float] = {}
        self._lock = threading.Lock()
        self._outage: float | None = None  # when the first call that failed in this outage was sent
        self._gave_up = False  # the give-up of this outage was logged
        self._unwatch = threading.Event()
        self._watchdog: threading.Thread | None = None
        self._cuts = 0  # counts up before and after each cut-off of the connections by the watchdog

    # -- calls ------------------------------------------------------------------

    def __call__(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call(*args, **kwargs)``, retried as the class says."""
        started = time.monotonic()
        under_way = self._under_way
        me = threading.get_ident()
        under_way[me] = started
        cuts = self._cuts
        try:
            # The first attempt goes straight through: a Redis call is most
            # of what a worker's dispatcher spends per batch.
            try:
                result = call(*args, **kwargs)
            except TRANSIENT as exc:
                return self._again(started, exc, call, *args, **kwargs)
            except Exception as exc:
                return self._again(started, self._cut_error(exc, cuts), call, *args, **kwargs)
            self._answered(started, cuts)
            return result
        finally:
            del under_way[me]

    def once(self, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``call(*args, **kwargs)`` sent once (a heartbeat, a hand-back
        that the leave repeats anyway), cut off as the class says."""
        started = time.monotonic()
        under_way = self._under_way
        me = threading.get_ident()
        under_way[me] = started
        cuts = self._cuts
        try:
            try:
                result = call(*args, **kwargs)
            except TRANSIENT:
                self._failed(started)
                raise
            except Exception as exc:
                lost = self._cut_error(exc, cuts)
                self._failed(started)
                raise lost from exc
            self._answered(started, cuts)
            return result
        finally:
            del under_way[me]

    def _again(
        self, started: float, first: BaseException, call: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """The retries of a call whose first attempt, sent at ``started``,
        failed with ``first``: tenacity runs the loop; this class says when
        to stop (the outage's deadline, a stop at once) and how long to wait."""
        pending: BaseException | None = first
        last: BaseException = first  # the last attempt's error

        def attempt() -> T:
            # tenacity sees the failed first attempt, so its counts and
            # waits are those of a call without the fast path; after a stop
            # at once the last error stands instead of another call.
            nonlocal pending
            if pending is not None:
                failed, pending = pending, None
                raise failed
            cuts = self._cuts
            sent = time.monotonic()
            try:
                result = call(*args, **kwargs)
            except TRANSIENT:
                raise
            except Exception as exc:
                raise self._cut_error(exc, cuts) from exc
            self._answered(sent, cuts)
            return result

        def stop(state: RetryCallState) -> bool:
            nonlocal last
            error = last = _error(state) or last
            deadline = self._failed(started)
            if self._hard_stop.is_set():
                log.warning("not retrying %s: the worker is stopping at once (%s)", _name(call), error)
                return True
            if time.monotonic() >= deadline:
                self._give_up(error)
                return True
            return False

        def wait(state: RetryCallState) -> float:
            # Doubling from FIRST_PAUSE up to LONGEST_PAUSE, jittered so that
            # the workers of one Redis do not all come back at once, and
            # never past the outage's deadline.
            pause = min(FIRST_PAUSE * 2.0 ** min(state.attempt_number - 1, 30), LONGEST_PAUSE)
            left = self._failed(started) - time.monotonic()
            return max(0.0, min(pause * (0.5 + self._randomness.unit()), left))

        def before_sleep(state: RetryCallState) -> None:
            self.resync = True
            self._tally.count(reconnects=1)

        def pause(seconds: float) -> None:
            # A stop at once ends the pause, and the next attempt raises.
            nonlocal pending
            if self._hard_stop.wait(seconds):
                pending = last

        retrying = Retrying(
            retry=retry_if_exception_type(TRANSIENT),
            stop=stop,
            wait=wait,
            sleep=pause,
            before_sleep=before_sleep,
            reraise=True,
        )
        return retrying(attempt)

    def _cut_error(self, exc: Exception, cuts: int) -> ConnectionLost:
        """``exc`` of a call during which the watchdog cut off the
        connections, as ConnectionLost; re-raises ``exc`` when there was no
        cut-off. redis-py's connection, shut down from the watchdog's thread,
        can fail in the call's thread with other errors than a connection
        error (an OpenSSL error of a TLS connection, say)."""
        if self._cuts == cuts:
            raise exc
        return ConnectionLost(f"cut off under way ({type(exc).__name__}: {exc})", applied=None)

    # -- the outage ---------------------------------------------------------------

    def _answered(self, started: float, cuts: int) -> None:
        """A call sent at ``started`` returned. When the watchdog cut it off
        meanwhile, one of its steps lost its connection and the call went on
        without it (a step whose failure it handles itself): Redis had left
        it unanswered past the limit, so the outage still counts from then,
        and it ends with the next call Redis answers uncut."""
        if self._cuts != cuts:
            if not self._hard_stop.is_set():  # a stop at once cuts off calls that Redis answers too
                self._failed(started)
        elif self._outage is not None:
            self._back()

    def _failed(self, started: float) -> float:
        """Records a failed call sent at ``started``; returns when the
        outage it belongs to has lasted ``timeout``."""
        with self._lock:
            if self._outage is None:
                self._outage = started
                self._gave_up = False
                log.warning("Redis did not answer; retrying the worker's calls for up to %g s", self.timeout)
            return self._outage + self.timeout

    def _back(self) -> None:
        with self._lock:
            if self._outage is None:
                return
            lasted = time.monotonic() - self._outage
            self._outage = None
        log.warning("Redis answers again after %.1f s", lasted)

    def _give_up(self, error: BaseException) -> None:
        with self._lock:
            said, self._gave_up = self._gave_up, True
            lasted = time.monotonic() - (self._outage if self._outage is not None else time.monotonic())
        if not said:
            log.error(
                "giving up: Redis has not answered for %.1f s (reconnect_timeout %g s): %s", lasted, self.timeout, error
            )

    # -- the watchdog ---------------------------------------------------------------

    def watch(self) -> None:
        """Starts the watchdog (a daemon thread) until :meth:`unwatch`."""
        if self._cut_off is None or self._watchdog is not None:
            return
        self._unwatch.clear()
        self._watchdog = threading.Thread(target=self._watch, name="rqueue-watchdog", daemon=True)
        self._watchdog.start()

    def unwatch(self) -> None:
        self._unwatch.set()
        if self._watchdog is not None:
            self._watchdog.join(1)
            self._watchdog = None

    def _watch(self) -> None:
        assert self._cut_off is not None
        while not self._unwatch.wait(WATCH_INTERVAL):
            now = time.monotonic()
            hard = self._hard_stop.is_set()
            outage = self._outage
            overdue = False
            for started in list(self._under_way.values()):
                limit = min(started, outage) if outage is not None else started
                if now > limit + self.timeout or (hard and now > started + STOP_PATIENCE):
                    overdue = True
                    break
            if overdue:
                log.warning(
                    "cutting off a Redis call under way for more than %s",
                    f"{STOP_PATIENCE:g} s after a stop at once" if hard else f"reconnect_timeout ({self.timeout:g} s)",
                )
                # Counted before and after: a call sent while the cut-off runs
                # sees it as a cut-off of its own.
                self._cuts += 1
                try:
                    self._cut_off()
                except Exception:  # the watchdog must outlive a failure to cut off
                    log.exception("could not shut the connections down")
                self._cuts += 1


def _error(state: RetryCallState) -> BaseException | None:
    return state.outcome.exception() if state.outcome is not None else None


def _name(call: Callable[..., object]) -> str:
    return getattr(call, "__name__", type(call).__name__)


def cut_off(client: QueueContext) -> None:
    """Shuts down every connection of ``client`` (its script calls' and its
    pools'), so that a call blocked on one fails at once; its thread closes
    it, and the next call opens a new one."""
    client.scripts.shut()
    shut_connections(client.redis)
