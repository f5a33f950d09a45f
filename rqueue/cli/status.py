"""``rqueue status``: what became of one message (rqueue.Queue.status)."""

from __future__ import annotations

from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, emit_json, existing
from rqueue.results import MessageStatus


def status_json(queue: str, st: MessageStatus) -> dict[str, Any]:
    return {
        "queue": queue,
        "seq": st.seq,
        "state": st.state.value,
        "published_ms": st.published_ms,
        "not_before_ms": st.not_before_ms,
        "groups": {
            name: {"state": g.state.value, "consumer": g.consumer, "deliveries": g.deliveries, "reason": g.reason}
            for name, g in st.groups.items()
        },
    }


@click.command()
@click.argument("queue")
@click.argument("id", required=False)
@click.option("--seq", type=click.IntRange(1), default=None, help="Name the message by its seq instead of its id.")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queue", "seq", "state", "published_ms", "not_before_ms", '
    '"groups": {GROUP: {"state", "consumer", "deliveries", "reason"}}}.',
)
@click.pass_obj
def status(obj: dict[str, Any], queue: str, id: str | None, seq: int | None, as_json: bool) -> None:
    """Where message ID (or --seq N) of QUEUE stands: published, delayed,
    and per group in flight, waiting, acked, dead-lettered or dropped.

    An id is known while it is inside the queue's de-duplication window.
    """
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        if not isinstance(q, rqueue.Queue):
            raise rqueue.InvalidInput(f"queue {queue!r} is partitioned: ask the partition's queue")
        st = q.status(id, seq=seq)
    if as_json:
        emit_json(status_json(queue, st))
        return
    name = f"seq {st.seq}" if st.seq is not None else (f"id {id!r}" if id else f"seq {seq}")
    click.echo(f"{queue} {name}: {st.state.value}")
    for group, g in st.groups.items():
        extra = []
        if g.consumer:
            extra.append(f"held by {g.consumer}")
        if g.deliveries:
            extra.append(f"{g.deliveries} deliveries")
        if g.reason:
            extra.append(f"reason: {g.reason}")
        click.echo(f"  {group}: {g.state.value}" + (f" ({', '.join(extra)})" if extra else ""))
