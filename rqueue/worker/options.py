"""The checks of a worker's arguments, shared by the threaded worker and
the asyncio one (rqueue.aio.Worker)."""

from __future__ import annotations

from typing import Any

from .. import validate as check
from ..errors import InvalidInput


def check_options(
    handler: Any,
    concurrency: int,
    prefetch: int | None,
    heartbeat_interval: float,
    heartbeat_timeout: float,
    max_run_time: float,
    grace_period: float,
    reconnect_timeout: float,
    time_limit: float | None = None,
) -> None:
    """Raises InvalidInput (naming the argument) for a bad worker argument."""
    if not callable(handler):
        raise InvalidInput(f"handler {handler!r} is not callable")
    check.whole_number("concurrency", concurrency, 1)
    for what, value in (
        ("heartbeat_interval", heartbeat_interval),
        ("heartbeat_timeout", heartbeat_timeout),
        ("max_run_time", max_run_time),
        ("reconnect_timeout", reconnect_timeout),
    ):
        check.positive_seconds(what, value)
    if heartbeat_timeout <= heartbeat_interval:
        raise InvalidInput(
            f"heartbeat_timeout ({heartbeat_timeout}) must be longer than heartbeat_interval ({heartbeat_interval})"
        )
    check.optional_whole_number("prefetch", prefetch, 1)
    check.seconds("grace_period", grace_period)
    if time_limit is not None:
        check.positive_seconds("time_limit", time_limit)
