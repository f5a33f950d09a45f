"""Model-based stateful test (issue 8): random operations run against the
real scripts and against the pure-Python model of SPEC.md in tests/model.py;
after every step the observable state of both must be equal.

Covered operations: publish and publish_many (ids that repeat inside and
after the de-duplication window, delays), fetch by up to three consumers of
group A and two of group B (per-consumer prefetch, the queue's max_inflight),
ack (single, and a list through any consumer: late acks, foreign tags,
repeated tags), nack (policy delay, now, with a delay), reject, term,
in_progress, lease expiry (the ManualClock moves), consumer death (a member
removed by another member's heartbeat after its liveness passed; its fetch
joins it again), graceful close and joining again, settings changes
(max_deliveries, redelivery_delay, redelivery_multiplier) and replay of dead
letters (all, by group, limited).

Compared after every step: per group the ack floor, cursor, pending, in
flight, expired leases, ready, delayed, the counters, the members and what
each holds, every lease (seq and deadline), every open delivery state (seq,
count, holder), the ready and delayed seqs; the queue's last seq, stored
records, scheduled count and dead letters (group, seq, reason, deliveries).
Compared per operation: the deliveries handed out (seq, count, redelivered,
payload, headers), publish results, nack statuses, in_progress deadlines,
heartbeat and close results, replay results, and which exception was
raised. Checked without the model: max_inflight and prefetch, nothing a
group settled is delivered to it again, delivery counts, fetch order.

CI runs a bounded number of examples per backend; set RQUEUE_MODEL_EXAMPLES
(e.g. 2000) for a long run by hand, RQUEUE_MODEL_STEPS for longer sequences.
"""

from __future__ import annotations

import logging
import os
import uuid

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

import rqueue
from model import ERRORS, Model, ModelError, Settings

QUEUE = "q"
SLOTS = {"a1": "A", "a2": "A", "a3": "A", "b1": "B", "b2": "B"}
KEEP_DELIVERIES = 40  # deliveries remembered for settling (old ones included)

LONG = int(os.environ.get("RQUEUE_MODEL_EXAMPLES", "0") or 0)
STEPS = int(os.environ.get("RQUEUE_MODEL_STEPS", "0") or 0)
SETTINGS = settings(
    max_examples=LONG or 25,
    stateful_step_count=STEPS or (60 if LONG else 40),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much, HealthCheck.data_too_large],
    derandomize=not LONG,  # CI: the same examples every run
    print_blob=True,
)

pick = st.integers(0, 10_000)
ids = st.one_of(st.none(), st.sampled_from(["x", "y", "z"]))
delays = st.sampled_from([None, None, 0, 0.5, 1, 3])


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


class QueueMachine(RuleBasedStateMachine):
    url = ""  # set by the test for each backend

    def __init__(self) -> None:
        super().__init__()
        self.client: rqueue.Client | None = None

    # -- setup ------------------------------------------------------------------

    @initialize(
        ack_wait=st.sampled_from([2.0, 5.0]),
        max_inflight=st.sampled_from([1, 2, 3, 4, 6, 1024]),
        max_deliveries=st.sampled_from([1, 2, 3, -1]),
        redelivery_delay=st.sampled_from([0.0, 0.5, 2.0]),
        multiplier=st.sampled_from([1.0, 2.0]),
        dedup_window=st.sampled_from([2.0, 30.0]),
        two_groups=st.booleans(),
        early=st.integers(0, 2),
        first=st.tuples(st.sampled_from([1, 2, 3, 100]), st.sampled_from([None, 1.5, 4.0, 20.0])),
    )
    def setup(self, ack_wait, max_inflight, max_deliveries, redelivery_delay, multiplier, dedup_window,
              two_groups, early, first):
        self.clock = rqueue.ManualClock()
        self.client = rqueue.connect(self.url, prefix=f"model-{uuid.uuid4().hex}", clock=self.clock,
                                     randomness=rqueue.Randomness(seed=1), settings_ttl=0)
        self.q = self.client.queue(QUEUE)
        s = Settings(ack_wait=ack_wait, max_inflight=max_inflight, max_deliveries=max_deliveries,
                     redelivery_delay=redelivery_delay, redelivery_multiplier=multiplier, dedup_window=dedup_window)
        self.client.configure(QUEUE, ack_wait=ack_wait, max_inflight=max_inflight, max_deliveries=max_deliveries,
                              redelivery_delay=redelivery_delay, redelivery_multiplier=multiplier,
                              dedup_window=dedup_window)
        self.model = Model(s, self.clock.now_ms)
        self.handles: dict[str, Handle | None] = {slot: None for slot in SLOTS}
        self.deliveries: list[tuple[Handle, rqueue.Delivery]] = []
        self.payloads = 0
        self.groups = ["A", "B"] if two_groups else ["A"]
        # checks that do not use the model
        self.settled: dict[str, set[int]] = {g: set() for g in self.groups}
        self.seen_counts: dict[tuple[str, int], int] = {}
        self.real_cursor: dict[str, int] = {g: 0 for g in self.groups}
        # a queue without a group keeps what is published; its first groups start at 0
        for _ in range(early):
            self._publish_both([None], None)
        for g in self.groups:
            self.model.create_group(g)
            self._join(f"{g.lower()}1", *first)

    def teardown(self) -> None:
        if self.client is not None:
            self.client.close()

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
        return self.deliveries[i % len(self.deliveries)]

    def _same(self, what: str, real, model) -> None:
        assert real == model, f"{what}: real {real!r} != model {model!r}"

    # -- publish ------------------------------------------------------------------

    def _publish_both(self, message_ids: list[str | None], delay: float | None, mandatory: bool = False) -> None:
        items = []
        for mid in message_ids:
            self.payloads += 1
            items.append((b"p%d" % self.payloads, {"n": str(self.payloads)} if self.payloads % 2 else {}, mid))
        payloads = [p for p, _, _ in items]
        headers = [h for _, h, _ in items]
        if len(items) == 1:
            real = outcome(lambda: [self.q.publish(payloads[0], headers=headers[0], id=message_ids[0], delay=delay,
                                                   mandatory=mandatory)])
        else:
            real = outcome(lambda: self.q.publish_many(payloads, headers=headers, ids=message_ids, delay=delay,
                                                       mandatory=mandatory))
        if real[0] == "ok":
            real = ("ok", [(r.seq, r.duplicate) for r in real[1]])
        model = outcome(lambda: self.model.publish(items, delay, mandatory))
        self._same(f"publish ids={message_ids} delay={delay}", real, model)

    @rule(mid=ids, delay=delays)
    def publish(self, mid, delay):
        self._publish_both([mid], delay)

    @rule(message_ids=st.lists(ids, min_size=2, max_size=4), delay=delays)
    def publish_many(self, message_ids, delay):
        self._publish_both(message_ids, delay)

    # -- fetch ---------------------------------------------------------------------

    @precondition(lambda self: self._live_slots())
    @rule(i=pick, n=st.integers(1, 4))
    def fetch(self, i, n):
        h = self._handle(i)
        cursor_before = self.real_cursor[h.group]
        real = outcome(lambda: h.consumer.fetch(n))
        model = outcome(lambda: self.model.fetch(h.group, h.name, n, h.prefetch, h.liveness))
        got = real[1] if real[0] == "ok" else []
        if real[0] == "ok":
            real = ("ok", [(d.seq, d.delivery_count, d.redelivered) for d in got])
        if model[0] == "ok":
            model = ("ok", [(s, c, c > 1) for s, c in model[1]])
        self._same(f"fetch {h} n={n}", real, model)
        # without the model: order, counts, nothing settled handed out again
        seqs = [d.seq for d in got]
        old = [s for s in seqs if s <= cursor_before]
        new = [s for s in seqs if s > cursor_before]
        assert seqs == old + new, f"fetch {seqs}: redeliveries (<= cursor {cursor_before}) must come first"
        assert old == sorted(old) and new == sorted(new), f"fetch {seqs}: not lowest seq first"
        assert len(got) <= n
        for d in got:
            assert d.seq not in self.settled[h.group], f"group {h.group} got seq {d.seq} again after settling it"
            key = (h.group, d.seq)
            self.seen_counts[key] = self.seen_counts.get(key, 0) + 1
            assert d.delivery_count == self.seen_counts[key], f"{d.tag}: seen {self.seen_counts[key]} times"
            rec = self.model.records[d.seq]
            assert (d.data, d.headers) == (rec.payload, rec.headers), f"{d.tag}: payload or headers changed"
            self.deliveries.append((h, d))
        del self.deliveries[:-KEEP_DELIVERIES]

    # -- settling --------------------------------------------------------------------

    def _settle(self, what: str, h: Handle, d: rqueue.Delivery, real_fn, model_fn):
        real = outcome(real_fn)  # a closed Consumer refuses before calling Redis
        model = outcome(lambda: model_fn() if not h.closed else _raise_closed())
        self._same(f"{what} {d.tag} by {h}", real, model)
        return real

    @precondition(lambda self: self.deliveries)
    @rule(i=pick)
    def ack(self, i):
        h, d = self._delivery(i)
        r = self._settle("ack", h, d, d.ack, lambda: self.model.ack(h.group, h.name, [(d.seq, d.delivery_count)]))
        if r[0] == "ok":
            self.settled[h.group].add(d.seq)

    @precondition(lambda self: self.deliveries and self._live_slots())
    @rule(i=pick, js=st.lists(pick, min_size=1, max_size=3))
    def ack_list(self, i, js):
        """c.ack([...]) through any live consumer: foreign, late and repeated tags."""
        h = self._handle(i)
        ds = [self._delivery(j)[1] for j in js]
        tags = [(d.seq, d.delivery_count) for d in ds]
        real = outcome(lambda: h.consumer.ack(ds))
        model = outcome(lambda: self.model.ack(h.group, h.name, tags))
        self._same(f"ack {[d.tag for d in ds]} by {h}", real, model)
        if real[0] == "ok":
            self.settled[h.group].update(d.seq for d in ds)

    @precondition(lambda self: self.deliveries)
    @rule(i=pick, delay=st.sampled_from([None, 0, 1, 4]))
    def nack(self, i, delay):
        h, d = self._delivery(i)
        r = self._settle(f"nack(delay={delay})", h, d, lambda: d.nack(delay=delay),
                         lambda: self.model.nack(h.group, h.name, d.seq, d.delivery_count, delay))
        if r == ("ok", "dead"):
            self.settled[h.group].add(d.seq)

    @precondition(lambda self: self.deliveries)
    @rule(i=pick, term=st.booleans())
    def reject(self, i, term):
        h, d = self._delivery(i)
        if term:
            r = self._settle("term", h, d, lambda: d.term("bad"),
                             lambda: self.model.reject(h.group, h.name, d.seq, d.delivery_count, "terminated"))
        else:
            r = self._settle("reject", h, d, d.reject,
                             lambda: self.model.reject(h.group, h.name, d.seq, d.delivery_count, "rejected"))
        if r[0] == "ok":
            self.settled[h.group].add(d.seq)

    @precondition(lambda self: self.deliveries)
    @rule(i=pick)
    def in_progress(self, i):
        h, d = self._delivery(i)
        self._settle("in_progress", h, d, d.in_progress,
                     lambda: self.model.in_progress(h.group, h.name, d.seq, d.delivery_count))

    # -- time, membership, settings ------------------------------------------------------

    @rule(seconds=st.sampled_from([0.25, 0.5, 1, 2, 3, 6, 15]))
    def advance(self, seconds):
        self.clock.advance(seconds)
        self.model.advance(seconds)

    @precondition(lambda self: self._live_slots())
    @rule(i=pick, timeout=st.sampled_from([0.5, 2.0, 10.0]))
    def heartbeat(self, i, timeout):
        """Keeps one member alive and removes every member whose liveness passed."""
        h = self._handle(i)
        real = outcome(lambda: h.consumer.heartbeat([], timeout=timeout))
        if real[0] == "ok":
            real = ("ok", (real[1].removed, real[1].returned, real[1].dead_lettered))
        model = outcome(lambda: self.model.heartbeat(h.group, h.name, timeout))
        self._same(f"heartbeat {h} timeout={timeout}", real, model)

    @precondition(lambda self: self._live_slots())
    @rule(i=pick)
    def close(self, i):
        h = self._handle(i)
        real = outcome(h.consumer.close)
        model = outcome(lambda: self.model.close(h.group, h.name))
        self._same(f"close {h}", real, model)
        h.closed = True
        self.handles[h.name] = None

    @rule(slot=st.sampled_from(sorted(SLOTS)), prefetch=st.sampled_from([1, 2, 3, 100]),
          liveness=st.sampled_from([None, 1.5, 4.0, 20.0]))
    def join(self, slot, prefetch, liveness):
        if self.handles[slot] is None and SLOTS[slot] in self.groups:
            self._join(slot, prefetch, liveness)

    @rule(max_deliveries=st.sampled_from([1, 2, 3, 5, -1]), redelivery_delay=st.sampled_from([0.0, 0.5, 2.0]),
          multiplier=st.sampled_from([1.0, 2.0]))
    def configure(self, max_deliveries, redelivery_delay, multiplier):
        self.client.configure(QUEUE, max_deliveries=max_deliveries, redelivery_delay=redelivery_delay,
                              redelivery_multiplier=multiplier)
        s = self.model.settings
        s.max_deliveries, s.redelivery_delay, s.redelivery_multiplier = max_deliveries, redelivery_delay, multiplier

    # -- dead letters --------------------------------------------------------------------

    @rule(group=st.sampled_from([None, None, "A", "B"]), limit=st.sampled_from([None, None, 1, 2]))
    def replay(self, group, limit):
        if group is not None and group not in self.groups:
            group = None
        before = {(d.dlq_seq, d.group, d.seq) for d in self.q.dead_letters()}
        res = self.q.replay_dead_letters(group=group, limit=limit)
        real = (res.selected, res.replayed, res.missing, res.skipped, res.by_group)
        model = self.model.replay(group, limit)
        self._same(f"replay group={group} limit={limit}", real, model)
        after = {(d.dlq_seq, d.group, d.seq) for d in self.q.dead_letters()}
        for _, g, seq in before - after:  # reopened: may be delivered again, with a fresh count
            self.settled[g].discard(seq)
            self.seen_counts[(g, seq)] = 0

    # -- comparison after every step ----------------------------------------------------------

    @invariant()
    def same_state(self):
        if self.client is None:
            return
        real = self._observe()
        model = self.model.observe()
        for g in self.groups:
            self.real_cursor[g] = real["groups"][g]["cursor"]
            for seq in [s for gg, s, _, _ in real["dead_letters"] if gg == g]:
                self.settled[g].add(seq)
        for g, rg in real["groups"].items():
            mg = model["groups"][g]
            for key in rg:
                self._same(f"group {g} {key}", rg[key], mg[key])
        for key in ("last_seq", "records", "scheduled", "dead_letters"):
            self._same(key, real[key], model[key])
        assert real["depth"] == len(real["records"])
        # limits, whatever the model says
        for g, rg in real["groups"].items():
            assert rg["in_flight"] <= self.model.settings.max_inflight, f"group {g}: max_inflight exceeded"
            for name, held in rg["consumers"]:
                h = self.handles.get(name)
                if h is not None:
                    assert 0 <= held <= h.prefetch, f"{name} holds {held}, prefetch {h.prefetch}"

    def _observe(self) -> dict:
        stats = self.q.stats()
        r = self.client.redis
        groups = {}
        for gs in stats.groups:
            keys = self.q.keys.group(gs.name).as_list()
            states = {}
            for seq, raw in r.hgetall(keys[8]).items():
                count, holder = raw.decode().split("\n", 1)[0].split(":")[:2]
                states[int(seq)] = (int(count), holder)
            groups[gs.name] = {
                "ack_floor": gs.ack_floor,
                "cursor": gs.cursor,
                "pending": gs.pending,
                "in_flight": gs.in_flight,
                "expired_leases": gs.expired_leases,
                "ready": gs.ready,
                "delayed": gs.delayed,
                "counters": {k: getattr(gs, k) for k in ("acked", "nacked", "redelivered", "expired",
                                                         "dead_lettered", "dropped")},
                "consumers": sorted((c.name, c.held) for c in gs.consumers),
                "leases": dict(sorted((int(m), int(s)) for m, s in r.zrange(keys[5], 0, -1, withscores=True))),
                "states": dict(sorted(states.items())),
                "ready_seqs": sorted(int(m) for m in r.zrange(keys[6], 0, -1)),
                "delay_seqs": dict(sorted((int(m), int(s)) for m, s in r.zrange(keys[7], 0, -1, withscores=True))),
            }
        return {
            "last_seq": stats.last_seq,
            "depth": stats.depth,
            "records": sorted(int(s) for s in r.hkeys(self.q.keys.msgs)),
            "scheduled": stats.scheduled,
            "dead_letters": sorted((d.group, d.seq, d.reason, d.deliveries) for d in self.q.dead_letters()),
            "groups": groups,
        }


def _raise_closed():
    raise ModelError("Closed")


@pytest.fixture(autouse=True)
def _quiet_drops():
    # dropped messages and rejoins are logged at WARNING; keep the output short
    logger = logging.getLogger("rqueue")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


@pytest.mark.slow
def test_model(backend: str) -> None:
    machine = type("Machine", (QueueMachine,), {"url": backend})
    run_state_machine_as_test(machine, settings=SETTINGS)
