"""``rqueue demo``: publish to queue 'demo', consume with acks, nacks and
rejects, and check the stats that result."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import click
import redis

import rqueue
from rqueue.cli.common import EXIT_ERROR, connection, emit_json, fail, progress, table
from rqueue.cli.inspect import Column, stats_text
from rqueue.protocols import AnyConsumer

DEMO_QUEUE = "demo"
DEMO_GROUP = "workers"
DEMO_BATCH = 500  # messages per publish_many call
DEMO_FETCH = 100  # deliveries per fetch
DEMO_FETCH_TIMEOUT = 0.5  # seconds a consumer waits for work
DEMO_NACK_EVERY = 100  # every such message is nacked once on its first delivery
DEMO_POISON = 3  # messages that are rejected into the dead-letter queue
DEMO_SHOW = 5  # events of each kind shown as they happen
DEMO_STALL_TIMEOUT = 60.0  # seconds without progress before the demo gives up

DEMO_COLUMNS: list[Column] = [
    ("group", lambda g: g.name),
    ("ack floor", lambda g: g.ack_floor),
    ("in flight", lambda g: g.in_flight),
    ("acked", lambda g: g.acked),
    ("nacked", lambda g: g.nacked),
    ("redelivered", lambda g: g.redelivered),
    ("dead-lettered", lambda g: g.dead_lettered),
]


class DemoRun:
    """What the demo's consumers have done so far; shared by their threads."""

    def __init__(self, run: str, seqs: set[int]) -> None:
        self.run = run
        self.remaining = set(seqs)
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.errors: list[BaseException] = []
        self.settled = 0
        self.deliveries = 0
        self.redelivered = 0
        self.nacked = 0
        self.dead_lettered = 0
        self.foreign = 0  # messages left in the queue by earlier runs
        self.shown: dict[str, int] = {}
        self.say: Callable[[str], None] | None = None  # where to show events as they happen
        if not self.remaining:
            self.done.set()

    def finish(self, seqs: list[int]) -> None:
        with self.lock:
            before = len(self.remaining)
            self.remaining.difference_update(seqs)
            self.settled += before - len(self.remaining)
            if not self.remaining:
                self.done.set()

    def show(self, kind: str, text: str) -> None:
        """Shows the first DEMO_SHOW events of each kind as they happen."""
        if self.say is None:
            return
        with self.lock:
            n = self.shown[kind] = self.shown.get(kind, 0) + 1
        if n <= DEMO_SHOW:
            self.say(text)
        elif n == DEMO_SHOW + 1:
            self.say(f"  ... (further {kind} events are counted, not shown)")

    def consume(self, consumer: AnyConsumer) -> None:
        try:
            while not self.done.is_set():
                to_ack = []
                for d in consumer.fetch(DEMO_FETCH, timeout=DEMO_FETCH_TIMEOUT):
                    try:
                        body = json.loads(d.data)
                    except ValueError:
                        body = {}  # not published by a demo run
                    with self.lock:
                        self.deliveries += 1
                        self.redelivered += d.redelivered
                    if d.redelivered:
                        self.show(
                            "redelivery", f"  redelivered: seq {d.seq}, delivery {d.delivery_count}, to {consumer.name}"
                        )
                    if not isinstance(body, dict) or body.get("run") != self.run:
                        with self.lock:
                            self.foreign += 1
                        to_ack.append(d)
                    elif body.get("poison"):
                        d.reject(reason="demo poison")
                        self.show(
                            "dead-letter", f"  dead-lettered: seq {d.seq} (rejected: demo poison) into DLQ.{DEMO_QUEUE}"
                        )
                        with self.lock:
                            self.dead_lettered += 1
                        self.finish([d.seq])
                    elif body["n"] % DEMO_NACK_EVERY == 0 and not d.redelivered:
                        d.nack(delay=0)
                        with self.lock:
                            self.nacked += 1
                    else:
                        to_ack.append(d)
                if to_ack:
                    consumer.ack(to_ack)
                    self.finish([d.seq for d in to_ack])
        except BaseException as exc:  # handed to the main thread
            self.fail(exc)

    def fail(self, exc: BaseException) -> None:
        with self.lock:
            self.errors.append(exc)
        self.done.set()


def poison_numbers(n: int) -> set[int]:
    """DEMO_POISON message numbers (1..n), spread out, none of them nacked first."""
    out: set[int] = set()
    for k in range(1, DEMO_POISON + 1):
        i = k * n // (DEMO_POISON + 1) + 1
        while i in out or i % DEMO_NACK_EVERY == 0:
            i = i % n + 1
        out.add(i)
    return out


@click.command()
@click.option(
    "--messages",
    "-n",
    type=click.IntRange(DEMO_POISON, 10_000_000),
    default=3000,
    show_default=True,
    help="Messages to publish.",
)
@click.option(
    "--consumers",
    "-c",
    type=click.IntRange(1, 64),
    default=2,
    show_default=True,
    help="Consumer threads of group 'workers'.",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object: published, consumed, redelivered, dead_lettered, "
    "publish_per_s, consume_per_s, stats{...} (dataclasses.asdict(QueueStats)), ok, problems.",
)
@click.pass_obj
def demo(obj: dict[str, Any], messages: int, consumers: int, as_json: bool) -> None:
    """Publish messages to queue 'demo' and consume them with acks.

    Every 100th message is nacked once on its first delivery, so it comes
    back with redelivered=True; 3 poison messages are rejected into the
    dead-letter queue 'DLQ.demo'. At the end the stats must show the
    group's ack floor at the last seq, depth 0 and 3 new dead letters;
    otherwise the exit code is 1.
    """
    with connection(obj["url"], obj["prefix"], embedded=True) as client:
        q = client.queue(DEMO_QUEUE)
        before = q.stats()
        run = uuid.uuid4().hex[:12]
        poison = poison_numbers(messages)

        # Publish.
        seqs: set[int] = set()
        start = time.perf_counter()
        with progress(messages, "publishing", quiet=as_json) as bar:
            for first in range(1, messages + 1, DEMO_BATCH):
                numbers = range(first, min(first + DEMO_BATCH, messages + 1))
                payloads = [json.dumps({"run": run, "n": i, "poison": i in poison}).encode() for i in numbers]
                results = q.publish_many(payloads, ids=[f"demo-{run}-{i}" for i in numbers])
                seqs.update(r.seq for r in results if not r.duplicate)
                bar.update(len(numbers))
        publish_s = time.perf_counter() - start

        # Consume.
        state = DemoRun(run, seqs)
        if not as_json:
            state.say = lambda text: click.echo(text, err=True)
        members = [q.consumer(group=DEMO_GROUP) for _ in range(consumers)]
        threads = [
            threading.Thread(target=state.consume, args=(c,), name=f"demo-consumer-{i}", daemon=True)
            for i, c in enumerate(members)
        ]
        start = time.perf_counter()
        try:
            for t in threads:
                t.start()
            with progress(len(seqs), "consuming", quiet=as_json) as bar:
                shown, last_progress = 0, time.monotonic()
                while not state.done.wait(0.1):
                    if state.settled != shown:
                        bar.update(state.settled - shown)
                        shown, last_progress = state.settled, time.monotonic()
                    elif time.monotonic() - last_progress > DEMO_STALL_TIMEOUT:
                        state.fail(
                            rqueue.RQueueError(
                                f"demo stalled: no message settled for {DEMO_STALL_TIMEOUT:.0f} s "
                                f"({len(state.remaining)} of {len(seqs)} left)"
                            )
                        )
                        break
                bar.update(state.settled - shown)
            consume_s = time.perf_counter() - start
        finally:
            state.done.set()
            for t in threads:
                t.join()
            for c in members:
                # The first error is the one to report.
                with contextlib.suppress(rqueue.RQueueError, redis.RedisError):
                    c.close()
        if state.errors:
            raise state.errors[0]
        after = q.stats()
        # Read while the server is there: a queue re-reads its settings once they are a second old.
        dead_letter_name = q.dead_letter_queue.name

    problems = demo_problems(before, after, messages, len(seqs))
    report = {
        "published": len(seqs),
        "consumed": state.settled,
        "deliveries": state.deliveries,
        "nacked": state.nacked,
        "redelivered": state.redelivered,
        "dead_lettered": state.dead_lettered,
        "publish_per_s": round(len(seqs) / publish_s, 1) if publish_s else None,
        "consume_per_s": round(state.settled / consume_s, 1) if consume_s else None,
        "stats": dataclasses.asdict(after),
        "ok": not problems,
        "problems": problems,
    }
    if as_json:
        emit_json(report)
    else:
        click.echo(stats_text(after, DEMO_COLUMNS))
        click.echo()
        click.echo(
            table(
                ["step", "messages", "seconds", "messages/s"],
                [
                    ["publish", len(seqs), round(publish_s, 3), report["publish_per_s"]],
                    ["consume", state.settled, round(consume_s, 3), report["consume_per_s"]],
                ],
            )
        )
        click.echo(
            f"\nredelivered {state.redelivered} (nacked {state.nacked}), "
            f"dead-lettered {state.dead_lettered} into {dead_letter_name}"
        )
        if state.foreign:
            click.echo(f"acked {state.foreign} messages left in {DEMO_QUEUE!r} by earlier runs")
    if problems:
        fail(click.get_current_context(), "demo check failed: " + "; ".join(problems), EXIT_ERROR)
    if not as_json:
        click.echo("ok: every message acked or dead-lettered")


def demo_problems(before: rqueue.QueueStats, after: rqueue.QueueStats, messages: int, published: int) -> list[str]:
    """What is wrong with the queue after the demo; empty when all is well."""
    problems = []
    if published != messages:
        problems.append(f"{messages - published} of {messages} publishes were reported as duplicates")
    try:
        group = after.group(DEMO_GROUP)
    except KeyError:
        return problems + [f"group {DEMO_GROUP!r} is missing"]
    if group.ack_floor != after.last_seq:
        problems.append(f"group {DEMO_GROUP!r} ack floor {group.ack_floor} != last seq {after.last_seq}")
    if after.depth != 0:
        problems.append(f"queue depth {after.depth} != 0")
    added = after.dead_letters - before.dead_letters
    if added != DEMO_POISON:
        problems.append(f"dead letters grew by {added} (now {after.dead_letters}), expected {DEMO_POISON}")
    return problems
