"""Model-based stateful test: random operations run against the real scripts
and against the pure-Python model of docs/guarantees.md in
tests/support/model.py; after every step the observable state of both must
be equal.

Operations: publish and publish_many (ids repeated inside and after the
de-duplication window, delays, mandatory), fetch by up to three consumers
of group A and two of group B (per-consumer prefetch, the queue's
max_inflight), ack (one delivery; a list through any live consumer, so late,
foreign and repeated tags too, as Delivery objects or tag texts), nack
(policy delay, now, with a delay), reject, term, in_progress, a settle of a
delivery right after its holder nacked it, a settle by tag text with a
token that fetch did not hand out with it, a Delivery handed to another
consumer (refused by the client before any call), lease expiry (the
ManualClock moves), consumer death (a member removed by another member's
heartbeat once its liveness passed; its next fetch joins it again),
graceful close and joining again, publishes with priorities, pause and
resume of a group and of the queue (refuse, hold), settings changes (max_deliveries,
redelivery_delay, redelivery_multiplier), replay of dead letters (all,
one group's, limited), group resets (to first, last or a seq, forced or
not, refused outside the stored seqs), retention by max_length set and
unset, and trim steps, completed events on or off for the example (on:
every ack goes through ack_result.lua, and each settle by an ack must have
recorded exactly one completed event; off: none), and Redis losing the queue's keys (a wipe, at most
MAX_WIPES per example: the queue starts again, each group's first consumer
joins again and must see the loss, the others on their next call) with
settles of deliveries from before it by their own consumers (refused:
LostDelivery once the consumer saw the loss, and nothing changes).

Compared after every step: per group the ack floor, cursor, pending, in
flight, expired leases, ready, delayed, the six counters, the members and
what each holds, every lease (seq, deadline), every open delivery state
(seq, count, holder, token, the deliveries taken back), the ready and the
delayed seqs (with due times); the queue's last seq, the seqs of the stored
records, the scheduled count and the dead letters (group, seq, reason,
deliveries). Compared per operation: the deliveries handed out (seq, count,
redelivered; payload and headers checked too), publish results (seq,
duplicate), nack statuses, in_progress deadlines, heartbeat results
(removed, returned, dead-lettered), close results, replay results, and
which exception was raised (AlreadyAcked, StaleDelivery, NotHeld,
UnknownDeliveryTag, NotMember, Unroutable, or the refusal of a closed
consumer). Checked without the model: max_inflight and prefetch, nothing a
group settled is delivered to it again, delivery counts exact, fetch order
(redeliveries lowest seq first, then new messages), one token per fetch
call, never one an earlier call had.

Groups are created at the start of each example (after 0-2 publishes to a
queue without a group); a group created later is not modelled.

CI runs a bounded, derandomized set of examples per backend and does not
shrink a failure (it prints the whole failing sequence). By hand:
RQUEUE_MODEL_EXAMPLES=2000 (random examples, shrinking, coverage printed
with -s), RQUEUE_MODEL_STEPS=100 for longer sequences, RQUEUE_MODEL_SHRINK=1
to shrink in the CI profile.
"""

from __future__ import annotations

import logging
import os
import re
import time
import uuid
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from support import callview, logview
from support.model import ERRORS, REPLAYED, Model, ModelError, Settings, Tag, ms
from support.raw import group_key

import rqueue
from rqueue.delivery import REPLAYED_HEADER
from rqueue.engine import commands
from rqueue.engine.keys import LAYOUT_ENV, LogLayout

QUEUE = "q"
SLOTS = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B"}  # consumer name -> group
KEEP_DELIVERIES = 40  # deliveries remembered for settling (stale ones included)
MAX_WIPES = 2  # per example: a wipe is cheap to reach and costly to follow

LONG = int(os.environ.get("RQUEUE_MODEL_EXAMPLES", "0") or 0)
STEPS = int(os.environ.get("RQUEUE_MODEL_STEPS", "0") or 0)
SHRINK = bool(LONG or os.environ.get("RQUEUE_MODEL_SHRINK"))
SETTINGS = settings(
    max_examples=LONG or 80,
    stateful_step_count=STEPS or (60 if LONG else 50),
    deadline=None,
    derandomize=not LONG,  # CI: the same examples on every run
    phases=[Phase.explicit, Phase.reuse, Phase.generate] + ([Phase.shrink] if SHRINK else []),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    print_blob=True,
)

COVERAGE: Counter[str] = Counter()  # what the examples exercised; printed by long runs

pick = st.integers(0, 10_000)
ids = st.sampled_from([None, None, None, "x", "y"])
delays = st.sampled_from([None, None, 0, 0.5, 1, 3])
ops = st.sampled_from(["ack", "nack", "reject", "term", "in_progress"])


class Handle:
    """One Consumer object and what the model needs to know about it."""

    def __init__(self, consumer: rqueue.Consumer, name: str, group: str, prefetch: int, liveness: float | None):
        self.consumer = consumer
        self.name = name
        self.group = group
        self.prefetch = prefetch
        self.liveness = liveness
        self.closed = False

    def __repr__(self) -> str:
        return f"{self.name}#{id(self) % 1000}"


def outcome(fn):
    """("ok", value) or ("err", exception class name) of one call."""
    try:
        return ("ok", fn())
    except ModelError as exc:
        return ("err", exc.code)
    except rqueue.RQueueError as exc:
        name = type(exc).__name__
        if name in ERRORS:
            return ("err", name)
        if type(exc) is rqueue.RQueueError and "is closed" in str(exc):
            return ("err", "Closed")
        raise


def _refused_closed():
    raise ModelError("Closed")


def _refused_not_held():
    raise ModelError("NotHeld")


def parse_state(raw: str) -> tuple[int, str, str, list[tuple[int, str, str, bool]]]:
    """(count, holder, token, deliveries taken back) of a delivery state
    "count:holder:first:last:token", then "\n<n>=<holder>=<token>" per
    delivery taken back, "!" for "=" when its holder nacked it
    (includes/delivery_state.lua). The test's consumer names hold no ":",
    "=" or "!"."""
    head, *lines = raw.split("\n")
    count, holder, _, _, token = head.split(":")
    past = []
    for line in lines:
        if replay := re.fullmatch(r"(\d+)\^", line):  # a replay restarted the count after n deliveries
            past.append((int(replay[1]), REPLAYED, "", False))
            continue
        match = re.fullmatch(r"(\d+)([=!])([^=]*)=([0-9a-z]*)", line)
        assert match, f"delivery state {raw!r}: history line {line!r}"
        past.append((int(match[1]), match[3], match[4], match[2] == "!"))
    return int(count), holder, token, past


def tag_of(d: rqueue.Delivery) -> Tag:
    return d.seq, d.delivery_count, d.token


class QueueMachine(RuleBasedStateMachine):
    url = ""  # set per backend by the tests

    def __init__(self) -> None:
        super().__init__()
        self.client: rqueue.Client | None = None

    # -- setup ------------------------------------------------------------------------

    @initialize(
        ack_wait=st.sampled_from([2.0, 5.0]),
        max_inflight=st.sampled_from([1, 2, 3, 4, 6, 1024]),
        max_deliveries=st.sampled_from([1, 2, 3, -1]),
        redelivery_delay=st.sampled_from([0.0, 0.5, 2.0]),
        multiplier=st.sampled_from([1.0, 2.0]),
        # at least 20 s: Redis also expires an id key after the window in wall-clock
        # time, so a shorter window could end during an example whatever the test
        # clock says (see test_dedup_window_follows_the_script_clock)
        dedup_window=st.sampled_from([20.0, 60.0]),
        two_groups=st.booleans(),
        early=st.lists(st.booleans(), max_size=2),  # publishes before any group; True = mandatory
        first=st.tuples(st.sampled_from([1, 2, 3, 100]), st.sampled_from([None, 1.5, 4.0, 20.0])),
        # completed events on: every ack goes through ack_result.lua instead of ack.lua
        completed=st.booleans(),
    )
    def setup(
        self,
        ack_wait,
        max_inflight,
        max_deliveries,
        redelivery_delay,
        multiplier,
        dedup_window,
        two_groups,
        early,
        first,
        completed=False,
    ):
        self.clock = rqueue.ManualClock()
        self.client = rqueue.connect(
            self.url,
            prefix=f"model-{uuid.uuid4().hex}",
            clock=self.clock,
            randomness=rqueue.Randomness(seed=1),
            settings_ttl=0,
        )
        self.q = self.client.queue(QUEUE)
        # Publishers run trim steps by themselves after their first publish
        # (rqueue/retention.py), on the wall clock: this one runs them only
        # by the trim rule (the intervals are patched by _no_background_trim).
        self.q.trim()
        values = dict(
            ack_wait=ack_wait,
            max_inflight=max_inflight,
            max_deliveries=max_deliveries,
            redelivery_delay=redelivery_delay,
            redelivery_multiplier=multiplier,
            dedup_window=dedup_window,
        )
        self.client.configure(QUEUE, **values)
        self.completed = completed
        if completed:
            self.client.configure(QUEUE, events=["completed"])
            COVERAGE["(examples with completed events)"] += 1
        self.model = Model(Settings(**values), self.clock.now_ms, stream_log=self.q.keys.layout is LogLayout.STREAM)
        self.handles: dict[str, Handle | None] = {slot: None for slot in SLOTS}
        self.deliveries: list[tuple[Handle, rqueue.Delivery]] = []
        # deliveries made before a wipe: nothing may settle them
        self.old_deliveries: list[tuple[Handle, rqueue.Delivery]] = []
        self.wipes = 0
        self.payloads = 0
        self.steps = 0
        self.groups = ["A", "B"] if two_groups else ["A"]
        # for the checks that do not use the model
        self.settled: dict[str, set[int]] = {g: set() for g in self.groups}
        self.seen_counts: dict[tuple[str, int], int] = {}
        self.reset_dead: set[tuple[str, int]] = set()  # dead letters a reset of their group made pending again
        self.tokens: set[str] = set()  # every token a fetch handed out
        self.real_cursor: dict[str, int] = {g: 0 for g in self.groups}
        self.key_last: dict[tuple[str, str], int] = {}  # (group, ordering key) -> its last seq handed out first
        self.key_concurrency_max = 1  # the highest key_concurrency configured
        # a queue without a group keeps what is published (a mandatory publish
        # is refused); its first groups start at 0 and see all of it
        for mandatory in early:
            self._publish_both([None], None, mandatory)
        for g in self.groups:
            self.model.create_group(g)
            self._join(f"{g.lower()}1", *first)

    def teardown(self) -> None:
        if self.client is None:
            return
        self.client.close()
        COVERAGE[f"(examples with {self.steps // 10 * 10}+ steps)"] += 1
        for g in self.model.groups.values():
            for k, v in g.counters.items():
                COVERAGE[f"(counter) {k}"] += v
            top = max((c for (gg, _), c in self.seen_counts.items() if gg == g.name), default=0)
            COVERAGE[f"(groups whose highest delivery count was) {top}"] += 1

    def _join(self, slot: str, prefetch: int, liveness: float | None) -> None:
        group = SLOTS[slot]
        c = self.q.consumer(group, name=slot, prefetch=prefetch, liveness=liveness)
        self.model.join(group, slot, liveness)
        self.handles[slot] = Handle(c, slot, group, prefetch, liveness)

    def _live_slots(self) -> list[str]:
        return [s for s, h in self.handles.items() if h is not None and SLOTS[s] in self.groups]

    def _handle(self, i: int) -> Handle:
        live = self._live_slots()
        return self.handles[live[i % len(live)]]  # type: ignore[return-value]

    def _delivery(self, i: int) -> tuple[Handle, rqueue.Delivery]:
        """Mostly one of the last four deliveries, sometimes any remembered one."""
        if i % 4:
            return self.deliveries[-1 - (i // 4) % min(4, len(self.deliveries))]
        return self.deliveries[(i // 4) % len(self.deliveries)]

    def _same(self, what: str, real, model) -> None:
        assert real == model, f"{what}: real {real!r} != model {model!r}"

    def _same_result(self, what: str, real, model) -> None:
        """As _same, for the outcome of an operation; counts what happened."""
        self._same(what, real, model)
        op = what.split()[0].split("(")[0]
        if real[0] == "err":
            label = real[1]
        elif op == "fetch":
            label = "redelivery" if any(c > 1 for _, c, _ in real[1]) else "new" if real[1] else "nothing"
        elif op == "publish":
            label = "duplicate" if any(dup for _, dup in real[1]) else "stored"
        elif op == "heartbeat":
            label = "removed members" if real[1][0] else "removed none"
        elif op == "close":
            label = "returned some" if real[1] else "returned none"
        elif op == "nack":
            label = real[1]
        else:
            label = "ok"
        COVERAGE[f"{op} -> {label}"] += 1

    # -- publish ----------------------------------------------------------------------

    def _publish_both(
        self,
        message_ids: list[str | None],
        delay: float | None,
        mandatory: bool = False,
        priorities: list[int] | None = None,
        ttl: float | None = None,
        keys: list[str | None] | None = None,
    ) -> None:
        items = []
        for mid in message_ids:
            self.payloads += 1
            headers = {"n": str(self.payloads)} if self.payloads % 2 else {}
            # the client writes a ttl as this header (ms): the model stores it as any header
            items.append(
                (b"p%d" % self.payloads, headers if ttl is None else {**headers, "x-rq-ttl": str(ms(ttl))}, mid)
            )
        payloads = [p for p, _, _ in items]
        # the real client gets the ttl as publish(ttl=) and writes the header itself
        headers = [{k: v for k, v in h.items() if k != "x-rq-ttl"} for _, h, _ in items]
        if len(items) == 1:
            real = outcome(
                lambda: [
                    self.q.publish(
                        payloads[0],
                        headers=headers[0],
                        id=message_ids[0],
                        delay=delay,
                        mandatory=mandatory,
                        priority=priorities[0] if priorities else 0,
                        ttl=ttl,
                        key=keys[0] if keys else None,
                    )
                ]
            )
        else:
            real = outcome(
                lambda: self.q.publish_many(
                    payloads,
                    headers=headers,
                    ids=message_ids,
                    delay=delay,
                    mandatory=mandatory,
                    priority=priorities,
                    ttl=ttl,
                    key=keys,
                )
            )
        if real[0] == "ok":
            real = ("ok", [(r.seq, r.duplicate) for r in real[1]])
        for mid in message_ids:
            if mid in self.model.ids and self.model.ids[mid][1] <= self.model.now:
                COVERAGE["(publish of an id whose window is over)"] += 1
        model = outcome(lambda: self.model.publish(items, delay, mandatory, priorities, keys))
        self._same_result(
            f"publish ids={message_ids} delay={delay} mandatory={mandatory} priorities={priorities} keys={keys}",
            real,
            model,
        )

    @rule(mid=ids, delay=delays, mandatory=st.booleans())
    def publish(self, mid, delay, mandatory):
        self._publish_both([mid], delay, mandatory)

    @rule(message_ids=st.lists(ids, min_size=2, max_size=4), delay=delays)
    def publish_many(self, message_ids, delay):
        self._publish_both(message_ids, delay)

    @rule(
        message_ids=st.lists(ids, min_size=1, max_size=4),
        delay=delays,
        priorities=st.lists(st.sampled_from([0, 0, 1, 5, 9]), min_size=4, max_size=4),
    )
    def publish_prioritized(self, message_ids, delay, priorities):
        self._publish_both(message_ids, delay, priorities=priorities[: len(message_ids)])

    @rule(
        message_ids=st.lists(ids, min_size=1, max_size=4),
        delay=delays,
        keys=st.lists(st.sampled_from([None, "a", "a", "b", "c"]), min_size=4, max_size=4),
    )
    def publish_keyed(self, message_ids, delay, keys):
        self._publish_both(message_ids, delay, keys=keys[: len(message_ids)])

    @rule(message_ids=st.lists(st.none(), min_size=2, max_size=4), keys=st.sampled_from([["a"] * 4, ["a", "b"] * 2]))
    def publish_keyed_more(self, message_ids, keys):  # a second rule: keys meet busy keys more often
        self._publish_both(message_ids, None, keys=keys[: len(message_ids)])

    @rule(message_ids=st.lists(ids, min_size=1, max_size=3), delay=delays, ttl=st.sampled_from([0.5, 2, 5]))
    def publish_with_ttl(self, message_ids, delay, ttl):
        self._publish_both(message_ids, delay, ttl=ttl)

    # -- pause and resume ---------------------------------------------------------------

    @rule(group=st.sampled_from(["A", "B"]), paused=st.booleans())
    def pause_group(self, group, paused):
        if group not in self.groups:
            return
        real = self.q.pause(group) if paused else self.q.resume(group)
        self._same_result(f"pause_group {group} {paused}", ("ok", real), ("ok", self.model.pause_group(group, paused)))

    @rule(mode=st.sampled_from(["", "", "refuse", "hold"]))
    def pause_queue(self, mode):
        real = self.q.pause(mode=mode) if mode else self.q.resume()
        self._same_result(f"pause_queue {mode!r}", ("ok", real), ("ok", self.model.pause_queue(mode)))

    # -- fetch -----------------------------------------------------------------------

    @precondition(lambda self: self._live_slots())
    @rule(i=pick, n=st.integers(1, 4))
    def fetch(self, i, n):
        self._fetch(i, n)

    @precondition(lambda self: self._live_slots())
    @rule(i=pick, n=st.integers(1, 4))
    def fetch_more(self, i, n):  # a second rule: fetch is the most common call
        self._fetch(i, n)

    def _fetch(self, i: int, n: int) -> None:
        h = self._handle(i)
        cursor_before = self.real_cursor[h.group]
        real = outcome(lambda: h.consumer.fetch(n))
        got = real[1] if real[0] == "ok" else []
        # the call's random token, as the client drew it (any word when it delivered nothing)
        token = got[0].token if got else "-"
        model = outcome(lambda: self.model.fetch(h.group, h.name, n, h.prefetch, h.liveness, token))
        if real[0] == "ok":
            real = ("ok", [(d.seq, d.delivery_count, d.redelivered) for d in got])
        if model[0] == "ok":
            dlv = self.model.groups[h.group].dlv
            model = ("ok", [(s, c, c > 1 or dlv[s].replayed_after() is not None) for s, c in model[1]])
        self._same_result(f"fetch {h} n={n}", real, model)
        # without the model: order, counts, nothing settled handed out again
        seqs = [d.seq for d in got]
        old = [s for s in seqs if s <= cursor_before]
        new = [s for s in seqs if s > cursor_before]
        if not self.model.priority and not self.model.keyed:  # (with priorities or keys the model says the order)
            assert seqs == old + new, f"fetch {seqs}: redeliveries (<= cursor {cursor_before}) must come first"
            assert old == sorted(old) and new == sorted(new), f"fetch {seqs}: not lowest seq first"
        assert len(got) <= n
        if got:
            assert {d.token for d in got} == {token}, f"fetch {seqs}: one token per call"
            assert token not in self.tokens, f"fetch {seqs}: token {token} was handed out before"
            self.tokens.add(token)
        for d in got:
            assert d.seq not in self.settled[h.group], f"group {h.group} got seq {d.seq} again after settling it"
            key = (h.group, d.seq)
            self.seen_counts[key] = self.seen_counts.get(key, 0) + 1
            assert d.delivery_count == self.seen_counts[key], f"{d.tag}: delivered {self.seen_counts[key]} times"
            rec = self.model.records[d.seq]
            headers = dict(d.headers)
            earlier = self.model.groups[h.group].dlv[d.seq].replayed_after()
            assert headers.pop(REPLAYED_HEADER, None) == (None if earlier is None else str(earlier)), d.tag
            assert (d.data, headers) == (rec.payload, rec.headers), f"{d.tag}: payload or headers changed"
            self.deliveries.append((h, d))
            key_of = self.model.keyed.get(d.seq)
            if key_of is not None:
                COVERAGE[f"(keyed delivery, key_concurrency {self.model.settings.key_concurrency})"] += 1
            if key_of is not None and d.delivery_count == 1 and earlier is None:
                # without the model: a key's first deliveries go out in seq order
                last = self.key_last.get((h.group, key_of), 0)
                assert d.seq > last, f"group {h.group} key {key_of}: seq {d.seq} handed out after {last}"
                self.key_last[(h.group, key_of)] = d.seq
        del self.deliveries[:-KEEP_DELIVERIES]
        mg = self.model.groups.get(h.group)
        if mg is not None and any(k in mg.kq for k in mg.kbusy if k not in mg.kready):
            COVERAGE["(fetch with a key held back by its deliveries out)"] += 1

    # -- settling ------------------------------------------------------------------------

    def _settle(self, what: str, op: str, via: Handle, ref, tag: Tag, delay: float | None = None):
        """One settle of ``ref`` (a Delivery or a tag text) through ``via``,
        real and modelled; returns the real outcome."""
        c, m, g, name = via.consumer, self.model, via.group, via.name
        real_fn = {
            "ack": lambda: c.ack(ref),
            "nack": lambda: c.nack(ref, delay=delay),
            "reject": lambda: c.reject(ref),
            "term": lambda: c.term(ref, "bad"),
            "in_progress": lambda: c.in_progress(ref),
        }[op]
        model_fn = {
            "ack": lambda: m.ack(g, name, [tag]),
            "nack": lambda: m.nack(g, name, tag, delay),
            "reject": lambda: m.reject(g, name, tag, "rejected"),
            "term": lambda: m.reject(g, name, tag, "terminated"),
            "in_progress": lambda: m.in_progress(g, name, tag),
        }[op]
        if isinstance(ref, rqueue.Delivery) and ref.consumer is not c:
            model_fn = _refused_not_held  # the client refuses before any call
        elif via.closed:
            model_fn = _refused_closed  # a closed Consumer refuses before calling Redis
        real = outcome(real_fn)
        self._same_result(f"{what} {getattr(ref, 'tag', ref)} by {via}", real, outcome(model_fn))
        if real[0] == "ok" and (op in ("ack", "reject", "term") or real[1] == "dead"):
            self.settled[g].add(tag[0])
        return real

    @precondition(lambda self: self.deliveries)
    @rule(i=pick)
    def ack(self, i):
        h, d = self._delivery(i)
        state = self.model.groups[h.group].dlv.get(d.seq)
        if state is not None and (state.count, state.holder) != (d.delivery_count, h.name):
            COVERAGE["(ack of a delivery taken back or redelivered since)"] += 1
        self._settle("ack", "ack", h, d, tag_of(d))

    @precondition(lambda self: self.deliveries and self._live_slots())
    @rule(i=pick, js=st.lists(st.tuples(pick, st.booleans()), min_size=1, max_size=3))
    def ack_list(self, i, js):
        """c.ack([...]) through any live consumer: foreign, late and repeated
        tags, each as its Delivery or (True) its tag text."""
        h = self._handle(i)
        picked = [self._delivery(j) for j, _ in js]
        refs = [d.tag if text else d for (_, d), (_, text) in zip(picked, js)]
        real = outcome(lambda: h.consumer.ack(refs))
        if any(hh is not h and not text for (hh, _), (_, text) in zip(picked, js)):
            model = ("err", "NotHeld")  # another consumer's Delivery: refused before any call
        else:
            model = outcome(lambda: self.model.ack(h.group, h.name, [tag_of(d) for _, d in picked]))
        self._same_result(f"ack_list {[str(getattr(r, 'tag', r)) for r in refs]} by {h}", real, model)
        if real[0] == "ok":
            self.settled[h.group].update(d.seq for _, d in picked)

    @precondition(lambda self: self.deliveries and self._live_slots())
    @rule(
        i=pick,
        js=st.lists(st.tuples(pick, st.booleans()), min_size=1, max_size=4),
        delay=st.sampled_from([None, 0, 4]),
    )
    def nack_list(self, i, js, delay):
        """c.nack_available([...]) (a worker's failed batch) through any live
        consumer: foreign, late and repeated tags, each as its Delivery or
        (True) its tag text. Every tag is checked before any is nacked (a
        refusal is its status); those that pass are nacked in order, as
        c.nack would, each checked again."""
        h = self._handle(i)
        picked = [self._delivery(j) for j, _ in js]
        refs = [d.tag if text else d for (_, d), (_, text) in zip(picked, js)]

        def real_statuses():
            got = h.consumer.nack_available(refs, delay=delay)
            return [("ok", s) if isinstance(s, str) else ("err", type(s).__name__) for s in got]

        # Another consumer's Delivery is refused as NotHeld in its place, unsent.
        foreign = [hh is not h and not text for (hh, _), (_, text) in zip(picked, js)]

        def model_statuses():
            refused = [
                "NotHeld" if away else self.model.refusal(h.group, h.name, tag_of(d))
                for (_, d), away in zip(picked, foreign, strict=True)
            ]
            return [
                ("err", code) if code else outcome(lambda d=d: self.model.nack(h.group, h.name, tag_of(d), delay))
                for (_, d), code in zip(picked, refused, strict=True)
            ]

        real = outcome(real_statuses)
        model = outcome(model_statuses)
        self._same_result(f"nack_list(delay={delay}) {[str(getattr(r, 'tag', r)) for r in refs]} by {h}", real, model)
        if real[0] == "ok":
            self.settled[h.group].update(d.seq for (_, d), st_ in zip(picked, real[1]) if st_ == ("ok", "dead"))
            COVERAGE[f"(nack_list of {len(refs)}: {sorted({st_[1] for st_ in real[1]})})"] += 1

    @precondition(lambda self: self.deliveries and self._live_slots())
    @rule(i=pick, js=st.lists(st.tuples(pick, st.booleans()), min_size=1, max_size=4))
    def in_progress_list(self, i, js):
        """c.in_progress_available([...]) (a batch's check) through any live
        consumer: foreign, late and repeated tags, each extended on its own
        as c.in_progress would, its refusal its status."""
        h = self._handle(i)
        picked = [self._delivery(j) for j, _ in js]
        refs = [d.tag if text else d for (_, d), (_, text) in zip(picked, js)]

        def real_statuses():
            return [None if s is None else type(s).__name__ for s in h.consumer.in_progress_available(refs)]

        # Another consumer's Delivery is refused as NotHeld in its place, unsent.
        foreign = [hh is not h and not text for (hh, _), (_, text) in zip(picked, js)]

        def model_statuses():
            statuses = []
            for (_, d), away in zip(picked, foreign, strict=True):
                if away:
                    statuses.append("NotHeld")
                    continue
                r = outcome(lambda d=d: self.model.in_progress(h.group, h.name, tag_of(d)))
                statuses.append(None if r[0] == "ok" else r[1])
            return statuses

        real = outcome(real_statuses)
        model = outcome(model_statuses)
        self._same_result(f"in_progress_list {[str(getattr(r, 'tag', r)) for r in refs]} by {h}", real, model)
        if real[0] == "ok":
            COVERAGE[f"(in_progress_list of {len(refs)}: {sorted({str(s) for s in real[1]})})"] += 1

    @precondition(lambda self: self.deliveries)
    @rule(i=pick, delay=st.sampled_from([None, 0, 1, 4]))
    def nack(self, i, delay):
        h, d = self._delivery(i)
        self._settle(f"nack(delay={delay})", "nack", h, d, tag_of(d), delay)

    @precondition(lambda self: self.deliveries)
    @rule(i=pick, term=st.booleans())
    def reject(self, i, term):
        h, d = self._delivery(i)
        op = "term" if term else "reject"
        self._settle(op, op, h, d, tag_of(d))

    @precondition(lambda self: self.deliveries)
    @rule(i=pick)
    def in_progress(self, i):
        h, d = self._delivery(i)
        self._settle("in_progress", "in_progress", h, d, tag_of(d))

    @precondition(lambda self: self.deliveries)
    @rule(i=pick, op=ops, delay=st.sampled_from([None, 0, 4]))
    def settle_after_nack(self, i, op, delay):
        """d.nack() and then any settle of d: the nack settled that delivery."""
        h, d = self._delivery(i)
        if self._settle(f"nack(delay={delay})", "nack", h, d, tag_of(d), delay)[0] == "ok":
            self._settle(f"{op}-after-nack", op, h, d, tag_of(d))

    @precondition(lambda self: self.deliveries)
    @rule(i=pick, op=ops, how=st.sampled_from(["another fetch's", "prefix", "longer", "never made"]))
    def settle_with_a_wrong_token(self, i, op, how):
        """A settle by the consumer that holds the delivery, by its tag text
        with a token that fetch did not hand out with it."""
        h, d = self._delivery(i)
        others = sorted({dd.token for _, dd in self.deliveries} - {d.token})
        token = {
            "another fetch's": others[i % len(others)] if others else "zz",
            "prefix": d.token[:-1],
            "longer": d.token + "0",
            "never made": "zz",
        }[how]
        tag = (d.seq, d.delivery_count, token)
        COVERAGE[f"(wrong token: {how})"] += 1
        self._settle(f"{op}-with-a-wrong-token", op, h, f"{d.seq}.{d.delivery_count}.{token}", tag)

    @precondition(lambda self: self.deliveries and len(self._live_slots()) > 1)
    @rule(i=pick, j=pick, op=ops)
    def hand_to_another_consumer(self, i, j, op):
        """x.ack(d) of a Delivery that consumer y fetched (of x's group or another)."""
        h, d = self._delivery(i)
        others = [s for s in self._live_slots() if self.handles[s] is not h]
        via = self.handles[others[j % len(others)]]
        assert via is not None
        if (via.group, via.name) == (h.group, h.name):
            COVERAGE["(Delivery of an earlier Consumer object of the same name)"] += 1
        self._settle(f"{op}-of-another's-Delivery", op, via, d, tag_of(d))

    # -- Redis losing its data -------------------------------------------------------------

    @precondition(lambda self: self.deliveries and self.wipes < MAX_WIPES)
    @rule()
    def wipe(self):
        """Redis loses every key of the queue (a restart without its data, a
        FLUSHALL, a failover to an empty replica); the settings, kept apart,
        stay. The first consumer of each group joins again at once (and sees
        the loss); the others find out on their next call."""
        r = self.client.redis
        for key in list(r.scan_iter(match=f"{self.client.prefix}:{{{QUEUE}}}*", count=1000)):
            r.delete(key)
        self.model.wipe()
        self.wipes += 1
        self.old_deliveries = (self.old_deliveries + self.deliveries)[-KEEP_DELIVERIES:]
        self.deliveries = []
        self.settled = {g: set() for g in self.groups}
        self.seen_counts = {}
        self.key_last = {}
        self.real_cursor = {g: 0 for g in self.groups}
        for g in self.groups:
            self.model.create_group(g)
            slot = f"{g.lower()}1"
            h = self.handles[slot]
            if h is None:
                self._join(slot, 100, None)
            else:
                h.consumer.rejoin()
                self.model.join(g, slot, h.liveness)
                assert h.consumer.last_state_loss is not None, f"{h} saw no loss when it joined again"
        COVERAGE["(wipe)"] += 1

    @precondition(lambda self: self.old_deliveries)
    @rule(i=pick, op=ops)
    def settle_from_before_a_wipe(self, i, op):
        """A settle of a delivery made before a wipe, by its own consumer:
        refused (LostDelivery once its consumer saw the loss; otherwise the
        tokens in the tags refuse it in Redis), and nothing changes (the
        model does nothing; the state is compared after the step)."""
        h, d = self.old_deliveries[i % len(self.old_deliveries)]
        c = d.consumer
        seen = c.state_epoch > d.epoch  # its consumer saw the loss
        real_fn = {
            "ack": lambda: c.ack(d),
            "nack": lambda: c.nack(d),
            "reject": lambda: c.reject(d),
            "term": lambda: c.term(d, "bad"),
            "in_progress": lambda: c.in_progress(d),
        }[op]
        real = outcome(real_fn)
        assert real[0] == "err", f"{op} of {d.tag} from before a wipe by {h}: {real}"
        if seen and not h.closed:
            assert real[1] == "LostDelivery", f"{op} of {d.tag} from before a wipe by {h}: {real}"
        COVERAGE[f"{op} from before a wipe -> {real[1]}"] += 1

    # -- time, membership, settings -------------------------------------------------------

    @rule(seconds=st.sampled_from([0.25, 0.5, 1, 2, 3, 6, 15, 30]))
    def advance(self, seconds):
        self.clock.advance(seconds)
        self.model.advance(seconds)

    @precondition(lambda self: self._live_slots())
    @rule(i=pick, timeout=st.sampled_from([0.5, 2.0, 10.0]))
    def heartbeat(self, i, timeout):
        """Keeps one member alive for timeout and removes every member whose liveness passed."""
        h = self._handle(i)
        real = outcome(lambda: h.consumer.heartbeat([], timeout=timeout))
        if real[0] == "ok":
            real = ("ok", (real[1].removed, real[1].returned, real[1].dead_lettered))
        model = outcome(lambda: self.model.heartbeat(h.group, h.name, timeout))
        self._same_result(f"heartbeat {h} timeout={timeout}", real, model)

    @precondition(lambda self: self._live_slots())
    @rule(i=pick)
    def close(self, i):
        h = self._handle(i)
        real = outcome(h.consumer.close)
        model = outcome(lambda: self.model.close(h.group, h.name))
        self._same_result(f"close {h}", real, model)
        h.closed = True
        self.handles[h.name] = None
        # keep one delivery of the closed consumer, to settle through it (refused)
        mine = [k for k, (hh, _) in enumerate(self.deliveries) if hh is h]
        for k in reversed(mine[:-1]):
            del self.deliveries[k]

    @precondition(lambda self: len(self._live_slots()) < sum(1 for g in SLOTS.values() if g in self.groups))
    @rule(i=pick, prefetch=st.sampled_from([1, 2, 3, 100]), liveness=st.sampled_from([None, 1.5, 4.0, 20.0]))
    def join(self, i, prefetch, liveness):
        free = [s for s, h in self.handles.items() if h is None and SLOTS[s] in self.groups]
        self._join(free[i % len(free)], prefetch, liveness)

    @rule(
        max_deliveries=st.sampled_from([1, 2, 3, 5, -1]),
        redelivery_delay=st.sampled_from([0.0, 0.5, 2.0]),
        multiplier=st.sampled_from([1.0, 2.0]),
    )
    def configure(self, max_deliveries, redelivery_delay, multiplier):
        self.client.configure(
            QUEUE, max_deliveries=max_deliveries, redelivery_delay=redelivery_delay, redelivery_multiplier=multiplier
        )
        s = self.model.settings
        s.max_deliveries, s.redelivery_delay, s.redelivery_multiplier = max_deliveries, redelivery_delay, multiplier

    @rule(key_concurrency=st.sampled_from([1, 1, 2]))
    def configure_keys(self, key_concurrency):
        self.client.configure(QUEUE, key_concurrency=key_concurrency)
        self.model.settings.key_concurrency = key_concurrency
        self.key_concurrency_max = max(self.key_concurrency_max, key_concurrency)

    # -- dead letters -------------------------------------------------------------------------

    @precondition(lambda self: self.model.dlq)
    @rule(group=st.sampled_from([None, None, "A", "B"]), limit=st.sampled_from([None, None, 1, 2]))
    def replay(self, group, limit):
        if group is not None and group not in self.groups:
            group = None
        before = {(d.dlq_seq, d.group, d.seq) for d in self.q.dead_letters()}
        floors = {g.name: g.ack_floor for g in self.q.stats().groups}
        res = self.q.replay_dead_letters(group=group, limit=limit)
        real = ("ok", (res.selected, res.replayed, res.missing, res.skipped, res.by_group))
        model = ("ok", self.model.replay(group, limit))
        self._same_result(f"replay group={group} limit={limit}", real, model)
        after = {(d.dlq_seq, d.group, d.seq) for d in self.q.dead_letters()}
        for _, g, seq in before - after:  # reopened: it may come again, with a fresh count
            self.settled[g].discard(seq)
            self.seen_counts[(g, seq)] = 0
            COVERAGE[
                "(replayed a seq at or below the ack floor)"
                if seq <= floors[g]
                else "(replayed a seq above the ack floor)"
            ] += 1

    # -- retention and resets (docs/retention.md) -------------------------------------------

    @rule(group=st.sampled_from(["A", "B"]), to=st.sampled_from(["first", "last", 1, 2, 3, 5, 8]), force=st.booleans())
    def reset(self, group, to, force):
        if group not in self.groups:
            group = "A"
        real = outcome(lambda: self.q.reset_group(group, to, force=force))
        if real[0] == "ok":
            real = ("ok", (real[1].previous, real[1].floor, real[1].cancelled))
        model = outcome(lambda: self.model.reset(group, to, force))
        self._same_result(f"reset {group} to {to} force={force}", real, model)
        if real[0] == "ok":
            # an operator's choice: the group is handed again what lies above its new floor,
            # even what it dead-lettered (those dead letters stay)
            self.settled[group] = set()
            self.reset_dead |= {(d.group, d.seq) for d in self.q.dead_letters() if d.group == group}
            for key in [k for k in self.seen_counts if k[0] == group]:
                del self.seen_counts[key]
            for key in [k for k in self.key_last if k[0] == group]:
                del self.key_last[key]
            COVERAGE[f"(reset) {'with' if real[1][2] else 'without'} deliveries taken back"] += 1

    @rule(length=st.sampled_from([None, 0, 2, 5]))
    def retention(self, length):
        # stored by the publishers' next trim step: here at once (see setup)
        if length is None:
            self.client.settings.unset(QUEUE, "max_length")
        else:
            self.client.configure(QUEUE, max_length=length)
        self.model.settings.max_length = length
        self.trim()

    @rule()
    def trim(self):
        real = self.q.trim()
        self._same_result("trim", ("ok", tuple(real)), ("ok", self.model.trim()))

    # -- comparison after every step -----------------------------------------------------------

    @invariant()
    def same_state(self):
        if self.client is None:
            return
        self.steps += 1
        real = self._observe()
        model = self.model.observe()
        for g, rg in real["groups"].items():
            for key in rg:
                self._same(f"group {g} {key}", rg[key], model["groups"][g][key])
        for key in ("last_seq", "records", "scheduled", "dead_letters"):
            self._same(key, real[key], model[key])
        assert real["depth"] == len(real["records"])
        # without the model
        for g, rg in real["groups"].items():
            self.real_cursor[g] = rg["cursor"]
            assert rg["in_flight"] <= self.model.settings.max_inflight, f"group {g}: max_inflight exceeded"
            for name, held in rg["consumers"]:
                h = self.handles.get(name)
                if h is not None:
                    assert 0 <= held <= h.prefetch, f"{name} holds {held}, prefetch {h.prefetch}"
            # never more than key_concurrency of one key in flight (a replayed
            # dead letter goes out as a redelivery, apart from its key)
            per_key: dict[str, int] = {}
            mg = self.model.groups[g]
            for seq in rg["leases"]:
                key_of = self.model.keyed.get(seq)
                if key_of is not None and mg.dlv[seq].replayed_after() is None:
                    per_key[key_of] = per_key.get(key_of, 0) + 1
            for key_of, count in per_key.items():
                # (lowered meanwhile, what was out stays out)
                assert count <= self.key_concurrency_max, f"group {g} key {key_of}: {count} in flight"

        for g, seq, _, _ in real["dead_letters"]:
            if (g, seq) not in self.reset_dead:
                self.settled[g].add(seq)
        # every ack that settled a message recorded one completed event, and nothing else did
        completed = Counter(
            f[b"group"].decode() for _, f in self.client.redis.xrange(self.q.keys.events) if f[b"event"] == b"completed"
        )
        for g, rg in real["groups"].items():
            want = rg["counters"]["acked"] if self.completed else 0
            assert completed[g] == want, f"group {g}: {completed[g]} completed events for {want} acks"

    def _observe(self) -> dict:
        stats = self.q.stats()
        r = self.client.redis
        groups = {}
        for gs in stats.groups:
            lease, delay, dlv = (group_key(self.q, gs.name, name) for name in ("lease", "delay", "dlv"))
            states = {}
            for seq, raw in r.hgetall(dlv).items():
                if seq == b"pin":  # no message: keeps the hash a hash table (delivery_state.lua)
                    continue
                states[int(seq)] = parse_state(raw.decode())
            # a call's deliveries (a stream log's first deliveries of a large fetch) are seen
            # as the split the scripts would make of them: the model knows no calls
            call_states, call_leases = callview.as_split(r, self.q.keys.group(gs.name).as_list())
            states.update((seq, parse_state(raw)) for seq, raw in call_states.items())
            groups[gs.name] = {
                "ack_floor": gs.ack_floor,
                "cursor": gs.cursor,
                "pending": gs.pending,
                "in_flight": gs.in_flight,
                "expired_leases": gs.expired_leases,
                "ready": gs.ready,
                "delayed": gs.delayed,
                "counters": {
                    k: getattr(gs, k) for k in ("acked", "nacked", "redelivered", "expired", "dead_lettered", "dropped")
                },
                "consumers": sorted((c.name, c.held) for c in gs.consumers),
                # (the pin at +inf is no lease: includes/group_keys.lua)
                "leases": dict(
                    sorted(
                        (int(m), int(s))
                        for m, s in r.zrange(lease, 0, -1, withscores=True)
                        if not m.startswith(b"pin:")
                    )
                    + sorted(call_leases.items())
                ),
                "states": dict(sorted(states.items())),
                "ready_seqs": sorted(int(m) for m in r.zrange(self.q.keys.group(gs.name).ready, 0, -1)),
                "delay_seqs": dict(sorted((int(m), int(s)) for m, s in r.zrange(delay, 0, -1, withscores=True))),
            }
        return {
            "last_seq": stats.last_seq,
            "depth": stats.depth,
            "records": logview.seqs(r, self.q.keys),
            "scheduled": stats.scheduled,
            "dead_letters": sorted((d.group, d.seq, d.reason, d.deliveries) for d in self.q.dead_letters()),
            "groups": groups,
        }


@pytest.fixture(autouse=True)
def _no_background_trim(monkeypatch):
    monkeypatch.setattr("rqueue.retention.RETAIN_INTERVAL", 1e9)
    monkeypatch.setattr("rqueue.retention.RETAIN_CHECK", 1e9)


@pytest.fixture(autouse=True)
def _quiet_logs():
    # drops and rejoins are logged at WARNING; keep the output short
    logger = logging.getLogger("rqueue")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def _run(base: type[QueueMachine], backend: str) -> None:
    machine = type(base.__name__, (base,), {"url": backend})
    run_state_machine_as_test(machine, settings=SETTINGS)
    if LONG:
        print(f"\ncoverage of {base.__name__} on {backend.split(':')[0]}:")
        for key, n in sorted(COVERAGE.items()):
            print(f"  {n:8d}  {key}")
    COVERAGE.clear()


@pytest.mark.slow
def test_model(backend: str) -> None:
    _run(QueueMachine, backend)


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)
def test_model_with_a_hash_log(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # The same machine with the queue's log in a hash, the layout of prefixes made before the
    # stream layout became the default (docs/upgrading.md); on a real server and memory://
    # (test_model takes the default layout over every backend, and the cluster and Valkey run
    # the same script texts)
    monkeypatch.setenv(LAYOUT_ENV, "hash")
    _run(QueueMachine, backend)


CALL_EXAMPLES = settings(SETTINGS, max_examples=LONG or 20)


def test_model_with_call_records(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stream log whose every fetch from the cursor writes a call record (CALL_MIN 1, where
    # fetch.lua's 16 leaves the model's fetches of 1-4 per message): the model knows no calls,
    # and sees a call's deliveries as the split the scripts would make (_observe)
    monkeypatch.setenv(LAYOUT_ENV, "stream")
    callview.with_call_min(monkeypatch, 1)
    client = rqueue.connect(backend, prefix=f"calls-{uuid.uuid4().hex}")
    q = client.queue(QUEUE)
    try:  # the hook took: a fetch of one writes a call record
        q.publish(b"x")
        q.consumer("A", "a1").fetch(1)
        assert callview.calls_of(client.redis, q.keys.group("A").as_list()) != {}
    finally:
        q.delete(force=True)
        client.close()
    machine = type(QueueMachine.__name__, (QueueMachine,), {"url": backend})
    run_state_machine_as_test(machine, settings=CALL_EXAMPLES)


@pytest.mark.parametrize("backend", ["redis", "memory"], indirect=True)
def test_model_with_claims(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # A stream log whose every fetch from the cursor claims its seqs (CLAIM_MIN 1, CALL_MIN 1,
    # where fetch.lua's 32 leaves the model's fetches of 1-4 unclaimed): the client reads the
    # records itself (commands.fill_claimed), and the model sees what the scan would hand out.
    # On a real server and memory:// (the cluster's read goes through redis-py's parse, which
    # tests/test_claimed_fetch.py covers on every backend)
    monkeypatch.setenv(LAYOUT_ENV, "stream")
    callview.with_call_min(monkeypatch, 1, claim_min=1)
    claimed: list[tuple[int, int, int]] = []
    fill = commands.fill_claimed

    def counted(reply: commands.FetchReply, entries: object) -> commands.FetchReply:
        assert reply.claim is not None
        claimed.append(reply.claim)
        return fill(reply, entries)  # type: ignore[arg-type]

    monkeypatch.setattr(commands, "fill_claimed", counted)
    machine = type(QueueMachine.__name__, (QueueMachine,), {"url": backend})
    run_state_machine_as_test(machine, settings=CALL_EXAMPLES)
    assert claimed, "no fetch claimed: the hook did not take"


def _machine(backend: str) -> QueueMachine:
    return type("QueueMachine", (QueueMachine,), {"url": backend})()


def _setup(
    state: QueueMachine,
    ack_wait: float,
    max_inflight: int,
    max_deliveries: int,
    first: tuple[int, None],
    two_groups: bool = False,
) -> None:
    """The setup rule of the examples below: no redelivery delay or backoff,
    a 20 s de-duplication window, and with one group a consumer joined at once."""
    state.setup(
        ack_wait=ack_wait,
        max_inflight=max_inflight,
        max_deliveries=max_deliveries,
        redelivery_delay=0.0,
        multiplier=1.0,
        dedup_window=20.0,
        two_groups=two_groups,
        early=[] if two_groups else [False],
        first=first,
    )


def test_replay_below_the_floor_reopens_it(backend: str) -> None:
    # the minimal sequence Hypothesis found
    state = _machine(backend)
    try:
        _setup(state, ack_wait=2.0, max_inflight=1, max_deliveries=1, first=(1, None))
        state.same_state()
        state.fetch(i=0, n=1)
        state.same_state()
        state.reject(i=0, term=False)
        state.same_state()
        state.replay(group=None, limit=None)
        state.same_state()  # group A ack_floor: real 1 != model 0 (pending: real 0 != model 1)
    finally:
        state.teardown()


def test_in_progress_of_a_removed_member_does_not_make_a_member(backend: str) -> None:
    state = _machine(backend)
    try:
        _setup(state, ack_wait=5.0, max_inflight=1024, max_deliveries=3, first=(100, None))
        state.join(i=0, prefetch=100, liveness=1.5)  # a2
        state.fetch(i=1, n=1)  # a2 holds seq 1
        state.advance(seconds=2)
        state.heartbeat(i=0, timeout=10.0)  # a1 removes a2 (removed 1, returned 1)
        state.same_state()
        state.in_progress(i=1)  # a2: StaleDelivery
        state.same_state()
        state.advance(seconds=6)
        state.heartbeat(i=0, timeout=10.0)  # real: removed 1 (a2 again), model: removed 0
        state.same_state()
    finally:
        state.teardown()


def test_dedup_window_follows_the_script_clock(backend: str, prefix: str) -> None:
    clock = rqueue.ManualClock()
    client = rqueue.connect(backend, prefix=prefix, clock=clock, settings_ttl=0)
    try:
        client.configure(QUEUE, dedup_window=0.2)
        q = client.queue(QUEUE)
        model = Model(Settings(dedup_window=0.2), clock.now_ms)
        for pause in (0.0, 0.4):  # wall-clock seconds; the test clock stands still
            time.sleep(pause)
            real = [(r.seq, r.duplicate) for r in q.publish_many([b"a", b"b"], ids=["x", "x"])]
            assert real == model.publish([(b"a", {}, "x"), (b"b", {}, "x")], None), f"after {pause} s of wall time"
    finally:
        client.close()


def test_a_late_ack_with_another_fetchs_token_is_not_held(backend: str) -> None:
    # found by a long run: the CI examples reach no late ack with a wrong token
    state = _machine(backend)
    try:
        # given seq 1 fetched by a1 (token t1), its lease run out, and fetched again by a1 (token t2)
        _setup(state, ack_wait=2.0, max_inflight=1, max_deliveries=2, first=(1, None))
        state.fetch(i=0, n=1)
        state.advance(seconds=2)
        state.fetch(i=0, n=1)
        state.same_state()
        # when a1 acks its first delivery, 1.1, with t2: NotHeld, nothing changes
        state.settle_with_a_wrong_token(i=0, op="ack", how="another fetch's")
        state.same_state()
        # then with t1 the late ack is stale (a1 holds 1.2 now, both agree), and 1.2's ack completes it
        state.ack(i=0)
        state.same_state()
        assert state.q.stats().group("A").acked == 0
        state.ack(i=1)
        state.same_state()
        assert state.q.stats().group("A").acked == 1
    finally:
        state.teardown()


def test_a_forced_reset_while_deliveries_are_held_and_then_settled(backend: str) -> None:
    # a reset that takes back deliveries, their settles afterwards, a replay
    # held open across it, and trim steps: the model and the scripts agree
    state = _machine(backend)
    try:
        _setup(state, ack_wait=5.0, max_inflight=1024, max_deliveries=1, first=(100, None), two_groups=True)
        steps = [
            lambda: state.publish_many(message_ids=[None, None, None], delay=None),
            lambda: state.fetch(i=0, n=3),  # a1 holds 1..3
            lambda: state.reject(i=0, term=True),  # seq 1 dead-lettered by A
            lambda: state.replay(group="A", limit=None),  # and reopened
            lambda: state.fetch(i=1, n=3),  # b1 holds 1..3
            lambda: state.ack_list(i=1, js=[(2, False), (3, False)]),
            lambda: state.reset(group="A", to="first", force=False),  # refused: A holds deliveries
            lambda: state.reset(group="A", to=2, force=True),
            lambda: state.ack(i=1),  # an old delivery of A: refused
            lambda: state.trim(),
            lambda: state.fetch(i=0, n=3),
            lambda: state.ack_list(i=0, js=[(0, False), (1, False)]),
            lambda: state.ack(i=5),
            lambda: state.trim(),
            lambda: state.reset(group="B", to="last", force=True),
            lambda: state.trim(),
            lambda: state.publish(mid=None, delay=None, mandatory=False),
        ]
        for step in steps:
            step()
            state.same_state()
        assert COVERAGE["(reset) with deliveries taken back"] >= 1
    finally:
        state.teardown()
        COVERAGE.clear()


def test_a_wipe_keeps_the_models_stream_log(backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # Found by Hypothesis (test_model_with_a_stream_log): after a wipe the model forgot the queue's
    # log was a stream, and deleted a record acked above the floor, which a stream log keeps until
    # the lowest floor passes it (records: real [1, 2, 3] != model [1, 2]).
    monkeypatch.setenv(LAYOUT_ENV, "stream")
    state = _machine(backend)
    try:
        _setup(state, ack_wait=2.0, max_inflight=1024, max_deliveries=3, first=(3, None))
        state.fetch(i=0, n=1)
        state.wipe()
        state.same_state()
        state.publish_many(delay=None, message_ids=[None, None, None])
        state.fetch(i=0, n=3)
        state.same_state()
        state.ack(i=1)  # a seq above the floor: settled, its record kept
        state.same_state()
    finally:
        state.teardown()


@pytest.mark.parametrize("layout", ["hash", "stream"])
def test_a_replay_while_another_group_holds_the_message_keeps_its_record(
    backend: str, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    # Found by Hypothesis (test_model_with_a_stream_log) on Redis, the cluster and memory://: with
    # group B holding seq 1, a stream log's replay keeps beside the pins the record its entry holds,
    # as the hash layout keeps its record. The record made again from the dead letter lists the two
    # headers (n and x-rq-ttl) in a Lua table's order, which is the server's (Valkey's keeps these
    # two as published), and the model's check of the log found it (seqs whose record in side
    # differs from their entry: {1}).
    monkeypatch.setenv(LAYOUT_ENV, layout)
    state = _machine(backend)
    try:
        _setup(state, ack_wait=2.0, max_inflight=1, max_deliveries=1, first=(1, None), two_groups=True)
        state.same_state()
        state.publish_with_ttl(delay=None, message_ids=[None], ttl=0.5)
        state.same_state()
        state.fetch_more(i=0, n=1)
        state.same_state()
        state.nack(delay=None, i=0)  # a dead letter of group A (max-deliveries)
        state.same_state()
        state.replay(group=None, limit=None)
        state.same_state()
    finally:
        state.teardown()
