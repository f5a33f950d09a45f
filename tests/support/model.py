"""A pure-Python reference model of one rqueue queue, written from
docs/guarantees.md and the README (not from the Lua), for the stateful test
in tests/test_model.py.

It knows nothing about Redis. Time is an explicit number of ms that only
moves when told to. Every operation either returns what the real client
returns (in plain tuples) or raises :class:`ModelError` naming the exception
the real client raises; an operation that raises changes nothing.

What the model says, in short:

- A queue is a log of records with seq 1, 2, 3, ...; a publish with an id
  seen less than dedup_window ago is a duplicate (it names the first seq and
  stores nothing). A delayed publish is not delivered before its not-before
  time.
- Groups are created before the test publishes (possibly after a few
  publishes: a group created on a queue that never had one starts at seq 0
  and sees everything). Every group sees every message; a record is deleted
  once every group settled it (acked or dead-lettered) and no group has it
  open again by replay.
- A group's ack floor is the highest seq such that every seq at or below it
  is settled by the group (docs/guarantees.md, "Ack floor"); pending is the
  number of published seqs the group has not settled. A replayed dead letter is open
  (not settled) again until the group settles it once more.
- fetch: a lease whose deadline has passed (deadline <= now) is a failed
  attempt: the message is dead-lettered when it had max_deliveries, else
  offered again after the redelivery policy's delay. Leases are looked at
  only by fetch (lazily); a late ack or in_progress before that fetch still
  finds the lease. Then due delayed messages become ready; then up to
  min(n, max_inflight - in flight, prefetch - held by this consumer)
  deliveries: ready ones lowest seq first, then new ones from the group's
  cursor (a delayed publish passed by the cursor waits in the group's delay
  set until due). Leases that ran out are handled in deadline order, which
  decides the order of the dead letters they make (and so which ones a
  limited replay picks); docs/guarantees.md leaves that order open.
- A delivery tag is (seq, count, token): the token is the fetch call's
  random word (the test hands the model the one the real client drew), so
  only the delivery that fetch made has it (guarantee 11). Settling checks,
  in this order: no open delivery state -> AlreadyAcked when the group
  settled seq, else UnknownDeliveryTag; count above the current count ->
  UnknownDeliveryTag; the current delivery held by this consumer -> ok with
  its token, UnknownDeliveryTag with another; the current delivery held by
  another -> NotHeld; an earlier delivery (or the current one after it was
  taken back) that this consumer nacked with that token -> StaleDelivery;
  one this consumer did not receive with that token -> NotHeld; else ok for
  ack while no newer delivery of it is out (a late ack completes a message
  waiting to be handed out again) and StaleDelivery otherwise, and for nack,
  reject, term and in_progress. A list ack is all or nothing; a tag listed
  twice is AlreadyAcked. A Delivery handed to a Consumer other than the one
  that fetched it is NotHeld before any call (the test knows which object
  fetched it; the model is not asked).
- A member's liveness deadline is moved by join, fetch, in_progress and its
  own heartbeat (which also sets its liveness to the heartbeat's timeout);
  a heartbeat removes every member whose deadline is strictly before now,
  and each message such a member held is a failed attempt (as an expired
  lease). A graceful close puts what the consumer held back at once with its
  count kept.
- Replay returns a dead letter to the group that dead-lettered it, and only
  to it, ready at once, with a fresh delivery count (the next delivery has
  count 1 and is not "redelivered").
- Retention mode (docs/retention.md): a trim step with max_length set, or
  a group reset, puts the queue in it; a trim step keeps the settled
  records among the last max_length seqs.
  Then settling deletes no record (but one at or below the trim point that
  no replay holds open); a trim step deletes the records from the trim point
  up to the lowest stored ack floor of all groups, but those a replay holds
  open, and the mode ends once the trim point reaches the last seq. The
  stored ack floor is the floor as the scripts keep it: a replay does not
  lower it (the reported floor does). The trim point outside retention mode
  is the lowest stored floor.
- A reset moves a group to a position (first: the trim point; last; a seq
  in trim point + 1 .. last + 1), refused (InvalidInput) outside that, and
  (GroupInUse) while the group has leases, unless forced: everything it had
  in flight or waiting is forgotten, its consumers hold nothing, and it
  needs again every record above the new floor.
- Ordering keys (docs/flow-control.md): a keyed message is handed out
  after the priority messages and before the scan of new ones, a key's
  lowest seqs first, at most key_concurrency of a key whose delivery state
  is open; the model keeps the group's key queue, ready keys (by turn, ties
  by name) and busy keys as fetch.lua does, so that it names the same
  deliveries. A reset forgets them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

HISTORY_MAX = 10  # earlier holders of a message the real scripts remember

ERRORS = (
    "AlreadyAcked",
    "UnknownDeliveryTag",
    "NotHeld",
    "StaleDelivery",
    "NotMember",
    "Closed",
    "Unroutable",
    "LostDelivery",
    "QueuePaused",
    "GroupInUse",
    "InvalidInput",
)


class ModelError(Exception):
    """The model's verdict that the real call raises ``code`` (a class name)."""

    def __init__(self, code: str) -> None:
        assert code in ERRORS, code
        super().__init__(code)
        self.code = code


def ms(seconds: float) -> int:
    """Seconds to ms, as the client converts settings and delays."""
    return int(round(seconds * 1000))


@dataclass
class Settings:
    ack_wait: float = 5.0
    max_inflight: int = 1024
    max_deliveries: int = 10
    redelivery_delay: float = 0.0
    redelivery_multiplier: float = 1.0
    dedup_window: float = 120.0
    max_length: int | None = None  # retention (docs/retention.md); applied by trim()
    key_concurrency: int = 1  # ordering keys: deliveries of one key unsettled at once

    def policy_delay_ms(self, count: int) -> int:
        """Artemis: delay x multiplier^(count-1), capped at delay x 10; jitter 0."""
        delay = ms(self.redelivery_delay)
        if delay <= 0:
            return 0
        d = delay * float(self.redelivery_multiplier) ** (count - 1)
        cap = ms(self.redelivery_delay * 10)
        if d > cap:
            d = cap
        return math.floor(d + 0.5)


@dataclass
class Record:
    payload: bytes
    headers: dict[str, str]
    not_before: int | None  # ms, for a delayed publish
    needed: set[str]  # groups that have not settled it (or reopened it)
    published: int = 0  # ms; with an x-rq-ttl header, when its time to live began


Tag = tuple[int, int, str]  # (seq, delivery count, token)
REPLAYED = "^"  # the holder of a history entry that is a replay (no consumer name holds it here)


@dataclass
class Dlv:
    """A group's open delivery state of one message."""

    count: int = 0
    holder: str = ""  # "" while it waits for (re)delivery
    token: str = ""  # of the fetch that made the current (or last) delivery
    # deliveries taken back: (count, holder, token, nacked by that holder);
    # (n, REPLAYED, "", False) where a replay restarted the count after n
    past: list[tuple[int, str, str, bool]] = field(default_factory=list)

    def replayed_after(self) -> int | None:
        """The deliveries before its replay, for a replayed dead letter."""
        return next((n for n, holder, _, _ in self.past if holder == REPLAYED), None)


@dataclass
class DeadLetter:
    group: str
    seq: int
    reason: str
    deliveries: int
    payload: bytes
    headers: dict[str, str]
    published: int = field(default=0, compare=False)  # ms: a replay restores it (x-rq-published)


COUNTERS = ("acked", "nacked", "redelivered", "expired", "dead_lettered", "dropped")


class Group:
    def __init__(self, name: str) -> None:
        self.name = name
        self.start = 0  # the floor it was created with
        self.settled: set[int] = set()  # seqs above start settled and not reopened
        self.cursor = 0
        self.dlv: dict[int, Dlv] = {}
        self.lease: dict[int, int] = {}  # seq -> deadline ms (in flight)
        self.ready: set[int] = set()
        self.delay: dict[int, int] = {}  # seq -> due ms
        self.members: dict[str, int] = {}  # consumer -> deliveries held
        self.beats: dict[str, int] = {}  # consumer -> liveness deadline ms
        self.live: dict[str, int] = {}  # consumer -> liveness timeout ms
        self.counters = {k: 0 for k in COUNTERS}
        self.paused = False  # its fetches hand out nothing and take no lease back
        self.pulled = 0  # the highest priority seq moved to pq
        self.pq: set[int] = set()  # priority seqs read from the queue's log, not handed out yet
        # Ordering keys (docs/flow-control.md), as fetch.lua keeps them: the
        # seqs pulled and not handed out per key; the keys that may hand out
        # and the keys with deliveries out, each by turn (ties by name); and
        # each busy key's deliveries not yet seen settled.
        self.kq: dict[str, list[int]] = {}
        self.kready: dict[str, int] = {}
        self.kbusy: dict[str, int] = {}
        self.kflight: dict[str, list[int]] = {}
        self.hash_floor = 0  # the floor as stored: a replay does not lower it
        self.reopened: set[int] = set()  # seqs a replay reopened, not settled again

    def is_settled(self, seq: int) -> bool:
        return (seq <= self.start and seq not in self.reopened) or seq in self.settled

    def floor(self) -> int:
        f = self.start
        while f + 1 in self.settled:
            f += 1
        # a replay reopens a seq at or below the floor a reset gave the group too
        below = [s for s in self.reopened if s <= f]
        return min(below) - 1 if below else f

    def pending(self, last: int) -> int:
        reopened_below = sum(1 for s in self.reopened if s <= self.start)
        return reopened_below + sum(1 for s in range(self.start + 1, last + 1) if s not in self.settled)


class Model:
    def __init__(self, settings: Settings, now_ms: int, stream_log: bool = False) -> None:
        self.settings = settings
        # The log in a stream (rqueue.engine.keys.LogLayout.STREAM): a record
        # goes only when the lowest floor passes it and no replay holds it.
        self.stream_log = stream_log
        self.now = now_ms
        self.last = 0
        self.records: dict[int, Record] = {}
        self.sched: dict[int, int] = {}  # seq -> not-before of delayed publishes
        self.ids: dict[str, tuple[int, int]] = {}  # id -> (seq, expiry ms)
        self.groups: dict[str, Group] = {}
        self.dlq: dict[int, DeadLetter] = {}
        self.dlq_last = 0
        self.priority: dict[int, int] = {}  # seq -> priority (1-9) of the messages published with one
        self.keyed: dict[int, str] = {}  # seq -> ordering key of the messages published with one
        self.paused = ""  # the queue's pause: "", "refuse" or "hold"
        self.hold_at = 0  # with "hold": the last seq when it began
        self.retain: str | None = None  # retention mode's "<max_age> <max_length>" (docs/retention.md)
        self.trimmed = 0  # records at or below it are deleted, but those a replay holds open

    def wipe(self) -> None:
        """Redis loses every key of the queue (a restart without its data):
        the queue starts again, empty, without groups. The settings stay
        (they are the prefix's, kept apart), and so does the log's layout:
        the client makes the queue again with the layout it makes queues
        with."""
        self.__init__(self.settings, self.now, self.stream_log)  # type: ignore[misc]

    # -- time -----------------------------------------------------------------

    def advance(self, seconds: float) -> None:
        self.now += round(seconds * 1000)

    # -- publish -------------------------------------------------------------

    def publish(
        self,
        items: list[tuple[bytes, dict[str, str], str | None]],
        delay: float | None,
        mandatory: bool = False,
        priorities: list[int] | None = None,
        keys: list[str | None] | None = None,
    ) -> list[tuple[int, bool]]:
        if mandatory and not self.groups:
            raise ModelError("Unroutable")
        if self.paused == "refuse":
            raise ModelError("QueuePaused")
        delay_ms = 0 if delay is None else ms(delay)
        out = []
        for i, (payload, headers, mid) in enumerate(items):
            if mid is not None and mid in self.ids and self.ids[mid][1] > self.now:
                out.append((self.ids[mid][0], True))
                continue
            self.last += 1
            seq = self.last
            if priorities and priorities[i]:
                self.priority[seq] = priorities[i]
            if keys and keys[i] is not None:
                self.keyed[seq] = keys[i]
            nb = self.now + delay_ms if delay_ms > 0 else None
            if nb is not None:
                self.sched[seq] = nb
            self.records[seq] = Record(payload, dict(headers), nb, set(self.groups), self.now)
            if mid is not None:
                self.ids[mid] = (seq, self.now + ms(self.settings.dedup_window))
            out.append((seq, False))
        return out

    # -- membership -------------------------------------------------------------

    def create_group(self, name: str) -> None:
        assert name not in self.groups
        g = Group(name)
        # A queue's first groups start at 0 and need every record stored.
        assert all(not g.settled for g in self.groups.values()) and not self.dlq
        self.groups[name] = g
        for rec in self.records.values():
            rec.needed.add(name)

    def join(self, group: str, consumer: str, liveness: float | None) -> None:
        g = self.groups[group]
        g.members.setdefault(consumer, 0)
        g.live[consumer] = ms(self.settings.ack_wait if liveness is None else liveness)
        self._beat(g, consumer)

    def _beat(self, g: Group, consumer: str) -> None:
        if consumer in g.members:
            g.beats[consumer] = self.now + g.live.get(consumer, ms(self.settings.ack_wait))

    # -- internal moves ---------------------------------------------------------

    def _release(self, g: Group, seq: int, d: Dlv, nacked: bool = False) -> None:
        g.lease.pop(seq, None)
        if d.holder:
            g.members[d.holder] = g.members.get(d.holder, 0) - 1
            d.past.append((d.count, d.holder, d.token, nacked))
            del d.past[:-HISTORY_MAX]
            d.holder = ""

    def _requeue(self, g: Group, seq: int, delay_ms: int) -> None:
        if delay_ms > 0:
            g.delay[seq] = self.now + delay_ms
        else:
            g.ready.add(seq)

    def _pinned(self, seq: int) -> bool:
        return any(seq in g.reopened for g in self.groups.values())

    def _settle(self, g: Group, seq: int) -> None:
        if seq > g.start:
            g.settled.add(seq)
        g.reopened.discard(seq)
        while g.hash_floor + 1 in g.settled:
            g.hash_floor += 1
        if (self.priority or self.keyed) and g.cursor < g.hash_floor:
            # settle.lua: priority and keyed messages are settled apart from
            # the cursor, which goes up with the floor
            g.cursor = g.hash_floor
        rec = self.records.get(seq)
        if rec is not None:
            rec.needed.discard(g.name)
            if self.retain is not None:
                if seq <= self.trimmed and not self._pinned(seq):
                    del self.records[seq]
            elif not rec.needed and not self.stream_log:
                del self.records[seq]
        if self.retain is None and self.groups:
            self.trimmed = min(x.hash_floor for x in self.groups.values())
            if self.stream_log:
                for s in [s for s in self.records if s <= self.trimmed and not self._pinned(s)]:
                    del self.records[s]

    def _dead_letter(self, g: Group, seq: int, d: Dlv, reason: str) -> None:
        rec = self.records.get(seq)
        g.ready.discard(seq)
        g.delay.pop(seq, None)
        self._release(g, seq, d)
        del g.dlv[seq]
        self._settle(g, seq)
        if rec is None:
            g.counters["dropped"] += 1
            return
        self.dlq_last += 1
        self.dlq[self.dlq_last] = DeadLetter(
            g.name, seq, reason, d.count, rec.payload, dict(rec.headers), rec.published
        )
        g.counters["dead_lettered"] += 1

    def _retry_or_dead(self, g: Group, seq: int, d: Dlv, delay_ms: int | None, nacked: bool = False) -> str:
        self._release(g, seq, d, nacked)
        md = self.settings.max_deliveries
        if md != -1 and d.count >= md:
            self._dead_letter(g, seq, d, "max-deliveries")
            return "dead"
        if delay_ms is None:
            delay_ms = self.settings.policy_delay_ms(d.count)
        self._requeue(g, seq, delay_ms)
        return "requeued"

    def _return_held(self, g: Group, member: str, graceful: bool) -> tuple[int, int]:
        returned = dead = 0
        for seq in sorted(g.lease, key=lambda s: (g.lease[s], str(s))):
            d = g.dlv[seq]
            if d.holder != member:
                continue
            if graceful:
                self._release(g, seq, d)
                self._requeue(g, seq, 0)
                returned += 1
            elif self._retry_or_dead(g, seq, d, None) == "dead":
                dead += 1
            else:
                returned += 1
        g.members.pop(member, None)
        g.beats.pop(member, None)
        g.live.pop(member, None)
        return returned, dead

    def _check_tag(self, g: Group, consumer: str, tag: Tag, late_ok: bool) -> str | None:
        seq, count, token = tag
        d = g.dlv.get(seq)
        if d is None:
            return "AlreadyAcked" if g.is_settled(seq) else "UnknownDeliveryTag"
        if count > d.count:
            return "UnknownDeliveryTag"
        if count == d.count and d.holder == consumer:
            return None if token == d.token else "UnknownDeliveryTag"
        if count == d.count and d.holder:
            return "NotHeld"
        if (count, consumer, token, True) in d.past:
            return "StaleDelivery"  # its holder nacked it: nothing settles it again
        if (count, consumer, token, False) not in d.past:
            return "NotHeld"
        return None if late_ok and not d.holder else "StaleDelivery"

    # -- consuming --------------------------------------------------------------

    def fetch(
        self, group: str, consumer: str, n: int, prefetch: int, liveness: float | None, token: str
    ) -> list[tuple[int, int]]:
        """Returns [(seq, delivery_count)] in the order handed out, each made
        with ``token`` (the call's random word)."""
        g = self.groups[group]
        if consumer not in g.members:  # the client joins again by itself
            self.join(group, consumer, liveness)
        self._beat(g, consumer)
        if g.paused:
            return []
        # in deadline order (ties: seq as text), which decides the order of dead letters
        for seq in sorted((s for s, dl in g.lease.items() if dl <= self.now), key=lambda s: (g.lease[s], str(s))):
            self._retry_or_dead(g, seq, g.dlv[seq], None)
            g.counters["expired"] += 1
        for seq in [s for s, due in g.delay.items() if due <= self.now]:
            del g.delay[seq]
            g.ready.add(seq)
        room = min(n, self.settings.max_inflight - len(g.lease), prefetch - g.members[consumer])
        out: list[tuple[int, int]] = []

        def deliver(seq: int) -> None:
            d = g.dlv.get(seq)
            if d is None:
                d = g.dlv[seq] = Dlv()
            elif d.count > 0:
                g.counters["redelivered"] += 1
            d.count += 1
            d.holder = consumer
            d.token = token
            g.lease[seq] = self.now + ms(self.settings.ack_wait)
            g.members[consumer] += 1
            out.append((seq, d.count))

        if room <= 0:
            return out
        for seq in sorted(g.ready)[:room]:
            g.ready.remove(seq)
            assert seq in self.records, f"model: ready seq {seq} has no record"
            deliver(seq)
        last = self.last if self.paused != "hold" else min(self.last, max(self.hold_at, g.cursor))
        cut = False
        if len(out) < room and (self.priority or self.keyed):
            # what is new in the priority log joins the group's priority set
            # (a group's first pull starts above its ack floor); a keyed
            # message joins its key's queue, a key new to the ready keys at
            # their back
            start = g.pulled if g.pulled else g.floor()
            fresh = [s for s in self.priority if start < s <= last]
            g.pq.update(fresh)
            fresh_keyed = sorted(s for s in self.keyed if start < s <= last)
            turn = max(g.kready.values(), default=0) + 1
            for seq in fresh_keyed:
                g.kq.setdefault(self.keyed[seq], []).append(seq)
                g.kready.setdefault(self.keyed[seq], turn)
            if fresh or fresh_keyed:
                g.pulled = max(fresh + fresh_keyed)
            # picks until the room is filled: a delayed one picked is parked,
            # and the next ones are picked (at most 100 picks, 1,000 passed over)
            # (the model's pull and scan have no bound per call: its runs stay
            # far below 1,000 messages, where fetch.lua's bounds never bite)
            rounds = passed = 0
            while len(out) < room and g.pq and rounds < 100 and passed < 1000:
                rounds += 1
                picked = sorted(g.pq, key=lambda s: (-self.priority[s], s))[: min(room - len(out), 1000 - passed)]
                before = len(out)
                for seq in picked:
                    g.pq.remove(seq)
                    rec = self.records.get(seq)
                    if g.is_settled(seq) or seq in g.dlv:
                        continue  # settled meanwhile (a purge) or delivered another way
                    if rec is None or group not in rec.needed:
                        self._settle(g, seq)  # gone before this group reached it (as the scan judges it)
                        continue
                    if rec.not_before is not None and rec.not_before > self.now:
                        g.delay[seq] = rec.not_before
                    else:
                        deliver(seq)
                passed += len(picked) - (len(out) - before)
            # stopped at its bound with more to pick: lower priorities wait for the next call
            cut = len(out) < room and bool(g.pq) and (rounds >= 100 or passed >= 1000)
        if cut:
            return self._drop_expired(g, out)
        if len(out) < room and (self.priority or self.keyed) and (g.kready or g.kbusy):
            self._pick_keyed(g, group, room, out, deliver)
        if (self.priority or self.keyed) and g.cursor < g.hash_floor:
            g.cursor = g.hash_floor  # the scan starts at the floor (fetch.lua)
        while len(out) < room and g.cursor < last:
            g.cursor += 1
            seq = g.cursor
            if seq in self.priority or seq in self.keyed:
                continue  # handed out from the priority set or its key's queue
            rec = self.records.get(seq)
            if rec is None or group not in rec.needed:
                self._settle(g, seq)  # gone before this group reached it
            elif rec.not_before is not None and rec.not_before > self.now:
                g.delay[seq] = rec.not_before
            else:
                deliver(seq)
        return self._drop_expired(g, out)

    def _pick_keyed(self, g: Group, group: str, room: int, out: list[tuple[int, int]], deliver) -> None:
        """Hands out messages of ordering keys: a key's lowest seqs, at most
        key_concurrency of it unsettled, least recently served key first,
        each key its share of the room per turn (docs/flow-control.md)."""
        conc = self.settings.key_concurrency
        extra = 16  # busy keys checked beyond the room
        turn = max(g.kready.values(), default=0) + 1
        busy_turn = max(g.kbusy.values(), default=0) + 1
        flights: dict[str, list[int]] = {}
        for key in sorted(g.kbusy, key=lambda k: (g.kbusy[k], k))[: room - len(out) + extra]:
            kept = [s for s in g.kflight[key] if s in g.dlv]  # settled: its delivery state is gone
            if kept:
                g.kflight[key] = kept
                g.kbusy[key] = busy_turn
                busy_turn += 1
            else:
                del g.kflight[key], g.kbusy[key]
            flights[key] = kept
            if len(kept) < conc:
                g.kready.setdefault(key, turn)
                turn += 1
        passed: set[str] = set()
        examined, at_most = 0, (room - len(out)) * 2 + extra
        while len(out) < room and examined < at_most:
            candidates = sorted(g.kready, key=lambda k: (g.kready[k], k))[: room - len(out)]
            share = math.ceil((room - len(out)) / max(1, len(candidates)))
            progress = False
            for key in candidates:
                if len(out) >= room or examined >= at_most:
                    break
                if key in passed:
                    continue
                examined += 1
                progress = True  # a key looked at, even one passed over
                flight = flights.setdefault(key, list(g.kflight.get(key, [])))
                free = conc - len(flight)
                if free <= 0:
                    passed.add(key)
                    del g.kready[key]
                    continue
                want = min(free, share, room - len(out))
                members = g.kq.get(key, [])[:want]
                done, handed, wait = [], 0, False
                for seq in members:
                    rec = self.records.get(seq)
                    if g.is_settled(seq) or seq in g.dlv:
                        done.append(seq)  # settled meanwhile, or delivered another way
                    elif rec is None or group not in rec.needed:
                        self._settle(g, seq)  # gone before this group reached it
                        done.append(seq)
                    elif rec.not_before is not None and rec.not_before > self.now:
                        wait = True  # a delayed message holds its key's later ones
                        break
                    else:
                        deliver(seq)
                        flight.append(seq)
                        done.append(seq)
                        handed += 1
                for seq in done:
                    g.kq[key].remove(seq)
                if key in g.kq and not g.kq[key]:
                    del g.kq[key]
                if handed:
                    g.kflight[key] = list(flight)
                    if key not in g.kbusy:
                        g.kbusy[key] = busy_turn
                    busy_turn += 1
                if len(flight) >= conc or (not wait and len(members) < want and len(done) == len(members)):
                    passed.add(key)
                    del g.kready[key]
                else:
                    if wait:
                        passed.add(key)
                    g.kready[key] = turn
                    turn += 1
            if not progress:
                break

    def _drop_expired(self, g: Group, out: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """What the fetching consumer hands on: a message past its time to
        live (x-rq-ttl) is dead-lettered as expired in fetch order instead."""
        kept = []
        for seq, count in out:
            rec = self.records.get(seq)
            ttl = rec.headers.get("x-rq-ttl") if rec is not None else None
            if rec is not None and ttl is not None and rec.published + int(ttl) <= self.now:
                self._dead_letter(g, seq, g.dlv[seq], "expired")
            else:
                kept.append((seq, count))
        return kept

    def ack(self, group: str, consumer: str, tags: list[Tag]) -> None:
        g = self.groups[group]
        seen: set[int] = set()
        for tag in tags:
            code = self._check_tag(g, consumer, tag, late_ok=True)
            if code is None and tag[0] in seen:
                code = "AlreadyAcked"
            if code == "AlreadyAcked" and tags.count(tag) > 1:
                code = "InvalidInput"  # the same tag twice in the list (consumer_core.named_twice)
            if code is not None:
                raise ModelError(code)
            seen.add(tag[0])
        for seq, _, _ in tags:
            d = g.dlv.pop(seq)
            if d.holder:
                g.lease.pop(seq)
                g.members[d.holder] -= 1
            else:
                g.ready.discard(seq)
                g.delay.pop(seq, None)
            self._settle(g, seq)
        g.counters["acked"] += len(tags)

    def refusal(self, group: str, consumer: str, tag: Tag) -> str | None:
        """What a nack of ``tag`` would be refused with now (None: nothing),
        without nacking it: a list nack checks every tag first (nack.lua)."""
        return self._check_tag(self.groups[group], consumer, tag, late_ok=False)

    def nack(self, group: str, consumer: str, tag: Tag, delay: float | None) -> str:
        g = self.groups[group]
        code = self._check_tag(g, consumer, tag, late_ok=False)
        if code is not None:
            raise ModelError(code)
        seq = tag[0]
        status = self._retry_or_dead(g, seq, g.dlv[seq], None if delay is None else ms(delay), nacked=True)
        if status == "requeued":
            g.counters["nacked"] += 1
        return status

    def reject(self, group: str, consumer: str, tag: Tag, reason: str) -> None:
        g = self.groups[group]
        code = self._check_tag(g, consumer, tag, late_ok=False)
        if code is not None:
            raise ModelError(code)
        self._dead_letter(g, tag[0], g.dlv[tag[0]], reason)

    def in_progress(self, group: str, consumer: str, tag: Tag) -> int:
        g = self.groups[group]
        self._beat(g, consumer)
        code = self._check_tag(g, consumer, tag, late_ok=False)
        if code is not None:
            raise ModelError(code)
        deadline = self.now + ms(self.settings.ack_wait)
        g.lease[tag[0]] = deadline
        return deadline

    def heartbeat(self, group: str, consumer: str, timeout: float) -> tuple[int, int, int]:
        """Returns (members removed, returned, dead-lettered)."""
        g = self.groups[group]
        if consumer not in g.members:
            raise ModelError("NotMember")
        g.live[consumer] = ms(timeout)
        self._beat(g, consumer)
        removed = returned = dead = 0
        silent = sorted((dl, m) for m, dl in g.beats.items() if dl < self.now)[:10]
        for _, member in silent:
            r, d = self._return_held(g, member, graceful=False)
            removed, returned, dead = removed + 1, returned + r, dead + d
        return removed, returned, dead

    def close(self, group: str, consumer: str) -> int:
        returned, _ = self._return_held(self.groups[group], consumer, graceful=True)
        return returned

    # -- dead letters -----------------------------------------------------------

    def replay(self, group: str | None, limit: int | None) -> tuple[int, int, int, int, dict[str, int]]:
        """Returns (selected, replayed, missing, skipped, by_group)."""
        chosen = [k for k in sorted(self.dlq) if group is None or self.dlq[k].group == group]
        if limit is not None:
            chosen = chosen[:limit]
        order: dict[str, list[int]] = {}
        for k in chosen:
            order.setdefault(self.dlq[k].group, []).append(k)
        replayed = skipped = 0
        by_group: dict[str, int] = {}
        for gname, dseqs in order.items():
            g = self.groups[gname]
            for k in dseqs:
                dl = self.dlq[k]
                if dl.seq in g.dlv or (dl.seq > g.cursor and dl.seq > g.hash_floor and dl.seq not in g.settled):
                    # pending, or unread since a reset: its fetches hand it out (one
                    # settled above the cursor and floor was handed out apart from the
                    # scan, which passes over it: replayed)
                    skipped += 1
                    continue
                g.settled.discard(dl.seq)
                g.reopened.add(dl.seq)
                rec = self.records.get(dl.seq)
                if rec is None:
                    self.records[dl.seq] = Record(dl.payload, dict(dl.headers), None, {gname}, dl.published)
                else:
                    rec.needed.add(gname)
                g.dlv[dl.seq] = Dlv(past=[(dl.deliveries, REPLAYED, "", False)])
                g.ready.add(dl.seq)
                del self.dlq[k]
                replayed += 1
                by_group[gname] = by_group.get(gname, 0) + 1
        return len(chosen), replayed, 0, skipped, by_group

    # -- flow control ----------------------------------------------------------------

    def pause_group(self, group: str, paused: bool) -> bool:
        g = self.groups[group]
        changed = g.paused != paused
        g.paused = paused
        return changed

    def pause_queue(self, mode: str) -> bool:
        """mode "" resumes."""
        if mode == "hold" and self.paused == "hold":
            return False
        changed = mode != self.paused
        if mode == "hold":
            self.hold_at = self.last
        self.paused = mode
        return changed

    # -- retention and resets ----------------------------------------------------------

    def reset(self, group: str, to: str | int, force: bool) -> tuple[int, int, int]:
        """Returns (previous stored floor, new floor, deliveries taken back)."""
        g = self.groups[group]
        if to == "first":
            target = self.trimmed
        elif to == "last":
            target = self.last
        else:
            assert isinstance(to, int)
            if to > self.last + 1 or to <= self.trimmed:
                raise ModelError("InvalidInput")
            target = to - 1
        if g.lease and not force:
            raise ModelError("GroupInUse")
        previous, cancelled = g.hash_floor, len(g.lease)
        for seq in g.reopened:
            g.reopened = g.reopened - {seq}
            if seq <= self.trimmed and not self._pinned(seq) and seq in self.records:
                del self.records[seq]
        g.reopened = set()
        g.pq, g.pulled = set(), 0
        g.kq, g.kready, g.kbusy, g.kflight = {}, {}, {}, {}
        g.start = g.hash_floor = g.cursor = target
        g.settled = set()
        g.dlv.clear()
        g.lease.clear()
        g.ready.clear()
        g.delay.clear()
        for member in g.members:
            g.members[member] = 0
        for seq, rec in self.records.items():
            if seq > target:
                rec.needed.add(group)
            else:
                rec.needed.discard(group)
        if self.retain is None:
            self.retain = "- -"
        return previous, target, cancelled

    def trim(self) -> tuple[bool, int, int]:
        """One trim step under the settings' max_length (no max_age):
        (retention mode, trim point, seqs passed)."""
        want = "- " + ("-" if self.settings.max_length is None else str(self.settings.max_length))
        if want == "- -":
            if self.retain is not None:
                self.retain = want  # leaving: the step deletes until nothing is stored
        else:
            self.retain = want
        if self.retain is None:
            return False, self.trimmed, 0
        length = None if self.retain == "- -" else int(self.retain.split()[1])
        passed = 0
        if self.groups:
            low = min(g.hash_floor for g in self.groups.values())
            if low > self.trimmed:
                upto, s = min(low, self.trimmed + 5000), self.trimmed
                while s < upto and (length is None or s + 1 <= self.last - length):
                    s += 1
                for seq in range(self.trimmed + 1, s + 1):
                    if seq in self.records and not self._pinned(seq):
                        del self.records[seq]
                passed, self.trimmed = s - self.trimmed, s
        if self.retain == "- -" and self.trimmed >= self.last:
            self.retain = None
            return False, self.trimmed, passed
        return True, self.trimmed, passed

    # -- what can be observed ------------------------------------------------------

    def observe(self) -> dict:
        groups = {}
        for name, g in self.groups.items():
            groups[name] = {
                "ack_floor": g.floor(),
                "cursor": g.cursor,
                "pending": g.pending(self.last),
                "in_flight": len(g.lease),
                "expired_leases": sum(1 for dl in g.lease.values() if dl <= self.now),
                "ready": len(g.ready),
                "delayed": len(g.delay),
                "counters": dict(g.counters),
                "consumers": sorted(g.members.items()),
                "leases": dict(sorted(g.lease.items())),
                "states": {s: (d.count, d.holder, d.token, list(d.past)) for s, d in sorted(g.dlv.items())},
                "ready_seqs": sorted(g.ready),
                "delay_seqs": dict(sorted(g.delay.items())),
            }
        return {
            "last_seq": self.last,
            "records": sorted(self.records),
            "scheduled": sum(1 for nb in self.sched.values() if nb > self.now),
            "dead_letters": sorted((d.group, d.seq, d.reason, d.deliveries) for d in self.dlq.values()),
            "groups": groups,
        }
