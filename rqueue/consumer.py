"""Consumers of a group, and the deliveries they hold."""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, Union

import redis

from . import constants as C
from .engine.keys import ACK_KEYS
from .engine.record import COMPACT_HEAD, COMPACT_TAG, decode_record
from .errors import (
    CorruptRecord,
    InvalidInput,
    NotMember,
    RQueueError,
    delivery_error,
    from_script_error,
)
from .ids import consumer_name, delivery_tag, parse_delivery_tag
from .names import check_name
from .settings import Settings, positive_seconds, validate

if TYPE_CHECKING:
    from .queue import Queue

log = logging.getLogger("rqueue")


class Delivery:
    """One hand-over of one message to one consumer.

    Attributes:
        seq: the message's sequence number in its queue.
        data: the payload (bytes).
        headers: str to str.
        delivery_count: 1 on the first delivery, persisted across crashes.
        published_ms: server time of the publish, ms since the epoch.
        deadline_ms: server time at which the lease runs out.
    """

    __slots__ = ("seq", "data", "headers", "delivery_count", "published_ms", "deadline_ms", "consumer", "tag")

    def __init__(
        self,
        consumer: Consumer,
        seq: int,
        delivery_count: int,
        data: bytes,
        headers: dict[str, str],
        published_ms: int,
        deadline_ms: int,
    ) -> None:
        self.consumer = consumer
        self.seq = seq
        self.delivery_count = delivery_count
        self.data = data
        self.headers = headers
        self.published_ms = published_ms
        self.deadline_ms = deadline_ms
        #: Identifies exactly this hand-over: ``<seq>.<delivery_count>``.
        self.tag = delivery_tag(seq, delivery_count)

    @property
    def redelivered(self) -> bool:
        return self.delivery_count > 1

    def ack(self, multiple: bool = False) -> None:
        """Settles the message for the group (with ``multiple``, also every
        earlier delivery this consumer holds)."""
        self.consumer.ack(self, multiple=multiple)

    def nack(self, delay: float | None = None, error: str = "") -> str:
        """Offers the message again (see :meth:`Consumer.nack`)."""
        return self.consumer.nack(self, delay=delay, error=error)

    nak = nack

    def reject(self, requeue: bool = False, reason: str = "") -> None:
        """Dead-letters the message now, or with ``requeue`` offers it again at once."""
        self.consumer.reject(self, requeue=requeue, reason=reason)

    def term(self, reason: str = "") -> None:
        """Dead-letters the message now, recording ``reason``."""
        self.consumer.term(self, reason)

    def in_progress(self) -> int:
        """Extends the lease by ack_wait; returns the new deadline (server ms)."""
        return self.consumer.in_progress(self)

    def __repr__(self) -> str:
        return f"Delivery(tag={self.tag!r}, data={self.data[:40]!r})"


DeliveryRef = Union[Delivery, str]


class HeartbeatResult(NamedTuple):
    """What one heartbeat did."""

    statuses: list[RQueueError | None]  # per delivery: None = lease extended
    removed: int  # silent members removed
    returned: int  # their deliveries offered again
    dead_lettered: int  # their deliveries that had reached max_deliveries
    handed_back: int  # (sync) deliveries held in Redis that the caller did not know


class Consumer:
    """A named member of a group. Obtain one with :meth:`rqueue.Queue.consumer`.

    Joins the group when created; :meth:`close` leaves it and returns every
    unacked delivery at once. Safe to share between threads.
    """

    def __init__(
        self, queue: Queue, group: str, name: str | None, overrides: dict[str, Any], liveness: float | None = None
    ) -> None:
        self.queue = queue
        self.client = queue.client
        self.group = check_name("group", group)
        self.name = check_name("consumer", name) if name is not None else consumer_name(self.client.randomness)
        self.overrides = validate(overrides)
        self.liveness = positive_seconds("liveness", liveness) if liveness is not None else None
        self._keys_for: tuple[Settings | None, list[str], list[str]] = (None, [], [])
        self._args_for: tuple[Settings | None, Any] = (None, None)
        self._held: dict[str, Delivery] = {}
        self._closed = False
        self._settings_seen: Settings | None = None
        self._settings: Settings = Settings()
        self._join()

    def __repr__(self) -> str:
        return f"Consumer(queue={self.queue.name!r}, group={self.group!r}, name={self.name!r})"

    # -- plumbing -----------------------------------------------------------

    def settings(self) -> Settings:
        """The settings this consumer works with: stored patterns, then the
        overrides given when it was created."""
        resolved = self.queue.settings()
        if resolved is not self._settings_seen:
            self._settings_seen = resolved
            self._settings = resolved.merged(self.overrides) if self.overrides else resolved
        return self._settings

    def _keys(self, settings: Settings, ack: bool = False) -> list[str]:
        """KEYS of the group scripts (with ``ack``, the first ACK_KEYS of
        them, all that ack.lua can touch); they follow the settings because
        the dead_letter setting may name another queue."""
        seen, keys, ack_keys = self._keys_for
        if seen is not settings:
            keys = self.queue.group_keys(self.group, settings)
            ack_keys = keys[:ACK_KEYS]
            self._keys_for = (settings, keys, ack_keys)
        return ack_keys if ack else keys

    def _call(self, script: Any, *extra: Any) -> Any:
        if self._closed:
            raise RQueueError(f"{self!r} is closed")
        settings = self.settings()
        seen, fixed = self._args_for
        if seen is not settings:  # the settings' part of ARGV, once per settings object
            fixed = self.queue._settings_argv(settings)
            self._args_for = (settings, fixed)
        return self._run(
            script, self._keys(settings), self.queue._group_argv(self.group, self.name, settings, extra, fixed)
        )

    def _ack_call(self, strict: str, tags: list[tuple[str, int, int]]) -> Any:
        """ack.lua, sent the group and consumer names alone of the group
        arguments: it reads no clock and no setting (its header)."""
        if self._closed:
            raise RQueueError(f"{self!r} is closed")
        return self._run(
            self.client.scripts.ack,
            self._keys(self.settings(), ack=True),
            [self.group, self.name, strict, *_flat(tags)],
        )

    def _run(self, script: Any, keys: list[str], args: list[Any]) -> Any:
        try:
            return script(keys=keys, args=args)
        except redis.ResponseError as exc:
            raise from_script_error(exc, queue=self.queue.name, where=self.queue.keys.base) from None

    def _join(self) -> None:
        liveness = self.liveness if self.liveness is not None else self.settings().ack_wait
        self._call(self.client.scripts.join, int(liveness * 1000))
        self.client._register(self.queue.name)

    # -- fetching -----------------------------------------------------------

    def fetch(self, n: int = 1, timeout: float = 0.0) -> list[Delivery]:
        """Claims up to ``n`` deliveries; waits up to ``timeout`` seconds for
        the first one when none is ready. Due redeliveries come before new
        messages, lowest seq first. Respects prefetch and max_inflight."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= C.MAX_FETCH:
            raise InvalidInput(f"n must be a whole number from 1 to {C.MAX_FETCH}, not {n!r}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, (int, float))
            or not math.isfinite(timeout)
            or timeout < 0
        ):
            raise InvalidInput(f"timeout must be a number of seconds >= 0, not {timeout!r}")
        clock = self.client.clock
        channel = self.queue.keys.wake_channel
        deadline = clock.monotonic() + timeout
        while True:
            generation = self.client.notifier.generation(channel) if timeout > 0 else 0
            reply = self._fetch_once(n)
            deliveries = self._parse(reply)
            remaining = deadline - clock.monotonic()
            if deliveries or remaining <= 0:
                return deliveries
            wait = min(remaining, C.IDLE_POLL_INTERVAL)
            if reply[1] not in (b"", None):
                wait = min(wait, max(0.001, (int(reply[1]) - int(reply[0])) / 1000))
            self.client.notifier.wait(channel, generation, wait)

    def _fetch_once(self, n: int) -> Any:
        try:
            return self._call(self.client.scripts.fetch, n)
        except NotMember:
            # Removed as dead (e.g. after a long pause): what it held was
            # already offered again, so joining afresh loses nothing.
            log.warning("%r was not a member of its group any more; joining again", self)
            self._join()
            return self._call(self.client.scripts.fetch, n)

    def _parse(self, reply: list[Any]) -> list[Delivery]:
        # Per message on the hot path: no helper calls for a compact record
        # (no headers, no delay: the common case); anything else goes to
        # decode_record.
        now = int(reply[0])
        deadline = now + int(round(self.settings().ack_wait * 1000))
        held = self._held
        out = []
        new = Delivery.__new__
        from_bytes = int.from_bytes
        for i in range(2, len(reply), 3):
            seq, count, record = int(reply[i]), int(reply[i + 1]), reply[i + 2]
            if record[:1] == COMPACT_TAG and len(record) >= COMPACT_HEAD:
                published, headers, data = from_bytes(record[1:COMPACT_HEAD], "big"), {}, record[COMPACT_HEAD:]
            else:
                try:
                    published, headers, data = decode_record(record, f"{self.queue.keys.msgs}[{seq}]")
                except CorruptRecord as exc:
                    # Moved aside byte for byte; the rest of the batch goes on.
                    log.error("%s; moving it to the dead-letter queue", exc)
                    self._dead_letter(delivery_tag(seq, count), "corrupted-record", str(exc))
                    continue
            d = new(Delivery)
            d.consumer = self
            d.seq = seq
            d.delivery_count = count
            d.data = data
            d.headers = headers
            d.published_ms = published
            d.deadline_ms = deadline
            d.tag = tag = delivery_tag(seq, count)
            held[tag] = d
            out.append(d)
        return out

    # -- settling -----------------------------------------------------------

    def _tag_of(self, ref: DeliveryRef) -> tuple[str, int, int]:
        if type(ref) is Delivery:
            return ref.tag, ref.seq, ref.delivery_count
        tag = ref.tag if isinstance(ref, Delivery) else ref
        if not isinstance(tag, str):
            raise InvalidInput(f"expected a Delivery or a delivery tag, not {type(ref).__name__}")
        try:
            seq, count = parse_delivery_tag(tag)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        return tag, seq, count

    def ack(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool = False) -> None:
        """Acks one delivery or a list of them in one round trip.

        All or nothing: if any tag is unknown, already acked or held by
        another consumer, a DeliveryError naming that tag is raised and no
        tag is acked. With ``multiple``, every delivery this consumer handed
        out before the given one (and still holds) is acked too.
        """
        refs = _refs(deliveries)
        tags = [self._tag_of(r) for r in refs]
        if multiple:
            if len(tags) != 1:
                raise InvalidInput("multiple=True takes exactly one delivery: the last one to ack")
            # Earlier deliveries that moved on meanwhile are skipped; only
            # the named one must be ackable.
            named = tags[0]
            earlier = [t[0] for t in self._held_up_to(named) if t != named]
            statuses = self.ack_available(earlier + [named[0]])
            if statuses[-1] is not None:
                raise statuses[-1]
            return
        if not tags:
            return
        self._ack_call("1", tags)
        held = self._held
        for tag, _, _ in tags:
            held.pop(tag, None)

    def ack_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]:
        """Acks every delivery that can be acked, in one round trip; returns,
        per delivery, None or the DeliveryError that kept it from being acked.
        For runtimes that must not fail a whole batch for one stale tag."""
        tags = [self._tag_of(r) for r in _refs(deliveries)]
        if not tags:
            return []
        statuses = self._ack_call("0", tags)
        out = []
        for (tag, _, _), status in zip(tags, statuses):
            self._held.pop(tag, None)
            out.append(delivery_error(status.decode(), tag))
        return out

    def ack_and_fetch(
        self, acks: Iterable[DeliveryRef], n: int
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """Acks what can be acked (as :meth:`ack_available`) and claims up to
        ``n`` deliveries, both in one script call (one round trip). Returns
        the ack statuses, the deliveries, and (when none came) the seconds
        until a waiting message falls due, or None."""
        tags = [self._tag_of(r) for r in acks]
        if n <= 0:
            return self.ack_available([t[0] for t in tags]), [], None
        try:
            reply = self._call(self.client.scripts.fetch, n, *_flat(tags))
        except NotMember:
            # Nothing was changed: join afresh (what this consumer held was
            # offered again; its late acks are still accepted) and do both.
            log.warning("%r was not a member of its group any more; joining again", self)
            self._join()
            statuses = self.ack_available([t[0] for t in tags]) if tags else []
            return statuses, self._parse(self._call(self.client.scripts.fetch, n)), None
        statuses: list[RQueueError | None] = []
        held = self._held
        for i, (tag, _, _) in enumerate(tags):
            held.pop(tag, None)
            status = reply[2 + i]
            statuses.append(None if status == b"ok" else delivery_error(status.decode(), tag))
        if tags:
            reply = reply[:2] + reply[2 + len(tags) :]
        deliveries = self._parse(reply)
        due_in = None
        if not deliveries and reply[1] not in (b"", None):
            due_in = max(0.0, (int(reply[1]) - int(reply[0])) / 1000)
        return statuses, deliveries, due_in

    def heartbeat(self, running: Iterable[DeliveryRef], timeout: float, sync: bool = False) -> HeartbeatResult:
        """Records that this consumer is alive for ``timeout`` seconds more,
        extends the leases of ``running`` deliveries, and removes members
        whose own liveness ran out (what they held is offered again at
        once). With ``sync``, ``running`` must list every delivery the caller
        knows of: any other delivery this consumer holds in Redis (a fetch
        whose reply was lost) is handed back without counting as an attempt.
        Raises NotMember when this consumer was itself removed."""
        tags = [self._tag_of(r) for r in _refs(running)]
        args: list[Any] = [int(positive_seconds("timeout", timeout) * 1000), "1" if sync else "0"]
        for _, seq, count in tags:
            args += [seq, count]
        reply = self._call(self.client.scripts.heartbeat, *args)
        deadline = int(reply[0])
        statuses = []
        for (tag, _, _), status in zip(tags, reply[5:]):
            err = delivery_error(status.decode(), tag)
            held = self._held.get(tag)
            if err is None and held is not None:
                held.deadline_ms = deadline
            statuses.append(err)
        return HeartbeatResult(statuses, int(reply[1]), int(reply[2]), int(reply[3]), int(reply[4]))

    def rejoin(self) -> None:
        """Joins the group again after having been removed."""
        self._held.clear()
        self._join()

    def _held_up_to(self, last: tuple[str, int, int]) -> list[tuple[str, int, int]]:
        if last[0] not in self._held:
            return [last]
        out = []
        for tag in self._held:
            out.append(self._tag_of(tag))
            if tag == last[0]:
                break
        return out

    def nack(self, delivery: DeliveryRef, delay: float | None = None, error: str = "") -> str:
        """Offers the message again: at once ahead of every later message
        (``delay`` 0), after ``delay`` seconds, or (None) after the queue's
        redelivery policy. A message that already had max_deliveries is
        dead-lettered instead. Returns "requeued" or "dead"."""
        tag, seq, count = self._tag_of(delivery)
        delay_arg = ""
        if delay is not None:
            from .queue import _delay_ms

            delay_arg = str(_delay_ms(delay))
        status, where = self._call(self.client.scripts.nack, seq, count, delay_arg, _text("error", error))
        self._held.pop(tag, None)
        if status == b"dead" and int(where) == 0:
            self._log_drop(seq, "max-deliveries")
        return str(status.decode())

    nak = nack

    def reject(self, delivery: DeliveryRef, requeue: bool = False, reason: str = "") -> None:
        """Dead-letters the message now (RabbitMQ basic.reject); with
        ``requeue`` it is offered again at once instead."""
        if requeue:
            self.nack(delivery, delay=0, error=reason)
            return
        self._dead_letter(delivery, "rejected", reason)

    def term(self, delivery: DeliveryRef, reason: str = "") -> None:
        """Dead-letters the message now, never to be retried; ``reason`` is
        kept in its x-rq-error header (JetStream's +TERM)."""
        self._dead_letter(delivery, "terminated", reason)

    def _dead_letter(self, delivery: DeliveryRef, reason: str, text: str) -> None:
        tag, seq, count = self._tag_of(delivery)
        dseq = self._call(self.client.scripts.reject, seq, count, reason, _text("reason", text))
        self._held.pop(tag, None)
        if dseq == 0:
            self._log_drop(seq, reason)

    def _log_drop(self, seq: int, reason: str) -> None:
        log.warning(
            "message %s/%d dropped by group %s (%s): dead_letter is none", self.queue.name, seq, self.group, reason
        )

    def in_progress(self, deliveries: DeliveryRef | Iterable[DeliveryRef]) -> int:
        """Extends the leases of deliveries this consumer holds to now +
        ack_wait; returns the new deadline (server ms). Raises the
        DeliveryError of the first tag that could not be extended (the
        others are extended)."""
        refs = _refs(deliveries)
        tags = [self._tag_of(r) for r in refs]
        args: list[Any] = []
        for _, seq, count in tags:
            args += [seq, count]
        reply = self._call(self.client.scripts.extend, *args)
        deadline = int(reply[0])
        for (tag, _, _), status in zip(tags, reply[1:]):
            err = delivery_error(status.decode(), tag)
            if err is not None:
                raise err
            held = self._held.get(tag)
            if held is not None:
                held.deadline_ms = deadline
        return deadline

    # -- leaving ------------------------------------------------------------

    def close(self) -> int:
        """Leaves the group; every delivery still held goes back at once,
        ahead of new messages. Returns how many went back."""
        if self._closed:
            return 0
        returned, _dead = self._call(self.client.scripts.leave, self.name, "graceful")
        self._closed = True
        self._held.clear()
        return int(returned)

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _flat(tags: list[tuple[str, int, int]]) -> list[int]:
    """seq1, count1, seq2, count2, ... of (tag, seq, count) triples."""
    return [n for _, seq, count in tags for n in (seq, count)]


def _text(what: str, value: str) -> str:
    if not isinstance(value, str):
        raise InvalidInput(f"{what} must be a str, not {type(value).__name__}")
    value = value[: C.MAX_REASON_LENGTH]
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InvalidInput(f"{what} {value!r} cannot be encoded as UTF-8: {exc.reason}") from None
    return value


def _refs(deliveries: Any) -> list[DeliveryRef]:
    if isinstance(deliveries, (Delivery, str)):
        return [deliveries]
    try:
        return list(deliveries)
    except TypeError:
        raise InvalidInput(
            f"expected a Delivery, a delivery tag or a list of them, not {type(deliveries).__name__}"
        ) from None
