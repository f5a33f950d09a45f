"""Everything rqueue does, run against one URL and prefix and checked as it
goes: publishing, consuming, settling, stats, dead letters, events, a
worker and the CLI. The security tests run it as a restricted ACL user
(test_acl.py) and with a password that must never be shown
(test_security.py)."""

from __future__ import annotations

import inspect
import threading
import time
import traceback
from dataclasses import dataclass, field

import pytest
from click.testing import CliRunner

import rqueue
from rqueue.cli import cli
from support.servers import wait_for


@dataclass
class CliRun:
    args: list[str]
    exit_code: int
    text: str  # stdout, stderr and any traceback


@dataclass
class Exercised:
    cli: list[CliRun] = field(default_factory=list)


def run_cli(*args: str, env: dict[str, str] | None = None) -> CliRun:
    result = CliRunner().invoke(cli, list(args), env=env)
    try:
        parts = [result.stdout, result.stderr]
    except ValueError:  # older click: stderr mixed into output
        parts = [result.output]
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        parts += traceback.format_exception(result.exception)
    return CliRun(list(args), result.exit_code, "\n".join(parts))


def exercise_everything(url: str, prefix: str) -> Exercised:
    """Every operation of rqueue against ``url`` under ``prefix``: publishing,
    consuming, settling, stats, dead letters, events, a worker and the CLI.
    Asserts that each one did what it should."""
    out = Exercised()
    client = rqueue.connect(url, prefix=prefix, settings_ttl=0)
    try:
        client.configure("jobs.#", ack_wait=5, max_deliveries=2)
        client.configure("jobs.a", dedup_window=60)
        q = client.queue("jobs.a")
        assert q.settings().ack_wait == 5

        # publish and publish_many, with ids (one a duplicate) and delays
        first = q.publish(b"one", headers={"k": "v"}, id="m-1")
        dup = q.publish(b"one again", id="m-1")
        assert dup.duplicate and dup.seq == first.seq
        q.publish_many([b"two", b"three", b"four", b"five"], ids=["m-2", "m-3", None, None])
        # (due after the first fetch below, even on a loaded machine: that fetch must not see it)
        q.publish_many([b"late"], ids=["m-late"], delay=1.5)

        # a consumer: fetch, ack, nack, reject, term, in_progress, heartbeat, close
        with q.consumer("g", name="c1", prefetch=50) as con:
            got = {d.data: d for d in con.fetch(10, timeout=1.0)}
            assert set(got) == {b"one", b"two", b"three", b"four", b"five"}
            assert got[b"one"].headers == {"k": "v"}
            got[b"one"].ack()
            assert got[b"two"].nack(delay=0, error="try again") == "requeued"
            got[b"three"].reject(reason="bad input")
            got[b"four"].term("not wanted")
            assert got[b"five"].in_progress() > 0
            hb = con.heartbeat([got[b"five"]], timeout=5.0, sync=True)
            assert hb.statuses == [None]
            con.ack([got[b"five"]])
            with pytest.raises(rqueue.AlreadyAcked):  # acked above the ack floor
                con.ack(got[b"five"])
            again = con.fetch(1, timeout=2.0)
            assert [d.data for d in again] == [b"two"] and again[0].redelivered
            again[0].ack()
            late = con.fetch(1, timeout=5.0)  # waits on the pub/sub wake-up and the delay
            assert [d.data for d in late] == [b"late"]
            late[0].ack()
            q.publish(b"six")
            held = con.fetch(1, timeout=1.0)
            assert [d.data for d in held] == [b"six"]
            members = q.stats().group("g").consumers  # with a member's heartbeat
            assert [(c.name, c.held) for c in members] == [("c1", 1)] and members[0].idle_ms is not None
        # closing returned "six" to the group

        # inspection
        stats = q.stats()
        g = stats.group("g")
        assert (g.dead_lettered, g.in_flight, stats.dead_letters) == (2, 0, 2)
        assert {"jobs.a", "DLQ.jobs.a"} <= set(client.queues())
        assert q.groups() == ["g"]
        assert [m.data for m in q.peek_group("g")] == [b"six"]
        assert len(q.peek(10)) >= 1
        assert [m.data for m in client.queue("DLQ.jobs.a").peek()] == [b"three", b"four"]

        # dead letters: list, replay (dry run, then for real), purge, events
        dead = q.dead_letters()
        assert sorted(d.reason for d in dead) == ["rejected", "terminated"]
        assert q.replay_dead_letters(dry_run=True).selected == 2
        assert q.replay_dead_letters(reason="rejected").replayed == 1
        assert q.purge_dead_letters(reason="terminated") == 1
        kinds = {e["event"] for e in q.events(50)}
        assert {"dead-lettered", "replayed", "purged"} <= kinds

        # a worker: "three" (replayed), "six" (returned), four new ones, one rejected
        q.publish_many([b"w0", b"w1", b"w2", b"w3", b"poison"])
        done: list[bytes] = []
        lock = threading.Lock()

        def handler(d: rqueue.Delivery) -> None:
            if d.data == b"poison":
                raise rqueue.Reject("poisoned")
            if d.data == b"w0":
                time.sleep(0.5)  # outlives a few heartbeats
            with lock:
                done.append(d.data)

        worker = rqueue.Worker(
            q, "g", handler, concurrency=3, heartbeat_interval=0.1, heartbeat_timeout=2.0, grace_period=5.0
        )
        worker.start()
        try:
            # (a worker that ended, e.g. on a refused command, stops the wait)
            wait_for(lambda: worker.join(0) or (worker.stats.acked >= 6 and worker.stats.rejected >= 1), timeout=15)
        finally:
            worker.stop()
            assert worker.join(10)
        assert sorted(done) == [b"six", b"three", b"w0", b"w1", b"w2", b"w3"]

        # a consumer that waits in Redis for its queue's wake-up (wait_in_redis:
        # XREAD on the wake stream; the publish after its empty fetch adds an entry)
        client.configure("jobs.wait", wait_in_redis=True)
        wq = client.queue("jobs.wait")
        with wq.consumer("g", name="w") as waiting:
            assert waiting.fetch(1, timeout=0.2) == [] and waiting.waits_on_wakes()
            wq.publish(b"woken")
            woken = waiting.fetch(1, timeout=2.0)
            assert [d.data for d in woken] == [b"woken"]
            woken[0].ack()
            assert waiting.fetch(1, timeout=0.05) == [] and waiting.waits_on_wakes()  # (Redis took its wait)
        assert worker.stats.leases_lost == 0

        # a second group, so that settling counts groups and trims by the lowest floor
        q.publish_many([b"x1", b"x2"])
        with q.consumer("audit") as audit:
            seen = audit.fetch(100, timeout=1.0)
            assert [d.data for d in seen][-2:] == [b"x1", b"x2"]
            audit.ack(seen)
        with q.consumer("g") as con:
            con.ack(con.fetch(10, timeout=1.0))
        assert q.stats().depth == 0

        if hasattr(q, "purge"):  # Queue.purge (lua/purge.lua), where this version has it
            q.publish(b"purge me")
            q.purge()

        if "key" in inspect.signature(q.publish_many).parameters:  # ordering keys, where this version has them
            client.configure("keys.q", key_concurrency=2, key_rate_limit=100, key_rate_period=60)
            kq = client.queue("keys.q")
            kq.publish_many([b"k1", b"k2", b"k3", b"j1"], key=["k", "k", "k", "j"])
            with kq.consumer("g") as con:
                first = con.fetch(10, timeout=1.0)
                assert sorted(d.data for d in first) == [b"j1", b"k1", b"k2"]
                con.ack(first)
                assert [d.data for d in con.fetch(10, timeout=1.0)] == [b"k3"]
            kq.purge()  # what the group's key queue holds, settled (lua/purge.lua)
            assert kq.stats().group("g").pending == 0

        (poison,) = q.dead_letters()
        assert (poison.data, poison.reason, poison.error) == (b"poison", "rejected", "poisoned")

        # the CLI, connected the same way
        common = ["--url", url, "--prefix", prefix]
        for args in (
            ["queues"],
            ["queues", "--json"],
            ["stats", "jobs.a"],
            ["stats", "jobs.a", "--json"],
            ["dlq", "list", "jobs.a"],
            ["dlq", "show", "jobs.a", str(poison.dlq_seq)],
            ["dlq", "replay", "jobs.a", "--dry-run"],
            ["dlq", "purge", "jobs.a", "--yes"],
            ["events", "jobs.a", "-n", "50"],
            ["configure", "cli.#", "--ack-wait", "7"],
            ["settings", "cli.q"],
            ["publish", "cli.q", "hello", "--id", "cli-1", "-H", "k=v"],
            ["publish", "cli.q", "later", "--delay", "60"],
            ["peek", "cli.q"],
            ["peek", "jobs.a", "-g", "g"],
            ["purge", "cli.q", "--yes"],
            ["top", "--once"],
            ["demo", "-n", "50", "-c", "2", "--json"],
        ):
            run = run_cli(*common, *args)
            assert run.exit_code == 0, f"rqueue {' '.join(args)} failed:\n{run.text}"
            run.args = args  # without the URL
            out.cli.append(run)
        shown = next(r.text for r in out.cli if r.args[:2] == ["dlq", "show"])
        assert "poisoned" in shown
    finally:
        client.close()
    return out
