"""``rqueue worker``: run a handler, named as ``module.path:function``, for
every message of a queue's group."""

from __future__ import annotations

import importlib
import json
import logging
import sys
from collections.abc import Callable
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, require_url
from rqueue.worker import TRANSIENT, worker_for


def one_line(exc: BaseException) -> str:
    """An exception's text on one line (a SyntaxError's names its file and line)."""
    return " ".join(str(exc).split()) or type(exc).__name__


def load_handler(spec: str) -> Callable[..., Any]:
    """The function named by ``module.path:function`` (the current directory
    is importable, as for ``python -m``)."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise rqueue.InvalidInput(f"handler {spec!r} must be given as module.path:function")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise rqueue.InvalidInput(f"handler {spec!r}: cannot import {module_name!r}: {exc}") from None
    except Exception as exc:
        # The module's own code failed (a SyntaxError, a NameError, a missing
        # setting...): one line naming it, as for a module not found.
        raise rqueue.InvalidInput(
            f"handler {spec!r}: importing {module_name!r} raised {type(exc).__name__}: {one_line(exc)}"
        ) from None
    handler = getattr(module, attr, None)
    if not callable(handler):
        raise rqueue.InvalidInput(f"handler {spec!r}: {module_name!r} has no callable {attr!r}")
    return handler


@click.command()
@click.argument("handler")
@click.option("--queue", "-q", "queue_name", required=True, help="Queue to consume.")
@click.option("--group", "-g", required=True, help="Group to join (created on first use).")
@click.option(
    "--concurrency",
    "-c",
    type=click.IntRange(1, 10_000),
    default=rqueue.constants.DEFAULT_CONCURRENCY,
    show_default=True,
    help="Handler threads.",
)
@click.option(
    "--prefetch",
    type=click.IntRange(1),
    default=None,
    help="Deliveries held at most, running or waiting for a thread [default: 2 x concurrency].",
)
@click.option("--name", default=None, help="Consumer name [default: host-pid-random].")
@click.option(
    "--heartbeat-timeout",
    type=click.FloatRange(0.01),
    default=rqueue.constants.DEFAULT_HEARTBEAT_TIMEOUT,
    show_default=True,
    help="Seconds of silence before a member is removed.",
)
@click.option(
    "--grace-period",
    type=click.FloatRange(0),
    default=rqueue.constants.DEFAULT_GRACE_PERIOD,
    show_default=True,
    help="Seconds running handlers get to finish on SIGTERM/SIGINT.",
)
@click.option(
    "--time-limit",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Seconds each run of the handler may take; past it the message is nacked (reason timeout) "
    "and the handler's rqueue.cancellation() is set. A message's x-rq-time-limit header overrides it.",
)
@click.option(
    "--interrupt/--no-interrupt",
    default=False,
    show_default=True,
    help="Also raise rqueue.TimeLimitExceeded inside a handler past its time limit (docs/worker.md).",
)
@click.option(
    "--log-level", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"]), default="INFO", show_default=True
)
@click.option(
    "--metrics-port",
    type=click.IntRange(1, 65535),
    default=None,
    help="Serve Prometheus metrics on 127.0.0.1:PORT/metrics (needs rqueue[metrics]).",
)
@click.option(
    "--scheduler/--no-scheduler",
    default=True,
    show_default=True,
    help="Also publish the due ticks of the prefix's recurring schedules (docs/schedules.md).",
)
@click.pass_obj
def worker(
    obj: dict[str, Any],
    handler: str,
    queue_name: str,
    group: str,
    concurrency: int,
    prefetch: int | None,
    name: str | None,
    heartbeat_timeout: float,
    grace_period: float,
    time_limit: float | None,
    interrupt: bool,
    log_level: str,
    metrics_port: int | None,
    scheduler: bool,
) -> None:
    """Run HANDLER (module.path:function) for every message of QUEUE/GROUP.

    A normal return acks, an exception nacks under the redelivery policy,
    rqueue.Reject dead-letters at once. SIGTERM or SIGINT finishes running
    handlers (within --grace-period), returns the rest and leaves the group;
    a second signal stops at once. Exit code 0 after a clean stop, 1 when
    Redis stayed unreachable, 2 for bad arguments.
    """
    require_url(obj["url"])
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fn = load_handler(handler)
    with connection(obj["url"], obj["prefix"]) as client:
        q = client.queue(queue_name)
        metrics = None
        if metrics_port is not None:
            # Here, so that prometheus-client loads only when metrics are asked for.
            from rqueue.worker.metrics import WorkerMetrics

            metrics = WorkerMetrics(q, group)
            metrics.serve(metrics_port)
        w = worker_for(
            q,
            group,
            fn,
            concurrency=concurrency,
            prefetch=prefetch,
            name=name,
            metrics=metrics,
            heartbeat_interval=min(rqueue.constants.DEFAULT_HEARTBEAT_INTERVAL, heartbeat_timeout / 3),
            heartbeat_timeout=heartbeat_timeout,
            grace_period=grace_period,
            scheduler=scheduler,
            time_limit=time_limit,
            interrupt=interrupt,
        )
        try:
            final = w.run()
        except TRANSIENT as exc:
            raise rqueue.ConnectionFailed(client.url, f"Redis stayed unreachable: {exc}") from None
    click.echo(json.dumps(final.as_dict()), err=True)
