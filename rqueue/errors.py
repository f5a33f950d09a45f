"""The exception tree of rqueue, and the one place where script error codes
become exceptions (:func:`from_script_error`).

Long because every exception rqueue raises stands here with its attributes
and message, beside the one mapping of codes: one file says all that a
caller can meet."""

from __future__ import annotations

import enum
import re
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .results import PublishResult

__all__ = [
    "RQueueError",
    "InvalidInput",
    "InvalidName",
    "InvalidSetting",
    "InvalidURL",
    "PayloadTooLarge",
    "ConnectionFailed",
    "ConnectionLost",
    "NotSettled",
    "EvictionPolicy",
    "OutOfMemory",
    "ServerTooOld",
    "DeliveryError",
    "UnknownDeliveryTag",
    "AlreadyAcked",
    "NotHeld",
    "StaleDelivery",
    "NotMember",
    "StateLost",
    "LossKind",
    "LostDelivery",
    "NotPermitted",
    "ScriptsNotLoaded",
    "Unroutable",
    "NotDurable",
    "PartialPublish",
    "QueueInUse",
    "CorruptRecord",
    "LayoutMismatch",
    "Reject",
    "TimeLimitExceeded",
    "ResultLost",
    "ResultTimeout",
    "from_script_error",
]


MAX_SHOWN = 120  # characters of a rejected value shown in an error message


def show(value: object) -> str:
    """``repr(value)`` for an error message, cut to MAX_SHOWN characters.

    Never fails: a value whose repr raises (or is too large to convert, such
    as an int of thousands of digits) is described by its type.
    """
    try:
        text = repr(value)
    except Exception:
        return f"<{type(value).__name__} that cannot be shown>"
    if len(text) > MAX_SHOWN:
        return f"{text[: MAX_SHOWN - 20]}...({len(text)} characters)"
    return text


class RQueueError(Exception):
    """Root of every error rqueue raises."""


class InvalidInput(RQueueError, ValueError):
    """An argument is wrong; nothing was changed."""


class InvalidName(InvalidInput):
    """A queue, group, consumer or pattern name is not allowed.

    Attributes:
        kind: what the name was for ("queue", "group", ...).
        name: the rejected name.
    """

    def __init__(self, kind: str, name: object, why: str) -> None:
        super().__init__(f"invalid {kind} name {show(name)}: {why}")
        self.kind = kind
        self.name = name


class InvalidSetting(InvalidInput):
    """A setting is unknown or out of range.

    Attributes:
        setting: the setting's name.
        value: the rejected value.
    """

    def __init__(self, setting: str, value: object, why: str) -> None:
        super().__init__(f"invalid setting {setting}={show(value)}: {why}")
        self.setting = setting
        self.value = value


class InvalidURL(InvalidInput):
    """A connection URL rqueue cannot use. The password is never shown.

    Attributes:
        url: the URL with any password masked.
    """

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"invalid URL {url}: {why}")
        self.url = url


class PayloadTooLarge(InvalidInput):
    """A payload is larger than the queue's max_payload.

    Attributes:
        size: the payload's size in bytes.
        limit: the allowed maximum in bytes.
    """

    def __init__(self, size: int, limit: int, index: int | None = None) -> None:
        where = "" if index is None else f" (message {index} of the batch)"
        super().__init__(f"payload of {size} bytes is over max_payload {limit} bytes{where}")
        self.size = size
        self.limit = limit


class ConnectionFailed(RQueueError):
    """The server cannot be reached, or does not speak the Redis protocol.

    Attributes:
        url: the URL with any password masked.
    """

    def __init__(self, url: str, why: str) -> None:
        super().__init__(f"cannot use {url}: {why}")
        self.url = url


class EvictionPolicy(RQueueError):
    """The server's maxmemory-policy may evict keys, and with them stored
    messages, leases and acks, silently: rqueue refuses to use it unless
    the caller accepts that (``connect(..., allow_eviction=True)``).

    Attributes:
        url: the URL with any password masked.
        policy: the server's maxmemory-policy.
    """

    def __init__(self, url: str, policy: str) -> None:
        super().__init__(
            f"Redis at {url} has maxmemory-policy {policy}: at maxmemory it evicts keys, and with them "
            "stored messages, leases and acks, without a trace; set maxmemory-policy noeviction "
            "(CONFIG SET maxmemory-policy noeviction), or connect with allow_eviction=True to accept the risk"
        )
        self.url = url
        self.policy = policy


class NotSettled(RQueueError, TimeoutError):
    """A wait for groups to settle ran out of time."""

    def __init__(self, queue: str, behind: dict[str, tuple[int, int]], timeout: float) -> None:
        #: Per group still behind: (the seq it settled up to, the last seq published before the wait).
        self.behind = behind
        self.timeout = timeout
        parts = ", ".join(f"group {g!r} settled up to seq {f} of {t}" for g, (f, t) in sorted(behind.items()))
        super().__init__(
            f"queue {queue!r} did not settle what was published before the wait within {timeout:g} s: {parts}"
        )


class ConnectionLost(RQueueError):
    """A call to Redis failed on the way: the connection broke or timed
    out, or a cluster was failing over. Unless ``applied`` is False, the call
    may or may not have been applied; calls rqueue makes are safe to repeat
    (a publish with an id, an ack, a fetch whose deliveries a worker hands
    back).

    Attributes:
        applied: False when the error proves the call never ran, else None.
    """

    def __init__(self, why: str, applied: bool | None = None) -> None:
        super().__init__(f"lost the connection to Redis: {why}")
        self.applied = applied


class OutOfMemory(RQueueError):
    """Redis refused a write because it is at maxmemory (noeviction): the
    call changed nothing. Memory comes back as consumers ack and dead
    letters are purged: acks, fetches of stored messages, purges and
    deletes run at maxmemory, publishes wait for it.

    Attributes:
        used: Redis's used_memory in bytes when the refusal was seen (None: not known).
        limit: its maxmemory in bytes (None: not known).
    """

    def __init__(self, why: str, used: int | None = None, limit: int | None = None) -> None:
        figures = f" (used_memory {used:,} bytes, maxmemory {limit:,} bytes)" if used is not None and limit else ""
        super().__init__(f"Redis is out of memory{figures}: {why}")
        self.why = why
        self.used = used
        self.limit = limit


class QueueInUse(RQueueError):
    """A queue was to be deleted while consumers hold deliveries of it;
    nothing was deleted (``delete(force=True)`` deletes it anyway).

    Attributes:
        queue: the queue's name.
        in_flight: deliveries held when it was asked.
    """

    def __init__(self, queue: str, in_flight: int) -> None:
        super().__init__(
            f"queue {queue!r} has {in_flight} deliveries in flight: nothing was deleted "
            "(stop its consumers first, or delete with force=True)"
        )
        self.queue = queue
        self.in_flight = in_flight


class GroupInUse(RQueueError):
    """A group was to be reset or deleted while its consumers hold
    deliveries; nothing was changed (``force=True`` takes them back: their
    settles then fail).

    Attributes:
        group: the group's name.
        in_flight: deliveries held when it was asked.
    """

    def __init__(self, group: str, in_flight: int) -> None:
        super().__init__(
            f"group {group!r} has {in_flight} deliveries in flight: nothing was changed "
            "(stop its consumers first, or pass force=True)"
        )
        self.group = group
        self.in_flight = in_flight


class ServerTooOld(RQueueError):
    """The server's version is older than the scripts need.

    Attributes:
        version: the server's version string.
    """

    def __init__(self, version: str, needed: str) -> None:
        super().__init__(f"server version {version} is too old: rqueue needs {needed} or later")
        self.version = version


class DeliveryError(RQueueError):
    """A settle operation named a delivery that cannot be settled that way.
    Nothing was changed; the consumer can go on working.

    Attributes:
        tag: the delivery tag, "<seq>.<delivery count>.<token>".
    """

    reason = "cannot be settled"

    def __init__(self, tag: str, detail: str = "") -> None:
        super().__init__(f"delivery tag {tag} {self.reason}{': ' + detail if detail else ''}")
        self.tag = tag


class UnknownDeliveryTag(DeliveryError):
    """No such delivery was ever made in this group (RabbitMQ's unknown delivery tag)."""

    reason = "is unknown in this group"


class AlreadyAcked(DeliveryError):
    """The group has already acked or dead-lettered this message."""

    reason = "was already settled (acked or dead-lettered) by this group"


class NotHeld(DeliveryError):
    """The delivery is held by another consumer (of the group, or a
    Delivery object of another consumer was handed to this one)."""

    reason = "is not held by this consumer"


class LostDelivery(DeliveryError):
    """The delivery was made before this consumer saw Redis lose the
    queue's state: it is not settled (nothing is sent), so no settle of it
    can touch the queue's new messages.

    Attributes:
        loss: the StateLost that made it void.
    """

    reason = "is from before Redis lost the queue's state"

    def __init__(self, tag: str, loss: StateLost) -> None:
        super().__init__(tag, str(loss))
        self.loss = loss


class StaleDelivery(DeliveryError):
    """The delivery is no longer held: its lease ran out, a newer delivery
    exists, or this consumer settled it already (a nack)."""

    reason = "is no longer held by this consumer (lease expired, redelivered or already nacked)"


class NotPermitted(RQueueError):
    """Redis refused a command or key to this user (ACL).

    Attributes:
        where: the key prefix or queue the call was for.
    """

    def __init__(self, where: str, detail: str) -> None:
        super().__init__(
            f"Redis refused the call{f' for {where}' if where else ''} ({detail}): the user needs rqueue's ACL rule "
            "(keys ~<prefix>:*, channels &<prefix>:* and the commands listed in docs/ACL.md)"
        )
        self.where = where


class ScriptsNotLoaded(NotPermitted):
    """Redis does not hold one of rqueue's scripts and this user may not
    load it: its ACL grants EVALSHA but not SCRIPT LOAD, the setup where an
    administrator loads the scripts with ``rqueue scripts load``
    (docs/ACL.md). The call did not run; nothing was changed.

    Attributes:
        script: the script's name ("publish", "fetch", ...).
        sha: the SHA-1 of its text, which the call asked Redis for.
    """

    def __init__(self, script: str, sha: str, detail: str) -> None:
        # Not NotPermitted's message: the fix is to load the scripts, not
        # to change the user's rule.
        RQueueError.__init__(
            self,
            f"Redis does not hold rqueue's script {script!r} (sha1 {sha}) and this user may not load it "
            f"({detail}): an administrator must run `rqueue scripts load` (docs/ACL.md); nothing was changed",
        )
        self.where = ""
        self.script = script
        self.sha = sha


class NotMember(RQueueError):
    """The consumer is not a member of its group (it left or was removed).

    Attributes:
        partitions: of a partitioned consumer's heartbeat, the partitions
            whose group removed the member (empty: the consumer's one group).
    """

    partitions: tuple[int, ...] = ()


# The dead-letter reason of a message handed out again after Redis lost
# acks, that its group had settled (acked, or dead-lettered) before: set
# aside unrun (rqueue.statewatch).
SETTLED_BEFORE_LOSS = "settled-before-loss"


class LossKind(enum.Enum):
    """How a client saw that Redis lost a queue's state."""

    INCARNATION = "incarnation-changed"  # the queue's incarnation id is not the one seen before
    SEQ_WENT_BACK = "seq-went-back"  # a seq at or below one seen before, in the same incarnation
    ACKS_WENT_BACK = "acks-went-back"  # a group's ack floor below one seen before, or its generation went back
    ACKS_LOST = "acks-lost"  # a message handed out again that this consumer had seen acked above the floor


class StateLost(RQueueError):
    """Redis lost state of a queue that this client had seen (a restart
    without its data, FLUSHALL, a failover to a replica that was behind, a
    rolled-back AOF, or the queue deleted and made again by another
    client). Logged at ERROR and recorded as a "state-lost" event when a
    client notices it; the consumer's and queue's ``last_state_loss``.

    Attributes:
        queue: the queue's name.
        kind: a LossKind.
        incarnation: the queue's incarnation id before the loss.
        new_incarnation: its incarnation id now.
        gone_above: every seq of ``incarnation`` above this is gone from
            Redis (0: every one); for ACKS_WENT_BACK, the group's ack floor
            now: acks above it may be gone, the messages are kept.
        last_seq_seen: the highest seq of ``incarnation`` this client saw.
        confirmed_gone: publishes this client confirmed (of its last
            100,000 publish calls) whose messages are gone: those no group had handled
            yet are lost. durable=True is what protects them.
        deliveries_dropped: deliveries this consumer held from before the
            loss, dropped: never run, never settled.
        noticed_by: who noticed ("publisher", or "consumer <name> of group <group>").
        floor_seen: for ACKS_WENT_BACK, the group's ack floor this consumer
            saw before: a delivery of a seq at or below it (a message the
            group settled before the loss: acked, or dead-lettered) is
            dead-lettered unrun, reason "settled-before-loss".
        group: the group, for ACKS_WENT_BACK ("" otherwise).
        generations: for ACKS_WENT_BACK, the group's generation this
            consumer saw before, and the one now (lower when Redis lost a
            reset of the group, or its making).
        seqs: for ACKS_LOST, the seqs this consumer had seen acked above
            the group's ack floor (``gone_above``, as ``floor_seen``) and a
            fetch handed out again: dead-lettered unrun, reason
            "settled-before-loss". The loss may have taken other such acks,
            of seqs not handed out yet, or handed to other consumers.
    """

    def __init__(
        self,
        queue: str,
        kind: LossKind,
        incarnation: str,
        new_incarnation: str,
        gone_above: int,
        last_seq_seen: int,
        confirmed_gone: int,
        deliveries_dropped: int,
        noticed_by: str,
        floor_seen: int = 0,
        group: str = "",
        generations: tuple[int, int] = (0, 0),
        seqs: tuple[int, ...] = (),
    ) -> None:
        if kind is LossKind.INCARNATION:
            what = f"its incarnation changed from {incarnation} to {new_incarnation}: every message of it is gone"
        elif kind is LossKind.ACKS_WENT_BACK:
            seen, now = generations
            back = (
                f"went back from {floor_seen} to {gone_above}"
                if seen == now
                else f"went back from generation {seen} (ack floor {floor_seen}) to generation {now}, a reset or "
                f"its making undone (ack floor {gone_above})"
            )
            what = (
                f"group {group!r} {back} (incarnation {incarnation}): acks of messages above seq {gone_above} may "
                f"be gone; the messages are kept, those up to seq {floor_seen} are dead-lettered unrun as they "
                f"come back (reason {SETTLED_BEFORE_LOSS}), and one acked out of order above it may run again"
            )
        elif kind is LossKind.ACKS_LOST:
            shown = ", ".join(map(str, seqs[:10])) + (", ..." if len(seqs) > 10 else "")
            what = (
                f"group {group!r} handed out again {len(seqs)} messages whose acks this consumer had seen confirmed "
                f"above its ack floor {gone_above} (seqs {shown}; incarnation {incarnation}): Redis lost those acks; "
                f"these are dead-lettered unrun (reason {SETTLED_BEFORE_LOSS}), and others acked so may run again"
            )
        else:
            what = (
                f"its seqs went back from {last_seq_seen} to {gone_above} (incarnation {incarnation}): "
                f"messages above seq {gone_above} are gone"
            )
        super().__init__(
            f"Redis lost state of queue {queue!r} ({noticed_by}): {what}; {confirmed_gone} publishes this client "
            f"confirmed are gone, {deliveries_dropped} deliveries held were dropped, not run "
            "(a restart without data, FLUSHALL, a failover to a lagging replica, or the queue deleted)"
        )
        self.queue = queue
        self.kind = kind
        self.incarnation = incarnation
        self.new_incarnation = new_incarnation
        self.gone_above = gone_above
        self.last_seq_seen = last_seq_seen
        self.confirmed_gone = confirmed_gone
        self.deliveries_dropped = deliveries_dropped
        self.noticed_by = noticed_by
        self.floor_seen = floor_seen
        self.group = group
        self.generations = generations
        self.seqs = seqs


class QueuePartitioned(RQueueError):
    """A publish, a join or a group's making, reset or deletion reached the
    plain queue of a name that was made a partitioned queue (this process
    took it for a plain queue, read less than the settings' cache time
    before): nothing was stored or changed.
    ``client.queue(name)`` returns the partitioned queue now; a plain
    :meth:`rqueue.Queue.publish` sends its messages there by itself.

    Attributes:
        queue: the queue's name.
        layout: the stored layout ("<n>" or "<n>:<salts>").
    """

    def __init__(self, queue: str, layout: str) -> None:
        super().__init__(
            f"queue {queue!r} is partitioned ({layout.split(':')[0]} partitions): use client.queue({queue!r}) again"
        )
        self.queue = queue
        self.layout = layout

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.queue, self.layout))


class Unroutable(RQueueError):
    """A mandatory publish found no group to deliver to; nothing was stored.

    Attributes:
        queue: the queue's name.
    """

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} has no group: mandatory publish refused, nothing stored")
        self.queue = queue


class QueuePaused(RQueueError):
    """A publish to a queue paused with mode "refuse"; nothing was stored.

    Attributes:
        queue: the queue's name.
    """

    def __init__(self, queue: str) -> None:
        super().__init__(f"queue {queue!r} is paused: publish refused, nothing stored (resume it to publish)")
        self.queue = queue


class LayoutMismatch(RQueueError):
    """A call reached a queue whose log has another layout than the one this
    client uses (rqueue.engine.keys.LogLayout): nothing was stored or changed.
    Every client of a prefix must use the same layout.

    Attributes:
        queue: the queue's name.
    """

    def __init__(self, queue: str, detail: str) -> None:
        super().__init__(f"queue {queue!r}: {detail}; every client of a prefix must use the same layout")
        self.queue = queue


class CorruptRecord(RQueueError):
    """Data found in Redis does not have the shape rqueue writes.

    Attributes:
        key: the Redis key (and field) where it was found.
    """

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(
            f"corrupted record at {key}: {detail} (`rqueue doctor QUEUE` names every damaged key; "
            "--repair fixes what is safe)"
        )
        self.key = key
        self.detail = detail


class Reject(RQueueError):
    """Raised by a handler to dead-letter its message at once, without retries.

    Attributes:
        reason: text stored with the dead letter.
    """

    def __init__(self, reason: str = "rejected") -> None:
        super().__init__(reason)
        self.reason = reason


class TimeLimitExceeded(RQueueError):
    """A handler ran past its time limit (``Worker(time_limit=...)`` or the
    message's ``x-rq-time-limit`` header). Raised inside the handler by
    :meth:`rqueue.Cancellation.check`, or delivered into its thread by a
    worker with ``interrupt=True``; the worker has nacked the message with
    the reason ``timeout`` by then, whatever the handler does next.

    Attributes:
        limit: the time limit, seconds (None when raised into the
            handler's thread, which is told no more).
    """

    def __init__(self, limit: float | None = None) -> None:
        of = "" if limit is None else f" of {limit:g} s"
        super().__init__(f"timeout: the handler ran past its time limit{of}")
        self.limit = limit


class ResultTimeout(RQueueError, TimeoutError):
    """``q.result(seq, timeout=...)`` found no stored result in time: the
    message is not settled yet, its result expired, or results are off for
    its queue (the ``results`` setting)."""

    def __init__(self, queue: str, seq: int, timeout: float, group: str | None = None) -> None:
        of_group = "" if group is None else f" for group {group!r}"
        super().__init__(f"no result for seq {seq} of queue {queue!r}{of_group} within {timeout:g} s")
        self.queue = queue
        self.seq = seq
        self.timeout = timeout
        self.group = group


class ResultLost(RQueueError):
    """``q.result(publish_result)`` for a message that went with a state
    loss of its queue (Redis restarted without its data, FLUSHALL, the queue
    deleted): the queue's incarnation is not the one that took the message,
    its seq may name a later message now, and no result of it will come.

    Attributes:
        queue: the queue's name.
        seq: the message's seq.
        incarnation: the incarnation that took the message.
        new_incarnation: the queue's incarnation now ("" when it has none).
    """

    def __init__(self, queue: str, seq: int, incarnation: str, new_incarnation: str) -> None:
        super().__init__(
            f"message {seq} of queue {queue!r} was published to incarnation {incarnation}, but the queue is "
            f"{new_incarnation or 'gone'} now: Redis lost its state, and no result of the message will come"
        )
        self.queue = queue
        self.seq = seq
        self.incarnation = incarnation
        self.new_incarnation = new_incarnation


# Errors raised with error() arrive wrapped ("ERR user_script:1: RQ_X ...");
# replies made with redis.error_reply() arrive as they are.
_CODE = re.compile(r"\b(RQ_[A-Z_]+)\b(.*)", re.DOTALL)

_LUA_WHERE = re.compile(r" script: [0-9a-f]{40}|\nstack traceback:")

_DELIVERY_CODES: dict[str, type[DeliveryError]] = {
    "RQ_UNKNOWN_TAG": UnknownDeliveryTag,
    "RQ_ACKED": AlreadyAcked,
    "RQ_NOT_HELD": NotHeld,
    "RQ_STALE": StaleDelivery,
}


def delivery_error(code: str, tag: str) -> RQueueError | None:
    """The exception for a per-tag status code returned by a script, or None for "ok"."""
    cls = _DELIVERY_CODES.get(code)
    if cls is None:
        if code == "ok":
            return None
        if code == "RQ_CORRUPT":
            return CorruptRecord(tag, "the delivery state of this message is missing or does not parse")
        return DeliveryError(tag, f"unexpected status {code}")
    return cls(tag)


class NotDurable(RQueueError):
    """A durable publish was stored and applied by the primary, but the
    durability it asked for was not confirmed in time. Publishing again with
    the same message ids is safe (they de-duplicate).

    Attributes:
        results: the PublishResult of each message (they are stored).
        replicas: how many replicas acknowledged the write (WAIT).
        required: how many were asked for (durable_replicas).
        fsynced: whether the primary fsynced it (WAITAOF), or None when the
            server could not be asked (no WAITAOF, or no append-only file).
        why: what fell short.
    """

    def __init__(self, results: list[Any], replicas: int, required: int, fsynced: bool | None, why: str) -> None:
        super().__init__(
            f"publish not confirmed durable: {why} (the messages are stored; "
            "publishing them again with the same ids is safe)"
        )
        self.results = results
        self.replicas = replicas
        self.required = required
        self.fsynced = fsynced
        self.why = why


class PartialPublish(RQueueError):
    """A publish_many went in several steps, not one atomic step, and some
    of them failed after others stored their messages: the partitions of a
    partitioned queue (each its own slot), or the script calls of a batch
    over MAX_BATCH messages (each all or nothing). Every partition was
    tried. Publishing the messages whose result is None again with the same
    ids is safe.

    Attributes:
        results: per message of the batch, in its order, the PublishResult
            of a stored message, or None for one not stored (or unknown when
            the reply was lost).
        errors: partition (or script call, counted from 0) -> the error it gave.
    """

    def __init__(
        self, results: list[PublishResult | None], errors: dict[int, Exception], unit: str = "partition"
    ) -> None:
        failed = ", ".join(f"{unit} {p}: {type(e).__name__}: {e}" for p, e in sorted(errors.items()))
        stored = sum(1 for r in results if r is not None)
        super().__init__(f"publish_many stored {stored} of {len(results)} messages; {failed}")
        self.results = results
        self.errors = errors


def from_script_error(exc: Exception, *, queue: str = "", where: str = "") -> Exception:
    """Maps an error reply of an rqueue script to the matching exception.

    Every script error starts with a stable code (``RQ_...``); anything else
    is returned unchanged so that it is re-raised as it came.
    """
    found = _CODE.search(str(exc))
    if found is None:
        return exc
    code, detail = found.group(1), found.group(2).strip()
    if code in _DELIVERY_CODES:
        return _DELIVERY_CODES[code](detail)
    if code == "RQ_NOT_MEMBER":
        return NotMember(detail)
    if code == "RQ_UNROUTABLE":
        return Unroutable(queue)
    if code == "RQ_PARTITIONED":
        return QueuePartitioned(queue, detail)
    if code == "RQ_DELETING":
        return InvalidInput(
            f"queue {queue or where!r} is being deleted ({detail} field deleting): no group joins it until the "
            "delete ends; a delete that was cut off ends when it is run again"
        )
    if code == "RQ_LAYOUT":
        return LayoutMismatch(queue or where, _LUA_WHERE.split(detail, 1)[0].strip())
    if code == "RQ_PAUSED":
        return QueuePaused(queue)
    if code == "RQ_CORRUPT":
        # error() in Lua appends where it stood (" script: <sha>, on ...",
        # or a traceback under memory://): the key and what is wrong come first.
        detail = _LUA_WHERE.split(detail, 1)[0].strip()
        # A script names the damaged key first (one of a queue's keys holds
        # its hash tag); a tag's error names the tag.
        first, _, rest = detail.partition(" ")
        if "{" in first:
            return CorruptRecord(first, rest)
        return CorruptRecord(where, detail)
    if code in ("RQ_POSITION", "RQ_NO_GROUP", "RQ_GROUP_EXISTS"):
        return InvalidInput(_LUA_WHERE.split(detail, 1)[0].strip())
    if code == "RQ_GROUP_BUSY":
        held, _, rest = detail.partition(" ")
        group = rest.split(" ")[1] if rest.startswith("group ") else rest
        return GroupInUse(group, int(held) if held.isdigit() else 0)
    if code == "RQ_BAD_ARGUMENT":
        # Only a client that builds a script's arguments wrongly (another
        # version's layout) meets it; the script headers say what a call
        # may have done before it (nack, reject, leave, replay: nothing).
        return InvalidInput(f"a script refused its arguments: {detail}")
    return exc
