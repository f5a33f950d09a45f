"""What became of a delivery a handler thread was given."""

from __future__ import annotations

import enum
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Generic, NamedTuple, Protocol, TypeVar

from ..errors import AlreadyAcked, CorruptRecord, InvalidInput, RQueueError, StaleDelivery
from ..events import EventKind
from ..stored_results import encode_failure, encode_value

if TYPE_CHECKING:
    from ..settings import Settings
    from .stats import Tally

log = logging.getLogger("rqueue.worker")

D = TypeVar("D")  # a delivery of either client


class _Tagged(Protocol):
    @property
    def tag(self) -> str: ...


T = TypeVar("T", bound=_Tagged)  # a delivery of either client, named by its tag


class Outcome(enum.Enum):
    """The outcome of one delivery, settled by the dispatcher."""

    ACK = "ack"  # the handler returned: acked with the next fetch
    NACK = "nack"  # the handler raised: offered again under the redelivery policy
    REJECT = "reject"  # the handler raised rqueue.Reject: dead-lettered
    TIMEOUT = "timeout"  # the handler ran past its time limit: nacked with the reason timeout
    SKIPPED = "skipped"  # not run: its lease was lost while it waited, or the handler could not be called
    RETURNED = "return"  # not run: the worker is stopping, and its leave returns the delivery


class Completion(NamedTuple):
    """What an ack keeps besides its message's result (the queue's results
    setting): acked on its own, with it, rather than with the next fetch."""

    value: bytes  # the handler's result, encoded
    event: bool  # record a completed event too


# What comes with an outcome: the error text of a nack, reject or timeout;
# for an ack, "" or what it keeps.
Detail = str | Completion


def ack_detail(value: Any, settings: Settings) -> Detail:
    """What the ack of a handler that returned ``value`` keeps, under the
    queue's settings: "" (the common ack, sent with the next fetch) unless
    results are on. Completed events alone keep the common ack: the
    consumer's ack_and_fetch records them, for every ack of the round in
    one call."""
    if not settings.results:
        return ""
    event = EventKind.COMPLETED.value in settings.events
    try:
        encoded = encode_value(value)
    except InvalidInput as exc:
        # The work is done: acked all the same, the result kept as a failure.
        log.warning("result not kept: %s", exc)
        encoded = encode_failure("bad-result", str(exc))
    return Completion(encoded, event)


class Settles(NamedTuple, Generic[D]):
    """The outcomes a dispatcher settles apart from the acks that ride on
    its fetch, by the call that settles them (for both workers)."""

    keeping: list[tuple[D, Completion]]  # acks that keep a result: one call
    failed: dict[tuple[str, bool], list[D]]  # by (error, timed out): one nack call each
    rejected: list[tuple[D, str]]  # one reject call each


def settles(others: list[tuple[D, Outcome, Detail]]) -> Settles[D]:
    """``others`` (from the ledger's drain) by the call that settles them."""
    out: Settles[D] = Settles([], {}, [])
    for d, outcome, detail in others:
        if isinstance(detail, Completion):
            out.keeping.append((d, detail))
        elif outcome is Outcome.NACK or outcome is Outcome.TIMEOUT:
            out.failed.setdefault((detail, outcome is Outcome.TIMEOUT), []).append(d)
        elif outcome is Outcome.REJECT:
            out.rejected.append((d, detail))
    return out


def acks_done(statuses: Sequence[RQueueError | None], resync: bool, tally: Tally) -> None:
    """Counts and logs what one round's acks did, for both workers. After a
    retry (``resync``), AlreadyAcked usually means the first attempt was
    applied and only its reply was lost."""
    if statuses.count(None) == len(statuses):  # every ack applied: the common round
        tally.count(acked=len(statuses), late_settles=0)
        return
    ok = sum(1 for s in statuses if s is None or (resync and isinstance(s, AlreadyAcked)))
    for err in statuses:
        if isinstance(err, CorruptRecord):  # damage, not a late ack: said loudly
            log.error("ack not applied: %s", err)
        elif err is not None and not isinstance(err, AlreadyAcked):
            log.info("ack not applied: %s", err)
    tally.count(acked=ok, late_settles=len(statuses) - ok)


def reject_applied(exc: RQueueError, retried: bool) -> bool:
    """Whether a reject refused with ``exc`` was applied all the same: sent
    again after its reply was lost (``retried``) and refused as already
    acked, the first attempt dead-lettered it (as nacks_done judges a nack)."""
    return retried and isinstance(exc, AlreadyAcked)


def reject_done(d: _Tagged, reason: str, refused: RQueueError | None, retried: bool, tally: Tally) -> bool:
    """Counts and logs a handler's reject of ``d``, for both workers; True
    when it dead-lettered the message: it was applied, or refused with
    ``refused`` and applied all the same (:func:`reject_applied`). Otherwise
    it is a late settle: the delivery moved on (its lease ran out, the
    member was removed), so the message is offered again and nothing is undone."""
    if refused is not None:
        if not reject_applied(refused, retried):
            log.info("reject of %s not applied: %s", d.tag, refused)
            tally.count(late_settles=1)
            return False
        log.info("reject of %s taken as applied by the call whose reply was lost: %s", d.tag, refused)
    tally.count(rejected=1, dead_lettered=1)
    log.warning("dead-lettered %s: rejected by the handler: %s", d.tag, reason)
    return True


def nacks_done(
    outcome: Outcome, deliveries: Sequence[T], statuses: Sequence[str | RQueueError], retried: bool, tally: Tally
) -> list[T]:
    """Counts and logs what one nack_available call of ``deliveries`` did,
    for both workers; returns those it dead-lettered (max_deliveries). A
    refusal counts as applied when the call was sent again after its reply
    was lost (``retried``) and the refusal (stale: this consumer nacked that
    delivery; already acked: the nack dead-lettered it) is most likely the
    first attempt's doing. Otherwise it is a late settle (the delivery moved
    on: its lease ran out, the member was removed, so the message is offered
    again and nothing is undone), or damage, said loudly."""
    dead: list[T] = []
    for d, status in zip(deliveries, statuses, strict=True):
        if not isinstance(status, RQueueError):
            tally.count(nacked=1, dead_lettered=1 if status == "dead" else 0)
            if status == "dead":
                dead.append(d)
        elif retried and isinstance(status, (StaleDelivery, AlreadyAcked)):
            log.info("%s of %s taken as applied by the call whose reply was lost: %s", outcome.value, d.tag, status)
            tally.count(nacked=1)
        else:
            if isinstance(status, CorruptRecord):
                log.error("%s of %s not applied: %s", outcome.value, d.tag, status)
            else:
                log.info("%s of %s not applied: %s", outcome.value, d.tag, status)
            tally.count(late_settles=1)
    return dead
