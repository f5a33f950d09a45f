"""``rqueue schedules``: list, add, pause, resume and remove recurring
schedules; ``rqueue scheduler``: run a scheduler alone (docs/schedules.md)."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import click

import rqueue
from rqueue.cli.admin import parse_headers
from rqueue.cli.common import connection, emit_json, table
from rqueue.schedules import Missed, ScheduleInfo
from rqueue.worker.scheduler import Scheduler


def when(ms: int | None) -> str | None:
    """A time in ms since the epoch as UTC text, to the second."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).strftime("%Y-%m-%d %H:%M:%S")


def schedule_json(s: ScheduleInfo) -> dict[str, Any]:
    out = s.as_dict()
    out["next_tick"] = when(s.next_tick_ms)
    out["last_tick"] = when(s.last_tick_ms)
    return out


def timing_text(s: ScheduleInfo) -> str:
    if s.every is not None:
        return f"every {s.every:g}s"
    return f"{s.cron} {s.timezone}"


def show(info: ScheduleInfo, as_json: bool, what: str) -> None:
    if as_json:
        emit_json({"schedule": schedule_json(info)})
    else:
        nxt = when(info.next_tick_ms) or "none while paused"
        click.echo(f"schedule {info.name} {what}: {timing_text(info)} -> {info.queue}, next tick (UTC) {nxt}")


@click.group()
def schedules() -> None:
    """List, add, pause, resume and remove recurring schedules."""


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True, help='Print {"schedules": [...]} (fields of ScheduleInfo).')
@click.pass_obj
def schedules_list(obj: dict[str, Any], as_json: bool) -> None:
    """Every schedule, with its last and next tick (UTC) and whether it is paused."""
    with connection(obj["url"], obj["prefix"]) as client:
        found = client.schedules()
    if as_json:
        emit_json({"schedules": [schedule_json(s) for s in found]})
    elif not found:
        click.echo("(no schedules)")
    else:
        click.echo(
            table(
                ["name", "queue", "timing", "missed", "paused", "last tick (UTC)", "next tick (UTC)", "fired"],
                [
                    [s.name, s.queue, timing_text(s), s.missed, "yes" if s.paused else "no"]
                    + [when(s.last_tick_ms), when(s.next_tick_ms), s.fired]
                    for s in found
                ],
            )
        )


@schedules.command("add")
@click.argument("name")
@click.option("--queue", "-q", "queue_name", required=True, help="Queue to publish to.")
@click.option("--every", type=float, default=None, help="Seconds between ticks (at multiples since the epoch).")
@click.option("--cron", default=None, help="Five-field cron expression, or an alias such as @daily.")
@click.option("--timezone", default=None, help="IANA time zone of --cron [default: UTC].")
@click.option("--payload", default="", help="The message's payload (text).")
@click.option(
    "--payload-file",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Use the whole file as the payload.",
)
@click.option("--header", "-H", "headers", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option(
    "--missed",
    type=click.Choice([m.value for m in Missed]),
    default=Missed.ONCE.value,
    show_default=True,
    help="Ticks missed while no scheduler ran: one message, every tick, or none.",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"schedule": {...}}.')
@click.pass_obj
def schedules_add(
    obj: dict[str, Any],
    name: str,
    queue_name: str,
    every: float | None,
    cron: str | None,
    timezone: str | None,
    payload: str,
    payload_file: str | None,
    headers: Sequence[str],
    missed: str,
    as_json: bool,
) -> None:
    """Add schedule NAME, or change it (the same timing goes on where it was)."""
    if payload and payload_file is not None:
        raise rqueue.InvalidInput("give --payload or --payload-file, not both")
    data = payload.encode()
    if payload_file is not None:
        with open(payload_file, "rb") as f:
            data = f.read()
    with connection(obj["url"], obj["prefix"]) as client:
        info = client.schedule(
            name,
            queue_name,
            every=every,
            cron=cron,
            payload=data,
            headers=parse_headers(headers) or None,
            timezone=timezone,
            missed=missed,
        )
    show(info, as_json, "saved")


@schedules.command("pause")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='Print {"schedule": {...}}.')
@click.pass_obj
def schedules_pause(obj: dict[str, Any], name: str, as_json: bool) -> None:
    """Stop publishing schedule NAME until it is resumed."""
    with connection(obj["url"], obj["prefix"]) as client:
        info = client.pause_schedule(name)
    show(info, as_json, "paused")


@schedules.command("resume")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='Print {"schedule": {...}}.')
@click.pass_obj
def schedules_resume(obj: dict[str, Any], name: str, as_json: bool) -> None:
    """Publish schedule NAME again, from its next tick (the pause's ticks are not published)."""
    with connection(obj["url"], obj["prefix"]) as client:
        info = client.resume_schedule(name)
    show(info, as_json, "resumed")


@schedules.command("remove")
@click.argument("name")
@click.option("--json", "as_json", is_flag=True, help='Print {"name": NAME, "removed": true|false}.')
@click.pass_obj
def schedules_remove(obj: dict[str, Any], name: str, as_json: bool) -> None:
    """Delete schedule NAME (nothing to do when there is none)."""
    with connection(obj["url"], obj["prefix"]) as client:
        removed = client.remove_schedule(name)
    if as_json:
        emit_json({"name": name, "removed": removed})
    else:
        click.echo(f"schedule {name} removed" if removed else f"(no schedule {name})")


@click.command()
@click.option(
    "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO", show_default=True
)
@click.pass_obj
def scheduler(obj: dict[str, Any], log_level: str) -> None:
    """Run a scheduler: publish every due tick of the prefix's schedules until SIGTERM or SIGINT.

    Any number may run (workers run one too): each tick is published once.
    """
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    with connection(obj["url"], obj["prefix"]) as client:
        runner = Scheduler(client)

        def stop(_signum: int, _frame: Any) -> None:
            runner.stop()

        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                signal.signal(sig, stop)
        logging.getLogger("rqueue.scheduler").info("scheduler running under prefix %r", client.prefix)
        runner.run()
    click.echo(f'{{"published": {runner.published}}}', err=True)
