"""The options of the ``rqueue`` data source, checked once on the driver
and turned into plans: plain values that Spark sends to the executors.

Spark hands a data source its options as strings (``.option("dedup_window",
86400)`` arrives as ``"86400"``); every check names the option and the
value it refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from ..constants import DEFAULT_PREFIX, MAX_BATCH
from ..errors import InvalidInput, InvalidURL
from ..names import check_name

RESERVED_HEADER_PREFIX = "x-rq-"  # headers rqueue writes itself (dead letters)
ROW_IDS = ("content", "position")
DEFAULT_BATCH = 1000  # messages per script call of a writing task
DEFAULT_SPLIT = 20_000  # seqs one reading task reads at most


@dataclass(frozen=True)
class WritePlan:
    """What a writing task needs (sent to the executors)."""

    url: str
    queue: str
    prefix: str
    mode: str  # "id" (id column: a key per message), "content" or "position" (a tracker per task)
    value_col: str
    id_col: str | None
    headers: tuple[str, ...]
    label_col: str | None  # a column naming a bad row in errors (the input's own id or offset)
    batch_size: int
    job: str | None  # the namespace of the trackers; None: the streaming query's id
    batch: str | None  # the batch of the trackers; None: the micro-batch's id ("-" for a batch write)
    partitions: int | None  # the queue's partitions, when it is to be (or is) partitioned


@dataclass(frozen=True)
class ReadPlan:
    """What a reading task and the driver's source need."""

    url: str
    queue: str
    prefix: str
    group: str | None
    split: int  # seqs per reading task
    max_rows: int | None  # seqs per micro-batch and partition of the queue (None: all there are)
    partitions: int | None  # the queue's partitions, when it is partitioned


def check_url(url: object) -> str:
    if not isinstance(url, str) or not url:
        raise InvalidURL(f"<{type(url).__name__}>", "the url option is required (a redis://, rediss:// or unix:// URL)")
    if url.startswith("memory://"):
        raise InvalidURL(
            url,
            "memory:// lives inside one process; Spark executors run in other processes "
            "(use a redis://, rediss:// or unix:// URL)",
        )
    return url


def check_job(job: object, what: str = "job_id") -> str:
    check_name(what, job)
    assert isinstance(job, str)
    if ":" in job:
        raise InvalidInput(f"{what} {job!r} must not contain ':' (it separates the parts of tracker names)")
    return job


def _number(
    options: Mapping[str, str], name: str, default: int | None, low: int, high: int | None = None
) -> int | None:
    raw = options.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(str(raw))
    except ValueError:
        raise InvalidInput(f"option {name} must be a whole number, not {raw!r}") from None
    if value < low or (high is not None and value > high):
        bounds = f"from {low} to {high}" if high is not None else f">= {low}"
        raise InvalidInput(f"option {name} must be a whole number {bounds}, not {raw!r}")
    return value


def window_option(options: Mapping[str, str]) -> float | None:
    """The dedup_window option (seconds), or None when not given."""
    raw = options.get("dedup_window")
    if raw is None or raw == "":
        return None
    try:
        value = float(str(raw))
    except ValueError:
        raise InvalidInput(f"option dedup_window must be a number of seconds, not {raw!r}") from None
    if not value > 0:
        raise InvalidInput(f"option dedup_window must be more than 0 seconds, not {raw!r}")
    return value


def header_list(raw: object) -> tuple[str, ...]:
    """header_cols: a comma-separated string (an option) or a list of names."""
    if raw is None or raw == "":
        return ()
    if isinstance(raw, str):
        names = [n.strip() for n in raw.split(",")]
    elif isinstance(raw, (list, tuple)):
        names = list(raw)
    else:
        raise InvalidInput(f"header_cols must be a list of column names, not {raw!r}")
    for n in names:
        if not isinstance(n, str) or not n:
            raise InvalidInput(f"header_cols holds {n!r}: each entry must be a column name")
        if n.lower().startswith(RESERVED_HEADER_PREFIX):
            raise InvalidInput(
                f"header column {n!r} starts with {RESERVED_HEADER_PREFIX!r}, which rqueue reserves for its own "
                "headers (dead letters); rename the column"
            )
    if len(set(names)) != len(names):
        raise InvalidInput(f"header_cols {names!r} names a column twice")
    return tuple(names)


def write_plan(options: Mapping[str, str]) -> WritePlan:
    """The plan of a write from the data source's options."""
    url = check_url(options.get("url"))
    queue = check_name("queue", options.get("queue"))
    prefix = check_name("key prefix", options.get("prefix") or DEFAULT_PREFIX)
    value_col = options.get("value_col") or "value"
    id_col = options.get("id_col") or None
    label_col = options.get("label_col") or id_col
    headers = header_list(options.get("header_cols"))
    row_ids = options.get("row_ids") or "content"
    if row_ids not in ROW_IDS:
        raise InvalidInput(f"option row_ids must be one of {', '.join(map(repr, ROW_IDS))}, not {row_ids!r}")
    batch_size = _number(options, "batch_size", DEFAULT_BATCH, 1, MAX_BATCH)
    assert batch_size is not None
    window_option(options)
    job = options.get("job_id") or None
    if job is not None:
        check_job(job)
    batch = options.get("batch_id") or None
    if batch is not None:
        _number(options, "batch_id", None, 0)
    return WritePlan(
        url,
        queue,
        prefix,
        "id" if id_col is not None else row_ids,
        value_col,
        id_col,
        headers,
        label_col,
        batch_size,
        job,
        batch,
        _number(options, "partitions", None, 1),
    )


def read_plan(options: Mapping[str, str], streaming: bool) -> ReadPlan:
    """The plan of a read from the data source's options."""
    url = check_url(options.get("url"))
    queue = check_name("queue", options.get("queue"))
    prefix = check_name("key prefix", options.get("prefix") or DEFAULT_PREFIX)
    group = options.get("group") or None
    if group is not None:
        check_name("group", group)
    elif streaming:
        raise InvalidInput(
            "a stream of an rqueue queue needs the group option: the group whose ack floor is the stream's "
            "progress (messages stay stored until the query commits them for it)"
        )
    split = _number(options, "rows_per_task", DEFAULT_SPLIT, 1)
    assert split is not None
    return ReadPlan(
        url,
        queue,
        prefix,
        group,
        split,
        _number(options, "max_rows_per_batch", None, 1),
        _number(options, "partitions", None, 1),
    )
