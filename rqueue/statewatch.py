"""The client's check that Redis kept a queue's state.

Each queue has an incarnation id, stored with its meta by the script that
creates the meta (publish or join), from a random id the client offers. The
scripts a client calls all the time (publish, fetch, heartbeat, join)
return it, and publish and fetch return seqs. A client that sees the
incarnation change, or a seq go back, knows Redis lost state it had
confirmed: it logs at ERROR once, records a "state-lost" event in the
queue's events stream, and says what it knows is gone (docs/guarantees.md,
guarantee 12).

A fetch also returns its group's ack floor and generation (a number that
grows at each make and reset of the group). A floor that goes back within
one generation is acks Redis lost, a failover to a replica that missed them,
where no seq goes back. The consumer that sees it reports it as above, and
from then on sets aside, to the dead-letter queue unrun, any delivery of a
seq at or below the floor it had seen, published before the fetch that
showed it that floor (those messages were settled before the loss), until
the group's floor is back there. A generation that goes back (Redis lost a
reset of the group) is such a loss too.

Acks above the floor (a priority message, or a key's, acked while an older
one still runs) leave the floor where it is, and a Redis that lost them
shows no floor going back. So a consumer remembers the seqs whose acks it
saw confirmed above the floor it knew (:meth:`StateWatch.acked`; at most
ACKED_KEPT, the lowest forgotten first), forgets each one once the floor it
sees passes it, and every one when the group's generation changes (a
reset). A later fetch that hands it one of those seqs again, not as a
replayed dead letter, shows Redis lost that ack (:meth:`StateWatch.acks_lost`):
it is reported as above (LossKind.ACKS_LOST, once per loss) and the delivery
goes to the dead-letter queue unrun, reason "settled-before-loss". Only the
consumer that acked a seq can tell: another member of the group handed it
again sees a first delivery of an unacked message.

Replies of calls made by several threads can arrive in any order, so each
reply is judged against what the watch knew when its call was sent
(:meth:`StateWatch.mark`): a seq the server assigned after the call was
sent is above every seq seen before it was sent, unless Redis lost state.
"""

from __future__ import annotations

import heapq
import logging
import operator
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from itertools import islice
from typing import TYPE_CHECKING, NamedTuple

from .engine import store
from .errors import LossKind, RQueueError, StateLost
from .ids import incarnation_id

if TYPE_CHECKING:
    from .connection.open import RedisClient
    from .engine.keys import QueueKeys
    from .randomness import Randomness

log = logging.getLogger("rqueue")

CONFIRMED_KEPT = 100_000  # runs of confirmed seqs a publisher remembers, to count those a loss took
GENERATIONS_KEPT = 16  # a group's generations whose floors a consumer remembers (resets are rare)
ACKED_KEPT = 100_000  # seqs a consumer saw acked above its group's floor and remembers, to see those acks lost


class Mark(NamedTuple):
    """What a watch knew when a call was sent."""

    epoch: int  # losses seen so far
    last_seq: int  # the highest seq seen
    generation: int  # the group's generation (-1: none seen)
    floor: int  # the highest ack floor seen in that generation
    floor_ms: int  # the server time of the reply that first showed that floor
    acks: int = 0  # the stamp of the last acks remembered (StateWatch.acked)


class StateWatch:
    """What one client (a queue's publisher, or one consumer) saw of one
    queue's state: its incarnation, the highest seq, the seqs it confirmed.
    Thread-safe."""

    def __init__(
        self,
        queue: str,
        keys: QueueKeys,
        redis: RedisClient,
        randomness: Randomness,
        noticed_by: str,
        group: str = "",
        drop_held: Callable[[], int] | None = None,
        record: Callable[[dict[str, str]], None] | None = None,
    ) -> None:
        self._queue = queue
        self._keys = keys
        self._redis = redis
        self._randomness = randomness
        self._noticed_by = noticed_by
        self._group = group
        self._drop_held = drop_held
        # How the state-lost event is written: by default a plain XADD on
        # ``redis``; an asyncio client passes one that schedules it.
        self._record = record
        self._lock = threading.Lock()
        self.incarnation: str | None = None
        self.epoch = 0
        self._last_seq = 0
        # The group's generation (-1: none seen), the highest ack floor seen
        # in it and the server time of the reply that first showed it: one
        # tuple, which mark() reads whole without the lock.
        self._group_seen = (-1, 0, 0)
        # (floor, ms) as above, for each of the last generations seen.
        self._floors: dict[int, tuple[int, int]] = {}
        #: (seq, ms): a message of a seq at or below seq (0: none) published
        #: at or before ms (server time) was settled by the group before
        #: Redis lost acks: a delivery of one (not a replayed dead letter)
        #: goes to the dead-letter queue, never run. A later one is a new
        #: message that took a seq the loss gave back.
        self.settled = (0, 0)
        # (first, last) of the seqs each publish call confirmed
        self._confirmed: deque[tuple[int, int]] = deque(maxlen=CONFIRMED_KEPT)
        #: The incarnation id this client offers when a call creates the
        #: queue's meta; drawn again once a queue takes it.
        self.candidate = incarnation_id(randomness)
        #: The last loss this watch saw, or None.
        self.last_loss: StateLost | None = None
        # seq -> stamp: the seqs whose acks a consumer saw confirmed above
        # its group's floor, in generation ``_acked_generation``; the stamp
        # is that of the call's reply (``_stamp`` grows at each one).
        self._acked: dict[int, int] = {}
        self._acked_heap: list[int] = []  # the same seqs (and some forgotten), lowest first
        self._acked_top = 0  # no seq in the heap is above it: a floor that reaches it clears the heap whole
        # (seqs, stamp, floor) of each call :meth:`acked` was given, not yet
        # in _acked: a consumer acking in order sees the next fetch's floor
        # pass them all (_passed), so most are dropped whole, never stored
        # seq by seq; whatever reads _acked stores them first (_store_pending).
        self._pending: list[tuple[Sequence[int], int, int]] = []
        self._pending_count = 0  # seqs in _pending
        self._pending_top = 0  # no seq in _pending is above it
        self._acked_generation = -1
        self._stamp = 0
        # Acks remembered at or before this stamp belong to a loss already
        # reported: finding them gone again reports nothing new.
        self._reported_stamp = 0

    def mark(self) -> Mark:
        """What the watch knows now: taken before a call is sent."""
        return Mark(self.epoch, self._last_seq, *self._group_seen, self._stamp)

    def forget(self) -> None:
        """Forgets the queue's state (this client deleted the queue: its next
        incarnation is no loss)."""
        with self._lock:
            self.incarnation = None
            self._last_seq = 0
            self._group_seen, self.settled = (-1, 0, 0), (0, 0)
            self._floors.clear()
            self._confirmed.clear()
            self._forget_acked()
            self.epoch += 1

    def saw(
        self,
        mark: Mark,
        incarnation: str,
        last_seq: int | None = None,
        new: tuple[int, int] | None = None,
        floor: tuple[int, int, int] | None = None,
    ) -> int | None:
        """Judges the reply of a call sent at ``mark``: the queue's
        ``incarnation`` ("" when it has none), and its ``last_seq`` or the
        first and last of the ``new`` seqs the call assigned in one run
        (confirmed publishes; last < first: none), and a fetch's group
        generation, ack floor and server time (``floor``; a floor of -1 is
        not a seq, not judged).
        Reports a loss it shows (log, event, ``last_loss``). Returns the
        epoch the reply belongs to, or None when a loss was seen after the
        call was sent (what the reply brought is from before it)."""
        if not incarnation:
            return self.epoch  # a queue an older rqueue made: nothing to compare
        loss = None
        with self._lock:
            if mark.epoch != self.epoch:
                return None
            if incarnation == self.candidate:
                self.candidate = incarnation_id(self._randomness)
            if new is not None and new[1] < new[0]:
                new = None
            top = new[1] if new is not None else last_seq
            if self.incarnation is None:
                self.incarnation = incarnation
            elif incarnation != self.incarnation:
                loss = self._lost(LossKind.INCARNATION, incarnation, 0)
            elif new is not None and new[0] <= mark.last_seq:
                loss = self._lost(LossKind.SEQ_WENT_BACK, incarnation, new[0] - 1)
            elif last_seq is not None and last_seq < mark.last_seq:
                loss = self._lost(LossKind.SEQ_WENT_BACK, incarnation, last_seq)
            if floor is not None and floor[1] >= 0 and (loss is None or loss.kind is not LossKind.INCARNATION):
                acks_lost = self._saw_floor(mark, *floor, loss)
                if acks_lost is not None:
                    loss = acks_lost
            if top is not None and top > self._last_seq:
                self._last_seq = top
            if new is not None:
                self._confirmed.append(new)
            epoch = self.epoch
        if loss is not None:
            self._report(loss)
        return epoch

    def _saw_floor(
        self, mark: Mark, generation: int, floor: int, now_ms: int, loss: StateLost | None
    ) -> StateLost | None:
        """Judges a fetch's group ``generation`` and ack ``floor`` (its reply
        made at ``now_ms``, under the lock, after the seq checks made
        ``loss``): the loss of acks it shows, when no other was seen."""
        floors = self._floors
        went_back, up_to, up_to_ms = False, 0, 0
        if mark.generation >= 0 and generation <= mark.generation:
            if generation == mark.generation:
                went_back, up_to, up_to_ms = floor < mark.floor, mark.floor, mark.floor_ms
            else:
                # Redis has the group from before a reset (or its making)
                # that this watch saw: everything seen since that generation
                # was settled before the loss.
                went_back = True
                up_to, up_to_ms = max((v for g, v in floors.items() if g >= generation), default=(0, 0))
            if went_back and floor < up_to:
                # Not above what survived of the seqs: a seq taken back is a
                # new message when published again.
                if loss is not None:
                    up_to = min(up_to, loss.gone_above)
                self.settled = (max(self.settled[0], up_to), max(self.settled[1], up_to_ms))
        known, known_floor, _ = self._group_seen
        if went_back:
            # Starts over from the reply; generations the loss took may be
            # given again.
            for g in [g for g in floors if g > generation]:
                del floors[g]
            self._group_seen = (generation, floor, now_ms)
        elif generation == known:
            if floor > known_floor:
                self._group_seen = (generation, floor, now_ms)
        elif generation > known:
            # Made anew or reset: the floor starts over, and what the old
            # generation settled is the operator's to hand out again. (A
            # reply of a call sent before the watch learned of a newer
            # generation may bring an older one: it is passed over.)
            self._group_seen, self.settled = (generation, floor, now_ms), (0, 0)
            if len(floors) >= GENERATIONS_KEPT:
                del floors[min(floors)]
        known, known_floor, known_ms = self._group_seen
        floors[known] = (known_floor, known_ms)
        if self._acked or self._pending:
            if known > self._acked_generation or (went_back and generation != mark.generation):
                # A reset (or its making undone): what was acked before is
                # the operator's to hand out again.
                self._forget_acked()
            elif known == self._acked_generation:
                self._passed(known_floor)
        if self.settled[0] and floor >= self.settled[0] and generation == known:
            self.settled = (0, 0)  # Redis has the acks again
        if not went_back or loss is not None:
            return None
        self._reported_stamp = self._stamp  # the acks remembered are part of this loss
        return self._lost(
            LossKind.ACKS_WENT_BACK, self.incarnation or "", floor, max(up_to, floor), (mark.generation, generation)
        )

    def _lost(
        self,
        kind: LossKind,
        incarnation: str,
        gone_above: int,
        floor_seen: int = 0,
        generations: tuple[int, int] = (0, 0),
    ) -> StateLost:
        """Records a loss (under the lock) and starts over from the reply."""
        old = self.incarnation or ""
        if kind is LossKind.ACKS_WENT_BACK:
            # The messages are kept: nothing this client confirmed is gone,
            # and its seqs stand.
            dropped = self._drop_held() if self._drop_held is not None else 0
            loss = StateLost(
                self._queue,
                kind,
                old,
                incarnation,
                gone_above,
                self._last_seq,
                0,
                dropped,
                self._noticed_by,
                floor_seen=floor_seen,
                group=self._group,
                generations=generations,
            )
            self.epoch += 1
            self.last_loss = loss
            return loss
        gone = sum(max(0, last - max(first, gone_above + 1) + 1) for first, last in self._confirmed)
        kept = [(first, min(last, gone_above)) for first, last in self._confirmed if first <= gone_above]
        self._confirmed.clear()
        if kind is LossKind.SEQ_WENT_BACK:
            self._confirmed.extend(kept)
        dropped = self._drop_held() if self._drop_held is not None else 0
        loss = StateLost(
            self._queue, kind, old, incarnation, gone_above, self._last_seq, gone, dropped, self._noticed_by
        )
        self.incarnation = incarnation
        self._last_seq = gone_above
        if kind is LossKind.INCARNATION:
            self._group_seen, self.settled = (-1, 0, 0), (0, 0)
            self._floors.clear()
            self._forget_acked()
        else:
            # Acks remembered up to gone_above are part of this loss; the
            # seqs above it will be new messages.
            self._store_pending()
            for seq in [seq for seq in self._acked if seq > gone_above]:
                del self._acked[seq]
            self._reported_stamp = self._stamp
            # Seqs above gone_above are new messages once published again:
            # none of them was settled, whatever was seen before.
            generation, floor, floor_ms = self._group_seen
            self._group_seen = (generation, min(floor, gone_above), floor_ms)
            self.settled = (min(self.settled[0], gone_above), self.settled[1])
            for g, (f, ms) in self._floors.items():
                self._floors[g] = (min(f, gone_above), ms)
        self.epoch += 1
        self.last_loss = loss
        return loss

    def acked(self, mark: Mark, seqs: Sequence[int], generation: int = -1, floor: int = -1) -> None:
        """Remembers ``seqs``, whose acks the reply of a call sent at
        ``mark`` confirmed, those above the group's ack floor: the one the
        reply reported with its ``generation`` (a fetch's), else the one
        this watch knows (an ack's reply carries none). Not when a loss was
        seen since the call was sent, nor before a group generation is known.
        ``seqs`` is kept as given: the caller does not change it after."""
        if not seqs:
            return
        with self._lock:
            known, known_floor, _ = self._group_seen
            if generation < 0:
                generation, floor = known, known_floor
            elif generation == known:
                floor = max(floor, known_floor)
            if mark.epoch != self.epoch or generation <= 0 or floor < 0 or generation < self._acked_generation:
                return
            if generation > self._acked_generation:
                self._forget_acked()
                self._acked_generation = generation
            self._stamp = stamp = self._stamp + 1
            top = max(seqs)
            if top <= floor:
                return  # absorbed by the floor already: nothing to remember
            self._pending.append((seqs, stamp, floor))
            self._pending_count += len(seqs)
            self._pending_top = max(self._pending_top, top)
            if len(self._acked) + self._pending_count > ACKED_KEPT:
                self._store_pending()

    def _store_pending(self) -> None:
        """Puts the acks of ``_pending`` in ``_acked`` (under the lock), each
        call's seqs above the floor it was judged against, as they came."""
        pending = self._pending
        if not pending:
            return
        acked, heap = self._acked, self._acked_heap
        for seqs, stamp, floor in pending:
            if (
                seqs[0] > max(floor, self._acked_top)
                and len(acked) + len(seqs) <= ACKED_KEPT
                and all(map(operator.lt, seqs, islice(seqs, 1, None)))
            ):
                # Rising, above every seq remembered and with room for all
                # (a batch acked in order): what the loop below does, whole.
                # Appended so, they keep the heap a heap.
                acked.update(dict.fromkeys(seqs, stamp))
                heap.extend(seqs)
                self._acked_top = seqs[-1]
            else:
                for seq in seqs:
                    if seq > floor and seq not in acked:
                        while len(acked) >= ACKED_KEPT:
                            acked.pop(heapq.heappop(heap), None)
                        acked[seq] = stamp
                        heapq.heappush(heap, seq)
                if heap:
                    self._acked_top = max(self._acked_top, *seqs)
            if len(heap) > 2 * ACKED_KEPT:
                self._acked_heap = heap = sorted(acked)
        pending.clear()
        self._pending_count = self._pending_top = 0

    @property
    def acked_seqs(self) -> dict[int, int]:
        """seq -> stamp: the seqs whose acks this consumer saw confirmed
        above its group's floor (:meth:`acked`), and the stamp of each."""
        with self._lock:
            self._store_pending()
            return self._acked

    def remembers_acks(self) -> bool:
        """Whether any ack is remembered (read without the lock)."""
        return bool(self._acked or self._pending)

    def acked_among(self, seqs: Iterable[int]) -> bool:
        """Whether any of ``seqs`` is remembered acked."""
        with self._lock:
            self._store_pending()
            return not self._acked.keys().isdisjoint(seqs)

    def acks_lost(self, mark: Mark, epoch: int, generation: int, floor: int, seqs: list[int]) -> set[int]:
        """Of ``seqs``, handed out (not replayed) by a fetch sent at
        ``mark`` whose reply :meth:`saw` judged (of ``epoch``: what it
        returned) and that showed the group's ``generation`` and ``floor``:
        those whose acks this watch
        had seen confirmed before the fetch was sent. Redis lost those acks:
        the seqs are forgotten, and the loss is reported unless it was."""
        loss = None
        with self._lock:
            self._store_pending()
            acked = self._acked
            if epoch != self.epoch or generation != self._acked_generation:
                return set()
            found = {seq for seq in seqs if acked.get(seq, mark.acks + 1) <= mark.acks}
            if not found:
                return found
            fresh = max(acked.pop(seq) for seq in found) > self._reported_stamp
            if fresh:
                self._reported_stamp = self._stamp
                inc = self.incarnation or ""
                loss = StateLost(
                    self._queue,
                    LossKind.ACKS_LOST,
                    inc,
                    inc,
                    floor,
                    self._last_seq,
                    0,
                    0,
                    self._noticed_by,
                    floor_seen=floor,
                    group=self._group,
                    generations=(generation, generation),
                    seqs=tuple(sorted(found)),
                )
                self.last_loss = loss
        if loss is not None:
            self._report(loss)
        return found

    def _passed(self, floor: int) -> None:
        """Forgets the acks remembered at or below ``floor`` (under the lock)."""
        if floor >= self._acked_top and floor >= self._pending_top:
            # every seq remembered is at or below it (acks in order): all go
            # at once, not one heap pop each
            self._forget_acked(keep_generation=True)
            return
        self._store_pending()
        heap, acked = self._acked_heap, self._acked
        while heap and heap[0] <= floor:
            acked.pop(heapq.heappop(heap), None)

    def _forget_acked(self, keep_generation: bool = False) -> None:
        self._acked.clear()
        self._acked_heap.clear()
        self._acked_top = 0
        self._pending.clear()
        self._pending_count = self._pending_top = 0
        if not keep_generation:
            self._acked_generation = -1

    def _report(self, loss: StateLost) -> None:
        log.error("%s", loss)
        fields = {
            "event": "state-lost",
            "group": self._group,
            "seq": str(loss.gone_above),
            "reason": loss.kind.value,
            "incarnation": loss.incarnation,
            "new_incarnation": loss.new_incarnation,
            "last_seq_seen": str(loss.last_seq_seen),
            "confirmed_gone": str(loss.confirmed_gone),
            "deliveries_dropped": str(loss.deliveries_dropped),
            "floor_seen": str(loss.floor_seen),
            "generation_seen": str(loss.generations[0]),
            "generation": str(loss.generations[1]),
            "noticed_by": loss.noticed_by,
        }
        try:
            if self._record is not None:
                self._record(fields)
            else:
                store.record_event(self._redis, self._keys, fields)
        except RQueueError as exc:  # the log line stands; the event is a record of it
            log.warning("could not record the state-lost event of %r: %s", self._queue, exc)
