"""Publishing to one queue (or one partition): every message checked and
encoded before anything is sent, then sent in one round trip. A partitioned
queue prepares each partition's share with :func:`prepare` and sends them
with :func:`send`, as a plain queue does.

A batch goes in script calls of MAX_BATCH messages, each stored whole or
not at all. When a later call fails after earlier ones stored their
messages, PartialPublish lists what was stored, so that a retry of the rest
does not store anything twice.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from . import validate as check
from .constants import MAX_BATCH
from .delivery import TTL_HEADER
from .engine import commands
from .engine.durable import publish_durably
from .engine.record import encode_body
from .errors import (
    InvalidInput,
    InvalidSetting,
    NotDurable,
    PartialPublish,
    PayloadTooLarge,
    QueuePartitioned,
    Unroutable,
)
from .names import check_message_id
from .results import PublishResult
from .retention import after_publish
from .settings import Settings
from .statewatch import Mark, StateWatch
from .tracing import with_trace

if TYPE_CHECKING:
    from .protocols import QueueLike

# A queue that is its own alternate would take back, not mandatory, each
# mandatory publish it refused for want of a group: the message would be
# stored where no group reads it, which is what mandatory=True refuses.
SELF_ALTERNATE = (
    "names the queue itself: a mandatory publish finding no group would be stored in it anyway, "
    "which mandatory=True exists to refuse; name another queue, or None"
)


class PreparedPublish(NamedTuple):
    """A checked publish_many call, ready to send: the script calls and what
    a fall-back to the alternate queue needs."""

    calls: list[commands.PublishCall]
    sizes: list[int]  # messages of each call, in order
    settings: Settings
    payloads: Sequence[bytes]
    headers: list[Any]
    ids: list[Any]
    delay: float | None
    durable: bool
    watch: StateWatch  # what this client saw of the queue's state
    mark: Mark  # what it knew when the calls were made
    mandatory: bool = False
    priorities: list[int] | None = None  # one per message (the alternate queue gets them too)
    keys: list[str | None] | None = None  # ordering keys, one per message (likewise)


def per_message(value: Any, count: int, what: str) -> list[Any]:
    """``value`` for each of ``count`` messages: one mapping (or None) for
    all, or a sequence with one per message."""
    if value is None or type(value) is dict or isinstance(value, Mapping):
        return [value] * count
    values = list(value)
    if len(values) != count:
        raise InvalidInput(f"{what} has {len(values)} entries for {count} payloads")
    return values


def with_ttl(headers: list[Any], ttl: float | None) -> list[Any]:
    """Each message's headers with its time to live (``x-rq-ttl``, ms) when
    ``ttl`` is given; a header the caller set is kept."""
    if ttl is None:
        return headers
    ms = str(max(1, round(check.seconds("ttl", ttl, positive=True) * 1000)))
    return [h if h is not None and TTL_HEADER in h else {**(h or {}), TTL_HEADER: ms} for h in headers]


def prepare(
    queue: QueueLike,
    payloads: Sequence[bytes],
    headers: Any,
    ids: Sequence[str | None] | None,
    delay: float | None,
    mandatory: bool,
    durable: bool,
    positions: Sequence[int] | None = None,
    trace: str | None = None,
    priority: int | Sequence[int] | None = None,
    ttl: float | None = None,
    key: str | Sequence[str | None] | None = None,
) -> PreparedPublish | None:
    """Checks every message of a publish_many call and encodes it; None for
    an empty batch. Raises before anything is sent; an error names the
    message by its index, or by ``positions[index]`` (its place in the
    caller's batch) when given. ``trace`` is the ``traceparent`` header
    every message gets (rqueue.tracing.sending). ``priority``: one for all
    messages or one per message, 0 (none, the default) to 9
    (docs/flow-control.md). ``key``: the ordering key, one for all or one
    per message (None: none); never with a priority. ``ttl``: seconds after its publish each message
    expires unhandled (the ``x-rq-ttl`` header, docs/lifecycle.md)."""
    if type(payloads) is not list and (isinstance(payloads, (bytes, str)) or not isinstance(payloads, Sequence)):
        raise InvalidInput("payloads must be a sequence of bytes (for one message use publish())")
    count = len(payloads)
    if count == 0:
        return None
    per_headers = with_ttl(per_message(headers, count, "headers"), ttl)
    if trace is not None:
        per_headers = with_trace(per_headers, trace)
    per_ids = [None] * count if ids is None else list(ids)
    if len(per_ids) != count:
        raise InvalidInput(f"ids has {len(per_ids)} entries for {count} payloads")
    per_priority = check.priorities(priority, count)
    per_key = check.ordering_keys(key, count)
    for i in range(count):
        if per_key[i] is not None and per_priority[i]:
            place = "" if count == 1 else f"message {i if positions is None else positions[i]} of the batch: "
            raise InvalidInput(
                f"{place}priority={per_priority[i]} with key={per_key[i]!r}: a message with an ordering key is "
                "handed out in seq order within its key, not by priority"
            )
    check.flag("durable", durable)
    delay_ms = check.delay_ms(delay)
    settings = queue.settings()
    if mandatory and settings.alternate == queue.name:
        raise InvalidSetting("alternate", settings.alternate, SELF_ALTERNATE)
    watch = queue.client.state_watch(queue.name, queue.keys)
    messages: list[commands.PublishMessage] = []
    single = count == 1 and positions is None
    for i, payload in enumerate(payloads):
        where = i if positions is None else positions[i]
        try:
            hlen, body = encode_body(payload, per_headers[i])
            msg_id = check_message_id(per_ids[i])
        except InvalidInput as exc:
            if single:
                raise
            raise InvalidInput(f"message {where} of the batch: {exc}") from None
        size = len(body) - hlen
        if size > settings.max_payload:
            raise PayloadTooLarge(size, settings.max_payload, None if single else where)
        messages.append((msg_id, commands.timing(delay_ms, hlen, per_priority[i], per_key[i]), body))
    calls = commands.publish_calls(
        queue.keys,
        queue.client.clock.script_now(),
        int(settings.dedup_window * 1000),
        mandatory,
        messages,
        MAX_BATCH,
        watch.candidate,
    )
    sizes = [count] if count <= MAX_BATCH else [min(MAX_BATCH, count - s) for s in range(0, count, MAX_BATCH)]
    return PreparedPublish(
        calls,
        sizes,
        settings,
        payloads,
        per_headers,
        per_ids,
        delay,
        durable,
        watch,
        watch.mark(),
        mandatory,
        per_priority,
        per_key,
    )


def resend(prepared: PreparedPublish, target: object, mandatory: bool = True) -> dict[str, Any]:
    """The publish_many arguments that send ``prepared``'s messages again,
    to ``target``: the partitions of a queue partitioned since, or the
    alternate queue (``mandatory`` False: it takes them as they are). A
    partitioned target takes the ordering keys as its routing keys, so the
    messages of a key stay together in one partition."""
    return {
        "headers": prepared.headers,
        "ids": prepared.ids,
        "delay": prepared.delay,
        "mandatory": prepared.mandatory and mandatory,
        "durable": prepared.durable,
        "priority": prepared.priorities,
        "keys" if hasattr(target, "partitions") else "key": prepared.keys,
    }


def watch_replies(prepared: PreparedPublish, replies: Sequence[Any]) -> None:
    """Checks what publish replies say of the queue's state in Redis (a
    changed incarnation, a seq gone back: statewatch.py); errors are
    skipped. The publish itself stands: its messages are stored."""
    for reply in replies:
        if isinstance(reply, list) and reply:
            seen = commands.publish_seen(reply)
            prepared.watch.saw(prepared.mark, seen.incarnation, new=(seen.first, seen.last))


def stored(prepared: PreparedPublish, replies: Sequence[Any], partition: int | None) -> list[PublishResult]:
    """The results of a publish whose calls all stored their messages (the
    state watch judges the replies first)."""
    watch_replies(prepared, replies)
    return commands.publish_results(replies, partition)


def short_of_durable(prepared: PreparedPublish, exc: NotDurable, partition: int | None) -> NotDurable:
    """``exc`` (every message stored, the wait fell short) with the results
    of its replies instead of the replies."""
    watch_replies(prepared, exc.results)
    exc.results = commands.publish_results(exc.results, partition)
    return exc


def failure(prepared: PreparedPublish, replies: list[Any], partition: int | None) -> Exception:
    """What a publish whose calls gave ``replies`` (per call its reply or its
    error, at least one an error) raises: the first error when no call
    stored anything (so an Unroutable batch still goes to the alternate
    queue), else PartialPublish with the results of the calls that did (the
    caller registers the queue then)."""
    errors = [r for r in replies if isinstance(r, Exception)]
    if len(errors) == len(replies):
        return errors[0]
    watch_replies(prepared, replies)
    results: list[PublishResult | None] = []
    for reply, size in zip(replies, prepared.sizes, strict=True):
        if isinstance(reply, Exception):
            results += [None] * size
        else:
            results += commands.publish_results([reply], partition)
    failed = {i: r for i, r in enumerate(replies) if isinstance(r, Exception)}
    return PartialPublish(results, failed, unit="call")


def durable_outcome(
    prepared: PreparedPublish,
    replies: list[Any],
    short: list[NotDurable],
    failed: Exception | None,
    partition: int | None,
) -> list[Any]:
    """The replies of a durable publish sent one call at a time (each call
    confirmed before the next: publish_durably raises the first error of
    the calls it is given without the others' replies, so one call at a
    time is what tells which messages a failure left stored): ``replies``
    of the calls that stored, ``short`` the NotDurable of those whose wait
    fell short, ``failed`` the error that stopped the rest. Raises the
    failure (PartialPublish when earlier calls stored), or NotDurable for
    the weakest confirmation of any call."""
    if failed is not None:
        # the calls after the one that failed were not sent: not stored
        raise failure(prepared, replies + [failed] * (len(prepared.calls) - len(replies)), partition)
    if short:
        synced = [e.fsynced for e in short]
        raise NotDurable(
            replies,
            min(e.replicas for e in short),
            short[0].required,
            None if None in synced else all(synced),
            "; ".join(dict.fromkeys(e.why for e in short)),
        )
    return replies


def alternate_results(alternate: str, results: list[PublishResult]) -> list[PublishResult]:
    return [PublishResult(r.seq, r.duplicate, alternate) for r in results]


def send(queue: QueueLike, prepared: PreparedPublish) -> list[PublishResult]:
    """Runs the script calls of a prepared publish; returns once Redis
    applied them. When some call failed: its error if no call stored
    anything, else PartialPublish."""
    client = queue.client
    try:
        if prepared.durable:
            replies = _send_durably(queue, prepared)
        elif len(prepared.calls) == 1:
            replies = commands.publish(client.scripts, prepared.calls, queue.name)
        else:
            replies = commands.publish_each(client.scripts, prepared.calls, queue.name)
            if any(isinstance(r, Exception) for r in replies):
                raise failure(prepared, replies, queue.partition)
    except (NotDurable, PartialPublish) as exc:
        client.register(queue.name)
        if isinstance(exc, NotDurable):
            raise short_of_durable(prepared, exc, queue.partition) from None
        raise
    except QueuePartitioned as exc:
        if queue.partition is not None:
            raise
        # The name was partitioned after this process last read it as plain:
        # nothing was stored; the messages go to the partitions.
        client.partitioned_now(queue.root, exc.layout)
        target = client.queue(queue.name)
        if not hasattr(target, "partitions"):  # a dead-letter queue's name: not routed
            raise
        return target.publish_many(prepared.payloads, **resend(prepared, target))
    except Unroutable:
        alternate = prepared.settings.alternate
        if alternate is None:
            raise
        other = client.queue(alternate)
        results = other.publish_many(prepared.payloads, **resend(prepared, other, mandatory=False))
        return alternate_results(alternate, results)
    client.register(queue.name)
    known = prepared.watch.incarnation
    results = stored(prepared, replies, queue.partition)
    if prepared.watch.incarnation != known:
        # The queue was made (again): a delete by another client took it out of the list.
        client.register(queue.name, again=True)
    after_publish(queue, prepared.settings)
    return results


def _send_durably(queue: QueueLike, prepared: PreparedPublish) -> list[Any]:
    """The replies of a durable publish's calls, each call confirmed before
    the next is sent (see :func:`durable_outcome`)."""
    client = queue.client
    if len(prepared.calls) == 1:
        return publish_durably(client, queue.keys.meta, client.scripts.publish, prepared.calls)
    replies: list[Any] = []
    short: list[NotDurable] = []
    failed: Exception | None = None
    for call in prepared.calls:
        try:
            replies += publish_durably(client, queue.keys.meta, client.scripts.publish, [call])
        except NotDurable as exc:
            replies += exc.results
            short.append(exc)
        except Exception as exc:
            failed = exc
            break
    return durable_outcome(prepared, replies, short, failed, queue.partition)
