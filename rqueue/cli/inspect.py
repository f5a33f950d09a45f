"""Commands that read and change nothing: stats, queues, peek, settings,
top and events."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

import click

import rqueue
from rqueue.cli.common import clock_time, connection, emit_json, existing, table
from rqueue.events import EVENT_KINDS, check_kinds

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
    ("paused", lambda g: "yes" if g.paused else "no"),
    ("keys_ready", lambda g: g.keys_ready),
    ("keys_busy", lambda g: g.keys_busy),
]

EVENT_KEYS = ["id", "event", "group", "seq", "reason", "at", "dlq_seq"]
EVENT_NUMBERS = ("seq", "at", "dlq_seq")  # stored as text in the stream; whole numbers or empty
FOLLOW_POLL = 0.5  # seconds between reads of the event stream


def stats_text(s: rqueue.QueueStats, columns: list[Column]) -> str:
    """The stats of a queue as text: one line for the queue, a table of its
    groups and, with STATS_COLUMNS, a table of their consumers."""
    head = (
        f"queue {s.name}: depth {s.depth}, last seq {s.last_seq}, delayed {s.scheduled}, dead letters {s.dead_letters}"
    )
    if s.paused:
        head += f", paused ({s.paused})"
    if s.placement:
        head += "\npartitions on: " + ", ".join(f"{p.partition} {p.node or 'the server'}" for p in s.placement)
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


def paused_text(s: rqueue.QueueStats) -> str:
    """What of a queue is paused, as `rqueue top` shows it: the queue's
    mode, and the paused groups."""
    parts = [f"queue ({s.paused})"] if s.paused else []
    return ", ".join(parts + [g.name for g in s.groups if g.paused])


def queue_delayed(s: rqueue.QueueStats) -> int:
    """Messages of a queue waiting for a time before they may be delivered,
    as one figure: its delayed publishes not yet due, or the most any group
    holds back (its delayed redeliveries and the delayed publishes it has
    read), whichever is larger. `rqueue stats` shows each group's."""
    return max([s.scheduled, *(g.delayed for g in s.groups)])


def event_json(e: dict[str, str]) -> dict[str, Any]:
    """An event with its numbers as ints (None where empty), as every other
    --json output gives them."""
    out: dict[str, Any] = dict(e)
    for key in EVENT_NUMBERS:
        value = e.get(key, "")
        out[key] = int(value) if value.isdigit() else None
    return out


def event_cells(e: dict[str, Any]) -> list[Any]:
    """An event as a table row, its time readable."""
    return [clock_time(e["at"]) if k == "at" else e.get(k) for k in EVENT_KEYS]


def message_json(m: rqueue.Message) -> dict[str, Any]:
    return {
        "seq": m.seq,
        "published_ms": m.published_ms,
        "headers": m.headers,
        "data": m.data.decode("utf-8", "backslashreplace"),
    }


@click.command()
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print dataclasses.asdict(QueueStats) as JSON.")
@click.pass_obj
def stats(obj: dict[str, Any], queue: str, as_json: bool) -> None:
    """Depth, delayed publishes, dead letters and per-group figures of QUEUE."""
    with connection(obj["url"], obj["prefix"]) as client:
        s = existing(client, queue).stats()
    if as_json:
        emit_json(dataclasses.asdict(s))
    else:
        click.echo(stats_text(s, STATS_COLUMNS))


QUEUE_FIGURES = ["groups", "depth", "in_flight", "delayed", "dead_letters", "consumers"]


def queue_row(client: rqueue.Client, name: str) -> dict[str, Any]:
    """One queue's line of `rqueue queues`. A queue that cannot be read (a
    name another client or an older version stored that this one refuses,
    a damaged key) gets its error and no figures, rather than failing the
    whole list; a lost connection still fails it."""
    try:
        s = client.queue(name).stats()
    except rqueue.ConnectionLost:
        raise
    except rqueue.RQueueError as exc:
        return {"name": name, **dict.fromkeys(QUEUE_FIGURES), "error": str(exc)}
    return {
        "name": name,
        "groups": len(s.groups),
        "depth": s.depth,
        "in_flight": sum(g.in_flight for g in s.groups),
        "delayed": queue_delayed(s),
        "dead_letters": s.dead_letters,
        "consumers": sum(len(g.consumers) for g in s.groups),
    }


def shown_name(name: str) -> str:
    """A queue name as a table shows it: as it is, or quoted with escapes
    when it holds what would break the table (whitespace, control
    characters), as a name stored by another client may."""
    return name if name.isprintable() and " " not in name else repr(name)


@click.command()
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queues": [{name, groups, depth, in_flight, delayed, dead_letters, consumers}, ...]}; '
    'a queue that cannot be read has "error" and null figures. delayed: delayed publishes not yet due, '
    "or the most any group holds back for a delay, whichever is larger.",
)
@click.pass_obj
def queues(obj: dict[str, Any], as_json: bool) -> None:
    """Every queue of the prefix with its depth, in-flight and dead-letter
    counts. A queue that cannot be read is listed with a warning on stderr."""
    with connection(obj["url"], obj["prefix"]) as client:
        rows = [queue_row(client, name) for name in client.queues()]
    for row in rows:
        if "error" in row:
            click.echo(f"warning: queue {shown_name(row['name'])} cannot be read: {row['error']}", err=True)
    if as_json:
        emit_json({"queues": rows})
    elif not rows:
        click.echo("(no queues)")
    else:
        click.echo(
            table(
                ["queue", "groups", "depth", "in flight", "delayed", "dead letters", "consumers"],
                [[shown_name(r["name"]), *(r[k] for k in QUEUE_FIGURES)] for r in rows],
            )
        )


@click.command()
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
        found = q.peek_group(group, count) if group is not None else q.peek(count, after=after)
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
                        clock_time(m.published_ms),
                        json.dumps(m.headers) if m.headers else "",
                        m.data[:60].decode("utf-8", "backslashreplace"),
                    ]
                    for m in found
                ],
            )
        )


@click.command()
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


@click.command()
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
                        queue_delayed(s),
                        s.dead_letters,
                        sum(len(g.consumers) for g in s.groups),
                        in_rate,
                        ack_rate,
                        paused_text(s) or None,
                    ]
                )
            last_at = now
            view = table(
                ["queue", "depth", "in flight", "delayed", "dead letters", "consumers", "in/s", "acked/s", "paused"],
                rows,
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


@click.command()
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
@click.option(
    "--kind",
    "kinds",
    multiple=True,
    metavar="EVENT",
    help=f"Show only events of this kind (repeatable; another kind is refused): {', '.join(EVENT_KINDS)}.",
)
@click.pass_obj
def events(
    obj: dict[str, Any],
    queue: str,
    count: int,
    as_json: bool,
    follow: bool,
    seconds: float | None,
    kinds: tuple[str, ...],
) -> None:
    """Recent events of QUEUE, oldest first: dead-letters, drops, replays and
    purges, and the lifecycle events its events setting records (completed,
    failed, timeout, scheduled, ...; docs/events.md). --kind filters the
    newest COUNT."""
    check_kinds(kinds)
    if follow:
        follow_events(obj, queue, count, as_json, seconds, kinds)
        return
    with connection(obj["url"], obj["prefix"]) as client:
        found = [event_json(e) for e in existing(client, queue).events(count) if not kinds or e.get("event") in kinds]
    if as_json:
        emit_json({"events": found})
    elif not found:
        click.echo("(no events)")
    else:
        click.echo(table(EVENT_KEYS, [event_cells(e) for e in found]))


def follow_events(
    obj: dict[str, Any], queue: str, count: int, as_json: bool, seconds: float | None, kinds: tuple[str, ...] = ()
) -> None:
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        shown = q.events(count)
        last = shown[-1]["id"] if shown else "0"
        deadline = None if seconds is None else time.monotonic() + seconds
        try:
            while True:
                for raw in shown:
                    if kinds and raw.get("event") not in kinds:
                        continue
                    e = event_json(raw)
                    cells = zip(EVENT_KEYS, event_cells(e), strict=True)
                    line = "  ".join(f"{k}={'-' if v is None else v}" for k, v in cells)
                    click.echo(json.dumps(e) if as_json else line)
                if deadline is not None and time.monotonic() >= deadline:
                    return
                time.sleep(FOLLOW_POLL)
                shown = q.events_after(last, 1000)
                if shown:
                    last = shown[-1]["id"]
        except KeyboardInterrupt:
            return
