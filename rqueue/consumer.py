"""Consumers of a group: fetching, settling, and the deliveries they hold.
What a consumer decides without Redis is rqueue.consumer_core's (shared
with the asyncio consumer); this module is its I/O."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from . import validate as check
from .constants import IDLE_POLL_INTERVAL, MAX_FETCH
from .consumer_core import ConsumerCore, named_twice, refs_of
from .delivery import Delivery, DeliveryRef, HeartbeatResult
from .engine import commands, notify, store
from .errors import AlreadyAcked, NotMember, QueuePartitioned, RQueueError
from .ids import fetch_token
from .settings import Settings
from .stored_results import encode_failure

if TYPE_CHECKING:
    from .protocols import QueueLike

__all__ = ["Consumer", "refs_of"]

log = logging.getLogger("rqueue")


class Consumer(ConsumerCore):
    """A named member of a group. Obtain one with :meth:`rqueue.Queue.consumer`.

    Joins the group when created; :meth:`close` leaves it and returns every
    unacked delivery at once. Safe to share between threads.
    """

    queue: QueueLike

    def __init__(
        self, queue: QueueLike, group: str, name: str | None, overrides: dict[str, Any], liveness: float | None = None
    ) -> None:
        super().__init__(queue, group, name, overrides, liveness)
        self._join()

    def __repr__(self) -> str:
        return f"Consumer(queue={self.queue.name!r}, group={self.group!r}, name={self.name!r})"

    # -- plumbing -----------------------------------------------------------

    def settings(self) -> Settings:
        """The settings this consumer works with: stored patterns, then the
        overrides given when it was created."""
        return self._merge_settings(self.queue.settings())

    def _group_call(self) -> commands.GroupCall:
        settings = self.settings()

        def make() -> commands.GroupCall:
            queue, client = self.queue, self.client
            return commands.GroupCall.of(
                client.scripts, client.clock, client.randomness, queue.group_keys(self.group, settings),
                queue.name, queue.keys.base, self.group, self.name, settings,
            )  # fmt: skip

        call: commands.GroupCall = self._cached_call(settings, make)
        return call

    def _join(self) -> None:
        call = self._group_call()
        mark = self._watch.mark()
        try:
            reply = commands.join(call, self._liveness_ms(), self._watch.candidate)
        except QueuePartitioned as exc:
            if self.queue.partition is None:  # the client asks for the partitioned queue from now on
                self.client.partitioned_now(self.queue.root, exc.layout)
            raise
        self._joined(mark, reply)
        self.client.register(self.queue.name)

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
        in_redis = False  # this round's fetch waits in Redis for the queue's wake-up first
        # The channel is read before a fetch that a wait on it may follow.
        # One that may wait in Redis reads it only once it is not the
        # waiter, or when its client listens already: the first read
        # subscribes, and the notifier thread then wakes at every publish,
        # which the waiter's latency shows.
        read_channel = timeout > 0 and (
            not self._claims(self._group_call(), True) or self.client.notifier.listens(channel)
        )
        wait = 0.0
        while True:
            generation: int | None = None
            if in_redis:
                reply, deliveries = self._wait_then_fetch(n, wait)
            else:
                generation = self.client.notifier.generation(channel) if read_channel else None
                reply, mark = self._fetch_once(n, waits=timeout > 0)
                deliveries = self._received(reply, mark)
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
            self.client.notifier.wait(channel, generation, wait)

    def _fetch_once(self, n: int, waits: bool = False) -> tuple[commands.FetchReply, Any]:
        """A fetch's reply, and what the watch knew when it was sent;
        ``waits``: the caller waits for news if it brings nothing."""
        mark = self._watch.mark()
        try:
            call = self._group_call()
            return commands.fetch(call, n, fetch_token(self.client.randomness), waits=self._claims(call, waits)), mark
        except NotMember:
            # Removed as dead (e.g. after a long pause): what it held was
            # already offered again, so joining afresh loses nothing.
            log.warning("%r was not a member of its group any more; joining again", self)
            self._join()
            mark = self._watch.mark()
            call = self._group_call()
            return commands.fetch(call, n, fetch_token(self.client.randomness), waits=self._claims(call, waits)), mark

    def _wait_then_fetch(self, n: int, wait: float) -> tuple[commands.FetchReply, list[Delivery]]:
        """Waits up to ``wait`` seconds for the queue's wake-up, then
        fetches, in one round trip; the reply and its deliveries. When Redis
        refuses the wait, the fetch runs all the same; then, and when the
        wait shows that a message came without a wake-up, this consumer
        waits on the channel from then on."""
        mark = self._watch.mark()
        call, token = self._group_call(), fetch_token(self.client.randomness)
        block_ms = max(1, int(wait * 1000))
        since = self._wake_since
        try:
            woken = commands.wait_then_fetch(call, self.queue.keys.wakes, since, block_ms, n, token)
        except NotMember:
            reply, mark = self._fetch_once(n)  # it joins again
            return reply, self._received(reply, mark)
        self._wake_since = woken.since
        deliveries = self._received(woken.reply, mark)
        if self._judge_wait(woken, since, block_ms, deliveries):
            self._judge_silence(self._newest_wake(), since)
        return woken.reply, deliveries

    def _newest_wake(self) -> str | None:
        return notify.newest_wake(self.client.redis, self.queue.keys)

    def end_waits(self) -> None:
        """Ends the waits of every consumer of the queue waiting in Redis for
        its wake-up (this one's included) at once, as a publish would; each
        fetches once more. A stopping worker ends its own wait this way."""
        notify.wake_waiters(self.client.redis, self.queue.keys)

    def _received(self, reply: commands.FetchReply, mark: Any) -> list[Delivery]:
        """The deliveries of a fetch reply; its corrupt records (byte for
        byte) and expired messages are dead-lettered, and the rest of the
        batch goes on."""
        deliveries, aside = self._parse(reply, mark)
        if aside:
            try:
                items, keys, ttl_ms = self._aside_call(aside)
                self._set_aside_done(items, commands.set_aside(self._group_call(), items, keys, ttl_ms))
            except BaseException:
                self._unhold(deliveries)
                raise
        return deliveries

    # -- settling -----------------------------------------------------------

    def ack(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool = False) -> None:
        """Acks one delivery or a list of them in one round trip.

        All or nothing: if any tag is unknown, already acked or held by
        another consumer, a DeliveryError naming that tag is raised and no
        tag is acked (InvalidInput for a tag given twice). With
        ``multiple``, every delivery this consumer handed out before the
        given one (and still holds) is acked too. The list a large fetch
        returned, acked unchanged, goes as one range with no tag made per
        delivery: the fastest ack there is.
        """
        whole = self._whole_claim(deliveries, multiple)
        ranges = True
        if whole is not None:
            call = self._group_call()
            if not self._completed_on():
                mark = self._watch.mark()
                if commands.ack_run(call, whole.lo, whole.n, whole.token):
                    self._claim_acked(whole, mark)
                    return
                ranges = False  # refused: as triples, the error names the first bad tag
        tags = self._ack_tags(deliveries, multiple)
        if multiple:
            statuses = self.ack_available(self._earlier_refs(tags[0]))
            if statuses[-1] is not None:
                raise statuses[-1]
            return
        if not tags:
            return
        call = self._group_call()
        mark = self._watch.mark()
        try:
            if self._completed_on():
                commands.ack_completed(call, tags, strict=True)
            else:
                commands.ack(call, tags, strict=True, ranges=ranges)
        except AlreadyAcked as exc:
            raise named_twice(tags, exc) from None
        self._forget(tags, mark)

    def ack_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]:
        """Acks every delivery that can be acked, in one round trip; returns,
        per delivery, None or the DeliveryError that kept it from being acked.
        For runtimes that must not fail a whole batch for one stale tag."""
        tags, lost = self._sendable(refs_of(deliveries))
        if not tags:
            return list(lost)
        call = self._group_call()
        mark = self._watch.mark()
        if self._completed_on():
            return self._acked(tags, lost, commands.ack_completed(call, tags, strict=False), mark)
        return self._acked(tags, lost, commands.ack(call, tags, strict=False), mark)

    def ack_and_fetch(
        self, acks: Iterable[DeliveryRef], n: int, wait: float | None = None, may_wait: bool = False
    ) -> tuple[list[RQueueError | None], list[Delivery], float | None]:
        """Acks what can be acked (as :meth:`ack_available`) and claims up to
        ``n`` deliveries, both in one script call (one round trip). With
        completed events on, the acks go first, in a call of their own that
        records them, then the fetch: a fetch that fails then raises with the
        acks applied (sent again, they come back AlreadyAcked). Returns
        the ack statuses, the deliveries, and (when none came) the seconds
        until a waiting message falls due, or None.

        With ``wait`` (seconds), no acks and :meth:`waits_on_wakes`, the
        fetch first waits up to ``wait`` for the queue's wake-up (a publish
        after a fetch that found nothing), in the same round trip: an idle
        worker's fetch. With ``may_wait`` (or ``wait``) and no acks, the
        caller waits for news if this call brings nothing, so that the
        call may make this consumer the queue's waiter (the setting
        wait_in_redis)."""
        check.whole_number("n", n, 0)
        if wait is not None:
            check.seconds("wait", wait)
        refs = list(acks)
        if n == 0:
            return self.ack_available(refs), [], None
        if wait is not None and not refs and self.waits_on_wakes():
            reply, deliveries = self._wait_then_fetch(n, wait)
            return [], deliveries, self._due_in(reply, deliveries)
        if refs and self._completed_on():
            # fetch.lua's acks record no event: the acks go first, in a call
            # that records them, then the fetch (two round trips, only then;
            # decided by the settings this consumer last read)
            statuses = self.ack_available(refs)
            _, deliveries, due_in = self.ack_and_fetch([], n)
            return statuses, deliveries, due_in
        tags, lost = self._sendable(refs)
        mark = self._watch.mark()
        waits = not refs and (may_wait or wait is not None)
        try:
            call = self._group_call()
            reply = commands.fetch(call, n, fetch_token(self.client.randomness), tags, self._claims(call, waits))
        except NotMember:
            # Nothing was changed: join afresh (what this consumer held was
            # offered again; its late acks are still accepted for what nobody
            # else holds yet) and do both.
            log.warning("%r was not a member of its group any more; joining again", self)
            self._join()
            lenient = self.ack_available(refs) if refs else []
            mark = self._watch.mark()
            call = self._group_call()
            fetched = commands.fetch(call, n, fetch_token(self.client.randomness), waits=self._claims(call, waits))
            deliveries = self._received(fetched, mark)
            return lenient, deliveries, self._due_in(fetched, deliveries)
        statuses = self._fetched_acks(tags, lost, reply, mark)
        deliveries = self._received(reply, mark)
        return statuses, deliveries, self._due_in(reply, deliveries)

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
        return self._beaten(tags, lost, mark, commands.heartbeat(self._group_call(), timeout_ms, sync, tags))

    def rejoin(self, removal: NotMember | None = None) -> None:
        """Joins the group again after having been removed (``removal``:
        the NotMember that said so, as a partitioned consumer takes it)."""
        self._join()  # sees a loss of Redis state with what was held
        self._held.clear()

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
        event = self._nack_event(timed_out)
        return self._nacked(tag, commands.nack(self._group_call(), tag, delay_ms, check.text("error", error), event))

    nak = nack

    def nack_available(
        self,
        deliveries: Iterable[DeliveryRef],
        delay: float | None = None,
        error: str = "",
        *,
        timed_out: bool = False,
    ) -> list[str | RQueueError]:
        """Nacks every delivery that can be nacked, as :meth:`nack` does
        (the same delay, error and event for all), in one round trip;
        returns, per delivery, "requeued", "dead", or the DeliveryError that
        kept it from being nacked (as :meth:`ack_available` does for acks)."""
        tags, lost = self._sendable(refs_of(deliveries))
        delay_ms = None if delay is None else check.delay_ms(delay)
        text, event = check.text("error", error), self._nack_event(timed_out)
        replies = commands.nack_many(self._group_call(), tags, delay_ms, text, event) if tags else []
        return self._nack_each(tags, lost, replies)

    def ack_result(self, delivery: DeliveryRef, value: bytes | None, event: bool) -> None:
        """Acks one delivery as :meth:`ack` does and in the same call keeps
        ``value`` (rqueue.stored_results' encoding; None: none) for the
        result_ttl and, with ``event``, records a completed event."""
        tag = self._tag_of(delivery)
        keys, ttl_ms, values = self._results_of_one(tag, value)
        mark = self._watch.mark()
        commands.ack_results(self._group_call(), [tag], keys, ttl_ms, values, event, strict=True)
        self._forget([tag], mark)

    def ack_results(self, items: Iterable[tuple[DeliveryRef, bytes]], event: bool) -> list[RQueueError | None]:
        """Acks what can be acked of ``items`` (delivery, result) as
        :meth:`ack_available` does, in one round trip, and in the same call
        keeps the result of each one acked (as :meth:`ack_result`); returns,
        per item, None or the DeliveryError that kept it from being acked
        (its result not kept)."""
        tags, keys, values, lost = self._results_to_send(list(items))
        mark = self._watch.mark()
        statuses: list[str] = []
        for a, b in commands.results_chunks(values):
            call, ttl_ms = self._group_call(), self._result_ttl_ms()
            statuses += commands.ack_results(call, tags[a:b], keys[a:b], ttl_ms, values[a:b], event, False)
        return self._acked(tags, lost, statuses, mark)

    def keep_failure(self, delivery: Delivery, reason: str, error: str) -> None:
        """Keeps how the message of ``delivery`` failed for good as its result
        (sent after its settle: a crash in between loses the result, not the message)."""
        ttl_ms = max(1, int(self.settings().result_ttl * 1000))
        failure = encode_failure(reason, error)
        store.save_result(self.client.redis, self.queue.keys, delivery.seq, self.group, failure, ttl_ms)

    def reject(self, delivery: DeliveryRef, requeue: bool = False, reason: str = "") -> None:
        """Dead-letters the message now (RabbitMQ basic.reject); with
        ``requeue`` it is offered again at once instead."""
        if check.flag("requeue", requeue):
            self.nack(delivery, delay=0, error=reason)
            return
        self._dead_letter(delivery, "rejected", reason)

    def term(self, delivery: DeliveryRef, reason: str = "") -> None:
        """Dead-letters the message now, never to be retried; ``reason`` is
        kept in its x-rq-error header (JetStream's +TERM)."""
        self._dead_letter(delivery, "terminated", reason)

    def _dead_letter(self, delivery: DeliveryRef, reason: str, text: str) -> None:
        tag = self._tag_of(delivery)
        dseq = commands.reject(self._group_call(), tag, reason, check.text("reason", text), self._reject_event(reason))
        self._dead_lettered(tag, reason, dseq)

    def in_progress(self, deliveries: DeliveryRef | Iterable[DeliveryRef]) -> int:
        """Extends the leases of deliveries this consumer holds to now +
        ack_wait; returns the new deadline (server ms). Raises the
        DeliveryError of the first tag that could not be extended (the
        others are extended)."""
        tags = [self._tag_of(r) for r in refs_of(deliveries)]
        return self._extended(tags, commands.extend(self._group_call(), tags))

    def in_progress_available(self, deliveries: Iterable[DeliveryRef]) -> list[RQueueError | None]:
        """Extends the leases of the deliveries this consumer still holds to
        now + ack_wait, in one round trip; returns, per delivery, None or the
        DeliveryError that kept it from being extended (as
        :meth:`ack_available` does for acks)."""
        tags, lost = self._sendable(refs_of(deliveries))
        if not tags:
            return list(lost)
        return self._extended_each(tags, lost, commands.extend(self._group_call(), tags))

    # -- leaving ------------------------------------------------------------

    def close(self) -> int:
        """Leaves the group; every delivery still held goes back at once,
        ahead of new messages. Returns how many went back."""
        if self._closed:
            return 0
        reply = commands.leave(self._group_call(), self.name, graceful=True)
        self._left()
        return reply.returned

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
