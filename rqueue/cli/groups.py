"""``rqueue group create|reset|delete``: groups at a position
(docs/retention.md)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, emit_json, existing
from rqueue.retention import Position
from rqueue.validate import is_whole_number_text

POSITION_HELP = (
    "first (the oldest message stored), last (only new messages), a seq N (or seq:N: from seq N on) "
    "or an ISO 8601 time with a timezone (or time:T: from the first message published at or after it)."
)


def parse_position(text: str) -> Position:
    """A position from its command-line form; InvalidInput naming it."""
    kind, _, rest = text.partition(":")
    if text in ("first", "last"):
        return text
    if kind == "seq" and rest:
        text = rest
    if is_whole_number_text(text):
        return int(text)
    if kind == "time" and rest:
        text = rest
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise rqueue.InvalidInput(f"position {text!r} is not one: {POSITION_HELP}") from None
    if when.tzinfo is None:
        raise rqueue.InvalidInput(f"time {text!r} has no timezone: add one (e.g. Z or +00:00)")
    return when


def _queue(client: rqueue.Client, name: str) -> rqueue.Queue | rqueue.PartitionedQueue:
    q = existing(client, name)
    assert isinstance(q, (rqueue.Queue, rqueue.PartitionedQueue))  # what Client.queue returns
    return q


@click.group("group")
def group() -> None:
    """Create a group at a position, reset one, or delete one.

    On a partitioned queue each applies in every partition: first, last and
    a time mean the same in each; a seq is refused (each partition has its
    own seqs).
    """


@group.command("create")
@click.argument("queue")
@click.argument("name")
@click.option("--from", "start", default="first", show_default=True, metavar="POSITION", help=POSITION_HELP)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queue": Q, "group": G, "after": SEQ}; for a partitioned queue '
    '"partitions": [{"partition", "after"}] instead of "after".',
)
@click.pass_obj
def group_create(obj: dict[str, Any], queue: str, name: str, start: str, as_json: bool) -> None:
    """Create group NAME of QUEUE, handed the messages after a position."""
    position = parse_position(start)
    with connection(obj["url"], obj["prefix"]) as client:
        after = _queue(client, queue).create_group(name, position)
    if isinstance(after, list):
        if as_json:
            parts = [{"partition": i, "after": seq} for i, seq in enumerate(after)]
            emit_json({"queue": queue, "group": name, "partitions": parts})
        else:
            seqs = ", ".join(f"{i}: {seq}" for i, seq in enumerate(after))
            click.echo(f"group {name} of {queue} created in {len(after)} partitions, after seqs {seqs}")
    elif as_json:
        emit_json({"queue": queue, "group": name, "after": after})
    else:
        click.echo(f"group {name} of {queue} created: it is handed the messages after seq {after}")


@group.command("reset")
@click.argument("queue")
@click.argument("name")
@click.option("--to", "to", required=True, metavar="POSITION", help=POSITION_HELP)
@click.option("--force", is_flag=True, help="Take back deliveries in flight (their acks then fail).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queue", "group", "previous", "floor", "cancelled"}: the floors are seqs. For a '
    'partitioned queue {"queue", "group", "cancelled", "partitions": [{"partition", "previous", '
    '"floor", "cancelled"}]}.',
)
@click.pass_obj
def group_reset(obj: dict[str, Any], queue: str, name: str, to: str, force: bool, as_json: bool) -> None:
    """Move group NAME of QUEUE to a position: back, and it is handed again
    what it had settled; forward, and it skips what lies between."""
    position = parse_position(to)
    with connection(obj["url"], obj["prefix"]) as client:
        reset = _queue(client, queue).reset_group(name, position, force=force)
    if isinstance(reset, list):
        cancelled = sum(r.cancelled for r in reset)
        if as_json:
            parts = [
                {"partition": r.partition, "previous": r.previous, "floor": r.floor, "cancelled": r.cancelled}
                for r in reset
            ]
            emit_json({"queue": queue, "group": name, "cancelled": cancelled, "partitions": parts})
            return
        for r in reset:
            click.echo(f"partition {r.partition}: from seq {r.previous} to seq {r.floor}")
        click.echo(
            f"group {name} of {queue} reset in {len(reset)} partitions"
            + (f"; {cancelled} deliveries in flight taken back" if cancelled else "")
        )
    elif as_json:
        emit_json(
            {
                "queue": queue,
                "group": name,
                "previous": reset.previous,
                "floor": reset.floor,
                "cancelled": reset.cancelled,
            }
        )
    else:
        click.echo(
            f"group {name} of {queue} reset from seq {reset.previous} to seq {reset.floor}"
            + (f"; {reset.cancelled} deliveries in flight taken back" if reset.cancelled else "")
        )


@group.command("delete")
@click.argument("queue")
@click.argument("name")
@click.option("--force", is_flag=True, help="Take back deliveries in flight (their acks then fail).")
@click.option("--json", "as_json", is_flag=True, help='Print {"queue": Q, "group": G, "cancelled": N}.')
@click.pass_obj
def group_delete(obj: dict[str, Any], queue: str, name: str, force: bool, as_json: bool) -> None:
    """Delete group NAME of QUEUE (in every partition of a partitioned
    queue; its dead letters stay)."""
    with connection(obj["url"], obj["prefix"]) as client:
        cancelled = _queue(client, queue).delete_group(name, force=force)
    if as_json:
        emit_json({"queue": queue, "group": name, "cancelled": cancelled})
    else:
        click.echo(
            f"group {name} of {queue} deleted" + (f"; {cancelled} deliveries in flight taken back" if cancelled else "")
        )
