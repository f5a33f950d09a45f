"""`rqueue doctor QUEUE`: checks that a queue's keys agree with each other,
and with --repair repairs what is safe (rqueue/doctor.py, docs/doctor.md)."""

from __future__ import annotations

from typing import Any

import click

from rqueue import doctor as checks
from rqueue.cli.common import EXIT_ERROR, LabelledBars, connection, emit_json, existing
from rqueue.engine.doctor_reads import SCAN_STEP


def finding_text(f: checks.Finding) -> str:
    where = f.queue if f.group is None else f"{f.queue} group {f.group}"
    line = f"{f.kind}  {where}  {f.key}: {f.detail}"
    if f.repair:
        line += f"\n    --repair: {f.repair}"
    return line


@click.command()
@click.argument("queue")
@click.option("--repair", "do_repair", is_flag=True, help="Repair what is safe, one atomic step each, and check again.")
@click.option("--json", "as_json", is_flag=True, help="Print the findings (and repairs) as JSON.")
@click.pass_context
def doctor(ctx: click.Context, queue: str, do_repair: bool, as_json: bool) -> None:
    """Check QUEUE's invariants in Redis: exit code 0 when clean, 1 with findings.

    Floor <= cursor <= last seq per group, every lease has a delivery state
    and the reverse, the counts add up, every unsettled message has its
    record. --repair fixes what is safe and says what it did; it never
    deletes a message (a lost state sends its message to the dead-letter
    queue).
    """
    obj = ctx.obj
    bars = LabelledBars(quiet=as_json, min_total=SCAN_STEP)
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        found = checks.examine(q, bars)
        repairs: list[checks.Repair] = []
        remaining = found
        if do_repair and any(f.fix for f in found):
            repairs = checks.repair(q, found)
            remaining = checks.examine(q, bars)
    bars.close()
    if as_json:
        report: dict[str, Any] = {"queue": queue, "clean": not remaining, "findings": [f.as_json() for f in found]}
        if do_repair:
            report["repairs"] = [r.as_json() for r in repairs]
            report["remaining"] = [f.as_json() for f in remaining]
        emit_json(report)
    else:
        for f in found:
            click.echo(finding_text(f))
        for r in repairs:
            click.echo(f"{r.outcome}  {r.finding.kind}  {r.finding.key}: {r.detail or 'no longer so; nothing changed'}")
        if not found:
            click.echo(f"queue {queue}: clean")
        elif do_repair:
            click.echo(f"queue {queue}: {len(repairs)} repairs; {len(remaining)} findings remain")
            for f in remaining:
                click.echo(finding_text(f))
        else:
            fixable = sum(1 for f in found if f.fix)
            click.echo(f"queue {queue}: {len(found)} findings, {fixable} repairable with --repair")
    if remaining:
        ctx.exit(EXIT_ERROR)
