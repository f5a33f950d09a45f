"""Consumers of a group: fetching, settling, and the deliveries they hold.

Long because every way of settling (ack, ack_result, nack, reject, term,
in_progress) checks its tags and keeps the held deliveries in step, and
they share that bookkeeping here."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import validate as check
from .constants import IDLE_POLL_INTERVAL, MAX_FETCH
from .delivery import REPLAYED_HEADER, Delivery, DeliveryRef, HeartbeatResult
from .engine import commands, store
from .engine.record import COMPACT_HEAD, COMPACT_TAG, decode_record
from .errors import (
    CorruptRecord,
    InvalidInput,
    LostDelivery,
    NotHeld,
    NotMember,
    RQueueError,
    StateLost,
    delivery_error,
)
from .events import EventKind
from .ids import consumer_name, delivery_tag, fetch_token, parse_delivery_tag
from .names import check_name
from .settings import Settings, validate
from .statewatch import Mark, StateWatch
from .stored_results import encode_failure

if TYPE_CHECKING:
    from .protocols import QueueLike

log = logging.getLogger("rqueue")


class Consumer:
    """A named member of a group. Obtain one with :meth:`rqueue.Queue.consumer`.

    Joins the group when created; :meth:`close` leaves it and returns every
    unacked delivery at once. Safe to share between threads.
    """

    def __init__(
        self, queue: QueueLike, group: str, name: str | None, overrides: dict[str, Any], liveness: float | None = None
    ) -> None:
        self.queue = queue
        self.client = queue.client
        self.group = check_name("group", group)
        self.name = check_name("consumer", name) if name is not None else consumer_name(self.client.randomness)
        self.overrides = validate(overrides)
        self.liveness = check.positive_seconds("liveness", liveness) if liveness is not None else None
        self._call_for: tuple[Settings | None, commands.GroupCall | None] = (None, None)
        self._held: dict[str, Delivery] = {}
        self._closed = False
        self._settings_seen: Settings | None = None
        self._settings: Settings = Settings()
        # How many times this consumer has joined its group: a worker compares
        # it around a call to learn that the group had removed it meanwhile.
        self.joins = 0
        # What it saw of the queue's state in Redis (statewatch.py): a loss
        # drops every delivery it holds.
        self._watch = StateWatch(
            self.queue.name,
            self.queue.keys,
            self.client.redis,
            self.client.randomness,
            f"consumer {self.name} of group {self.group}",
            self.group,
            self._drop_held,
        )
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

    @property
    def last_settings(self) -> Settings:
        """The settings of this consumer's last call, read without asking
        Redis (a worker's heartbeat runs on them while Redis is away)."""
        return self._settings

    def _group_call(self) -> commands.GroupCall:
        """The engine's view of this consumer under its settings now, made
        once per settings object (the KEYS follow the settings, as the
        dead_letter setting may name another queue)."""
        if self._closed:
            raise RQueueError(f"{self!r} is closed")
        settings = self.settings()
        seen, call = self._call_for
        if seen is not settings or call is None:
            queue, client = self.queue, self.client
            call = commands.GroupCall.of(
                client.scripts,
                client.clock,
                client.randomness,
                queue.group_keys(self.group, settings),
                queue.name,
                queue.keys.base,
                self.group,
                self.name,
                settings,
            )
            self._call_for = (settings, call)
        return call

    def _join(self) -> None:
        liveness = self.liveness if self.liveness is not None else self.settings().ack_wait
        watch = self._watch
        mark = watch.mark()
        reply = commands.join(self._group_call(), int(liveness * 1000), watch.candidate)
        watch.saw(mark, reply.incarnation)
        self.joins += 1
        self.client.register(self.queue.name)

    @property
    def state_epoch(self) -> int:
        """How many losses of the queue's state in Redis this consumer has
        seen: a delivery made before the last one cannot be settled
        (LostDelivery), and a worker drops it unrun."""
        return self._watch.epoch

    @property
    def incarnation(self) -> str | None:
        """The queue's incarnation id as this consumer last saw it (None
        before a reply told it; docs/guarantees.md, guarantee 12)."""
        return self._watch.incarnation

    @property
    def last_state_loss(self) -> StateLost | None:
        """The last loss of the queue's state in Redis this consumer saw."""
        return self._watch.last_loss

    def _drop_held(self) -> int:
        """Forgets every delivery held (Redis lost the state they were
        made in); how many."""
        dropped = len(self._held)
        self._held.clear()
        return dropped

    # -- fetching -----------------------------------------------------------

    def fetch(self, n: int = 1, timeout: float = 0.0) -> list[Delivery]:
        """Claims up to ``n`` deliveries; waits up to ``timeout`` seconds for
        the first one when none is ready. Due redeliveries come before new
        messages, lowest seq first. Respects prefetch and max_inflight."""
        check.whole_number("n", n, 1, MAX_FETCH)
        check.seconds("timeout", timeout)
        clock = self.client.clock
        channel = self.queue.keys.wake_channel
        deadline = clock.monotonic() + timeout
        while True:
            generation = self.client.notifier.generation(channel) if timeout > 0 else 0
            reply, mark = self._fetch_once(n)
            deliveries = self._parse(reply, mark)
            remaining = deadline - clock.monotonic()
            if deliveries or remaining <= 0:
                return deliveries
            wait = min(remaining, IDLE_POLL_INTERVAL)
            if reply.next_due_ms is not None:
                wait = min(wait, max(0.001, (reply.next_due_ms - reply.now_ms) / 1000))
            self.client.notifier.wait(channel, generation, wait)

    def _fetch_once(self, n: int) -> tuple[commands.FetchReply, Mark]:
        """A fetch's reply, and what the watch knew when it was sent."""
        mark = self._watch.mark()
        try:
            return commands.fetch(self._group_call(), n, fetch_token(self.client.randomness)), mark
        except NotMember:
            # Removed as dead (e.g. after a long pause): what it held was
            # already offered again, so joining afresh loses nothing.
            log.warning("%r was not a member of its group any more; joining again", self)
            self._join()
            mark = self._watch.mark()
            return commands.fetch(self._group_call(), n, fetch_token(self.client.randomness)), mark

    def _parse(self, reply: commands.FetchReply, mark: Mark) -> list[Delivery]:
        # Per message on the hot path: no helper calls for a compact record
        # (no headers, no delay: the common case); anything else goes to
        # decode_record.
        epoch = self._watch.saw(mark, reply.incarnation, reply.last_seq)
        if epoch is None:
            # Sent before a loss this consumer saw meanwhile: what it brought
            # may be from before the loss, so none of it runs; its leases run
            # out and the messages that still exist are offered again.
            if len(reply.raw) > reply.first:
                count = (len(reply.raw) - reply.first) // 3
                log.warning("%r dropped %d deliveries fetched across a loss of Redis state", self, count)
            return []
        raw, token = reply.raw, reply.token
        deadline = reply.now_ms + int(round(self.settings().ack_wait * 1000))
        held = self._held
        out = []
        new = Delivery.__new__
        from_bytes = int.from_bytes
        for i in range(reply.first, len(raw), 3):
            seq, count, record = int(raw[i]), raw[i + 1], raw[i + 2]
            replayed = None
            if type(count) is not int:
                count, replayed = commands.delivery_count(count)
            headers: dict[str, str]
            if record[:1] == COMPACT_TAG and len(record) >= COMPACT_HEAD:
                published, headers, data = from_bytes(record[1:COMPACT_HEAD], "big"), {}, record[COMPACT_HEAD:]
            else:
                try:
                    published, headers, data = decode_record(record, f"{self.queue.keys.msgs}[{seq}]")
                except CorruptRecord as exc:
                    # Moved aside byte for byte; the rest of the batch goes on.
                    log.error("%s; moving it to the dead-letter queue", exc)
                    self._dead_letter(delivery_tag(seq, count, token), "corrupted-record", str(exc))
                    continue
            d = new(Delivery)
            d.consumer = self
            d.seq = seq
            d.delivery_count = count
            d.data = data
            d.headers = headers
            d.published_ms = published
            d.deadline_ms = deadline
            d.token = token
            d.tag = tag = delivery_tag(seq, count, token)
            d.epoch = epoch
            d.replayed = replayed is not None
            if replayed is not None:
                d.headers = {**headers, REPLAYED_HEADER: str(replayed)}
            held[tag] = d
            out.append(d)
        return out

    # -- settling -----------------------------------------------------------

    def _tag_of(self, ref: DeliveryRef) -> commands.Tag:
        if isinstance(ref, Delivery):
            if ref.consumer is not self:
                # Another consumer's delivery (of this group or another): its
                # seq and count may name one of this consumer's too.
                raise NotHeld(ref.tag, f"it was fetched by {ref.consumer!r}, not by {self!r}")
            if ref.epoch != self._watch.epoch and self._watch.last_loss is not None:
                # Made before Redis lost the state it was made in: nothing is
                # sent, so no settle of it can touch a new message.
                raise LostDelivery(ref.tag, self._watch.last_loss)
            return ref.tag, ref.seq, ref.delivery_count, ref.token
        if not isinstance(ref, str):
            raise InvalidInput(f"expected a Delivery or a delivery tag, not {type(ref).__name__}")
        try:
            seq, count, token = parse_delivery_tag(ref)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        return ref, seq, count, token

    def ack(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool = False) -> None:
        """Acks one delivery or a list of them in one round trip.

        All or nothing: if any tag is unknown, already acked or held by
        another consumer, a DeliveryError naming that tag is raised and no
        tag is acked. With ``multiple``, every delivery this consumer handed
        out before the given one (and still holds) is acked too.
        """
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        if multiple:
            if len(tags) != 1:
                raise InvalidInput("multiple=True takes exactly one delivery: the last one to ack")
            # Earlier deliveries that moved on meanwhile are skipped; only
            # the named one must be ackable.
            named = tags[0]
            earlier = [t[0] for t in self._held_up_to(named) if t != named]
            statuses = self.ack_available([*earlier, named[0]])
            if statuses[-1] is not None:
                raise statuses[-1]
            return
        if not tags:
            return
        commands.ack(self._group_call(), tags, strict=True)
        held = self._held
        for tag, *_ in tags:
            held.pop(tag, None)

    def ack_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]:
        """Acks every delivery that can be acked, in one round trip; returns,
        per delivery, None or the DeliveryError that kept it from being acked.
        For runtimes that must not fail a whole batch for one stale tag."""
        tags, lost = self._sendable(refs_of(deliveries))
        if not tags:
            return list(lost)
        statuses = commands.ack(self._group_call(), tags, strict=False)
        held = self._held
        out = []
        for (tag, *_), status in zip(tags, statuses, strict=True):
            held.pop(tag, None)
            out.append(delivery_error(status, tag))
        return _merged(lost, out)

    def _sendable(self, refs: Iterable[DeliveryRef]) -> tuple[list[commands.Tag], list[RQueueError | None]]:
        """The tags of ``refs`` to send, and per ref its LostDelivery (not
        sent) or None (sent)."""
        tags: list[commands.Tag] = []
        lost: list[RQueueError | None] = []
        for ref in refs:
            try:
                tags.append(self._tag_of(ref))
                lost.append(None)
            except LostDelivery as exc:
                lost.append(exc)
        return tags, lost

    def ack_and_fetch(
        self, acks: Iterable[DeliveryRef], n: int
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """Acks what can be acked (as :meth:`ack_available`) and claims up to
        ``n`` deliveries, both in one script call (one round trip). Returns
        the ack statuses, the deliveries, and (when none came) the seconds
        until a waiting message falls due, or None."""
        refs = list(acks)
        if n <= 0:
            return self.ack_available(refs), [], None
        tags, lost = self._sendable(refs)
        mark = self._watch.mark()
        try:
            reply = commands.fetch(self._group_call(), n, fetch_token(self.client.randomness), tags)
        except NotMember:
            # Nothing was changed: join afresh (what this consumer held was
            # offered again; its late acks are still accepted) and do both.
            log.warning("%r was not a member of its group any more; joining again", self)
            self._join()
            lenient = self.ack_available(refs) if refs else []
            mark = self._watch.mark()
            fetched = commands.fetch(self._group_call(), n, fetch_token(self.client.randomness))
            return lenient, self._parse(fetched, mark), None
        statuses: list[RQueueError | None] = []
        held = self._held
        for (tag, *_), status in zip(tags, reply.ack_statuses, strict=True):
            held.pop(tag, None)
            statuses.append(None if status == "ok" else delivery_error(status, tag))
        statuses = _merged(lost, statuses)
        deliveries = self._parse(reply, mark)
        due_in = None
        if not deliveries and reply.next_due_ms is not None:
            due_in = max(0.0, (reply.next_due_ms - reply.now_ms) / 1000)
        return statuses, deliveries, due_in

    def heartbeat(self, running: Iterable[DeliveryRef], timeout: float, sync: bool = False) -> HeartbeatResult:
        """Records that this consumer is alive for ``timeout`` seconds more,
        extends the leases of ``running`` deliveries, and removes members
        whose own liveness ran out (what they held is offered again at
        once). With ``sync``, ``running`` must list every delivery the caller
        knows of: any other delivery this consumer holds in Redis (a fetch
        whose reply was lost) is handed back without counting as an attempt.
        Raises NotMember when this consumer was itself removed."""
        tags, lost = self._sendable(refs_of(running))
        timeout_ms = int(check.positive_seconds("timeout", timeout) * 1000)
        mark = self._watch.mark()
        reply = commands.heartbeat(self._group_call(), timeout_ms, sync, tags)
        self._watch.saw(mark, reply.incarnation)
        statuses: list[RQueueError | None] = []
        for (tag, *_), status in zip(tags, reply.statuses, strict=True):
            err = delivery_error(status, tag)
            held = self._held.get(tag)
            if err is None and held is not None:
                held.deadline_ms = reply.deadline_ms
            statuses.append(err)
        return HeartbeatResult(
            _merged(lost, statuses), reply.removed, reply.returned, reply.dead_lettered, reply.handed_back
        )

    def rejoin(self) -> None:
        """Joins the group again after having been removed."""
        self._join()  # sees a loss of Redis state with what was held
        self._held.clear()

    def _held_up_to(self, last: commands.Tag) -> list[commands.Tag]:
        if last[0] not in self._held:
            return [last]
        out = []
        for tag in self._held:
            out.append(self._tag_of(tag))
            if tag == last[0]:
                break
        return out

    def nack(
        self, delivery: DeliveryRef, delay: float | None = None, error: str = "", *, timed_out: bool = False
    ) -> str:
        """Offers the message again: at once ahead of every later message
        (``delay`` 0), after ``delay`` seconds, or (None) after the queue's
        redelivery policy. A message that already had max_deliveries is
        dead-lettered instead. Returns "requeued" or "dead". The event it
        records (events setting) is ``timeout`` with ``timed_out``, else ``failed``."""
        tag = self._tag_of(delivery)
        delay_ms = None if delay is None else check.delay_ms(delay)
        call = self._group_call()
        kind = EventKind.TIMEOUT.value if timed_out else EventKind.FAILED.value
        event = kind if kind in self._settings.events else ""
        reply = commands.nack(call, tag, delay_ms, check.text("error", error), event)
        self._held.pop(tag[0], None)
        seq = tag[1]
        if reply.dead and reply.where == 0:
            self._log_drop(seq, "max-deliveries")
        return "dead" if reply.dead else "requeued"

    nak = nack

    def ack_result(self, delivery: DeliveryRef, value: bytes | None, event: bool) -> None:
        """Acks one delivery as :meth:`ack` does and in the same call keeps
        ``value`` (rqueue.stored_results' encoding; None: none) for the
        result_ttl and, with ``event``, records a completed event."""
        tag = self._tag_of(delivery)
        call = self._group_call()
        ttl_ms = None if value is None else max(1, int(self._settings.result_ttl * 1000))
        commands.ack_result(call, self.queue.keys.result(tag[1]), tag, ttl_ms, value or b"", event)
        self._held.pop(tag[0], None)

    def keep_failure(self, seq: int, reason: str, error: str) -> None:
        """Keeps how message ``seq`` failed for good as its result (sent
        after its settle: a crash in between loses the result, not the message)."""
        ttl_ms = max(1, int(self.settings().result_ttl * 1000))
        store.save_result(self.client.redis, self.queue.keys, seq, encode_failure(reason, error), ttl_ms)

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
        tag = self._tag_of(delivery)
        call = self._group_call()
        event = EventKind.FAILED.value if EventKind.FAILED.value in self._settings.events else ""
        dseq = commands.reject(call, tag, reason, check.text("reason", text), event)
        self._held.pop(tag[0], None)
        if dseq == 0:
            self._log_drop(tag[1], reason)

    def _log_drop(self, seq: int, reason: str) -> None:
        log.warning(
            "message %s/%d dropped by group %s (%s): dead_letter is none", self.queue.name, seq, self.group, reason
        )

    def in_progress(self, deliveries: DeliveryRef | Iterable[DeliveryRef]) -> int:
        """Extends the leases of deliveries this consumer holds to now +
        ack_wait; returns the new deadline (server ms). Raises the
        DeliveryError of the first tag that could not be extended (the
        others are extended)."""
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        reply = commands.extend(self._group_call(), tags)
        for (tag, *_), status in zip(tags, reply.statuses, strict=True):
            err = delivery_error(status, tag)
            if err is not None:
                raise err
            held = self._held.get(tag)
            if held is not None:
                held.deadline_ms = reply.deadline_ms
        return reply.deadline_ms

    # -- leaving ------------------------------------------------------------

    def close(self) -> int:
        """Leaves the group; every delivery still held goes back at once,
        ahead of new messages. Returns how many went back."""
        if self._closed:
            return 0
        reply = commands.leave(self._group_call(), self.name, graceful=True)
        self._closed = True
        self._held.clear()
        return reply.returned

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _merged(lost: list[RQueueError | None], sent: list[RQueueError | None]) -> list[RQueueError | None]:
    """Per ref, in order: its LostDelivery, or the status of its tag that
    was sent (``sent``, in order)."""
    if not any(lost):
        return sent
    statuses = iter(sent)
    return [exc if exc is not None else next(statuses) for exc in lost]


def refs_of(deliveries: object) -> list[DeliveryRef]:
    """``deliveries`` as a list: one Delivery or tag, or an iterable of them."""
    if isinstance(deliveries, (Delivery, str)):
        return [deliveries]
    if isinstance(deliveries, Iterable):
        return list(deliveries)
    raise InvalidInput(f"expected a Delivery, a delivery tag or a list of them, not {type(deliveries).__name__}")
