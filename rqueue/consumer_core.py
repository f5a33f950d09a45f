"""What a consumer of a group knows and decides without Redis: its name and
settings, the deliveries it holds, what it saw of the queue's state
(rqueue.statewatch), how a fetch reply becomes deliveries, and how the
replies of its settles change what it holds. The sync consumer
(rqueue.consumer) and the asyncio one (rqueue.aio.consumer) are this core
plus their I/O, so that the two cannot drift apart.

Long because every decision the two consumers share stays in this one
place: split up, each half would need the other's state."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from operator import itemgetter
from typing import TYPE_CHECKING, Any, NamedTuple

from . import validate as check
from .delivery import REPLAYED_HEADER, TTL_HEADER, Delivery, DeliveryRef, HeartbeatResult
from .engine import commands
from .engine.record import COMPACT_HEAD, COMPACT_TAG, decode_record, not_before
from .errors import (
    SETTLED_BEFORE_LOSS,
    AlreadyAcked,
    CorruptRecord,
    DeliveryError,
    InvalidInput,
    LostDelivery,
    NotHeld,
    NotMember,
    RQueueError,
    StateLost,
    delivery_error,
)
from .events import EventKind
from .ids import consumer_name, delivery_tag, parse_delivery_tag
from .names import check_name
from .settings import Settings, validate
from .statewatch import Mark, StateWatch

if TYPE_CHECKING:
    from .engine.keys import QueueKeys
    from .randomness import Randomness

log = logging.getLogger("rqueue")

COMPACT_BYTE = COMPACT_TAG[0]  # a compact record's first byte, as an int: record[0] makes no slice


class ConsumerCore:
    """The state of one member of a group, and the bookkeeping around its
    calls. ``delivery_class`` is the Delivery type its fetches make."""

    delivery_class: type[Delivery] = Delivery

    def __init__(
        self,
        queue: Any,
        group: str,
        name: str | None,
        overrides: dict[str, Any],
        liveness: float | None,
        record: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self.queue = queue
        self.client = queue.client
        self.group = check_name("group", group)
        randomness: Randomness = self.client.randomness
        self.name = check_name("consumer", name) if name is not None else consumer_name(randomness)
        self.overrides = validate(overrides)
        self.liveness = check.positive_seconds("liveness", liveness) if liveness is not None else None
        self._call_for: tuple[Settings | None, Any] = (None, None)
        self._held: dict[int, Delivery] = {}
        # The last fetch's deliveries when they are one claim's whole run
        # (first deliveries of seqs lo.., one call, none set aside), with a
        # copy of the list returned and the epoch it was fetched in. An ack
        # of that list as it was returned goes as one range, with no tag made
        # per delivery (:meth:`_whole_claim`).
        self._claimed: tuple[Claimed, list[Delivery], int] | None = None
        self._closed = False
        self._settings_seen: Settings | None = None
        self._settings: Settings = Settings()
        # How many times this consumer has joined its group: a worker compares
        # it around a call to learn that the group had removed it meanwhile.
        self.joins = 0
        # The last entry of the queue's wake stream this consumer saw, and
        # whether it waits on that stream (engine.commands.wait_then_fetch)
        # rather than on the notifier's channel: not on a cluster, nor after
        # Redis refused the wait.
        self._wake_since = commands.WAKE_ANY
        self._wakes_on = True
        # Its last fetch handed out nothing and made it the queue's waiter:
        # the one idle consumer that waits in Redis (lua/fetch.lua).
        self._waiter = False
        # When (server ms) its last fetch handed out nothing: when that fetch
        # made it the waiter, the next publish was to add a wake-up.
        self._found_nothing_at: int | None = None
        # The losses of the queue's state it had seen then (state_epoch).
        self._found_nothing_epoch = 0
        keys: QueueKeys = queue.keys
        # What it saw of the queue's state in Redis (statewatch.py): a loss
        # drops every delivery it holds.
        self._watch = StateWatch(
            queue.name,
            keys,
            self.client.redis,
            randomness,
            f"consumer {self.name} of group {self.group}",
            self.group,
            self._drop_held,
            record,
        )

    # -- settings -------------------------------------------------------------

    def _merge_settings(self, resolved: Settings) -> Settings:
        """The queue's settings ``resolved`` with this consumer's overrides
        (merged once per settings object)."""
        if resolved is not self._settings_seen:
            self._settings_seen = resolved
            self._settings = resolved.merged(self.overrides) if self.overrides else resolved
        return self._settings

    @property
    def last_settings(self) -> Settings:
        """The settings of this consumer's last call, read without asking
        Redis (a worker's heartbeat runs on them while Redis is away)."""
        return self._settings

    def _liveness_ms(self) -> int:
        liveness = self.liveness if self.liveness is not None else self._settings.ack_wait
        return int(liveness * 1000)

    def _cached_call(self, settings: Settings, make: Callable[[], Any]) -> Any:
        """The engine's view of this consumer under ``settings``, made once
        per settings object (the KEYS follow the settings, as the
        dead_letter setting may name another queue)."""
        if self._closed:
            raise RQueueError(f"{self!r} is closed")
        seen, call = self._call_for
        if seen is not settings or call is None:
            made = make()
            if call is not None and call.flow[0]:
                # fetch.lua said the queue needs every key (it had priority or
                # keyed messages): so it does under new settings too, rather
                # than a refused call first (settings_ttl=0: every fetch)
                made.flow[0] = True
            if call is not None and made.ack_keys == call.ack_keys:
                # the calls fetched under the old settings are acked as
                # ranges under the new (the same group keys and consumer)
                made.spans.carry(call.spans)
                made.guess.carry(call.guess)
            call = made
            self._call_for = (settings, call)
        return call

    # -- the state watch ----------------------------------------------------------

    @property
    def state_epoch(self) -> int:
        """How many losses of the queue's state in Redis this consumer has
        seen: a delivery made before the last one cannot be settled
        (LostDelivery), and a worker drops it unrun."""
        return self._watch.epoch

    def epoch_for(self, delivery: Delivery) -> int:
        """The state epoch a delivery of this consumer is judged by (its
        ``epoch`` is current when equal): this consumer's."""
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

    def join_marks(self) -> tuple[int, ...]:
        """How many times this member joined (see :meth:`rejoined_since`)."""
        return (self.joins,)

    def rejoined_since(self, marks: Sequence[int]) -> Callable[[Delivery], bool] | None:
        """Which deliveries a removal since ``marks`` took back: every one
        when this member joined again since (a fetch found it removed),
        else None."""
        return every_delivery if self.joins != marks[0] else None

    def removed_by(self, removal: NotMember) -> Callable[[Delivery], bool]:
        """Which deliveries the removal a heartbeat raised took back: every one."""
        return every_delivery

    def _drop_held(self) -> int:
        """Forgets every delivery held (Redis lost the state they were
        made in); how many."""
        dropped = len(self._held)
        self._held.clear()
        self._claimed = None
        call = self._call_for[1]
        if call is not None:
            call.spans.clear()  # calls made before the loss: no hint for a range
        return dropped

    def _joined(self, mark: Mark, reply: commands.JoinReply) -> None:
        self._watch.saw(mark, reply.incarnation)
        self.joins += 1

    # -- fetch replies ------------------------------------------------------------

    def _parse(self, reply: commands.FetchReply, mark: Mark) -> tuple[list[Delivery], list[tuple[str, str, str]]]:
        """The deliveries of a fetch sent at ``mark`` (now held), and the
        (tag, reason, why) of each one set aside for the caller to move to
        the dead-letter queue: a corrupt record (byte for byte), a message
        past its time to live ("expired": never handed to a handler), or one
        its group settled before Redis lost acks ("settled-before-loss":
        statewatch.py)."""
        # Per message on the hot path: no helper calls for a compact record
        # (no headers, no delay: the common case); anything else goes to
        # decode_record.
        self._claimed = None
        seen = self._watch.epoch
        epoch = self._watch.saw(
            mark, reply.incarnation, reply.last_seq, floor=(reply.generation, reply.floor, reply.now_ms)
        )
        if reply.call is not None and epoch is not None and epoch != seen:
            # the loss this reply showed forgot its call too (_drop_held),
            # which was made after it
            self._call_for[1].spans.note(reply.token, reply.call)
        self._waiter = reply.waiter
        if len(reply.raw) == reply.first:
            self._found_nothing_at, self._found_nothing_epoch = reply.now_ms, self._watch.epoch
        if epoch is None:
            # Sent before a loss this consumer saw meanwhile: what it brought
            # may be from before the loss, so none of it runs; its leases run
            # out (or a worker hands them back) and the messages that still
            # exist are offered again.
            if len(reply.raw) > reply.first:
                count = (len(reply.raw) - reply.first) // 3
                log.warning("%r dropped %d deliveries fetched across a loss of Redis state", self, count)
            return [], []
        raw, first, token = reply.raw, reply.first, reply.token
        aside: list[tuple[str, str, str]] = []
        settled = self._watch.settled
        if settled[0] and len(raw) > first:
            raw, first = self._set_aside_settled(reply, aside, *settled)
        if self._watch.remembers_acks() and len(raw) > first:
            raw, first = self._set_aside_acked(reply, mark, epoch, aside, raw, first)
        deadline = reply.now_ms + int(round(self._settings.ack_wait * 1000))
        held = self._held
        out: list[Delivery] = []
        now = reply.now_ms
        ttl = self._settings.ttl
        # Published at or before this: past the queue's ttl (a header's own is read per message).
        stale = now - max(1, round(ttl * 1000)) if ttl is not None else -1
        new = Delivery.__new__
        cls = self.delivery_class
        from_bytes = int.from_bytes
        # The triples read off one iterator; strict: a reply cut inside a
        # triple raises rather than losing its last delivery unsaid.
        triples = islice(raw, first, None)
        for seq, count, record in zip(triples, triples, triples, strict=True):
            if type(seq) is not int:
                seq = int(seq)
            replayed = None
            if type(count) is not int:
                count, replayed = commands.delivery_count(count)
            headers: dict[str, str]
            if type(record) is tuple:
                # a stream log's claimed entry (engine.record.SplitRecord)
                published, data = record
                headers = {}
            elif len(record) >= COMPACT_HEAD and record[0] == COMPACT_BYTE:
                # from_bytes's byteorder is "big" unless told: one argument
                # less to parse per message
                published, headers, data = from_bytes(record[1:COMPACT_HEAD]), {}, record[COMPACT_HEAD:]
            else:
                where = f"{self.queue.keys.msgs}[{seq}]"
                try:
                    published, headers, data = decode_record(record, where)
                    # A delayed message before its time: a claim took it
                    # (lua/fetch.lua), which only a schedule that lacked its
                    # seq (deleted, edited) lets happen, or its call ran out
                    # (a client that died before it set it aside) and it
                    # came again. set_aside puts it back to wait, unrun.
                    due = not_before(record, where)
                    if due is not None and due > now:
                        aside.append((delivery_tag(seq, count, token), NOT_DUE, str(due)))
                        continue
                except CorruptRecord as exc:
                    if seq in reply.missing:
                        # Claimed by the fetch, and its entry was not in the
                        # log when the client read it (commands.fill_claimed):
                        # deleted, or settled by another consumer meanwhile
                        # and trimmed. set_aside tells which; _set_aside_done
                        # logs what it did.
                        why = f"record of seq {seq} is missing from {self.queue.keys.msgs}"
                        aside.append((delivery_tag(seq, count, token), MISSING_RECORD, why))
                        continue
                    log.error("%s; moving it to the dead-letter queue", exc)
                    aside.append((delivery_tag(seq, count, token), "corrupted-record", str(exc)))
                    continue
                if TTL_HEADER in headers:
                    expired = expiry(headers[TTL_HEADER], published, now)
                    if expired is not None:
                        aside.append((delivery_tag(seq, count, token), "expired", expired))
                        continue
            if published <= stale and TTL_HEADER not in headers:
                aside.append((delivery_tag(seq, count, token), "expired", f"its time to live of {ttl} s ran out"))
                continue
            d = new(cls)
            d.consumer = self  # type: ignore[assignment]  # each consumer class settles its own deliveries
            d.seq = seq
            d.delivery_count = count
            d.data = data
            d.headers = headers
            d.published_ms = published
            d.deadline_ms = deadline
            d.token = token
            d._tag = None  # made when first read: an ack names a delivery by seq, count and token
            d.epoch = epoch
            d.replayed = replayed is not None
            if replayed is not None:
                d.headers = {**headers, REPLAYED_HEADER: str(replayed)}
            held[seq] = d
            out.append(d)
        claim = reply.claim
        if claim is not None and not aside and claim[0] == first and len(raw) == first + 3 * len(out):
            _, lo, hi = claim
            if len(out) == hi - lo + 1:
                self._claimed = (Claimed(out, lo, len(out), token), out[:], epoch)
        return out, aside

    def _set_aside_settled(
        self, reply: commands.FetchReply, aside: list[tuple[str, str, str]], settled_up_to: int, before_ms: int
    ) -> tuple[list[Any], int]:
        """The deliveries of ``reply`` (its raw list and where they start)
        without those of seqs at or below ``settled_up_to`` published at or
        before ``before_ms``, which the group settled before Redis lost
        acks: their tags go to ``aside``, to the dead-letter queue unrun,
        before anything else is judged of them. Acked or dead-lettered
        before, the floor does not say which, and a dead letter the loss
        took is kept so. A message published later took a seq the loss gave
        back: it runs. So does a replayed dead letter: an operator asked for
        it. A record that does not parse is left to the checks after."""
        raw, first = reply.raw, reply.first
        why = (
            f"group {self.group!r} had settled it (its ack floor had reached {settled_up_to}) before Redis lost "
            "acks: not run again; replay it to run it"
        )
        kept = _settled_aside(
            reply, raw, first, aside, why, lambda seq, rec: seq <= settled_up_to and _published_ms(rec) <= before_ms
        )
        if len(kept) < len(raw):
            log.warning(
                "%r dead-letters %d deliveries, unrun, of messages its group settled before Redis lost acks "
                "(seqs up to %d; reason %s)",
                self,
                (len(raw) - len(kept)) // 3,
                settled_up_to,
                SETTLED_BEFORE_LOSS,
            )
        return kept, first

    def _set_aside_acked(
        self,
        reply: commands.FetchReply,
        mark: Mark,
        epoch: int,
        aside: list[tuple[str, str, str]],
        raw: list[Any],
        first: int,
    ) -> tuple[list[Any], int]:
        """The deliveries ``raw[first:]`` of ``reply`` (a fetch sent at
        ``mark``, of the watch's ``epoch``) without those of seqs whose acks this consumer had seen
        confirmed above the group's floor before (statewatch.py): Redis lost
        those acks (reported by the watch). Their tags go to ``aside``, to
        the dead-letter queue unrun. A replayed dead letter runs: an operator
        asked for it."""
        if not self._watch.acked_among([int(raw[i]) for i in range(first, len(raw), 3)]):
            return raw, first
        seqs = [int(raw[i]) for i in range(first, len(raw), 3) if commands.delivery_count(raw[i + 1])[1] is None]
        found = self._watch.acks_lost(mark, epoch, reply.generation, reply.floor, seqs)
        if not found:
            return raw, first
        why = (
            f"{self!r} had seen its ack confirmed (above the ack floor of group {self.group!r}) before Redis lost "
            "it: not run again; replay it to run it"
        )
        kept = _settled_aside(reply, raw, first, aside, why, lambda seq, rec: seq in found)
        log.warning(
            "%r dead-letters %d deliveries, unrun, of messages it had seen acked before Redis lost the acks "
            "(seqs %s; reason %s)",
            self,
            len(found),
            sorted(found)[:10],
            SETTLED_BEFORE_LOSS,
        )
        return kept, first

    def _fetched_acks(
        self, tags: Sequence[commands.Tag], lost: list[RQueueError | None], reply: commands.FetchReply, mark: Mark
    ) -> list[RQueueError | None]:
        """Per ack ref of an ack_and_fetch sent at ``mark``, its
        LostDelivery or its status; the watch remembers the acks confirmed
        above the floor the reply reports."""
        self._release(tags)
        acked = reply.ack_statuses
        statuses: list[RQueueError | None]
        if len(acked) == len(tags) and acked.count("ok") == len(acked):
            statuses = [None] * len(tags)  # every ack went through: no status to look at one by one
        else:
            statuses = [
                None if status == "ok" else delivery_error(status, tag_text(t))
                for t, status in zip(tags, acked, strict=True)
            ]
        floor = reply.floor
        # acks in order: absorbed by the floor, nothing to remember
        if tags and max(map(itemgetter(1), tags)) > floor:
            confirmed = [t[1] for t, status in zip(tags, statuses, strict=True) if status is None]
            self._watch.acked(mark, confirmed, reply.generation, floor)
        return merged(lost, statuses)

    def _judge_wait(self, woken: commands.WokenFetch, since: str, block_ms: int, deliveries: list[Delivery]) -> bool:
        """After a wait in Redis for the queue's wake-up (``since`` the last
        one seen, ``block_ms`` long): this consumer waits on the channel from
        then on when Redis refused the wait. True when the wait ran out and
        the fetch after it brought a message first published after the fetch
        that found nothing: the caller then reads the wake stream's newest
        entry and hands it to :meth:`_judge_silence`."""
        if woken.refused:
            log.warning(
                "XREAD on %s refused (%s): %r waits on the wake-up channel instead (docs/ACL.md)",
                self.queue.keys.wakes,
                woken.refused,
                self,
            )
            self._wait_on_the_channel()
            return False
        if woken.since != since or not deliveries:
            return False
        if self._watch.epoch != self._found_nothing_epoch:
            # Redis lost the queue's state since the fetch that marked it:
            # the mark went with it, so no publish since was to add a
            # wake-up; the next fetch that finds nothing marks it again.
            return False
        # Published after the fetch that found nothing (that marked the
        # queue), else after the wait began.
        began = self._found_nothing_at or woken.reply.now_ms - block_ms
        return any(d.delivery_count == 1 and d.published_ms > began for d in deliveries)

    def _judge_silence(self, newest: str | None, since: str) -> None:
        """After a wait that ran out while a message came (:meth:`_judge_wait`),
        ``newest`` the id of the wake stream's newest entry (None: none, or
        unread). An entry after ``since`` is the message's wake-up, added as
        the wait gave up (memory://'s blocking read reports a timeout when an
        entry lands while it takes its lock back): the next wait looks past
        it. Else the message came without a wake-up, as one from a publisher
        of an rqueue that adds none (docs/upgrading.md) does; its publishes
        are announced on the channel, where this consumer waits from then on."""
        if newest is not None and commands.wake_id_after(newest, since):
            self._wake_since = newest
            return
        log.warning(
            "a message came to %s without a wake-up (a publisher of an older rqueue, or Redis over maxmemory?): "
            "%r waits on the wake-up channel instead (docs/upgrading.md)",
            self.queue.name,
            self,
        )
        self._wait_on_the_channel()

    def waits_on_wakes(self) -> bool:
        """True when an idle fetch waits in Redis for the queue's wake-up
        (``fetch`` with a timeout, ``ack_and_fetch`` with a wait): its last
        fetch found nothing and made it the queue's waiter, the one consumer
        of the queue that waits so (lua/fetch.lua). Only a fetch sent to
        claim the role can (:meth:`_claims`); False when it waits on the
        channel."""
        return self._waiter

    def _claims(self, call: commands.GroupArgs, waits: bool) -> bool:
        """A fetch with ``call`` whose caller ``waits`` for news if it brings
        nothing asks for the waiter role: the setting wait_in_redis and a
        client that can wait in Redis (``call.marks``), and no turn to the
        channel since."""
        return waits and call.marks and self._wakes_on

    def _wait_on_the_channel(self) -> None:
        """From now on this consumer waits on the channel when idle, and its
        fetches claim no waiter role (:meth:`_claims`)."""
        self._wakes_on = self._waiter = False

    @staticmethod
    def _due_in(reply: commands.FetchReply, deliveries: Sequence[Delivery]) -> float | None:
        """Seconds until a waiting message falls due, when a fetch brought
        none; 0 when it handed out messages that were all set aside (the
        next fetch may find more at once)."""
        if deliveries:
            return None
        if len(reply.raw) > reply.first:
            return 0.0
        if reply.next_due_ms is None:
            return None
        return max(0.0, (reply.next_due_ms - reply.now_ms) / 1000)

    @staticmethod
    def _fetch_wait(reply: commands.FetchReply, wait: float) -> float:
        """How long an empty fetch waits before it asks again: at most
        ``wait``, and no longer than until a waiting message falls due."""
        if reply.next_due_ms is not None:
            return min(wait, max(0.001, (reply.next_due_ms - reply.now_ms) / 1000))
        return wait

    # -- tags and settles -----------------------------------------------------------

    def _tag_of(self, ref: DeliveryRef) -> commands.Tag:
        if isinstance(ref, Delivery):
            if ref.consumer is not self:  # type: ignore[comparison-overlap]  # any consumer class
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

    def _sendable(self, refs: Iterable[DeliveryRef]) -> tuple[list[commands.Tag], list[RQueueError | None]]:
        """The tags of ``refs`` to send, and per ref the DeliveryError that
        keeps it from being sent (LostDelivery, or NotHeld for another
        consumer's delivery) or None (sent)."""
        tags: list[commands.Tag] = []
        lost: list[RQueueError | None] = []
        epoch = self._watch.epoch
        cls = self.delivery_class
        for ref in refs:
            if type(ref) is cls and ref.consumer is self and ref.epoch == epoch:  # type: ignore[comparison-overlap]
                # :meth:`_tag_of` of a delivery this consumer made since its
                # last loss, inline: a worker acks every message so. Its text
                # is left out (tag_text makes it where an error needs it).
                tags.append(("", ref.seq, ref.delivery_count, ref.token))
                lost.append(None)
                continue
            try:
                tags.append(self._tag_of(ref))
                lost.append(None)
            except DeliveryError as exc:
                lost.append(exc)
        return tags, lost

    def _ack_tags(self, deliveries: DeliveryRef | Iterable[DeliveryRef], multiple: bool) -> list[commands.Tag]:
        """The tags an ack sends (checked before anything is sent); with
        ``multiple`` the one named (the caller acks the earlier ones too:
        :meth:`_earlier_refs`)."""
        tags: list[commands.Tag] = []
        epoch = self._watch.epoch
        cls = self.delivery_class
        for ref in refs_of(deliveries):
            if type(ref) is cls and ref.consumer is self and ref.epoch == epoch:  # type: ignore[comparison-overlap]
                # :meth:`_tag_of` of a delivery this consumer made since its
                # last loss, inline: the ack of a fetched batch takes this path.
                tags.append(("", ref.seq, ref.delivery_count, ref.token))
            else:
                tags.append(self._tag_of(ref))
        if multiple and len(tags) != 1:
            raise InvalidInput("multiple=True takes exactly one delivery: the last one to ack")
        return tags

    def _whole_claim(self, deliveries: object, multiple: bool) -> Claimed | None:
        """The claim (its list, first seq, count and token) when a strict
        ack of ``deliveries`` (without ``multiple``) is of the list the last
        fetch returned, unchanged, and that list is one claim's whole run of
        first deliveries (:attr:`_claimed`); None otherwise. Either way the
        claim is forgotten: a list is acked once, and no batch is kept alive
        past the next ack."""
        claimed, self._claimed = self._claimed, None
        if claimed is None or deliveries is not claimed[0].deliveries or multiple:
            return None
        claim, copy, epoch = claimed
        # One comparison of the elements, by identity: the caller may have
        # changed the list since.
        if epoch != self._watch.epoch or claim.deliveries != copy:
            return None
        return claim

    def _claim_acked(self, claim: Claimed, mark: Mark) -> None:
        """Forgets a whole claim acked by :func:`commands.ack_run`, sent at
        ``mark`` (the watch remembers its seqs as an ack's)."""
        self._unhold(claim.deliveries)
        self._watch.acked(mark, range(claim.lo, claim.lo + claim.n))

    def _earlier_refs(self, named: commands.Tag) -> list[DeliveryRef]:
        """The refs an ack with multiple=True acks leniently: every delivery
        held up to ``named`` (earlier ones that moved on meanwhile are
        skipped; only the named one must be ackable), ``named`` last."""
        return [*(d.tag for d in self._held_up_to(named)), tag_text(named)]

    def _held_up_to(self, last: commands.Tag) -> list[Delivery]:
        """The deliveries held before the one of tag ``last``, in the order
        they were handed out; none when ``last`` is not held."""
        held = self._held
        if self._held_as(last) is None:
            return []
        out = []
        for d in held.values():
            if d.seq == last[1]:
                break
            out.append(d)
        return out

    def _held_as(self, tag: commands.Tag) -> Delivery | None:
        """The delivery held of ``tag``: None when this consumer holds none,
        or holds another delivery of that seq."""
        d = self._held.get(tag[1])
        if d is None or d.delivery_count != tag[2] or d.token != tag[3]:
            return None
        return d

    def _release(self, tags: Iterable[commands.Tag]) -> None:
        """Forgets the deliveries of ``tags``: settled, or no longer this
        consumer's. Held is keyed by seq; a later delivery of the same seq
        stays held."""
        held = self._held
        get = held.get
        for _, seq, count, token in tags:
            d = get(seq)
            if d is not None and d.delivery_count == count and d.token == token:
                del held[seq]

    def _results_to_send(
        self, items: Sequence[tuple[DeliveryRef, bytes]]
    ) -> tuple[list[commands.Tag], list[str], list[bytes], list[RQueueError | None]]:
        """What an ack keeping results sends (the tags, their result keys and
        results), and per item its LostDelivery (not sent) or None (sent)."""
        tags, lost = self._sendable(ref for ref, _ in items)
        values = [value for (_, value), err in zip(items, lost, strict=True) if err is None]
        keys = [self.queue.keys.result(seq, self.group) for _, seq, _, _ in tags]
        return tags, keys, values, lost

    def _result_ttl_ms(self) -> int:
        return max(1, int(self._settings.result_ttl * 1000))

    def _results_of_one(self, tag: commands.Tag, value: bytes | None) -> tuple[list[str], int | None, list[bytes]]:
        """What an ack_result of ``tag`` keeping ``value`` (None: none)
        sends: the result keys, the time to live and the results."""
        if value is None:
            return [], None, []
        return [self.queue.keys.result(tag[1], self.group)], self._result_ttl_ms(), [value]

    def _forget(self, tags: Sequence[commands.Tag], mark: Mark | None = None) -> None:
        """Forgets the deliveries of ``tags``, acked by a call sent at
        ``mark`` (the watch remembers those above the floor it knows)."""
        self._release(tags)
        if mark is not None:
            self._watch.acked(mark, list(map(itemgetter(1), tags)))

    def _acked(
        self,
        tags: Sequence[commands.Tag],
        lost: list[RQueueError | None],
        statuses: Sequence[str],
        mark: Mark | None = None,
    ) -> list[RQueueError | None]:
        """Per ref of an ack_available sent at ``mark``, its LostDelivery or
        the error of its status."""
        self._forget(tags)
        errors = [
            None if status == "ok" else delivery_error(status, tag_text(t))
            for t, status in zip(tags, statuses, strict=True)
        ]
        if mark is not None:
            self._watch.acked(mark, [t[1] for t, err in zip(tags, errors, strict=True) if err is None])
        return merged(lost, errors)

    def _beaten(
        self, tags: Sequence[commands.Tag], lost: list[RQueueError | None], mark: Mark, reply: commands.HeartbeatReply
    ) -> HeartbeatResult:
        """What a heartbeat sent at ``mark`` did."""
        self._watch.saw(mark, reply.incarnation)
        statuses: list[RQueueError | None] = []
        for t, status in zip(tags, reply.statuses, strict=True):
            err = None if status == "ok" else delivery_error(status, tag_text(t))
            held = self._held_as(t)
            if err is None and held is not None:
                held.deadline_ms = reply.deadline_ms
            statuses.append(err)
        return HeartbeatResult(
            merged(lost, statuses), reply.removed, reply.returned, reply.dead_lettered, reply.handed_back
        )

    def _extended(self, tags: Sequence[commands.Tag], reply: commands.ExtendReply) -> int:
        """The new deadline of an in_progress; raises the DeliveryError of
        the first tag that could not be extended (the others are)."""
        for err in self._extended_each(tags, [None] * len(tags), reply):
            if err is not None:
                raise err
        return reply.deadline_ms

    def _extended_each(
        self, tags: Sequence[commands.Tag], lost: list[RQueueError | None], reply: commands.ExtendReply
    ) -> list[RQueueError | None]:
        """Per ref of an extend, its LostDelivery (not sent), the error of
        its tag, or None (extended: its held deadline moves)."""
        statuses: list[RQueueError | None] = []
        for t, status in zip(tags, reply.statuses, strict=True):
            err = None if status == "ok" else delivery_error(status, tag_text(t))
            held = self._held_as(t)
            if err is None and held is not None:
                held.deadline_ms = reply.deadline_ms
            statuses.append(err)
        return merged(lost, statuses)

    def _aside_call(
        self, aside: Sequence[tuple[str, str, str]]
    ) -> tuple[list[commands.AsideTag], list[str], int | None]:
        """What set_aside is sent for the (tag, reason, text) of :meth:`_parse`:
        its items, result keys and result time to live. A queue that keeps
        results keeps each one's failure, so that a caller waiting for its
        result learns why it never ran (docs/results.md)."""
        items = [
            (self._tag_of(ref), reason, check.text("reason", text), self._reject_event(reason))
            for ref, reason, text in aside
        ]
        if not self._settings.results:
            return items, [], None
        return items, [self.queue.keys.result(tag[1], self.group) for tag, *_ in items], self._result_ttl_ms()

    def _unhold(self, deliveries: Sequence[Delivery]) -> None:
        """Forgets ``deliveries`` that this consumer holds (each by identity:
        a later delivery of the same seq stays held): a whole claim acked, or
        the deliveries of a fetch that raised before it returned them. Those
        no caller has, so no settle of this consumer may name them (an ack
        with ``multiple`` would ack them unrun); Redis holds them until their
        leases run out, and then offers them again."""
        held = self._held
        for d in deliveries:
            if held.get(d.seq) is d:
                del held[d.seq]

    def _set_aside_done(self, items: Sequence[commands.AsideTag], results: Sequence[int | str]) -> None:
        """Forgets what set_aside dead-lettered, and logs what it put back to
        wait (a delivery handed out before its time). A tag it refused was settled
        or taken back meanwhile, so nothing is left to do for it; one whose
        delivery state is damaged costs only itself: its lease runs out and
        a fetch dead-letters it (corrupted-state), while the rest of the
        batch goes on."""
        for (tag, reason, text, _), result in zip(items, results, strict=True):
            if result == "deferred":
                log.error(
                    "%s was handed out before its time (%s ms), not run: the queue's schedule (%s) lacked it; "
                    "it waits in the group's delay set until then",
                    tag_text(tag),
                    text,
                    self.queue.keys.sched,
                )
                continue
            if type(result) is int:
                if reason == MISSING_RECORD:
                    log.error("%s; moved it to the dead-letter queue", text)
                self._dead_lettered(tag, reason, result)
                continue
            err = delivery_error(str(result), tag_text(tag))
            if isinstance(err, DeliveryError):
                log.info("%s of %s not set aside: %s", reason, tag_text(tag), err)
            else:
                log.error("%s of %s not set aside: %s", reason, tag_text(tag), err)

    def _completed_on(self) -> bool:
        """Whether the events setting asks for completed events: then acks
        go through ack_result.lua, which records them (the acks of a queue
        without them stay as they are: ack.lua, or riding on the next fetch)."""
        return EventKind.COMPLETED.value in self._settings.events

    def _nack_event(self, timed_out: bool) -> str:
        """The lifecycle event a nack records: timeout or failed, when the
        events setting asks for that kind ("" records none)."""
        kind = EventKind.TIMEOUT.value if timed_out else EventKind.FAILED.value
        return kind if kind in self._settings.events else ""

    def _reject_event(self, reason: str = "") -> str:
        """The lifecycle event a dead-lettering for ``reason`` records (see
        _nack_event): expired for a message past its time to live, else failed."""
        if reason == NOT_DUE:
            return ""  # not dead-lettered: set_aside records a corrupt event of its own
        kind = EventKind.EXPIRED.value if reason == "expired" else EventKind.FAILED.value
        return kind if kind in self._settings.events else ""

    def _nacked(self, tag: commands.Tag, reply: commands.NackReply) -> str:
        self._release((tag,))
        if reply.dead and reply.where == 0:
            self._log_drop(tag[1], "max-deliveries")
        return "dead" if reply.dead else "requeued"

    def _nack_each(
        self,
        tags: Sequence[commands.Tag],
        lost: list[RQueueError | None],
        replies: Sequence[commands.NackReply | str],
    ) -> list[str | RQueueError]:
        """Per ref of a nack_available, its LostDelivery (not sent), "requeued"
        or "dead", or the error of its tag."""
        sent = iter([self._nack_status(tag, reply) for tag, reply in zip(tags, replies, strict=True)])
        return [exc if exc is not None else next(sent) for exc in lost]

    def _nack_status(self, tag: commands.Tag, reply: commands.NackReply | str) -> str | RQueueError:
        if isinstance(reply, commands.NackReply):
            return self._nacked(tag, reply)
        err = delivery_error(reply, tag_text(tag))
        assert err is not None, "a refused tag's status is an error code"
        return err

    def _dead_lettered(self, tag: commands.Tag, reason: str, dead_letter_seq: int) -> None:
        self._release((tag,))
        if dead_letter_seq == 0:
            self._log_drop(tag[1], reason)

    def _log_drop(self, seq: int, reason: str) -> None:
        log.warning(
            "message %s/%d dropped by group %s (%s): dead_letter is none", self.queue.name, seq, self.group, reason
        )

    def _left(self) -> None:
        self._closed = True
        self._held.clear()


class Claimed(NamedTuple):
    """A fetch's whole claim, as an ack of it sends it (ConsumerCore._whole_claim)."""

    deliveries: list[Delivery]  # the list the fetch returned
    lo: int  # the first seq
    n: int  # how many: seqs lo to lo + n - 1, each a first delivery
    token: str  # the fetch's


def named_twice(tags: Sequence[commands.Tag], exc: AlreadyAcked) -> RQueueError:
    """What a strict ack of ``tags`` refused with ``exc`` raises: InvalidInput
    when the tag it names stands twice in the list (whether its first
    place or an earlier call settled it: nothing of this call was acked),
    else ``exc``. Judged on the refusal alone, so an ack that passes pays
    nothing for it."""
    twice = [t for t in tags if tag_text(t) == exc.tag]
    if len(twice) < 2:
        return exc
    return InvalidInput(f"delivery tag {exc.tag} is given twice in one ack: nothing was acked")


def tag_text(tag: commands.Tag) -> str:
    """The text of ``tag``: the caller's, or made from its seq, count and
    token where the caller named a Delivery (its first item is "" then)."""
    return tag[0] or delivery_tag(tag[1], tag[2], tag[3])


# The reason a claimed delivery without its record is set aside with.
MISSING_RECORD = "missing-record"
# The reason a delivery handed out before its time is set aside with: not
# dead-lettered, put back to wait (lua/set_aside.lua).
NOT_DUE = "not-due"


def expiry(header: str, published: int, now: int) -> str | None:
    """Why a message with the ``x-rq-ttl`` header ``header`` (ms), published
    at ``published``, has expired at ``now`` (server ms); None while it
    lives, or when the header is not a whole number (handed out as usual)."""
    if not header.isascii() or not header.isdigit():
        log.warning("header %s=%r is not a whole number of ms: the message does not expire", TTL_HEADER, header[:40])
        return None
    if published + int(header) > now:
        return None
    return f"its time to live of {int(header) / 1000:g} s ran out"


def merged(lost: list[RQueueError | None], sent: list[RQueueError | None]) -> list[RQueueError | None]:
    """Per ref, in order: its LostDelivery, or the status of its tag that
    was sent (``sent``, in order)."""
    if not any(lost):
        return sent
    statuses = iter(sent)
    return [exc if exc is not None else next(statuses) for exc in lost]


def _settled_aside(
    reply: commands.FetchReply,
    raw: list[Any],
    first: int,
    aside: list[tuple[str, str, str]],
    why: str,
    settled: Callable[[int, Any], bool],
) -> list[Any]:
    """``raw[:first]`` and the deliveries of ``raw[first:]`` (seq, count,
    record triples of ``reply``) but those of messages ``settled`` (seq,
    record) says the group settled before Redis lost acks: their tags go to
    ``aside``, reason SETTLED_BEFORE_LOSS and ``why``, to the dead-letter
    queue unrun. A replayed dead letter is kept: an operator asked for it."""
    kept = raw[:first]
    for i in range(first, len(raw), 3):
        seq = int(raw[i])
        count, replayed = commands.delivery_count(raw[i + 1])
        if replayed is None and settled(seq, raw[i + 2]):
            aside.append((delivery_tag(seq, count, reply.token), SETTLED_BEFORE_LOSS, why))
        else:
            kept.extend(raw[i : i + 3])
    return kept


def every_delivery(delivery: Delivery) -> bool:
    """The judgement of a removal from a consumer's one group: it took back
    every delivery the consumer held."""
    return True


def refs_of(deliveries: object) -> list[DeliveryRef]:
    """``deliveries`` as a list: one Delivery or tag, or an iterable of them."""
    if isinstance(deliveries, (Delivery, str)):
        return [deliveries]
    if isinstance(deliveries, Iterable):
        return list(deliveries)
    raise InvalidInput(f"expected a Delivery, a delivery tag or a list of them, not {type(deliveries).__name__}")


def _published_ms(record: bytes) -> float:
    """When a record's message was published (server ms); infinity for one
    that does not parse."""
    try:
        return decode_record(record, "")[0]
    except CorruptRecord:
        return math.inf
