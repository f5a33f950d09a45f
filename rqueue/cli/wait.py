"""``rqueue wait``: wait until a queue's groups have settled everything
published before the command started (rqueue.Queue.wait_settled)."""

from __future__ import annotations

import sys
import time
from typing import Any

import click

import rqueue
from rqueue.cli.common import EXIT_ERROR, connection, emit_json, existing
from rqueue.errors import NotSettled
from rqueue.waiting import wait_settled


@click.command()
@click.argument("queue")
@click.option("--group", "-g", default=None, help="Wait for this group only [default: every group].")
@click.option(
    "--timeout", type=click.FloatRange(0), default=None, help="Give up after this many seconds [default: never]."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queue", "settled": true|false, "groups": {GROUP: SEQ}, "waited_s"}, '
    'with "behind" and "error" when it timed out.',
)
@click.pass_obj
def wait(obj: dict[str, Any], queue: str, group: str | None, timeout: float | None, as_json: bool) -> None:
    """Wait until GROUP (or every group) of QUEUE has settled every message published before now.

    Exit code 0 once settled, 1 when --timeout passed first.
    """
    started = time.monotonic()
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        parts: list[rqueue.Queue] = []
        if isinstance(q, rqueue.PartitionedQueue):
            parts = q.parts
        elif isinstance(q, rqueue.Queue):
            parts = [q]
        try:
            settled = wait_settled(parts, queue, group, timeout)
        except NotSettled as exc:
            if not as_json:
                raise
            emit_json(
                {
                    "queue": queue,
                    "settled": False,
                    "behind": {g: {"settled_seq": f, "last_seq": t} for g, (f, t) in exc.behind.items()},
                    "waited_s": round(time.monotonic() - started, 3),
                    "error": str(exc),
                }
            )
            sys.exit(EXIT_ERROR)
    waited = round(time.monotonic() - started, 3)
    if as_json:
        emit_json({"queue": queue, "settled": True, "groups": settled, "waited_s": waited})
    else:
        groups = ", ".join(f"{g} (up to seq {s})" for g, s in settled.items())
        click.echo(f"queue {queue} settled by {groups} after {waited:g} s")
