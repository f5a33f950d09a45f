"""The doctor: checks that a queue's keys in Redis agree with each other, and
repairs what can be repaired without losing or repeating a message
(docs/doctor.md).

It reads each key by its name (engine/keys.py), but for one SCAN of the
queue's group hashes (groups the floors hash lost), and big
keys in bounded steps (engine/doctor_reads.py); each repair is one atomic script
call (lua/repair.lua) that acts only while what the doctor saw is still so.
The reads are not one snapshot, so on a queue in use they see moments that
never were one state; each finding is confirmed in one atomic look
(repair.lua's check form) before it is reported, and dropped if it is gone.

Long because each invariant of a group's keys is checked here beside the
finding it makes and the repair that finding allows; split by invariant,
the checks would read the same keys several times.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from . import schedules
from .engine import commands, schedule_store
from .engine import doctor_reads as reads
from .engine.keys import GroupKeys, LogLayout, QueueKeys
from .engine.log import MIGRATING
from .engine.store import DELETING
from .errors import CorruptRecord, InvalidInput
from .partitions import PartitionedQueue
from .protocols import AnyQueue
from .queue import Queue

# Progress of a long check: (what, done, total).
UNTRACKED_MAX = 1000  # untracked seqs reported one by one per group
# Leaked side records named, and deleted, per finding (one repair call, as
# repair.lua's SIDE_LEAK_MAX).
SIDE_LEAK_MAX = 1000
Progress = Callable[[str, int, int], None]


class Kind(StrEnum):
    """What a finding is about."""

    META_MISSING = "meta-missing"  # no last seq while records or settled messages exist
    FLOW_FLAG_MISSING = "flow-flag-missing"  # no field prio while priority or keyed messages are there
    BAD_NUMBER = "bad-number"  # a seq field that is not a whole number >= 0
    LAST_BELOW_CURSOR = "last-below-cursor"  # the last seq is below a group's cursor
    CURSOR_BELOW_FLOOR = "cursor-below-floor"  # it would hand out settled messages again
    CURSOR_BELOW_RUN = "cursor-below-acked-run"  # ditto, for seqs settled above the floor
    CURSOR_BELOW_DELIVERY = "cursor-below-delivery"  # it would hand out again what the group holds or will redeliver
    RUN_OUT_OF_PLACE = "acked-run-out-of-place"  # at or below the floor, reversed or overlapping
    LEASE_WITHOUT_STATE = "lease-without-state"
    STATE_WITHOUT_LEASE = "state-without-lease"  # held by a member, never runs out
    STATE_STRANDED = "state-stranded"  # waiting in no set, or held by a consumer that is no member
    STATE_UNPARSED = "state-unparsed"
    UNTRACKED = "untracked"  # read by the group, neither settled nor delivered nor waiting
    COUNT_MISMATCH = "count-mismatch"  # a member's held count, or acked_above
    RECORD_MISSING = "record-missing"  # an unsettled seq without its record
    INCARNATION_EMPTY = "incarnation-empty"
    DEAD_LETTER_SEQ_TAKEN = "dead-letter-seq-taken"  # the next dead letter would overwrite one
    KEY_STRANDED = "key-stranded"  # an ordering key with messages waiting, neither ready nor busy
    STUB_MISSING = "stub-missing"  # stream log: a side record whose stub entry is gone (read from the side)
    SIDE_LEAKED = "side-record-leaked"  # stream log: a side record at or below the trim point nothing deletes
    GROUP_UNREGISTERED = "group-unregistered"  # a group's hash, while the floors hash (the registry) lacks it
    CALL_DAMAGED = "call-damaged"  # stream log: a call record, its deadline or first seq, or callout disagree
    MIGRATION_UNFINISHED = "migration-unfinished"  # a move to the stream layout was cut off (rqueue migrate)
    DELETE_UNFINISHED = "delete-unfinished"  # a queue's delete was cut off: groups are refused until it ends
    SCHEDULE_MISSING = "schedule-missing"  # the prefix's registry names a schedule of the queue whose hash is gone


class Outcome(StrEnum):
    """What a repair did."""

    REPAIRED = "repaired"
    GONE = "gone"  # no longer so when the repair ran: nothing changed


@dataclass(frozen=True)
class Finding:
    """One broken invariant: its kind, the key it is in, what is wrong and,
    when it is safe to repair, how (``repair`` says it in words)."""

    kind: Kind
    key: str
    detail: str
    queue: str
    group: str | None = None
    seq: int | None = None
    repair: str | None = None  # what --repair does, None: not repaired (docs/doctor.md says why)
    fix: tuple[str, ...] = field(default=(), repr=False, compare=False)  # repair.lua's arguments
    # repair.lua's check of a finding without a repair; () with a fix: the fix's
    # own check; () without one: damage that does not come and go (kept as read)
    check: tuple[str, ...] = field(default=(), repr=False, compare=False)

    def as_json(self) -> dict[str, Any]:
        return {
            "kind": str(self.kind),
            "queue": self.queue,
            "group": self.group,
            "key": self.key,
            "seq": self.seq,
            "detail": self.detail,
            "repair": self.repair,
        }


@dataclass(frozen=True)
class Repair:
    """What one repair did."""

    finding: Finding
    outcome: Outcome
    detail: str

    def as_json(self) -> dict[str, Any]:
        return {"finding": self.finding.as_json(), "outcome": str(self.outcome), "detail": self.detail}


def parts(queue: AnyQueue) -> list[Queue]:
    """The plain queues the doctor checks: the queue, or each partition."""
    if isinstance(queue, PartitionedQueue):
        return list(queue.parts)
    if isinstance(queue, Queue):
        return [queue]
    raise TypeError(f"expected a Queue or a PartitionedQueue, not {type(queue).__name__}")


def examine(queue: AnyQueue, progress: Progress | None = None) -> list[Finding]:
    """Every finding in ``queue`` (each partition of a partitioned one),
    each confirmed in one atomic look."""
    return [f for q in parts(queue) for f in _Examination(q, progress).run() if _still_so(q, f)]


def repair(queue: AnyQueue, findings: list[Finding]) -> list[Repair]:
    """Repairs each finding that has a repair, one atomic call each; the
    counts of a group last, after what changes them."""
    by_name = {q.name if q.partition is None else f"{q.name}/{q.partition}": q for q in parts(queue)}
    todo = [f for f in findings if f.fix]
    todo.sort(key=lambda f: f.fix[0] == "counts")
    done: list[Repair] = []
    for f in todo:
        q = by_name[f.queue]
        reply = commands.repair(q.group_call(f.group or ""), f.fix[0], f.fix[1:])
        done.append(Repair(f, Outcome.REPAIRED if reply.done else Outcome.GONE, reply.detail))
    return done


def _still_so(q: Queue, f: Finding) -> bool:
    check = f.check or f.fix
    if not check:
        return True
    return commands.still_so(q.group_call(f.group or ""), check[0], check[1:])


def _seq(text: str | None) -> int | None:
    """A stored seq, None when it is not a whole number >= 0 (missing: 0)."""
    if text is None:
        return 0
    return int(text) if text.isdigit() else None


class _Examination:
    def __init__(self, queue: Queue, progress: Progress | None) -> None:
        self.q = queue
        self.r = queue.client.redis
        self.keys = queue.keys
        self.where = queue.keys.base
        self.name = queue.name if queue.partition is None else f"{queue.name}/{queue.partition}"
        self.progress = progress
        self.found: list[Finding] = []
        self.highest = 0  # the highest seq any group knows of
        self.pulled = False  # a group pulled from the priority log (its field pcur)
        # Up to which seq a record missing at or below a group's since went
        # as settled (a hash log deletes one once the groups of then settled
        # it), above it lost: a stream log drops entries only by the trim,
        # unless meta field "gaps" says they went one by one, up to meta
        # field "gaps_to" where it holds a seq (None: no bound)
        # (lua/includes/missing_record.lua).
        self.gaps_to: int | None = None

    def schedules(self) -> None:
        """Each schedule that the prefix's registry says publishes to this
        queue (or partition) has its hash: one without never fires, and
        nothing else says so. Not repaired: its definition went with it."""
        client = self.q.client
        for name, queue in sorted(schedule_store.registry(self.r, client.prefix).items()):
            if queue != self.q.name:
                continue
            try:
                key = schedules.target(client, queue, name).keys.schedule(name)
            except (InvalidInput, CorruptRecord):
                continue  # the scheduler logs a queue it cannot open
            if key.startswith(self.keys.base + ":") and not reads.key_exists(self.r, key, self.where):
                self.add(
                    Kind.SCHEDULE_MISSING,
                    key,
                    f"schedule {name!r} is in the prefix's registry, but its hash is gone: it fires no more. "
                    f"Define it again, or remove it (`rqueue schedules remove {name}`)",
                )

    def gaps_bound(self, meta: dict[str, str]) -> int | None:
        """The last seq of a stream log that may lack its entry by right: 0
        without "gaps", "gaps_to" where it holds a seq, else None (any)."""
        if "gaps" not in meta:
            return 0
        text = meta.get("gaps_to")
        bound = None if text is None else _seq(text)
        if text is not None and bound is None:
            # As fetch reads it: no bound (a missing record is passed over, not dead-lettered).
            self.add(Kind.BAD_NUMBER, self.keys.meta, f"field gaps_to holds {text[:40]!r}, not a seq")
        return bound

    def add(self, kind: Kind, key: str, detail: str, **kw: Any) -> None:
        self.found.append(Finding(kind, key, detail, self.name, **kw))

    def run(self) -> list[Finding]:
        keys = self.keys
        meta = reads.hash_all(self.r, keys.meta, self.where)
        if meta.get("layout") == MIGRATING:
            # Its records are split between the two logs: the other checks
            # would read half of them as missing.
            self.add(
                Kind.MIGRATION_UNFINISHED,
                keys.meta,
                f"field layout is {MIGRATING}: a move to the stream layout was cut off after copying records up "
                f"to seq {meta.get('migrated', '0')}; every call is refused until `rqueue migrate --to stream` "
                "finishes it",
            )
            return self.found
        if DELETING in meta:
            self.add(
                Kind.DELETE_UNFINISHED,
                keys.meta,
                f"field {DELETING} is set: a delete of the queue was cut off, and no group joins it until "
                "Queue.delete() runs again and ends it",
            )
        floors = reads.hash_all(self.r, keys.floors, self.where)
        if keys.layout is LogLayout.STREAM:
            self.gaps_to = self.gaps_bound(meta)
        last = _seq(meta.get("seq"))
        if last is None:
            self.add(Kind.BAD_NUMBER, keys.meta, f"field seq holds {meta['seq'][:40]!r}, not a seq")
        if "inc" in meta and not meta["inc"].strip():
            self.add(Kind.INCARNATION_EMPTY, keys.meta, "field inc (the queue's incarnation id) is empty")
        for group in sorted(floors):
            self.group(group, floors[group], last if meta.get("seq") is not None else None, "prio" in meta)
        named = reads.group_names(self.r, keys, self.where)
        for group in sorted(named - floors.keys()):
            self.unregistered(
                group, not floors and len(named) == 1, meta, last if meta.get("seq") is not None else None
            )
        self.schedules()
        if meta.get("seq") is None:
            depth = reads.log_length(self.r, keys, self.where)
            settled = any(v != "0" for v in floors.values())
            # A stream log refuses ids at or below the newest it ever held.
            newest = reads.log_newest(self.r, keys, self.where)
            if depth or settled or newest:
                top = max(self.highest, self.highest_record() if depth else 0, newest)
                self.add(
                    Kind.META_MISSING,
                    keys.meta,
                    f"no field seq (the last seq) while {depth} records are stored"
                    + (" and groups settled messages" if settled else "")
                    + ": a publish would reuse seqs, so publishing is refused. The queue's incarnation, pause "
                    "(or hold) and retention mode were kept in the same hash and are not restored: pause it or set "
                    "its retention again if it had one",
                    repair=f"write the last seq {top}, the highest seq any group or record knows of",
                    fix=("meta", str(top)),
                )
        if "prio" not in meta and (self.pulled or reads.key_exists(self.r, keys.prio, self.where)):
            self.add(
                Kind.FLOW_FLAG_MISSING,
                keys.meta,
                "no field prio, though the queue has had priority or keyed messages (its priority log, or a "
                "group's pull position, is there): fetch would read them by seq again, and hand out a second "
                "time those it handed out apart from the cursor",
                repair="write field prio",
                fix=("prio",),
            )
        self.side_leaks(_seq(meta.get("trimmed")) or 0, bool(floors))
        self.dead_letter_seq()
        return self.found

    def unregistered(self, group: str, alone: bool, meta: dict[str, str], last: int | None) -> None:
        """A group whose hash is there while the floors hash (its ack floor,
        and the registry of groups the doctor, join and the trim read) has
        no field for it. Its floor is known only when it is the queue's one
        group (``alone``: no other hash, an empty floors hash) outside
        retention mode: every settle that moved it wrote it as the trim
        point too (includes/settle.lua). Even then it is taken only when the
        group's keys agree with it (the group examined at that floor leaves
        no seq untracked, no cursor below it or a run)."""
        keys, gk = self.keys, self.keys.group(group)
        floor = meta.get("trimmed", "0")
        known = alone and "retain" not in meta and floor.isdigit()
        if known:
            probe = _Examination(self.q, None)
            probe.group(group, floor, last, "prio" in meta)
            known = not any(f.kind in _FLOOR_DISAGREES for f in probe.found)
        self.add(
            Kind.GROUP_UNREGISTERED,
            keys.floors,
            f"{gk.state} holds the state of group {group!r}, but {keys.floors} has no field {group} (its ack floor "
            "and its entry in the registry of groups): join refuses the group, the trim does not wait for it, "
            "and the doctor, groups() and stats() do not see it"
            + (
                ""
                if known
                else f". Its floor is not known (every seq at or below it is settled by the group; the trim point "
                f"{floor} is at or below it): set the field back to it (HSET {keys.floors} {group} <floor>), or "
                "delete the group's keys to start it afresh"
            ),
            group=group,
            repair=f"register it again with the ack floor {floor}, the trim point (the queue's one group settled "
            "every seq up to it, and its keys agree)"
            if known
            else None,
            fix=("register", floor) if known else (),
            check=() if known else ("unregistered",),
        )

    def side_leaks(self, trimmed: int, groups: bool) -> None:
        """Stream layout: the side records at or below the trim point whose
        priority log entry is gone (a deleted key or entry), or all of them
        in a queue without ``groups``: no fetch deletes them
        (lua/includes/side_sweep.lua), so they stay for good."""
        keys = self.keys
        seqs, more = reads.side_leaks(self.r, keys, trimmed, SIDE_LEAK_MAX, self.where, groups)
        if not seqs:
            return
        shown = ", ".join(str(s) for s in seqs[:10]) + (", ..." if len(seqs) > 10 else "")
        self.add(
            Kind.SIDE_LEAKED,
            keys.side,
            f"{len(seqs)}{' or more' if more else ''} records of seqs at or below the trim point {trimmed} "
            f"({shown}) stay in the side hash "
            + (
                f"without their priority log entries ({keys.prio}), by which fetches delete them"
                if groups
                else "of a queue without groups, where no fetch deletes them"
            )
            + ": no group needs them",
            repair=f"delete these {len(seqs)} side records (run again for more)" if more else "delete them",
            fix=("side-leak", *(str(s) for s in seqs)),
        )

    def highest_record(self, keys: QueueKeys | None = None) -> int:
        """The highest seq with a stored record in this queue (or ``keys``:
        its dead-letter queue), the records read in steps."""
        top = 0
        for seqs in reads.record_seqs_in_steps(self.r, keys or self.keys, self.where):
            top = max([top, *seqs])
        return top

    def dead_letter_seq(self) -> None:
        """The dead-letter queue's next seq is free (else dead-lettering is refused)."""
        dlq = self.keys.dead_letters
        text = reads.hash_all(self.r, dlq.meta, self.where).get("seq")
        last = _seq(text)
        if last is None:
            self.add(Kind.BAD_NUMBER, dlq.meta, f"field seq holds {str(text)[:40]!r}, not a seq")
            return
        if reads.log_length(self.r, dlq, self.where) and reads.records_exist(self.r, dlq, [last + 1])[0]:
            top = self.highest_record(dlq)
            self.add(
                Kind.DEAD_LETTER_SEQ_TAKEN,
                dlq.meta,
                f"field seq is {last}, but dead letter {last + 1} exists in {dlq.msgs}: dead-lettering is refused",
                repair=f"raise it to {top}, the highest dead letter stored",
                fix=("dead-letter-seq", str(top)),
            )

    def group(self, group: str, floor_text: str, last: int | None, flow: bool = False) -> None:
        """``flow``: the queue had priority or keyed messages (meta field prio)."""
        gk = self.keys.group(group)
        state = reads.hash_all(self.r, gk.state, self.where)
        self.pulled = self.pulled or "pcur" in state
        floor, cursor = _seq(floor_text), _seq(state.get("cursor"))
        if floor is None:
            self.add(
                Kind.BAD_NUMBER,
                self.keys.floors,
                f"field {group} (the ack floor) holds {floor_text[:40]!r}",
                group=group,
            )
        if cursor is None:
            self.add(Kind.BAD_NUMBER, gk.state, f"field cursor holds {state['cursor'][:40]!r}", group=group)
        if floor is None or cursor is None:
            return
        runs: list[tuple[int, int]] = []
        for run_page in reads.zset_in_steps(self.r, gk.acked, self.where):
            for first, end in run_page:
                if first.isdigit():
                    runs.append((int(first), int(end)))
                else:
                    self.add(Kind.RUN_OUT_OF_PLACE, gk.acked, f"member {first[:40]!r} is not a seq", group=group)
        leases = {int(m) for page in reads.zset_in_steps(self.r, gk.lease, self.where) for m, _ in page if m.isdigit()}
        waiting = {
            int(m)
            for key in (gk.ready, gk.delay)
            for page in reads.zset_in_steps(self.r, key, self.where)
            for m, _ in page
        }
        states: dict[int, str] = {}
        for state_page in reads.hash_in_steps(self.r, gk.deliveries, self.where):
            states.update((int(f), v) for f, v in state_page if f.isdigit())
        members = reads.hash_all(self.r, gk.consumers, self.where)
        if self.keys.layout is LogLayout.STREAM:
            # A call delivery is judged as the state and lease a split gives it.
            for on_call, raw in self.check_calls(gk, group, state, states).items():
                states[on_call] = raw
                leases.add(on_call)
        # Priority messages are handed out apart from the cursor (fetch.lua): waiting
        # in the group's priority set or in the log above its pull cursor.
        prioritized = {int(s) for page in reads.zset_in_steps(self.r, self.keys.prio, self.where) for _, s in page}
        pulled = _seq(state.get("pcur")) or floor
        waiting |= {int(m) for page in reads.zset_in_steps(self.r, gk.priority, self.where) for m, _ in page}
        # Messages of ordering keys wait in the group's key queue ("<key> <seq>").
        queued: dict[str, int] = {}  # ordering key -> its messages waiting
        for page in reads.zset_in_steps(self.r, gk.key_queue, self.where):
            for m, _ in page:
                key, _, seq = m.rpartition(" ")
                waiting.add(int(seq))
                queued[key] = queued.get(key, 0) + 1
        waiting |= {s for s in prioritized if s > pulled}
        known = max([floor, cursor, *(end for _, end in runs), *leases, *states, *waiting])
        self.highest = max(self.highest, known)
        # Where the scan of new messages has read to: priority and keyed
        # messages are handed out apart from it, so one held or settled
        # above it says nothing of the plain messages below it, unread.
        # A stream log also tells them by their own entries, which stay
        # when the priority log (or an entry of it) is lost.
        read_to = [
            next(self.by_scan(range(end, first - 1, -1), prioritized), 0) if end > cursor else 0 for first, end in runs
        ]
        scanned = max(
            [
                floor,
                cursor,
                *read_to,
                *self.by_scan(sorted(s for s in leases | states.keys() | waiting if s > cursor), prioritized),
            ]
        )

        # The cursor: at or above the floor and every acked run; a repair
        # moves it up to the highest seq the scan settled or holds, so that
        # nothing above it was delivered by the scan (nothing is handed out
        # twice) and nothing below it is unread (nothing is skipped).
        if last is not None and cursor > last:
            self.add(
                Kind.LAST_BELOW_CURSOR,
                self.keys.meta,
                f"field seq is {last}, below the cursor {cursor} of {gk.state}",
                group=group,
                check=("last-below-cursor",),
            )
        # With priority or keyed messages the floor may pass the cursor: they
        # are settled apart from the scan, which starts above the floor.
        below_floor = cursor < floor and not flow
        if flow:
            cursor = max(cursor, floor)
        behind = [end for (_, end), read in zip(runs, read_to, strict=True) if read > cursor]
        # A delivery the scan made (no priority or keyed message) is at or
        # below the cursor: above it, the scan of a plain queue would hand
        # the message out again as new while it is held or waits for its
        # redelivery. A queue that had priority or keyed messages is not
        # judged so: its scan passes over seqs with a delivery state, and
        # one above the cursor may be a priority message whose entry in the
        # priority log is gone, with unread plain messages below it that a
        # raised cursor would skip.
        ahead = [] if flow else [s for s in leases | states.keys() | waiting if s > cursor and s not in prioritized]
        # No cursor at all (a deleted group hash) while the group has acked
        # runs or delivery states: fetch refuses every call (whatever they hold).
        missing = "cursor" not in state and bool(runs or states)
        if below_floor or behind or ahead or missing:
            if below_floor or behind or (missing and runs):
                kind = Kind.CURSOR_BELOW_FLOOR if below_floor else Kind.CURSOR_BELOW_RUN
                what = (
                    f"below the ack floor {floor}: fetch refuses to hand out settled messages again"
                    if below_floor
                    else f"below seq {max(behind)} the group settled: fetch refuses to hand out settled messages again"
                    if behind
                    else f"while {gk.acked} holds runs the group settled: fetch refuses every call"
                )
            else:
                kind = Kind.CURSOR_BELOW_DELIVERY
                what = (
                    f"below seq {max(ahead)}, which the group holds or will redeliver: fetch would hand it out "
                    "again as a new message"
                    if ahead
                    else f"while {gk.deliveries} holds deliveries of the group: fetch refuses every call"
                )
            self.add(
                kind,
                gk.state,
                f"field cursor is {state.get('cursor', 'missing')}, {what}",
                group=group,
                repair=f"set the cursor to {scanned}, the highest seq the group settled or holds "
                "(priority and keyed messages aside: they are handed out apart from the cursor)",
                fix=("cursor", state.get("cursor", "0"), str(scanned)),
            )
        self.check_runs(gk, group, floor, runs, state)
        self.check_deliveries(gk, group, leases, waiting, states, members)
        self.check_untracked(gk, group, floor, cursor, runs, states.keys() | leases | waiting, prioritized, pulled)
        self.check_records(gk, group, cursor, last, _seq(state.get("since")), states, runs)
        self.check_keys(gk, group, queued)

    def by_scan(self, seqs: Iterable[int], prioritized: set[int]) -> Iterator[int]:
        """Those of ``seqs`` the scan of new messages hands out, in their
        order: not priority or keyed messages, which are in the priority
        log (``prioritized``) or, in a stream log, marked by their own
        entries (read lazily, a step at a time)."""
        todo = (s for s in seqs if s not in prioritized)
        while step := list(itertools.islice(todo, reads.SCAN_STEP)):
            flow = reads.flow_seqs(self.r, self.keys, step)
            yield from (s for s in step if s not in flow)

    def check_calls(self, gk: GroupKeys, group: str, state: dict[str, str], states: dict[int, str]) -> dict[int, str]:
        """The call records of a stream log's group (lua/includes/call_state.lua):
        each parses, its out counts its bytes at 1, it has a deadline (cexp)
        and its first seq (cseq), no seq of it is also a delivery state, and
        callout is the sum of out; cexp and cseq name
        no other token. Returns the state a split would give each seq out on
        a call (seq -> state). Any fault is one finding, repaired by
        splitting every call out to the per-message path."""

        def calls_in(key: str) -> dict[str, float]:
            # The set's member at +inf is its pin (lua/includes/group_keys.lua, SKIPLIST_PIN), no call.
            return {m: sc for page in reads.zset_in_steps(self.r, key, self.where) for m, sc in page if sc != math.inf}

        deadlines, firsts = calls_in(gk.call_deadlines), calls_in(gk.call_seqs)
        out_on_calls: dict[int, str] = {}
        faults: list[str] = []
        total = 0
        tokens: set[str] = set()
        for page in reads.hash_in_steps(self.r, gk.calls, self.where):
            for token, raw in page:
                tokens.add(token)
                found = _CALL.match(raw)
                if found is None:
                    faults.append(f"field {token} does not parse: {raw[:80]!r}")
                    continue
                first, ms, out, bytes_, holder = int(found[1]), found[2], int(found[3]), found[4], found[5]
                total += out
                ones = [first + i for i, b in enumerate(bytes_) if b == "1"]
                if len(ones) != out:
                    faults.append(f"call {token} counts {out} out, and has {len(ones)} seqs out")
                if token not in deadlines or firsts.get(token) != first:
                    faults.append(f"call {token} has no deadline in {gk.call_deadlines} or first seq in {gk.call_seqs}")
                for seq in ones:
                    if seq in states:
                        faults.append(f"seq {seq} is out on call {token} and has a delivery state")
                    else:  # (one above the cursor is the cursor's finding)
                        out_on_calls[seq] = f"1:{holder}:{ms}:{ms}:{token}"
        for token in sorted((deadlines.keys() | firsts.keys()) - tokens):
            faults.append(f"token {token} of {gk.call_deadlines} or {gk.call_seqs} has no call record")
        callout = _seq(state.get("callout", "0"))
        if callout != total:
            faults.append(f"{gk.state} field callout is {state.get('callout', 'missing')}, and calls hold {total}")
        if faults:
            self.add(
                Kind.CALL_DAMAGED,
                gk.calls,
                "; ".join(faults[:10]) + (f" (and {len(faults) - 10} more)" if len(faults) > 10 else ""),
                group=group,
                repair="split every call out to a delivery state and a lease each, and drop the call keys",
                fix=("calls",),
            )
        return out_on_calls

    def check_keys(self, gk: GroupKeys, group: str, queued: dict[str, int]) -> None:
        """Every ordering key with messages waiting in the group's key queue
        is in line: ready (kready), or busy (kbusy, which brings it back
        once its deliveries settle). A key in neither is never looked at by
        a fetch again: its messages would wait for good."""
        if not queued:
            return
        in_line: set[str] = set()
        for line in (gk.key_ready, gk.key_busy):
            for page in reads.zset_in_steps(self.r, line, self.where):
                in_line.update(m for m, _ in page)
        for key in sorted(queued.keys() - in_line)[:UNTRACKED_MAX]:
            self.add(
                Kind.KEY_STRANDED,
                gk.key_queue,
                f"ordering key {key!r} has {queued[key]} message(s) waiting but is neither ready ({gk.key_ready}) "
                f"nor busy ({gk.key_busy}): no fetch would hand them out",
                group=group,
                repair="put the key at the back of the ready keys",
                fix=("key-stranded", key),
            )

    def check_runs(
        self, gk: GroupKeys, group: str, floor: int, runs: list[tuple[int, int]], state: dict[str, str]
    ) -> None:
        previous = floor
        for first, end in sorted(runs):
            if first > end or first <= previous:
                self.add(
                    Kind.RUN_OUT_OF_PLACE,
                    gk.acked,
                    f"run {first}..{end} is reversed, at or below the ack floor {floor}, or overlaps the run before",
                    group=group,
                    seq=first,
                )
            previous = max(previous, end)
        above = sum(end - first + 1 for first, end in runs)
        stored = _seq(state.get("acked_above"))
        if stored != above:
            self.add(
                Kind.COUNT_MISMATCH,
                gk.state,
                f"field acked_above is {state.get('acked_above', '0')}, but the acked runs hold {above} seqs",
                group=group,
                repair="recompute the counts from the runs, leases and states",
                fix=("counts",),
            )

    def check_deliveries(
        self,
        gk: GroupKeys,
        group: str,
        leases: set[int],
        waiting: set[int],
        states: dict[int, str],
        members: dict[str, str],
    ) -> None:
        for seq in sorted(leases - states.keys()):
            self.add(
                Kind.LEASE_WITHOUT_STATE,
                gk.lease,
                f"seq {seq} is leased but has no delivery state in {gk.deliveries}",
                group=group,
                seq=seq,
                repair="move it to the dead-letter queue as corrupted-state (its count and holder are lost)",
                fix=("lease-without-state", str(seq)),
            )
        held: dict[str, int] = {}
        for seq, raw in sorted(states.items()):
            parsed = reads.state_holder(raw)
            if parsed is None:
                self.add(
                    Kind.STATE_UNPARSED,
                    gk.deliveries,
                    f"the state of seq {seq} does not parse: {raw[:80]!r}"
                    + ("" if seq in leases or seq in waiting else " (and it waits in no set)"),
                    group=group,
                    seq=seq,
                )
                continue
            _, holder = parsed
            if holder and holder not in members:
                self.add(
                    Kind.STATE_STRANDED,
                    gk.deliveries,
                    f"seq {seq} is held by {holder!r}, no member of the group",
                    group=group,
                    seq=seq,
                    repair="make it ready again, its count kept",
                    fix=("state-without-lease", str(seq)),
                )
            elif holder and seq not in leases:
                self.add(
                    Kind.STATE_WITHOUT_LEASE,
                    gk.deliveries,
                    f"seq {seq} is held by {holder!r} but has no lease in {gk.lease}: it would never run out",
                    group=group,
                    seq=seq,
                    repair="give it a lease that runs out now, so the next fetch offers it again",
                    fix=("state-without-lease", str(seq)),
                )
            elif not holder and seq not in waiting and seq not in leases:
                self.add(
                    Kind.STATE_STRANDED,
                    gk.deliveries,
                    f"seq {seq} waits for redelivery in no set ({gk.ready}, {gk.delay})",
                    group=group,
                    seq=seq,
                    repair="make it ready again, its count kept",
                    fix=("state-without-lease", str(seq)),
                )
            if holder and seq in leases:
                held[holder] = held.get(holder, 0) + 1
        for member, count in sorted(members.items()):
            if _seq(count) != held.get(member, 0):
                self.add(
                    Kind.COUNT_MISMATCH,
                    gk.consumers,
                    f"field {member} (deliveries it holds) is {count}, but it holds {held.get(member, 0)} leases",
                    group=group,
                    repair="recompute the counts from the runs, leases and states",
                    fix=("counts",),
                )

    def check_untracked(
        self,
        gk: GroupKeys,
        group: str,
        floor: int,
        cursor: int,
        runs: list[tuple[int, int]],
        tracked: set[int],
        prioritized: set[int],
        pulled: int,
    ) -> None:
        """Every seq the group read (floor < seq <= cursor, and the priority
        and keyed messages it pulled from the priority log, up to its pull
        position ``pulled``, whatever its cursor) is settled (in an acked
        run), has a delivery state or waits (a pulled one in the group's
        priority set or key queue, until handed out): else nothing would
        ever hand it out, and the floor could never pass it.
        Such a seq is made ready only when no group can have settled it: its
        record is stored and no group counts it settled (a record goes when
        its last group settles it). Otherwise (an acked run lost, say)
        handing it out again could run a handler after its ack, so it is
        reported alone; always so for a stream log, whose records stay until
        the lowest floor passes them and which keeps no counts."""
        covered = sorted((first, end) for first, end in runs if end > floor)
        lost: list[int] = []
        seq, i = floor + 1, 0
        while seq <= cursor and len(lost) <= UNTRACKED_MAX:
            while i < len(covered) and covered[i][1] < seq:
                i += 1
            if i < len(covered) and covered[i][0] <= seq:
                seq = covered[i][1] + 1
                continue
            if seq not in tracked:
                lost.append(seq)
            seq += 1
        i = 0
        for seq in sorted(s for s in prioritized if cursor < s <= pulled):
            if len(lost) > UNTRACKED_MAX:
                break
            while i < len(covered) and covered[i][1] < seq:
                i += 1
            if not (i < len(covered) and covered[i][0] <= seq) and seq not in tracked:
                lost.append(seq)
        shown = lost[:UNTRACKED_MAX]
        stored = reads.records_exist(self.r, self.keys, shown)
        settled = reads.settled_counts(self.r, self.keys, shown)
        for seq, there, count in zip(shown, stored, settled, strict=True):
            where = (
                f"seq {seq} is at or below the cursor {cursor} and above the floor {floor}, "
                "but neither settled nor delivered nor waiting"
                if seq <= cursor
                else f"seq {seq}, a priority or keyed message the group pulled (its pull position is {pulled}), "
                f"is above the cursor {cursor} but neither settled nor delivered nor waiting in {gk.priority} "
                f"or {gk.key_queue}"
            )
            if there and not count and self.keys.layout is not LogLayout.STREAM:
                self.add(
                    Kind.UNTRACKED,
                    gk.state,
                    where + ": nothing would hand it out, and the floor would stop below it",
                    group=group,
                    seq=seq,
                    repair="pull it again from the priority log (its pull position goes back below it): the next "
                    "fetch hands it out by its priority or in its key's order"
                    if seq in prioritized
                    else "make it ready for redelivery (its record is stored and no group settled it)",
                    fix=("untracked", str(seq)),
                )
            else:
                why = (
                    "its record is gone"
                    if not there
                    else f"{count} group(s) settled it"
                    if count
                    else "its stream log keeps records settled above the lowest floor"
                )
                self.add(
                    Kind.UNTRACKED,
                    gk.state,
                    f"{where}; {why}, so it may have been settled (a damaged acked run): not handed out again",
                    group=group,
                    seq=seq,
                    check=("lost-seq", str(seq)),
                )
        if len(lost) > UNTRACKED_MAX:
            self.add(
                Kind.UNTRACKED,
                gk.state,
                f"more seqs than these {UNTRACKED_MAX} are untracked between the floor {floor} and the cursor "
                f"{cursor}, or pulled above it (is {gk.acked} damaged?)",
                group=group,
            )

    def check_records(
        self,
        gk: GroupKeys,
        group: str,
        cursor: int,
        last: int | None,
        since: int | None,
        states: dict[int, str],
        runs: list[tuple[int, int]],
    ) -> None:
        """Every message the group has not settled has its record: those
        in flight or waiting (a state), and those not read yet (above the
        cursor, but a record deleted as settled, see gaps_to, or one
        in an acked run: a priority or keyed message settled apart from
        the cursor)."""
        top = last if last is not None else cursor
        passed = since if since is not None else top  # the scan passes over a missing record up to it
        start = max(cursor, passed if self.gaps_to is None else min(passed, self.gaps_to))
        if top > start:
            # A last seq far above what is stored (damaged, or set by hand)
            # is one finding, not one per seq: the scan stops at the records.
            highest = self.highest_record()
            if top - max(highest, start) > UNTRACKED_MAX:
                self.add(
                    Kind.RECORD_MISSING,
                    self.keys.msgs,
                    f"seqs {max(highest, start) + 1} to {top} are not settled by group {group} but have no "
                    f"record: the last seq {top} is above the highest stored record {highest}",
                    group=group,
                )
                top = max(highest, start)
        # The seqs the group holds, those above the cursor (a priority or
        # keyed message handed out apart from it) left to the scan above it:
        # each seq is looked at, and listed, once.
        held = sorted(s for s in states if not start < s <= top)
        total = len(held) + max(0, top - start)
        todo = itertools.chain(
            _chunks(held, reads.SCAN_STEP),
            (
                list(range(low, min(top, low + reads.SCAN_STEP - 1) + 1))
                for low in range(start + 1, top + 1, reads.SCAN_STEP)
            ),
        )
        done = missing = 0
        for seqs in todo:
            for seq, (there, stubless) in zip(seqs, reads.record_states(self.r, self.keys, seqs), strict=True):
                if stubless and not any(first <= seq <= end for first, end in runs):
                    missing += 1
                    if missing <= UNTRACKED_MAX:
                        self.add(
                            Kind.STUB_MISSING,
                            self.keys.msgs,
                            f"seq {seq} is not settled by group {group} and its stub entry is gone from the "
                            f"log, but its record is in {self.keys.side}: fetch reads it there, so the message "
                            "is handed out (nothing to repair)",
                            group=group,
                            seq=seq,
                        )
                if there or any(first <= seq <= end for first, end in runs):
                    continue
                missing += 1
                if missing > UNTRACKED_MAX:
                    self.add(
                        Kind.RECORD_MISSING,
                        self.keys.msgs,
                        f"more than these {UNTRACKED_MAX} seqs not settled by group {group} have no record; "
                        "the check stopped there",
                        group=group,
                    )
                    return
                self.add(
                    Kind.RECORD_MISSING,
                    self.keys.msgs,
                    f"seq {seq} is not settled by group {group} but has no record: the group's fetch "
                    "moves it to the dead-letter queue as missing-record",
                    group=group,
                    seq=seq,
                    check=("record-missing", str(seq)),
                )
            done += len(seqs)
            if self.progress is not None:
                self.progress(f"records of {self.name} for {group}", done, total)


# What an unregistered group's keys show when the floor it is given is wrong.
_FLOOR_DISAGREES = {
    Kind.BAD_NUMBER,
    Kind.CURSOR_BELOW_FLOOR,
    Kind.CURSOR_BELOW_RUN,
    Kind.RUN_OUT_OF_PLACE,
    Kind.UNTRACKED,
    Kind.LAST_BELOW_CURSOR,
}

# A call record (lua/includes/call_state.lua): first seq, fetch ms, out, bytes, holder.
_CALL = re.compile(r"(\d+) (\d+) (\d+) ([01]+) (\S+)\Z")


def _chunks(items: list[int], size: int) -> Iterator[list[int]]:
    for i in range(0, len(items), size):
        yield items[i : i + size]
