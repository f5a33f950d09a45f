"""Recurring schedules: ticks (pure computation, daylight-saving changes),
each tick published once whatever number of schedulers run or crash, the
missed-tick policies, pause/resume/remove, bad input, the script's own
checks, the worker's scheduler and the CLI (docs/schedules.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest
from click.testing import CliRunner
from support import logview
from support.servers import wait_for

import rqueue
from rqueue.cli import cli
from rqueue.engine import commands, schedule_store
from rqueue.engine.keys import schedules_key
from rqueue.schedules import FIRE_BATCH, SKIP_LATENESS, target
from rqueue.ticks import timing
from rqueue.worker.scheduler import Scheduler

ROOT = Path(__file__).resolve().parent.parent
BERLIN = ZoneInfo("Europe/Berlin")
MINUTE = 60_000


def berlin(*args: int, fold: int = 0) -> int:
    """ms since the epoch of a Berlin wall-clock time."""
    return round(datetime(*args, tzinfo=BERLIN, fold=fold).timestamp() * 1000)


def ticks_of(q: rqueue.Queue) -> list[int]:
    """The x-rq-tick of every message stored in ``q``, in seq order."""
    out: list[int] = []
    after = 0
    while batch := q.peek(500, after=after):
        out += [int(m.headers["x-rq-tick"]) for m in batch]
        after = batch[-1].seq
    return out


# -- ticks: pure computation ---------------------------------------------------


def test_every_ticks_at_multiples_since_the_epoch():
    # given a schedule every 10 s
    t = timing(every=10)
    # then its ticks are the multiples of 10 s, whatever the moment asked
    assert t.after(1_000_001) == 1_010_000
    assert t.after(1_010_000) == 1_020_000
    assert t.latest(1_019_999) == 1_010_000
    assert t.between(1_000_000, 1_035_000, 100) == [1_010_000, 1_020_000, 1_030_000]
    assert t.between(1_000_000, 1_035_000, 2) == [1_010_000, 1_020_000]


def test_cron_in_a_time_zone_across_daylight_saving_changes():
    # given a job at a fixed time of day and one every half hour, in Berlin
    daily = timing(cron="30 2 * * *", timezone="Europe/Berlin")
    half_hourly = timing(cron="*/30 * * * *", timezone="Europe/Berlin")
    # when the clocks go forward (2026-03-29, 02:00 -> 03:00): 02:30 does not
    # exist, so the daily job runs at the first instant after the gap
    spring = daily.between(berlin(2026, 3, 28, 12), berlin(2026, 3, 30, 12), 10)
    assert spring == [berlin(2026, 3, 29, 3, 0), berlin(2026, 3, 30, 2, 30)]
    assert half_hourly.between(berlin(2026, 3, 29, 1, 0), berlin(2026, 3, 29, 3, 30), 10) == [
        berlin(2026, 3, 29, 1, 30),
        berlin(2026, 3, 29, 3, 0),  # 30 real minutes after 01:30
        berlin(2026, 3, 29, 3, 30),
    ]
    # when the clocks go back (2026-10-25, 03:00 -> 02:00): 02:30 shows twice;
    # the fixed-time job runs once, at its first showing
    autumn = daily.between(berlin(2026, 10, 24, 12), berlin(2026, 10, 26, 12), 10)
    assert autumn == [berlin(2026, 10, 25, 2, 30), berlin(2026, 10, 26, 2, 30)]
    assert daily.latest(berlin(2026, 10, 25, 2, 45, fold=1)) == berlin(2026, 10, 25, 2, 30)
    # and the half-hourly one runs by elapsed time, at both showings
    assert half_hourly.between(berlin(2026, 10, 25, 1, 45), berlin(2026, 10, 25, 3, 0), 10) == [
        berlin(2026, 10, 25, 2, 0),
        berlin(2026, 10, 25, 2, 30),
        berlin(2026, 10, 25, 2, 0, fold=1),
        berlin(2026, 10, 25, 2, 30, fold=1),
        berlin(2026, 10, 25, 3, 0),
    ]
    # and every tick is 30 real minutes after the one before
    ticks = half_hourly.between(berlin(2026, 10, 25, 0, 0), berlin(2026, 10, 25, 5, 0), 20)
    assert {b - a for a, b in zip(ticks, ticks[1:])} == {30 * MINUTE}


def test_cron_aliases_and_the_default_zone():
    # given @daily without a zone
    t = timing(cron="@daily")
    # then it is midnight UTC
    assert t.cron == "0 0 * * *" and t.timezone == "UTC"
    assert t.after(86_400_000 * 100 + 1) == 86_400_000 * 101


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"every": 0}, "every"),
        ({"every": -5}, "every"),
        ({"every": True}, "every"),
        ({"every": 0.0001}, "every"),
        ({"every": 5, "cron": "* * * * *"}, "exactly one of every"),
        ({}, "exactly one of every"),
        ({"cron": "61 * * * *"}, "61 * * * *"),
        ({"cron": "* * * *"}, "5 fields"),
        ({"cron": "* * * * * *"}, "5 fields"),
        ({"cron": "0 0 30 2 *"}, "never comes"),
        ({"cron": "@reboot"}, "alias"),
        ({"cron": 5}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "Mars/Olympus"),
        ({"cron": "* * * * *", "timezone": ""}, "timezone"),
        ({"every": 5, "timezone": "UTC"}, "timezone applies to cron"),
    ],
)
def test_a_bad_timing_is_refused_naming_it(kwargs, named):
    with pytest.raises(rqueue.InvalidInput, match=named.replace("*", r"\*")):
        timing(**kwargs)


# -- defining, listing, pausing, removing ----------------------------------------


def test_a_schedule_whose_hash_is_gone_is_logged_once_and_reported_by_the_doctor(client, clock, caplog):
    # given a schedule that fired once, whose hash was then deleted (an eviction, an operator)
    from rqueue import doctor

    client.schedule("nightly", "reports", every=10, payload=b"tick")
    q = client.queue("reports")
    clock.advance(10)
    assert Scheduler(client).run_once().published == 1
    key = target(client, "reports", "nightly").keys.schedule("nightly")
    client.redis.delete(key)
    # when schedulers pass while its ticks come, twice
    with caplog.at_level("ERROR", logger="rqueue.schedules"):
        for _ in range(2):
            clock.advance(10)
            assert Scheduler(client).run_once().published == 0
    # then it fired no more, and that was logged once, naming it
    gone = [r.getMessage() for r in caplog.records if "is in the registry, but its hash" in r.getMessage()]
    assert len(gone) == 1 and "'nightly'" in gone[0] and key in gone[0]
    # and the doctor reports it, not repaired: its definition went with it
    found = doctor.examine(q)
    assert [(f.kind, f.key, f.repair) for f in found] == [(doctor.Kind.SCHEDULE_MISSING, key, None)]
    # and once it is removed, the queue is clean
    assert client.remove_schedule("nightly")
    assert doctor.examine(q) == []


def test_a_schedule_publishes_each_tick_once(client, clock):
    # given a schedule every 10 s, and two schedulers
    info = client.schedule("beat", "orders", every=10, payload=b"tick", headers={"kind": "beat"})
    assert info.next_tick_ms == (clock.now_ms // 10_000 + 1) * 10_000 and info.last_tick_ms is None
    a, b = Scheduler(client), Scheduler(client)
    q = client.queue("orders")
    # when nothing is due yet
    assert a.run_once().published == 0 and q.peek() == []
    # when the next tick comes, and both schedulers pass, twice
    clock.advance(10)
    tick = info.next_tick_ms
    assert a.run_once().published + b.run_once().published + a.run_once().published == 1
    # then one message carries it, with the schedule's payload and headers
    [m] = q.peek()
    assert m.data == b"tick"
    assert m.headers == {"kind": "beat", "x-rq-schedule": "beat", "x-rq-tick": str(tick)}
    [listed] = client.schedules()
    assert (listed.name, listed.queue, listed.every, listed.last_tick_ms, listed.fired) == (
        "beat",
        "orders",
        10.0,
        tick,
        1,
    )
    assert listed.next_tick_ms == tick + 10_000 and not listed.paused


def test_missed_ticks_follow_the_policy(client, clock):
    # given three schedules every 100 s, one per policy, and 350 s without a scheduler
    for policy in ("once", "all", "skip"):
        client.schedule(policy, f"q-{policy}", every=100, missed=policy)
    first = (clock.now_ms // 100_000 + 1) * 100_000
    clock.advance(first / 1000 + 250 - clock.now_ms / 1000)  # 50 s after the third tick
    # when a scheduler passes
    Scheduler(client).run_once()
    # then "once" published the latest tick, "all" each one, "skip" the latest
    # (found within SKIP_LATENESS of its time)
    assert ticks_of(client.queue("q-once")) == [first + 200_000]
    assert ticks_of(client.queue("q-all")) == [first, first + 100_000, first + 200_000]
    assert ticks_of(client.queue("q-skip")) == [first + 200_000]
    # given another gap, after which the latest tick is found over SKIP_LATENESS late
    assert SKIP_LATENESS < 70
    clock.advance(220)  # 70 s after the fifth tick
    Scheduler(client).run_once()
    # then "skip" passed it over (counted), and the others went on as before
    assert ticks_of(client.queue("q-skip")) == [first + 200_000]
    skip = {s.name: s for s in client.schedules()}["skip"]
    assert (skip.skipped, skip.fired, skip.last_tick_ms) == (1, 1, first + 400_000)
    assert ticks_of(client.queue("q-once")) == [first + 200_000, first + 400_000]
    assert ticks_of(client.queue("q-all")) == [first + i * 100_000 for i in range(5)]


def test_missed_all_is_bounded_per_call(client, clock):
    # given a backlog of more ticks than one call takes
    client.schedule("fast", "orders", every=0.01, missed="all")
    clock.advance(0.01 * (FIRE_BATCH * 2 + 5))
    # when a scheduler passes
    result = Scheduler(client).run_once()
    # then it took them in several calls, each tick once, in order
    assert result.published == FIRE_BATCH * 2 + 5 and result.handled == 3
    ticks = ticks_of(client.queue("orders"))
    assert ticks == sorted(set(ticks)) and len(ticks) == FIRE_BATCH * 2 + 5


def test_pause_resume_and_remove(client, clock):
    # given a schedule that has fired once
    client.schedule("beat", "orders", every=10)
    s = Scheduler(client)
    clock.advance(10)
    assert s.run_once().published == 1
    # when it is paused over three ticks
    paused = client.pause_schedule("beat")
    assert paused.paused and paused.next_tick_ms is None
    clock.advance(30)
    assert s.run_once().published == 0
    # then resuming publishes none of the pause's ticks, and goes on from the next
    resumed = client.resume_schedule("beat")
    assert not resumed.paused and resumed.next_tick_ms > clock.now_ms
    assert s.run_once().published == 0
    clock.advance(10)
    assert s.run_once().published == 1
    # when it is removed, nothing is published any more
    assert client.remove_schedule("beat") is True
    assert client.remove_schedule("beat") is False
    clock.advance(30)
    assert s.run_once().published == 0 and client.schedules() == []
    assert len(client.queue("orders").peek()) == 2
    # and pausing what does not exist says so
    with pytest.raises(rqueue.InvalidInput, match="no schedule 'beat'"):
        client.pause_schedule("beat")


def test_defining_again_keeps_or_restarts_the_ticks(client, clock):
    # given a schedule that fired its first tick
    client.schedule("beat", "orders", every=10, payload=b"v1")
    s = Scheduler(client)
    clock.advance(10)
    s.run_once()
    # when it is defined again with the same timing (an application that
    # declares its schedules at every start) and a new payload
    before = client.schedules()[0]
    again = client.schedule("beat", "orders", every=10, payload=b"v2")
    # then it goes on where it was, with the new payload
    assert (again.last_tick_ms, again.next_tick_ms, again.created_ms) == (
        before.last_tick_ms,
        before.next_tick_ms,
        before.created_ms,
    )
    clock.advance(10)
    assert s.run_once().published == 1
    assert [m.data for m in client.queue("orders").peek()] == [b"v1", b"v2"]
    # when its timing changes, the new timing fires from its first tick after now
    clock.advance(5)
    client.schedule("beat", "orders", every=60)
    assert s.run_once().published == 0
    # when it moves to another queue, it publishes there only
    client.schedule("beat", "other", every=60)
    clock.advance(60)
    assert s.run_once().published == 1
    assert len(client.queue("orders").peek()) == 2 and len(client.queue("other").peek()) == 1
    assert [x.queue for x in client.schedules()] == ["other"]


def test_bad_input_stores_nothing(client):
    # given calls that each get one thing wrong
    bad = [
        ({"name": "a b", "every": 1}, "schedule name 'a b'"),
        ({"name": "", "every": 1}, "schedule name"),
        ({"name": "s", "every": 0}, "every"),
        ({"name": "s", "every": 1, "cron": "* * * * *"}, "exactly one"),
        ({"name": "s", "cron": "nope"}, "5 fields"),
        ({"name": "s", "cron": "* * * * *", "timezone": "Nowhere/Land"}, "Nowhere/Land"),
        ({"name": "s", "every": 1, "missed": "sometimes"}, "missed must be one of once, all, skip"),
        ({"name": "s", "every": 1, "payload": "text"}, "payload must be bytes"),
        ({"name": "s", "every": 1, "headers": {"a": 1}}, "not str to str"),
        ({"name": "s", "every": 1, "headers": {"x-rq-tick": "1"}}, "x-rq-tick"),
        ({"name": "s", "every": 1, "queue": "bad{queue}"}, "queue name"),
    ]
    for kwargs, named in bad:
        args = {"queue": "orders", **kwargs}
        with pytest.raises(rqueue.InvalidInput, match=named.replace("{", r"\{").replace("}", r"\}")):
            client.schedule(args.pop("name"), args.pop("queue"), **args)
    # then nothing was stored: no schedule, no queue
    assert client.schedules() == []
    assert client.redis.exists(schedules_key(client.prefix)) == 0
    assert client.queues() == []


def test_a_schedule_on_a_partitioned_queue_lives_in_its_partition(client, clock):
    # given a partitioned queue and a schedule publishing to it
    pq = client.queue("events", partitions=3)
    client.schedule("nightly", "events", every=10)
    clock.advance(10)
    # when it fires
    assert Scheduler(client).run_once().published == 1
    # then the message is in the partition the schedule's name routes to
    part = pq.partition_for(key="nightly")
    assert [len(p.peek()) for p in pq.parts] == [1 if i == part else 0 for i in range(3)]
    assert target(client, "events", "nightly").keys == pq.parts[part].keys


def test_a_schedule_that_does_not_parse_holds_up_no_other(client, clock, caplog):
    # given three schedules, two of them damaged in Redis (headers that are
    # not JSON, a cron expression that is not one)
    for name in ("a", "b", "c"):
        client.schedule(name, "orders", every=10)
    keys = client.queue("orders").keys
    client.redis.hset(keys.schedule("a"), "headers", "not json")
    client.redis.hset(keys.schedule("b"), mapping={"every_ms": "", "cron": "bad"})
    clock.advance(10)
    # when a scheduler passes
    with caplog.at_level("WARNING", logger="rqueue.schedules"):
        result = Scheduler(client).run_once()
    # then the sound one published, and each damaged one was named
    assert result.published == 1
    assert [m.headers["x-rq-schedule"] for m in client.queue("orders").peek()] == ["c"]
    assert "schedule 'a'" in caplog.text and "schedule 'b'" in caplog.text
    assert [s.name for s in client.schedules()] == ["a", "c"]


def test_the_script_with_raw_keys_and_argv(client, clock):
    # given a schedule and its script called as a client in another language would
    client.schedule("beat", "orders", every=10, payload=b"p")
    q = client.queue("orders")
    key = q.keys.schedule("beat")
    version = client.redis.hget(key, "version")
    tick = clock.now_ms + 10_000
    keys = [key, q.keys.meta, q.keys.msgs, q.keys.floors]
    clock.advance(10)

    def call(*args):
        return client.scripts.schedule_fire(keys, [clock.script_now(), version, *args])

    # then too many ticks, or a lateness limit that is no number, are refused whole
    for args in (["", "", *range(1, 1002)], ["soon", "", str(tick)], ["-1", "", str(tick)]):
        with pytest.raises(Exception, match="RQ_BAD_ARGUMENT"):
            call(*args)
    assert q.peek() == []
    # and a due tick is stored as a record with the schedule's payload and headers
    assert call("", q.keys.wake_channel, str(tick)) == [b"ok", tick, 1, 0, 1]
    [m] = q.peek()
    assert (m.data, m.headers, m.published_ms) == (
        b"p",
        {"x-rq-schedule": "beat", "x-rq-tick": str(tick)},
        clock.now_ms,
    )
    # and a tick handled by a lateness limit of 0 ms, once late, is skipped
    clock.advance(20)
    assert call("0", "", str(tick + 10_000), str(tick + 20_000)) == [b"ok", tick + 20_000, 1, 1, 2]


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_a_scheduler_on_a_host_with_a_wrong_clock_fires_by_redis_time(backend, prefix, monkeypatch):
    # given a host whose clock is an hour behind, and a schedule every 50 ms
    client = rqueue.connect(backend, prefix=prefix)
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() - 3600)
    try:
        client.schedule("fast", "orders", every=0.05)
        runner = Scheduler(client).start()
        # when it runs
        q = client.queue("orders")
        wait_for(lambda: len(q.peek(10)) >= 3, timeout=15)
        runner.stop()
        # then it published the ticks due by Redis's clock, as they came
        sec, usec = client.redis.time()
        server_ms = int(sec) * 1000 + int(usec) // 1000
        ticks = ticks_of(q)
        assert all(server_ms - 15_000 < t <= server_ms for t in ticks)
        assert ticks == sorted(set(ticks))
    finally:
        client.close()


def test_the_script_checks_every_tick_itself(client, clock):
    # given a schedule, called with raw ticks as a scheduler would send them
    client.schedule("beat", "orders", every=10)
    q = client.queue("orders")
    key = q.keys.schedule("beat")
    version = client.redis.hget(key, "version").decode()
    now = clock.now_ms
    tick = now // 10_000 * 10_000 + 10_000
    clock.advance(10)

    def fire(*ticks: int, version: str = version, lateness: int | None = None) -> commands.FireReply:
        return commands.schedule_fire(
            client.scripts, key, q.keys, clock.script_now(), version, lateness, ticks, "orders"
        )

    # then a tick at or before creation is not published, nor one after now
    assert fire(now - 10_000, tick + 10_000).published == 0
    # a due tick is published once, however often it is sent
    first = fire(tick)
    assert (first.status, first.published, first.last_tick_ms, first.first_seq) == (
        commands.FireStatus.OK,
        1,
        tick,
        1,
    )
    assert fire(tick).published == 0 and fire(tick - 1).published == 0
    # ticks of another timing, of a paused schedule or of a removed one are refused
    clock.advance(10)
    assert fire(tick + 10_000, version="other").status is commands.FireStatus.CHANGED
    client.pause_schedule("beat")
    assert fire(tick + 10_000).status is commands.FireStatus.PAUSED
    client.resume_schedule("beat")
    client.remove_schedule("beat")
    assert fire(tick + 10_000).status is commands.FireStatus.GONE
    assert len(q.peek()) == 1
    # and arguments that do not parse are refused before anything is written
    client.schedule("beat", "orders", every=10)
    for ticks in ((tick + 20_000, tick + 10_000), (tick, tick)):
        with pytest.raises(rqueue.InvalidInput, match="refused its arguments: tick"):
            fire(*ticks)
    with pytest.raises(rqueue.InvalidInput, match="refused its arguments: tick 1e3"):
        commands.schedule_fire(client.scripts, key, q.keys, "", version, None, ["1e3"], "orders")
    assert len(q.peek()) == 1


def test_three_schedulers_at_once_publish_each_tick_once(backend, prefix):
    # given three processes' worth of schedulers on the server's clock, and
    # a schedule every 50 ms that publishes every tick
    clients = [rqueue.connect(backend, prefix=prefix) for _ in range(3)]
    try:
        clients[0].schedule("fast", "orders", every=0.05, missed="all")
        runners = [Scheduler(c).start() for c in clients]
        q = clients[0].queue("orders")
        # when they run for a dozen ticks
        wait_for(lambda: len(q.peek(20)) >= 12, timeout=15)
        for r in runners:
            r.stop()
        # then every tick from the first to the last was published once, in order
        ticks = ticks_of(q)
        assert ticks == list(range(ticks[0], ticks[-1] + 1, 50))
        assert sum(r.published for r in runners) == len(ticks)
    finally:
        for c in clients:
            c.close()


@pytest.mark.parametrize("backend", ["redis"], indirect=True)
def test_schedulers_killed_mid_run_publish_each_tick_once(backend, prefix):
    # given a schedule every 20 ms that publishes every tick
    client = rqueue.connect(backend, prefix=prefix)
    client.schedule("fast", "orders", every=0.02, missed="all")
    q = client.queue("orders")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-m", "rqueue.cli", "--url", backend, "--prefix", prefix, "scheduler"]

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    # when two scheduler processes run while one after the other is killed
    # (SIGKILL) as soon as it has published, and started again
    steady = start()
    try:
        for _ in range(3):
            doomed = start()
            count = len(ticks_of(q))
            wait_for(lambda count=count: len(ticks_of(q)) >= count + 5, timeout=20)
            doomed.send_signal(signal.SIGKILL)
            doomed.wait(10)
        count = len(ticks_of(q))
        wait_for(lambda: len(ticks_of(q)) >= count + 5, timeout=20)
    finally:
        steady.send_signal(signal.SIGTERM)
        assert steady.wait(10) == 0
    # then every tick from the first to the last was published once
    ticks = ticks_of(q)
    assert ticks == list(range(ticks[0], ticks[-1] + 1, 20))
    client.close()


def test_a_worker_runs_a_scheduler_by_default(client, clock):
    # given a schedule, and a worker of another queue
    client.schedule("beat", "ticks", every=10)
    clock.advance(10)
    w = rqueue.Worker(client.queue("orders"), "g", lambda d: None)
    off = rqueue.Worker(client.queue("orders"), "g", lambda d: None, scheduler=False)
    assert w.scheduler is True and off.scheduler is False
    with pytest.raises(rqueue.InvalidInput, match="scheduler must be True or False"):
        rqueue.Worker(client.queue("orders"), "g", lambda d: None, scheduler="yes")
    # (a partitioned queue's worker is one worker: one scheduler, not one per partition)
    pw = rqueue.Worker(client.queue("parted", partitions=3), "g", lambda d: None)
    assert isinstance(pw, rqueue.PartitionedWorker) and pw.scheduler is True
    # when it runs
    w.start()
    try:
        # then the due tick is published
        wait_for(lambda: len(client.queue("ticks").peek()) == 1, timeout=10)
    finally:
        w.stop()
        assert w.join(10)
    wait_for(lambda: not any(t.name == "rqueue-scheduler" and t.is_alive() for t in threading.enumerate()))


def test_scheduler_sleeps_until_the_next_tick(client, clock):
    # given a schedule every hour and a scheduler's pass
    client.schedule("hourly", "orders", every=3600)
    s = Scheduler(client, max_sleep=5.0)
    result = s.run_once()
    # then it sleeps until the next tick, bounded, never 0 when nothing is due
    assert 0 < (result.next_due_ms - result.now_ms) <= 3_600_000
    assert s.sleep_after(result) == 5.0


class CountingScheduler(Scheduler):
    passes = 0

    def run_once(self):
        self.passes += 1
        return super().run_once()


def test_a_running_scheduler_waits_and_wakes_on_a_change_or_stop(client, clock):
    # given a running scheduler with nothing due for an hour, whose bounded
    # sleep is longer than the test
    client.schedule("hourly", "orders", every=3600)
    s = CountingScheduler(client, max_sleep=60.0)
    s.start()
    try:
        wait_for(lambda: s.passes >= 1)
        # when a schedule is added, it wakes for another pass at once (the
        # change is announced again until then: an announcement made before
        # the scheduler's subscription is confirmed is only seen at its next
        # pass, up to max_sleep later)
        client.schedule("other", "orders", every=3600)

        def woken() -> bool:
            schedule_store.announce(client.redis, client.prefix)
            return s.passes >= 2

        wait_for(woken, timeout=10, interval=0.1)
        # and otherwise it does not pass again (no busy loop)
        seen = s.passes
        time.sleep(0.3)
        assert s.passes <= seen + 1
    finally:
        # when stopped, its loop ends at once, mid-sleep
        t0 = time.monotonic()
        s.stop()
    assert time.monotonic() - t0 < 2.0
    assert not s.alive


# -- the command line ------------------------------------------------------------


def test_cli_schedules_with_json(prefix):
    url = f"memory://{prefix}"
    runner = CliRunner()

    def run(*args: str):
        return runner.invoke(cli, ["--url", url, "--prefix", prefix, *args])

    # given a schedule added on the command line
    added = run(
        "schedules",
        "add",
        "nightly",
        "-q",
        "orders",
        "--cron",
        "0 3 * * *",
        "--timezone",
        "Europe/Berlin",
        "--payload",
        "go",
        "-H",
        "kind=report",
        "--json",
    )
    assert added.exit_code == 0, added.output
    info = json.loads(added.output)["schedule"]
    assert (info["name"], info["cron"], info["timezone"], info["missed"]) == (
        "nightly",
        "0 3 * * *",
        "Europe/Berlin",
        "once",
    )
    # then it is listed, as JSON and as a table
    listed = json.loads(run("schedules", "list", "--json").output)["schedules"]
    assert [s["name"] for s in listed] == ["nightly"] and listed[0]["next_tick"] is not None
    assert "nightly" in run("schedules", "list").output
    # and it pauses, resumes and goes
    assert json.loads(run("schedules", "pause", "nightly", "--json").output)["schedule"]["paused"] is True
    assert json.loads(run("schedules", "resume", "nightly", "--json").output)["schedule"]["paused"] is False
    assert json.loads(run("schedules", "remove", "nightly", "--json").output) == {"name": "nightly", "removed": True}
    assert json.loads(run("schedules", "list", "--json").output) == {"schedules": []}
    # and bad input names the problem with exit code 2, storing nothing
    bad = run("schedules", "add", "x", "-q", "orders", "--every", "0")
    assert bad.exit_code == 2 and "every must be" in bad.output
    bad = run("schedules", "add", "x", "-q", "orders", "--every", "5", "--cron", "* * * * *")
    assert bad.exit_code == 2 and "exactly one" in bad.output
    assert run("schedules", "pause", "x").exit_code == 2
    assert json.loads(run("schedules", "list", "--json").output) == {"schedules": []}


def test_a_schedule_never_overwrites_a_queue_whose_meta_was_deleted(client, clock):
    # given a queue with stored messages and a group, whose meta hash was deleted, and a due schedule on it
    q = client.queue("orders")
    q.publish_many([b"original-1", b"original-2"])
    q.consumer("g", "c0").close()
    client.schedule("beat", "orders", every=10, payload=b"SCHEDULED")
    client.redis.delete(q.keys.meta)
    clock.advance(10)
    # when a scheduler passes
    result = Scheduler(client).run_once()
    # then nothing is published and no stored record is overwritten: the meta stays missing for the doctor
    assert result.published == 0
    records = logview.records(client.redis, q.keys)
    assert sorted(records) == [1, 2] and not any(b"SCHEDULED" in r for r in records.values())
    assert client.redis.exists(q.keys.meta) == 0


def test_a_damaged_target_queue_holds_up_only_its_own_schedule(client, clock):
    # given two schedules, one to a queue whose last seq is garbage
    client.schedule("a", "broken", every=10, payload=b"a")
    client.schedule("b", "fine", every=10, payload=b"b")
    broken = client.queue("broken")
    client.redis.hset(broken.keys.meta, "seq", "garbage")
    clock.advance(10)
    # when a scheduler passes
    result = Scheduler(client).run_once()
    # then the other schedule fires, and the broken queue is left as it was
    assert result.published == 1
    assert [m.data for m in client.queue("fine").peek()] == [b"b"]
    assert client.redis.hget(broken.keys.meta, "seq") == b"garbage"


def test_the_scheduler_waits_double_up_to_a_limit_however_long_redis_is_away():
    # then the waits double from 0.5 s to 5 s, and stay there after any number of failures
    from rqueue.worker.scheduler import retry_wait

    assert [retry_wait(n) for n in (1, 2, 3, 4, 5)] == [0.5, 1.0, 2.0, 4.0, 5.0]
    assert retry_wait(10_000) == 5.0  # 2 ** 9999 overflowed a float and ended the thread
