"""``rqueue bench``: what rqueue costs on the Redis server it is given,
next to the same work done with raw redis-py Streams on the same server in
the same run. docs/bench.md describes every figure and the JSON report."""

from __future__ import annotations

import json
import os
import platform
import time
import uuid

import click

import rqueue
from rqueue.cli.bench.base import Progress
from rqueue.cli.bench.report import cpu_jiffies, figures, render_text, versions
from rqueue.cli.bench.runner import Bench
from rqueue.cli.bench.spec import GROUPS, SCHEMA, Config
from rqueue.cli.common import connection


def _parse_only(ctx: click.Context, param: click.Parameter, value: str | None) -> tuple[str, ...]:
    if not value:
        return ()
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in GROUPS]
    if bad or not names:
        raise click.BadParameter(f"unknown figure {', '.join(bad) or repr(value)}; choose from {', '.join(GROUPS)}")
    return names


@click.command("bench")
@click.option(
    "--messages",
    "-n",
    type=click.IntRange(100, 10_000_000),
    default=None,
    help="Messages per throughput figure [default: 20000; --quick: 1000]; one-per-call figures use a quarter.",
)
@click.option(
    "--runs",
    "-r",
    type=click.IntRange(1, 100),
    default=None,
    help="Runs per figure; the median and min-max are reported [default: 3; --quick: 1].",
)
@click.option("--quick", is_flag=True, help="Small sizes and one run (for tests and a first look).")
@click.option("--full", is_flag=True, help="The issue's sweep sizes: 10^6 queued, 10^5 delayed, 10^5 in flight.")
@click.option(
    "--only",
    callback=_parse_only,
    default=None,
    metavar="NAME[,NAME]",
    help=f"Only these figures: {', '.join(GROUPS)}.",
)
@click.option(
    "--latency-rate",
    type=click.IntRange(1, 100_000),
    default=1000,
    show_default=True,
    help="Messages per second of the first latency figure (the second runs at half the end-to-end rate).",
)
@click.option(
    "--latency-secs",
    type=click.FloatRange(0.1, 600),
    default=None,
    help="Seconds of each latency figure [default: 3; --quick: 0.5, and half that at half the max rate].",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (keys in docs/bench.md).")
@click.pass_context
def bench_command(
    ctx: click.Context,
    messages: int | None,
    runs: int | None,
    quick: bool,
    full: bool,
    only: tuple[str, ...],
    latency_rate: int,
    latency_secs: float | None,
    as_json: bool,
) -> None:
    """Measure rqueue against this server: publish, consume, end to end,
    Worker, latency (at a fixed rate and at half the end-to-end rate), the
    size sweep, memory and Redis CPU per message, each next to raw redis-py
    Streams on the same server.

    Uses a key prefix of its own (<prefix>-bench-<random>) and deletes its
    keys afterwards. Progress goes to stderr, the table (or --json) to stdout.
    Benchmark on a server of its own: other traffic skews every figure, and
    the CPU figures run CONFIG RESETSTAT.
    """
    if quick and full:
        raise click.UsageError("--quick and --full do not go together")
    obj = ctx.obj or {}
    url = obj.get("url")
    if url and url.split("://", 1)[0] == "memory":
        raise rqueue.InvalidInput("rqueue bench needs a Redis server: memory:// runs inside this process")
    config = Config.make(messages, runs, quick, full, only, latency_rate, latency_secs)
    bench_prefix = f"{obj.get('prefix') or 'rq'}-bench-{uuid.uuid4().hex[:8]}"
    progress = Progress()
    started = time.time()
    jiffies0 = cpu_jiffies()
    loadavg = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    with connection(url, bench_prefix, embedded=True) as client:
        raw_url = url or client.url
        b = Bench(client, raw_url, config, progress)
        try:
            info = b.r.info("server")
            name = "valkey" if info.get("valkey_version") or info.get("server_name") == "valkey" else "redis"
            version = str(info.get("valkey_version") or info.get("redis_version") or "?")
            b.run()
        finally:
            try:
                b.cleanup()
            finally:
                b.r.close()
    jiffies1 = cpu_jiffies()
    steal = None
    if jiffies0 and jiffies1 and jiffies1[0] > jiffies0[0]:
        steal = (jiffies1[1] - jiffies0[1]) / (jiffies1[0] - jiffies0[0]) * 100
    report = {
        "schema": SCHEMA,
        "server": {"url": client.url, "name": name, "version": version},
        "config": config.as_dict(),
        "environment": {
            "python": platform.python_version(),
            "redis_py": versions()["redis"],
            "hiredis": versions()["hiredis"],
            "nproc": os.cpu_count(),
            "loadavg": round(loadavg, 2) if loadavg is not None else None,
            "cpu_steal_pct": steal,
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%S%z", time.localtime(started)),
        },
        "figures": figures(b.series, config.groups),
        "notes": b.notes,
        "errors": b.errors,
        "elapsed_s": time.time() - started,
    }
    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        click.echo(render_text(report))
    if b.errors:
        click.echo(f"error: {len(b.errors)} figure group(s) failed: " + "; ".join(b.errors), err=True)
        ctx.exit(1)
