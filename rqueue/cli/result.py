"""``rqueue result``: the stored outcome of one message (rqueue.Queue.result)."""

from __future__ import annotations

import base64
import json
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, emit_json, existing
from rqueue.stored_results import Result


@click.command()
@click.argument("queue")
@click.argument("seq", type=click.IntRange(1), required=False)
@click.option(
    "--id",
    "msg_id",
    default=None,
    help="Name the message by the id it was published with (known while inside its de-duplication window).",
)
@click.option(
    "--timeout", type=click.FloatRange(0), default=0.0, show_default=True, help="Wait up to this many seconds for it."
)
@click.option(
    "--group",
    default=None,
    help="The group whose result to show (each group keeps its own); may be left out when the queue has one.",
)
@click.option(
    "--partition",
    type=click.IntRange(0),
    default=None,
    help="The partition of a partitioned queue that took the message (its seqs are per partition).",
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print {"queue", "seq", "group", "partition", "ok", "value"} (bytes as {"base64": ...}), '
    'or with "failure": {"reason", "error"}; "partition" is the partition that kept it (null: not partitioned).',
)
@click.pass_obj
def result(
    obj: dict[str, Any],
    queue: str,
    seq: int | None,
    msg_id: str | None,
    timeout: float,
    group: str | None,
    partition: int | None,
    as_json: bool,
) -> None:
    """Show the result a worker kept for message SEQ of QUEUE (the queue's results setting).

    Exit code 0 with a result (a failure included), 1 when none came within --timeout.
    """
    if (seq is None) == (msg_id is None):
        raise click.UsageError("give the message's SEQ or its --id, not both and not neither")
    which: int | str = seq if seq is not None else str(msg_id)
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        if isinstance(q, rqueue.PartitionedQueue):
            found = q.result(which, timeout=timeout, group=group, partition=partition)
        else:
            assert isinstance(q, rqueue.Queue)
            if partition is not None:
                raise rqueue.InvalidInput(f"queue {queue!r} is not partitioned: leave out --partition")
            found = q.result(which, timeout=timeout, group=group)
    if as_json:
        emit_json({**result_json(queue, found), "group": found.group, "partition": found.partition})
    elif found.failure is not None:
        click.echo(f"failed ({found.failure.reason}): {found.failure.error}")
    elif isinstance(found.value, bytes):
        click.echo(found.value.decode(errors="backslashreplace"))
    else:
        click.echo(json.dumps(found.value))


def result_json(queue: str, found: Result) -> dict[str, Any]:
    out: dict[str, Any] = {"queue": queue, "seq": found.seq, "ok": found.ok}
    if found.failure is not None:
        out["failure"] = {"reason": found.failure.reason, "error": found.failure.error}
    elif isinstance(found.value, bytes):
        out["value"] = {"base64": base64.b64encode(found.value).decode()}
    else:
        out["value"] = found.value
    return out
