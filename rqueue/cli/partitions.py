"""`rqueue rebalance`: where the partitions of a partitioned queue live."""

from __future__ import annotations

import dataclasses
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, emit_json, table


def partitioned(client: rqueue.Client, name: str) -> rqueue.PartitionedQueue:
    """Queue ``name``, which must be partitioned (InvalidInput, exit code 2, if not)."""
    q = client.queue(name)
    if not isinstance(q, rqueue.PartitionedQueue):
        raise rqueue.InvalidInput(f"queue {name!r} is not partitioned (create it with `rqueue create --partitions N`)")
    return q


def placement_text(report: rqueue.PlacementReport) -> str:
    """Where each partition lives, then how many each primary serves."""
    rows = [[p.partition, p.hash_tag, p.slot, p.node or "(the server)"] for p in report.placement]
    text = f"queue {report.queue}: {report.partitions} partitions\n"
    text += table(["partition", "hash_tag", "slot", "node"], rows)
    if not report.per_node:
        text += "\none server: every partition lives on it (balanced)"
    else:
        text += "\n\n" + table(["node", "partitions"], [[n, c] for n, c in sorted(report.per_node.items())])
        text += "\n" + (
            "balanced" if report.balanced else "not balanced: a primary serves 2 or more partitions more than another"
        )
    return text


@click.command()
@click.argument("queue")
@click.option("--json", "as_json", is_flag=True, help="Print the placement as JSON.")
@click.pass_obj
def rebalance(obj: dict[str, Any], queue: str, as_json: bool) -> None:
    """Report where each partition of QUEUE lives (hash tag, slot, primary)
    and how many partitions each primary serves. Moves nothing: partitions
    are spread over the primaries when the queue is created or grown, and
    move with their slots when the cluster is resharded."""
    with connection(obj["url"], obj["prefix"]) as client:
        report = partitioned(client, queue).placement(refresh=True)
    if as_json:
        emit_json(dataclasses.asdict(report))
    else:
        click.echo(placement_text(report))


@click.command()
@click.argument("queue")
@click.option("--grow", "grow", type=int, default=None, help="Add partitions, live, up to this many in all.")
@click.option("--json", "as_json", is_flag=True, help="Print the layout as JSON.")
@click.pass_obj
def partitions(obj: dict[str, Any], queue: str, grow: int | None, as_json: bool) -> None:
    """Show how many partitions QUEUE has (and its last growth); with
    --grow M, add partitions up to M in all without stopping producers or
    workers (they take up the new partitions within a second)."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = partitioned(client, queue)
        before = q.partitions
        if grow is not None:
            q = client.grow_partitions(queue, grow)
        layout = q.layout
        report = q.placement(refresh=True)
    out = {
        "queue": queue,
        "partitions": layout.partitions,
        "before": before,
        "previous": layout.previous or None,
        "grown_ms": layout.grown_ms or None,
        "per_node": report.per_node,
    }
    if as_json:
        emit_json(out)
        return
    if grow is not None and before != layout.partitions:
        click.echo(f"queue {queue}: grew from {before} to {layout.partitions} partitions")
    else:
        click.echo(f"queue {queue}: {layout.partitions} partitions")
    if layout.previous:
        click.echo(f"last growth: from {layout.previous} partitions at server time {layout.grown_ms} ms")
