"""Consumers of an asyncio client, and their deliveries: the awaitable twins
of rqueue.consumer.Consumer and rqueue.delivery.Delivery, on the same
engine builders and parsers."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import validate as check
from ..constants import IDLE_POLL_INTERVAL, MAX_FETCH
from ..consumer import refs_of
from ..delivery import REPLAYED_HEADER, HeartbeatResult
from ..delivery import Delivery as SyncDelivery
from ..engine import async_commands as acmd
from ..engine import commands
from ..engine.record import COMPACT_HEAD, COMPACT_TAG, decode_record
from ..errors import CorruptRecord, InvalidInput, NotHeld, NotMember, RQueueError, delivery_error
from ..events import EventKind
from ..ids import consumer_name, delivery_tag, fetch_token, incarnation_id, parse_delivery_tag
from ..names import check_name
from ..settings import Settings, validate
from ..stored_results import encode_failure

if TYPE_CHECKING:
    from .context import AsyncQueueLike

log = logging.getLogger("rqueue")

Ref = SyncDelivery | str


class Delivery(SyncDelivery):
    """One hand-over of one message to a consumer of an asyncio client:
    the attributes of :class:`rqueue.Delivery`, settled with awaits."""

    __slots__ = ()
    consumer: Consumer  # type: ignore[assignment]  # an asyncio client's consumer

    async def ack(self, multiple: bool = False) -> None:  # type: ignore[override]  # awaitable twin
        await self.consumer.ack(self, multiple=multiple)

    async def nack(self, delay: float | None = None, error: str = "") -> str:  # type: ignore[override]
        return await self.consumer.nack(self, delay=delay, error=error)

    nak = nack  # type: ignore[assignment]

    async def reject(self, requeue: bool = False, reason: str = "") -> None:  # type: ignore[override]
        await self.consumer.reject(self, requeue=requeue, reason=reason)

    async def term(self, reason: str = "") -> None:  # type: ignore[override]
        await self.consumer.term(self, reason)

    async def in_progress(self) -> int:  # type: ignore[override]
        return await self.consumer.in_progress(self)


class Consumer:
    """A named member of a group, on an asyncio client. Obtain one with
    :meth:`rqueue.aio.Queue.consumer`; it joins on ``async with`` (or
    :meth:`join`) and leaves on exit (or :meth:`close`), returning every
    unacked delivery at once."""

    def __init__(
        self,
        queue: AsyncQueueLike,
        group: str,
        name: str | None,
        overrides: dict[str, Any],
        liveness: float | None = None,
    ) -> None:
        self.queue = queue
        self.client = queue.client
        self.group = check_name("group", group)
        self.name = check_name("consumer", name) if name is not None else consumer_name(self.client.randomness)
        self.overrides = validate(overrides)
        self.liveness = check.positive_seconds("liveness", liveness) if liveness is not None else None
        self._call_for: tuple[Settings | None, acmd.AsyncGroupCall | None] = (None, None)
        self._held: dict[str, Delivery] = {}
        self._closed = False
        self._settings_seen: Settings | None = None
        self._settings: Settings = Settings()
        #: How many times this consumer has joined its group (as rqueue.Consumer.joins).
        self.joins = 0

    def __repr__(self) -> str:
        return f"rqueue.aio.Consumer(queue={self.queue.name!r}, group={self.group!r}, name={self.name!r})"

    async def settings(self) -> Settings:
        """The settings this consumer works with (stored patterns, then overrides)."""
        resolved = await self.queue.settings()
        if resolved is not self._settings_seen:
            self._settings_seen = resolved
            self._settings = resolved.merged(self.overrides) if self.overrides else resolved
        return self._settings

    @property
    def last_settings(self) -> Settings:
        """The settings of this consumer's last call, read without asking Redis."""
        return self._settings

    async def _group_call(self) -> acmd.AsyncGroupCall:
        if self._closed:
            raise RQueueError(f"{self!r} is closed")
        settings = await self.settings()
        seen, call = self._call_for
        if seen is not settings or call is None:
            call = self.queue.group_call(self.group, settings, self.name)
            self._call_for = (settings, call)
        return call

    async def join(self) -> Consumer:
        """Joins the group (created on first use)."""
        await self.queue.check_plain()
        liveness = self.liveness if self.liveness is not None else (await self.settings()).ack_wait
        await acmd.join(await self._group_call(), int(liveness * 1000), incarnation_id(self.client.randomness))
        self.joins += 1
        await self.client.register(self.queue.name)
        return self

    async def __aenter__(self) -> Consumer:
        return await self.join()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # -- fetching -----------------------------------------------------------

    async def fetch(self, n: int = 1, timeout: float = 0.0) -> list[Delivery]:
        """Claims up to ``n`` deliveries; waits up to ``timeout`` seconds
        (without blocking the event loop) for the first one when none is
        ready (see :meth:`rqueue.Consumer.fetch`)."""
        check.whole_number("n", n, 1, MAX_FETCH)
        check.seconds("timeout", timeout)
        clock = self.client.clock
        notifier = self.client.notifier
        channel = self.queue.keys.wake_channel
        deadline = clock.monotonic() + timeout
        while True:
            generation = await notifier.generation(channel) if timeout > 0 else 0
            reply = await self._fetch_once(n)
            deliveries = await self._parse(reply)
            remaining = deadline - clock.monotonic()
            if deliveries or remaining <= 0:
                return deliveries
            wait = min(remaining, IDLE_POLL_INTERVAL)
            if reply.next_due_ms is not None:
                wait = min(wait, max(0.001, (reply.next_due_ms - reply.now_ms) / 1000))
            await notifier.wait(channel, generation, wait)

    async def _fetch_once(self, n: int, acks: list[commands.Tag] | None = None) -> commands.FetchReply:
        try:
            return await acmd.fetch(await self._group_call(), n, fetch_token(self.client.randomness), acks or ())
        except NotMember:
            if acks:
                raise
            log.warning("%r was not a member of its group any more; joining again", self)
            await self.join()
            return await acmd.fetch(await self._group_call(), n, fetch_token(self.client.randomness))

    async def _parse(self, reply: commands.FetchReply) -> list[Delivery]:
        raw, token = reply.raw, reply.token
        deadline = reply.now_ms + int(round(self._settings.ack_wait * 1000))
        held = self._held
        out: list[Delivery] = []
        corrupt: list[tuple[str, str]] = []
        new = Delivery.__new__
        for i in range(reply.first, len(raw), 3):
            seq, count, record = int(raw[i]), raw[i + 1], raw[i + 2]
            replayed = None
            if type(count) is not int:
                count, replayed = commands.delivery_count(count)
            headers: dict[str, str]
            if record[:1] == COMPACT_TAG and len(record) >= COMPACT_HEAD:
                published, headers, data = int.from_bytes(record[1:COMPACT_HEAD], "big"), {}, record[COMPACT_HEAD:]
            else:
                try:
                    published, headers, data = decode_record(record, f"{self.queue.keys.msgs}[{seq}]")
                except CorruptRecord as exc:
                    log.error("%s; moving it to the dead-letter queue", exc)
                    corrupt.append((delivery_tag(seq, count, token), str(exc)))
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
            d.epoch = 0
            d.replayed = replayed is not None
            if replayed is not None:
                d.headers = {**headers, REPLAYED_HEADER: str(replayed)}
            held[tag] = d
            out.append(d)
        for tag, text in corrupt:  # moved aside byte for byte; the rest of the batch goes on
            await self._dead_letter(tag, "corrupted-record", text)
        return out

    # -- settling -----------------------------------------------------------

    def _tag_of(self, ref: Ref) -> commands.Tag:
        if isinstance(ref, SyncDelivery):
            if ref.consumer is not self:  # type: ignore[comparison-overlap]  # the owner is an aio Consumer
                raise NotHeld(ref.tag, f"it was fetched by {ref.consumer!r}, not by {self!r}")
            return ref.tag, ref.seq, ref.delivery_count, ref.token
        if not isinstance(ref, str):
            raise InvalidInput(f"expected a Delivery or a delivery tag, not {type(ref).__name__}")
        try:
            seq, count, token = parse_delivery_tag(ref)
        except ValueError as exc:
            raise InvalidInput(str(exc)) from None
        return ref, seq, count, token

    async def ack(self, deliveries: Ref | Iterable[Ref], multiple: bool = False) -> None:
        """Acks one delivery or a list of them in one round trip, all or
        nothing (see :meth:`rqueue.Consumer.ack`)."""
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        if multiple:
            if len(tags) != 1:
                raise InvalidInput("multiple=True takes exactly one delivery: the last one to ack")
            named = tags[0]
            earlier = [t[0] for t in self._held_up_to(named) if t != named]
            statuses = await self.ack_available([*earlier, named[0]])
            if statuses[-1] is not None:
                raise statuses[-1]
            return
        if not tags:
            return
        await acmd.ack(await self._group_call(), tags, strict=True)
        for tag, *_ in tags:
            self._held.pop(tag, None)

    def _held_up_to(self, last: commands.Tag) -> list[commands.Tag]:
        if last[0] not in self._held:
            return [last]
        out = []
        for tag in self._held:
            out.append(self._tag_of(tag))
            if tag == last[0]:
                break
        return out

    async def ack_available(self, deliveries: Iterable[Ref]) -> list[RQueueError | None]:
        """Acks every delivery that can be acked; per delivery None or the
        DeliveryError that kept it from being acked."""
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        if not tags:
            return []
        statuses = await acmd.ack(await self._group_call(), tags, strict=False)
        out = []
        for (tag, *_), status in zip(tags, statuses, strict=True):
            self._held.pop(tag, None)
            out.append(delivery_error(status, tag))
        return out

    async def ack_and_fetch(
        self, acks: Iterable[Ref], n: int
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """Acks what can be acked and claims up to ``n`` deliveries in one
        round trip (see :meth:`rqueue.Consumer.ack_and_fetch`)."""
        tags = [self._tag_of(r) for r in acks]
        if n <= 0:
            return await self.ack_available([t[0] for t in tags]), [], None
        try:
            reply = await self._fetch_once(n, tags)
        except NotMember:
            log.warning("%r was not a member of its group any more; joining again", self)
            await self.join()
            lenient = await self.ack_available([t[0] for t in tags]) if tags else []
            fetched = await acmd.fetch(await self._group_call(), n, fetch_token(self.client.randomness))
            return lenient, await self._parse(fetched), None
        statuses: list[RQueueError | None] = []
        for (tag, *_), status in zip(tags, reply.ack_statuses, strict=True):
            self._held.pop(tag, None)
            statuses.append(None if status == "ok" else delivery_error(status, tag))
        deliveries = await self._parse(reply)
        due_in = None
        if not deliveries and reply.next_due_ms is not None:
            due_in = max(0.0, (reply.next_due_ms - reply.now_ms) / 1000)
        return statuses, deliveries, due_in

    async def heartbeat(self, running: Iterable[Ref], timeout: float, sync: bool = False) -> HeartbeatResult:
        """See :meth:`rqueue.Consumer.heartbeat`."""
        tags = [self._tag_of(r) for r in refs_of(running)]
        timeout_ms = int(check.positive_seconds("timeout", timeout) * 1000)
        reply = await acmd.heartbeat(await self._group_call(), timeout_ms, sync, tags)
        statuses = []
        for (tag, *_), status in zip(tags, reply.statuses, strict=True):
            err = delivery_error(status, tag)
            held = self._held.get(tag)
            if err is None and held is not None:
                held.deadline_ms = reply.deadline_ms
            statuses.append(err)
        return HeartbeatResult(statuses, reply.removed, reply.returned, reply.dead_lettered, reply.handed_back)

    async def rejoin(self) -> None:
        """Joins the group again after having been removed."""
        self._held.clear()
        await self.join()

    async def nack(self, delivery: Ref, delay: float | None = None, error: str = "", *, timed_out: bool = False) -> str:
        """Offers the message again (see :meth:`rqueue.Consumer.nack`);
        returns "requeued" or "dead"."""
        tag = self._tag_of(delivery)
        delay_ms = None if delay is None else check.delay_ms(delay)
        call = await self._group_call()
        kind = EventKind.TIMEOUT.value if timed_out else EventKind.FAILED.value
        event = kind if kind in self._settings.events else ""
        reply = await acmd.nack(call, tag, delay_ms, check.text("error", error), event)
        self._held.pop(tag[0], None)
        if reply.dead and reply.where == 0:
            self._log_drop(tag[1], "max-deliveries")
        return "dead" if reply.dead else "requeued"

    nak = nack

    async def ack_result(self, delivery: Ref, value: bytes | None, event: bool) -> None:
        """See :meth:`rqueue.Consumer.ack_result`."""
        tag = self._tag_of(delivery)
        call = await self._group_call()
        ttl_ms = None if value is None else max(1, int(self._settings.result_ttl * 1000))
        await acmd.ack_result(call, self.queue.keys.result(tag[1]), tag, ttl_ms, value or b"", event)
        self._held.pop(tag[0], None)

    async def keep_failure(self, seq: int, reason: str, error: str) -> None:
        """See :meth:`rqueue.Consumer.keep_failure`."""
        ttl_ms = max(1, int(self._settings.result_ttl * 1000))
        await acmd.save_result(self.client.redis, self.queue.keys, seq, encode_failure(reason, error), ttl_ms)

    async def reject(self, delivery: Ref, requeue: bool = False, reason: str = "") -> None:
        """Dead-letters the message now; with ``requeue`` offers it again at once."""
        if requeue:
            await self.nack(delivery, delay=0, error=reason)
            return
        await self._dead_letter(delivery, "rejected", reason)

    async def term(self, delivery: Ref, reason: str = "") -> None:
        """Dead-letters the message now, never to be retried."""
        await self._dead_letter(delivery, "terminated", reason)

    async def _dead_letter(self, delivery: Ref, reason: str, text: str) -> None:
        tag = self._tag_of(delivery)
        call = await self._group_call()
        event = EventKind.FAILED.value if EventKind.FAILED.value in self._settings.events else ""
        dseq = await acmd.reject(call, tag, reason, check.text("reason", text), event)
        self._held.pop(tag[0], None)
        if dseq == 0:
            self._log_drop(tag[1], reason)

    def _log_drop(self, seq: int, reason: str) -> None:
        log.warning(
            "message %s/%d dropped by group %s (%s): dead_letter is none", self.queue.name, seq, self.group, reason
        )

    async def in_progress(self, deliveries: Ref | Iterable[Ref]) -> int:
        """Extends the leases of deliveries to now + ack_wait; returns the
        new deadline (server ms) (see :meth:`rqueue.Consumer.in_progress`)."""
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        reply = await acmd.extend(await self._group_call(), tags)
        for (tag, *_), status in zip(tags, reply.statuses, strict=True):
            err = delivery_error(status, tag)
            if err is not None:
                raise err
            held = self._held.get(tag)
            if held is not None:
                held.deadline_ms = reply.deadline_ms
        return reply.deadline_ms

    async def close(self) -> int:
        """Leaves the group; every delivery still held goes back at once."""
        if self._closed or self.joins == 0:
            self._closed = True
            return 0
        reply = await acmd.leave(await self._group_call(), self.name, graceful=True)
        self._closed = True
        self._held.clear()
        return reply.returned
