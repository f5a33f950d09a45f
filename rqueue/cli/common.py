"""What every command shares: the connection, exit codes, tables, JSON and
progress output, and how a failure is printed."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from typing import Any

import click

import rqueue
from rqueue.embedded import EmbeddedServer, find_binary
from rqueue.protocols import AnyQueue

EXIT_ERROR = 1  # the server, the network or a failed check
EXIT_BAD_INPUT = 2  # the user's input is wrong (click uses 2 for usage errors too)
EXIT_NOT_FOUND = 3  # the named queue does not exist


class QueueNotFound(rqueue.RQueueError):
    """The command names a queue that was never written to."""


# Commands whose work makes sense on a server thrown away at exit; every
# other command writes or reads data the user keeps, so it needs a URL.
EMBEDDED_COMMANDS = ("demo", "bench")


class MissingURL(rqueue.InvalidInput):
    """The command needs a Redis URL and none was given."""

    def __init__(self) -> None:
        super().__init__(
            "this command needs a Redis URL: give --url redis://HOST:PORT/0 or set RQUEUE_URL (only "
            + " and ".join(f"`rqueue {c}`" for c in EMBEDDED_COMMANDS)
            + " start a private server of their own)"
        )


def require_url(url: str | None) -> str:
    """``url``, or MissingURL (exit code 2) when there is none."""
    if not url:
        raise MissingURL()
    return url


@contextmanager
def connection(url: str | None, prefix: str, *, embedded: bool = False) -> Iterator[rqueue.Client]:
    """A client for ``url``. With no URL: with ``embedded``, for a private
    embedded server that lives as long as the block; else MissingURL."""
    if url or not embedded:
        with rqueue.connect(require_url(url), prefix=prefix, allow_eviction=_allow_eviction()) as client:
            yield client
        return
    with EmbeddedServer(binary=find_binary(prefer="valkey")) as server:
        click.echo(f"no --url given: using a private server at {server.url} (discarded at exit)", err=True)
        with rqueue.connect(server.url, prefix=prefix) as client:
            yield client


def _allow_eviction() -> bool:
    """Whether the command line said --allow-eviction (or RQUEUE_ALLOW_EVICTION)."""
    ctx = click.get_current_context(silent=True)
    obj = ctx.find_root().obj if ctx is not None else None
    return bool(isinstance(obj, dict) and obj.get("allow_eviction"))


def existing(client: rqueue.Client, name: str) -> AnyQueue:
    """The queue ``name``; QueueNotFound (exit code 3) if it was never used."""
    q = client.queue(name)
    if name not in client.queues():
        raise QueueNotFound(f"queue {name!r} does not exist under prefix {client.prefix!r} (see `rqueue queues`)")
    return q


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Rows as aligned text columns: numbers to the right, text to the left."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    numeric = [all(isinstance(row[i], (int, float)) for row in rows) and bool(rows) for i in range(len(headers))]
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    out = []
    for line in cells:
        # A row longer than the headers loses its extra cells.
        parts = [c.rjust(w) if num else c.ljust(w) for c, w, num in zip(line, widths, numeric, strict=False)]
        out.append("  ".join(parts).rstrip())
    return "\n".join(out)


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False))


class _NoBar:
    """What ``progress`` hands out when no bar is shown: takes the updates."""

    def update(self, n: int) -> None:
        pass


def progress(length: int, label: str, *, quiet: bool = False) -> Any:
    """A progress bar on stderr, so that stdout holds only the result; shown
    only on a terminal and never with ``quiet`` (--json), so that scripts
    and logs get the result alone."""
    if quiet or not sys.stderr.isatty():
        return nullcontext(_NoBar())
    return click.progressbar(length=length, label=label, file=sys.stderr)


class LabelledBars:
    """A progress bar on stderr per label, for work reported as (label,
    done, total): the doctor's checks, the migration's levels. Shown as
    ``progress`` shows its bar (on a terminal, never with ``quiet``), and
    only for work longer than ``min_total``."""

    def __init__(self, *, quiet: bool = False, min_total: int = 0) -> None:
        self.shown = not quiet and sys.stderr.isatty()
        self.min_total = min_total
        self.bars: dict[str, tuple[Any, int]] = {}

    def __call__(self, label: str, done: int, total: int) -> None:
        if not self.shown or total <= self.min_total:
            return
        if label not in self.bars:
            bar = click.progressbar(length=total, label=label, file=sys.stderr)
            bar.__enter__()
            self.bars[label] = (bar, 0)
        bar, shown = self.bars[label]
        bar.update(done - shown)
        self.bars[label] = (bar, done)
        if done >= total:
            bar.__exit__(None, None, None)

    def close(self) -> None:
        for bar, _ in self.bars.values():
            bar.render_finish()


def clock_time(ms: int | None) -> str:
    """Server milliseconds since the epoch as a local date and time for
    people; "-" for None."""
    if ms is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ms / 1000)) + f".{ms % 1000:03d}"


def fail(ctx: click.Context, message: str, code: int) -> None:
    click.echo(f"error: {message}", err=True)
    ctx.exit(code)
