"""Commands that write to a queue or its settings: publish, create,
configure, purge, pause and resume."""

from __future__ import annotations

import sys
import typing
from collections.abc import Callable, Sequence
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, emit_json, existing, progress, require_url

PUBLISH_BATCH = 500  # messages per publish_many call


def parse_headers(pairs: Sequence[str]) -> dict[str, str]:
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise rqueue.InvalidInput(f"header {pair!r} must be given as key=value")
        out[key] = value
    return out


@click.command()
@click.argument("queue")
@click.argument("message", required=False)
@click.option(
    "--file",
    "-f",
    "path",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help="Publish the whole file as one message.",
)
@click.option("--header", "-H", "headers", multiple=True, metavar="KEY=VALUE", help="A header (repeatable).")
@click.option("--id", "msg_id", default=None, help="De-duplication id (one message only).")
@click.option(
    "--key",
    "routing_key",
    default=None,
    help="A partitioned queue's partition key (same key, same partition); a plain queue's ordering key "
    "(docs/flow-control.md).",
)
@click.option("--delay", type=click.FloatRange(0), default=None, help="Seconds before the message may be delivered.")
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"published": N, "duplicates": N, "first_seq", "last_seq"}.'
)
@click.pass_obj
def publish(
    obj: dict[str, Any],
    queue: str,
    message: str | None,
    path: str | None,
    headers: Sequence[str],
    msg_id: str | None,
    routing_key: str | None,
    delay: float | None,
    as_json: bool,
) -> None:
    """Publish MESSAGE, a file (--file), or one message per line of stdin."""
    require_url(obj["url"])  # before stdin is read
    if message is not None and path is not None:
        raise rqueue.InvalidInput("give MESSAGE or --file, not both")
    hdrs = parse_headers(headers)
    if message is not None:
        payloads = [message.encode()]
    elif path is not None:
        with open(path, "rb") as f:
            payloads = [f.read()]
    else:
        if sys.stdin.isatty():
            click.echo(
                f"reading messages for {queue} from stdin, one per line; end with Ctrl-D (or give MESSAGE or --file)",
                err=True,
            )
        # sys.stdin.buffer: click.get_binary_stream is deprecated (Click 9).
        payloads = [line.rstrip(b"\r\n") for line in sys.stdin.buffer]
    if msg_id is not None and len(payloads) != 1:
        raise rqueue.InvalidInput(f"--id names one message, but {len(payloads)} were given")
    results: list[rqueue.PublishResult] = []
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue)
        with progress(len(payloads), "publishing", quiet=as_json) as bar:
            for start in range(0, len(payloads), PUBLISH_BATCH):
                batch = payloads[start : start + PUBLISH_BATCH]
                ids = [msg_id] if msg_id is not None else None
                if isinstance(q, rqueue.PartitionedQueue):
                    results += q.publish_many(
                        batch, headers=hdrs or None, ids=ids, delay=delay, keys=[routing_key] * len(batch)
                    )
                else:  # a plain queue: the key orders
                    assert isinstance(q, rqueue.Queue)
                    results += q.publish_many(batch, headers=hdrs or None, ids=ids, delay=delay, key=routing_key)
                bar.update(len(batch))
    summary = {
        "published": sum(1 for r in results if not r.duplicate),
        "duplicates": sum(1 for r in results if r.duplicate),
        "first_seq": results[0].seq if results else None,
        "last_seq": results[-1].seq if results else None,
    }
    if as_json:
        emit_json(summary)
    elif not results:
        click.echo(f"no messages: stdin was empty, nothing published to {queue}")
    else:
        click.echo(
            f"published {summary['published']} message(s) to {queue}"
            f" (seq {summary['first_seq']}..{summary['last_seq']}), {summary['duplicates']} duplicate(s)"
        )


@click.command()
@click.argument("queue")
@click.option(
    "--partitions",
    type=int,
    required=True,
    help="Partitions of the queue (fixed once created; each has its own hash slot).",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"queue": NAME, "partitions": N}.')
@click.pass_obj
def create(obj: dict[str, Any], queue: str, partitions: int, as_json: bool) -> None:
    """Create QUEUE as a partitioned queue of N partitions (idempotent for the same N)."""
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue, partitions=partitions)
        count = q.partitions if isinstance(q, rqueue.PartitionedQueue) else 1
    if as_json:
        emit_json({"queue": queue, "partitions": count})
    else:
        click.echo(f"queue {queue}: {count} partition{'s' if count != 1 else ''}")


def _option_type(annotation: Any) -> Any:
    """The click type of a setting, from its annotation in rqueue.Settings:
    a setting added there gets an option that parses its kind of value, and a
    true-or-false one refuses any other word the way click refuses it."""
    kinds = [k for k in typing.get_args(annotation) or (annotation,) if k is not type(None)]
    kind = typing.get_origin(kinds[0]) or kinds[0]
    if kind is bool:
        return click.BOOL
    if kind in (int, float):
        return kind
    return str  # a queue name, a mode word or a comma-separated list


def setting_options(f: Callable[..., Any]) -> Callable[..., Any]:
    """One option per setting of rqueue.Settings."""
    kinds = typing.get_type_hints(rqueue.Settings)
    helps = {
        "dead_letter": "none = no target",
        "alternate": "none = no target",
        "results": "true = workers keep each handler's result (docs/results.md)",
        "wait_in_redis": "true = an idle consumer waits in Redis for the queue's wake-up (docs/settings.md)",
        "events": "lifecycle event kinds to record, comma-separated (completed,failed,timeout,...), all or none",
        "rate_limit": "at most this many deliveries per rate period per group (0 = no limit)",
        "key_concurrency": "deliveries of one ordering key unsettled at once per group (docs/flow-control.md)",
        "key_rate_limit": "at most this many deliveries of one ordering key per key rate period (0 = no limit)",
        "key_rate_period": "seconds of the per-key rate window",
    }
    for name in reversed(sorted(rqueue.settings.SETTING_NAMES)):
        f = click.option(
            f"--{name.replace('_', '-')}",
            name,
            type=_option_type(kinds[name]),
            default=None,
            help=helps.get(name),
        )(f)
    return f


@click.command()
@click.argument("pattern")
@setting_options
@click.option("--unset", "unset_names", multiple=True, metavar="SETTING", help="Remove a setting from the pattern.")
@click.option("--json", "as_json", is_flag=True, help='Print {"pattern": P, "set": {setting: value}, "unset": [...]}.')
@click.pass_obj
def configure(obj: dict[str, Any], /, pattern: str, unset_names: Sequence[str], as_json: bool, **values: Any) -> None:
    """Store settings for every queue matching PATTERN (* = one word, # = any)."""
    given = {k: (None if v == "none" else v) for k, v in values.items() if v is not None}
    if "events" in given:
        kinds = given["events"]
        given["events"] = [] if kinds is None else kinds if kinds == "all" else [k for k in kinds.split(",") if k]
    unset = [n.replace("-", "_") for n in unset_names]
    for name in unset:
        if name not in rqueue.settings.SETTING_NAMES:
            raise rqueue.InvalidInput(
                f"--unset {name}: no such setting; settings are {', '.join(sorted(rqueue.settings.SETTING_NAMES))}"
            )
    if not given and not unset:
        raise rqueue.InvalidInput("give at least one setting (e.g. --ack-wait 5) or --unset NAME")
    with connection(obj["url"], obj["prefix"]) as client:
        if given:
            # Checked (and stored) before anything is unset: a bad value changes nothing.
            client.configure(pattern, **given)
        if unset:
            client.settings.unset(pattern, *unset)
    if as_json:
        emit_json({"pattern": pattern, "set": given, "unset": unset})
        return
    parts = [f"set {', '.join(f'{k}={v}' for k, v in given.items())}"] if given else []
    parts += [f"unset {', '.join(unset)}"] if unset else []
    click.echo(f"configured {pattern}: {'; '.join(parts)}")


@click.command()
@click.argument("queue")
@click.option("--group", "-g", default=None, help="Purge only this group's backlog.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@click.option("--json", "as_json", is_flag=True, help='Print {"purged": {group: N}}.')
@click.pass_obj
def purge(obj: dict[str, Any], queue: str, group: str | None, yes: bool, as_json: bool) -> None:
    """Settle every message of QUEUE that is not in flight, as purged.

    For every group (or --group); in-flight deliveries stay with their
    consumers. A queue without groups loses its stored messages.
    """
    with connection(obj["url"], obj["prefix"]) as client:
        q = existing(client, queue)
        s = q.stats()
        backlog = sum(g.pending - g.in_flight for g in s.groups if group in (None, g.name)) if s.groups else s.depth
        if backlog and not yes:
            click.confirm(f"purge about {backlog} message(s) of {queue!r}?", abort=True, err=True)
        with progress(max(backlog, 1), "purging", quiet=as_json) as bar:
            purged = q.purge(group, progress=bar.update)
    if as_json:
        emit_json({"purged": purged})
    else:
        click.echo("purged " + ", ".join(f"{n} ({g or 'no group'})" for g, n in purged.items()))


@click.command()
@click.argument("queue")
@click.option("--group", "-g", default=None, help="Pause this group only: its fetches hand out nothing.")
@click.option(
    "--mode",
    type=click.Choice(["refuse", "hold"]),
    default="hold",
    show_default=True,
    help="Without --group, what publishes to the paused queue do: refused (QueuePaused) or stored and held.",
)
@click.option("--json", "as_json", is_flag=True, help='Print {"queue", "group", "paused": true, "changed"}.')
@click.pass_obj
def pause(obj: dict[str, Any], queue: str, group: str | None, mode: str, as_json: bool) -> None:
    """Pause QUEUE's publishes (--mode), or one group's deliveries (--group).

    A paused group keeps acks, nacks and heartbeats working; leases that run
    out while it is paused are offered again after `rqueue resume`.
    """
    with connection(obj["url"], obj["prefix"]) as client:
        changed = group_named(lambda: existing(client, queue).pause(group, mode))
    report_pause(queue, group, True, changed, mode, as_json)


@click.command()
@click.argument("queue")
@click.option("--group", "-g", default=None, help="Resume this group (else the queue).")
@click.option("--json", "as_json", is_flag=True, help='Print {"queue", "group", "paused": false, "changed"}.')
@click.pass_obj
def resume(obj: dict[str, Any], queue: str, group: str | None, as_json: bool) -> None:
    """End the pause of QUEUE (or of one --group) and wake its consumers."""
    with connection(obj["url"], obj["prefix"]) as client:
        changed = group_named(lambda: existing(client, queue).resume(group))
    report_pause(queue, group, False, changed, "", as_json)


def group_named(change: Callable[[], bool]) -> bool:
    """``change()`` of a pause; a group that does not exist (NotMember, as
    the script says it) is bad input, as for `rqueue group reset`."""
    try:
        return change()
    except rqueue.NotMember as exc:
        raise rqueue.InvalidInput(str(exc)) from None


def report_pause(queue: str, group: str | None, paused: bool, changed: bool, mode: str, as_json: bool) -> None:
    if as_json:
        emit_json({"queue": queue, "group": group, "paused": paused, "mode": mode or None, "changed": changed})
        return
    what = f"group {group!r} of queue {queue!r}" if group is not None else f"queue {queue!r}"
    state = ("paused" + (f" ({mode})" if group is None else "")) if paused else "running"
    click.echo(f"{what} {'is now' if changed else 'was already'} {state}")
