"""Batch handlers: a handler that takes a list of deliveries and returns
their outcomes, for both workers (this package's and rqueue.aio.Worker).
docs/worker.md, "Batch handlers", describes what a batch keeps of the
per-message semantics."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, overload

from .. import validate as check
from ..constants import WORKER_PREFETCH_PER_THREAD
from ..errors import InvalidInput, Reject
from .outcome import Detail, Outcome, ack_detail
from .processes import InProcess

if TYPE_CHECKING:
    from ..delivery import Delivery
    from ..settings import Settings

log = logging.getLogger("rqueue.worker")

DEFAULT_BATCH_SIZE = 100  # deliveries per call of a batch handler
MAX_BATCH_SIZE = 10_000  # as many as one fetch may ask for


class BatchHandler:
    """A handler that takes a list of up to ``size`` deliveries and returns
    their outcomes. Pass it where a handler goes (``rqueue.Worker(q, group,
    BatchHandler(f))``, or decorate ``f`` with :func:`batch_handler`).

    ``function(deliveries)`` returns, for each delivery, one of
    :attr:`Outcome.ACK <rqueue.worker.Outcome.ACK>` (or ``True``),
    :class:`Acked(value) <rqueue.worker.Acked>` (acked, keeping a result),
    :attr:`Outcome.NACK <rqueue.worker.Outcome.NACK>`,
    :attr:`Outcome.REJECT <rqueue.worker.Outcome.REJECT>`, or an exception
    instance (:class:`rqueue.Reject` dead-letters, any other nacks with its
    text): as a list in the order of ``deliveries``, or as a mapping from
    the delivery (or its tag) to its outcome. A delivery the mapping leaves
    out, or names twice (by itself and its tag), is nacked with an error
    naming it, never acked; a list of the wrong length, a mapping with a
    key that is no delivery of the batch, or anything else, nacks the whole
    batch. An exception raised by
    ``function`` nacks the whole batch (:class:`rqueue.Reject`
    dead-letters it). ``function`` may be a coroutine function."""

    def __init__(self, function: Callable[[list[Delivery]], Any], size: int = DEFAULT_BATCH_SIZE) -> None:
        if not callable(function):
            raise InvalidInput(f"batch handler {function!r} is not callable")
        if isinstance(function, (BatchHandler, InProcess)):
            # InProcess sends its child one delivery per call.
            raise InvalidInput(f"a BatchHandler cannot wrap {type(function).__name__} {function!r}")
        check.whole_number("size", size, 1)
        if size > MAX_BATCH_SIZE:
            raise InvalidInput(f"size {size} is over {MAX_BATCH_SIZE:,}, the most one fetch may bring")
        self.function = function
        self.size = size
        #: Whether ``function`` is a coroutine function.
        self.coroutine = inspect.iscoroutinefunction(function)

    def __call__(self, deliveries: list[Delivery]) -> Any:
        return self.function(deliveries)

    def __repr__(self) -> str:
        return f"BatchHandler({self.function!r}, size={self.size})"


class Acked(NamedTuple):
    """A batch handler's outcome for a delivery that is acked keeping
    ``value`` as its result (with the queue's ``results`` setting on;
    :attr:`Outcome.ACK <rqueue.worker.Outcome.ACK>` keeps ``None``)."""

    value: Any


BatchFunction = Callable[[list["Delivery"]], Any]


@overload
def batch_handler(function: BatchFunction, *, size: int = DEFAULT_BATCH_SIZE) -> BatchHandler: ...
@overload
def batch_handler(
    function: None = None, *, size: int = DEFAULT_BATCH_SIZE
) -> Callable[[BatchFunction], BatchHandler]: ...
def batch_handler(
    function: BatchFunction | None = None, *, size: int = DEFAULT_BATCH_SIZE
) -> BatchHandler | Callable[[BatchFunction], BatchHandler]:
    """Makes ``function`` a :class:`BatchHandler`: ``@batch_handler`` or
    ``@batch_handler(size=500)``."""
    if function is None:
        return lambda f: BatchHandler(f, size)
    return BatchHandler(function, size)


def default_prefetch(handler: Any, concurrency: int) -> int:
    """How many deliveries a worker holds at first unless told: two runs'
    worth per handler thread or task (two batches' worth for a batch
    handler); its window grows from there (rqueue/worker/window.py)."""
    per_run = handler.size if isinstance(handler, BatchHandler) else 1
    return concurrency * per_run * WORKER_PREFETCH_PER_THREAD


def outcomes_of(
    deliveries: list[Delivery], returned: Any, settings: Settings
) -> list[tuple[Delivery, Outcome, Detail]]:
    """The outcome of each delivery from what a batch handler returned; a
    return that does not say one for every delivery fails the batch (or the
    deliveries it left out), never acks them."""
    acked = ack_detail(None, settings)

    def entry_of(d: Delivery, entry: Any) -> tuple[Outcome, Detail]:
        if isinstance(entry, Acked):
            return Outcome.ACK, ack_detail(entry.value, settings)
        return _entry(d, entry, acked)

    if isinstance(returned, Mapping):
        strays = _strays(deliveries, returned)
        if strays:
            error = (
                f"BatchOutcomeError: the batch handler returned outcomes for {len(strays)} keys"
                f" that are no delivery of this batch (such as {strays[0]!r})"
            )
            log.error("%s: the batch is nacked", error)
            return [(d, Outcome.NACK, error) for d in deliveries]
        done: list[tuple[Delivery, Outcome, Detail]] = []
        missing = []
        for d in deliveries:
            entry = returned.get(d.tag, _MISSING)
            by_delivery = returned.get(d, _MISSING)
            if entry is not _MISSING and by_delivery is not _MISSING:
                # Which one the handler meant is unknown: neither is taken.
                error = f"BatchOutcomeError: the batch handler returned two outcomes for {d.tag} (by it and its tag)"
                log.error("%s: nacked", error)
                done.append((d, Outcome.NACK, error))
                continue
            if entry is _MISSING:
                entry = by_delivery
            if entry is _MISSING:
                missing.append(d.tag)
                done.append(
                    (d, Outcome.NACK, f"BatchOutcomeMissing: the batch handler returned no outcome for {d.tag}")
                )
            else:
                done.append((d, *entry_of(d, entry)))
        if missing:
            log.error(
                "batch handler returned no outcome for %d of %d deliveries: nacked", len(missing), len(deliveries)
            )
        return done
    if isinstance(returned, Sequence) and not isinstance(returned, (str, bytes, bytearray)):
        if len(returned) == len(deliveries):
            return [(d, *entry_of(d, entry)) for d, entry in zip(deliveries, returned, strict=True)]
        error = (
            f"BatchOutcomeError: the batch handler returned {len(returned)} outcomes for {len(deliveries)} deliveries"
        )
    else:
        kind = type(returned).__name__
        error = f"BatchOutcomeError: the batch handler returned {kind}, not a list or mapping of outcomes"
    log.error("%s: the batch is nacked", error)
    return [(d, Outcome.NACK, error) for d in deliveries]


def failed_batch(deliveries: list[Delivery], exc: BaseException) -> list[tuple[Delivery, Outcome, Detail]]:
    """Every delivery of a batch whose handler raised ``exc``."""
    if isinstance(exc, Reject):
        return [(d, Outcome.REJECT, exc.reason) for d in deliveries]
    tags = deliveries[0].tag if len(deliveries) == 1 else f"{deliveries[0].tag} and {len(deliveries) - 1} more"
    log.warning("batch handler failed on %s: %s: %s", tags, type(exc).__name__, exc)
    text = f"{type(exc).__name__}: {exc}"
    return [(d, Outcome.NACK, text) for d in deliveries]


_MISSING = object()


def _strays(deliveries: list[Delivery], returned: Mapping[Any, Any]) -> list[Any]:
    """The keys of a batch handler's mapping that name none of its
    deliveries (another batch's, say): a sign the mapping is not the
    batch's, so none of it is taken."""
    tags = {d.tag for d in deliveries}
    ids = {id(d) for d in deliveries}
    return [key for key in returned if not (key in tags if isinstance(key, str) else id(key) in ids)]


def _entry(d: Delivery, entry: Any, acked: Detail) -> tuple[Outcome, Detail]:
    if entry is Outcome.ACK or entry is True:
        return Outcome.ACK, acked
    if entry is Outcome.NACK:
        return Outcome.NACK, "nacked by the batch handler"
    if entry is Outcome.REJECT:
        return Outcome.REJECT, "rejected by the batch handler"
    if isinstance(entry, Reject):
        return Outcome.REJECT, entry.reason
    if isinstance(entry, BaseException):
        return Outcome.NACK, f"{type(entry).__name__}: {entry}"
    error = f"BatchOutcomeError: {entry!r} is not an outcome (for {d.tag})"
    log.error("%s: nacked", error)
    return Outcome.NACK, error
