"""``rqueue worker``: run a handler, named as ``module.path:function``, for
every message of a queue's group."""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

import click

import rqueue
from rqueue.cli.common import connection, require_url
from rqueue.worker import TRANSIENT, BatchHandler, worker_for
from rqueue.worker.loading import load_handler
from rqueue.worker.processes import InProcess


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
    help="Deliveries held at most, running or waiting for a thread [default: 2 x concurrency (x --batch) at "
    "first, more while quick handlers wait for fetches, up to 256].",
)
@click.option(
    "--batch",
    type=click.IntRange(1, 10_000),
    default=None,
    help="Call HANDLER with lists of up to this many deliveries; it returns their outcomes "
    "(rqueue.BatchHandler, docs/worker.md). A function decorated with rqueue.batch_handler is one already.",
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
    "--processes",
    is_flag=True,
    help="Run HANDLER in a child process per handler thread, killed at its time limit (a hard limit; "
    "the handler gets the delivery's data, not the delivery).",
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
    batch: int | None,
    name: str | None,
    heartbeat_timeout: float,
    grace_period: float,
    time_limit: float | None,
    processes: bool,
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
    if batch is not None and processes:
        raise click.UsageError("--batch and --processes do not go together: a child process runs one delivery per call")
    logging.basicConfig(level=log_level, stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    fn: Any = InProcess(handler) if processes else load_handler(handler)
    if processes and isinstance(load_handler(handler), BatchHandler):
        raise click.UsageError(f"{handler} is a batch handler: --processes runs one delivery per call")
    if batch is not None:
        fn = BatchHandler(fn.function if isinstance(fn, BatchHandler) else fn, batch)
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
