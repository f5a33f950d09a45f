"""``rqueue dlq``: list, show, replay and purge a queue's dead letters."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import click

import rqueue
from rqueue.cli.common import clock_time, connection, emit_json, existing, progress, table


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


def dead_letter_json(d: rqueue.DeadLetter, with_data: bool = False) -> dict[str, Any]:
    out = dataclasses.asdict(d)
    data = out.pop("data")
    if with_data:
        out["data"] = data.decode("utf-8", "backslashreplace")
    return out


@click.group()
def dlq() -> None:
    """Inspect, replay and purge a queue's dead letters."""


@dlq.command("list")
@click.argument("queue")
@selection_options
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"dead_letters": [...]} (fields of rqueue.DeadLetter, no data).'
)
@click.pass_obj
def dlq_list(obj: dict[str, Any], /, queue: str, as_json: bool, **selection: Any) -> None:
    """The dead letters of QUEUE, oldest first."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
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
        q = existing(client, queue)
        if isinstance(q, rqueue.PartitionedQueue):
            if partition is None or partition >= q.partitions:
                raise rqueue.InvalidInput(
                    f"queue {queue!r} has {q.partitions} partitions: give --partition from 0 to "
                    f"{q.partitions - 1} (dlq list shows each dead letter's)"
                )
            page = q.parts[partition].dead_letter_queue.peek(1, after=dlq_seq - 1)
        elif partition is not None:
            raise rqueue.InvalidInput(f"--partition {partition}: queue {queue!r} is not partitioned")
        else:
            page = q.dead_letter_queue.peek(1, after=dlq_seq - 1)
    if not page or page[0].seq != dlq_seq:
        raise rqueue.InvalidInput(f"queue {queue!r} has no dead letter with dlq seq {dlq_seq}")
    d = dataclasses.replace(rqueue.DeadLetter.from_message(page[0]), partition=partition)
    if as_json:
        emit_json(dead_letter_json(d, with_data=True))
        return
    for key, value in dead_letter_json(d, with_data=True).items():
        if key == "partition" and value is None:
            continue
        if key.endswith("_ms"):
            key, value = key[:-3], clock_time(value)
        click.echo(f"{key:>17}: {value}")


@dlq.command("replay")
@click.argument("queue")
@selection_options
@click.option("--dry-run", is_flag=True, help="Only say what would be replayed.")
@click.option("--json", "as_json", is_flag=True, help="Print the ReplayResult as JSON.")
@click.pass_obj
def dlq_replay(obj: dict[str, Any], /, queue: str, dry_run: bool, as_json: bool, **selection: Any) -> None:
    """Return dead letters of QUEUE to the group that dead-lettered each, and
    only to it, with a fresh delivery count. Safe to run twice or to
    interrupt: each dead letter is replayed exactly once."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        total = len(q.dead_letters(**selection))
        with progress(total, "replaying", quiet=as_json) as bar:
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
def dlq_purge(obj: dict[str, Any], /, queue: str, yes: bool, as_json: bool, **selection: Any) -> None:
    """Delete dead letters of QUEUE for good."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        total = len(q.dead_letters(**selection))
        if total and not yes:
            click.confirm(f"delete {total} dead letter(s) of {queue!r} for good?", abort=True, err=True)
        with progress(total, "purging", quiet=as_json) as bar:
            purged = q.purge_dead_letters(**selection, progress=bar.update)
    if as_json:
        emit_json({"purged": purged})
    else:
        click.echo(f"purged {purged} dead letter(s)")
