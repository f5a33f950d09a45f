"""`rqueue migrate`: moves every queue of the prefix from the hash layout to
the stream layout (rqueue/migration.py, docs/upgrading.md)."""

from __future__ import annotations

import sys
from typing import Any

import click

from rqueue.cli.common import EXIT_ERROR, LabelledBars, connection, emit_json
from rqueue.engine.keys import LogLayout
from rqueue.migration import migrate_prefix


@click.command()
@click.option(
    "--to",
    "target",
    type=click.Choice([LogLayout.STREAM.value]),
    required=True,
    help="The layout to move to: stream, whose log is a Redis stream.",
)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"prefix", "layout", "moved", "levels", "left", "marked"}.'
)
@click.pass_obj
def migrate(obj: dict[str, Any], target: str, yes: bool, as_json: bool) -> None:
    """Move every queue of the prefix to the stream layout.

    Stop the prefix's workers and producers first: a queue refuses their
    calls while it moves, and a client that started before the move is
    refused by the queues moved (LayoutMismatch) until it is restarted.
    Messages in flight stay in flight. The prefix is marked last, once every
    queue moved. Safe to run again: a run cut off is finished by the next.
    """
    prefix = obj["prefix"]
    if not yes:
        click.confirm(
            f"move every queue of prefix {prefix!r} to the {target} layout? Its workers and producers must be stopped",
            abort=True,
            err=True,
        )
    bars = LabelledBars(quiet=as_json)
    with connection(obj["url"], prefix) as client:
        try:
            report = migrate_prefix(client, bars)
        finally:
            bars.close()
    if as_json:
        emit_json(report.as_json())
        if not report.marked:
            sys.exit(EXIT_ERROR)
        return
    for level in report.levels:
        if level.before == "stream":
            click.echo(f"{level.base}: in the stream layout already")
        else:
            resumed = " (a migration cut off, finished)" if level.before == "migrating" else ""
            click.echo(
                f"{level.base}: {level.logged} record(s) to the stream, {level.pinned} kept for replays, "
                f"{level.dropped} settled by every group dropped{resumed}"
            )
    for base in report.left:
        click.echo(f"{base}: still in the hash layout, made while this ran", err=True)
    if not report.marked:
        click.echo(
            f"prefix {prefix!r}: {report.moved} level(s) moved; a client kept making queues in the hash layout, so "
            "the prefix is not marked: stop it and run this again",
            err=True,
        )
        sys.exit(EXIT_ERROR)
    click.echo(f"prefix {prefix!r}: {report.moved} level(s) moved; its clients use the stream layout")
