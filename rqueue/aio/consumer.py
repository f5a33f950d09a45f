"""Consumers of an asyncio client, and their deliveries: the awaitable twins
of rqueue.consumer.Consumer and rqueue.delivery.Delivery, on the same
engine builders and parsers."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from .. import validate as check
from ..constants import IDLE_POLL_INTERVAL, MAX_FETCH
from ..consumer_core import ConsumerCore, named_twice, refs_of
from ..delivery import Delivery as SyncDelivery
from ..delivery import HeartbeatResult
from ..engine import async_commands as acmd
from ..engine import commands
from ..errors import AlreadyAcked, NotMember, QueuePartitioned, RQueueError
from ..ids import fetch_token
from ..settings import Settings
from ..statewatch import Mark
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


class Consumer(ConsumerCore):
    """A named member of a group, on an asyncio client. Obtain one with
    :meth:`rqueue.aio.Queue.consumer`; it joins on ``async with`` (or
    :meth:`join`) and leaves on exit (or :meth:`close`), returning every
    unacked delivery at once. What it decides without Redis (held
    deliveries, the state watch, reply handling) is rqueue.consumer_core's,
    as for :class:`rqueue.Consumer`."""

    delivery_class = Delivery
    queue: AsyncQueueLike

    def __init__(
        self,
        queue: AsyncQueueLike,
        group: str,
        name: str | None,
        overrides: dict[str, Any],
        liveness: float | None = None,
    ) -> None:
        super().__init__(queue, group, name, overrides, liveness, record=queue.client.event_writer(queue.keys))

    def __repr__(self) -> str:
        return f"rqueue.aio.Consumer(queue={self.queue.name!r}, group={self.group!r}, name={self.name!r})"

    async def settings(self) -> Settings:
        """The settings this consumer works with (stored patterns, then overrides)."""
        return self._merge_settings(await self.queue.settings())

    def _call_now(self) -> acmd.AsyncGroupCall | None:
        """The engine's view of this consumer, without an await while the
        client's copy of the settings is fresh (None: it is not)."""
        resolved = self.client.settings.fresh(self.queue.name)
        if resolved is None:
            return None
        settings = self._merge_settings(resolved)
        call: acmd.AsyncGroupCall = self._cached_call(
            settings, lambda: self.queue.group_call(self.group, settings, self.name)
        )
        return call

    async def _group_call(self) -> acmd.AsyncGroupCall:
        call = self._call_now()
        if call is not None:
            return call
        settings = await self.settings()
        made: acmd.AsyncGroupCall = self._cached_call(
            settings, lambda: self.queue.group_call(self.group, settings, self.name)
        )
        return made

    async def join(self) -> Consumer:
        """Joins the group (created on first use)."""
        call = await self._group_call()
        mark = self._watch.mark()
        try:
            reply = await acmd.join(call, self._liveness_ms(), self._watch.candidate)
        except QueuePartitioned as exc:
            if self.queue.partition is None:  # the client opens the partitioned queue from now on
                await self.client.partitioned_now(self.queue.root, exc.layout)
            raise
        self._joined(mark, reply)
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
        in_redis = False  # this round's fetch waits in Redis for the queue's wake-up first
        # As rqueue.Consumer.fetch: one that may wait in Redis reads the
        # channel (subscribes) only once it is not the waiter.
        read_channel = timeout > 0 and (
            not self._claims(self._call_now() or await self._group_call(), True) or notifier.listens(channel)
        )
        wait = 0.0
        while True:
            generation: int | None = None
            if in_redis:
                reply, deliveries = await self._wait_then_fetch(n, wait)
            else:
                generation = await notifier.generation(channel) if read_channel else None
                reply, mark = await self._fetch_once(n, waits=timeout > 0)
                deliveries = await self._received(reply, mark)
            remaining = deadline - clock.monotonic()
            if deliveries or remaining <= 0:
                return deliveries
            if reply.handed_out():
                # Every delivery was set aside (expired messages at the head
                # of the queue): the next ones may be ready, so no wait.
                in_redis = False
                continue
            wait = self._fetch_wait(reply, min(remaining, IDLE_POLL_INTERVAL))
            in_redis = self.waits_on_wakes()
            if in_redis:
                continue
            if generation is None:
                read_channel = True  # read first, and fetched after
                continue
            await notifier.wait(channel, generation, wait)

    async def end_waits(self) -> None:
        """See :meth:`rqueue.Consumer.end_waits`."""
        await acmd.wake_waiters(self.client.redis, self.queue.keys)

    async def _wait_then_fetch(self, n: int, wait: float) -> tuple[commands.FetchReply, list[Delivery]]:
        """See :meth:`rqueue.Consumer._wait_then_fetch`."""
        mark = self._watch.mark()
        call, token = self._call_now() or await self._group_call(), fetch_token(self.client.randomness)
        block_ms = max(1, int(wait * 1000))
        since = self._wake_since
        try:
            woken = await acmd.wait_then_fetch(call, self.queue.keys.wakes, since, block_ms, n, token)
        except NotMember:
            reply, mark = await self._fetch_once(n)  # it joins again
            return reply, await self._received(reply, mark)
        self._wake_since = woken.since
        deliveries = await self._received(woken.reply, mark)
        if self._judge_wait(woken, since, block_ms, deliveries):  # type: ignore[arg-type]  # an aio Delivery is a Delivery
            self._judge_silence(await self._newest_wake(), since)
        return woken.reply, deliveries

    async def _newest_wake(self) -> str | None:
        return await acmd.newest_wake(self.client.redis, self.queue.keys)

    async def _fetch_once(self, n: int, waits: bool = False) -> tuple[commands.FetchReply, Mark]:
        mark = self._watch.mark()
        try:
            call = self._call_now() or await self._group_call()
            return await acmd.fetch(call, n, fetch_token(self.client.randomness), waits=self._claims(call, waits)), mark
        except NotMember:
            # Removed as dead (e.g. after a long pause): what it held was
            # already offered again, so joining afresh loses nothing.
            log.warning("%r was not a member of its group any more; joining again", self)
            await self.join()
            mark = self._watch.mark()
            call = await self._group_call()
            return await acmd.fetch(call, n, fetch_token(self.client.randomness), waits=self._claims(call, waits)), mark

    async def _received(self, reply: commands.FetchReply, mark: Mark) -> list[Delivery]:
        deliveries, aside = self._parse(reply, mark)
        if aside:
            try:
                items, keys, ttl_ms = self._aside_call(aside)
                self._set_aside_done(items, await acmd.set_aside(await self._group_call(), items, keys, ttl_ms))
            except BaseException:
                self._unhold(deliveries)
                raise
        return deliveries  # type: ignore[return-value]  # delivery_class makes them

    # -- settling -----------------------------------------------------------

    async def ack(self, deliveries: Ref | Iterable[Ref], multiple: bool = False) -> None:
        """Acks one delivery or a list of them in one round trip, all or
        nothing (see :meth:`rqueue.Consumer.ack`)."""
        whole = self._whole_claim(deliveries, multiple)
        ranges = True
        if whole is not None:
            call = self._call_now() or await self._group_call()
            if not self._completed_on():
                mark = self._watch.mark()
                if await acmd.ack_run(call, whole.lo, whole.n, whole.token):
                    self._claim_acked(whole, mark)
                    return
                ranges = False  # refused: as triples, the error names the first bad tag
        tags = self._ack_tags(deliveries, multiple)
        if multiple:
            statuses = await self.ack_available(self._earlier_refs(tags[0]))
            if statuses[-1] is not None:
                raise statuses[-1]
            return
        if not tags:
            return
        call = self._call_now() or await self._group_call()
        mark = self._watch.mark()
        try:
            if self._completed_on():
                await acmd.ack_completed(call, tags, strict=True)
            else:
                await acmd.ack(call, tags, strict=True, ranges=ranges)
        except AlreadyAcked as exc:
            raise named_twice(tags, exc) from None
        self._forget(tags, mark)

    async def ack_available(self, deliveries: Iterable[Ref]) -> list[RQueueError | None]:
        """Acks every delivery that can be acked; per delivery None or the
        DeliveryError that kept it from being acked."""
        tags, lost = self._sendable(refs_of(deliveries))
        if not tags:
            return list(lost)
        call = await self._group_call()
        mark = self._watch.mark()
        if self._completed_on():
            return self._acked(tags, lost, await acmd.ack_completed(call, tags, strict=False), mark)
        return self._acked(tags, lost, await acmd.ack(call, tags, strict=False), mark)

    async def ack_and_fetch(
        self, acks: Iterable[Ref], n: int, wait: float | None = None, may_wait: bool = False
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """Acks what can be acked and claims up to ``n`` deliveries in one
        round trip, two with completed events on; with ``wait`` and no acks,
        waits for the queue's wake-up first; ``may_wait`` as there (see
        :meth:`rqueue.Consumer.ack_and_fetch`)."""
        check.whole_number("n", n, 0)
        if wait is not None:
            check.seconds("wait", wait)
        refs = list(acks)
        if n == 0:
            return await self.ack_available(refs), [], None
        if wait is not None and not refs and self.waits_on_wakes():
            reply, deliveries = await self._wait_then_fetch(n, wait)
            return [], deliveries, self._due_in(reply, deliveries)
        if refs and self._completed_on():
            # fetch.lua's acks record no event: the acks go first, in a call
            # that records them, then the fetch (two round trips, only then;
            # decided by the settings this consumer last read)
            statuses = await self.ack_available(refs)
            _, deliveries, due_in = await self.ack_and_fetch([], n)
            return statuses, deliveries, due_in
        tags, lost = self._sendable(refs)
        mark = self._watch.mark()
        waits = not refs and (may_wait or wait is not None)
        try:
            call = self._call_now() or await self._group_call()
            reply = await acmd.fetch(call, n, fetch_token(self.client.randomness), tags, self._claims(call, waits))
        except NotMember:
            # Nothing was changed: join afresh and do both (as rqueue.Consumer).
            log.warning("%r was not a member of its group any more; joining again", self)
            await self.join()
            lenient = await self.ack_available(refs) if refs else []
            mark = self._watch.mark()
            call = await self._group_call()
            fetched = await acmd.fetch(call, n, fetch_token(self.client.randomness), waits=self._claims(call, waits))
            deliveries = await self._received(fetched, mark)
            return lenient, deliveries, self._due_in(fetched, deliveries)
        statuses = self._fetched_acks(tags, lost, reply, mark)
        deliveries = await self._received(reply, mark)
        return statuses, deliveries, self._due_in(reply, deliveries)

    async def heartbeat(self, running: Iterable[Ref], timeout: float, sync: bool = False) -> HeartbeatResult:
        """See :meth:`rqueue.Consumer.heartbeat`."""
        tags, lost = self._sendable(refs_of(running))
        timeout_ms = int(check.positive_seconds("timeout", timeout) * 1000)
        mark = self._watch.mark()
        return self._beaten(tags, lost, mark, await acmd.heartbeat(await self._group_call(), timeout_ms, sync, tags))

    async def rejoin(self, removal: NotMember | None = None) -> None:
        """Joins the group again after having been removed (``removal``:
        the NotMember that said so, as a partitioned consumer takes it)."""
        await self.join()  # sees a loss of Redis state with what was held
        self._held.clear()

    async def nack(self, delivery: Ref, delay: float | None = None, error: str = "", *, timed_out: bool = False) -> str:
        """Offers the message again (see :meth:`rqueue.Consumer.nack`);
        returns "requeued" or "dead"."""
        tag = self._tag_of(delivery)
        delay_ms = None if delay is None else check.delay_ms(delay)
        event = self._nack_event(timed_out)
        return self._nacked(
            tag, await acmd.nack(await self._group_call(), tag, delay_ms, check.text("error", error), event)
        )

    nak = nack

    async def nack_available(
        self, deliveries: Iterable[Ref], delay: float | None = None, error: str = "", *, timed_out: bool = False
    ) -> list[str | RQueueError]:
        """See :meth:`rqueue.Consumer.nack_available`."""
        tags, lost = self._sendable(refs_of(deliveries))
        delay_ms = None if delay is None else check.delay_ms(delay)
        text, event = check.text("error", error), self._nack_event(timed_out)
        replies = await acmd.nack_many(await self._group_call(), tags, delay_ms, text, event) if tags else []
        return self._nack_each(tags, lost, replies)

    async def ack_result(self, delivery: Ref, value: bytes | None, event: bool) -> None:
        """See :meth:`rqueue.Consumer.ack_result`."""
        tag = self._tag_of(delivery)
        call = await self._group_call()
        keys, ttl_ms, values = self._results_of_one(tag, value)
        mark = self._watch.mark()
        await acmd.ack_results(call, [tag], keys, ttl_ms, values, event, strict=True)
        self._forget([tag], mark)

    async def ack_results(self, items: Iterable[tuple[Ref, bytes]], event: bool) -> list[RQueueError | None]:
        """See :meth:`rqueue.Consumer.ack_results`."""
        tags, keys, values, lost = self._results_to_send(list(items))
        mark = self._watch.mark()
        statuses: list[str] = []
        for a, b in commands.results_chunks(values):
            call, ttl_ms = await self._group_call(), self._result_ttl_ms()
            statuses += await acmd.ack_results(call, tags[a:b], keys[a:b], ttl_ms, values[a:b], event, False)
        return self._acked(tags, lost, statuses, mark)

    async def keep_failure(self, delivery: Delivery, reason: str, error: str) -> None:
        """See :meth:`rqueue.Consumer.keep_failure`."""
        ttl_ms = max(1, int(self._settings.result_ttl * 1000))
        failure = encode_failure(reason, error)
        await acmd.save_result(self.client.redis, self.queue.keys, delivery.seq, self.group, failure, ttl_ms)

    async def reject(self, delivery: Ref, requeue: bool = False, reason: str = "") -> None:
        """Dead-letters the message now; with ``requeue`` offers it again at once."""
        if check.flag("requeue", requeue):
            await self.nack(delivery, delay=0, error=reason)
            return
        await self._dead_letter(delivery, "rejected", reason)

    async def term(self, delivery: Ref, reason: str = "") -> None:
        """Dead-letters the message now, never to be retried."""
        await self._dead_letter(delivery, "terminated", reason)

    async def _dead_letter(self, delivery: Ref, reason: str, text: str) -> None:
        tag = self._tag_of(delivery)
        dseq = await acmd.reject(
            await self._group_call(), tag, reason, check.text("reason", text), self._reject_event(reason)
        )
        self._dead_lettered(tag, reason, dseq)

    async def in_progress(self, deliveries: Ref | Iterable[Ref]) -> int:
        """Extends the leases of deliveries to now + ack_wait; returns the
        new deadline (server ms) (see :meth:`rqueue.Consumer.in_progress`)."""
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        return self._extended(tags, await acmd.extend(await self._group_call(), tags))

    async def in_progress_available(self, deliveries: Iterable[Ref]) -> list[RQueueError | None]:
        """See :meth:`rqueue.Consumer.in_progress_available`."""
        tags, lost = self._sendable(refs_of(deliveries))
        if not tags:
            return list(lost)
        return self._extended_each(tags, lost, await acmd.extend(await self._group_call(), tags))

    async def close(self) -> int:
        """Leaves the group; every delivery still held goes back at once."""
        if self._closed or self.joins == 0:
            self._closed = True
            return 0
        reply = await acmd.leave(await self._group_call(), self.name, graceful=True)
        self._left()
        return reply.returned
